// The cost model against closed forms it must reproduce, the simulator's
// queueing and processor sharing, and the search against brute force.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "loom/plan/cluster_json.hpp"
#include "loom/plan/cost_model.hpp"
#include "loom/plan/gpt_description.hpp"
#include "loom/parallel/strategy.hpp"
#include "loom/parallel/strategy_text.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/plan/search.hpp"
#include "../../tools/train_gpt_spelling.hpp"  // loom-plan's train_gpt flags
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::plan::Candidate;
using loom::plan::Cluster;
using loom::plan::estimate;
using loom::plan::LayerSpec;
using loom::plan::ModelDescription;
using loom::comm::Link;
using Catch::Contains;

namespace {

// `layers` equal layers of 1 GFLOP forward per sample, 2 backward.
ModelDescription even_model(int layers, std::int64_t batch, std::int64_t params = 1000) {
    ModelDescription m;
    m.name = "even";
    m.batch = batch;
    for (int i = 0; i < layers; ++i)
        m.layers.push_back(
            LayerSpec{.name = std::to_string(i), .forward_flops = 1e9, .params = params, .output_bytes = 1e6, .saved_bytes = 1e6});
    return m;
}

// dp x pp x tp x sp, then the fields that follow.
Candidate degrees(int dp, int pp, int tp, int sp) {
    Candidate c;
    c.dp = dp;
    c.pp = pp;
    c.tp = tp;
    c.sp = sp;
    return c;
}

// Devices of 1 TFLOP/s: one sample through one layer takes 1 ms forward, 2 ms backward.
Cluster fast_cluster(int devices, Link inter = Link::unlimited(), int per_node = 0) {
    if (per_node == 0) per_node = devices;
    return Cluster::uniform(devices / per_node, per_node, 1e12, 1e12, Link::unlimited(), inter);
}

}  // namespace

TEST_CASE("plan: one device runs every layer's forward and backward for every sample", "[plan]") {
    const auto model = even_model(4, 8);
    const auto e = estimate(model, fast_cluster(1), Candidate{});
    CHECK(e.step_seconds == Approx(8 * 4 * 3e-3));
    CHECK(e.compute_seconds == Approx(8 * 4 * 3e-3));
}

TEST_CASE("plan: a GPipe pipeline takes (m + p - 1) stage times", "[plan]") {
    // 4 layers on 2 stages of 2, 4 micro-batches of 2 samples: a stage's
    // forward is 4 ms and its backward 8 ms; free links.
    const auto model = even_model(4, 8);
    for (auto schedule : {loom::ScheduleKind::gpipe, loom::ScheduleKind::one_f_one_b}) {
        Candidate c;
        c.pp = 2;
        c.schedule = schedule;
        c.micro_batches = 4;
        const auto e = estimate(model, fast_cluster(2), c);
        CHECK(e.partition == std::vector<int>{2, 2});
        CHECK(e.step_seconds == Approx((4 + 2 - 1) * 12e-3));
    }
}

TEST_CASE("plan: a pipeline transfer costs its link's time on the critical path", "[plan]") {
    // 1 MB boundary activations over 1 GB/s with 1 ms latency: 2 ms each way.
    const auto model = even_model(2, 1);
    Candidate c;
    c.pp = 2;
    c.micro_batches = 1;
    const auto e = estimate(model, fast_cluster(2, Link::gbytes(1, 1e-3), 1), c);
    // F0, send (2 ms), F1, B1, send back (2 ms), B0; the loss all-reduce of 4 bytes costs 2 x 1 ms more.
    CHECK(e.step_seconds == Approx(1e-3 + 2e-3 + 1e-3 + 2e-3 + 2e-3 + 2e-3 + 2 * (1e-3 + 2e-9)));
}

TEST_CASE("plan: data parallelism pays the all-reduce after the last backward", "[plan]") {
    // One layer, so its bucket's reduction cannot overlap any backward.
    const auto model = even_model(1, 2, 250000);  // 1 MB of gradients
    Candidate c;
    c.dp = 2;
    const auto link = Link::gbytes(1, 0);
    const auto e = estimate(model, fast_cluster(2, link, 1), c);
    const double all_reduce = 2.0 * (2 - 1) * link.seconds(1e6 / 2);
    const double loss = 2.0 * link.seconds(4.0 / 2);
    CHECK(e.step_seconds == Approx(3e-3 + all_reduce + loss));
}

TEST_CASE("plan: collectives on one group queue behind each other", "[plan]") {
    // Two 1 MB buckets (the default bucket is 2 MiB): both are issued during
    // the backward, and the second waits for the first's links.
    const auto model = even_model(2, 2, 400000);
    Candidate c;
    c.dp = 2;
    const auto link = Link::gbytes(0.01, 0);  // 100 ms per MB: far longer than the compute
    const auto e = estimate(model, fast_cluster(2, link, 1), c);
    const double one = 2.0 * link.seconds(1.6e6 / 2);
    REQUIRE(e.step_seconds > 2 * one);
    CHECK(e.step_seconds < 2 * one + 10e-3);
}

TEST_CASE("plan: devices sharing cores run by processor sharing", "[plan]") {
    const auto model = even_model(2, 4);
    Candidate c;
    c.dp = 4;
    auto shared = Cluster(
        {{"local", 0}},
        {{"local/0", 0, 1e12, 1e12, 0}, {"local/1", 0, 1e12, 1e12, 0}, {"local/2", 0, 1e12, 1e12, 0},
         {"local/3", 0, 1e12, 1e12, 0}},
        loom::comm::Links(4), 2);
    // Each rank's 6 ms of work, four at once on two cores: 12 ms.
    CHECK(estimate(model, shared, c).step_seconds == Approx(12e-3));
    CHECK(estimate(model, fast_cluster(4), c).step_seconds == Approx(6e-3));
}

TEST_CASE("plan: ZeRO stages shrink the memory per device", "[plan]") {
    const auto model = even_model(4, 8, 1000000);
    double previous = std::numeric_limits<double>::infinity();
    for (int zero = 0; zero <= 3; ++zero) {
        Candidate c;
        c.dp = 4;
        c.zero = zero;
        const auto e = estimate(model, fast_cluster(4), c);
        CHECK(e.peak_memory < previous);
        previous = e.peak_memory;
    }
}

TEST_CASE("plan: the search's best plans are the brute force's", "[plan]") {
    const auto model = loom::plan::describe_gpt({4, 64, 4, 32, 256}, 8);
    const auto cluster = fast_cluster(4, Link::gbit(1, 50e-6), 2);
    const auto report = loom::plan::search(model, cluster, {.top = 3});
    REQUIRE(report.plans.size() == 3);
    CHECK(report.simulated <= report.candidates);
    // Every candidate, simulated: none beats the search's best.
    double best = std::numeric_limits<double>::infinity();
    for (Candidate c : loom::plan::detail::enumerate(model, cluster, {})) {
        const auto e = estimate(model, cluster, c);
        if (e.fits) best = std::min(best, e.step_seconds);
    }
    CHECK(report.plans.front().estimate.step_seconds == Approx(best));
    for (std::size_t i = 1; i < report.plans.size(); ++i)
        CHECK(report.plans[i - 1].estimate.step_seconds <= report.plans[i].estimate.step_seconds);
}

TEST_CASE("plan: a cluster too small for the model says the least memory any plan needs", "[plan]") {
    const auto model = even_model(4, 8, 100000000);  // 1.6 GB of state per copy
    const auto cluster = Cluster::uniform(1, 4, 1e12, 0.1e9, Link::unlimited(), Link::unlimited());
    CHECK_THAT(loom_test::message_of([&] { (void)loom::plan::search(model, cluster); }),
               Contains("in the memory of the cluster's devices: the least any plan needs is") &&
                   Contains("which has 0.1 GB"));
}

TEST_CASE("plan: candidates print themselves as a Strategy and as train_gpt flags", "[plan]") {
    Candidate c{2, 2, 2, 1, false, false, loom::ScheduleKind::interleaved, 2, 4, 1, {3, 3, 3, 3}, {}, {}};
    CHECK(c.strategy().text() == "Strategy<DataParallel<bucket 2 MiB>, Pipeline<Interleaved<2>>, TensorParallel, ZeroShard<1>>");
    CHECK(c.strategy() == loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::Interleaved<2>>, loom::TensorParallel,
                                         loom::ZeroShard<1>>::spec);
    CHECK(train_gpt_flags(c, 16) ==
          "--dp 2 --pp 2 --schedule interleaved --chunks 2 --tp 2 --micro-batches 4 --batch 16 --zero 1 --partition 3,3,3,3");
    CHECK(train_gpt_strategy_flags(c, 16) ==
          "--dp 2 --pp 2 --tp 2 --strategy 'Strategy<DataParallel<bucket 2 MiB>, Pipeline<Interleaved<2>>, TensorParallel, "
          "ZeroShard<1>>' --micro-batches 4 --batch 16 --partition 3,3,3,3");
}

TEST_CASE("plan: every candidate's printed strategy reads back as the same value", "[plan]") {
    // What loom-plan prints is what train_gpt --strategy parses: the pasted line runs the plan.
    for (const auto schedule : {loom::ScheduleKind::gpipe, loom::ScheduleKind::one_f_one_b, loom::ScheduleKind::interleaved,
                                loom::ScheduleKind::zero_bubble_h1, loom::ScheduleKind::zero_bubble_v})
        for (const int pp : {1, 2})
            for (const int tp : {1, 4})
                for (const bool grid : {false, true})
                    for (const int sp : {1, 2})
                        for (const bool ulysses : {false, true})
                            for (const int zero : {0, 1, 2, 3}) {
                                const int chunks = schedule == loom::ScheduleKind::interleaved ? 3
                                                   : schedule == loom::ScheduleKind::zero_bubble_v ? 2 : 1;
                                const Candidate c{1, pp, tp, sp, grid, ulysses, schedule, chunks, 4, zero, {}, {}, {}};
                                INFO(c.strategy());
                                CHECK(loom::parse_strategy(c.strategy().text()) == c.strategy());
                            }
}

TEST_CASE("plan: invalid candidates are refused with the rule they break", "[plan]") {
    const auto model = loom::plan::describe_gpt({4, 64, 4, 32, 256}, 8);
    const auto cluster = fast_cluster(4);
    const auto refused = [&](Candidate c) { return loom_test::message_of([&] { (void)estimate(model, cluster, c); }); };
    CHECK_THAT(refused(degrees(2, 1, 1, 1)), Contains("dp 2 = 2 ranks, but there are 4; the degrees must multiply to 4"));
    CHECK_THAT(refused([] {
                   auto c = degrees(4, 1, 1, 1);
                   c.micro_batches = 3;
                   return c;
               }()),
               Contains("batch 8 does not split into dp 4 x 3 micro-batches"));
    CHECK_THAT(refused(degrees(1, 1, 4, 1)), Contains("(no error)"));  // 4 heads, 256 tokens
    const auto odd = loom::plan::describe_gpt({4, 64, 2, 36, 256}, 8);
    const auto refused_odd = [&](Candidate c) { return loom_test::message_of([&] { (void)estimate(odd, cluster, c); }); };
    CHECK_THAT(refused_odd(degrees(1, 1, 4, 1)), Contains("tp 4 does not divide the 2 attention heads"));
    CHECK_THAT(refused_odd(degrees(1, 1, 1, 4)),
               Contains("sp 4 does not cut the sequence of 36 tokens into 8 equal chunks"));
    CHECK_THAT(refused([] {
                   auto c = degrees(1, 1, 2, 2);
                   c.tp_grid = true;
                   return c;
               }()), Contains("a 2D tensor grid of 2 ranks is not a square"));
    CHECK_THAT(refused([] {
                   auto c = degrees(1, 4, 1, 1);
                   c.micro_batches = 4;
                   c.partition = {1, 1, 1};
                   return c;
               }()),
               Contains("a partition of 3 stages summing to 3 layers for pp 4 = 4 stages; give 4 counts"));
    CHECK_THAT(refused([] {
                   auto c = degrees(2, 2, 1, 1);
                   c.zero = 5;
                   return c;
               }()),
               Contains("ZeRO stage 5 is not 0, 1, 2 or 3"));
}

TEST_CASE("plan: a rank thread's blocking exchange on oversubscribed cores costs the cores its turn", "[plan]") {
    // One layer split over tp 2 on one shared core: its forward has Megatron's
    // 2 all-reduces and its backward 4, each 1 ms of CPU for each of the two
    // threads, which share the core: 12 ms more; and the asynchronous sum of
    // the gradients the cut left whole, which each rank's progress thread
    // runs: 2 ms more.
    ModelDescription m = even_model(1, 2);
    m.layers[0].tp_bytes = 1e3;
    const auto cluster_with = [](double wake) {
        Cluster c({{"local", 0}}, {{"local/0", 0, 1e12, 1e12, 0}, {"local/1", 0, 1e12, 1e12, 0}}, loom::comm::Links(2), 1);
        c.set_wake_seconds(wake);
        return c;
    };
    const Candidate tp2 = degrees(1, 1, 2, 1);
    const double without = estimate(m, cluster_with(0), tp2).step_seconds;
    CHECK(estimate(m, cluster_with(1e-3), tp2).step_seconds == Approx(without + 14e-3));
    const auto read = loom::plan::read_cluster(
        R"({"shared_cores": 2, "wake_us": 250, "nodes": [{"name": "a", "devices": 2, "tflops": 1, "link": {"unlimited": true}}]})");
    CHECK(read.wake_seconds() == Approx(250e-6));
}

// A link of 1e-7 Gbit/s or 1e4 s of latency puts the clock near 1e9 s, where
// a double's step is about 1e-7 s: a fixed 1e-12 s tolerance never sees a
// compute step end, and the clock stopped (loom-plan never finished).
TEST_CASE("plan: the simulator finishes when links are extremely slow or late", "[plan]") {
    const auto model = loom::plan::describe_gpt({4, 64, 4, 32, 256}, 8);
    for (const Link link : {Link::gbit(1e-7, 50e-6), Link::gbit(1, 1e4)}) {
        const auto cluster = fast_cluster(4, link, 2);
        const auto report = loom::plan::search(model, cluster, {.top = 3});
        REQUIRE_FALSE(report.plans.empty());
        CHECK(std::isfinite(report.plans.front().estimate.step_seconds));
        CHECK(report.plans.front().estimate.step_seconds > 0);
    }
}

TEST_CASE("plan: the simulator's clock advances past 1e9 s with microsecond work", "[plan]") {
    // Rank 0 sends after a 1e9 s transfer; then both ranks compute 3 us
    // steps, the two sharing one core so their rates are not 1.
    loom::plan::SimProgram p;
    using Step = loom::plan::SimStep;
    Step send{Step::Kind::send, 0, 1e9, 1, 7};
    Step recv{Step::Kind::recv, 0, 0, 0, 7};
    Step wait{};
    wait.kind = Step::Kind::wait;
    wait.target = 0;
    Step work{Step::Kind::compute, 3e-6, 0};
    p.ranks = {{send, wait, work, work, work}, {recv, work, work, work, work}};
    p.devices = {1, 1};
    p.pool = {0, 0};
    p.pool_cores = {1.5};
    const auto result = loom::plan::simulate_steps(p);
    // Three steps side by side at 0.75 of full speed, then rank 1's last alone.
    CHECK(result.makespan - 1e9 == Approx(3 * 4e-6 + 3e-6).margin(1e-6));
    CHECK(result.busy[1] == Approx(12e-6));
}

TEST_CASE("plan: a rank thread that blocked on a peer pays its turn on the shared cores", "[plan]") {
    // Rank 1 waits for rank 0's 1 s of work to be sent, then works 1 s. Two
    // threads on one core: 0.5 s apart, then rank 1's turn (1 ms at full
    // speed, alone on the core) and its second alone. With 2 cores they do
    // not outnumber the cores and no turn is paid.
    loom::plan::SimProgram p;
    using Step = loom::plan::SimStep;
    Step work{Step::Kind::compute, 1, 0};
    Step send{Step::Kind::send, 0, 0, 1, 7};
    Step recv{Step::Kind::recv, 0, 0, 0, 7};
    p.ranks = {{work, send}, {recv, work}};
    p.devices = {1, 1};
    p.pool = {0, 0};
    p.pool_cores = {1};
    p.wake = 1e-3;
    CHECK(loom::plan::simulate_steps(p).makespan == Approx(2 + 1e-3));
    p.pool_cores = {2};
    CHECK(loom::plan::simulate_steps(p).makespan == Approx(2));
}

TEST_CASE("plan: an asynchronous collective on shared cores costs its progress thread's turn", "[plan]") {
    // Two rank threads on one core each issue an all-reduce (1 s on the
    // links), work 1 s, then wait for it. The progress thread that runs the
    // all-reduce takes a turn (1 ms) on the core as it is issued: each rank
    // computes 1 ms + 1 s, the two sharing the core. Blocking, the same
    // collective is waited at once and the turn is paid on waking instead.
    loom::plan::SimProgram p;
    using Step = loom::plan::SimStep;
    Step reduce{};
    reduce.kind = Step::Kind::collective;
    reduce.comm = 1;
    reduce.group = 0;
    Step work{Step::Kind::compute, 1, 0};
    Step wait{};
    wait.kind = Step::Kind::wait;
    wait.target = 0;
    p.ranks = {{reduce, work, wait}, {reduce, work, wait}};
    p.groups = {{0, 1}};
    p.devices = {1, 1};
    p.pool = {0, 0};
    p.pool_cores = {1};
    CHECK(loom::plan::simulate_steps(p).makespan == Approx(2));  // no wake: the collective ends under the work
    p.wake = 1e-3;
    CHECK(loom::plan::simulate_steps(p).makespan == Approx(2 + 2e-3));
    p.pool_cores = {2};  // a thread per core: nothing to wake
    CHECK(loom::plan::simulate_steps(p).makespan == Approx(1));
}

TEST_CASE("plan: calibrate_gpt prices each layer's FLOPs at the speed its units were profiled at", "[plan]") {
    ModelDescription m = loom::plan::describe_gpt({3, 64, 4, 32, 256}, 8);
    const ModelDescription before = m;
    const double gemm = 1e9;
    const std::int64_t rows = 2;
    const auto at_gemm = [&](std::size_t layer) {
        return (before.layers[layer].forward_flops + before.layers[layer].backward()) * rows / gemm;
    };
    // embed, blocks[0..2], ln_f, head, loss: the first layer 2x slower than
    // the GEMM, the middle 3x, the last (block, ln_f, head, loss) 4x.
    const double block0 = 1.5 * at_gemm(0), last_block = 3 * at_gemm(2);
    const std::vector<double> seconds{0.5 * at_gemm(0), block0, 3 * at_gemm(1), last_block,
                                      0.25 * at_gemm(2), 0.5 * at_gemm(2), 0.25 * at_gemm(2)};
    loom::plan::calibrate_gpt(m, seconds, rows, gemm);
    const double slower[] = {2, 3, 4};
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(m.layers[i].forward_flops == Approx(slower[i] * before.layers[i].forward_flops));
        CHECK(m.layers[i].backward() == Approx(slower[i] * before.layers[i].backward()));
        CHECK(m.layers[i].recompute() == Approx(slower[i] * before.layers[i].recompute()));
        CHECK(m.layers[i].product_flops == Approx(slower[i] * before.layers[i].product_flops));
        CHECK(m.layers[i].params == before.layers[i].params);  // only the time changes
    }
    CHECK_THAT(loom_test::message_of([&] { loom::plan::calibrate_gpt(m, {1.0, 2.0}, rows, gemm); }),
               Catch::Contains("calibrate_gpt: 2 unit times for 3 layers; give one per unit (embed, the blocks, ln_f, "
                               "head, loss): 7"));
    CHECK_THAT(loom_test::message_of([&] { loom::plan::calibrate_gpt(m, std::vector<double>(7, 0.0), rows, gemm); }),
               Catch::Contains("took 0 s"));
}

}  // namespace LOOM_TEST_FILE
