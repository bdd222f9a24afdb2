// Pipeline-parallel serving (infer/pipeline_parallel_gpt.hpp) on rank threads
// against the whole model on one (pp 1): greedy and seeded generation token
// for token at pp 2 and 4, alone and in mixed-length continuous batches with
// several groups in flight, a stage's values and hidden rows, and every bad
// input named in one line. Catch2's macros are not thread-safe, so the rank
// threads only record what they got and the checks run after the world ends.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/exec/trace.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipeline_parallel_gpt.hpp"
#include "loom/infer/pipeline_stage.hpp"
#include "loom/infer/pipelined_batcher.hpp"
#include "loom/nn/param_arena.hpp"
#include "infer/pipeline_serving_suite.hpp"
#include "infer/tensor_parallel_serving_suite.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::comm::AnyComm;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::infer::CachedGpt;
using loom::infer::Completion;
using loom::infer::KvCache;
using loom::infer::PipelineOptions;
using loom::infer::Request;
using loom::infer::Segment;
using loom_test::message_of;
using loom_test::mixed_batch;
using loom_test::PipelineGpt;
using loom_test::prompt_of;
using loom_test::RankStage;
using loom_test::request;

// Every rank's completions for the requests, generated on a pipeline of `degree` rank threads.
std::vector<std::vector<Completion>> generate_on_ranks(const PipelineGpt& whole, int degree,
                                                       const std::vector<Request>& requests, std::int64_t max_batch,
                                                       int groups = 0, std::int64_t prefill_tokens = 0) {
    std::vector<std::vector<Completion>> got(static_cast<std::size_t>(degree));
    ThreadWorld(degree).run([&](ThreadComm& comm) {
        AnyComm pp = AnyComm::view(comm);
        got[static_cast<std::size_t>(pp.rank())] = loom_test::serve_pipelined_on(
            pp, whole, requests, max_batch, PipelineOptions{.groups = groups, .prefill_tokens = prefill_tokens});
    });
    return got;
}

void check_same(const std::vector<Completion>& got, const std::vector<Completion>& expected) {
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("request " << i);
        CHECK(got[i].tokens == expected[i].tokens);
        CHECK(got[i].finish == expected[i].finish);
    }
}

void check_every_rank(const std::vector<std::vector<Completion>>& got, const std::vector<Completion>& expected) {
    for (std::size_t rank = 0; rank < got.size(); ++rank) {
        INFO("rank " << rank << " of " << got.size());
        check_same(got[rank], expected);
    }
}

// One rank's message, or "(no error)", for each rank of a pipeline of `degree`.
std::vector<std::string> messages_on_ranks(int degree, const std::function<void(AnyComm&)>& body) {
    std::vector<std::string> said(static_cast<std::size_t>(degree));
    ThreadWorld(degree).run([&](ThreadComm& comm) {
        AnyComm pp = AnyComm::view(comm);
        said[static_cast<std::size_t>(pp.rank())] = message_of([&] { body(pp); });
    });
    return said;
}

}  // namespace

TEST_CASE("a pipeline stage's hidden rows, passed on, give the whole model's logits", "[infer][pp]") {
    const PipelineGpt whole(31);
    const auto& config = whole.config;
    const std::vector<std::int32_t> a = prompt_of(5, 42, 1), b = prompt_of(9, 42, 2);
    const std::vector<Segment> segments{{0, a}, {1, b}};
    KvCache whole_cache(config.layers, config.width, 2, 16);
    auto whole_model = loom::gpt::make_model(config);  // a copy: ScaledGpt's model is const here
    loom::nn::ParamArena whole_arena(whole_model);
    std::copy(whole.arena.values().begin(), whole.arena.values().end(), whole_arena.values().begin());
    CachedGpt engine(whole_model, config, whole_cache);
    const auto expected = engine.forward(segments);
    const std::vector<float> reference(expected.begin(), expected.end());
    for (const int degree : {2, 4}) {
        INFO("pp " << degree);
        std::vector<float> hidden;
        for (int s = 0; s < degree; ++s) {
            RankStage stage(whole, s, degree);
            KvCache cache = loom::infer::pipeline_cache(config, stage.where, 2, 16);
            CachedGpt part(stage.model, config, cache, stage.where);
            const auto out = part.forward_stage(segments, hidden);
            hidden.assign(out.begin(), out.end());
        }
        // The same kernels on the same rows in the same order: the same bits.
        CHECK(hidden == reference);
    }
}

TEST_CASE("pp greedy generation of one request equals pp 1's", "[infer][pp]") {
    const PipelineGpt whole(32);
    const std::vector<Request> one{request(prompt_of(5, 42, 1), 20, true)};
    const auto expected = loom::infer::generate(const_cast<loom::gpt::Model&>(whole.model), whole.config, one);
    for (const int degree : {1, 2, 4}) {
        INFO("pp " << degree);
        check_every_rank(generate_on_ranks(whole, degree, one, 0), expected);
    }
}

TEST_CASE("pp greedy and seeded generation of mixed-length continuous batches equals pp 1's", "[infer][pp]") {
    const PipelineGpt whole(33);
    for (const bool greedy : {true, false}) {
        auto& model = const_cast<loom::gpt::Model&>(whole.model);
        auto batch = mixed_batch(greedy);
        // Request 2 stops at its own 6th token (or earlier, where that token comes sooner), mid-batch.
        batch[2].stop_tokens = {loom::infer::generate(model, whole.config, batch)[2].tokens.at(5)};
        // pp 1's tokens depend on neither the batch nor the slots (the Batcher tests), so one reference serves all.
        const auto expected = loom::infer::generate(model, whole.config, batch, 2);
        CHECK(expected[2].finish == loom::infer::Finish::stop);
        CHECK(expected[2].tokens.size() < 14);
        for (const int degree : {2, 4})
            for (const std::int64_t max_batch : {0, 2, 3})
                for (const int groups : {0, 1, 2, 3}) {
                    INFO((greedy ? "greedy" : "sampled") << ", pp " << degree << ", max_batch " << max_batch
                                                         << ", groups " << groups);
                    check_every_rank(generate_on_ranks(whole, degree, batch, max_batch, groups), expected);
                }
    }
    // Sampling at temperature 4 is not the argmax: the seeded check is not the greedy one again.
    const auto greedy = loom::infer::generate(const_cast<loom::gpt::Model&>(whole.model), whole.config, mixed_batch(true));
    const auto sampled = loom::infer::generate(const_cast<loom::gpt::Model&>(whole.model), whole.config, mixed_batch(false));
    CHECK(greedy[0].tokens != sampled[0].tokens);
}

TEST_CASE("pp with a prompt-token budget per step gives pp 1's completions", "[infer][pp]") {
    const PipelineGpt whole(37);
    auto& model = const_cast<loom::gpt::Model&>(whole.model);
    for (const bool greedy : {true, false}) {
        const auto batch = mixed_batch(greedy);
        const auto expected = loom::infer::generate(model, whole.config, batch, 2);
        // 1: every prompt alone (each is longer); 12: some steps admit two; 1000: all at once.
        for (const std::int64_t budget : {1, 12, 1000})
            for (const std::int64_t max_batch : {0, 3}) {
                INFO((greedy ? "greedy" : "sampled") << ", prefill_tokens " << budget << ", max_batch " << max_batch);
                check_every_rank(generate_on_ranks(whole, 2, batch, max_batch, 0, budget), expected);
            }
    }
}

TEST_CASE("a prompt-token budget spreads admissions over steps: each step admits at most its budget", "[infer][pp]") {
    const PipelineGpt whole(38);
    const std::vector<Request> batch{request(prompt_of(5, 42, 1), 3, true), request(prompt_of(4, 42, 2), 3, true),
                                     request(prompt_of(6, 42, 3), 3, true)};
    // With one group, step k reports the requests admitted so far: with a
    // budget of 9 the first step takes the 5- and 4-token prompts, not the 6.
    for (const auto& [budget, first] : {std::pair<std::int64_t, std::size_t>{0, 3}, {9, 2}, {1, 1}}) {
        std::size_t reported = 0;
        ThreadWorld(2).run([&](ThreadComm& comm) {
            AnyComm pp = AnyComm::view(comm);
            RankStage stage(whole, pp.rank(), 2);
            KvCache cache = loom::infer::pipeline_cache(whole.config, stage.where, 3, 16);
            CachedGpt engine(stage.model, whole.config, cache, stage.where);
            if (pp.rank() != 0) return loom::infer::serve_pipeline_stage(engine, pp);
            loom::infer::PipelinedBatcher batcher(engine, pp, {.groups = 1, .prefill_tokens = budget});
            for (const Request& r : batch) (void)batcher.submit(r);
            reported = batcher.step().size();
            while (!batcher.idle()) (void)batcher.step();
        });
        INFO("prefill_tokens " << budget);
        CHECK(reported == first);
    }
}

TEST_CASE("pp 2 x tp 2 on 4 rank threads: greedy and seeded mixed batches give pp 1's completions on every rank",
          "[infer][pp][tp]") {
    const PipelineGpt whole(36);
    auto& model = const_cast<loom::gpt::Model&>(whole.model);
    for (const bool greedy : {true, false}) {
        const auto batch = mixed_batch(greedy);
        const auto expected = loom::infer::generate(model, whole.config, batch, 2);
        for (const std::int64_t max_batch : {0, 2}) {
            std::vector<std::vector<Completion>> got(4);
            ThreadWorld(4).run([&](ThreadComm& comm) {
                loom::comm::Mesh<ThreadComm> mesh(comm, {{"pp", 2}, {"tp", 2}});
                AnyComm pp = AnyComm::view(mesh.axis("pp")), tp = AnyComm::view(mesh.axis("tp"));
                got[static_cast<std::size_t>(comm.rank())] =
                    loom_test::serve_pipelined_tp_on(pp, tp, whole, batch, max_batch);
            });
            INFO((greedy ? "greedy" : "sampled") << ", max_batch " << max_batch);
            check_every_rank(got, expected);
        }
    }
}

TEST_CASE("pp 2 keeps both groups in flight: each stage records a step of every group", "[infer][pp]") {
    const PipelineGpt whole(34);
    const auto batch = mixed_batch(true);
    std::vector<std::vector<loom::exec::TraceEvent>> events(2);
    ThreadWorld(2).run([&](ThreadComm& comm) {
        AnyComm pp = AnyComm::view(comm);
        loom::exec::Trace trace(true);
        (void)loom_test::serve_pipelined_on(pp, whole, batch, 4, PipelineOptions{.groups = 2, .trace = &trace});
        events[static_cast<std::size_t>(pp.rank())] = trace.events();
    });
    for (std::size_t rank = 0; rank < 2; ++rank) {
        bool group[2] = {false, false};
        for (const auto& e : events[rank])
            if (e.category == "forward" && e.micro_batch >= 0 && e.micro_batch < 2) group[e.micro_batch] = true;
        INFO("stage " << rank);
        CHECK(group[0]);
        CHECK(group[1]);
    }
}

TEST_CASE("pipeline-parallel serving names each bad input in one line", "[infer][pp]") {
    const PipelineGpt whole(35);
    const auto& config = whole.config;
    CHECK(message_of([&] { (void)loom::infer::pipeline_stage(config, 0, 3); }) ==
          "pipeline degree 3 does not divide the 4 layers; use 1, 2 or 4");
    CHECK(message_of([&] { (void)loom::infer::pipeline_stage(config, 0, 8); }) ==
          "pipeline degree 8 exceeds the 4 layers; use 1, 2 or 4");
    CHECK(message_of([&] { (void)loom::infer::pipeline_stage(config, 0, 0); }) ==
          "pipeline degree 0 does not divide the 4 layers; use 1, 2 or 4");
    CHECK(message_of([&] { (void)loom::infer::pipeline_stage(config, 2, 2); }) ==
          "pipeline stage 2 is not in a pipeline of 2 stages; give a stage in [0, 2)");
    const auto where = loom::infer::pipeline_stage(config, 1, 2);
    CHECK(message_of([&] {
              auto stage = loom::infer::make_stage_model(config, where);
              loom::nn::ParamArena arena(stage);
              std::vector<float> values(10);
              loom::infer::load_stage_values(stage, config, where, values);
          }) == "load_stage_values: 10 values given but the whole GPT(layers=4, width=32, heads=4, seq=32, vocab=42) "
                "has 54592; give the whole model's values in serial order");
    CHECK(message_of([&] {
              auto stage = loom::infer::make_stage_model(config, loom::infer::pipeline_stage(config, 0, 2));
              loom::nn::ParamArena arena(stage);
              loom::infer::load_stage_values(stage, config, where, whole.arena.values());
          }) == "load_stage_values: the stage model holds 27776 values but stage 1 of 2 holds 26816; build it with "
                "make_stage_model(config, pipeline_stage(config, 1, 2))");
    RankStage last(whole, 1, 2);
    KvCache cache = loom::infer::pipeline_cache(config, where, 2, 16);
    CHECK(message_of([&] {
              auto whole_model = loom::gpt::make_model(config);
              loom::nn::ParamArena arena(whole_model);
              CachedGpt engine(whole_model, config, cache, where);
          }) == "CachedGpt: the model has 4 blocks but pipeline stage 1 of 2 holds 2 (blocks 2..3); build it with "
                "make_stage_model");
    CHECK(message_of([&] {
              KvCache wrong(config.layers, config.width, 2, 16);
              CachedGpt engine(last.model, config, wrong, where);
          }) == "CachedGpt: the cache is for 4 layers of width 32 but the model has 2 (pipeline stage 1 of 2) of width 32");
    CHECK(message_of([&] {
              CachedGpt engine(last.model, config, cache, loom::infer::pipeline_stage(config, 0, 2));
          }) == "CachedGpt: pipeline stage 0 has no embeddings; build it with make_stage_model(config, "
                "pipeline_stage(config, 0, 2))");
    RankStage first(whole, 0, 2);
    CHECK(message_of([&] {
              CachedGpt engine(first.model, config, cache, where);
          }) == "CachedGpt: pipeline stage 1 is the last but has no head; build it with make_stage_model(config, "
                "pipeline_stage(config, 1, 2))");
    const std::vector<std::int32_t> tokens = prompt_of(3, 42, 0);
    const std::vector<Segment> segments{{0, tokens}};
    CHECK(message_of([&] {
              CachedGpt engine(last.model, config, cache, where);
              (void)engine.forward(segments);
          }) == "CachedGpt: forward on pipeline stage 1 of 2; a stage runs forward_stage with the hidden rows of the "
                "stage before");
    CHECK(message_of([&] {
              CachedGpt engine(last.model, config, cache, where);
              const std::vector<float> hidden(5);
              (void)engine.forward_stage(segments, hidden);
          }) == "CachedGpt: pipeline stage 1 of 2 was given 5 hidden values for 3 tokens; give 3 x 32 = 96 (the stage "
                "before's output)");
    // On the ranks: a degree that does not divide the layers, and engines built for each other's stage.
    const std::vector<Request> one{request(prompt_of(4, 42, 0), 3, true)};
    for (const std::string& said : messages_on_ranks(3, [&](AnyComm& pp) {
             auto stage = loom::gpt::make_model(config);
             (void)loom::infer::generate_pipelined(stage, config, pp, one);
         }))
        CHECK(said == "pipeline degree 3 does not divide the 4 layers; use 1, 2 or 4");
    const auto swapped = messages_on_ranks(2, [&](AnyComm& pp) {
        RankStage other(whole, 1 - pp.rank(), 2);
        KvCache own = loom::infer::pipeline_cache(config, other.where, 1, 16);
        CachedGpt engine(other.model, config, own, other.where);
        (void)loom::infer::generate_pipelined(engine, pp, one);
    });
    CHECK(swapped[0] == "generate_pipelined: the engine is stage 1 of 2 but this is rank 0 of a pipeline of 2; build "
                        "rank r's engine for pipeline_stage(config, r, 2)");
    CHECK(swapped[1] == "generate_pipelined: the engine is stage 0 of 2 but this is rank 1 of a pipeline of 2; build "
                        "rank r's engine for pipeline_stage(config, r, 2)");
    const auto no_groups = messages_on_ranks(2, [&](AnyComm& pp) {
        (void)loom_test::serve_pipelined_on(pp, whole, one, 0, PipelineOptions{.groups = -1});
    });
    for (const std::string& said : no_groups)
        CHECK(said == "generate_pipelined: groups = -1 is not valid; give at least 1 group in flight (0: one more "
                      "than the stages, 3)");
    const auto negative_budget = messages_on_ranks(2, [&](AnyComm& pp) {
        (void)loom_test::serve_pipelined_on(pp, whole, one, 0, PipelineOptions{.prefill_tokens = -4});
    });
    for (const std::string& said : negative_budget)
        CHECK(said == "generate_pipelined: prefill_tokens = -4 is not valid; give the most prompt tokens a step "
                      "admits, or 0 for no limit");
}

}  // namespace LOOM_TEST_FILE
