// What the GPT training benchmarks (bench/train_gpt.cpp, bench_data_parallel,
// bench_compression; bench/data_parallel_torch.py mirrors it) share, so that
// their rows describe the same runs: configs A and B with their sequences per
// rank, the cores this process may use (its affinity mask, not the machine's
// count), and how much of the machine other processes took while they
// measured. The median they report: timing.hpp.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <loom/data/corpus.hpp>
#include <loom/gpt/model.hpp>

#include "timing.hpp"

namespace bench {

struct BenchConfig {
    loom::gpt::Config model;
    std::int64_t batch;  // sequences per rank
};

inline const std::map<std::string, BenchConfig>& configs() {
    static const std::map<std::string, BenchConfig> all{
        {"A", {{.layers = 4, .width = 256, .heads = 4, .seq = 128, .vocab = 256}, 8}},
        {"B", {{.layers = 2, .width = 64, .heads = 4, .seq = 64, .vocab = 256}, 4}},
    };
    return all;
}

inline int usable_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// How much of the machine other processes used while we measured: on a
// shared 2-core machine a neighbour's compile halves a rank's core, and the
// numbers are only worth comparing when this is near 0.
class ForeignLoad {
public:
    ForeignLoad() : start_(sample()) {}
    // Also counts `helper`'s CPU time as ours: a child this process talks to
    // and has not waited for (bench/train_gpt's PyTorch peer).
    explicit ForeignLoad(pid_t helper) : helper_(helper), start_(sample()) {}
    // Cores' worth of CPU time (0..cores) that neither this process nor its
    // waited-for children (nor the helper) used since construction; -1 if unknown.
    [[nodiscard]] double cores() const {
        const Sample now = sample();
        const double wall = std::chrono::duration<double>(now.when - start_.when).count();
        if (start_.machine < 0 || now.machine < 0 || wall <= 0) return -1;
        const double foreign = (now.machine - start_.machine) - (now.own - start_.own);
        return std::max(0.0, foreign / wall);
    }

private:
    struct Sample {
        double machine = -1;  // seconds of non-idle CPU time, all processes, all cores
        double own = 0;       // this process's and its waited-for children's CPU seconds
        std::chrono::steady_clock::time_point when;
    };
    static double seconds(const timeval& t) {
        return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
    }
    // utime + stime of a live process, from /proc/PID/stat (fields 14 and 15,
    // counted after the parenthesised command name, which may hold spaces).
    static double process_seconds(pid_t pid) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const auto close = text.rfind(')');
        if (close == std::string::npos) return 0;
        std::istringstream fields(text.substr(close + 2));
        std::string field;
        double utime = 0, stime = 0;
        for (int i = 3; i <= 15 && fields >> field; ++i) {
            if (i == 14) utime = std::atof(field.c_str());
            if (i == 15) stime = std::atof(field.c_str());
        }
        return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
    Sample sample() const {
        Sample s;
        s.when = std::chrono::steady_clock::now();
        std::ifstream stat("/proc/stat");
        std::string cpu;
        double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
        if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal && cpu == "cpu")
            s.machine = (user + nice + system + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
        rusage self{}, children{};
        getrusage(RUSAGE_SELF, &self);
        getrusage(RUSAGE_CHILDREN, &children);
        s.own = seconds(self.ru_utime) + seconds(self.ru_stime) + seconds(children.ru_utime) +
                seconds(children.ru_stime);
        if (helper_ > 0) s.own += process_seconds(helper_);
        return s;
    }
    pid_t helper_ = 0;
    Sample start_;
};

// Every rank's rows of every step's global batch, generated before the
// clock starts: step s of rank r is inputs[r * steps + s] (and targets).
struct Batches {
    int steps = 0;
    std::vector<std::vector<std::int32_t>> inputs, targets;
    [[nodiscard]] std::size_t at(int rank, int step) const { return static_cast<std::size_t>(rank * steps + step); }
};

inline Batches pregenerated_batches(const BenchConfig& config, int dp, int steps, std::uint64_t data_seed) {
    const std::int64_t B = config.batch, T = config.model.seq;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 18, data_seed, static_cast<int>(config.model.vocab));
    Batches batches;
    batches.steps = steps;
    batches.inputs.assign(static_cast<std::size_t>(dp * steps), std::vector<std::int32_t>(static_cast<std::size_t>(B * T)));
    batches.targets = batches.inputs;
    for (int r = 0; r < dp; ++r)
        for (int s = 0; s < steps; ++s)
            corpus.rows(data_seed, s, r * B, B, T, batches.inputs[batches.at(r, s)], batches.targets[batches.at(r, s)]);
    return batches;
}

}  // namespace bench
