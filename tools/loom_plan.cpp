// loom-plan: the best ways to train a model on a cluster, by the cost model
// (plan/cost_model.hpp) and the search (plan/search.hpp).
//
//   loom-plan --model model.json --cluster cluster.json [--top 5] [--json]
//   loom-plan --gpt 12,768,12,1024,50257 --batch 32 --cluster cluster.json
//   loom-plan ... --evaluate "--dp 2 --pp 4 --schedule 1f1b --micro-batches 8"   (price one plan)
//   loom-plan ... --trace plan.json                                               (the best plan's simulated step)
#include <loom/exec/trace.hpp>
#include <loom/io/atomic_file.hpp>
#include <loom/io/json.hpp>
#include <loom/plan/cluster_json.hpp>
#include <loom/plan/cost_model.hpp>
#include <loom/plan/gpt_description.hpp>
#include <loom/plan/model_json.hpp>
#include <loom/plan/search.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage_text =
    "usage: loom-plan (--model FILE | --gpt LAYERS,WIDTH,HEADS,SEQ,VOCAB --batch N) --cluster FILE\n"
    "                 [--top K] [--json] [--evaluate \"TRAIN_GPT FLAGS\"] [--trace FILE]\n"
    "                 [--schedules 1f1b,gpipe,interleaved,zb,zbv] [--zero 0,1,2,3] [--no-2d] [--no-sp]\n"
    "                 [--max-micro-batches N]\n";

[[noreturn]] void usage_error(const std::string& message) {
    std::fprintf(stderr, "loom-plan: %s\n%s", message.c_str(), usage_text);
    std::exit(2);
}

struct Options {
    std::string model_file, cluster_file, gpt, evaluate, trace;
    std::int64_t batch = 0;
    bool json = false;
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

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--help" || flag == "-h") {
            std::printf("%s", usage_text);
            std::exit(0);
        }
        if (flag == "--json") { o.json = true; continue; }
        if (flag == "--no-2d") { o.search.tensor_grid = false; continue; }
        if (flag == "--no-sp") { o.search.sequence = false; continue; }
        if (i + 1 >= argc) usage_error(std::string(flag) + " needs a value");
        const std::string_view value = argv[++i];
        if (flag == "--model") o.model_file = value;
        else if (flag == "--cluster") o.cluster_file = value;
        else if (flag == "--gpt") o.gpt = value;
        else if (flag == "--batch") o.batch = parse_int(flag, value, 1, std::int64_t{1} << 30);
        else if (flag == "--top") o.search.top = static_cast<int>(parse_int(flag, value, 1, 1000));
        else if (flag == "--evaluate") o.evaluate = value;
        else if (flag == "--trace") o.trace = value;
        else if (flag == "--max-micro-batches") o.search.max_micro_batches = static_cast<int>(parse_int(flag, value, 1, 4096));
        else if (flag == "--schedules") {
            o.search.schedules.clear();
            for (const auto& s : split(value, ',')) {
                try {
                    o.search.schedules.push_back(loom::parse_schedule(s));
                } catch (const loom::Error& e) {
                    usage_error("--schedules: " + e.message());
                }
            }
            if (o.search.schedules.empty()) usage_error("--schedules is empty; name at least one schedule");
        } else if (flag == "--zero") {
            o.search.zero_stages.clear();
            for (const auto& s : split(value, ','))
                o.search.zero_stages.push_back(static_cast<int>(parse_int("--zero", s, 0, 3)));
            if (o.search.zero_stages.empty()) usage_error("--zero is empty; give stages among 0,1,2,3");
        } else {
            usage_error("unknown flag " + std::string(flag));
        }
    }
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

// The candidate a train_gpt command line names ("--dp 2 --pp 4 ...").
loom::plan::Candidate candidate_of(std::string_view text, const loom::plan::ModelDescription& model) {
    loom::plan::Candidate c;
    const auto words = split(text, ' ');
    bool chunks_given = false;
    for (std::size_t i = 0; i < words.size(); ++i) {
        const std::string& flag = words[i];
        if (i + 1 >= words.size()) usage_error("--evaluate: " + flag + " needs a value");
        const std::string& value = words[++i];
        if (flag == "--dp") c.dp = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
        else if (flag == "--pp") c.pp = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
        else if (flag == "--tp") c.tp = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
        else if (flag == "--sp") c.sp = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
        else if (flag == "--micro-batches") c.micro_batches = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
        else if (flag == "--zero") c.zero = static_cast<int>(parse_int(flag, value, 0, 3));
        else if (flag == "--chunks") { c.chunks = static_cast<int>(parse_int(flag, value, 2, 4)); chunks_given = true; }
        else if (flag == "--tp-mode") {
            if (value != "1d" && value != "2d") usage_error("--evaluate: --tp-mode " + value + " is not 1d or 2d");
            c.tp_grid = value == "2d";
        } else if (flag == "--sp-mode") {
            if (value != "ring" && value != "ulysses") usage_error("--evaluate: --sp-mode " + value + " is not ring or ulysses");
            c.ulysses = value == "ulysses";
        } else if (flag == "--schedule") {
            try {
                c.schedule = loom::parse_schedule(value);
            } catch (const loom::Error& e) {
                usage_error("--evaluate: --schedule: " + e.message());
            }
        } else if (flag == "--partition") {
            for (const auto& n : split(value, ',')) c.partition.push_back(static_cast<int>(parse_int("--partition", n, 1, 1 << 20)));
        } else if (flag == "--batch") {
            if (parse_int(flag, value, 1, std::int64_t{1} << 30) != model.batch)
                usage_error("--evaluate: --batch " + value + " differs from the model's batch of " + std::to_string(model.batch));
        } else {
            usage_error("--evaluate: unknown flag " + flag +
                        "; use --dp --pp --tp --tp-mode --sp --sp-mode --schedule --chunks --micro-batches --zero --partition --batch");
        }
    }
    if (!chunks_given)
        c.chunks = c.schedule == loom::ScheduleKind::interleaved || c.schedule == loom::ScheduleKind::zero_bubble_v ? 2 : 1;
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
        << loom::plan::schedule_flag(c.schedule) << "\", \"chunks\": " << c.chunks
        << ", \"micro_batches\": " << c.micro_batches << ", \"zero\": " << c.zero << ", \"partition\": [";
    for (std::size_t i = 0; i < e.partition.size(); ++i) out << (i ? ", " : "") << e.partition[i];
    loom::plan::Candidate with = c;
    with.partition = e.partition;
    out << "], \"strategy\": " << quote(c.strategy()) << ", \"flags\": " << quote(with.flags(batch) + extra_flags) << "}";
    return out.str();
}

void print_plan(const loom::plan::Candidate& c, const loom::plan::Estimate& e, std::int64_t batch,
                const std::string& extra_flags, int rank) {
    loom::plan::Candidate with = c;
    with.partition = e.partition;
    std::ostringstream line;
    line << with;
    std::printf("%3d  %9.4f  %9.4f  %10s  %s\n", rank, e.step_seconds, e.compute_seconds, gigabytes(e.peak_memory).c_str(),
                line.str().c_str());
    std::printf("     %s\n     train_gpt %s%s\n", c.strategy().c_str(), with.flags(batch).c_str(), extra_flags.c_str());
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

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const loom::plan::Cluster cluster = loom::plan::load_cluster(o.cluster_file);
    std::string extra_flags;
    loom::plan::ModelDescription model;
    if (!o.gpt.empty()) {
        const auto config = gpt_config(o.gpt);
        model = loom::plan::describe_gpt(config, o.batch);
        extra_flags = " --layers " + std::to_string(config.layers) + " --width " + std::to_string(config.width) +
                      " --heads " + std::to_string(config.heads) + " --seq " + std::to_string(config.seq) + " --vocab " +
                      std::to_string(config.vocab);
    } else {
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
        std::printf("{\"model\": %s, \"devices\": %d, \"candidates\": %lld, \"over_memory\": %lld, \"simulated\": %lld, "
                    "\"search_seconds\": %s, \"plans\": [",
                    loom::io::json::quote(model.name).c_str(), cluster.size(), static_cast<long long>(report.candidates),
                    static_cast<long long>(report.over_memory), static_cast<long long>(report.simulated),
                    loom::io::json::number(report.seconds).c_str());
        for (std::size_t i = 0; i < report.plans.size(); ++i)
            std::printf("%s%s", i ? ", " : "",
                        plan_json(report.plans[i].candidate, report.plans[i].estimate, model.batch, extra_flags,
                                  static_cast<int>(i) + 1).c_str());
        std::printf("]}\n");
        return 0;
    }
    std::printf("%s", about.str().c_str());
    std::printf("searched %lld candidates (%lld over memory), simulated %lld, in %.2f s\n\n",
                static_cast<long long>(report.candidates), static_cast<long long>(report.over_memory),
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
