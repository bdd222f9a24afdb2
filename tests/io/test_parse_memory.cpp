// Parsing is bounded by what it parses: json::parse and SafetensorsFile's
// header reading hold at most 8 bytes per byte of JSON at their peak, so a
// header at the format's 100 MB limit cannot ask for gigabytes (it took 150
// bytes per value, 1.76 GB for a 20 MB header), and an object's duplicate
// keys are found by sorting, not by comparing every pair.
//
// This file replaces the global operator new and delete for the whole test
// binary, to count the bytes live at the peak; they forward to malloc.
#include <catch2/catch.hpp>

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

#include <loom/io/json.hpp>
#include <loom/io/safetensors.hpp>

#include "io/temp_dir.hpp"

namespace {

std::atomic<std::int64_t> live_bytes{0};
std::atomic<std::int64_t> peak_bytes{0};

void note_allocation(void* p) {
    const auto now = live_bytes.fetch_add(static_cast<std::int64_t>(malloc_usable_size(p))) +
                     static_cast<std::int64_t>(malloc_usable_size(p));
    std::int64_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
}

// The most bytes live at once while `f` runs, above those live before it.
// LOOM_PRINT_RATIOS=1 prints each ratio measured, for the record.
double report(double ratio) {
    if (std::getenv("LOOM_PRINT_RATIOS") != nullptr) std::fprintf(stderr, "peak bytes per byte: %.2f\n", ratio);
    return ratio;
}

template <class F>
std::int64_t peak_while(F&& f) {
    const std::int64_t before = live_bytes.load();
    peak_bytes.store(before);
    f();
    return peak_bytes.load() - before;
}

}  // namespace

void* operator new(std::size_t size) {
    void* p = std::malloc(size == 0 ? 1 : size);
    if (p == nullptr) throw std::bad_alloc();
    note_allocation(p);
    return p;
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    try {
        return ::operator new(size);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return ::operator new(size, std::nothrow); }
void operator delete(void* p) noexcept {
    if (p == nullptr) return;
    live_bytes.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)));
    std::free(p);
}
void operator delete[](void* p) noexcept { ::operator delete(p); }
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete(p); }

namespace json = loom::io::json;

namespace {

// Peak bytes per byte of `text` while json::parse reads it and its result lives.
double json_ratio(const std::string& text) {
    const std::int64_t peak = peak_while([&] {
        std::string error;
        const auto parsed = json::parse(text, error);
        REQUIRE(parsed.has_value());
    });
    return report(static_cast<double>(peak) / static_cast<double>(text.size()));
}

std::string repeated(std::string_view open, std::string_view element, std::string_view close, std::size_t bytes) {
    std::string text(open);
    while (text.size() < bytes) {
        if (text.size() > open.size()) text += ',';
        text += element;
    }
    return text + std::string(close);
}

}  // namespace

TEST_CASE("json parsing holds at most 8 bytes per byte of text at its peak", "[json][memory]") {
    constexpr std::size_t size = 2'000'000;
    std::string keys = "{";
    for (std::size_t i = 0; keys.size() < size; ++i) keys += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
    keys += "}";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"small numbers", repeated("[", "1", "]", size)},
        {"empty arrays", repeated("[", "[]", "]", size)},
        {"empty objects", repeated("[", "{}", "]", size)},
        {"nested arrays", repeated("[", "[[0]]", "]", size)},
        {"short strings", repeated("[", "\"\"", "]", size)},
        {"escaped strings", repeated("[", R"("\n\u00e9\ud83d\ude00")", "]", size)},
        {"literals", repeated("[", "null", "]", size)},
        {"many keys", keys},
        {"objects of one key", repeated("[", R"({"a":1})", "]", size)},
    };
    for (const auto& [name, text] : cases) {
        INFO(name << ": " << text.size() << " bytes");
        CHECK(json_ratio(text) <= 8.0);
    }
}

TEST_CASE("json finds a duplicate among 160 thousand keys", "[json][errors]") {
    std::string text = "{";
    for (int i = 0; i < 160000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
    const std::size_t duplicate_at = text.size() + 1;
    std::string error;
    CHECK(json::parse(text + "}", error).has_value());
    CHECK(json::parse(text + ",\"k123456\":0}", error) == std::nullopt);
    CHECK(error == "duplicate object key \"k123456\" at byte " + std::to_string(duplicate_at));
}

namespace {

std::string le64(std::uint64_t n) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xffu);
    return bytes;
}

// Peak bytes, beyond the file itself, per byte of header while a
// SafetensorsFile reads `header` (with no data) and lives.
double safetensors_ratio(std::string header) {
    loom_test::TempDir dir;
    header.append((8 - header.size() % 8) % 8, ' ');
    loom_test::write_bytes(dir / "h.st", le64(header.size()) + header);
    const std::int64_t peak = peak_while([&] {
        const loom::io::SafetensorsFile file(dir / "h.st");
        CHECK(file.size() > 0);
    });
    return report(static_cast<double>(peak - static_cast<std::int64_t>(header.size() + 8)) /
                  static_cast<double>(header.size()));
}

}  // namespace

TEST_CASE("safetensors headers are read in at most 8 bytes per header byte", "[safetensors][memory]") {
    constexpr std::size_t size = 2'000'000;
    std::string tensors = "{";
    std::string metadata = R"({"__metadata__":{)";
    std::string shapes = "{";
    for (std::size_t i = 0; tensors.size() < size; ++i)
        tensors += (i ? ",\"" : "\"") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
    for (std::size_t i = 0; metadata.size() < size; ++i)
        metadata += (i ? ",\"" : "\"") + std::to_string(i) + R"(":"")";
    for (std::size_t i = 0; shapes.size() < size; ++i)
        shapes += (i ? ",\"" : "\"") + std::to_string(i) + R"(":{"dtype":"F32","shape":[1,0,1,1,1,1],"data_offsets":[0,0]})";
    INFO("tensors " << tensors.size() << " bytes");
    CHECK(safetensors_ratio(tensors + "}") <= 8.0);
    INFO("metadata " << metadata.size() << " bytes");
    CHECK(safetensors_ratio(metadata + R"(},"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})") <= 8.0);
    INFO("shapes " << shapes.size() << " bytes");
    CHECK(safetensors_ratio(shapes + "}") <= 8.0);
}
