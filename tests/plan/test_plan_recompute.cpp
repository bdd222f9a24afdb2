// Recomputation in the planner: the memory model with recomputed layers
// against hand-worked sums, the joint search on clusters whose memory forces
// recomputation, and the printed strategy reading back with its Recompute<...>;
// Recompute<Selective> (products kept, not rerun) priced beside Full and Budget.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "loom/parallel/strategy_text.hpp"
#include "loom/plan/cost_model.hpp"
#include "loom/plan/gpt_description.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/search.hpp"
#include "loom/train/memory_preflight.hpp"
#include "../../tools/train_gpt_spelling.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::RecomputeMode;
using loom::RecomputeSpec;
using loom::comm::Link;
using loom::plan::Candidate;
using loom::plan::Cluster;
using loom::plan::LayerSpec;
using loom::plan::ModelDescription;
using loom::plan::RecomputeSearch;
using Catch::Contains;

namespace {

// `layers` equal layers: 1 GFLOP forward per sample (2 backward), 1000
// parameters, 1 MB output and 4 MB saved per sample, `tp_bytes` all-reduced
// in a tensor-parallel forward. No sequence length, so no sp; `heads` limits tp.
ModelDescription memory_heavy(int layers, std::int64_t batch, double tp_bytes = 0, std::int64_t heads = 0) {
    ModelDescription m;
    m.name = "heavy";
    m.batch = batch;
    m.heads = heads;
    for (int i = 0; i < layers; ++i) {
        LayerSpec l;
        l.name = std::to_string(i);
        l.forward_flops = 1e9;
        l.params = 1000;
        l.output_bytes = 1e6;
        l.saved_bytes = 4e6;
        l.tp_bytes = tp_bytes;
        m.layers.push_back(l);
    }
    return m;
}

// Devices of 1 TFLOP/s (1 ms per sample-layer forward) with `memory` bytes,
// one node joined by `link`, each device its own cores.
Cluster devices(int n, double memory, Link link = Link::unlimited()) {
    return Cluster::uniform(1, n, 1e12, memory, link, link);
}

Candidate degrees(int dp, int pp, int tp, int micro_batches) {
    Candidate c;
    c.dp = dp;
    c.pp = pp;
    c.tp = tp;
    c.micro_batches = micro_batches;
    return c;
}

// memory_heavy's layers with matrix products: 1 MB of outputs per sample
// that Selective keeps, and `product_flops` of the 1 GFLOP its rerun skips.
ModelDescription with_products(ModelDescription m, double product_flops) {
    for (LayerSpec& l : m.layers) {
        l.product_bytes = 1e6;
        l.product_flops = product_flops;
    }
    return m;
}

// A candidate's layout: everything but its recomputation.
std::string layout_of(Candidate c) {
    c.recompute = {};
    c.recomputed.clear();
    std::ostringstream s;
    s << c;
    return s.str();
}

Candidate recomputing(Candidate c, RecomputeSpec spec, const ModelDescription& model, const Cluster& cluster) {
    c.recompute = spec;
    c.recomputed = loom::plan::recompute_choice(model, cluster, c, c.partition, spec).layers;
    return c;
}

std::vector<bool> marks(std::initializer_list<int> on, int layers) {
    std::vector<bool> out(static_cast<std::size_t>(layers), false);
    for (int i : on) out[static_cast<std::size_t>(i)] = true;
    return out;
}

}  // namespace

TEST_CASE("plan recompute: the memory model counts recomputed layers' outputs and the largest rerun", "[plan][recompute]") {
    const auto model = memory_heavy(4, 4);
    const auto cluster = devices(1, 1e12);
    const double states = 4 * 1000 * 16.0;  // 4 layers of 1000 parameters, 16 bytes each
    const Candidate c = degrees(1, 1, 1, 1);  // 4 samples in one micro-batch
    // Kept: 4 layers x 4 MB x 4 samples.
    CHECK(loom::plan::device_memory(model, cluster, c, {}).peak == Approx(states + 64e6));
    // Layers 1 and 2 recomputed: 2 x 4 MB + 2 x 16 MB kept, plus one 16 MB rerun.
    CHECK(loom::plan::device_memory(model, cluster, c, {}, marks({1, 2}, 4)).peak ==
          Approx(states + 2 * 4e6 + 2 * 16e6 + 16e6));
    // All four: 4 x 4 MB, plus one rerun.
    CHECK(loom::plan::device_memory(model, cluster, c, {}, marks({0, 1, 2, 3}, 4)).peak == Approx(states + 16e6 + 16e6));
}

TEST_CASE("plan recompute: a pipeline rank counts the schedule's micro-batches in flight for each layer", "[plan][recompute]") {
    const auto model = memory_heavy(4, 4);
    // pp 2, 1F1B over 2 micro-batches of 2 samples: 2 in flight, 2 layers per rank.
    Candidate c = degrees(1, 2, 1, 2);
    const auto m = loom::plan::device_memory(model, devices(2, 1e12), c, {2, 2}, marks({0}, 4));
    const double states = 2 * 1000 * 16.0;
    // Rank 0: layer 0 recomputed (2 x 2 MB), layer 1 kept (2 x 8 MB), an 8 MB rerun.
    CHECK(m.bytes[0] == Approx(states + 2 * 2e6 + 2 * 8e6 + 8e6));
    // Rank 1 recomputes nothing: 2 layers x 2 copies x 8 MB, no rerun.
    CHECK(m.bytes[1] == Approx(states + 4 * 8e6));
    // With nothing recomputed the model is the activation bound times the stage's saved bytes, as before.
    CHECK(loom::plan::device_memory(model, devices(2, 1e12), c, {2, 2}).bytes[0] == Approx(states + 2 * 2 * 8e6));
}

TEST_CASE("plan recompute: a recomputed layer costs one more forward in the simulated step", "[plan][recompute]") {
    const auto model = memory_heavy(4, 2);
    Candidate c = degrees(1, 1, 1, 1);
    const double plain = loom::plan::estimate(model, devices(1, 1e12), c).step_seconds;
    CHECK(plain == Approx(4 * 3e-3 * 2).epsilon(0.01));  // 4 layers x (1 + 2) ms x 2 samples
    c.recompute = {RecomputeMode::full, 0};
    const auto full = loom::plan::estimate(model, devices(1, 1e12), c);
    CHECK(std::count(full.recomputed.begin(), full.recomputed.end(), true) == 4);
    CHECK(full.step_seconds == Approx(plain + 4 * 1e-3 * 2).epsilon(0.01));
    // A layer's own recompute_flops: the part its rerun repeats.
    auto cheaper = model;
    for (LayerSpec& l : cheaper.layers) l.recompute_flops = 0.5e9;
    CHECK(loom::plan::estimate(cheaper, devices(1, 1e12), c).step_seconds == Approx(plain + 4 * 0.5e-3 * 2).epsilon(0.01));
    // The search's lower bound counts the reruns too.
    c.recomputed = full.recomputed;
    CHECK(loom::plan::detail::CostModel(model, devices(1, 1e12), c).lower_bound() == Approx(full.step_seconds).epsilon(0.01));
}

TEST_CASE("plan recompute: a Budget recomputes the cheapest layers that fit it on every rank", "[plan][recompute]") {
    auto model = memory_heavy(4, 1);
    model.layers[2].recompute_flops = 0.1e9;  // the cheapest to recompute
    const Candidate c = degrees(1, 1, 1, 1);
    // 16 MB kept; a budget of 14 MB: recomputing one layer saves 3 MB and adds a 4 MB rerun (17 MB), so two.
    auto chosen = loom::plan::recompute_choice(model, devices(1, 1e12), c, {}, {RecomputeMode::budget, 14'000'000});
    CHECK(chosen.fits);
    CHECK(std::count(chosen.layers.begin(), chosen.layers.end(), true) == 2);
    CHECK(chosen.layers[2]);
    // Full takes every recomputable layer, and a layer that says it is not recomputable is kept.
    model.layers[0].recomputable = false;
    chosen = loom::plan::recompute_choice(model, devices(1, 1e12), c, {}, {RecomputeMode::full, 0});
    CHECK(chosen.layers == marks({1, 2, 3}, 4));
    // A budget below even that does not fit.
    CHECK_FALSE(loom::plan::recompute_choice(model, devices(1, 1e12), c, {}, {RecomputeMode::budget, 1000}).fits);
}

TEST_CASE("plan recompute: when no plan fits without recomputation, the search recomputes", "[plan][recompute]") {
    // 4 devices, 3 heads (no tensor parallelism), 4 samples: every layout keeps 8 layers x 4 MB x 1 sample
    // = 32 MB of activations per device, in 25 MB.
    const auto model = memory_heavy(8, 4, 0, 3);
    const auto cluster = devices(4, 25e6);
    CHECK_THAT(loom_test::message_of([&] { (void)loom::plan::search(model, cluster, {.recompute = RecomputeSearch::never}); }),
               Contains("no plan fits heavy in the memory of the cluster's devices"));
    const auto report = loom::plan::search(model, cluster, {.top = 3});
    REQUIRE(!report.plans.empty());
    CHECK(report.recomputing > 0);
    for (const auto& plan : report.plans) {
        INFO(plan.candidate);
        CHECK(plan.candidate.recompute.on());
        CHECK(plan.estimate.fits);
        CHECK(plan.estimate.peak_memory <= 25e6);
        CHECK(std::count(plan.estimate.recomputed.begin(), plan.estimate.recomputed.end(), true) > 0);
        // What the search priced is what estimate() prices for the printed candidate.
        CHECK(loom::plan::estimate(model, cluster, plan.candidate).step_seconds == Approx(plan.estimate.step_seconds));
    }
}

TEST_CASE("plan recompute: the joint search beats sharding until it fits and recomputing everything", "[plan][recompute]") {
    // 8 layers of 1 GFLOP, 4 MB saved per sample; 4 samples on 4 devices of 25 MB joined at 10 GB/s. Data
    // parallelism keeps 32 MB per device, so it must recompute 4 layers (+4 ms); tensor parallelism fits
    // without recomputing but all-reduces 8 MB per layer and sample three times; Full recomputes 8 layers.
    const auto model = memory_heavy(8, 4, 8e6);
    const auto cluster = devices(4, 25e6, Link::gbytes(10, 0));
    const auto joint = loom::plan::search(model, cluster, {.top = 1});
    const auto shard = loom::plan::search(model, cluster, {.top = 1, .recompute = RecomputeSearch::never});
    const auto full = loom::plan::search(model, cluster, {.top = 1, .recompute = RecomputeSearch::always_full});
    const auto& best = joint.plans.front();
    INFO("joint " << best.candidate << ": " << best.estimate.step_seconds << " s; shard "
                  << shard.plans.front().candidate << ": " << shard.plans.front().estimate.step_seconds << " s; full "
                  << full.plans.front().candidate << ": " << full.plans.front().estimate.step_seconds << " s");
    CHECK(best.candidate.dp == 4);
    CHECK(best.candidate.recompute.mode == RecomputeMode::budget);
    CHECK(std::count(best.estimate.recomputed.begin(), best.estimate.recomputed.end(), true) == 4);
    CHECK(best.estimate.step_seconds == Approx(8 * 3e-3 + 4 * 1e-3).epsilon(0.02));
    CHECK_FALSE(shard.plans.front().candidate.recompute.on());
    CHECK(shard.plans.front().candidate.tp > 1);
    CHECK(best.estimate.step_seconds < shard.plans.front().estimate.step_seconds);
    CHECK(best.estimate.step_seconds < full.plans.front().estimate.step_seconds);
    CHECK(full.plans.front().estimate.step_seconds == Approx(8 * 3e-3 + 8 * 1e-3).epsilon(0.02));
}

TEST_CASE("plan recompute: the printed plan reads back through parse_strategy and train_gpt's flags", "[plan][recompute]") {
    const auto model = memory_heavy(8, 4, 8e6);
    const auto report = loom::plan::search(model, devices(4, 25e6, Link::gbytes(10, 0)), {.top = 1, .zero_stages = {0}});
    const Candidate& c = report.plans.front().candidate;
    const std::string text = c.strategy().text();
    CHECK(text == "Strategy<DataParallel<bucket 2 MiB>, Recompute<Budget 23 MiB>>");
    CHECK(loom::parse_strategy(text) == c.strategy());
    CHECK(train_gpt_flags(c, 4) == "--dp 4 --micro-batches 1 --batch 4 --recompute budget:23MiB");
    CHECK(parse_recompute_flag("budget:23MiB") == c.recompute);
    for (const RecomputeSpec spec : {RecomputeSpec{RecomputeMode::full, 0}, RecomputeSpec{RecomputeMode::selective, 0},
                                     RecomputeSpec{RecomputeMode::budget, 1000},
                                     RecomputeSpec{RecomputeMode::budget, std::int64_t{3} << 29}, RecomputeSpec{}}) {
        Candidate with = degrees(2, 2, 1, 4);
        with.recompute = spec;
        INFO(with.strategy());
        CHECK(loom::parse_strategy(with.strategy().text()) == with.strategy());
        CHECK(parse_recompute_flag(recompute_flag(spec)) == spec);
    }
    Candidate full = degrees(1, 1, 1, 1);
    full.recompute = {RecomputeMode::full, 0};
    CHECK(full.strategy().text() == "Strategy<DataParallel<bucket 2 MiB>, Recompute<Full>>");
}

TEST_CASE("plan recompute: GPT layers recompute their blocks, keeping the embedding's output and the head's tensors", "[plan][recompute]") {
    const auto model = loom::plan::describe_gpt({2, 64, 4, 32, 256}, 8);
    const double T = 32, C = 64, V = 256;
    for (const LayerSpec& l : model.layers) CHECK(l.recomputable);
    CHECK(model.layers[0].kept_when_recomputed() == Approx(4 * 2 * T * C));
    // The block's and ln_f's outputs, and the head's logits and input gradient (the head is not recomputed).
    CHECK(model.layers[1].kept_when_recomputed() == Approx(4 * (3 * T * C + T * V)));
    // While a layer reruns it holds its block's forward and backward: 36 T C + T H + 2 T floats.
    CHECK(model.layers[1].rerun_peak(false) == Approx(4 * (36 * T * C + 4 * T + 2 * T)));
    CHECK(model.layers[1].rerun_peak(true) == Approx(4 * (27 * T * C + 4 * T + 2 * T)));
    CHECK(model.layers[0].recompute() < model.layers[0].forward_flops);  // not the position add
    CHECK(model.layers[1].recompute() < model.layers[1].forward_flops);  // not the head's matmul
}

TEST_CASE("plan recompute: bad recomputation inputs are refused with what would be valid", "[plan][recompute]") {
    auto model = memory_heavy(2, 2);
    Candidate c = degrees(1, 1, 1, 1);
    c.recomputed = {true};
    CHECK(loom::plan::why_invalid(model, devices(1, 1e12), c) ==
          "the recompute choice covers 1 layers but the model has 2; give one entry per layer");
    c.recomputed = {true, false};
    model.layers[0].recomputable = false;
    CHECK(loom::plan::why_invalid(model, devices(1, 1e12), c) == "layer 0 is recomputed but says it is not recomputable");
    model.layers[0].recompute_flops = std::nan("");
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Contains("model heavy: layer 0 has recomputed_bytes -1 and recompute_flops nan; give finite numbers"));
    CHECK_THAT(loom_test::message_of([] { (void)parse_recompute_flag("budget:lots"); }),
               Contains("unknown recomputation \"budget:lots\"; use none, full, selective or budget:SIZE"));
    CHECK_THAT(loom_test::message_of([] { (void)parse_recompute_flag("sometimes"); }),
               Contains("unknown recomputation \"sometimes\""));
}

TEST_CASE("plan recompute: train_gpt's memory preflight counts Full's activations when it recomputes", "[plan][recompute]") {
    const loom::gpt::Config config{4, 64, 4, 32, 256};
    const auto model = loom::plan::describe_gpt(config, 8);
    const auto none = loom::train::gpt_training_memory(config, {.batch = 8, .pp = 2});
    const auto full = loom::train::gpt_training_memory(config, {.batch = 8, .pp = 2, .recompute = {RecomputeMode::full, 0}});
    double saved = 0, kept = 0, rerun = 1e300;
    for (const LayerSpec& l : model.layers) {
        saved += l.saved_bytes;
        kept += l.kept_when_recomputed();
        rerun = std::min(rerun, l.saved_bytes);
    }
    CHECK(none.activations == Approx(saved * 8 / 2));
    // Per rank: the recomputed layers' kept bytes over the 2 stages, and one block's rerun.
    CHECK(full.activations == Approx((kept / 2 + rerun) * 8));
    CHECK(full.activations < none.activations);
    CHECK(full.model_states == Approx(none.model_states));
    // A Budget counts as Full: the least it could keep.
    const auto budget = loom::train::gpt_training_memory(
        config, {.batch = 8, .pp = 2, .recompute = {RecomputeMode::budget, std::int64_t{1} << 40}});
    CHECK(budget.activations == Approx(full.activations));
}

TEST_CASE("plan recompute: the joint search's best is the brute force's over every candidate, recomputing where needed", "[plan][recompute]") {
    // The search prunes by a lower bound that must count the recomputes' forwards: every candidate priced
    // (without recomputation when it fits, else with the cheapest that fits) finds nothing better.
    const auto model = memory_heavy(8, 4, 8e6);
    const auto cluster = devices(4, 25e6, Link::gbytes(10, 0));
    const auto report = loom::plan::search(model, cluster, {.top = 3});
    double best = 1e300;
    int recomputing = 0;
    for (Candidate c : loom::plan::detail::enumerate(model, cluster, {})) {
        if (c.pp > 1) c.partition = loom::plan::detail::CostModel(model, cluster, c).balanced_partition();
        auto e = loom::plan::estimate(model, cluster, c);
        if (!e.fits) {
            const auto fitting = loom::plan::cheapest_fitting_recompute(model, cluster, c, c.partition);
            if (!fitting) continue;
            c.recompute = fitting->spec;
            c.recomputed = fitting->layers;
            e = loom::plan::estimate(model, cluster, c);
            REQUIRE(e.fits);
            ++recomputing;
        }
        best = std::min(best, e.step_seconds);
    }
    CHECK(report.recomputing == recomputing);
    CHECK(report.simulated < report.candidates);
    CHECK(report.plans.front().estimate.step_seconds == Approx(best));
}

TEST_CASE("plan recompute: a GPT block's Selective keeps its 9 T C products and reruns only the attention core", "[plan][recompute]") {
    const auto model = loom::plan::describe_gpt({4, 64, 4, 32, 256}, 8);
    const double T = 32, C = 64, V = 256;
    for (const LayerSpec& l : model.layers) {
        INFO(l.name);
        CHECK(l.product_bytes == Approx(4 * 9 * T * C));
        CHECK(l.kept_when_selective() == Approx(l.kept_when_recomputed() + 4 * 9 * T * C));
        CHECK(l.kept_when_selective() < l.saved_bytes);
    }
    CHECK(model.layers[1].selective_recompute() == Approx(2 * T * T * C));  // a block: the attention core alone
    CHECK(model.layers[3].selective_recompute() == Approx(2 * T * T * C + 5 * T * V));  // and the loss's softmax
    const auto cluster = devices(1, 1e12);
    const Candidate c = degrees(1, 1, 1, 1);  // 8 samples in one micro-batch
    const Candidate full = recomputing(c, {RecomputeMode::full, 0}, model, cluster);
    const Candidate selective = recomputing(c, {RecomputeMode::selective, 0}, model, cluster);
    CHECK(selective.recomputed == full.recomputed);  // the same layers: every one
    CHECK(std::count(selective.recomputed.begin(), selective.recomputed.end(), true) == 4);
    const double none_bytes = loom::plan::device_memory(model, cluster, c, {}).peak;
    const double full_bytes = loom::plan::device_memory(model, cluster, full, {}, full.recomputed).peak;
    const double selective_bytes = loom::plan::device_memory(model, cluster, selective, {}, selective.recomputed).peak;
    INFO("none " << none_bytes << ", full " << full_bytes << ", selective " << selective_bytes);
    CHECK(full_bytes < selective_bytes);
    CHECK(selective_bytes < none_bytes);
    // Above Full by every layer's products, 8 samples each, less the rerunning layer's: its transient holds
    // them under Full and the micro-batch does under Selective.
    CHECK(selective_bytes - full_bytes == Approx((4 - 1) * 8 * 4 * 9 * T * C));
    // What estimate() prices is the same.
    CHECK(loom::plan::estimate(model, cluster, selective).peak_memory == Approx(selective_bytes));
}

TEST_CASE("plan recompute: Selective's reruns cost their layers' FLOPs less the products, without tensor exchanges", "[plan][recompute]") {
    const auto model = loom::plan::describe_gpt({4, 64, 4, 32, 256}, 8);
    double full_flops = 0, selective_flops = 0;
    for (const LayerSpec& l : model.layers) {
        full_flops += l.recompute();
        selective_flops += l.selective_recompute();
    }
    REQUIRE(selective_flops < full_flops / 2);
    // One device of 1 TFLOP/s: a recompute adds its FLOPs x 8 samples.
    auto cluster = devices(1, 1e12);
    Candidate c = degrees(1, 1, 1, 1);
    const double plain = loom::plan::estimate(model, cluster, c).step_seconds;
    const auto full = loom::plan::estimate(model, cluster, recomputing(c, {RecomputeMode::full, 0}, model, cluster));
    const Candidate selective_plan = recomputing(c, {RecomputeMode::selective, 0}, model, cluster);
    const auto selective = loom::plan::estimate(model, cluster, selective_plan);
    CHECK(full.step_seconds - plain == Approx(full_flops * 8 / 1e12).epsilon(0.01));
    CHECK(selective.step_seconds - plain == Approx(selective_flops * 8 / 1e12).epsilon(0.01));
    CHECK(selective.step_seconds < full.step_seconds);
    CHECK(loom::plan::detail::CostModel(model, cluster, selective_plan).lower_bound() ==
          Approx(selective.step_seconds).epsilon(0.01));
    // Tensor parallelism over 2 devices at 1 GB/s: Full's reruns repeat Megatron's all-reduces,
    // Selective's replay the projections' outputs, which come after them.
    cluster = devices(2, 1e12, Link::gbytes(1, 0));
    c = degrees(1, 1, 2, 1);
    const double split = loom::plan::estimate(model, cluster, c).step_seconds;
    const double full_tp = loom::plan::estimate(model, cluster, recomputing(c, {RecomputeMode::full, 0}, model, cluster)).step_seconds;
    const double selective_tp =
        loom::plan::estimate(model, cluster, recomputing(c, {RecomputeMode::selective, 0}, model, cluster)).step_seconds;
    CHECK(selective_tp - split == Approx(selective_flops * 8 / 2 / 1e12).epsilon(0.01));
    CHECK(full_tp - split > full_flops * 8 / 2 / 1e12 * 1.05);  // its compute and the exchanges
}

TEST_CASE("plan recompute: the joint search takes Selective where it fits and is faster than the Budget", "[plan][recompute]") {
    // memory_heavy's 8 layers on 4 devices of 25 MB (3 heads: no tp): dp 4 keeps 32 MB per device without
    // recomputing. The Budget recomputes 4 layers (+4 ms); Selective keeps 8 x 2 MB + one 4 MB rerun = 20 MB
    // and reruns 0.1 GFLOP of each layer (+0.8 ms).
    const auto model = with_products(memory_heavy(8, 4, 0, 3), 0.9e9);
    const auto cluster = devices(4, 25e6);
    const auto report = loom::plan::search(model, cluster, {.top = 3});
    REQUIRE(!report.plans.empty());
    const auto& best = report.plans.front();
    INFO(best.candidate << ": " << best.estimate.step_seconds << " s");
    CHECK(best.candidate.dp == 4);
    CHECK(best.candidate.recompute.mode == RecomputeMode::selective);
    CHECK(std::count(best.estimate.recomputed.begin(), best.estimate.recomputed.end(), true) == 8);
    CHECK(best.estimate.peak_memory <= 25e6);
    CHECK(best.estimate.step_seconds == Approx(8 * 3e-3 + 8 * 0.1e-3).epsilon(0.02));
    CHECK(loom::plan::estimate(model, cluster, best.candidate).step_seconds == Approx(best.estimate.step_seconds));
    CHECK(best.candidate.strategy().text() == "Strategy<DataParallel<bucket 2 MiB>, Recompute<Selective>>");
    // The same layout's cheapest fitting Budget was priced too, and is slower.
    Candidate layout = best.candidate;
    const auto budget = loom::plan::cheapest_fitting_recompute(model, cluster, layout, layout.partition);
    REQUIRE(budget);
    CHECK(budget->spec.mode == RecomputeMode::budget);
    layout.recompute = budget->spec;
    layout.recomputed = budget->layers;
    CHECK(loom::plan::estimate(model, cluster, layout).step_seconds == Approx(8 * 3e-3 + 4 * 1e-3).epsilon(0.02));
    // One plan per layout: the losing pricing does not take a second place.
    for (std::size_t i = 0; i < report.plans.size(); ++i)
        for (std::size_t j = i + 1; j < report.plans.size(); ++j)
            CHECK(layout_of(report.plans[i].candidate) != layout_of(report.plans[j].candidate));
    // Without products Selective is Full and is not priced apart: the Budget stays (the joint-search test).
    CHECK(loom::plan::search(memory_heavy(8, 4, 0, 3), cluster, {.top = 1}).plans.front().candidate.recompute.mode ==
          RecomputeMode::budget);
}

TEST_CASE("plan recompute: the joint search keeps the Budget where Selective is slower or does not fit", "[plan][recompute]") {
    const auto cluster = devices(4, 25e6);
    // Products of 0.1 GFLOP: Selective reruns 0.9 GFLOP of all 8 layers (+7.2 ms), the Budget 4 whole ones (+4 ms).
    const auto slow = with_products(memory_heavy(8, 4, 0, 3), 0.1e9);
    const auto report = loom::plan::search(slow, cluster, {.top = 1});
    const auto& best = report.plans.front();
    INFO(best.candidate << ": " << best.estimate.step_seconds << " s");
    CHECK(best.candidate.dp == 4);
    CHECK(best.candidate.recompute.mode == RecomputeMode::budget);
    const auto selective = loom::plan::fitting_selective_recompute(slow, cluster, best.candidate, best.estimate.partition);
    REQUIRE(selective);  // it fits, and was priced
    Candidate as_selective = best.candidate;
    as_selective.recompute = selective->spec;
    as_selective.recomputed = selective->layers;
    CHECK(loom::plan::estimate(slow, cluster, as_selective).step_seconds == Approx(8 * 3e-3 + 8 * 0.9e-3).epsilon(0.02));
    CHECK(best.estimate.step_seconds < loom::plan::estimate(slow, cluster, as_selective).step_seconds);
    // Fast products, but 19 MB devices: Selective needs 19.1 MB on dp 4, the Budget recomputes 6 layers (18 MB).
    const auto fast = with_products(memory_heavy(8, 4, 0, 3), 0.9e9);
    const auto small = devices(4, 19e6);
    const auto tight = loom::plan::search(fast, small, {.top = 1}).plans.front();
    INFO(tight.candidate << ": " << tight.estimate.step_seconds << " s");
    CHECK(tight.candidate.recompute.mode != RecomputeMode::selective);
    CHECK(tight.estimate.peak_memory <= 19e6);
    CHECK_FALSE(loom::plan::fitting_selective_recompute(fast, small, tight.candidate, tight.estimate.partition));
    Candidate dp4 = degrees(4, 1, 1, 1);
    CHECK_FALSE(loom::plan::fitting_selective_recompute(fast, small, dp4, {}));
    dp4 = recomputing(dp4, {RecomputeMode::selective, 0}, fast, small);
    CHECK(loom::plan::device_memory(fast, small, dp4, {}, dp4.recomputed).peak > 19e6);
}

TEST_CASE("plan recompute: --recompute selective prices every plan with Selective, and it reads back", "[plan][recompute]") {
    const auto model = with_products(memory_heavy(8, 4, 8e6), 0.9e9);
    const auto cluster = devices(4, 1e12, Link::gbytes(10, 0));
    const auto report =
        loom::plan::search(model, cluster, {.top = 3, .zero_stages = {0}, .recompute = RecomputeSearch::always_selective});
    REQUIRE(!report.plans.empty());
    for (const auto& plan : report.plans) {
        INFO(plan.candidate);
        CHECK(plan.candidate.recompute.mode == RecomputeMode::selective);
        CHECK(std::count(plan.estimate.recomputed.begin(), plan.estimate.recomputed.end(), true) == 8);
    }
    const Candidate& c = report.plans.front().candidate;
    CHECK(loom::parse_strategy(c.strategy().text()) == c.strategy());
    CHECK_THAT(train_gpt_flags(c, 4), Contains("--recompute selective"));
    CHECK(parse_recompute_flag("selective") == c.recompute);
    std::ostringstream line;
    line << c;
    CHECK_THAT(line.str(), Contains("recompute Selective (8 of 8 layers)"));
}

TEST_CASE("plan recompute: bad matrix-product numbers are refused, naming the layer", "[plan][recompute]") {
    auto model = memory_heavy(2, 2);
    model.layers[0].product_bytes = -1;
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Contains("model heavy: layer 0 has product_bytes -1 and product_flops 0; give finite numbers of 0 or more"));
    model.layers[0].product_bytes = 0;
    model.layers[1].product_flops = std::nan("");
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Contains("model heavy: layer 1 has product_bytes 0 and product_flops nan; give finite numbers"));
    model.layers[1].product_flops = 2e9;
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Contains("model heavy: layer 1 has product_flops 2e+09 above the 1e+09 FLOPs its recompute runs"));
    model.layers[1].product_flops = 1e9;
    model.layers[1].product_bytes = 5e6;
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Contains("model heavy: layer 1 has product_bytes 5e+06 above the 4e+06 bytes it saves"));
    model.layers[1].product_bytes = 4e6;
    CHECK_NOTHROW(model.validate());
    // The search validates what it is given.
    model.layers[0].product_flops = -1;
    CHECK_THAT(loom_test::message_of([&] { (void)loom::plan::search(model, devices(1, 1e12)); }),
               Contains("layer 0 has product_bytes 0 and product_flops -1"));
}

TEST_CASE("plan recompute: train_gpt's memory preflight counts Selective as Full, its lower bound", "[plan][recompute]") {
    const loom::gpt::Config config{4, 64, 4, 32, 256};
    const auto full = loom::train::gpt_training_memory(config, {.batch = 8, .pp = 2, .recompute = {RecomputeMode::full, 0}});
    const auto selective =
        loom::train::gpt_training_memory(config, {.batch = 8, .pp = 2, .recompute = {RecomputeMode::selective, 0}});
    CHECK(selective.activations == Approx(full.activations));
    // The planner counts Selective's products, so it predicts more than that bound.
    const auto model = loom::plan::describe_gpt(config, 8);
    const auto cluster = devices(2, 1e12);
    Candidate c = degrees(1, 2, 1, 1);
    c.partition = {2, 2};
    c = recomputing(c, {RecomputeMode::selective, 0}, model, cluster);
    Candidate f = recomputing(c, {RecomputeMode::full, 0}, model, cluster);
    CHECK(loom::plan::device_memory(model, cluster, c, c.partition, c.recomputed).peak >
          loom::plan::device_memory(model, cluster, f, f.partition, f.recomputed).peak);
}

TEST_CASE("plan recompute: with Selective priced beside the Budget, the search's best is still the brute force's", "[plan][recompute]") {
    // Every candidate that does not fit priced both ways (Selective where it fits), the faster kept: the
    // search, which prunes by lower bounds and keeps one plan per layout, finds the same top 3 steps.
    const auto model = with_products(memory_heavy(8, 4, 8e6), 0.7e9);
    const auto cluster = devices(4, 25e6, Link::gbytes(10, 0));
    const auto report = loom::plan::search(model, cluster, {.top = 3});
    std::vector<double> steps;
    int selective_best = 0;
    for (Candidate c : loom::plan::detail::enumerate(model, cluster, {})) {
        if (c.pp > 1) c.partition = loom::plan::detail::CostModel(model, cluster, c).balanced_partition();
        auto e = loom::plan::estimate(model, cluster, c);
        if (!e.fits) {
            double best = 1e300;
            for (const auto& fitting : {loom::plan::cheapest_fitting_recompute(model, cluster, c, c.partition),
                                        loom::plan::fitting_selective_recompute(model, cluster, c, c.partition)}) {
                if (!fitting) continue;
                Candidate with = c;
                with.recompute = fitting->spec;
                with.recomputed = fitting->layers;
                const auto priced = loom::plan::estimate(model, cluster, with);
                REQUIRE(priced.fits);
                if (priced.step_seconds < best) {
                    best = priced.step_seconds;
                    e = priced;
                }
            }
            if (best == 1e300) continue;
        }
        steps.push_back(e.step_seconds);
    }
    std::sort(steps.begin(), steps.end());
    REQUIRE(report.plans.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(report.plans[i].estimate.step_seconds == Approx(steps[i]));
        selective_best += report.plans[i].candidate.recompute.mode == RecomputeMode::selective ? 1 : 0;
    }
    CHECK(selective_best > 0);  // the case exercises Selective winning somewhere in the top 3
    CHECK(report.simulated < report.candidates);
}

TEST_CASE("plan recompute: under zero-bubble a rerun is held with the one below it, as the executor holds it", "[plan][recompute]") {
    const auto model = loom::plan::describe_gpt({4, 64, 4, 32, 256}, 8);
    const auto cluster = devices(2, 1e12);
    Candidate one_f_one_b = degrees(1, 2, 1, 2);
    one_f_one_b.partition = {2, 2};
    Candidate zero_bubble = one_f_one_b;
    zero_bubble.schedule = loom::ScheduleKind::zero_bubble_h1;
    for (const RecomputeSpec spec : {RecomputeSpec{RecomputeMode::full, 0}, RecomputeSpec{RecomputeMode::selective, 0}}) {
        INFO(spec.describe());
        const Candidate a = recomputing(one_f_one_b, spec, model, cluster), b = recomputing(zero_bubble, spec, model, cluster);
        const auto plain = loom::plan::device_memory(model, cluster, a, a.partition, a.recomputed);
        const auto split = loom::plan::device_memory(model, cluster, b, b.partition, b.recomputed);
        // Two recomputed layers per rank: the upper one's rerun waits for the W of the one below.
        const double pair = model.layers[1].rerun_peak(spec.mode == RecomputeMode::selective) * 8 / 2;
        CHECK(split.bytes[0] - plain.bytes[0] == Approx(pair));
    }
}

}  // namespace LOOM_TEST_FILE
