// Tensor- and pipeline-parallel serving under mpirun (the GPT's, both at once, Kraken's and a user model's),
// and peer memory pooling between two processes:
// tp (or pp) = the number of processes, the requests the rank-thread tests run
// (tests/infer/tensor_parallel_serving_suite.hpp, pipeline_serving_suite.hpp,
// kraken_serving_suite.hpp),
// against the whole model in each process: greedy and seeded, a mixed-length
// batch refilled continuously.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>
#include <utility>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/comm/shared_window_mpi.hpp>
#include <loom/infer/block_prefetcher.hpp>
#include <loom/infer/cached_gpt.hpp>
#include <loom/infer/kv_cache.hpp>
#include <loom/infer/pooled_gpt.hpp>

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

TEST_CASE("pp 2 x tp 2 serving on 4 processes gives the whole model's tokens under MPI (GPT, a user's model, Kraken)",
          "[pp_tp_serving]") {
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
    // A user's model on the same mesh: each process its tp cut of its stage.
    loom_test::user_model::ScaledUserLm<loom_test::user_model::UserLmWithLoss> user(12);
    const auto expected = loom_test::user_model::serve_whole(user);
    const auto got = loom_test::user_model::serve_pipelined_tp_on(pp, tp);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("user model request " << i << ", stage " << pp.rank() << ", tp rank " << tp.rank());
        CHECK(got[i].tokens == expected[i].tokens);
        CHECK(got[i].finish == expected[i].finish);
    }
    // And Kraken: each process its sub-layers of its stage's layers.
    loom_test::TinyKraken kraken(2, /*layers=*/4);
    const auto kraken_batch = loom_test::mixed_batch(true);
    const auto kraken_expected = loom_test::serve_kraken_whole(kraken, kraken_batch, 2);
    const auto kraken_got = loom_test::serve_kraken_pipelined_on(pp, &tp, kraken, kraken_batch, 2);
    REQUIRE(kraken_got.size() == kraken_expected.size());
    for (std::size_t i = 0; i < kraken_got.size(); ++i) {
        INFO("Kraken request " << i << ", stage " << pp.rank() << ", tp rank " << tp.rank());
        CHECK(kraken_got[i].tokens == kraken_expected[i].tokens);
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

TEST_CASE("a user's model served pipeline-parallel gives the whole model's completions under MPI",
          "[user_model_pp_serving]") {
    auto world = loom::comm::Mpi::world();
    loom::comm::AnyComm pp = loom::comm::AnyComm::view(world);
    loom_test::user_model::ScaledUserLm<loom_test::user_model::UserLmWithLoss> whole(12);
    const auto expected = loom_test::user_model::serve_whole(whole);
    for (const std::int64_t max_batch : {std::int64_t{2}, std::int64_t{5}}) {
        const auto got = loom_test::user_model::serve_pipelined_on(pp, max_batch);
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO("request " << i << ", " << max_batch << " slots, rank " << pp.rank() << " of " << pp.size());
            CHECK(got[i].tokens == expected[i].tokens);
            CHECK(got[i].finish == expected[i].finish);
        }
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

TEST_CASE("two processes that each hold half the blocks and read the rest from the other's memory give the "
          "resident model's tokens", "[pool_serving]") {
    auto world = loom::comm::Mpi::world();
    REQUIRE(world.size() == 2);
    loom_test::PipelineGpt whole(34);  // 4 blocks: each process keeps the 2 of its parity
    const int rank = world.rank(), peer = 1 - rank;
    std::vector<std::int64_t> mine_pooled, peer_pooled;
    for (std::int64_t b = 0; b < whole.config.layers; ++b)
        (b % 2 == rank ? peer_pooled : mine_pooled).push_back(b);
    loom::comm::SharedWindow window(world,
                                    loom::infer::PooledGpt::resident_floats(whole.config, mine_pooled));
    loom::infer::PooledGpt replica(whole.config, whole.arena.values(), mine_pooled, window.mine());
    window.publish();
    replica.pool_from(window.of(peer), peer_pooled);
    CHECK(replica.home(mine_pooled.front()) == loom::infer::BlockHome::peer);
    // Process 0 stages its pooled blocks one ahead; process 1 reads them in place.
    std::optional<loom::infer::BlockPrefetcher> prefetcher;
    if (rank == 0) prefetcher.emplace(replica, loom::infer::PrefetchOptions{.lookahead = 1});
    for (const bool greedy : {true, false}) {
        auto batch = loom_test::mixed_batch(greedy);
        if (rank == 1) std::reverse(batch.begin(), batch.end());  // each serves its own requests
        const auto expected = loom::infer::generate(whole.model, whole.config, batch, 2);
        loom::infer::KvCache cache(whole.config.layers, whole.config.width, 2, whole.config.seq);
        loom::infer::CachedGpt engine(replica.model(), whole.config, cache);
        if (prefetcher) engine.prefetch_blocks(*prefetcher);
        const auto got = loom::infer::generate(engine, batch);
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO((greedy ? "greedy" : "sampled") << " request " << i << ", rank " << rank);
            CHECK(got[i].tokens == expected[i].tokens);
            CHECK(got[i].finish == expected[i].finish);
        }
    }
    world.barrier();  // neither frees its part of the window while the other may read it
}

}  // namespace LOOM_TEST_FILE
