// The executor's memory report against the ZeRO paper's model-state bytes,
// the Chrome trace it writes, and what Executor::step refuses.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/memory.hpp>
#include <loom/exec/trace.hpp>
#include <loom/gpt/model.hpp>
#include <loom/io/json.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/parallel/zero_shard.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::exec::ExecutionPlan;
using loom::exec::Executor;
using loom::exec::ExecutorOptions;
using loom_test::message_of;

namespace {

const loom::gpt::Config memory_model{.layers = 2, .width = 128, .heads = 4, .seq = 32, .vocab = 256};
const std::vector<std::string> gpt_fields{"embed", "blocks", "ln_f", "head", "loss"};

// A rank's rows of tokens: any values below the vocabulary do.
struct Batch {
    std::vector<std::int32_t> inputs, targets;
    loom::Tensor input_tensor() { return loom::Tensor::of(inputs.data(), {rows, seq}); }
    loom::Tensor target_tensor() { return loom::Tensor::of(targets.data(), {rows, seq}); }
    std::int64_t rows, seq;
};

Batch batch_for(int rank, int step, std::int64_t rows, std::int64_t seq, std::int64_t vocab) {
    Batch b{{}, {}, rows, seq};
    for (std::int64_t k = 0; k < rows * seq; ++k) {
        b.inputs.push_back(static_cast<std::int32_t>((k * 7 + rank * 13 + step * 5) % vocab));
        b.targets.push_back(static_cast<std::int32_t>((k * 11 + rank * 3 + step) % vocab));
    }
    return b;
}

}  // namespace

TEST_CASE("zero_model_state_bytes is the ZeRO paper's formula", "[parallel][memory]") {
    CHECK(loom::zero_model_state_bytes(0, 1000, 4) == 16000.0);
    CHECK(loom::zero_model_state_bytes(1, 1000, 4) == 8000.0 + 2000.0);
    CHECK(loom::zero_model_state_bytes(2, 1000, 4) == 4000.0 + 3000.0);
    CHECK(loom::zero_model_state_bytes(3, 1000, 4) == 4000.0);
    // One rank: every stage holds everything.
    for (int stage : {0, 1, 2, 3}) CHECK(loom::zero_model_state_bytes(stage, 1000, 1) == 16000.0);
    CHECK(message_of([] { (void)loom::zero_model_state_bytes(4, 1000, 2); }) ==
          "zero_model_state_bytes: stage 4 is not 0, 1, 2 or 3");
    CHECK(message_of([] { (void)loom::zero_model_state_bytes(-1, 1000, 2); }) ==
          "zero_model_state_bytes: stage -1 is not 0, 1, 2 or 3");
    CHECK(message_of([] { (void)loom::zero_model_state_bytes(1, 1000, 0); }) ==
          "zero_model_state_bytes: 0 ranks; there must be at least one");

    const loom::MemoryReport report{.rank = 3,
                                    .parameters = 1 << 20,
                                    .gradients = 2048,
                                    .optimizer_state = 100,
                                    .activations = 0,
                                    .communication_buffers = 512 << 10};
    CHECK(report.model_states() == (1 << 20) + 2048 + 100);
    CHECK(report.total() == (1 << 20) + 2048 + 100 + (512 << 10));
    std::ostringstream out;
    out << report;
    CHECK(out.str() == "rank 3: parameters 1 MiB, gradients 2.0 KiB, optimizer state 100 B, activations 0 B, "
                       "communication buffers 512.0 KiB; total 1.5 MiB");
}

TEST_CASE("the memory report matches ZeRO's model-state bytes for dp 2 and 4, stages 0-3", "[parallel][memory]") {
    const std::int64_t psi = memory_model.parameters();
    REQUIRE(psi == 466432);
    for (int dp : {2, 4})
        for (int stage : {0, 1, 2, 3}) {
            std::vector<loom::MemoryReport> before(static_cast<std::size_t>(dp)), after(before.size());
            std::vector<std::int64_t> padded(before.size()), shard(before.size()), largest(before.size());
            ThreadWorld(dp).run([&](ThreadComm& comm) {
                auto model = loom::gpt::make_model(memory_model);
                Executor<ThreadComm> exec(model, comm, ExecutionPlan{stage, loom::default_bucket_bytes},
                                          {.field_names = gpt_fields});
                exec.initialize(1);
                const auto r = static_cast<std::size_t>(comm.rank());
                before[r] = exec.memory_report();
                auto batch = batch_for(comm.rank(), 0, 2, memory_model.seq, memory_model.vocab);
                (void)exec.step(batch.input_tensor(), batch.target_tensor(), 1e-3f);
                after[r] = loom::memory_report(exec);  // the free form, as the docs name it
                padded[r] = exec.layout().padded_size();
                shard[r] = exec.layout().shard_size();
                largest[r] = exec.layout().largest_group();
            });
            for (int r = 0; r < dp; ++r) {
                const auto k = static_cast<std::size_t>(r);
                const auto& m = after[k];
                const double predicted = loom::zero_model_state_bytes(stage, psi, dp);
                const double ratio = static_cast<double>(m.model_states()) / predicted;
                INFO("dp " << dp << ", stage " << stage << ", " << m << "; model states / ZeRO's prediction = " << ratio);
                CHECK(m.rank == r);
                CHECK(ratio >= 0.95);
                CHECK(ratio <= 1.05);
                // Exactly what the layout says each part holds, in f32.
                const std::int64_t P = padded[k] * 4, S = shard[k] * 4;
                CHECK(m.parameters == (stage == 3 ? S : P));
                CHECK(m.gradients == (stage >= 2 ? S : P));
                CHECK(m.optimizer_state == 2 * (stage == 0 ? P : S));
                CHECK(m.communication_buffers == (stage == 3 ? 4 * largest[k] * 4 : stage == 2 ? 2 * largest[k] * 4 : 0));
                CHECK((m.communication_buffers > 0) == (stage >= 2));
                // Sharded gradients are the rank's shard; unsharded ones the whole model.
                if (stage >= 2) CHECK(m.gradients * dp == P);
                else CHECK(m.gradients >= psi * 4);
                // Activations exist only once a step ran; the model states do not change with it.
                CHECK(before[k].activations == 0);
                CHECK(m.activations > 0);
                CHECK(m.model_states() == before[k].model_states());
                CHECK(m.communication_buffers == before[k].communication_buffers);
                CHECK(m.total() == m.model_states() + m.activations + m.communication_buffers);
            }
        }
}

TEST_CASE("a traced ZeRO-2 run on 2 rank threads writes a Chrome trace", "[parallel][trace]") {
    const loom::gpt::Config config{.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64};
    const auto dir = std::filesystem::temp_directory_path() /
                     ("loom_test_trace_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(dir);
    const auto path = dir / "trace.json";
    using S = loom::Strategy<loom::DataParallel<loom::BucketBytes<16 << 10>>, loom::ZeroShard<2>>;
    constexpr int steps = 2, micro_batches = 2;
    std::vector<std::size_t> events_per_rank(2);
    int groups = 0;
    ThreadWorld(2).run([&](ThreadComm& comm) {
        auto model = loom::gpt::make_model(config);
        auto exec = Executor<ThreadComm>::make<S>(
            model, comm, {.micro_batches = micro_batches, .trace = true, .field_names = gpt_fields});
        exec.initialize(3);
        for (int step = 0; step < steps; ++step) {
            auto batch = batch_for(comm.rank(), step, 4, config.seq, config.vocab);
            (void)exec.step(batch.input_tensor(), batch.target_tensor(), 1e-3f);
        }
        events_per_rank[static_cast<std::size_t>(comm.rank())] = exec.trace().events().size();
        if (comm.rank() == 0) groups = static_cast<int>(exec.layout().groups().size());
        loom::exec::write_trace(comm, exec.trace(), path);
    });
    REQUIRE(groups == 3);
    std::ifstream file(path);
    REQUIRE(file);
    const std::string text{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
    file.close();
    std::filesystem::remove_all(dir);

    const auto document = loom::io::json::parse_or_throw(text, "trace.json");
    const auto json = document.root();
    REQUIRE(json.is_object());
    const auto events = json.find("traceEvents");
    REQUIRE(events.has_value());
    REQUIRE(events->is_array());

    std::map<int, std::size_t> x_events;                    // pid -> complete events
    std::map<std::pair<int, std::string>, int> per_category;  // (pid, cat) -> count
    std::set<std::string> categories, process_names;
    std::set<std::int64_t> steps_seen;
    const std::set<std::string> communication{"all_reduce", "reduce_scatter", "all_gather"};
    std::string first_forward;
    for (const auto& e : events->items()) {
        REQUIRE(e.is_object());
        const auto ph = e.find("ph");
        REQUIRE(ph.has_value());
        const auto pid = e.find("pid");
        REQUIRE(pid.has_value());
        REQUIRE(pid->as_uint64().has_value());
        const int p = static_cast<int>(*pid->as_uint64());
        if (ph->text() == "M") {
            if (e.find("name")->text() == "process_name")
                process_names.insert(std::string(e.find("args")->find("name")->text()));
            continue;
        }
        REQUIRE(ph->text() == "X");
        const auto cat = e.find("cat");
        const auto tid = e.find("tid");
        const auto ts = e.find("ts");
        const auto dur = e.find("dur");
        const auto name = e.find("name");
        REQUIRE((cat && tid && ts && dur && name));
        INFO(name->text());
        ++x_events[p];
        ++per_category[{p, std::string(cat->text())}];
        categories.insert(std::string(cat->text()));
        REQUIRE(ts->as_double().has_value());
        REQUIRE(dur->as_double().has_value());
        CHECK(*ts->as_double() >= 0.0);
        CHECK(*dur->as_double() >= 0.0);
        // Communication on lane 1, everything else on lane 0.
        CHECK(*tid->as_uint64() == (communication.count(std::string(cat->text())) ? 1u : 0u));
        const auto step = e.find("args")->find("step");
        REQUIRE(step.has_value());
        steps_seen.insert(static_cast<std::int64_t>(*step->as_uint64()));
        if (p == 0 && cat->text() == "forward" && first_forward.empty()) first_forward = std::string(name->text());
    }
    CHECK(process_names == std::set<std::string>{"rank 0", "rank 1"});
    CHECK(x_events.size() == 2);
    CHECK(x_events[0] == events_per_rank[0]);
    CHECK(x_events[1] == events_per_rank[1]);
    for (const char* c : {"zero_grads", "forward", "backward", "optimizer", "reduce_scatter", "all_gather"})
        CHECK(categories.count(c) == 1);
    CHECK(categories.count("all_reduce") == 0);  // ZeRO-2 reduce-scatters
    CHECK(steps_seen == std::set<std::int64_t>{0, 1});
    CHECK(first_forward == "forward embed Embedding");
    for (int p : {0, 1}) {
        INFO("pid " << p);
        // 6 units x 2 micro-batches x 2 steps; a reduce-scatter per group per
        // micro-batch; an all-gather per group after each optimizer step;
        // zeroing: the gradient shard once a step, and a gradient slot at
        // every bind (one per group per micro-batch).
        CHECK(per_category[{p, "forward"}] == 6 * micro_batches * steps);
        CHECK(per_category[{p, "backward"}] == 6 * micro_batches * steps);
        CHECK(per_category[{p, "optimizer"}] == steps);
        CHECK(per_category[{p, "zero_grads"}] == steps * (1 + groups * micro_batches));
        CHECK(per_category[{p, "reduce_scatter"}] == groups * micro_batches * steps);
        CHECK(per_category[{p, "all_gather"}] == groups * steps);
    }
}

TEST_CASE("an untraced executor records nothing", "[parallel][trace]") {
    const loom::gpt::Config config{.layers = 1, .width = 16, .heads = 2, .seq = 8, .vocab = 32};
    ThreadWorld(1).run([&](ThreadComm& comm) {
        auto model = loom::gpt::make_model(config);
        auto exec = Executor<ThreadComm>::make<loom::Strategy<loom::ZeroShard<3>>>(model, comm);
        exec.initialize(1);
        auto batch = batch_for(0, 0, 2, config.seq, config.vocab);
        (void)exec.step(batch.input_tensor(), batch.target_tensor(), 1e-3f);
        CHECK_FALSE(exec.trace().enabled());
        CHECK(exec.trace().events().empty());
        CHECK(exec.optimizer_steps() == 1);
    });
}

TEST_CASE("Executor::step refuses rows that do not split into the micro-batches", "[parallel][executor]") {
    const loom::gpt::Config config{.layers = 1, .width = 16, .heads = 2, .seq = 8, .vocab = 32};
    // Catch's assertions are not thread-safe: each rank records, the test thread checks.
    struct Seen {
        std::string indivisible, mismatched;
        std::int64_t steps_after_refusals = -1, steps_after_valid = -1;
        float loss = 0;
    };
    std::vector<Seen> seen(2);
    ThreadWorld(2).run([&](ThreadComm& comm) {
        auto& mine = seen[static_cast<std::size_t>(comm.rank())];
        auto model = loom::gpt::make_model(config);
        auto exec = Executor<ThreadComm>::make<loom::Strategy<loom::DataParallel<>, loom::ZeroShard<2>>>(
            model, comm, {.micro_batches = 4});
        exec.initialize(1);
        auto six = batch_for(comm.rank(), 0, 6, config.seq, config.vocab);
        mine.indivisible = message_of([&] { (void)exec.step(six.input_tensor(), six.target_tensor(), 1e-3f); });
        // Inputs and targets of different shapes.
        auto four = batch_for(comm.rank(), 0, 4, config.seq, config.vocab);
        const auto half_targets = loom::Tensor::of(four.targets.data(), {2, config.seq});
        mine.mismatched = message_of([&] { (void)exec.step(four.input_tensor(), half_targets, 1e-3f); });
        mine.steps_after_refusals = exec.optimizer_steps();
        mine.loss = exec.step(four.input_tensor(), four.target_tensor(), 1e-3f);
        mine.steps_after_valid = exec.optimizer_steps();
    });
    for (const auto& mine : seen) {
        CHECK_THAT(mine.indivisible, Catch::Contains("do not split into"));
        CHECK(mine.indivisible ==
              "Executor::step: 6 rows on this rank do not split into 4 micro-batches; the rows per rank must be a "
              "multiple of the micro-batches");
        CHECK_THAT(mine.mismatched, Catch::Contains("must both be [rows, T]"));
        // Nothing ran: the refused steps left the executor ready for a valid one.
        CHECK(mine.steps_after_refusals == 0);
        CHECK(std::isfinite(mine.loss));
        CHECK(mine.loss == seen[0].loss);
        CHECK(mine.steps_after_valid == 1);
    }
    // A bad micro-batch count is refused when the executor is made (one rank: on this thread).
    ThreadWorld(1).run([&](ThreadComm& comm) {
        auto model = loom::gpt::make_model(config);
        CHECK(message_of([&] {
                  (void)Executor<ThreadComm>::make<loom::Strategy<loom::DataParallel<>>>(model, comm,
                                                                                         {.micro_batches = 0});
              }) == "data_parallel_program: 0 micro-batches; there must be at least 1");
    });
}

}  // namespace LOOM_TEST_FILE
