// Recompute<...>: activation recomputation as instructions of the step
// program. The lowering (forwards that keep their input, a recompute before
// each backward) and what the verifier refuses; then, for every strategy
// family, bit-identical losses and parameters with Full, Selective and
// Budget recomputation against the same strategy without it, with less
// activation memory; a user layer that opts out; the recomputation in the
// trace.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/parallel/recompute.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/schedule/data_parallel.hpp>
#include <loom/schedule/recompute.hpp>
#include <loom/schedule/verify.hpp>

#include "parallel/equivalence_suite.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using namespace loom;
using loom_test::EquivalenceCase;
using loom_test::message_of;
using loom_test::TrainedCase;

// One unit per Param, for the step programs' generators (which read only the sizes).
std::vector<nn::Unit> units_of(std::vector<Param>& params) {
    std::vector<nn::Unit> units(params.size());
    for (std::size_t u = 0; u < units.size(); ++u) {
        units[u].params = {&params[u]};
        units[u].numel = params[u].numel();
    }
    return units;
}

// Every rank's training of `c`, on rank threads.
std::vector<TrainedCase> train_on_threads(const EquivalenceCase& c) {
    const int ranks = c.dp * c.pp * c.tp * c.sp;
    std::vector<TrainedCase> runs(static_cast<std::size_t>(ranks));
    comm::ThreadWorld(ranks).run(
        [&](comm::ThreadComm& comm) { runs[static_cast<std::size_t>(comm.rank())] = loom_test::train_case(comm, c); });
    return runs;
}

struct Comparison {
    std::vector<TrainedCase> plain, full, selective, budget;
};

// Activation bytes of every rank, or (`total`) their sum in one entry.
std::vector<std::int64_t> activations(const std::vector<TrainedCase>& runs, bool total) {
    std::vector<std::int64_t> out;
    for (const TrainedCase& run : runs) out.push_back(run.memory.activations);
    if (total) out = {std::accumulate(out.begin(), out.end(), std::int64_t{0})};
    return out;
}

// The case without recomputation, with Full, with Selective, and with a
// Budget halfway between plain and Full's activation bytes on rank 0; every
// rank's losses and parameters bit-identical to the plain run's. Full holds
// fewer activation bytes than the plain run on every rank, and Selective and
// Budget sit between (Selective above Full in total over the ranks); under a
// zero-bubble schedule only in total over the ranks (and Budget may beat
// Full, which is not the least memory there): its Ws run long after
// their Bs and need what the recompute rebuilt, so the last stage (whose
// forward and backward are close) can hold a little more than without it.
Comparison compare_recomputation(EquivalenceCase c) {
    Comparison out;
    out.plain = train_on_threads(c);
    c.recompute = Recompute<Full>::spec;
    out.full = train_on_threads(c);
    c.recompute = Recompute<Selective>::spec;
    out.selective = train_on_threads(c);
    const std::int64_t halfway = (out.plain[0].memory.activations + out.full[0].memory.activations) / 2;
    c.recompute = RecomputeSpec{RecomputeMode::budget, std::max<std::int64_t>(halfway, 1)};
    out.budget = train_on_threads(c);
    for (std::size_t r = 0; r < out.plain.size(); ++r) {
        INFO(c << ", rank " << r);
        for (const auto* runs : {&out.full, &out.selective, &out.budget}) {
            const TrainedCase& run = (*runs)[r];
            CHECK(run.losses == out.plain[r].losses);
            CHECK(run.params == out.plain[r].params);
        }
        CHECK(out.full[r].recomputes > 0);
        CHECK(out.plain[r].recomputes == 0);
        CHECK(out.budget[r].recomputes <= out.full[r].recomputes);
        CHECK(out.selective[r].recomputes == out.full[r].recomputes);  // the same units, keeping their products
    }
    const bool split = c.pp > 1 && (c.schedule == ScheduleKind::zero_bubble_h1 || c.schedule == ScheduleKind::zero_bubble_v);
    const auto plain = activations(out.plain, split), full = activations(out.full, split),
               budget = activations(out.budget, split), selective = activations(out.selective, split);
    for (std::size_t r = 0; r < plain.size(); ++r) {
        INFO(c << (split ? ", all ranks" : ", rank ") << (split ? "" : std::to_string(r)));
        CHECK(full[r] < plain[r]);
        CHECK(budget[r] <= plain[r]);
        CHECK(selective[r] < plain[r]);
        if (!split) CHECK(budget[r] >= full[r]);  // zero-bubble's least memory need not be Full's
        // A rank that recomputes one unit of one micro-batch at a time holds the same bytes either way: the
        // unit's products sit in the micro-batch's context under Selective, in the recompute's under Full.
        if (!split) CHECK(selective[r] >= full[r]);
    }
    if (!split) CHECK(activations(out.selective, true)[0] > activations(out.full, true)[0]);
    return out;
}

}  // namespace

TEST_CASE("recomputation lowers into forwards that keep their input and recomputes before the backwards",
          "[parallel][recompute]") {
    // Four units of one parameter group each, two micro-batches, ZeRO-3: a gather before every compute.
    std::vector<Param> params(4, Param{Shape{8}, Init::zeros()});
    const parallel::ShardLayout layout(units_of(params), 2, parallel::Grouping::per_unit, 1 << 20);
    schedule::StepProgram program = schedule::data_parallel_program(layout, 4, 3, 2);
    const auto plain = program;
    schedule::lower_recompute(program, {false, true, true, false});
    schedule::verify(program, layout, 4);
    CHECK(program.count(schedule::Op::recompute) == 4);  // 2 units x 2 micro-batches
    CHECK(schedule::recomputed_units(program, 4) == std::vector<bool>{false, true, true, false});
    std::ostringstream text;
    text << program;
    CHECK(text.str().find("forward u1 mb0 (keep input)") != std::string::npos);
    CHECK(text.str().find("recompute u2 mb1") != std::string::npos);
    // Each recompute comes right before its unit's backward, after the gather that backward waited for.
    for (std::size_t i = 0; i < program.code.size(); ++i)
        if (program.code[i].op == schedule::Op::recompute) {
            const auto& next = program.code[i + 1];
            CHECK(next.op == schedule::Op::backward);
            CHECK(next.unit == program.code[i].unit);
            CHECK(next.micro_batch == program.code[i].micro_batch);
        }
    // Lowered again, the earlier choice is undone first: none leaves the plain program.
    schedule::lower_recompute(program, {false, false, true, false});
    CHECK(program.count(schedule::Op::recompute) == 2);
    schedule::lower_recompute(program, std::vector<bool>(4, false));
    CHECK(program.code == plain.code);
    // Selective: the forward keeps its products too, and its recompute replays them.
    schedule::lower_recompute(program, {false, true, false, false}, schedule::Keep::products);
    schedule::verify(program, layout, 4);
    text.str("");
    text << program;
    CHECK(text.str().find("forward u1 mb1 (keep input, products)") != std::string::npos);
    CHECK(text.str().find("recompute u1 mb0 (kept products)") != std::string::npos);
    schedule::lower_recompute(program, std::vector<bool>(4, false));
    CHECK(program.code == plain.code);
    CHECK(message_of([&] { schedule::lower_recompute(program, {true, true, true, true}, schedule::Keep::all); }) ==
          "lower_recompute: Keep::all keeps everything; recomputation keeps the input (Keep::input) or the input and "
          "products (Keep::products)");
    CHECK(message_of([&] { schedule::lower_recompute(program, {true}); }) ==
          "lower_recompute: the program names unit 1 but the choice covers 1 units; give one entry per unit");
}

TEST_CASE("the verifier refuses a dropped forward that is not recomputed, and a recompute of a kept one",
          "[parallel][recompute]") {
    std::vector<Param> params(2, Param{Shape{8}, Init::zeros()});
    const parallel::ShardLayout layout(units_of(params), 1, parallel::Grouping::buckets, 1 << 20);
    const schedule::StepProgram plain = schedule::data_parallel_program(layout, 2, 0, 1);
    const auto index_of = [](const schedule::StepProgram& p, schedule::Op op, int unit) {
        for (std::size_t i = 0; i < p.code.size(); ++i)
            if (p.code[i].op == op && p.code[i].unit == unit) return static_cast<int>(i);
        return -1;
    };
    schedule::StepProgram dropped = plain;
    schedule::lower_recompute(dropped, {true, false});
    dropped.erase(index_of(dropped, schedule::Op::recompute, 0));
    CHECK_THAT(message_of([&] { schedule::verify(dropped, layout, 2); }),
               Catch::Contains("backward u0 mb0 runs before the recompute of the activations its forward dropped"));

    schedule::StepProgram kept = plain;
    kept.insert(index_of(kept, schedule::Op::backward, 0),
                schedule::Instruction{.op = schedule::Op::recompute, .unit = 0, .micro_batch = 0});
    CHECK_THAT(message_of([&] { schedule::verify(kept, layout, 2); }),
               Catch::Contains("recompute u0 mb0 recomputes u0, whose forward kept all it saved (or has not run)"));

    schedule::StepProgram twice = plain;
    schedule::lower_recompute(twice, {true, false});
    const int at = index_of(twice, schedule::Op::recompute, 0);
    twice.insert(at, twice.code[static_cast<std::size_t>(at)]);
    CHECK_THAT(message_of([&] { schedule::verify(twice, layout, 2); }), Catch::Contains("recomputes u0 a second time"));

    // A recompute must say what its forward kept: a replay of products never kept reads nothing.
    schedule::StepProgram mixed = plain;
    schedule::lower_recompute(mixed, {true, false});
    mixed.code[static_cast<std::size_t>(index_of(mixed, schedule::Op::recompute, 0))].keep = schedule::Keep::products;
    CHECK_THAT(message_of([&] { schedule::verify(mixed, layout, 2); }),
               Catch::Contains("recompute u0 mb0 (kept products) replays products its forward did not keep"));
    schedule::lower_recompute(mixed, {true, false}, schedule::Keep::products);
    mixed.code[static_cast<std::size_t>(index_of(mixed, schedule::Op::recompute, 0))].keep = schedule::Keep::input;
    CHECK_THAT(message_of([&] { schedule::verify(mixed, layout, 2); }),
               Catch::Contains("recompute u0 mb0 recomputes everything, but its forward kept its products"));

    schedule::StepProgram odd = plain;
    odd.code[static_cast<std::size_t>(index_of(odd, schedule::Op::backward, 1))].keep = schedule::Keep::input;
    CHECK_THAT(message_of([&] { schedule::verify(odd, layout, 2); }),
               Catch::Contains("keeps only part of its activations; only a forward (and its recompute) can"));
}

TEST_CASE("recomputation is bit-identical on data parallelism and every ZeRO stage", "[parallel][recompute]") {
    for (int stage = 0; stage <= 3; ++stage)
        compare_recomputation({.dp = 2, .stage = stage, .micro_batches = stage % 2 == 0 ? 2 : 1, .steps = 3});
}

TEST_CASE("recomputation is bit-identical on every pipeline schedule", "[parallel][recompute]") {
    using enum ScheduleKind;
    for (ScheduleKind schedule : {gpipe, one_f_one_b, zero_bubble_h1, zero_bubble_v, interleaved})
        compare_recomputation(
            {.dp = 1, .micro_batches = 4, .steps = 3, .pp = 2, .schedule = schedule, .layers = 4});
    // ZeroPP: a zero-bubble pipeline at ZeRO-3 over dp 2 (recomputes wait for the chunk's gather).
    compare_recomputation({.dp = 2, .stage = 3, .micro_batches = 4, .steps = 3, .pp = 2, .schedule = zero_bubble_h1,
                           .layers = 4});
}

TEST_CASE("recomputation is bit-identical with tensor parallelism (1D, 2D) and sequence parallelism",
          "[parallel][recompute]") {
    compare_recomputation({.dp = 1, .steps = 3, .tp = 2});
    compare_recomputation({.dp = 1, .steps = 3, .tp = 4, .grid = true});
    compare_recomputation({.dp = 1, .steps = 3, .sp = 2});
    compare_recomputation({.dp = 1, .steps = 3, .sp = 2, .sp_attention = nn::SequenceAttention::ulysses});
    // Everything at once, with stage messages and f/g all-reduces cast to 16 bits.
    compare_recomputation({.dp = 2, .stage = 3, .micro_batches = 2, .steps = 3, .pp = 2, .layers = 2, .tp = 2,
                           .pp_cast = {CompressorKind::bf16}, .tp_cast = {CompressorKind::bf16}});
}

TEST_CASE("recomputation is bit-identical with a compressed gradient exchange (TopK, error feedback)", "[parallel][recompute]") {
    compare_recomputation({.dp = 2, .stage = 1, .steps = 3, .dp_compress = {CompressorKind::top_k, 0.25}});
}

namespace {

// A user's layer whose only activation is its output (y = 2x): it says
// recomputing it is not worth it.
struct Twice {
    static constexpr bool worth_recomputing = false;
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) {
        Tensor y = ctx.alloc(x.shape());
        const auto in = x.span<const float>();
        const auto out = y.span<float>();
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = 2 * in[i];
        return y;
    }
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) { return forward(ctx, dy); }
};

// A user's model: a chain of fields, one of them a block of the user's own making.
struct UserNet {
    nn::Embedding embed;
    nn::Residual<nn::LayerNorm, nn::Linear, nn::Gelu, nn::Linear> mlp;
    Twice twice;
    nn::LayerNorm norm;
    nn::Linear head;
    nn::CrossEntropy loss;
};

struct UserRun {
    std::vector<float> losses, params;
    std::vector<bool> recomputed;
    std::vector<std::string> traced;  // the recompute spans of the last step
};

UserRun train_user_net(RecomputeSpec recompute) {
    constexpr std::int64_t V = 64, T = 8, C = 16, rows = 4;
    UserRun run;
    comm::ThreadWorld(2).run([&](comm::ThreadComm& comm) {
        UserNet model{nn::Embedding::make(V, T, C),
                      {{nn::LayerNorm::make(C), nn::Linear::make(C, 4 * C), nn::Gelu{}, nn::Linear::make(4 * C, C)}},
                      {},
                      nn::LayerNorm::make(C),
                      nn::Linear::make(C, V),
                      {}};
        exec::ExecutionPlan plan{.zero_stage = 1};
        plan.recompute = recompute;
        exec::Executor<comm::ThreadComm> exec(model, comm, plan,
                                              {.micro_batches = 2, .trace = true,
                                               .field_names = {"embed", "mlp", "twice", "norm", "head", "loss"}});
        exec.initialize(3);
        std::vector<std::int32_t> x(rows * T), y(rows * T);
        std::vector<float> losses;
        for (int step = 0; step < 3; ++step) {
            for (std::size_t i = 0; i < x.size(); ++i) {
                x[i] = static_cast<std::int32_t>((i * 5 + static_cast<std::size_t>(step) + static_cast<std::size_t>(comm.rank())) % V);
                y[i] = static_cast<std::int32_t>((i * 3 + 1) % V);
            }
            exec.trace().clear();
            losses.push_back(exec.step(Tensor::of(x.data(), {rows, T}), Tensor::of(y.data(), {rows, T}), 1e-2f));
        }
        const auto n = static_cast<std::size_t>(exec.parameter_count());
        std::vector<float> values(n), m(n), v(n);
        exec.gather_state(values, m, v);
        if (comm.rank() == 0) {
            run.losses = losses;
            run.params = values;
            run.recomputed = schedule::recomputed_units(exec.program(), static_cast<int>(exec.units().size()));
            for (const auto& e : exec.trace().events())
                if (e.category == "recompute") run.traced.push_back(e.name);
        }
    });
    return run;
}

}  // namespace

TEST_CASE("a user's model recomputes its own block and keeps the layer that opts out, bit-identically",
          "[parallel][recompute]") {
    const UserRun plain = train_user_net({});
    const UserRun full = train_user_net(Recompute<Full>::spec);
    const UserRun selective = train_user_net(Recompute<Selective>::spec);
    // embed, mlp, twice, norm, head, loss: Embedding, Linear and Twice say recomputing them is not worth it.
    CHECK(full.recomputed == std::vector<bool>{false, true, false, true, false, true});
    CHECK(plain.recomputed == std::vector<bool>(6, false));
    CHECK(full.losses == plain.losses);
    CHECK(full.params == plain.params);
    // Selective recomputes the same units, keeping the Linears' products of the user's block.
    CHECK(selective.recomputed == full.recomputed);
    CHECK(selective.losses == plain.losses);
    CHECK(selective.params == plain.params);
    CHECK(selective.traced.size() == full.traced.size());
    // The trace draws each recompute under its unit's name: 3 units x 2 micro-batches.
    REQUIRE(full.traced.size() == 6);
    CHECK(full.traced.front().starts_with("recompute loss"));
    CHECK(std::count(full.traced.begin(), full.traced.end(), full.traced.front()) == 2);  // once per micro-batch
    CHECK(std::find_if(full.traced.begin(), full.traced.end(), [](const std::string& s) {
              return s.starts_with("recompute mlp Residual");
          }) != full.traced.end());
    CHECK(plain.traced.empty());
}

TEST_CASE("Budget's choice is the executor's parallel::Recomputation, which lowered the program it chose",
          "[parallel][recompute]") {
    constexpr std::int64_t V = 64, T = 8, C = 16, rows = 2;
    comm::ThreadWorld(1).run([&](comm::ThreadComm& comm) {
        const auto make = [] {
            return UserNet{nn::Embedding::make(V, T, C),
                           {{nn::LayerNorm::make(C), nn::Linear::make(C, 4 * C), nn::Gelu{}, nn::Linear::make(4 * C, C)}},
                           {},
                           nn::LayerNorm::make(C),
                           nn::Linear::make(C, V),
                           {}};
        };
        UserNet plain_model = make(), budget_model = make();
        exec::Executor<comm::ThreadComm> plain(plain_model, comm, exec::ExecutionPlan{}, {});
        CHECK(plain.policy<parallel::Recomputation>() == nullptr);  // no Recompute<...>: no component

        exec::ExecutionPlan plan{};
        plan.recompute = Recompute<Budget<1>>::spec;  // a byte: nothing fits, so every worthy unit is recomputed
        std::vector<std::string> notices;
        exec::Executor<comm::ThreadComm> exec(budget_model, comm, plan,
                                              {.notice = [&](const std::string& line) { notices.push_back(line); }});
        const auto* recomputation = exec.policy<parallel::Recomputation>();
        REQUIRE(recomputation != nullptr);
        CHECK(recomputation->measuring());  // the first step measures, lowered as Full
        exec.initialize(3);
        std::vector<std::int32_t> x(rows * T, 1), y(rows * T, 2);
        (void)exec.step(Tensor::of(x.data(), {rows, T}), Tensor::of(y.data(), {rows, T}), 1e-2f);
        CHECK_FALSE(recomputation->measuring());
        const schedule::RecomputeChoice& choice = recomputation->choice();
        CHECK_FALSE(choice.fits);
        CHECK(choice.recompute == schedule::recomputed_units(exec.program(), static_cast<int>(exec.units().size())));
        CHECK(choice.recompute == std::vector<bool>{false, true, false, true, false, true});
        REQUIRE(notices.size() == 1);
        CHECK(notices[0].starts_with("Recompute<Budget 1 B>: "));
    });
}

TEST_CASE("a kept product is made once per key and micro-batch, and a replay asks only for what was kept",
          "[parallel][recompute]") {
    nn::Context keeper, ctx;
    keeper.reset();
    float made = 0;
    const auto fill = [&](const Tensor& t) {
        for (float& x : t.span<float>()) x = ++made;
    };
    int key = 0, other = 0;
    ctx.keep_products_in(&keeper, /*replay=*/false);
    const Tensor first = ctx.product(&key, Shape{3}, fill);
    CHECK(keeper.bytes_in_use() >= 3 * sizeof(float));  // it lives with the keeper
    CHECK(ctx.bytes_in_use() == 0);
    CHECK(message_of([&] { (void)ctx.product(&key, Shape{3}, fill); }) ==
          "Context::product: a second product under the same key in one micro-batch; give each product its own key "
          "(the address of the member that makes it)");
    ctx.keep_products_in(&keeper, /*replay=*/true);
    const Tensor again = ctx.product(&key, Shape{3}, [](const Tensor&) { FAIL("a replay computes nothing"); });
    CHECK(again.data<float>() == first.data<float>());
    CHECK(message_of([&] { (void)ctx.product(&key, Shape{4}, fill); }) ==
          "Context::product: the replay asks for shape [4] but the first run kept [3]; a replayed forward must see the "
          "same input");
    CHECK(message_of([&] { (void)ctx.product(&other, Shape{3}, fill); }) ==
          "Context::product: the replay asks for a product its first run did not make; a replayed forward must make "
          "the same products as its first run");
    // The next micro-batch: what the last one kept is not this one's.
    keeper.reset();
    CHECK(message_of([&] { (void)ctx.product(&key, Shape{3}, fill); }).starts_with(
        "Context::product: the replay asks for a product its first run did not make"));
    // Without a keeper a product is plain memory of the context, computed every time.
    ctx.keep_products_in(nullptr, false);
    (void)ctx.product(&key, Shape{3}, fill);
    (void)ctx.product(&key, Shape{3}, fill);
    CHECK(made == 9);
}

}  // namespace LOOM_TEST_FILE
