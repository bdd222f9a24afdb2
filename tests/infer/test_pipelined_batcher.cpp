// PipelinedBatcher (infer/pipelined_batcher.hpp) on rank threads: requests
// submitted while the pipeline runs, at pp 2 and 4, greedy and seeded, give
// the whole model's tokens (generate at pp 1); a cancelled request reports
// nothing more and the others are unchanged; keep_alive while idle, then
// more work; a batcher on the wrong rank is named. Catch2's macros are not
// thread-safe, so the rank threads only record what they got.
#include "support/test_file.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipelined_batcher.hpp"
#include "infer/pipeline_serving_suite.hpp"
#include "infer/tensor_parallel_serving_suite.hpp"
#include "support/message_of.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::comm::AnyComm;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::infer::CachedGpt;
using loom::infer::Completion;
using loom::infer::KvCache;
using loom::infer::PipelinedBatcher;
using loom::infer::Request;
using loom_test::mixed_batch;
using loom_test::PipelineGpt;
using loom_test::RankStage;

// What rank 0 saw, per id: the tokens reported and the finish (if any).
struct Seen {
    std::map<std::uint64_t, Completion> done;
    std::set<std::uint64_t> finished;
    std::string failure;  // a rank's exception, reported after the world ends
};

// Runs `requests` through a PipelinedBatcher of `degree` stages with `slots`
// slots: two submitted at first, then one more after each step (so most
// arrive while others run); `cancel_after_first` is cancelled after the first
// step; the batcher keeps the later stages alive once while idle, then takes
// the last request.
Seen run_pipelined(const PipelineGpt& whole, int degree, const std::vector<Request>& requests, std::int64_t slots,
                   std::int64_t cancel_after_first = -1) {
    Seen seen;
    ThreadWorld(degree).run([&](ThreadComm& comm) {
        AnyComm pp = AnyComm::view(comm);
        RankStage stage(whole, pp.rank(), pp.size());
        KvCache cache = loom::infer::pipeline_cache(whole.config, stage.where, slots, whole.config.seq, 4);
        CachedGpt engine(stage.model, whole.config, cache, stage.where);
        if (pp.rank() != 0) return loom::infer::serve_pipeline_stage(engine, pp);
        try {
            PipelinedBatcher batcher(engine, pp);
            std::size_t next = 0;
            const std::size_t before_idle = requests.size() - 1;
            const auto record = [&](const PipelinedBatcher::Event& e) {
                Completion& c = seen.done[e.id];
                c.tokens.push_back(e.token);
                if (e.finish) {
                    c.finish = *e.finish;
                    seen.finished.insert(e.id);
                }
            };
            for (; next < 2; ++next) (void)batcher.submit(requests[next]);
            bool first = true;
            while (!batcher.idle()) {
                for (const auto& e : batcher.step()) record(e);
                if (first && cancel_after_first >= 0) (void)batcher.cancel(static_cast<std::uint64_t>(cancel_after_first));
                first = false;
                if (next < before_idle) (void)batcher.submit(requests[next++]);
            }
            batcher.keep_alive();
            for (; next < requests.size(); ++next) (void)batcher.submit(requests[next]);
            while (!batcher.idle())
                for (const auto& e : batcher.step()) record(e);
        } catch (const std::exception& e) {
            seen.failure = e.what();
            throw;
        }
    });
    return seen;
}

// The whole model's completions (pp 1).
std::vector<Completion> whole_model(const PipelineGpt& whole, const std::vector<Request>& requests) {
    std::vector<Completion> done;
    ThreadWorld(1).run([&](ThreadComm& comm) {
        AnyComm pp = AnyComm::view(comm);
        done = loom_test::serve_pipelined_on(pp, whole, requests, 0);
    });
    return done;
}

}  // namespace

TEST_CASE("PipelinedBatcher: requests arriving while the pipeline runs get the whole model's tokens",
          "[infer][pp]") {
    const PipelineGpt whole(41);
    for (const bool greedy : {true, false}) {
        const std::vector<Request> requests = mixed_batch(greedy);
        const std::vector<Completion> expected = whole_model(whole, requests);
        for (const int degree : {2, 4}) {
            for (const std::int64_t slots : {2, 4}) {
                INFO((greedy ? "greedy" : "sampled") << ", pp " << degree << ", " << slots << " slots");
                const Seen seen = run_pipelined(whole, degree, requests, slots);
                REQUIRE(seen.failure.empty());
                REQUIRE(seen.done.size() == requests.size());
                CHECK(seen.finished.size() == requests.size());
                for (std::size_t i = 0; i < requests.size(); ++i) {
                    INFO("request " << i);
                    CHECK(seen.done.at(i).tokens == expected[i].tokens);
                    CHECK(seen.done.at(i).finish == expected[i].finish);
                }
            }
        }
    }
}

TEST_CASE("PipelinedBatcher: a cancelled request stops reporting; the others keep their tokens", "[infer][pp]") {
    const PipelineGpt whole(43);
    const std::vector<Request> requests = mixed_batch(false);
    const std::vector<Completion> expected = whole_model(whole, requests);
    const Seen seen = run_pipelined(whole, 2, requests, 2, 1);  // request 1 runs (in flight) when cancelled
    REQUIRE(seen.failure.empty());
    CHECK(seen.finished.count(1) == 0);
    CHECK((!seen.done.contains(1) || seen.done.at(1).tokens.size() < expected[1].tokens.size()));
    for (std::size_t i = 0; i < requests.size(); ++i) {
        if (i == 1) continue;
        INFO("request " << i);
        CHECK(seen.done.at(i).tokens == expected[i].tokens);
    }
}

TEST_CASE("PipelinedBatcher: built on another rank than stage 0 is named", "[infer][pp]") {
    const PipelineGpt whole(47);
    std::string said;
    ThreadWorld(2).run([&](ThreadComm& comm) {
        AnyComm pp = AnyComm::view(comm);
        RankStage stage(whole, pp.rank(), pp.size());
        KvCache cache = loom::infer::pipeline_cache(whole.config, stage.where, 2, whole.config.seq);
        CachedGpt engine(stage.model, whole.config, cache, stage.where);
        if (pp.rank() == 1) said = loom_test::message_of([&] { PipelinedBatcher batcher(engine, pp); });
    });
    CHECK(said ==
          "PipelinedBatcher: the engine is stage 1 of 2 on rank 1 of a group of 2; build it on rank 0 with stage 0 of "
          "a pipeline of 2 or more (a whole model takes Batcher)");
}

}  // namespace LOOM_TEST_FILE
