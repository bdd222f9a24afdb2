// libFuzzer targets for loom's readers of untrusted text: the JSON parser,
// the safetensors reader (a whole file, and on demand: the same verdict and
// the same bytes) and the planner's cluster and model
// files, and a sharded checkpoint's index. One binary, the target chosen by
// LOOM_FUZZ_TARGET (json, safetensors, plan, sharded_index), so the suite
// compiles it once. Built by clang with
// -fsanitize=fuzzer,address,undefined (tests/fuzz/fuzz.cmake); a finding is
// a crash, a sanitizer report, a leak, an exception other than loom::Error,
// or (json) a peak of more than 8 bytes per byte of input.
//
//   LOOM_FUZZ_TARGET=json build/release/tests/loom_fuzz -max_total_time=600 \
//       /tmp/json-corpus tests/fuzz/corpus/json
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/exec/sharded_index.hpp>
#include <loom/io/json.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/plan/cluster_json.hpp>
#include <loom/plan/model_json.hpp>

namespace {

enum class Target { json, safetensors, plan, sharded_index };
Target target = Target::json;

// Touches every value, so a handle pointing outside its document shows.
std::size_t walk(const loom::io::json::Value& value, int depth = 0) {
    std::size_t seen = value.text().size() + value.offset();
    (void)value.as_uint64();
    (void)value.as_double();
    (void)value.boolean();
    if (depth > 80) std::abort();  // the parser caps nesting at 64
    for (const loom::io::json::Member& m : value.members()) seen += m.key.size() + m.key_offset;
    std::size_t items = 0;
    for (const loom::io::json::Value item : value.items()) {
        seen += walk(item, depth + 1);
        ++items;
    }
    if (items != value.size()) std::abort();
    if (value.is_object() && value.size() > 0) (void)value.find(value.members().begin().operator*().key);
    return seen;
}

void fuzz_json(std::string_view text) {
    std::string error;
    const auto parsed = loom::io::json::parse(text, error);
    if (!parsed) {
        if (error.empty() || error.find(" at byte ") == std::string::npos) std::abort();
        return;
    }
    // The document's own bytes: the copy and the nodes (at most a node per
    // two bytes, plus the root).
    if (parsed->memory_bytes() > 8 * text.size() + 64) std::abort();
    (void)walk(parsed->root());
}

// The file through a memfd, so that the reader's open/fstat/read path runs
// as it does on a checkpoint, without touching the disk.
void fuzz_safetensors(std::string_view bytes) {
    static const int fd = ::memfd_create("loom_fuzz_safetensors", 0);
    if (fd < 0) std::abort();
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<::ssize_t>(bytes.size()))
        std::abort();
    static const std::string path = "/proc/self/fd/" + std::to_string(fd);
    std::string whole_error;
    std::optional<loom::io::SafetensorsFile> whole;
    try {
        whole.emplace(path);
        const loom::io::SafetensorsFile& file = *whole;
        for (const std::string& name : file.names()) {
            const loom::Tensor t = file.tensor(name);
            if (t.nbytes() > 0) {
                volatile unsigned char sum = 0;
                const auto* p = static_cast<const unsigned char*>(t.raw());
                for (std::size_t i = 0; i < t.nbytes(); ++i) sum = static_cast<unsigned char>(sum + p[i]);
            }
            if (!file.contains(name)) std::abort();
        }
        file.metadata().for_each([](std::string_view key, std::string_view value) {
            if (key.size() + value.size() > (std::size_t{1} << 30)) std::abort();
        });
    } catch (const loom::Error& e) {
        whole.reset();
        whole_error = e.message();
    }
    // On demand (the header read alone, tensors by pread): the same verdict,
    // the same message, the same bytes; and a 1-D tensor's halves by range.
    try {
        const loom::io::SafetensorsFile lazy(path, loom::io::SafetensorsRead::on_demand);
        if (!whole) std::abort();
        for (const std::string& name : lazy.names()) {
            const loom::Tensor t = whole->tensor(name);
            std::vector<std::byte> bytes(t.nbytes() + 1);
            const loom::Tensor into(bytes.data(), t.dtype(), t.shape());
            lazy.read_into(name, into);
            if (t.nbytes() > 0 && std::memcmp(bytes.data(), t.raw(), t.nbytes()) != 0) std::abort();
            if (t.rank() == 1 && t.dim(0) > 1) {
                const std::int64_t half = t.dim(0) / 2;
                const loom::Tensor part(bytes.data(), t.dtype(), loom::Shape{t.dim(0) - half});
                lazy.read_elements(name, half, t.dim(0) - half, part);
                if (std::memcmp(bytes.data(), static_cast<const std::byte*>(t.raw()) + half * loom::size_of(t.dtype()),
                                part.nbytes()) != 0)
                    std::abort();
            }
        }
    } catch (const loom::Error& e) {
        if (whole || e.message() != whole_error) std::abort();
    }
}

// A sharded checkpoint's index: parsed, or refused with loom::Error.
void fuzz_sharded_index(std::string_view text) {
    try {
        const auto index = loom::exec::parse_sharded_index(text, "fuzz");
        if (index.shards.empty() || index.parameters < 0 || index.optimizer_steps < 0) std::abort();
        for (const auto& name : index.shards)
            if (name.empty() || name.find('/') != std::string::npos) std::abort();
    } catch (const loom::Error&) {
    }
}

void fuzz_plan(std::string_view text) {
    // "measure" times this machine (milliseconds per file): not what is fuzzed.
    if (text.find("measure") != std::string_view::npos) return;
    try {
        (void)loom::plan::read_cluster(text, "cluster.json");
    } catch (const loom::Error&) {
    }
    try {
        (void)loom::plan::read_model(text, "model.json");
    } catch (const loom::Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const char* name = std::getenv("LOOM_FUZZ_TARGET");
    const std::string_view chosen = name != nullptr ? name : "";
    if (chosen == "json") target = Target::json;
    else if (chosen == "safetensors") target = Target::safetensors;
    else if (chosen == "plan") target = Target::plan;
    else if (chosen == "sharded_index") target = Target::sharded_index;
    else {
        std::fprintf(stderr, "set LOOM_FUZZ_TARGET to json, safetensors, plan or sharded_index (it is '%s')\n", name ? name : "");
        std::exit(2);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    switch (target) {
        case Target::json: fuzz_json(bytes); break;
        case Target::safetensors: fuzz_safetensors(bytes); break;
        case Target::plan: fuzz_plan(bytes); break;
        case Target::sharded_index: fuzz_sharded_index(bytes); break;
    }
    return 0;
}
