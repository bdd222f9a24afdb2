// The Kraken GPT (gpt/kraken.hpp) trains under loom's executor like any
// model: data parallel over 2 rank threads (with and without ZeRO, one and
// several micro-batches), on a pipeline, and tensor parallel with sub-layer i
// on rank i (KrakenLayer places its own parts, nn::TensorCut::own) gives the
// single-rank run's losses and parameters. The body is
// parallel/kraken_training_suite.hpp, which the MPI tests run too.
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>
#include <string>
#include <utility>

#include <loom/comm/thread_world.hpp>
#include <loom/parallel/tensor_parallel_model.hpp>

#include "parallel/kraken_training_suite.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom_test::KrakenCase;

// The case on dp x pp x tp rank threads; rank 0's result.
loom_test::KrakenTrained train_on_threads(const KrakenCase& c, const std::filesystem::path& load_from = {},
                                          const std::filesystem::path& save_to = {}) {
    loom_test::KrakenTrained result;
    loom::comm::ThreadWorld(c.dp * c.pp * c.tp).run([&](loom::comm::ThreadComm& comm) {
        auto mine = loom_test::train_kraken(comm, c, load_from, save_to);
        if (comm.rank() == 0) result = std::move(mine);
    });
    return result;
}

void check_equal(const KrakenCase& c, const loom_test::KrakenTrained& serial) {
    const auto errors = loom_test::kraken_errors(train_on_threads(c), serial);
    INFO(c << ": loss error " << errors.loss << ", parameter error " << errors.param);
    CHECK(errors.loss <= loom_test::kraken_loss_bound);
    CHECK(errors.param <= loom_test::kraken_param_bound);
}

}  // namespace

TEST_CASE("a Kraken GPT trained data parallel on 2 rank threads equals the single-rank run", "[parallel][kraken]") {
    const auto serial = train_on_threads({});
    REQUIRE(serial.losses.back() < serial.losses.front());  // it learns
    SECTION("dp 2") { check_equal({.dp = 2}, serial); }
    SECTION("dp 2, 2 micro-batches") { check_equal({.dp = 2, .micro_batches = 2}, serial); }
    SECTION("dp 2, ZeRO-2") { check_equal({.dp = 2, .zero_stage = 2}, serial); }
}

TEST_CASE("a Kraken GPT trained with sub-layer i on tp rank i, alone and with dp and pp, equals the single-rank run",
          "[parallel][kraken]") {
    for (std::int64_t degree : {2, 4}) {
        const auto serial = train_on_threads({.degree = degree});
        check_equal({.tp = 2, .degree = degree}, serial);
        check_equal({.pp = 2, .micro_batches = 2, .degree = degree}, serial);
    }
    const auto serial = train_on_threads({.degree = 4});
    check_equal({.tp = 4, .degree = 4}, serial);
    check_equal({.dp = 2, .tp = 2, .zero_stage = 3, .micro_batches = 2, .degree = 4}, serial);
    check_equal({.pp = 2, .tp = 2, .micro_batches = 2, .degree = 2}, train_on_threads({.degree = 2}));
}

// The sum a layer leaves to the next travels in the state, so a unit
// recomputed in backward re-issues its own all-reduces and nothing else.
TEST_CASE("Kraken at pp 2 x tp 2 with Full and Selective recomputation is bit-identical to the run without it",
          "[parallel][kraken]") {
    const KrakenCase plain{.pp = 2, .tp = 2, .micro_batches = 2, .degree = 2};
    const auto reference = train_on_threads(plain);
    for (const loom::RecomputeSpec& recompute :
         {loom::Recompute<loom::Full>::spec, loom::Recompute<loom::Selective>::spec}) {
        KrakenCase c = plain;
        c.recompute = recompute;
        INFO(c);
        const auto run = train_on_threads(c);
        CHECK(run.recomputes > 0);
        CHECK(run.losses == reference.losses);
        CHECK(run.params == reference.params);
    }
}

TEST_CASE("a Kraken checkpoint saved with its sub-layers on 2 tp ranks loads on 1, 4 and dp 2 x pp 2 ranks",
          "[parallel][kraken]") {
    const auto dir = std::filesystem::temp_directory_path() / "loom_kraken_tp_checkpoint";
    std::filesystem::remove_all(dir);
    const auto saved = train_on_threads({.tp = 2, .degree = 4, .steps = 2}, {}, dir);
    for (const KrakenCase& c : {KrakenCase{.degree = 4, .steps = 0}, KrakenCase{.tp = 4, .degree = 4, .steps = 0},
                                KrakenCase{.dp = 2, .pp = 2, .degree = 4, .steps = 0}}) {
        INFO(c);
        CHECK(train_on_threads(c, dir).params == saved.params);  // bit for bit
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("Kraken's layer places its own sub-layers on a tp group and refuses a degree that does not divide them",
          "[parallel][kraken]") {
    const auto config = loom_test::kraken_training_config(4);
    auto model = loom::gpt::make_kraken(config);
    loom::tp::CutReport report;
    const auto summary = loom::tp::shard_model(model, 1, 2, &report, loom::gpt::kraken_field_names);
    CHECK(summary.owned == 2);
    CHECK(report.warning().empty());  // every layer with weights is cut
    std::ostringstream described;
    described << report;
    INFO(described.str());
    CHECK(described.str().find("its own parts placed per rank") != std::string::npos);
    const auto& layer = model.layers[0];
    CHECK_FALSE(layer.holds(0));
    CHECK_FALSE(layer.holds(1));
    CHECK(layer.holds(2));
    CHECK(layer.holds(3));
    const loom::Param& held_elsewhere = layer.subs[0].mlp.fc.weight;
    CHECK(held_elsewhere.numel() == 0);
    CHECK(held_elsewhere.full_shape().numel() == layer.subs[2].mlp.fc.weight.numel());
    std::ostringstream printed;
    printed << held_elsewhere;
    CHECK(printed.str().find("held by tp rank 0") != std::string::npos);

    auto odd = loom::gpt::make_kraken(config);
    CHECK_THROWS_WITH(loom::tp::shard_model(odd, 0, 8),
                      Catch::Contains("KrakenLayer: a tp group of 8 ranks for a layer of 4 sub-layers; use a tp "
                                      "degree that divides 4"));
    auto twice = loom::gpt::make_kraken(config);
    twice.layers[0].place_on_tensor_group(0, 2);
    CHECK_THROWS_WITH(twice.layers[0].place_on_tensor_group(0, 2),
                      Catch::Contains("KrakenLayer: placed on a tp group twice"));
}

}  // namespace LOOM_TEST_FILE
