// The planner prices the messages the executor sends: for each strategy
// family, the bytes per axis that the cost model prices for one step
// (plan::Traffic) equal what comm::Counted measures on every axis of a real
// step of the same GPT under the same strategy.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/counted.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/exec/executor.hpp"
#include "loom/gpt/model.hpp"
#include "loom/plan/cost_model.hpp"
#include "loom/plan/gpt_description.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::comm::AnyComm;
using loom::comm::Counted;
using loom::comm::ThreadComm;
using loom::plan::Candidate;
using loom::plan::Traffic;

constexpr loom::gpt::Config config{2, 32, 4, 16, 64};
constexpr std::int64_t batch = 8;

// The planner's stages as the executor's units, as train_gpt cuts them: the
// planner's layers fold the embedding into the first block and ln_f, the
// head and the loss into the last.
std::vector<int> units_per_stage(const Candidate& c) {
    if (c.pp == 1) return {};
    std::vector<int> blocks(static_cast<std::size_t>(c.pp), static_cast<int>(config.layers) / c.pp);
    blocks.front() += 1;
    blocks.back() += 3;
    return blocks;
}

// Payload bytes rank 0 moved on each axis in one step (of point-to-point
// traffic, a pipeline's and ring attention's, the sends).
Traffic measured(const Candidate& c) {
    Traffic out;
    loom::comm::ThreadWorld(c.devices()).run([&](ThreadComm& thread) {
        Counted<ThreadComm> world(std::move(thread));
        loom::comm::Mesh<Counted<ThreadComm>> mesh(world, {{"dp", c.dp}, {"pp", c.pp}, {"tp", c.tp}, {"sp", c.sp}});
        auto& gradients = c.sp > 1 ? mesh.combined({"dp", "sp"}) : mesh.axis("dp");
        AnyComm dp = AnyComm::view(gradients), pp = AnyComm::view(mesh.axis("pp")), tp = AnyComm::view(mesh.axis("tp")),
                sp = AnyComm::view(mesh.axis("sp"));
        auto model = loom::gpt::make_model(config);
        loom::exec::Executor<AnyComm> exec(model, dp, c.pp > 1 ? &pp : nullptr, c.tp > 1 ? &tp : nullptr,
                                           c.sp > 1 ? &sp : nullptr, c.strategy(),
                                           {.micro_batches = c.micro_batches,
                                            .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
                                            .partition = units_per_stage(c)});
        exec.initialize(3);
        const std::int64_t rows = batch / c.dp;
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows * config.seq));
        for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % config.vocab);
        const auto x = loom::Tensor::of(tokens.data(), {rows, config.seq});
        (void)exec.step(x, x, 1e-3f);  // the first step binds and sizes everything
        world.reset();
        (void)exec.step(x, x, 1e-3f);
        if (world.rank() != 0) return;
        using loom::comm::OpKind;
        const auto bytes = [](std::int64_t b) { return static_cast<double>(b); };
        out.dp = bytes(gradients.counts_with_splits().total().bytes);
        out.pp = bytes(mesh.axis("pp").counts_with_splits()[OpKind::send].bytes);
        out.tp = bytes(mesh.axis("tp").counts_with_splits().total().bytes);
        const auto sequence = mesh.axis("sp").counts_with_splits();
        out.sp = bytes(c.ulysses ? sequence.total().bytes : sequence[OpKind::send].bytes);
    });
    return out;
}

Candidate family(int dp, int pp, int tp, int sp, int zero, bool grid = false, bool ulysses = false) {
    Candidate c;
    c.dp = dp;
    c.pp = pp;
    c.tp = tp;
    c.sp = sp;
    c.zero = zero;
    c.tp_grid = grid;
    c.ulysses = ulysses;
    c.micro_batches = 2;
    return c;
}

Candidate zero_bubble(Candidate c) {
    c.schedule = loom::ScheduleKind::zero_bubble_h1;
    return c;
}

}  // namespace

TEST_CASE("plan: the bytes the cost model prices per axis equal the bytes the executor sends", "[plan][traffic]") {
    // Data parallelism at ZeRO 0-3 (bucketed gradients, ZeRO-3's gathers unit
    // by unit, the loss), Megatron's all-reduces, ring attention and Ulysses,
    // pipelines (1F1B and ZB-H1: stage messages, and each stage's gradient
    // reductions), mixes, and the Optimus 2 x 2 grid (SUMMA's broadcasts and
    // reduce-scatters, LayerNorm's and the loss's row statistics, the
    // embedding's column exchanges), alone, with dp at ZeRO 0 and 3 (the
    // vectors cut q ways, the rest q^2) and with pp (a rank's block of the
    // boundary).
    const auto model = loom::plan::describe_gpt(config, batch);
    for (const Candidate& c : {family(2, 1, 1, 1, 0), family(2, 1, 1, 1, 1), family(2, 1, 1, 1, 2), family(1, 2, 1, 1, 0),
                               family(1, 1, 2, 1, 0), family(1, 1, 4, 1, 0), family(1, 1, 1, 2, 0),
                               family(1, 1, 1, 4, 0), family(1, 1, 1, 2, 0, false, true), family(1, 1, 2, 2, 0),
                               family(2, 1, 2, 1, 1), family(2, 1, 2, 2, 2), family(2, 2, 1, 1, 0),
                               family(2, 2, 1, 1, 1), family(2, 2, 2, 1, 2), zero_bubble(family(2, 2, 1, 1, 0)),
                               zero_bubble(family(1, 2, 2, 1, 0)), family(2, 1, 1, 1, 3), family(2, 1, 2, 1, 3),
                               family(2, 1, 1, 2, 3), family(2, 2, 1, 1, 3), family(1, 1, 4, 1, 0, true), family(2, 1, 4, 1, 0, true), family(2, 1, 4, 1, 3, true), family(1, 2, 4, 1, 0, true)}) {
        const auto cluster = loom::plan::Cluster::uniform(1, c.devices(), 1e12, 1e12, loom::comm::Link::unlimited(),
                                                          loom::comm::Link::unlimited());
        const Traffic priced = loom::plan::estimate(model, cluster, c).traffic.at(0);
        const Traffic counted = measured(c);
        INFO(c.strategy().text() << " on dp " << c.dp << " x pp " << c.pp << " x tp " << c.tp << " x sp " << c.sp
                                 << ": priced dp " << priced.dp << ", pp " << priced.pp << ", tp " << priced.tp << ", sp "
                                 << priced.sp << "; counted " << counted.dp << ", " << counted.pp << ", " << counted.tp
                                 << ", " << counted.sp);
        // An axis of one rank moves nothing: the executor's calls on it are copies.
        if (c.dp * c.sp > 1) CHECK(priced.dp == counted.dp);
        if (c.pp > 1) CHECK(priced.pp == counted.pp);
        if (c.tp > 1) CHECK(priced.tp == counted.tp);
        if (c.sp > 1) CHECK(priced.sp == counted.sp);
        CHECK(priced.dp + priced.pp + priced.tp + priced.sp > 0);
    }
}

TEST_CASE("plan: a layer whose parameters do not add up is refused by name", "[plan][traffic]") {
    auto model = loom::plan::describe_gpt(config, batch);
    model.layers[0].units.clear();
    model.layers[0].tp_replicated_params = model.layers[0].params + 1;
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Catch::Contains(": layer embed + blocks[0] keeps 15265 parameters whole on every tp rank; give 0 to its "
                               "15264 parameters"));
    model = loom::plan::describe_gpt(config, batch);
    model.layers[1].units.back().params = 1;  // the loss
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Catch::Contains(": layer blocks[1] + ln_f, head, loss's 4 units hold 14817 parameters (256 kept whole) "
                               "and its main unit is 0; they must add up to its 14816 (256) and the main unit be one of "
                               "them"));
    // The vectors a 2D grid cuts q ways (biases, LayerNorms, the position table).
    model = loom::plan::describe_gpt(config, batch);
    model.layers[0].units.clear();
    model.layers[0].grid_vector_params = model.layers[0].params + 1;
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Catch::Contains(": layer embed + blocks[0] has 15265 vector parameters a 2D grid cuts q ways; give 0 to "
                               "its 15264 parameters"));
    model = loom::plan::describe_gpt(config, batch);
    model.layers[1].units.back().grid_vector_params = 1;  // the loss
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Catch::Contains(": layer blocks[1] + ln_f, head, loss's 4 units hold 481 vector parameters a 2D grid "
                               "cuts q ways; they must add up to its 480"));
}

TEST_CASE("plan: a layer's 2D grid bytes that are negative or not finite are refused by name", "[plan][traffic]") {
    auto model = loom::plan::describe_gpt(config, batch);
    model.layers[1].grid_backward.row = -1;
    CHECK_THAT(loom_test::message_of([&] { model.validate(); }),
               Catch::Contains(": layer blocks[1] + ln_f, head, loss has grid_forward {row 23104, column 0, weights "
                               "57344, scalars 4} and grid_backward {row -1, column 0, weights 116608, scalars 0}; "
                               "give finite bytes of 0 or more (all 0: the planner estimates a 2D grid's messages)"));
}

}  // namespace LOOM_TEST_FILE
