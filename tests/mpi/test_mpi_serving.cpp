// Tensor- and pipeline-parallel serving under mpirun (the GPT's, both at once, Kraken's and a user model's):
// tp (or pp) = the number of processes, the requests the rank-thread tests run
// (tests/infer/tensor_parallel_serving_suite.hpp, pipeline_serving_suite.hpp,
// kraken_serving_suite.hpp),
// against the whole model in each process: greedy and seeded, a mixed-length
// batch refilled continuously.
#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/mesh.hpp>

#include "infer/kraken_serving_suite.hpp"
#include "infer/pipeline_serving_suite.hpp"
#include "infer/tensor_parallel_serving_suite.hpp"
#include "infer/user_model_suite.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("tensor-parallel serving gives the whole model's tokens under MPI", "[serving]") {
    auto world = loom::comm::Mpi::world();
    loom::comm::AnyComm tp = loom::comm::AnyComm::view(world);
    loom_test::SmallGpt whole(32);
    for (const bool greedy : {true, false}) {
        const auto batch = loom_test::mixed_batch(greedy);
        const auto expected = loom::infer::generate(whole.model, whole.config, batch, 2);
        const auto got = loom_test::serve_on(tp, whole, batch, 2);
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO((greedy ? "greedy" : "sampled") << " request " << i << ", rank " << tp.rank() << " of " << tp.size());
            CHECK(got[i].tokens == expected[i].tokens);
            CHECK(got[i].finish == expected[i].finish);
        }
    }
}

TEST_CASE("pipeline-parallel serving gives the whole model's tokens under MPI", "[pp_serving]") {
    auto world = loom::comm::Mpi::world();
    loom::comm::AnyComm pp = loom::comm::AnyComm::view(world);
    loom_test::PipelineGpt whole(33);
    for (const bool greedy : {true, false}) {
        const auto batch = loom_test::mixed_batch(greedy);
        const auto expected = loom::infer::generate(whole.model, whole.config, batch, 2);
        // (max_batch, the prompt tokens a step admits: 0 for no limit)
        for (const auto& [max_batch, budget] :
             {std::pair<std::int64_t, std::int64_t>{0, 0}, {2, 0}, {3, 12}}) {
            const auto got = loom_test::serve_pipelined_on(pp, whole, batch, max_batch, {.prefill_tokens = budget});
            REQUIRE(got.size() == expected.size());
            for (std::size_t i = 0; i < got.size(); ++i) {
                INFO((greedy ? "greedy" : "sampled") << " request " << i << ", max_batch " << max_batch
                                                     << ", prefill_tokens " << budget << ", rank " << pp.rank()
                                                     << " of " << pp.size());
                CHECK(got[i].tokens == expected[i].tokens);
                CHECK(got[i].finish == expected[i].finish);
            }
        }
    }
}

TEST_CASE("pp 2 x tp 2 serving on 4 processes gives the whole model's tokens under MPI", "[pp_tp_serving]") {
    auto world = loom::comm::Mpi::world();
    loom::comm::Mesh<loom::comm::Mpi> mesh(world, {{"pp", 2}, {"tp", world.size() / 2}});
    loom::comm::AnyComm pp = loom::comm::AnyComm::view(mesh.axis("pp")), tp = loom::comm::AnyComm::view(mesh.axis("tp"));
    loom_test::PipelineGpt whole(37);
    for (const bool greedy : {true, false}) {
        const auto batch = loom_test::mixed_batch(greedy);
        const auto expected = loom::infer::generate(whole.model, whole.config, batch, 2);
        const auto got = loom_test::serve_pipelined_tp_on(pp, tp, whole, batch, 2);
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO((greedy ? "greedy" : "sampled") << " request " << i << ", stage " << pp.rank() << ", tp rank "
                                                 << tp.rank());
            CHECK(got[i].tokens == expected[i].tokens);
            CHECK(got[i].finish == expected[i].finish);
        }
    }
}

TEST_CASE("a user's model cut by tp::shard_model serves at tp = the processes with tp 1's tokens under MPI",
          "[user_model_serving]") {
    auto world = loom::comm::Mpi::world();
    loom::comm::AnyComm tp = loom::comm::AnyComm::view(world);
    loom_test::user_model::ScaledUserLm<loom_test::user_model::UserLmWithLoss> whole(12);
    const auto expected = loom_test::user_model::serve_whole(whole);
    const auto got = loom_test::user_model::serve_on(tp);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("request " << i << ", rank " << tp.rank() << " of " << tp.size());
        CHECK(got[i].tokens == expected[i].tokens);
        CHECK(got[i].finish == expected[i].finish);
    }
}

TEST_CASE("Kraken served at tp = the processes gives the whole model's completions under MPI", "[kraken_serving]") {
    auto world = loom::comm::Mpi::world();
    loom::comm::AnyComm tp = loom::comm::AnyComm::view(world);
    loom_test::TinyKraken whole(4);  // 4 sub-layers per layer: 2 or 1 on each of 2 or 4 processes
    for (const bool greedy : {true, false}) {
        const auto batch = loom_test::mixed_batch(greedy);
        const auto expected = loom_test::serve_kraken_whole(whole, batch, 2);
        const auto got = loom_test::serve_kraken_on(tp, whole, batch, 2);
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO((greedy ? "greedy" : "sampled") << " request " << i << ", rank " << tp.rank() << " of " << tp.size());
            CHECK(got[i].tokens == expected[i].tokens);
            CHECK(got[i].finish == expected[i].finish);
        }
    }
}

}  // namespace LOOM_TEST_FILE
