// Sharded, reshardable checkpoints (exec/sharded_checkpoint.hpp): a
// checkpoint saved by every rank at once under one strategy loads under
// every other, nine layouts each way:
// - the loaded parameters and AdamW moments equal the saver's, bit for bit
//   (each rank checks the elements it owns; together they are the model);
// - the next step's loss equals the one after loading the saver's gathered
//   state, bit for bit.
// Also: a save in the background keeps the state of the step it started at,
// a later save replaces the older shards, and broken checkpoints are named
// in one line.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/sharded_checkpoint.hpp>
#include <loom/gpt/model.hpp>
#include <loom/io/safetensors.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Tensor;
using loom::comm::ThreadComm;
using loom_test::message_of;

namespace {

const loom::gpt::Config config{.layers = 4, .width = 32, .heads = 4, .seq = 16, .vocab = 64};
constexpr std::int64_t batch = 16;
constexpr std::uint64_t seed = 5;
constexpr float lr = 3e-3f;

const loom::data::ByteCorpus& corpus() {
    static const auto c = loom::data::ByteCorpus::synthetic(1 << 14, seed, 64);
    return c;
}

struct Layout {
    const char* name;
    int dp = 1, pp = 1, tp = 1, sp = 1;
    loom::StrategySpec spec{};
    [[nodiscard]] int ranks() const { return dp * pp * tp * sp; }
};

std::vector<Layout> layouts() {
    return {
        {"serial"},
        {"dp 2", 2},
        {"dp 2 ZeRO 1", 2, 1, 1, 1, {.zero_stage = 1}},
        {"dp 2 ZeRO 3", 2, 1, 1, 1, {.zero_stage = 3}},
        {"tp 2", 1, 1, 2, 1, {.tensor_parallel = true}},
        {"Optimus 2 x 2", 1, 1, 4, 1, {.tensor_parallel = true, .tensor_grid = true}},
        {"dp 2 x pp 2 (1F1B) ZeRO 2", 2, 2, 1, 1, {.zero_stage = 2, .pipelined = true}},
        {"dp 2 x pp 2 x tp 2 ZeRO 3", 2, 2, 2, 1, {.zero_stage = 3, .pipelined = true, .tensor_parallel = true}},
        {"sp 2 (ring) x dp 2 ZeRO 1", 2, 1, 1, 2, {.zero_stage = 1, .sequence_parallel = true}},
    };
}

struct State {
    std::vector<float> values, m, v;
};

// Runs `body(exec, comm)` on every rank of `layout`'s world, with an executor of a fresh model.
template <class Body>
void on_layout(const Layout& layout, Body&& body) {
    loom::comm::ThreadWorld(layout.ranks()).run([&](ThreadComm& comm) {
        loom::comm::Mesh<ThreadComm> mesh(comm, {{"dp", layout.dp}, {"pp", layout.pp}, {"tp", layout.tp}, {"sp", layout.sp}});
        ThreadComm& dp = layout.sp > 1 ? mesh.combined({"dp", "sp"}) : mesh.axis("dp");
        auto model = loom::gpt::make_model(config);
        loom::exec::Executor<ThreadComm> exec(model, dp, layout.pp > 1 ? &mesh.axis("pp") : nullptr,
                                              layout.tp > 1 ? &mesh.axis("tp") : nullptr,
                                              layout.sp > 1 ? &mesh.axis("sp") : nullptr, layout.spec,
                                              {.micro_batches = 2, .adamw = {lr, 0.9f, 0.95f, 1e-8f, 0.1f}});
        body(exec, comm, mesh.coordinate("dp"), layout.dp);
    });
}

float train_step(loom::exec::Executor<ThreadComm>& exec, int step, int dp_rank, int dp) {
    const std::int64_t rows = batch / dp;
    std::vector<std::int32_t> x(static_cast<std::size_t>(rows * config.seq)), y(x.size());
    corpus().rows(seed, step, dp_rank * rows, rows, config.seq, x, y);
    return exec.step(Tensor::of(x.data(), {rows, config.seq}), Tensor::of(y.data(), {rows, config.seq}), lr);
}

State gathered(loom::exec::Executor<ThreadComm>& exec) {
    const auto n = static_cast<std::size_t>(exec.parameter_count());
    State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
    exec.gather_state(s.values, s.m, s.v);
    return s;
}

// Two steps under `layout`, saved sharded to `dir`; the gathered state.
State train_and_save(const Layout& layout, const std::filesystem::path& dir) {
    State saved;
    on_layout(layout, [&](auto& exec, ThreadComm& world, int dp_rank, int dp) {
        exec.initialize(seed);
        for (int step = 0; step < 2; ++step) (void)train_step(exec, step, dp_rank, dp);
        loom::exec::save_sharded(exec, world, dir, {{"step", "2"}});
        State mine = gathered(exec);
        if (world.rank() == 0) saved = std::move(mine);
    });
    return saved;
}

struct Loaded {
    bool state_equal = true;  // every rank's owned values and moments equal the saver's, bit for bit
    std::int64_t owned = 0;   // elements owned over the world: the model's, once each
    float loss_after_sharded = 0, loss_after_gathered = 0;
    std::string step_metadata;
};

// Loads `dir` under `layout`. Each rank compares what it owns with the
// saver's gathered state (no gather here: every element has one owner).
Loaded load(const Layout& layout, const std::filesystem::path& dir, const State& reference) {
    Loaded out;
    std::mutex mutex;
    on_layout(layout, [&](auto& exec, ThreadComm& world, int dp_rank, int dp) {
        const auto index = loom::exec::load_sharded(exec, dir);
        const auto mine = exec.owned_state();
        bool equal = true;
        std::size_t at = 0;
        for (std::size_t i = 0; i < mine.runs.size(); i += 2)
            for (std::int64_t k = 0; k < mine.runs[i + 1]; ++k, ++at) {
                const auto whole = static_cast<std::size_t>(mine.runs[i] + k);
                equal = equal && mine.values[at] == reference.values[whole] && mine.m[at] == reference.m[whole] &&
                        mine.v[at] == reference.v[whole];
            }
        const float sharded = train_step(exec, 2, dp_rank, dp);
        exec.load_state(reference.values, reference.m, reference.v, index.optimizer_steps);
        const float dense = train_step(exec, 2, dp_rank, dp);
        const std::lock_guard lock(mutex);
        out.state_equal = out.state_equal && equal;
        out.owned += static_cast<std::int64_t>(at);
        if (world.rank() == 0) {
            out.loss_after_sharded = sharded;
            out.loss_after_gathered = dense;
            out.step_metadata = index.metadata.at("step");
        }
    });
    return out;
}

struct Directory {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("loom_sharded_test_" + std::to_string(::getpid()));
    Directory() { std::filesystem::remove_all(path); }
    ~Directory() { std::filesystem::remove_all(path); }
};

std::vector<std::string> files_in(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace

TEST_CASE("a sharded checkpoint saved under any of nine strategies loads under every other", "[parallel][checkpoint]") {
    const Directory root;
    const auto all = layouts();
    for (std::size_t a = 0; a < all.size(); ++a) {
        const auto dir = root.path / std::to_string(a);
        const State saved = train_and_save(all[a], dir);
        REQUIRE(!saved.values.empty());
        // One shard per rank, written by that rank, and the index.
        CHECK(files_in(dir).size() == static_cast<std::size_t>(all[a].ranks()) + 1);
        for (const Layout& b : all) {
            INFO("saved under " << all[a].name << ", loaded under " << b.name);
            const Loaded loaded = load(b, dir, saved);
            CHECK(loaded.state_equal);  // bit for bit: parameters and both moments
            CHECK(loaded.owned == static_cast<std::int64_t>(saved.values.size()));
            CHECK(loaded.loss_after_sharded == loaded.loss_after_gathered);
            CHECK(loaded.step_metadata == "2");
        }
    }
}

TEST_CASE("a rank of a tp or pp layout reads only its part of a sharded checkpoint", "[parallel][checkpoint]") {
    const Directory root;
    const State saved = train_and_save({"serial"}, root.path);
    std::uint64_t data = 0;
    for (const auto& name : files_in(root.path))
        if (name != "index.json") data += std::filesystem::file_size(root.path / name);
    for (const Layout& layout : {Layout{"tp 2", 1, 1, 2, 1, {.tensor_parallel = true}},
                                 Layout{"dp 2 x pp 2 ZeRO 3", 2, 2, 1, 1, {.zero_stage = 3, .pipelined = true}}}) {
        INFO(layout.name);
        std::mutex mutex;
        std::vector<std::uint64_t> read;
        bool equal = true;
        on_layout(layout, [&](auto& exec, ThreadComm&, int, int) {
            std::uint64_t bytes = 0;
            (void)loom::exec::load_sharded(exec, root.path, &bytes);
            const auto mine = exec.owned_state();
            bool same = true;
            std::size_t at = 0;
            for (std::size_t i = 0; i < mine.runs.size(); i += 2)
                for (std::int64_t k = 0; k < mine.runs[i + 1]; ++k, ++at)
                    same = same && mine.values[at] == saved.values[static_cast<std::size_t>(mine.runs[i] + k)];
            const std::lock_guard lock(mutex);
            read.push_back(bytes);
            equal = equal && same;
        });
        CHECK(equal);
        REQUIRE(read.size() == static_cast<std::size_t>(layout.ranks()));
        // tp 2: each rank its cut (the whole LayerNorms and row-split biases
        // on both); dp 2 x pp 2 ZeRO 3: a stage's quarter of the model's blocks.
        const double limit = layout.tp == 2 ? 0.7 : 0.45;
        for (const std::uint64_t bytes : read) {
            INFO(bytes << " of " << data << " bytes read");
            CHECK(bytes > 0);
            CHECK(static_cast<double>(bytes) < limit * static_cast<double>(data));
        }
    }
}

TEST_CASE("a later sharded save replaces the older shards only once its index is written", "[parallel][checkpoint]") {
    const Directory root;
    const Layout layout{"dp 2 ZeRO 3", 2, 1, 1, 1, {.zero_stage = 3}};
    on_layout(layout, [&](auto& exec, ThreadComm& world, int dp_rank, int dp) {
        exec.initialize(seed);
        (void)train_step(exec, 0, dp_rank, dp);
        loom::exec::save_sharded(exec, world, root.path);
        (void)train_step(exec, 1, dp_rank, dp);
        loom::exec::save_sharded(exec, world, root.path);
    });
    CHECK(files_in(root.path) == std::vector<std::string>{"index.json", "shard-s2-r0-of-2.safetensors",
                                                          "shard-s2-r1-of-2.safetensors"});
    CHECK(loom::exec::read_sharded_index(root.path).optimizer_steps == 2);
}

TEST_CASE("a sharded save in the background keeps the state of the step it started at", "[parallel][checkpoint]") {
    const Directory root;
    const Layout layout{"dp 2 x pp 2 ZeRO 3", 2, 2, 1, 1, {.zero_stage = 3, .pipelined = true}};
    State at_save;
    on_layout(layout, [&](auto& exec, ThreadComm& world, int dp_rank, int dp) {
        exec.initialize(seed);
        (void)train_step(exec, 0, dp_rank, dp);
        State mine = gathered(exec);
        loom::exec::ShardedSave<ThreadComm> save(exec, world, root.path, {{"step", "1"}});
        (void)train_step(exec, 1, dp_rank, dp);  // while the shards are written
        save.finish();
        if (world.rank() == 0) at_save = std::move(mine);
    });
    const Loaded loaded = load({"serial"}, root.path, at_save);
    CHECK(loaded.state_equal);
    CHECK(loaded.owned == static_cast<std::int64_t>(at_save.values.size()));
    CHECK(loom::exec::read_sharded_index(root.path).optimizer_steps == 1);
}

TEST_CASE("a sharded checkpoint gives each rank its own per-rank state back, under the same signature only",
          "[parallel][checkpoint]") {
    const Directory root;
    const Layout layout{"dp 2 ZeRO 2", 2, 1, 1, 1, {.zero_stage = 2}};
    const auto own = [](int rank) { return std::vector<float>{static_cast<float>(rank) + 0.5f, -1.0f, 7.0f}; };
    std::vector<std::vector<float>> read(2);
    std::vector<std::string> why(2);
    std::vector<bool> other(2, true);
    on_layout(layout, [&](auto& exec, ThreadComm& world, int, int) {
        exec.initialize(seed);
        loom::exec::save_sharded(exec, world, root.path, {}, {"TopK<0.1> on dp 2", own(world.rank())});
        const auto index = loom::exec::read_sharded_index(root.path);
        std::vector<float> mine(3);
        if (loom::exec::read_sharded_rank_state(root.path, index, world.rank(), "TopK<0.1> on dp 2", mine,
                                                why[static_cast<std::size_t>(world.rank())]))
            read[static_cast<std::size_t>(world.rank())] = mine;
        other[static_cast<std::size_t>(world.rank())] = loom::exec::read_sharded_rank_state(
            root.path, index, world.rank(), "TopK<0.1> on dp 4", mine, why[static_cast<std::size_t>(world.rank())]);
    });
    for (int r = 0; r < 2; ++r) {
        CHECK(read[static_cast<std::size_t>(r)] == own(r));
        CHECK_FALSE(other[static_cast<std::size_t>(r)]);
        CHECK(why[static_cast<std::size_t>(r)] ==
              "the checkpoint's per-rank state belongs to TopK<0.1> on dp 2, not TopK<0.1> on dp 4");
    }
}

TEST_CASE("a broken sharded checkpoint is named in one line", "[parallel][checkpoint]") {
    const Directory root;
    const Layout layout{"dp 2 ZeRO 1", 2, 1, 1, 1, {.zero_stage = 1}};
    (void)train_and_save(layout, root.path);
    const std::string index = [&] {
        std::ifstream in(root.path / "index.json");
        std::stringstream text;
        text << in.rdbuf();
        return text.str();
    }();
    const auto write_index = [&](const std::string& text) { std::ofstream(root.path / "index.json") << text; };
    const auto load_message = [&] {
        std::string message;
        on_layout({"serial"}, [&](auto& exec, ThreadComm&, int, int) {
            message = message_of([&] { (void)loom::exec::load_sharded(exec, root.path); });
        });
        return message;
    };
    const std::string where = "sharded checkpoint " + root.path.string();
    const std::string first = "shard-s2-r0-of-2.safetensors", second = "shard-s2-r1-of-2.safetensors";
    const auto replaced = [&](const std::string& from, const std::string& to) {
        std::string text = index;
        text.replace(text.find(from), from.size(), to);
        return text;
    };

    SECTION("a shard left out of the index") {
        write_index(replaced("\"" + first + "\",", ""));
        CHECK_THAT(load_message(), Catch::Matchers::StartsWith(where + ": element ") &&
                                       Catch::Matchers::EndsWith(" of the model is in no shard; the checkpoint is incomplete"));
    }
    SECTION("a shard named twice") {
        write_index(replaced(first, second));
        CHECK_THAT(load_message(), Catch::Matchers::Contains(" is in two shards (" + second + " and an earlier one)"));
    }
    SECTION("a shard that is missing") {
        std::filesystem::remove(root.path / second);
        CHECK_THAT(load_message(), Catch::Matchers::Contains(second));
    }
    SECTION("another model") {
        write_index(replaced("\"parameters\": ", "\"parameters\": 1"));
        CHECK_THAT(load_message(), Catch::Matchers::Contains("; load it into the model it was saved from"));
    }
    SECTION("not an index") {
        write_index("{\"format\": \"something else\"}");
        CHECK(load_message() == where + ": index.json's format is 'something else'; this loom reads loom-sharded-1");
    }
    SECTION("no index") {
        std::filesystem::remove(root.path / "index.json");
        CHECK_THAT(load_message(), Catch::Matchers::StartsWith(where + ": cannot read "));
    }
    SECTION("a shard holding a NaN moment") {
        // The shard rewritten whole, as a diverged run would have left it.
        const std::filesystem::path file = root.path / second;
        std::vector<std::vector<float>> arrays;
        std::vector<std::string> names;
        std::map<std::string, std::string> metadata;
        {
            const loom::io::SafetensorsFile shard(file);
            metadata = shard.metadata().to_map();
            for (const std::string& name : shard.names()) {
                const loom::Tensor t = shard.tensor(name);
                if (t.dtype() != loom::DType::f32) continue;
                arrays.emplace_back(t.data<float>(), t.data<float>() + t.numel());
                names.push_back(name);
            }
        }
        const auto m = std::find(names.begin(), names.end(), "m") - names.begin();
        REQUIRE(m < static_cast<std::ptrdiff_t>(names.size()));
        arrays[static_cast<std::size_t>(m)][3] = std::numeric_limits<float>::quiet_NaN();
        std::vector<loom::io::NamedTensor> tensors;
        for (std::size_t i = 0; i < arrays.size(); ++i)
            tensors.push_back({names[i], loom::Tensor::of(arrays[i].data(), {static_cast<std::int64_t>(arrays[i].size())})});
        // The integer runs (i64) go back as they were.
        const loom::io::SafetensorsFile again(file);
        std::vector<std::vector<std::int64_t>> runs;
        for (const std::string& name : again.names()) {
            const loom::Tensor t = again.tensor(name);
            if (t.dtype() != loom::DType::i64) continue;
            runs.emplace_back(t.data<std::int64_t>(), t.data<std::int64_t>() + t.numel());
            tensors.push_back({name, loom::Tensor(runs.back().data(), loom::DType::i64, t.shape())});
        }
        loom::io::save_safetensors(file, tensors, metadata);
        CHECK_THAT(load_message(), Catch::Matchers::StartsWith(where + ": tensor m holds nan at element ") &&
                                       Catch::Matchers::EndsWith("; only finite values are valid"));
    }
}

}  // namespace LOOM_TEST_FILE
