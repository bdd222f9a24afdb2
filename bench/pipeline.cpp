// bench/pipeline: how much of a pipeline step each schedule leaves idle when
// its programs really run: the generated per-rank programs
// (schedule::pipeline_program) interpreted on ThreadWorld rank threads, with
// synthetic stages, beside the simulator's price of the same programs and the
// closed forms the schedules promise.
//
//   bench_pipeline [--synthetic] [--reps 5] [--ms 5] [--schedules gpipe,1f1b,interleaved,zb,zbv]
//                  [--stages 2,4,8] [--micro-batches 4,8,16] [--no-realtime]
//   bench_pipeline --draw DIR [--ms 5] [--reps 5] [--schedules ...] [--no-realtime]
//   bench_pipeline --gpt [--reps 3] [--steps 6]     (bench/pipeline_gpt.hpp)
//
// Synthetic stages: a forward, input-gradient backward or weight-gradient
// backward of a whole stage takes --ms milliseconds of wall time (F = B = W;
// a combined backward B + W). A rank holding `chunks` virtual stages has its
// stage cut into that many pieces, so one chunk's F is F / chunks: every
// schedule does the same work. Compute is a timed sleep, not a busy loop, so
// 8 ranks fit on the 2-core machine without taking each other's cores; the
// time a compute really took (sleep overshoot included) is what counts as
// busy. Sends and recvs move a real 64 KiB buffer through ThreadComm's
// send_async / recv, and the program's waits wait on the sends' Requests.
// Rank threads run at real-time priority where allowed, and pinned one per
// core when they fit (RankThread says why); --no-realtime leaves the priority
// alone, to see what a neighbour's load does to the figures.
//
// Per repetition: all ranks sleep until one common start (after a barrier),
// run their programs, and note when they finished; makespan = the last
// rank's end - start; measured bubble = 1 - sum(busy) / (p * makespan).
// Each figure is the median over --reps repetitions (after one unmeasured
// warm-up), repetitions of the schedules of one (p, m) interleaved so a burst
// of foreign load falls on all of them alike. zero_grads and optimizer_step
// take no time here: the bubble is the pipeline's.
//
// --draw DIR writes, for each schedule at p = 4, m = 8, the simulation with
// F = B = W = 1 unit (drawn as 1 ms) as DIR/pipeline_<schedule>.json, and
// one measured run of 1F1B and of ZB-H1 at --ms as
// DIR/pipeline_measured_<schedule>.json, for scripts/draw_trace.py.
//
// The runs themselves: pipeline_runs.hpp; --gpt: pipeline_gpt.hpp.
#include "pipeline_gpt.hpp"
#include "pipeline_runs.hpp"
#include "timing.hpp"

#include <loom/exec/schedule_trace.hpp>
#include <loom/exec/trace.hpp>
#include <loom/io/atomic_file.hpp>
#include <loom/parallel/pipeline.hpp>
#include <loom/schedule/pipeline.hpp>
#include <loom/schedule/simulate.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using loom::ScheduleKind;

// The --schedules spellings (parallel/pipeline.hpp's parse_schedule), with the
// chunk count this bench runs each at.
struct Choice {
    std::string_view flag;
    ScheduleKind kind;
    int chunks;
};
constexpr Choice choices[] = {{"gpipe", ScheduleKind::gpipe, 1},
                              {"1f1b", ScheduleKind::one_f_one_b, 1},
                              {"interleaved", ScheduleKind::interleaved, 2},
                              {"zb", ScheduleKind::zero_bubble_h1, 1},
                              {"zbv", ScheduleKind::zero_bubble_v, 2}};
constexpr std::string_view valid_schedules = "gpipe, 1f1b, interleaved, zb (ZB-H1), zbv (ZB-V)";

using bench::median;
using namespace bench::pipeline_runs;

// Interleaved needs m to be a multiple of p; every other schedule runs any shape.
bool runs(const Choice& c, int p, int m) { return c.kind != ScheduleKind::interleaved || m % p == 0; }

// The closed forms for F = B = W and free p2p: GPipe and 1F1B
// (p-1)/(m+p-1); Megatron's interleaving divides the fill and drain by v,
// (p-1)/(vm+p-1); ZB-H1 takes 3m+p-1 units for 3m of work once m >= p
// (zero_bubble.hpp; with fewer micro-batches its warm-up cannot fill).
// None for ZB-V: zero_bubble.hpp promises its memory, not its makespan.
std::optional<double> formula_bubble(ScheduleKind kind, int p, int m, int chunks) {
    switch (kind) {
        case ScheduleKind::gpipe:
        case ScheduleKind::one_f_one_b: return static_cast<double>(p - 1) / (m + p - 1);
        case ScheduleKind::interleaved: return static_cast<double>(p - 1) / (chunks * m + p - 1);
        case ScheduleKind::zero_bubble_h1:
            if (m >= p) return static_cast<double>(p - 1) / (3 * m + p - 1);
            return std::nullopt;
        case ScheduleKind::zero_bubble_v: return std::nullopt;
    }
    return std::nullopt;
}

struct Row {
    const Choice* choice = nullptr;
    std::string label;  // "Interleaved<2>"
    bool ran = false;
    double bubble = 0, makespan_ms = 0, overshoot_us = 0;
    double sim_bubble = 0, sim_makespan_ms = 0;
    std::optional<double> formula;
};

std::string number_or_dash(std::optional<double> v, int decimals) {
    if (!v) return "-";
    char text[32];
    std::snprintf(text, sizeof text, "%.*f", decimals, *v);
    return text;
}

void print_row(const Row& row, int p, int m, const Row* one_f_one_b) {
    if (!row.ran) {
        std::printf("%-15s %3d %3d  n/a: interleaving needs m a multiple of p (%d %% %d = %d)\n", row.label.c_str(), p,
                    m, m, p, m % p);
        return;
    }
    // One stage has no pipeline bubble to compare, only timer noise.
    const std::optional<double> ratio =
        one_f_one_b && p > 1 ? std::optional(row.bubble / one_f_one_b->bubble) : std::nullopt;
    std::printf("%-15s %3d %3d  %8.4f %10.4f %8s %8s %11.2f %11.2f %10.1f\n", row.label.c_str(), p, m, row.bubble,
                row.sim_bubble, number_or_dash(row.formula, 4).c_str(), number_or_dash(ratio, 3).c_str(),
                row.makespan_ms, row.sim_makespan_ms, row.overshoot_us);
}

// The pass/fail lines. The simulation's own figure is printed beside each,
// so a miss that the schedule makes even with exact times reads as such.
struct Tally {
    int met = 0, missed = 0, not_applicable = 0;
    int unreachable = 0;  // missed, and missed by the simulation as well
};

const Row* find_row(const std::vector<Row>& rows, ScheduleKind kind) {
    const auto it = std::ranges::find(rows, kind, [](const Row& row) { return row.choice->kind; });
    return it == rows.end() ? nullptr : &*it;
}

void check_targets(const std::vector<Row>& rows, int p, int m, Tally& tally) {
    const auto verdict = [&](bool ok) {
        (ok ? tally.met : tally.missed) += 1;
        return ok ? "met" : "MISSED";
    };
    const Row* base = find_row(rows, ScheduleKind::one_f_one_b);
    if (base == nullptr) return;
    if (p == 1) {
        std::printf("target p=1 m=%-3d n/a: one stage is no pipeline (no bubble to compare)\n", m);
        ++tally.not_applicable;
        return;
    }
    const double formula = *base->formula;
    const double rel = base->bubble / formula - 1;
    std::printf("target p=%d m=%-3d 1F1B within 10%% of (p-1)/(m+p-1): measured %.4f, formula %.4f, %+.1f%% %s\n", p, m,
                base->bubble, formula, 100 * rel, verdict(std::abs(rel) <= 0.10));
    const auto versus = [&](ScheduleKind kind, double limit) {
        const Row* row = find_row(rows, kind);
        if (row == nullptr) return;
        if (!row->ran) {
            std::printf("target p=%d m=%-3d %s <= %.1f x 1F1B: n/a (m %% p != 0)\n", p, m, row->label.c_str(), limit);
            ++tally.not_applicable;
            return;
        }
        const double ratio = row->bubble / base->bubble;
        const double sim_ratio = row->sim_bubble / base->sim_bubble;
        const bool unreachable = sim_ratio > limit;
        if (ratio > limit && unreachable) ++tally.unreachable;
        std::printf("target p=%d m=%-3d %s <= %.1f x 1F1B: measured %.3f x (simulated %.3f x) %s%s\n", p, m,
                    row->label.c_str(), limit, ratio, sim_ratio, verdict(ratio <= limit),
                    unreachable ? " (the schedule misses it with exact times too)" : "");
    };
    versus(ScheduleKind::zero_bubble_h1, 0.5);
    versus(ScheduleKind::interleaved, 0.6);
}

std::vector<PipelineProgram> programs_of(const std::vector<const Choice*>& selected, int p, int m,
                                         std::vector<Row>& rows) {
    std::vector<PipelineProgram> programs;
    rows.clear();
    for (const Choice* c : selected) {
        Row row;
        row.choice = c;
        row.label = std::string(loom::name(c->kind));
        row.ran = runs(*c, p, m);
        if (c->kind == ScheduleKind::interleaved) row.label += "<" + std::to_string(c->chunks) + ">";
        if (row.ran) programs.push_back(loom::schedule::pipeline_program(c->kind, p, m, c->chunks));
        rows.push_back(std::move(row));
    }
    return programs;
}

double load_average() {
    std::ifstream in("/proc/loadavg");
    double one = -1;
    in >> one;
    return one;
}

void print_thread_note(bool realtime) {
    if (realtime)
        std::printf("# rank threads: SCHED_FIFO priority 1, timer slack 1 ns, one core each when p <= cores\n");
    else
        std::printf("# rank threads: normal priority (real-time refused or --no-realtime), timer slack 1 ns, one core "
                    "each when p <= cores; other processes' load delays wake-ups and inflates the bubbles\n");
}

int synthetic(const std::vector<const Choice*>& selected, const std::vector<int>& stages,
              const std::vector<int>& micro_batches, int reps, double stage_ms, bool realtime) {
    std::printf("# bench_pipeline --synthetic: F = B = W = %.3g ms per whole stage (half that per chunk where a rank "
                "holds 2), p2p %lld KiB per message over ThreadWorld; median of %d repetitions after 1 warm-up; "
                "load average %.2f at start\n",
                stage_ms, static_cast<long long>(message_floats * 4 / 1024), reps, load_average());
    print_thread_note(realtime);
    std::printf("# bubble = 1 - sum(busy) / (p x makespan), busy = measured compute time; sim = schedule::simulate "
                "with the same times and free p2p; vs_1F1B = bubble / 1F1B's measured bubble; overshoot = mean "
                "measured minus nominal time per compute\n");
    std::printf("%-15s %3s %3s  %8s %10s %8s %8s %11s %11s %10s\n", "# schedule", "p", "m", "bubble", "sim_bubble",
                "formula", "vs_1F1B", "makespan_ms", "sim_ms", "overshoot_us");
    std::fflush(stdout);
    struct Cell {
        int p, m;
        std::vector<Row> rows;
    };
    std::vector<Cell> cells;
    for (int p : stages)
        for (int m : micro_batches) {
            Cell& cell = cells.emplace_back(Cell{p, m, {}});
            const std::vector<PipelineProgram> programs = programs_of(selected, p, m, cell.rows);
            const auto measured = measure(programs, p, reps, stage_ms, realtime);
            std::size_t k = 0;
            for (auto& row : cell.rows) {
                if (!row.ran) continue;
                const auto& program = programs[k];
                const auto sim = loom::schedule::simulate(program, chunk_times(stage_ms, program.chunks));
                std::vector<double> bubbles, makespans, overshoots;
                for (const auto& rep : measured[k]) {
                    bubbles.push_back(rep.bubble);
                    makespans.push_back(rep.makespan_s);
                    overshoots.push_back(rep.overshoot_s);
                }
                row.bubble = median(bubbles);
                row.makespan_ms = 1e3 * median(makespans);
                row.overshoot_us = 1e6 * median(overshoots);
                row.sim_bubble = sim.bubble;
                row.sim_makespan_ms = sim.makespan;
                row.formula = formula_bubble(row.choice->kind, p, m, program.chunks);
                ++k;
            }
            const Row* base = find_row(cell.rows, ScheduleKind::one_f_one_b);
            for (const auto& row : cell.rows) print_row(row, p, m, base);
            std::fflush(stdout);
        }
    std::printf("# load average %.2f at end\n", load_average());
    if (std::ranges::find(selected, ScheduleKind::one_f_one_b, &Choice::kind) == selected.end()) {
        std::printf("# targets: not checked (they compare against 1F1B, which --schedules left out)\n");
        return 0;
    }
    Tally tally;
    for (const Cell& cell : cells) check_targets(cell.rows, cell.p, cell.m, tally);
    std::printf("targets: %d met, %d missed (%d of them missed by the simulation too), %d n/a\n", tally.met,
                tally.missed, tally.unreachable, tally.not_applicable);
    return 0;
}

// The pictures: every selected schedule simulated at p = 4, m = 8, and one
// measured run each of 1F1B and ZB-H1 (the repetition with the median makespan).
int draw(const std::vector<const Choice*>& selected, const std::filesystem::path& dir, int reps, double stage_ms,
         bool realtime) {
    constexpr int p = 4, m = 8;
    std::filesystem::create_directories(dir);
    print_thread_note(realtime);
    for (const Choice* c : selected) {
        const PipelineProgram program = loom::schedule::pipeline_program(c->kind, p, m, c->chunks);
        // One unit per whole stage, as in the measured runs: a chunk of a
        // two-chunk schedule takes half a unit.
        const auto sim = loom::schedule::simulate(program, chunk_times(1.0, c->chunks));
        const auto path = dir / ("pipeline_" + std::string(c->flag) + ".json");
        loom::exec::write_schedule_trace(sim, path);
        std::printf("simulated %s p=%d m=%d F=B=W=1 unit makespan=%.1f units bubble=%.4f file=%s\n",
                    program.schedule.c_str(), p, m, sim.makespan, sim.bubble, path.c_str());
    }
    for (const Choice* c : selected) {
        if (c->kind != ScheduleKind::one_f_one_b && c->kind != ScheduleKind::zero_bubble_h1) continue;
        const std::vector<PipelineProgram> programs{loom::schedule::pipeline_program(c->kind, p, m, c->chunks)};
        auto reps_measured = measure(programs, p, reps, stage_ms, realtime)[0];
        std::ranges::sort(reps_measured, {}, &Repetition::makespan_s);
        const Repetition& rep = reps_measured[reps_measured.size() / 2];
        const auto path = dir / ("pipeline_measured_" + std::string(c->flag) + ".json");
        loom::io::write_file_atomically(path, loom::exec::chrome_trace_json(rep.events));
        std::printf("measured %s p=%d m=%d F=B=W=%.3g ms makespan=%.2f ms bubble=%.4f (median of %d by makespan) "
                    "file=%s\n",
                    programs[0].schedule.c_str(), p, m, stage_ms, 1e3 * rep.makespan_s, rep.bubble, reps, path.c_str());
    }
    std::printf("# draw each with: /usr/bin/python3 scripts/draw_trace.py FILE.json -o docs/images/NAME.png "
                "--title TEXT\n");
    return 0;
}

// "4,8,16" -> {4, 8, 16}; false when an item is not an integer.
bool parse_ints(std::string_view text, std::vector<int>& out, std::string& bad) {
    out.clear();
    for (std::string_view rest = text;;) {
        const auto comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        int value = 0;
        const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
        if (item.empty() || error != std::errc() || end != item.data() + item.size()) {
            bad = std::string(item);
            return false;
        }
        out.push_back(value);
        if (comma == std::string_view::npos) return true;
        rest = rest.substr(comma + 1);
    }
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 5;
    double stage_ms = 5;
    std::vector<int> stages{2, 4, 8}, micro_batches{4, 8, 16};
    std::vector<const Choice*> selected;
    for (const Choice& c : choices) selected.push_back(&c);
    std::optional<std::filesystem::path> draw_dir;
    bool shape_given = false, realtime = true, gpt = false;
    int gpt_steps = 6;
    const auto fail = [](const std::string& what) {
        std::fprintf(stderr, "bench_pipeline: %s\n", what.c_str());
        return 2;
    };
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--synthetic") continue;
        if (flag == "--gpt") {
            gpt = true;
            continue;
        }
        if (flag == "--steps") {
            std::vector<int> n;
            std::string bad;
            if (i + 1 >= argc || !parse_ints(argv[i + 1], n, bad) || n.size() != 1 || n[0] < 1 || n[0] > 1000)
                return fail("--steps needs a whole number in 1..1000");
            gpt_steps = n[0];
            ++i;
            continue;
        }
        if (flag == "--no-realtime") {
            realtime = false;
            continue;
        }
        const bool known = flag == "--draw" || flag == "--reps" || flag == "--ms" || flag == "--schedules" ||
                           flag == "--stages" || flag == "--micro-batches";
        if (!known)
            return fail("unknown flag " + std::string(flag) +
                        "; flags are --synthetic, --draw DIR, --gpt, --steps N (--gpt), --reps N, --ms X, --schedules LIST, "
                        "--stages LIST, --micro-batches LIST, --no-realtime");
        if (i + 1 >= argc) return fail(std::string(flag) + " needs a value");
        const std::string value = argv[++i];
        std::string bad;
        if (flag == "--draw") {
            draw_dir = value;
        } else if (flag == "--reps") {
            std::vector<int> n;
            if (!parse_ints(value, n, bad) || n.size() != 1 || n[0] < 1 || n[0] > 1000)
                return fail("--reps " + value + " is not a whole number in 1..1000");
            reps = n[0];
        } else if (flag == "--ms") {
            char* end = nullptr;
            stage_ms = std::strtod(value.c_str(), &end);
            if (value.empty() || *end != '\0' || !(stage_ms >= 0.1 && stage_ms <= 1000))
                return fail("--ms " + value + " is not a number of milliseconds in 0.1..1000");
        } else if (flag == "--schedules") {
            selected.clear();
            for (std::string_view rest = value;;) {
                const auto comma = rest.find(',');
                const std::string_view item = rest.substr(0, comma);
                const auto it = std::ranges::find(choices, item, &Choice::flag);
                if (it == std::end(choices))
                    return fail("--schedules: \"" + std::string(item) + "\" is not a schedule; use " +
                                std::string(valid_schedules));
                selected.push_back(&*it);
                if (comma == std::string_view::npos) break;
                rest = rest.substr(comma + 1);
            }
        } else if (flag == "--stages") {
            shape_given = true;
            if (!parse_ints(value, stages, bad))
                return fail("--stages: \"" + bad + "\" is not a whole number; give e.g. 2,4,8");
            for (int p : stages)
                if (p < 1 || p > 64) return fail("--stages " + std::to_string(p) + " is not in 1..64");
        } else {
            shape_given = true;
            if (!parse_ints(value, micro_batches, bad))
                return fail("--micro-batches: \"" + bad + "\" is not a whole number; give e.g. 4,8,16");
            for (int m : micro_batches)
                if (m < 1 || m > 1024) return fail("--micro-batches " + std::to_string(m) + " is not in 1..1024");
        }
    }
    if (draw_dir && shape_given)
        return fail("--stages and --micro-batches apply to --synthetic; --draw always draws p = 4, m = 8");
    if (gpt) {
        if (draw_dir || shape_given) return fail("--gpt runs its own table; drop --draw, --stages and --micro-batches");
        try {
            return bench_gpt::gpt_table(16, gpt_steps, 2, reps);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
            return 1;
        }
    }
    realtime = realtime && RankThread::realtime_allowed();
    try {
        return draw_dir ? draw(selected, *draw_dir, reps, stage_ms, realtime)
                        : synthetic(selected, stages, micro_batches, reps, stage_ms, realtime);
    } catch (const std::exception& e) {  // an unwritable --draw folder, a world that failed
        std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
        return 1;
    }
}
