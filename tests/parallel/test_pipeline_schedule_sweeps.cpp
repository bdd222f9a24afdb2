// The pipeline schedule generators (schedule/pipeline.hpp, zero_bubble.hpp)
// swept over p in 1..8 and m in 1..32: the counts (each virtual stage and
// micro-batch computed once, on its rank; sends and recvs pairing up; each
// send waited once), the order facts each rank must respect, the static
// verifier (which also runs all ranks together: recvs block until their send
// was issued, sends never block), the promised activation bound, counted in
// program order, and the compile-time tables against the generators.
#include <catch2/catch.hpp>

#include <algorithm>
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
#include "support/step_programs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::ScheduleKind;
using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Payload;
using loom::schedule::PipelineProgram;
using loom::schedule::peak_activations;
using loom_test::message_of;

namespace {

using loom_test::is_unit_compute;

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

// What a send carries, named from the receiver's side: (from, to, payload,
// receiving virtual stage, micro-batch).
using Message = std::tuple<int, int, Payload, int, int>;

Message sent(int rank, const Instruction& in) {
    const int to_stage = in.payload == Payload::activation ? in.chunk + 1 : in.chunk - 1;
    return {rank, in.peer, in.payload, to_stage, in.micro_batch};
}
Message received(int rank, const Instruction& in) { return {in.peer, rank, in.payload, in.chunk, in.micro_batch}; }

// Every channel's messages in the order its sender sends them and in the
// order its receiver receives them: a channel is (sender, receiver, payload),
// or with by_payload false the whole link (sender, receiver), as NCCL sees it.
struct Channels {
    std::map<std::tuple<int, int, int>, std::vector<Message>> sends, recvs;
};
Channels channels_of(const PipelineProgram& program, bool by_payload) {
    Channels out;
    for (int r = 0; r < program.stages; ++r)
        for (const Instruction& in : program.ranks[static_cast<std::size_t>(r)].code) {
            const int payload = by_payload ? static_cast<int>(in.payload) : -1;
            if (in.op == Op::send) out.sends[{r, in.peer, payload}].push_back(sent(r, in));
            if (in.op == Op::recv) out.recvs[{in.peer, r, payload}].push_back(received(r, in));
        }
    return out;
}

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
                if (is_unit_compute(in.op)) {
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
                if (!is_unit_compute(in.op)) continue;
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

TEST_CASE("each channel delivers in order: a receiver posts recvs in the order its peer sends",
          "[parallel][pipeline]") {
    // Not needed with messages matched by (chunk, micro-batch), but it lets a
    // transport match by arrival order, one queue per (sender, receiver, payload).
    for (const PipelineProgram& program : all_programs()) {
        INFO(what(program));
        const Channels channels = channels_of(program, /*by_payload=*/true);
        CHECK(channels.sends == channels.recvs);
    }
}

TEST_CASE("one link carries its messages in one order on both ranks, except ZB-V's, which NCCL cannot run",
          "[parallel][pipeline]") {
    // NCCL has no tags: it pairs a link's sends and receives in the order
    // they are issued (transport_nccl.hpp). That is right where a receiver
    // posts every message from a peer, whatever its payload, in the order the
    // peer sends them. ZB-V's V makes one link carry activations one way and
    // gradients the other way for both chunks, in orders that differ between
    // the two ranks, so train_gpt refuses it on NCCL; every other schedule runs.
    int zero_bubble_v_differs = 0;
    for (const PipelineProgram& program : all_programs()) {
        INFO(what(program));
        const Channels links = channels_of(program, /*by_payload=*/false);
        if (program.schedule == "ZB-V")
            zero_bubble_v_differs += links.sends != links.recvs ? 1 : 0;
        else
            CHECK(links.sends == links.recvs);
    }
    // Not one program in a few: the refusal is not a precaution.
    CHECK(zero_bubble_v_differs > 100);
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
        if (is_unit_compute(in.op)) out.push_back({in.op, in.chunk, in.micro_batch});
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

}  // namespace LOOM_TEST_FILE
