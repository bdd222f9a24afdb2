// bench/data_parallel: loom's data-parallel GPT training step on rank threads
// (ThreadWorld, one BLAS thread per rank) against loom's own dp=1 and against
// PyTorch DistributedDataParallel (bench/data_parallel_torch.py, gloo, one
// thread per rank) measured in the same run; memory per rank for ZeRO stages
// 0-3 from loom's own accounting (Executor::memory_report) beside the ZeRO
// paper's prediction and the process's VmHWM; the sgemm peak of this machine
// in the same run, so the achieved GFLOP/s read as a fraction of it.
//
//   bench_data_parallel [--steps 20] [--warmup 3] [--config A|B] [--no-torch]
//                       [--stages 0,1,2,3] [--dp 2,4] [--bucket BYTES] [--trace FILE]
//
// --bucket sets ExecutionPlan::bucket_bytes for every loom run (default the
// DataParallel<> default, 2 MiB); --trace writes the Chrome trace of one more
// dp=2 stage-2 run (loom::exec::write_trace), for scripts/draw_trace.py.
//
// The batch is PER RANK (config A: 8 sequences of 128 tokens), so dp ranks
// train dp x batch sequences a step; tokens/s = global tokens per step over
// the median step time. Every rank's batches (its rows of each step's global
// batch, ByteCorpus::rows) are made before the clock; each rank times each of
// its steps (Executor::step: zero grads, forward, backward with the bucketed
// gradient collectives in flight, AdamW, the loss all-reduce); a step is done
// when its slowest rank is, so the step time is the max over ranks, and the
// figure is the median over the timed steps. One machine-readable line per
// measurement on stdout; lines starting with '#' are commentary. In order:
// the sgemm peak (single core, and every core at once), loom dp=1 and dp=2
// stage 0, the PyTorch DDP lines (or "torch: not available (why)"), the ZeRO
// table (dp x stage), the sgemm peak again, the fractions of peak, and the
// ratio lines with their targets. comm_ms is the time a rank's collectives
// ran on its progress thread per step, exposed_comm_ms the time its compute
// thread stood waiting for them (from the executor's trace).
//
// Every measurement line ends in other_cores=X: the cores' worth of CPU time
// that processes other than this bench (and the PyTorch peer it started) used
// while it ran, from /proc/stat and getrusage. On the shared 2-core machine a
// neighbour's compile takes a rank's core; compare runs where X is near 0.
#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/memory.hpp>
#include <loom/parallel/zero_shard.hpp>
#include <loom/exec/trace.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>

#include <malloc.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#ifndef LOOM_SOURCE_DIR
#define LOOM_SOURCE_DIR "."
#endif

#include "gpt_bench_configs.hpp"

namespace {

using loom::comm::ThreadComm;

using bench::BenchConfig;
using bench::configs;
using bench::median;
using bench::usable_cores;

constexpr std::uint64_t data_seed = 1;
constexpr std::uint64_t init_seed = 1;
// The AdamW of data_parallel_torch.py (the cost does not depend on it).
constexpr loom::optim::AdamWConfig adamw{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};


constexpr double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }


// A line of /proc/self/status in MiB ("VmHWM:", the resident-set high-water
// mark; "VmRSS:", the resident set now), or -1.
double vm_mib(std::string_view key) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
        if (line.starts_with(key)) return std::atof(line.c_str() + key.size()) / 1024.0;
    return -1;
}

// Resets VmHWM to the current RSS (Linux: "5" into clear_refs), so each run's
// high-water mark is its own; first hands the heap's free memory back (the
// previous run's rank threads leave their malloc arenas resident otherwise).
// Returns whether the reset worked.
bool reset_vm_hwm() {
    malloc_trim(0);
    std::ofstream refs("/proc/self/clear_refs");
    if (!refs) return false;
    refs << "5";
    refs.flush();
    return static_cast<bool>(refs);
}

using bench::ForeignLoad;

struct LoomRun {
    double step_seconds = 0;      // median over steps of the max over ranks
    double rank_spread = 0;       // median over steps of (max - min) / max over ranks
    loom::MemoryReport memory;    // the rank with the largest total
    std::int64_t parameters = 0;  // dense parameter count
    double vm_hwm = -1;           // MiB, the whole process (all ranks)
    double vm_base = -1;          // MiB, the process's resident set when the run began
    float final_loss = 0;
    double other_cores = -1;      // ForeignLoad over the run
    double comm_ms = 0;           // per step: collectives' time on the progress thread (median, slowest rank)
    double exposed_ms = 0;        // per step: time the rank thread waited for them (median, slowest rank)
};

// Per step (median over the timed steps): milliseconds the rank's collectives
// ran on its progress thread, and milliseconds its compute thread stood
// waiting for them (the "wait for" events): the part the overlap did not hide.
std::pair<double, double> communication_ms(const loom::exec::Trace& trace, int warmup, int steps) {
    std::vector<double> comm(static_cast<std::size_t>(steps)), exposed(comm.size());
    for (const auto& e : trace.events()) {
        if (e.step < warmup || e.step >= warmup + steps) continue;
        const auto s = static_cast<std::size_t>(e.step - warmup);
        if (e.lane == loom::exec::communication_lane) comm[s] += e.duration_us / 1e3;
        else if (e.category == "wait") exposed[s] += e.duration_us / 1e3;
    }
    return {median(comm), median(exposed)};
}

// Trains `steps` timed steps after `warmup` on dp rank threads at ZeRO `stage`.
LoomRun run_loom(const BenchConfig& config, int dp, int stage, std::int64_t bucket_bytes, int steps, int warmup,
                 const std::string& trace_path = {}) {
    const std::int64_t B = config.batch, T = config.model.seq;
    const int total = warmup + steps;
    // Before the clock: every rank's rows of every step's global batch.
    auto batches = bench::pregenerated_batches(config, dp, total, data_seed);

    std::vector<std::vector<double>> seconds(static_cast<std::size_t>(dp),
                                             std::vector<double>(static_cast<std::size_t>(steps)));
    std::vector<loom::MemoryReport> reports(static_cast<std::size_t>(dp));
    std::vector<float> losses(static_cast<std::size_t>(dp));
    std::vector<std::pair<double, double>> comm_ms(static_cast<std::size_t>(dp));
    std::int64_t parameters = 0;
    const bool hwm_reset = reset_vm_hwm();
    const double vm_base = vm_mib("VmRSS:");
    const ForeignLoad load;

    loom::comm::ThreadWorld(dp).run([&](ThreadComm& world) {
        loom::comm::Mesh<ThreadComm> mesh(world, {{"dp", dp}});
        ThreadComm& comm = mesh.axis("dp");
        const int r = comm.rank();
        auto model = loom::gpt::make_model(config.model);
        loom::exec::Executor<ThreadComm> exec(model, comm, loom::exec::ExecutionPlan{stage, bucket_bytes},
                                              {.micro_batches = 1,
                                               .adamw = adamw,
                                               .trace = true,  // for comm_ms; its cost is a few clock reads a unit
                                               .field_names = {"embed", "blocks", "ln_f", "head", "loss"}});
        exec.initialize(init_seed);
        float loss = 0;
        for (int s = 0; s < total; ++s) {
            auto& in = batches.inputs[batches.at(r, s)];
            auto& out = batches.targets[batches.at(r, s)];
            const auto t0 = std::chrono::steady_clock::now();
            loss = exec.step(loom::Tensor::of(in.data(), {B, T}), loom::Tensor::of(out.data(), {B, T}), adamw.lr);
            const auto t1 = std::chrono::steady_clock::now();
            if (s >= warmup)
                seconds[static_cast<std::size_t>(r)][static_cast<std::size_t>(s - warmup)] =
                    std::chrono::duration<double>(t1 - t0).count();
        }
        reports[static_cast<std::size_t>(r)] = exec.memory_report();
        losses[static_cast<std::size_t>(r)] = loss;
        comm_ms[static_cast<std::size_t>(r)] = communication_ms(exec.trace(), warmup, steps);
        if (r == 0) parameters = exec.layout().dense_size();
        if (!trace_path.empty()) loom::exec::write_trace(comm, exec.trace(), trace_path);
    });

    LoomRun run;
    run.other_cores = load.cores();
    run.vm_hwm = hwm_reset ? vm_mib("VmHWM:") : -1;
    run.vm_base = vm_base;
    std::vector<double> step_max(static_cast<std::size_t>(steps)), spread(static_cast<std::size_t>(steps));
    for (std::size_t s = 0; s < step_max.size(); ++s) {
        double hi = 0, lo = 1e300;
        for (const auto& rank : seconds) {
            hi = std::max(hi, rank[s]);
            lo = std::min(lo, rank[s]);
        }
        step_max[s] = hi;
        spread[s] = (hi - lo) / hi;
    }
    run.step_seconds = median(step_max);
    run.rank_spread = median(spread);
    run.memory = *std::max_element(reports.begin(), reports.end(),
                                   [](const auto& a, const auto& b) { return a.total() < b.total(); });
    run.parameters = parameters;
    run.final_loss = losses[0];
    for (const auto& [comm, exposed] : comm_ms) {
        run.comm_ms = std::max(run.comm_ms, comm);
        run.exposed_ms = std::max(run.exposed_ms, exposed);
    }
    return run;
}

// The sgemm rate of every usable core at once (one product per core thread,
// one BLAS thread each): the limit for ranks that each run their own GEMMs.
double all_cores_sgemm_gflops(int cores) {
    std::vector<double> rates(static_cast<std::size_t>(cores));
    std::vector<std::thread> threads;
    for (int c = 0; c < cores; ++c)
        threads.emplace_back(
            [&rates, c] { rates[static_cast<std::size_t>(c)] = loom::kernels::host::measure_sgemm_gflops(1024, 7); });
    for (auto& t : threads) t.join();
    double sum = 0;
    for (double r : rates) sum += r;
    return sum;
}

struct TorchRun {
    double tokens_per_s = 0;
    double step_ms = 0;
    std::string line;  // its result line, or why there is none
};

double field(const std::string& line, std::string_view key) {
    const auto at = line.find(std::string(key) + "=");
    return at == std::string::npos ? 0 : std::atof(line.c_str() + at + key.size() + 1);
}

// Runs data_parallel_torch.py at `ranks`; tokens_per_s = 0 when it did not run.
TorchRun run_torch(const std::string& config, int ranks, int steps, int warmup) {
    TorchRun result;
    const ForeignLoad load;
    for (int attempt = 0; attempt < 3; ++attempt) {
        // A port of our own, so a neighbour's run of the same script does not collide.
        const int port = 29600 + static_cast<int>((getpid() * 7 + attempt * 101 + ranks) % 300);
        const std::string command = "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/python3 " +
                                    std::string(LOOM_SOURCE_DIR) + "/bench/data_parallel_torch.py --config " + config +
                                    " --ranks " + std::to_string(ranks) + " --steps " + std::to_string(steps) +
                                    " --warmup " + std::to_string(warmup) + " --port " + std::to_string(port) + " 2>&1";
        FILE* pipe = popen(command.c_str(), "r");
        if (pipe == nullptr) {
            result.line = "cannot start /usr/bin/python3";
            return result;
        }
        char buffer[2048];
        std::string last;
        while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) {
            std::string text = buffer;
            while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
            if (text.starts_with("torch_ddp ")) {
                result.line = text;
                result.tokens_per_s = field(text, "tokens_per_s");
                result.step_ms = field(text, "step_ms");
            } else if (!text.empty()) {
                last = text;
                std::fprintf(stderr, "  %s\n", text.c_str());
            }
        }
        const int status = pclose(pipe);
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (result.tokens_per_s > 0) {
            char other[64];
            std::snprintf(other, sizeof other, " other_cores=%.2f", load.cores());
            result.line += other;
            return result;
        }
        result.line = last.empty() ? "exit code " + std::to_string(code) : last;
        if (code != 2 || last.find("in use") == std::string::npos) return result;  // only a busy port is retried
    }
    return result;
}

std::vector<int> int_list(std::string_view text) {
    std::vector<int> out;
    for (std::string_view rest = text; !rest.empty();) {
        const auto comma = rest.find(',');
        out.push_back(std::atoi(std::string(rest.substr(0, comma)).c_str()));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    return out;
}

struct Peak {
    double single_core = 0;  // GFLOP/s, one core
    double all_cores = 0;    // GFLOP/s, every usable core at once
    double other_cores = -1;
};

Peak measure_peak(int cores) {
    const ForeignLoad load;
    Peak p;
    p.single_core = loom::kernels::host::measure_sgemm_gflops(1024, 7);
    p.all_cores = all_cores_sgemm_gflops(cores);
    p.other_cores = load.cores();
    return p;
}

double gflops_of(const BenchConfig& config, int dp, double step_seconds) {
    const double tokens = static_cast<double>(dp * config.batch * config.model.seq);
    return config.model.flops_per_token(config.model.seq) * tokens / step_seconds / 1e9;
}

void print_loom(int dp, int stage, std::int64_t bucket, const BenchConfig& config, const LoomRun& run,
                bool oversubscribed) {
    const double tokens = static_cast<double>(dp * config.batch * config.model.seq);
    const auto& m = run.memory;
    std::printf("loom dp=%d stage=%d bucket_KiB=%lld tokens_per_s=%.0f step_ms=%.2f GFLOPs=%.1f rank_spread=%.1f%% "
                "comm_ms=%.2f exposed_comm_ms=%.2f mem_total_MiB=%.2f params_MiB=%.2f grads_MiB=%.2f optim_MiB=%.2f "
                "act_MiB=%.2f comm_MiB=%.2f zero_pred_states_MiB=%.2f vm_hwm_MiB=%.0f vm_base_MiB=%.0f loss=%.4f "
                "other_cores=%.2f%s\n",
                dp, stage, static_cast<long long>(bucket >> 10), tokens / run.step_seconds, run.step_seconds * 1e3,
                gflops_of(config, dp, run.step_seconds), 100 * run.rank_spread, run.comm_ms, run.exposed_ms,
                mib(m.total()), mib(m.parameters), mib(m.gradients), mib(m.optimizer_state), mib(m.activations),
                mib(m.communication_buffers), loom::zero_model_state_bytes(stage, run.parameters, dp) / (1024.0 * 1024.0),
                run.vm_hwm, run.vm_base, static_cast<double>(run.final_loss), run.other_cores,
                oversubscribed ? " oversubscribed=1" : "");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 20, warmup = 3;
    std::string config_name = "A", trace_path;
    bool torch = true;
    std::vector<int> stages{0, 1, 2, 3}, dps{2, 4};
    std::int64_t bucket = loom::default_bucket_bytes;
    auto usage = [] {
        std::fprintf(stderr,
                     "bench_data_parallel [--steps 20] [--warmup 3] [--config A|B] [--no-torch] [--stages 0,1,2,3] "
                     "[--dp 2,4] [--bucket BYTES] [--trace FILE]\n");
        return 2;
    };
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        const bool has_value = i + 1 < argc;
        if (flag == "--no-torch") torch = false;
        else if (flag == "--steps" && has_value) steps = std::atoi(argv[++i]);
        else if (flag == "--warmup" && has_value) warmup = std::atoi(argv[++i]);
        else if (flag == "--config" && has_value) config_name = argv[++i];
        else if (flag == "--stages" && has_value) stages = int_list(argv[++i]);
        else if (flag == "--dp" && has_value) dps = int_list(argv[++i]);
        else if (flag == "--bucket" && has_value) bucket = std::atoll(argv[++i]);
        else if (flag == "--trace" && has_value) trace_path = argv[++i];
        else {
            std::fprintf(stderr, "bench_data_parallel: unknown flag or missing value: %s\n", argv[i]);
            return usage();
        }
    }
    if (steps < 1 || warmup < 0) {
        std::fprintf(stderr, "bench_data_parallel: --steps %d --warmup %d; steps must be >= 1 and warmup >= 0\n", steps,
                     warmup);
        return 2;
    }
    if (!configs().contains(config_name)) {
        std::fprintf(stderr, "bench_data_parallel: config %s is not one of A, B\n", config_name.c_str());
        return 2;
    }
    for (int s : stages)
        if (s < 0 || s > 3) {
            std::fprintf(stderr, "bench_data_parallel: stage %d is not 0, 1, 2 or 3\n", s);
            return 2;
        }
    for (int d : dps)
        if (d < 1 || d > 64) {
            std::fprintf(stderr, "bench_data_parallel: dp %d is not in 1..64\n", d);
            return 2;
        }
    if (bucket < 1) {
        std::fprintf(stderr, "bench_data_parallel: --bucket %lld must be positive\n", static_cast<long long>(bucket));
        return 2;
    }
    const BenchConfig& config = configs().at(config_name);
    const int cores = usable_cores();

    // glibc raises its mmap threshold to the size of any mmapped block freed
    // (measure_sgemm_gflops frees 4 MiB matrices); the contexts' first-step
    // chunks would then come from the heap and stay resident once freed, and
    // each rank would look 150 MiB larger than in a training process that
    // did not measure a GEMM first. Pinning the default keeps VmHWM honest.
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);

    // One BLAS thread per rank thread: OpenBLAS sized its pool when it loaded,
    // so set the count directly; the variable is for the PyTorch peer.
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    loom::kernels::host::set_blas_threads(1);

    std::printf("# bench_data_parallel: config %s: layers %lld, width %lld, heads %lld, seq %lld, vocab %lld, "
                "batch %lld per rank; %d timed steps after %d warm-up; step time = max over ranks, median over steps\n",
                config_name.c_str(), static_cast<long long>(config.model.layers),
                static_cast<long long>(config.model.width), static_cast<long long>(config.model.heads),
                static_cast<long long>(config.model.seq), static_cast<long long>(config.model.vocab),
                static_cast<long long>(config.batch), steps, warmup);
    std::printf("# cores=%d blas_threads=%d per rank thread (ThreadWorld); each rank also has a progress thread "
                "for its async collectives\n",
                cores, loom::kernels::host::blas_threads());
    // The sgemm peak before and after the runs; the larger is used (a
    // neighbour's load only ever lowers it).
    const Peak peak_before = measure_peak(cores);
    std::printf("sgemm when=start single_core_GFLOPs=%.1f all_cores_GFLOPs=%.1f cores=%d other_cores=%.2f (1024^3, "
                "1 BLAS thread per core)\n",
                peak_before.single_core, peak_before.all_cores, cores, peak_before.other_cores);
    std::fflush(stdout);

    // The figures the targets compare come first, close together in time
    // (dp=1, dp=2 stage 0, PyTorch DDP at 1 and 2 ranks), so a neighbour's
    // burst of load is less likely to fall on one side of a ratio only.
    const LoomRun dp1 = run_loom(config, 1, 0, bucket, steps, warmup);
    print_loom(1, 0, bucket, config, dp1, false);
    std::optional<LoomRun> dp2_stage0;
    bool noted = false;
    auto measure = [&](int dp, int stage) {
        const bool oversubscribed = dp > cores;
        if (oversubscribed && !noted) {
            std::printf("# note: dp=%d runs %d rank threads on %d cores: oversubscribed, so its tokens_per_s is not a "
                        "scaling figure; its memory columns are valid\n",
                        dp, dp, cores);
            noted = true;
        }
        const LoomRun run = run_loom(config, dp, stage, bucket, steps, warmup);
        print_loom(dp, stage, bucket, config, run, oversubscribed);
        if (dp == 2 && stage == 0) dp2_stage0 = run;
    };
    const bool with_dp2_stage0 = std::ranges::find(dps, 2) != dps.end() && std::ranges::find(stages, 0) != stages.end();
    if (with_dp2_stage0) measure(2, 0);

    std::optional<TorchRun> torch1, torch2;
    if (torch) {
        torch1 = run_torch(config_name, 1, steps, warmup);
        if (torch1->tokens_per_s > 0) {
            std::printf("%s\n", torch1->line.c_str());
            std::fflush(stdout);
            torch2 = run_torch(config_name, 2, steps, warmup);
            if (torch2->tokens_per_s > 0) std::printf("%s\n", torch2->line.c_str());
            else std::printf("torch: not available (ranks=2: %s)\n", torch2->line.c_str());
        } else {
            std::printf("torch: not available (%s)\n", torch1->line.c_str());
        }
        std::fflush(stdout);
    }

    std::printf("# ZeRO stages: tokens/s and memory per rank (mem_* from Executor::memory_report, the rank with the "
                "largest total; zero_pred_states = the ZeRO paper's params+grads+optim; vm_hwm = the whole "
                "process's peak resident set during the run, all ranks; vm_base = its resident set when the run began: "
                "OpenBLAS's per-thread buffers, earlier runs' malloc arenas)\n");
    for (int dp : dps)
        for (int stage : stages)
            if (!(dp == 2 && stage == 0)) measure(dp, stage);

    const Peak peak_after = measure_peak(cores);
    std::printf("sgemm when=end single_core_GFLOPs=%.1f all_cores_GFLOPs=%.1f cores=%d other_cores=%.2f\n",
                peak_after.single_core, peak_after.all_cores, cores, peak_after.other_cores);
    const double peak1 = std::max(peak_before.single_core, peak_after.single_core);
    const double peak_all = std::max(peak_before.all_cores, peak_after.all_cores);
    // The peak a run on `workers` cores could reach: that many cores' worth, at most all.
    auto of_peak = [&](double gflops, int workers) {
        return 100 * gflops / (workers >= cores ? peak_all : peak1 * workers);
    };
    std::printf("of_peak loom_dp1=%.1f%%", of_peak(gflops_of(config, 1, dp1.step_seconds), 1));
    if (dp2_stage0) std::printf(" loom_dp2=%.1f%%", of_peak(gflops_of(config, 2, dp2_stage0->step_seconds), 2));
    if (torch1 && torch1->tokens_per_s > 0)
        std::printf(" torch_ddp1=%.1f%%", of_peak(gflops_of(config, 1, 1e-3 * torch1->step_ms), 1));
    if (torch2 && torch2->tokens_per_s > 0)
        std::printf(" torch_ddp2=%.1f%%", of_peak(gflops_of(config, 2, 1e-3 * torch2->step_ms), 2));
    std::printf(" (of single_core_GFLOPs=%.1f for 1 rank, all_cores_GFLOPs=%.1f for %d; the larger of start and end)\n",
                peak1, peak_all, cores);

    const double tokens1 = static_cast<double>(config.batch * config.model.seq) / dp1.step_seconds;
    if (dp2_stage0) {
        const double tokens2 = static_cast<double>(2 * config.batch * config.model.seq) / dp2_stage0->step_seconds;
        const double scaling = tokens2 / tokens1;
        std::printf("ratio dp2_over_dp1=%.2f target=1.8 %s\n", scaling, scaling >= 1.8 ? "met" : "missed");
        if (torch2 && torch2->tokens_per_s > 0) {
            const double over = tokens2 / torch2->tokens_per_s;
            std::printf("ratio loom_dp2_over_torch_ddp2=%.2f target=1.2 %s\n", over, over >= 1.2 ? "met" : "missed");
        }
    }
    if (torch1 && torch2 && torch1->tokens_per_s > 0 && torch2->tokens_per_s > 0)
        std::printf("ratio torch_ddp2_over_ddp1=%.2f\n", torch2->tokens_per_s / torch1->tokens_per_s);
    if (torch1 && torch1->tokens_per_s > 0)
        std::printf("ratio loom_dp1_over_torch_ddp1=%.2f\n", tokens1 / torch1->tokens_per_s);
    std::fflush(stdout);

    if (!trace_path.empty()) {
        const int trace_steps = std::min(steps, 3);
        (void)run_loom(config, 2, 2, bucket, trace_steps, warmup, trace_path);
        std::printf("trace file=%s dp=2 stage=2 steps=%d (the first %d are warm-up)\n", trace_path.c_str(),
                    warmup + trace_steps, warmup);
    }
    return 0;
}
