// A user's model served pipeline-parallel (infer/cached_model.hpp's stages
// through infer/pipeline_parallel_gpt.hpp's non-blocking pipeline) on rank
// threads: pp 2 and 3, and pp 2 x tp 2 (each stage a Megatron cut), give the
// whole model's completions token for token, greedy and sampled, with fewer
// slots than requests; a stage holds only its
// units' Params; and every bad input is named in one line. Catch2's macros
// are not thread-safe: the ranks record, the checks run after the world ends.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/infer/cached_model.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/nn/residual.hpp"
#include "infer/user_model_suite.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace um = loom_test::user_model;
using loom::comm::AnyComm;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::infer::Completion;
using loom_test::message_of;

std::vector<std::vector<Completion>> serve_on_ranks(int degree, std::int64_t max_batch) {
    std::vector<std::vector<Completion>> got(static_cast<std::size_t>(degree));
    ThreadWorld(degree).run([&](ThreadComm& comm) {
        AnyComm pp = AnyComm::view(comm);
        got[static_cast<std::size_t>(pp.rank())] = um::serve_pipelined_on(pp, max_batch);
    });
    return got;
}

// Two attention layers in one unit: no stage boundary may fall between them.
struct TwoAttentions {
    loom::nn::Residual<loom::nn::CausalSelfAttention> first;
    loom::nn::Residual<loom::nn::CausalSelfAttention> second;
};
struct PairedLm {
    loom::nn::Embedding embed;
    TwoAttentions pair;
    loom::nn::Linear head;
};

}  // namespace

TEST_CASE("a user's model served pipeline-parallel gives the whole model's completions", "[infer][pipeline]") {
    um::ScaledUserLm<um::UserLmWithLoss> whole(12);
    const auto expected = um::serve_whole(whole);
    // 3 attention layers: pp 2 holds 1 + 2 of them, pp 3 one each.
    for (const int degree : {2, 3})
        for (const std::int64_t max_batch : {std::int64_t{2}, std::int64_t{5}}) {
            const auto got = serve_on_ranks(degree, max_batch);
            for (std::size_t rank = 0; rank < got.size(); ++rank) {
                INFO("pp " << degree << ", " << max_batch << " slots, rank " << rank);
                REQUIRE(got[rank].size() == expected.size());
                for (std::size_t i = 0; i < expected.size(); ++i) {
                    INFO("request " << i);
                    CHECK(got[rank][i].tokens == expected[i].tokens);
                    CHECK(got[rank][i].finish == expected[i].finish);
                }
            }
        }
}

TEST_CASE("a user's model at pp 2 x tp 2 on 4 rank threads gives the whole model's completions on every rank",
          "[infer][pipeline][tp]") {
    um::ScaledUserLm<um::UserLmWithLoss> whole(12);
    const auto expected = um::serve_whole(whole);
    for (const std::int64_t max_batch : {std::int64_t{2}, std::int64_t{5}}) {
        std::vector<std::vector<Completion>> got(4);
        ThreadWorld(4).run([&](ThreadComm& comm) {
            loom::comm::Mesh<ThreadComm> mesh(comm, {{"pp", 2}, {"tp", 2}});
            AnyComm pp = AnyComm::view(mesh.axis("pp")), tp = AnyComm::view(mesh.axis("tp"));
            got[static_cast<std::size_t>(comm.rank())] = um::serve_pipelined_tp_on(pp, tp, max_batch);
        });
        for (std::size_t rank = 0; rank < got.size(); ++rank) {
            INFO(max_batch << " slots, rank " << rank);
            REQUIRE(got[rank].size() == expected.size());
            for (std::size_t i = 0; i < expected.size(); ++i) {
                INFO("request " << i);
                CHECK(got[rank][i].tokens == expected[i].tokens);
                CHECK(got[rank][i].finish == expected[i].finish);
            }
        }
    }
}

TEST_CASE("a user model's pipeline stage holds its units' attention layers and Params only", "[infer][pipeline]") {
    um::ScaledUserLm<um::UserLmWithLoss> whole(12);
    const auto first = loom::infer::model_stage(whole.model, 0, 2);
    const auto second = loom::infer::model_stage(whole.model, 1, 2);
    CHECK(first.where.first == 0);
    CHECK(first.where.count == 1);
    CHECK(second.where.first == 1);
    CHECK(second.where.count == 2);
    CHECK(first.vocab == um::V);
    CHECK(first.width == um::C);
    auto stage = um::make_user_lm<um::UserLmWithLoss>();
    loom::infer::drop_other_stages(stage, second);
    loom::nn::ParamArena arena(stage);
    // blocks[1], last, norm and head: the embeddings and blocks[0] are left out.
    constexpr std::int64_t C = um::C;
    const std::int64_t block = (4 * C * C + 4 * C) + 2 * C + (2 * C * C + 2 * C) + (2 * C * C + C) + 2 * C;
    const std::int64_t last = 2 * C + 4 * C * C + 4 * C, norm = 2 * C, head = C * um::V + um::V;
    CHECK(arena.size() == block + last + norm + head);
    loom::infer::copy_stage_values(stage, whole.model);
    CHECK(stage.head.weight.value.data<float>()[7] == whole.model.head.weight.value.data<float>()[7]);
    CHECK(stage.embed.token.numel() == 0);
}

TEST_CASE("a user model's pipeline refuses bad input in one line", "[infer][pipeline]") {
    um::ScaledUserLm<um::UserLmWithLoss> whole(12);
    CHECK(message_of([&] { (void)loom::infer::model_stage(whole.model, 0, 4); }) ==
          "model_stage: a pipeline of 4 stages for a model of 3 attention layers; use 1..3 stages (each holds at "
          "least one)");
    CHECK(message_of([&] { (void)loom::infer::model_stage(whole.model, 2, 2); }) ==
          "model_stage: stage 2 is not in a pipeline of 2 stages; give a stage in [0, 2)");
    PairedLm paired{loom::nn::Embedding::make(8, 4, 8),
                    {{{loom::nn::CausalSelfAttention::make(8, 2)}}, {{loom::nn::CausalSelfAttention::make(8, 2)}}},
                    loom::nn::Linear::make(8, 8)};
    CHECK(message_of([&] { (void)loom::infer::model_stage(paired, 0, 2); }) ==
          "model_stage: unit 1 holds attention layers 0..1, which stages 0 and 1 of 2 would split; use a degree "
          "whose stage boundaries fall between units");
    const auto second = loom::infer::model_stage(whole.model, 1, 2);
    // A stage model whose other units were not dropped holds a cache of the wrong depth, or unbound Params.
    auto unbound = um::make_user_lm<um::UserLmWithLoss>();
    loom::infer::KvCache cache(2, um::C, 2, um::T, 4);
    CHECK(message_of([&] { loom::infer::CachedModel<um::UserLmWithLoss> engine(unbound, cache, second); }).find(
              "is not bound; bind the stage model and copy_stage_values first") != std::string::npos);
    auto stage = um::make_user_lm<um::UserLmWithLoss>();
    loom::infer::drop_other_stages(stage, second);
    loom::nn::ParamArena arena(stage);
    loom::infer::copy_stage_values(stage, whole.model);
    loom::infer::KvCache shallow(1, um::C, 2, um::T, 4);
    CHECK(message_of([&] { loom::infer::CachedModel<um::UserLmWithLoss> engine(stage, shallow, second); }) ==
          "CachedModel: the model's pipeline stage 1 of 2 has 2 CausalSelfAttention layers but the cache has 1; "
          "build the cache with one layer per attention layer");
    loom::infer::CachedModel<um::UserLmWithLoss> engine(stage, cache, second);
    const std::vector<std::int32_t> tokens{1, 2, 3};
    const loom::infer::Segment segment{0, tokens};
    CHECK(message_of([&] { (void)engine.forward(std::span(&segment, 1)); }) ==
          "CachedModel: forward on pipeline stage 1 of 2; a stage runs forward_stage with the hidden rows of the "
          "stage before");
    CHECK(message_of([&] { (void)engine.forward_stage(std::span(&segment, 1), std::vector<float>(5)); }) ==
          "CachedModel: pipeline stage 1 of 2 was given 5 hidden values for 3 tokens; give 3 x 24 = 72 (the stage "
          "before's output)");
    // tp x pp: a stage that was not cut for the tp group is named on every rank.
    std::vector<std::string> messages(2);
    ThreadWorld(2).run([&](ThreadComm& comm) {
        AnyComm tp = AnyComm::view(comm);
        messages[static_cast<std::size_t>(tp.rank())] =
            message_of([&] { loom::infer::CachedModel<um::UserLmWithLoss> uncut(stage, cache, second, tp); });
    });
    for (std::size_t rank = 0; rank < messages.size(); ++rank) {
        INFO("rank " << rank << ": " << messages[rank]);
        CHECK(messages[rank].find("is not rank " + std::to_string(rank) + "'s Megatron cut for a tp group of 2; cut "
                                  "the model with tp::shard_model(model, " + std::to_string(rank) + ", 2) before "
                                  "binding it") != std::string::npos);
    }
}

}  // namespace LOOM_TEST_FILE
