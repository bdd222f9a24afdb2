// Recompute<...> on GPT config A (4 layers, width 256, 4 heads, sequence 128,
// vocabulary 256), one rank on one core: activation bytes per rank
// (MemoryReport, what the contexts hold at their peak) and step time without
// recomputation, with Full, Selective and Budgets between, at several
// batches; the time Full and Selective add beside one extra forward (the
// forwards' own time, from the step's trace); the predicted activations
// beside the measured: the planner's memory model (plan/memory_model.hpp,
// what loom-plan prices) for none, Full and Selective, the executor's solver
// for a Budget.
//
//   bench_recompute [--batches 8,32,96] [--steps 7]
#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/parallel/recompute.hpp>
#include <loom/parallel/recomputation.hpp>
#include <loom/plan/gpt_description.hpp>
#include <loom/plan/memory_model.hpp>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_model.hpp"
#include "timing.hpp"

namespace {

using loom::RecomputeMode;
using loom::RecomputeSpec;

const loom::gpt::Config config_a{.layers = 4, .width = 256, .heads = 4, .seq = 128, .vocab = 256};

struct Row {
    double step_seconds = 0, forward_seconds = 0, recompute_seconds = 0;
    std::int64_t activations = 0, predicted = 0;
    int recomputed = 0;
};

// Steps of one strategy on one rank; the trace's forward and recompute spans of the last step.
Row measure(std::int64_t batch, RecomputeSpec recompute, int steps) {
    Row row;
    loom::comm::ThreadWorld(1).run([&](loom::comm::ThreadComm& comm) {
        auto model = loom::gpt::make_model(config_a);
        loom::exec::ExecutionPlan plan{};
        plan.recompute = recompute;
        loom::exec::Executor<loom::comm::ThreadComm> exec(model, comm, plan, {.micro_batches = 1, .trace = true});
        exec.initialize(1);
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch * config_a.seq)), targets(inputs.size());
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            inputs[i] = static_cast<std::int32_t>((i * 7 + 3) % 256);
            targets[i] = static_cast<std::int32_t>((i * 7 + 10) % 256);
        }
        const auto step = [&] {
            (void)exec.step(loom::Tensor::of(inputs.data(), {batch, config_a.seq}),
                            loom::Tensor::of(targets.data(), {batch, config_a.seq}), 1e-4f);
        };
        step();  // Budget measures and chooses here; first touches of memory
        std::vector<double> times, forwards, recomputes;
        for (int s = 0; s < steps; ++s) {
            exec.trace().clear();
            const auto t0 = std::chrono::steady_clock::now();
            step();
            times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            double f = 0, r = 0;
            for (const auto& e : exec.trace().events()) {
                if (e.category == "forward") f += e.duration_us * 1e-6;
                if (e.category == "recompute") r += e.duration_us * 1e-6;
            }
            forwards.push_back(f);
            recomputes.push_back(r);
        }
        row.step_seconds = bench::median(times);
        row.forward_seconds = bench::median(forwards);
        row.recompute_seconds = bench::median(recomputes);
        row.activations = exec.memory_report().activations;
        const auto* recomputation = exec.template policy<loom::parallel::Recomputation>();
        row.predicted = recomputation != nullptr ? recomputation->choice().peak_bytes : 0;
        row.recomputed = static_cast<int>(exec.program().count(loom::schedule::Op::recompute));
    });
    return row;
}

// The time `recompute` adds beside one forward, A/B interleaved: a step without
// recomputation and a step with it, in turn, so that the machine's drift
// (other tenants, frequency) falls on both alike; medians of the per-pair
// differences and of the plain step's forwards (its trace).
struct Overhead {
    double added = 0, forward = 0, plain = 0;
};
Overhead interleaved_overhead(std::int64_t batch, int pairs, RecomputeSpec recompute) {
    Overhead out;
    loom::comm::ThreadWorld(1).run([&](loom::comm::ThreadComm& comm) {
        auto plain_model = loom::gpt::make_model(config_a), full_model = loom::gpt::make_model(config_a);
        loom::exec::ExecutionPlan plain_plan{}, full_plan{};
        full_plan.recompute = recompute;
        loom::exec::Executor<loom::comm::ThreadComm> plain(plain_model, comm, plain_plan, {.trace = true});
        loom::exec::Executor<loom::comm::ThreadComm> full(full_model, comm, full_plan, {});
        plain.initialize(1);
        full.initialize(1);
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch * config_a.seq)), targets(inputs.size());
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            inputs[i] = static_cast<std::int32_t>((i * 7 + 3) % 256);
            targets[i] = static_cast<std::int32_t>((i * 7 + 10) % 256);
        }
        const auto timed_step = [&](auto& exec) {
            const auto t0 = std::chrono::steady_clock::now();
            (void)exec.step(loom::Tensor::of(inputs.data(), {batch, config_a.seq}),
                            loom::Tensor::of(targets.data(), {batch, config_a.seq}), 1e-4f);
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        };
        (void)timed_step(plain);
        (void)timed_step(full);
        std::vector<double> added, forwards, plains;
        for (int p = 0; p < pairs; ++p) {
            plain.trace().clear();
            const double a = timed_step(plain), b = timed_step(full);
            added.push_back(b - a);
            plains.push_back(a);
            double f = 0;
            for (const auto& e : plain.trace().events())
                if (e.category == "forward") f += e.duration_us * 1e-6;
            forwards.push_back(f);
        }
        out = {bench::median(added), bench::median(forwards), bench::median(plains)};
    });
    return out;
}

// The planner's activations for config A at `batch` on one device: its
// device memory less the model states.
std::int64_t planner_activations(std::int64_t batch, RecomputeSpec recompute) {
    const loom::plan::ModelDescription model = loom::plan::describe_gpt(config_a, batch);
    const loom::plan::Cluster cluster = loom::plan::Cluster::uniform(1, 1, 1e12, 1e15, {}, {});
    loom::plan::Candidate c;
    c.recompute = recompute;
    c.recomputed = loom::plan::recompute_choice(model, cluster, c, {}, recompute).layers;
    const double total = loom::plan::device_memory(model, cluster, c, {}, c.recomputed).peak;
    const double states = loom::plan::detail::place(model, c, {}).static_bytes.front();
    return static_cast<std::int64_t>(total - states);
}

std::vector<std::int64_t> parse_list(const char* text) {
    std::vector<std::int64_t> out;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) out.push_back(std::atoll(item.c_str()));
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::int64_t> batches{8, 32, 96};
    int steps = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--batches") batches = parse_list(argv[i + 1]);
        else if (flag == "--steps") steps = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "bench_recompute: unknown flag %s (--batches N,N,... --steps N)\n", flag.c_str());
            return 2;
        }
    }
    loom::kernels::host::set_blas_threads(1);
    std::printf("CPU: %s; GEMM: loom host kernels at %s, 1 thread; one rank; median of %d steps\n",
                bench::cpu_model().c_str(), bench::cpu_level().c_str(), steps);
    std::printf("GPT config A (L4 C256 H4 T128 V256)\n\n");
    std::printf("| batch | recompute | units recomputed / step | activations | vs none | step | + vs none | "
                "one forward | added / forward | predicted |\n");
    std::printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const std::int64_t batch : batches) {
        Row none = measure(batch, {}, steps);
        Row full = measure(batch, loom::Recompute<loom::Full>::spec, steps);
        Row selective = measure(batch, loom::Recompute<loom::Selective>::spec, steps);
        none.predicted = planner_activations(batch, {});
        full.predicted = planner_activations(batch, loom::Recompute<loom::Full>::spec);
        selective.predicted = planner_activations(batch, loom::Recompute<loom::Selective>::spec);
        std::vector<std::pair<std::string, Row>> rows{{"none", none}, {"Full", full}, {"Selective", selective}};
        // The least memory the solver knows (the budget cannot be met): its predicted peak is Full's formula.
        rows.emplace_back("Budget 1 B", measure(batch, RecomputeSpec{RecomputeMode::budget, 1}, steps));
        for (const double at : {0.25, 0.5, 0.75}) {
            const auto budget = static_cast<std::int64_t>(static_cast<double>(full.activations) +
                                                          at * static_cast<double>(none.activations - full.activations));
            RecomputeSpec spec{RecomputeMode::budget, budget};
            rows.emplace_back("Budget " + loom::readable_bytes(budget), measure(batch, spec, steps));
        }
        for (const auto& [name, r] : rows) {
            const double added = r.step_seconds - none.step_seconds;
            std::printf("| %lld | %s | %d | %s | %.2f | %.1f ms | %+.1f ms | %.1f ms | %s | %s |\n",
                        static_cast<long long>(batch), name.c_str(), r.recomputed,
                        loom::readable_bytes(r.activations).c_str(),
                        static_cast<double>(r.activations) / static_cast<double>(none.activations),
                        r.step_seconds * 1e3, added * 1e3, none.forward_seconds * 1e3,
                        name == "none" ? "" : (std::to_string(added / none.forward_seconds).substr(0, 4)).c_str(),
                        (loom::readable_bytes(r.predicted) + (name.starts_with("Budget") ? " (solver)" : " (planner)"))
                            .c_str());
        }
    }
    std::printf("\nThe added time beside one forward, A/B interleaved (a plain step, then a recomputing step, %d pairs):\n\n",
                3 * steps);
    std::printf("| batch | recompute | plain step | forwards of the plain step | added | added / forward |\n");
    std::printf("| ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (const std::int64_t batch : batches)
        for (const RecomputeSpec spec : {loom::Recompute<loom::Full>::spec, loom::Recompute<loom::Selective>::spec}) {
            const Overhead o = interleaved_overhead(batch, 3 * steps, spec);
            std::printf("| %lld | %s | %.1f ms | %.1f ms | %+.1f ms | %.3f |\n", static_cast<long long>(batch),
                        spec.describe().c_str(), o.plain * 1e3, o.forward * 1e3, o.added * 1e3, o.added / o.forward);
        }
    return 0;
}
