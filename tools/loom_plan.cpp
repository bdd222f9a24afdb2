// loom-plan: the best ways to train a model on a cluster, by the cost model
// (plan/cost_model.hpp) and the search (plan/search.hpp).
//
//   loom-plan --model model.json --cluster cluster.json [--top 5] [--json]
//   loom-plan --gpt 12,768,12,1024,50257 --batch 32 --cluster cluster.json
//   loom-plan ... --evaluate "--dp 2 --pp 4 --schedule 1f1b --micro-batches 8"   (price one plan)
//   loom-plan ... --trace plan.json                                               (the best plan's simulated step)
//
// Each plan prints its strategy as StrategySpec's text and the train_gpt
// line that runs it (`--strategy '...'`, pasted as is); --json also gives the
// piecewise flags ("flags"), words a script can split. `--help` lists the flags.
// A plan that fits only by recomputing activations carries its
// Recompute<Full>, Recompute<Budget ...> or Recompute<Selective> in that line
// (--recompute never searches without it, --recompute full or selective
// recomputes so on every candidate).
#include <algorithm>

#include <loom/exec/trace.hpp>
#include <loom/io/atomic_file.hpp>
#include <loom/io/json.hpp>
#include <loom/plan/cluster_json.hpp>
#include <loom/plan/cost_model.hpp>
#include <loom/plan/gpt_description.hpp>
#include <loom/plan/measure.hpp>
#include <loom/plan/model_json.hpp>
#include <loom/plan/profile.hpp>
#include <loom/plan/search.hpp>
#include <loom/parallel/strategy_text.hpp>

#include <CLI/CLI.hpp>

#include "train_gpt_spelling.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

[[noreturn]] void usage_error(const std::string& message) {
    std::fprintf(stderr, "loom-plan: %s (loom-plan --help lists every flag)\n", message.c_str());
    std::exit(2);
}

struct Options {
    std::string model_file, cluster_file, gpt, evaluate, trace;
    std::int64_t batch = 0;
    bool json = false;
    bool profile = false;
    loom::plan::SearchOptions search;
};

std::int64_t parse_int(std::string_view flag, std::string_view text, std::int64_t lo, std::int64_t hi) {
    std::int64_t value = 0;
    const std::string s(text);
    char* end = nullptr;
    value = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || value < lo || value > hi)
        usage_error(std::string(flag) + " " + s + " is not valid; use a whole number in " + std::to_string(lo) + ".." +
                    std::to_string(hi));
    return value;
}

std::vector<std::string> split(std::string_view text, char by) {
    std::vector<std::string> out;
    std::string item;
    std::istringstream in{std::string(text)};
    while (std::getline(in, item, by))
        if (!item.empty()) out.push_back(item);
    return out;
}

// Parses `app`'s flags from the command line (or, for --evaluate, from one
// string), with --help printing the groups and every other mistake one line.
template <class Parse>
void parse_or_exit(CLI::App& app, Parse parse, const std::string& context) {
    try {
        parse();
    } catch (const CLI::CallForHelp&) {
        std::printf("%s", app.help().c_str());
        std::exit(0);
    } catch (const CLI::ParseError& e) {
        usage_error(context + e.what());
    }
}

Options parse(int argc, char** argv) {
    Options o;
    CLI::App app{"loom-plan: the best ways to train a model on a cluster, by loom's cost model and search.", "loom-plan"};
    app.footer("docs/planner.md describes the cost model, the files and the output.");
    app.get_formatter()->column_width(24);
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given again wins
    const auto whole = [&](const char* group, const char* name, auto set, const std::string& meaning, const std::string& shown) {
        return app.add_option_function<std::string>(name, set, shown.empty() ? meaning : meaning + " (default " + shown + ")")
            ->type_name("N")->group(group);
    };
    app.add_option("--model", o.model_file, "the model: a JSON description")->type_name("FILE")->group("Model");
    app.add_option("--gpt", o.gpt, "or loom's GPT: layers, width, heads, sequence, vocabulary")
        ->type_name("L,W,H,S,V")->group("Model");
    whole("Model", "--batch", [&o](const std::string& v) { o.batch = parse_int("--batch", v, 1, std::int64_t{1} << 30); },
          "sequences per step (with --gpt)", "");
    app.add_flag("--profile", o.profile,
                 "with --gpt: time the GPT's layers on this machine (one micro-batch of batch / devices samples) and "
                 "price their FLOPs at the speed they ran, not the GEMM's")
        ->group("Model");
    app.add_option("--cluster", o.cluster_file, "the devices and their links: a JSON description (required)")
        ->type_name("FILE")->group("Cluster");
    whole("Search", "--top", [&o](const std::string& v) { o.search.top = static_cast<int>(parse_int("--top", v, 1, 1000)); },
          "plans to print", "5");
    app.add_option_function<std::string>("--schedules", [&o](const std::string& v) {
        o.search.schedules.clear();
        for (const auto& s : split(v, ',')) {
            try {
                o.search.schedules.push_back(parse_schedule_flag(s));
            } catch (const loom::Error& e) {
                usage_error("--schedules: " + e.message());
            }
        }
        if (o.search.schedules.empty()) usage_error("--schedules is empty; name at least one schedule");
    }, "pipeline schedules to try: gpipe, 1f1b, interleaved, zb, zbv (default all)")->type_name("S,S,...")->group("Search");
    app.add_option_function<std::string>("--zero", [&o](const std::string& v) {
        o.search.zero_stages.clear();
        for (const auto& s : split(v, ',')) o.search.zero_stages.push_back(static_cast<int>(parse_int("--zero", s, 0, 3)));
        if (o.search.zero_stages.empty()) usage_error("--zero is empty; give stages among 0,1,2,3");
    }, "ZeRO stages to try (default 0,1,2,3)")->type_name("Z,Z,...")->group("Search");
    app.add_option_function<std::string>("--recompute", [&o](const std::string& v) {
        if (v == "never") o.search.recompute = loom::plan::RecomputeSearch::never;
        else if (v == "when-needed") o.search.recompute = loom::plan::RecomputeSearch::when_needed;
        else if (v == "full") o.search.recompute = loom::plan::RecomputeSearch::always_full;
        else if (v == "selective") o.search.recompute = loom::plan::RecomputeSearch::always_selective;
        else usage_error("--recompute " + v + " is not valid; use never, when-needed, full or selective");
    }, "recompute activations: when-needed (a plan that does not fit gets the cheapest recomputation that fits, "
       "or Selective where it fits and is faster), never, full or selective (every plan) (default when-needed)")
        ->type_name("WHEN")->group("Search");
    app.add_flag_callback("--no-2d", [&o] { o.search.tensor_grid = false; }, "no Optimus 2D tensor grids")->group("Search");
    app.add_flag_callback("--no-sp", [&o] { o.search.sequence = false; }, "no sequence parallelism")->group("Search");
    whole("Search", "--max-micro-batches", [&o](const std::string& v) {
        o.search.max_micro_batches = static_cast<int>(parse_int("--max-micro-batches", v, 1, 4096));
    }, "the most micro-batches per step to try", "64");
    app.add_option("--evaluate", o.evaluate,
                   "price one train_gpt command line instead of searching, e.g. \"--dp 2 --pp 4 --schedule 1f1b "
                   "--micro-batches 8\" or \"--dp 2 --pp 4 --strategy 'Strategy<DataParallel<>, Pipeline<1F1B>>'\"")
        ->type_name("FLAGS")->group("Output");
    app.add_flag("--json", o.json, "print JSON instead of a table")->group("Output");
    app.add_option("--trace", o.trace, "the best plan's simulated step, for ui.perfetto.dev")->type_name("FILE")->group("Output");
    parse_or_exit(app, [&] { app.parse(argc, argv); }, "");
    if (o.cluster_file.empty()) usage_error("--cluster FILE is required");
    if (o.model_file.empty() == o.gpt.empty()) usage_error("give exactly one of --model FILE and --gpt L,W,H,S,V");
    if (!o.gpt.empty() && o.batch == 0) usage_error("--gpt needs --batch N (sequences per step)");
    if (!o.model_file.empty() && o.batch != 0) usage_error("--batch is read from the --model file; drop it");
    return o;
}

// "--gpt 12,768,12,1024,50257" -> the GPT's config.
loom::gpt::Config gpt_config(std::string_view text) {
    const auto parts = split(text, ',');
    if (parts.size() != 5) usage_error("--gpt " + std::string(text) + " needs 5 numbers: layers,width,heads,seq,vocab");
    loom::gpt::Config c;
    c.layers = parse_int("--gpt layers", parts[0], 1, 1024);
    c.width = parse_int("--gpt width", parts[1], 1, 65536);
    c.heads = parse_int("--gpt heads", parts[2], 1, 65536);
    c.seq = parse_int("--gpt seq", parts[3], 1, 1 << 20);
    c.vocab = parse_int("--gpt vocab", parts[4], 2, 1 << 24);
    try {
        c.validate();
    } catch (const loom::Error& e) {
        usage_error(e.message());
    }
    return c;
}

// The candidate a train_gpt command line names ("--dp 2 --pp 4 ...", or
// with --strategy '...' for the policies): train_gpt's flags that shape a
// step, read by CLI11 from the one string (quotes as in a shell).
loom::plan::Candidate candidate_of(const std::string& text, const loom::plan::ModelDescription& model) {
    loom::plan::Candidate c;
    std::string schedule, tp_mode = "1d", sp_mode = "ring", strategy, partition, recompute;
    int chunks = 0;
    std::int64_t batch = model.batch;
    CLI::App app{"loom-plan --evaluate: the train_gpt flags that shape a step", "--evaluate"};
    app.add_option("--dp", c.dp)->check(CLI::Range(1, 1 << 20));
    app.add_option("--pp", c.pp)->check(CLI::Range(1, 1 << 20));
    app.add_option("--tp", c.tp)->check(CLI::Range(1, 1 << 20));
    app.add_option("--sp", c.sp)->check(CLI::Range(1, 1 << 20));
    app.add_option("--micro-batches", c.micro_batches)->check(CLI::Range(1, 1 << 20));
    app.add_option("--batch", batch);
    app.add_option("--partition", partition);
    auto* whole = app.add_option("--strategy", strategy);
    for (auto* piece : {app.add_option("--zero", c.zero)->check(CLI::Range(0, 3)),
                        app.add_option("--chunks", chunks)->check(CLI::Range(2, 4)),
                        app.add_option("--schedule", schedule),
                        app.add_option("--tp-mode", tp_mode)->check(CLI::IsMember({"1d", "2d"})),
                        app.add_option("--sp-mode", sp_mode)->check(CLI::IsMember({"ring", "ulysses"})),
                        app.add_option("--recompute", recompute)})
        piece->excludes(whole);
    parse_or_exit(app, [&] { app.parse(text, false); }, "--evaluate: ");
    if (batch != model.batch)
        usage_error("--evaluate: --batch " + std::to_string(batch) + " differs from the model's batch of " +
                    std::to_string(model.batch));
    for (const auto& n : split(partition, ',')) c.partition.push_back(static_cast<int>(parse_int("--partition", n, 1, 1 << 20)));
    if (!strategy.empty()) {
        // The one grammar; the planner prices what a Candidate can say.
        const loom::StrategySpec spec = loom::parse_strategy(strategy);
        c.zero = spec.zero_stage;
        c.schedule = spec.schedule;
        c.chunks = spec.chunks;
        c.tp_grid = spec.tensor_grid;
        c.ulysses = spec.sequence_attention == loom::nn::SequenceAttention::ulysses;
        c.recompute = spec.recompute;
        if (c.strategy() != spec)
            usage_error("--evaluate: the planner prices " + c.strategy().text() + " for these degrees, not " + spec.text() +
                        " (no compression, hybrid or contiguous sequence layout, default bucket; --pp/--tp/--sp give the "
                        "pipeline, tensor and sequence degrees)");
        return c;
    }
    c.tp_grid = tp_mode == "2d";
    c.ulysses = sp_mode == "ulysses";
    try {
        if (!schedule.empty()) c.schedule = parse_schedule_flag(schedule);
    } catch (const loom::Error& e) {
        usage_error("--evaluate: --schedule: " + e.message());
    }
    try {
        if (!recompute.empty()) c.recompute = parse_recompute_flag(recompute);
    } catch (const loom::Error& e) {
        usage_error("--evaluate: --recompute: " + e.message());
    }
    c.chunks = chunks > 0 ? chunks
                          : c.schedule == loom::ScheduleKind::interleaved || c.schedule == loom::ScheduleKind::zero_bubble_v ? 2 : 1;
    return c;
}

std::string gigabytes(double bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f GB", bytes / 1e9);
    return text;
}

std::string plan_json(const loom::plan::Candidate& c, const loom::plan::Estimate& e, std::int64_t batch,
                      const std::string& extra_flags, int rank) {
    using loom::io::json::number;
    using loom::io::json::quote;
    std::ostringstream out;
    out << "{\"rank\": " << rank << ", \"step_seconds\": " << number(e.step_seconds)
        << ", \"compute_seconds\": " << number(e.compute_seconds) << ", \"memory_bytes\": " << number(e.peak_memory)
        << ", \"fits\": " << (e.fits ? "true" : "false") << ", \"dp\": " << c.dp << ", \"pp\": " << c.pp
        << ", \"tp\": " << c.tp << ", \"tp_mode\": \"" << (c.tp_grid ? "2d" : "1d") << "\", \"sp\": " << c.sp
        << ", \"sp_mode\": \"" << (c.ulysses ? "ulysses" : "ring") << "\", \"schedule\": \""
        << schedule_flag(c.schedule) << "\", \"chunks\": " << c.chunks
        << ", \"micro_batches\": " << c.micro_batches << ", \"zero\": " << c.zero
        << ", \"recompute\": \"" << recompute_flag(c.recompute) << "\", \"recomputed_layers\": "
        << std::count(e.recomputed.begin(), e.recomputed.end(), true) << ", \"partition\": [";
    for (std::size_t i = 0; i < e.partition.size(); ++i) out << (i ? ", " : "") << e.partition[i];
    loom::plan::Candidate with = c;
    with.partition = e.partition;
    with.recomputed = e.recomputed;
    out << "], \"strategy\": " << quote(c.strategy().text()) << ", \"flags\": " << quote(train_gpt_flags(with, batch) + extra_flags)
        << ", \"strategy_flags\": " << quote(train_gpt_strategy_flags(with, batch) + extra_flags) << "}";
    return out.str();
}

void print_plan(const loom::plan::Candidate& c, const loom::plan::Estimate& e, std::int64_t batch,
                const std::string& extra_flags, int rank) {
    loom::plan::Candidate with = c;
    with.partition = e.partition;
    with.recomputed = e.recomputed;
    std::ostringstream line;
    line << with;
    std::printf("%3d  %9.4f  %9.4f  %10s  %s\n", rank, e.step_seconds, e.compute_seconds, gigabytes(e.peak_memory).c_str(),
                line.str().c_str());
    std::printf("     %s\n     train_gpt %s%s\n", c.strategy().text().c_str(),
                train_gpt_strategy_flags(with, batch).c_str(), extra_flags.c_str());
}

void write_trace(const loom::plan::Estimate& e, const std::string& path) {
    std::vector<std::vector<loom::exec::TraceEvent>> events(e.simulation.events.size());
    for (std::size_t r = 0; r < events.size(); ++r)
        for (const auto& ev : e.simulation.events[r])
            events[r].push_back({std::string(ev.label) + (ev.micro_batch >= 0 ? " mb" + std::to_string(ev.micro_batch) : ""),
                                 ev.lane == 0 ? "compute" : "communication", ev.lane, ev.start * 1e6, ev.duration * 1e6, 0,
                                 ev.micro_batch});
    loom::io::write_file_atomically(path, loom::exec::chrome_trace_json(events));
}

// --profile: the GPT's units timed on `rows` samples, one thread, and its
// FLOPs scaled to the speed they ran at against this machine's GEMM.
void profile_gpt(loom::plan::ModelDescription& model, const loom::gpt::Config& config, std::int64_t rows) {
    const loom::plan::detail_measure::OneBlasThread one_thread;
    const double gemm = loom::plan::measure_gemm_flops();
    loom::gpt::Model probe = loom::gpt::make_model(config);
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * config.seq)), targets(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(config.vocab));
        targets[i] = static_cast<std::int32_t>((i * 104729 + 1) % static_cast<std::size_t>(config.vocab));
    }
    const std::vector<double> seconds =
        loom::plan::profile_units(probe, 1, loom::Tensor::of(inputs.data(), {rows, config.seq}),
                                  loom::Tensor::of(targets.data(), {rows, config.seq}));
    loom::plan::calibrate_gpt(model, seconds, rows, gemm);
}

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const loom::plan::Cluster cluster = loom::plan::load_cluster(o.cluster_file);
    std::string extra_flags;
    loom::plan::ModelDescription model;
    if (!o.gpt.empty()) {
        const auto config = gpt_config(o.gpt);
        model = loom::plan::describe_gpt(config, o.batch);
        if (o.profile) profile_gpt(model, config, std::max<std::int64_t>(1, o.batch / cluster.size()));
        extra_flags = " --layers " + std::to_string(config.layers) + " --width " + std::to_string(config.width) +
                      " --heads " + std::to_string(config.heads) + " --seq " + std::to_string(config.seq) + " --vocab " +
                      std::to_string(config.vocab);
    } else {
        if (o.profile) usage_error("--profile times loom's GPT; give --gpt, or a --model file with the FLOPs you measured");
        model = loom::plan::load_model(o.model_file);
    }
    std::ostringstream about;
    about << "model: " << model << "\ncluster: " << cluster << "\n";

    if (!o.evaluate.empty()) {
        const loom::plan::Candidate c = candidate_of(o.evaluate, model);
        const loom::plan::Estimate e = loom::plan::estimate(model, cluster, c, !o.trace.empty());
        if (!o.trace.empty()) write_trace(e, o.trace);
        if (o.json) {
            std::printf("%s\n", plan_json(c, e, model.batch, extra_flags, 1).c_str());
            return 0;
        }
        std::printf("%s\n  #  step (s)  compute (s)  memory/dev  plan\n", about.str().c_str());
        print_plan(c, e, model.batch, extra_flags, 1);
        if (!e.fits) std::printf("note: this plan does not fit: device %s needs %s\n", cluster.device(e.peak_device).name.c_str(),
                                 gigabytes(e.peak_memory).c_str());
        return 0;
    }

    const loom::plan::SearchReport report = loom::plan::search(model, cluster, o.search);
    if (!o.trace.empty()) {
        const auto& best = report.plans.front();
        write_trace(loom::plan::estimate(model, cluster, best.candidate, true), o.trace);
    }
    if (o.json) {
        std::printf("{\"model\": %s, \"devices\": %d, \"candidates\": %lld, \"over_memory\": %lld, "
                    "\"recomputing\": %lld, \"simulated\": %lld, \"search_seconds\": %s, \"plans\": [",
                    loom::io::json::quote(model.name).c_str(), cluster.size(), static_cast<long long>(report.candidates),
                    static_cast<long long>(report.over_memory), static_cast<long long>(report.recomputing),
                    static_cast<long long>(report.simulated),
                    loom::io::json::number(report.seconds).c_str());
        for (std::size_t i = 0; i < report.plans.size(); ++i)
            std::printf("%s%s", i ? ", " : "",
                        plan_json(report.plans[i].candidate, report.plans[i].estimate, model.batch, extra_flags,
                                  static_cast<int>(i) + 1).c_str());
        std::printf("]}\n");
        return 0;
    }
    std::printf("%s", about.str().c_str());
    std::printf("searched %lld candidates (%lld over memory, %lld recomputing), simulated %lld, in %.2f s\n\n",
                static_cast<long long>(report.candidates), static_cast<long long>(report.over_memory),
                static_cast<long long>(report.recomputing),
                static_cast<long long>(report.simulated), report.seconds);
    std::printf("  #  step (s)  compute (s)  memory/dev  plan\n");
    for (std::size_t i = 0; i < report.plans.size(); ++i)
        print_plan(report.plans[i].candidate, report.plans[i].estimate, model.batch, extra_flags, static_cast<int>(i) + 1);
    if (!o.trace.empty()) std::printf("\nthe best plan's simulated step: %s (open in ui.perfetto.dev)\n", o.trace.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "loom-plan: %s\n", e.what());
        return 1;
    }
}
