// The Kraken GPT (gpt/kraken.hpp) trains under loom's executor like any
// model: data parallel over 2 rank threads (with and without ZeRO, one and
// several micro-batches) gives the single-rank run's losses and parameters.
// Megatron's tensor-parallel cut cannot place "sub-layer i on rank i" (it
// cuts every weight of a layer across the group), so a KrakenLayer declares
// no TensorCut and a tp axis runs it whole.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/kraken.hpp>

#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::Tensor;

const loom::gpt::KrakenConfig config{.layers = 2, .width = 16, .heads = 4, .seq = 8, .vocab = 256, .degree = 2};
constexpr std::int64_t rows = 4;  // the global batch, split over dp

struct Trained {
    std::vector<float> losses, params;
};

// Four steps of Strategy on `dp` rank threads; rank 0's losses and whole parameters.
template <class Strategy>
Trained train(int dp, int micro_batches) {
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 12, 1);
    Trained result;
    loom::comm::ThreadWorld(dp).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::Mesh<loom::comm::ThreadComm> mesh(comm, {{"dp", dp}, {"tp", 1}});
        auto model = loom::gpt::make_kraken(config);
        auto exec = loom::exec::Executor<loom::comm::ThreadComm>::make<Strategy>(
            model, mesh, {.micro_batches = micro_batches, .field_names = loom::gpt::kraken_field_names});
        exec.initialize(7);
        const std::int64_t mine = rows / dp;
        std::vector<std::int32_t> x(static_cast<std::size_t>(mine * config.seq)), y(x.size());
        std::vector<float> losses;
        for (int step = 0; step < 4; ++step) {
            corpus.rows(1, step, comm.rank() * mine, mine, config.seq, x, y);
            losses.push_back(exec.step(Tensor::of(x.data(), {mine, config.seq}),
                                       Tensor::of(y.data(), {mine, config.seq}), 1e-2f));
        }
        const auto n = static_cast<std::size_t>(exec.parameter_count());
        std::vector<float> values(n), m(n), v(n);
        exec.gather_state(values, m, v);
        if (comm.rank() == 0) result = {losses, values};
    });
    return result;
}

void check_equal(const Trained& parallel, const Trained& serial) {
    REQUIRE(parallel.losses.size() == serial.losses.size());
    for (std::size_t i = 0; i < serial.losses.size(); ++i)
        CHECK(std::abs(parallel.losses[i] - serial.losses[i]) <= 1e-5f * std::abs(serial.losses[i]));
    REQUIRE(parallel.params.size() == serial.params.size());
    float scale = 0, worst = 0;
    for (float p : serial.params) scale = std::max(scale, std::abs(p));
    for (std::size_t k = 0; k < serial.params.size(); ++k)
        worst = std::max(worst, std::abs(parallel.params[k] - serial.params[k]) / scale);
    // Reassociation of the dp sums, through AdamW's division by each gradient's own scale:
    // 1.1e-5 of the largest parameter after four steps (the losses agree to 1e-5).
    CHECK(worst <= 3e-5f);
}

}  // namespace

TEST_CASE("a Kraken GPT trained data parallel on 2 rank threads equals the single-rank run", "[parallel][kraken]") {
    using Plain = loom::Strategy<loom::DataParallel<>>;
    using Zero2 = loom::Strategy<loom::DataParallel<>, loom::ZeroShard<2>>;
    const Trained serial = train<Plain>(1, 1);
    REQUIRE(serial.losses.back() < serial.losses.front());  // it learns
    SECTION("dp 2") { check_equal(train<Plain>(2, 1), serial); }
    SECTION("dp 2, 2 micro-batches") { check_equal(train<Plain>(2, 2), serial); }
    SECTION("dp 2, ZeRO-2") { check_equal(train<Zero2>(2, 1), serial); }
}

}  // namespace LOOM_TEST_FILE
