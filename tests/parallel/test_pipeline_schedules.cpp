// The pipeline schedule generators (schedule/pipeline.hpp, zero_bubble.hpp)
// checked without a simulator: exact programs for small cases, then for p in
// 1..8 and m in 1..32 the counts (each virtual stage and micro-batch computed
// once, on its rank; sends and recvs pairing up; each send waited once), the
// order facts each rank must respect, the static verifier (which also runs
// all ranks together: recvs block until their send was issued, sends never
// block), and the promised activation bound, counted in program order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <loom/parallel/pipeline.hpp>
#include <loom/parallel/policy.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/schedule/pipeline.hpp>
#include <loom/schedule/verify_pipeline.hpp>

#include "support/message_of.hpp"

using loom::ScheduleKind;
using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Payload;
using loom::schedule::PipelineProgram;
using loom::schedule::peak_activations;
using loom_test::message_of;

namespace {

std::string listing(const PipelineProgram& program) {
    std::ostringstream out;
    out << program;
    return out.str();
}

// Every program the sweeps look at: each schedule at every (p, m) it accepts.
std::vector<PipelineProgram> all_programs(int max_stages = 8, int max_micro_batches = 32) {
    std::vector<PipelineProgram> out;
    for (int p = 1; p <= max_stages; ++p)
        for (int m = 1; m <= max_micro_batches; ++m) {
            out.push_back(loom::schedule::gpipe(p, m));
            out.push_back(loom::schedule::one_f_one_b(p, m));
            out.push_back(loom::schedule::zero_bubble_h1(p, m));
            if (m % p == 0)
                for (int v = 2; v <= 4; ++v) out.push_back(loom::schedule::interleaved(p, m, v));
            out.push_back(loom::schedule::zero_bubble_v(p, m));
        }
    return out;
}

std::string what(const PipelineProgram& program) {
    std::ostringstream out;
    out << program.schedule << " p=" << program.stages << " m=" << program.micro_batches;
    return out.str();
}

bool is_pipeline_compute(Op op) {
    return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}

// What a send carries, named from the receiver's side: (from, to, payload,
// receiving virtual stage, micro-batch).
using Message = std::tuple<int, int, Payload, int, int>;

Message sent(int rank, const Instruction& in) {
    const int to_stage = in.payload == Payload::activation ? in.chunk + 1 : in.chunk - 1;
    return {rank, in.peer, in.payload, to_stage, in.micro_batch};
}
Message received(int rank, const Instruction& in) { return {in.peer, rank, in.payload, in.chunk, in.micro_batch}; }

// The number of forwards rank r runs before its first backward.
int warmup_of(const PipelineProgram& program, int r) {
    int forwards = 0;
    for (const Instruction& in : program.ranks[static_cast<std::size_t>(r)].code) {
        if (in.op == Op::backward || in.op == Op::backward_input) break;
        forwards += in.op == Op::forward ? 1 : 0;
    }
    return forwards;
}

}  // namespace

TEST_CASE("GPipe runs every forward, then every backward", "[parallel][pipeline]") {
    CHECK(listing(loom::schedule::gpipe(2, 3)) == R"(GPipe over 2 stages, 3 micro-batches, 1 chunk per rank (activations in flight <= 3)
rank 0: step program (GPipe, rank 0 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 forward c0 mb2
  #6 send activation to rank 1 c0 mb2
  #7 recv gradient from rank 1 c0 mb0
  #8 backward c0 mb0
  #9 recv gradient from rank 1 c0 mb1
  #10 backward c0 mb1
  #11 recv gradient from rank 1 c0 mb2
  #12 backward c0 mb2
  #13 wait #2
  #14 wait #4
  #15 wait #6
  #16 optimizer_step
rank 1: step program (GPipe, rank 1 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 recv activation from rank 0 c1 mb1
  #4 forward c1 mb1
  #5 recv activation from rank 0 c1 mb2
  #6 forward c1 mb2
  #7 backward c1 mb0
  #8 send gradient to rank 0 c1 mb0
  #9 backward c1 mb1
  #10 send gradient to rank 0 c1 mb1
  #11 backward c1 mb2
  #12 send gradient to rank 0 c1 mb2
  #13 wait #8
  #14 wait #10
  #15 wait #12
  #16 optimizer_step
)");
}

TEST_CASE("1F1B: warm-up forwards, then one forward and one backward, then the drain", "[parallel][pipeline]") {
    // Rank 0 runs p-1 = 1 warm-up forward; rank 1, the last, none.
    CHECK(listing(loom::schedule::one_f_one_b(2, 3)) == R"(1F1B over 2 stages, 3 micro-batches, 1 chunk per rank (activations in flight <= 2)
rank 0: step program (1F1B, rank 0 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 recv gradient from rank 1 c0 mb0
  #6 backward c0 mb0
  #7 forward c0 mb2
  #8 send activation to rank 1 c0 mb2
  #9 recv gradient from rank 1 c0 mb1
  #10 backward c0 mb1
  #11 recv gradient from rank 1 c0 mb2
  #12 backward c0 mb2
  #13 wait #2
  #14 wait #4
  #15 wait #8
  #16 optimizer_step
rank 1: step program (1F1B, rank 1 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 backward c1 mb0
  #4 send gradient to rank 0 c1 mb0
  #5 recv activation from rank 0 c1 mb1
  #6 forward c1 mb1
  #7 backward c1 mb1
  #8 send gradient to rank 0 c1 mb1
  #9 recv activation from rank 0 c1 mb2
  #10 forward c1 mb2
  #11 backward c1 mb2
  #12 send gradient to rank 0 c1 mb2
  #13 wait #4
  #14 wait #8
  #15 wait #12
  #16 optimizer_step
)");
}

TEST_CASE("Interleaved<2> visits chunks in groups of p micro-batches, as Megatron does", "[parallel][pipeline]") {
    // Rank 0: 2(p-1) + (v-1)p = 4 warm-up forwards (c0 mb0-1, c2 mb0-1), then
    // F B pairs, the backwards visiting the chunks in reverse; rank 1: 2.
    // Rank 1 passes c1 -> c2 back to rank 0 (the loop), rank 0 c2 -> c3.
    CHECK(listing(loom::schedule::interleaved(2, 4, 2)) == R"(Interleaved<2> over 2 stages, 4 micro-batches, 2 chunks per rank (activations in flight <= 5)
rank 0: step program (Interleaved<2>, rank 0 of 2, 4 micro-batches): 54 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 recv activation from rank 1 c2 mb0
  #6 forward c2 mb0
  #7 send activation to rank 1 c2 mb0
  #8 recv activation from rank 1 c2 mb1
  #9 forward c2 mb1
  #10 send activation to rank 1 c2 mb1
  #11 forward c0 mb2
  #12 send activation to rank 1 c0 mb2
  #13 recv gradient from rank 1 c2 mb0
  #14 backward c2 mb0
  #15 send gradient to rank 1 c2 mb0
  #16 forward c0 mb3
  #17 send activation to rank 1 c0 mb3
  #18 recv gradient from rank 1 c2 mb1
  #19 backward c2 mb1
  #20 send gradient to rank 1 c2 mb1
  #21 recv activation from rank 1 c2 mb2
  #22 forward c2 mb2
  #23 send activation to rank 1 c2 mb2
  #24 recv gradient from rank 1 c0 mb0
  #25 backward c0 mb0
  #26 recv activation from rank 1 c2 mb3
  #27 forward c2 mb3
  #28 send activation to rank 1 c2 mb3
  #29 recv gradient from rank 1 c0 mb1
  #30 backward c0 mb1
  #31 recv gradient from rank 1 c2 mb2
  #32 backward c2 mb2
  #33 send gradient to rank 1 c2 mb2
  #34 recv gradient from rank 1 c2 mb3
  #35 backward c2 mb3
  #36 send gradient to rank 1 c2 mb3
  #37 recv gradient from rank 1 c0 mb2
  #38 backward c0 mb2
  #39 recv gradient from rank 1 c0 mb3
  #40 backward c0 mb3
  #41 wait #2
  #42 wait #4
  #43 wait #7
  #44 wait #10
  #45 wait #12
  #46 wait #15
  #47 wait #17
  #48 wait #20
  #49 wait #23
  #50 wait #28
  #51 wait #33
  #52 wait #36
  #53 optimizer_step
rank 1: step program (Interleaved<2>, rank 1 of 2, 4 micro-batches): 54 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 send activation to rank 0 c1 mb0
  #4 recv activation from rank 0 c1 mb1
  #5 forward c1 mb1
  #6 send activation to rank 0 c1 mb1
  #7 recv activation from rank 0 c3 mb0
  #8 forward c3 mb0
  #9 backward c3 mb0
  #10 send gradient to rank 0 c3 mb0
  #11 recv activation from rank 0 c3 mb1
  #12 forward c3 mb1
  #13 backward c3 mb1
  #14 send gradient to rank 0 c3 mb1
  #15 recv activation from rank 0 c1 mb2
  #16 forward c1 mb2
  #17 send activation to rank 0 c1 mb2
  #18 recv gradient from rank 0 c1 mb0
  #19 backward c1 mb0
  #20 send gradient to rank 0 c1 mb0
  #21 recv activation from rank 0 c1 mb3
  #22 forward c1 mb3
  #23 send activation to rank 0 c1 mb3
  #24 recv gradient from rank 0 c1 mb1
  #25 backward c1 mb1
  #26 send gradient to rank 0 c1 mb1
  #27 recv activation from rank 0 c3 mb2
  #28 forward c3 mb2
  #29 backward c3 mb2
  #30 send gradient to rank 0 c3 mb2
  #31 recv activation from rank 0 c3 mb3
  #32 forward c3 mb3
  #33 backward c3 mb3
  #34 send gradient to rank 0 c3 mb3
  #35 recv gradient from rank 0 c1 mb2
  #36 backward c1 mb2
  #37 send gradient to rank 0 c1 mb2
  #38 recv gradient from rank 0 c1 mb3
  #39 backward c1 mb3
  #40 send gradient to rank 0 c1 mb3
  #41 wait #3
  #42 wait #6
  #43 wait #10
  #44 wait #14
  #45 wait #17
  #46 wait #20
  #47 wait #23
  #48 wait #26
  #49 wait #30
  #50 wait #34
  #51 wait #37
  #52 wait #40
  #53 optimizer_step
)");
}

TEST_CASE("ZB-H1: 1F1B with split backward; rank r holds back its first r weight gradients",
          "[parallel][pipeline]") {
    // Rank 1 (the last) sends each input gradient before any W; its held-back
    // W mb0 runs after the next pair, and W mb2 ends the step.
    CHECK(listing(loom::schedule::zero_bubble_h1(2, 3)) == R"(ZB-H1 over 2 stages, 3 micro-batches, 1 chunk per rank (activations in flight <= 2)
rank 0: step program (ZB-H1, rank 0 of 2, 3 micro-batches): 20 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 recv gradient from rank 1 c0 mb0
  #6 backward_input c0 mb0
  #7 backward_weight c0 mb0
  #8 forward c0 mb2
  #9 send activation to rank 1 c0 mb2
  #10 recv gradient from rank 1 c0 mb1
  #11 backward_input c0 mb1
  #12 backward_weight c0 mb1
  #13 recv gradient from rank 1 c0 mb2
  #14 backward_input c0 mb2
  #15 backward_weight c0 mb2
  #16 wait #2
  #17 wait #4
  #18 wait #9
  #19 optimizer_step
rank 1: step program (ZB-H1, rank 1 of 2, 3 micro-batches): 20 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 backward_input c1 mb0
  #4 send gradient to rank 0 c1 mb0
  #5 recv activation from rank 0 c1 mb1
  #6 forward c1 mb1
  #7 backward_input c1 mb1
  #8 send gradient to rank 0 c1 mb1
  #9 backward_weight c1 mb0
  #10 recv activation from rank 0 c1 mb2
  #11 forward c1 mb2
  #12 backward_input c1 mb2
  #13 send gradient to rank 0 c1 mb2
  #14 backward_weight c1 mb1
  #15 backward_weight c1 mb2
  #16 wait #4
  #17 wait #8
  #18 wait #13
  #19 optimizer_step
)");
}

TEST_CASE("ZB-V: two chunks per rank in a V, the turn on the last rank needs no message",
          "[parallel][pipeline]") {
    // Rank 1 holds virtual stages 1 and 2: forward c1 feeds forward c2 and
    // backward_input c2 feeds backward_input c1 with no send between them.
    CHECK(listing(loom::schedule::zero_bubble_v(2, 3)) == R"(ZB-V over 2 stages, 3 micro-batches, 2 chunks per rank (activations in flight <= 4)
rank 0: step program (ZB-V, rank 0 of 2, 3 micro-batches): 38 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 forward c0 mb2
  #6 send activation to rank 1 c0 mb2
  #7 recv activation from rank 1 c3 mb0
  #8 forward c3 mb0
  #9 backward_input c3 mb0
  #10 send gradient to rank 1 c3 mb0
  #11 backward_weight c3 mb0
  #12 recv activation from rank 1 c3 mb1
  #13 forward c3 mb1
  #14 backward_input c3 mb1
  #15 send gradient to rank 1 c3 mb1
  #16 backward_weight c3 mb1
  #17 recv gradient from rank 1 c0 mb0
  #18 backward_input c0 mb0
  #19 backward_weight c0 mb0
  #20 recv activation from rank 1 c3 mb2
  #21 forward c3 mb2
  #22 backward_input c3 mb2
  #23 send gradient to rank 1 c3 mb2
  #24 backward_weight c3 mb2
  #25 recv gradient from rank 1 c0 mb1
  #26 backward_input c0 mb1
  #27 backward_weight c0 mb1
  #28 recv gradient from rank 1 c0 mb2
  #29 backward_input c0 mb2
  #30 backward_weight c0 mb2
  #31 wait #2
  #32 wait #4
  #33 wait #6
  #34 wait #10
  #35 wait #15
  #36 wait #23
  #37 optimizer_step
rank 1: step program (ZB-V, rank 1 of 2, 3 micro-batches): 38 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 forward c2 mb0
  #4 send activation to rank 0 c2 mb0
  #5 recv activation from rank 0 c1 mb1
  #6 forward c1 mb1
  #7 forward c2 mb1
  #8 send activation to rank 0 c2 mb1
  #9 recv gradient from rank 0 c2 mb0
  #10 backward_input c2 mb0
  #11 backward_weight c2 mb0
  #12 recv activation from rank 0 c1 mb2
  #13 forward c1 mb2
  #14 backward_input c1 mb0
  #15 send gradient to rank 0 c1 mb0
  #16 backward_weight c1 mb0
  #17 forward c2 mb2
  #18 send activation to rank 0 c2 mb2
  #19 recv gradient from rank 0 c2 mb1
  #20 backward_input c2 mb1
  #21 backward_weight c2 mb1
  #22 backward_input c1 mb1
  #23 send gradient to rank 0 c1 mb1
  #24 recv gradient from rank 0 c2 mb2
  #25 backward_input c2 mb2
  #26 backward_input c1 mb2
  #27 send gradient to rank 0 c1 mb2
  #28 backward_weight c1 mb1
  #29 backward_weight c2 mb2
  #30 backward_weight c1 mb2
  #31 wait #4
  #32 wait #8
  #33 wait #15
  #34 wait #18
  #35 wait #23
  #36 wait #27
  #37 optimizer_step
)");
}

TEST_CASE("every schedule computes each virtual stage and micro-batch once, on its rank", "[parallel][pipeline]") {
    for (const PipelineProgram& program : all_programs()) {
        INFO(what(program));
        const int p = program.stages, m = program.micro_batches, stages = program.virtual_stages();
        REQUIRE(static_cast<int>(program.ranks.size()) == p);
        REQUIRE(static_cast<int>(program.rank_of_chunk.size()) == stages);
        // (op, virtual stage, micro-batch) -> how often and on which rank.
        std::map<std::tuple<Op, int, int>, int> runs;
        std::map<Message, int> sends, recvs;
        for (int r = 0; r < p; ++r) {
            const auto& code = program.ranks[static_cast<std::size_t>(r)].code;
            std::map<int, int> waits;  // send index -> waits naming it
            for (std::size_t i = 0; i < code.size(); ++i) {
                const Instruction& in = code[i];
                if (is_pipeline_compute(in.op)) {
                    CHECK(program.rank_of_chunk[static_cast<std::size_t>(in.chunk)] == r);
                    ++runs[{in.op, in.chunk, in.micro_batch}];
                }
                if (in.op == Op::send) {
                    ++sends[sent(r, in)];
                    waits.emplace(static_cast<int>(i), 0);
                }
                if (in.op == Op::recv) ++recvs[received(r, in)];
                if (in.op == Op::wait) {
                    CHECK(waits.contains(in.target));
                    ++waits[in.target];
                }
            }
            for (const auto& [index, count] : waits) CHECK(count == 1);
            CHECK(program.ranks[static_cast<std::size_t>(r)].count(Op::optimizer_step) == 1);
        }
        const std::vector<Op> kinds = program.split_backward
                                          ? std::vector<Op>{Op::forward, Op::backward_input, Op::backward_weight}
                                          : std::vector<Op>{Op::forward, Op::backward};
        CHECK(static_cast<int>(runs.size()) == static_cast<int>(kinds.size()) * stages * m);
        for (Op op : kinds)
            for (int v = 0; v < stages; ++v)
                for (int k = 0; k < m; ++k) CHECK(runs[{op, v, k}] == 1);
        CHECK(sends == recvs);
        // One activation and one gradient per micro-batch and rank boundary.
        int boundaries = 0;
        for (int v = 0; v + 1 < stages; ++v)
            boundaries += program.rank_of_chunk[static_cast<std::size_t>(v)] !=
                                  program.rank_of_chunk[static_cast<std::size_t>(v + 1)]
                              ? 1
                              : 0;
        CHECK(static_cast<int>(sends.size()) == 2 * boundaries * m);
        for (const auto& [message, count] : sends) CHECK(count == 1);
    }
}

TEST_CASE("1F1B and ZB-H1 warm up with min(p-r-1, m) forwards, Interleaved as Megatron", "[parallel][pipeline]") {
    for (int p = 1; p <= 8; ++p)
        for (int m = 1; m <= 32; ++m) {
            INFO("p=" << p << " m=" << m);
            const auto one = loom::schedule::one_f_one_b(p, m);
            const auto zb = loom::schedule::zero_bubble_h1(p, m);
            for (int r = 0; r < p; ++r) {
                // The first backward follows one more forward than the warm-up (the steady F B pair),
                // unless the warm-up already ran every micro-batch.
                const int warmup = std::min(p - r - 1, m);
                CHECK(warmup_of(one, r) == std::min(warmup + 1, m));
                CHECK(warmup_of(zb, r) == std::min(warmup + 1, m));
            }
            if (m % p != 0) continue;
            for (int v = 2; v <= 4; ++v) {
                const auto inter = loom::schedule::interleaved(p, m, v);
                for (int r = 0; r < p; ++r) {
                    const int warmup = m == p ? m * v : std::min(2 * (p - r - 1) + (v - 1) * p, m * v);
                    CHECK(loom::schedule::interleaved_warmup(p, m, v, r) == warmup);
                    CHECK(warmup_of(inter, r) == std::min(warmup + 1, m * v));
                }
            }
        }
    CHECK(loom::schedule::interleaved_warmup(4, 8, 2, 0) == 10);  // Megatron: (4-0-1)*2 + (2-1)*4
    CHECK(loom::schedule::interleaved_warmup(4, 8, 2, 3) == 4);
    CHECK(loom::schedule::interleaved_warmup(4, 4, 2, 3) == 8);  // m == p: every forward first
}

TEST_CASE("on every rank, F before B before W, micro-batches in order per virtual stage", "[parallel][pipeline]") {
    for (const PipelineProgram& program : all_programs()) {
        INFO(what(program));
        for (int r = 0; r < program.stages; ++r) {
            std::map<std::pair<Op, int>, int> last;  // (op, virtual stage) -> last micro-batch
            std::set<std::tuple<Op, int, int>> done;
            const auto& code = program.ranks[static_cast<std::size_t>(r)].code;
            for (std::size_t i = 0; i < code.size(); ++i) {
                const Instruction& in = code[i];
                if (!is_pipeline_compute(in.op)) continue;
                INFO("rank " << r << " #" << i << " " << in);
                auto [it, first] = last.emplace(std::pair{in.op, in.chunk}, in.micro_batch);
                if (!first) {
                    CHECK(it->second + 1 == in.micro_batch);
                    it->second = in.micro_batch;
                } else {
                    CHECK(in.micro_batch == 0);
                }
                if (in.op == Op::backward || in.op == Op::backward_input)
                    CHECK(done.contains({Op::forward, in.chunk, in.micro_batch}));
                if (in.op == Op::backward_weight) CHECK(done.contains({Op::backward_input, in.chunk, in.micro_batch}));
                // Consecutive virtual stages on one rank pass data without messages, in order.
                const int v = in.chunk, last_stage = program.virtual_stages() - 1;
                const auto here = [&](int s) { return program.rank_of_chunk[static_cast<std::size_t>(s)] == r; };
                if (in.op == Op::forward && v > 0 && here(v - 1))
                    CHECK(done.contains({Op::forward, v - 1, in.micro_batch}));
                if ((in.op == Op::backward || in.op == Op::backward_input) && v < last_stage && here(v + 1))
                    CHECK(done.contains({in.op, v + 1, in.micro_batch}));
                // A recv comes right before the compute that needs it, a send right after.
                if (i > 0 && code[i - 1].op == Op::recv) {
                    CHECK(code[i - 1].chunk == in.chunk);
                    CHECK(code[i - 1].micro_batch == in.micro_batch);
                }
                done.insert({in.op, in.chunk, in.micro_batch});
            }
        }
    }
}

// The static verifier over every schedule: matching, dependencies, waits, no
// deadlock (all ranks run together, recvs block until their send was issued)
// and the activation bound. Its rejections are tested in test_pipeline_verify.cpp.
TEST_CASE("every generated program passes the pipeline verifier, deadlock check included", "[parallel][pipeline]") {
    for (const PipelineProgram& program : all_programs()) {
        INFO(what(program));
        CHECK(message_of([&] { loom::schedule::verify_pipeline(program); }) == "(no error)");
    }
}

TEST_CASE("the activation bound is what the ranks hold at their peak", "[parallel][pipeline]") {
    for (const PipelineProgram& program : all_programs()) {
        INFO(what(program));
        int peak = 0;
        for (int r = 0; r < program.stages; ++r) {
            const int here = peak_activations(program, r);
            CHECK(here <= program.activation_bound);
            peak = std::max(peak, here);
        }
        CHECK(peak == program.activation_bound);
    }
    // The closed forms, rank by rank where they differ.
    for (int p = 1; p <= 8; ++p)
        for (int m = 1; m <= 32; ++m) {
            INFO("p=" << p << " m=" << m);
            const auto one = loom::schedule::one_f_one_b(p, m);
            const auto zb = loom::schedule::zero_bubble_h1(p, m);
            CHECK(loom::schedule::gpipe(p, m).activation_bound == m);
            CHECK(one.activation_bound == std::min(p, m));
            CHECK(zb.activation_bound == std::min(p, m));
            for (int r = 0; r < p; ++r) {
                CHECK(peak_activations(one, r) == std::min(p - r, m));
                CHECK(peak_activations(zb, r) == std::min(p, m));  // W held back r times: every rank at 1F1B's peak
            }
            if (m % p == 0)
                for (int v = 2; v <= 4; ++v)
                    CHECK(loom::schedule::interleaved(p, m, v).activation_bound ==
                          (m == p ? m * v : std::min(v * p + p - 1, v * m)));
            CHECK(loom::schedule::zero_bubble_v(p, m).activation_bound == 2 * std::min(p, m));
        }
}

TEST_CASE("pipeline schedules refuse what they cannot schedule, in one line", "[parallel][pipeline]") {
    using namespace loom::schedule;
    CHECK(message_of([] { (void)gpipe(0, 3); }) == "GPipe: 0 stages; a pipeline needs at least 1");
    CHECK(message_of([] { (void)one_f_one_b(2, 0); }) == "1F1B: 0 micro-batches; a step needs at least 1");
    CHECK(message_of([] { (void)zero_bubble_h1(-1, 4); }) == "ZB-H1: -1 stages; a pipeline needs at least 1");
    CHECK(message_of([] { (void)interleaved(4, 6, 2); }) ==
          "Interleaved<2>: 6 micro-batches over 4 stages; interleaving needs a multiple of the stages (4, 8, ...)");
    CHECK(message_of([] { (void)interleaved(4, 2, 3); }) ==
          "Interleaved<3>: 2 micro-batches over 4 stages; interleaving needs a multiple of the stages (4, 8, ...)");
    CHECK(message_of([] { (void)interleaved(2, 4, 1); }) ==
          "Interleaved<1>: 1 chunk per rank; interleaving needs at least 2 (one chunk per rank is 1F1B)");
    CHECK(message_of([] { (void)interleaved(2, 0, 2); }) == "Interleaved<2>: 0 micro-batches; a step needs at least 1");
    // ZB-V writes its order for max(m, 2p-1) micro-batches and drops the missing ones: any m runs.
    CHECK(message_of([] { (void)zero_bubble_v(0, 6); }) == "ZB-V: 0 stages; a pipeline needs at least 1");
    CHECK(message_of([] { (void)zero_bubble_v(4, 0); }) == "ZB-V: 0 micro-batches; a step needs at least 1");
    CHECK(message_of([] { (void)zero_bubble_v(4, 1); }) == "(no error)");
    CHECK(message_of([] { (void)pipeline_program(ScheduleKind::gpipe, 2, 4, 2); }) ==
          "GPipe: 2 chunks per rank; GPipe runs exactly 1");
    CHECK(message_of([] { (void)pipeline_program(ScheduleKind::zero_bubble_v, 2, 4, 1); }) ==
          "ZB-V: 1 chunks per rank; ZB-V runs exactly 2");
    CHECK(message_of([] { (void)loom::parse_schedule("zb-h1"); }) ==
          "unknown pipeline schedule \"zb-h1\"; use gpipe, 1f1b, interleaved, zb (ZB-H1) or zbv (ZB-V)");
}

TEST_CASE("schedule names, tags and Pipeline<Schedule> print themselves", "[parallel][pipeline]") {
    CHECK(loom::parse_schedule("gpipe") == ScheduleKind::gpipe);
    CHECK(loom::parse_schedule("1f1b") == ScheduleKind::one_f_one_b);
    CHECK(loom::parse_schedule("interleaved") == ScheduleKind::interleaved);
    CHECK(loom::parse_schedule("zb") == ScheduleKind::zero_bubble_h1);
    CHECK(loom::parse_schedule("zbv") == ScheduleKind::zero_bubble_v);

    STATIC_REQUIRE(loom::Policy<loom::Pipeline<loom::OneFOneB>>);
    STATIC_REQUIRE(loom::Pipeline<>::kind == loom::PolicyKind::pipeline);
    STATIC_REQUIRE(loom::Pipeline<loom::Interleaved<3>>::chunks == 3);
    STATIC_REQUIRE(loom::Pipeline<loom::ZeroBubbleV>::schedule_kind == ScheduleKind::zero_bubble_v);
    CHECK(loom::describe<loom::Pipeline<loom::GPipe>>() == "Pipeline<GPipe>");
    CHECK(loom::describe<loom::Pipeline<loom::OneFOneB>>() == "Pipeline<1F1B>");
    CHECK(loom::describe<loom::Pipeline<loom::Interleaved<2>>>() == "Pipeline<Interleaved<2>>");
    CHECK(loom::describe<loom::Pipeline<loom::ZeroBubbleH1>>() == "Pipeline<ZB-H1>");
    CHECK(loom::describe<loom::Pipeline<loom::ZeroBubbleV>>() == "Pipeline<ZB-V>");
    std::ostringstream strategy;
    strategy << loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::Interleaved<4>>>{};
    CHECK(strategy.str() == "Strategy<DataParallel<bucket 2 MiB>, Pipeline<Interleaved<4>>>");

    // The factory from a tag gives the generator's program.
    using T = loom::Interleaved<2>;
    CHECK(listing(loom::schedule::pipeline_program(T::kind, 4, 8, T::chunks)) ==
          listing(loom::schedule::interleaved(4, 8, 2)));
    CHECK(loom::schedule::pipeline_program(ScheduleKind::zero_bubble_v, 2, 4, 2).schedule == "ZB-V");
    CHECK(loom::schedule::pipeline_program(ScheduleKind::zero_bubble_h1, 2, 4).schedule == "ZB-H1");
    CHECK(loom::schedule::pipeline_program(ScheduleKind::gpipe, 2, 4).schedule == "GPipe");
    CHECK(loom::schedule::pipeline_program(ScheduleKind::one_f_one_b, 2, 4).schedule == "1F1B");
}

TEST_CASE("each channel delivers in order: a receiver posts recvs in the order its peer sends",
          "[parallel][pipeline]") {
    // Not needed with messages matched by (chunk, micro-batch), but it lets a
    // transport match by arrival order, one queue per (sender, receiver, payload).
    for (const PipelineProgram& program : all_programs()) {
        INFO(what(program));
        std::map<std::tuple<int, int, Payload>, std::vector<Message>> sends, recvs;
        for (int r = 0; r < program.stages; ++r)
            for (const Instruction& in : program.ranks[static_cast<std::size_t>(r)].code) {
                if (in.op == Op::send) sends[{r, in.peer, in.payload}].push_back(sent(r, in));
                if (in.op == Op::recv) recvs[{in.peer, r, in.payload}].push_back(received(r, in));
            }
        CHECK(sends == recvs);
    }
}

namespace {

using loom::schedule::compute_table;
using loom::schedule::detail::PipeAction;

// Compile-time shapes give compile-time tables: 1F1B's last rank alternates
// from the start, GPipe's runs every forward first, ZB-V's rows hold 3 m x 2
// chunk computes.
static_assert(compute_table<ScheduleKind::one_f_one_b, 4, 8>[3][0] == PipeAction{Op::forward, 3, 0});
static_assert(compute_table<ScheduleKind::one_f_one_b, 4, 8>[3][1] == PipeAction{Op::backward, 3, 0});
static_assert(compute_table<ScheduleKind::one_f_one_b, 4, 8>[0][3] == PipeAction{Op::forward, 0, 3});
static_assert(compute_table<ScheduleKind::gpipe, 2, 3>[1][3] == PipeAction{Op::backward, 1, 0});
static_assert(compute_table<ScheduleKind::zero_bubble_v, 4, 8>[0].size() == 48);
static_assert(compute_table<ScheduleKind::interleaved, 4, 8, 3>[0].size() == 48);

// The compute of a generated program, in order, without p2p and bookkeeping.
std::vector<PipeAction> computes_of(const loom::schedule::StepProgram& program) {
    std::vector<PipeAction> out;
    for (const Instruction& in : program.code)
        if (in.op == Op::forward || in.op == Op::backward || in.op == Op::backward_input ||
            in.op == Op::backward_weight)
            out.push_back({in.op, in.chunk, in.micro_batch});
    return out;
}

template <ScheduleKind Kind, int P, int M>
void check_table_is_the_generator() {
    const auto& table = compute_table<Kind, P, M>;
    const auto program = loom::schedule::pipeline_program(Kind, P, M, loom::schedule::default_chunks(Kind));
    for (int r = 0; r < P; ++r) {
        INFO(loom::name(Kind) << " p " << P << " m " << M << " rank " << r);
        const auto& row = table[static_cast<std::size_t>(r)];
        CHECK(computes_of(program.ranks[static_cast<std::size_t>(r)]) == std::vector<PipeAction>(row.begin(), row.end()));
    }
}

}  // namespace

TEST_CASE("compile-time schedule tables are the generators' compute orders", "[parallel][pipeline]") {
    check_table_is_the_generator<ScheduleKind::gpipe, 4, 8>();
    check_table_is_the_generator<ScheduleKind::one_f_one_b, 4, 8>();
    check_table_is_the_generator<ScheduleKind::interleaved, 4, 8>();
    check_table_is_the_generator<ScheduleKind::zero_bubble_h1, 4, 8>();
    check_table_is_the_generator<ScheduleKind::zero_bubble_v, 4, 8>();
    check_table_is_the_generator<ScheduleKind::zero_bubble_v, 4, 3>();  // fewer micro-batches than the V is written for
    check_table_is_the_generator<ScheduleKind::one_f_one_b, 8, 2>();
}
