// safetensors checkpoints: byte-exact with the format, a round trip of every
// dtype, and a one-line error naming the file for every kind of damage.
#include <catch2/catch.hpp>

#include <loom/core/buffer.hpp>
#include <loom/io/safetensors.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Buffer;
using loom::DType;
using loom::Host;
using loom::Shape;
using loom::Tensor;
using loom::io::NamedTensor;
using loom::io::SafetensorsFile;
using loom::io::save_safetensors;
using loom_test::message_of;
using loom_test::read_bytes;
using loom_test::TempDir;
using loom_test::write_bytes;

namespace {

std::string le64(std::uint64_t n) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xffu);
    return bytes;
}

// A file from a header and data written by hand, the header padded to 8.
std::string raw_file(std::string header, std::string_view data) {
    header.append((8 - header.size() % 8) % 8, ' ');
    return le64(header.size()) + header + std::string(data);
}

// A buffer whose byte k is (seed + 7k) mod 256: every tensor distinct.
Buffer<Host> patterned(DType dtype, Shape shape, int seed) {
    Buffer<Host> b(dtype, shape);
    auto* bytes = static_cast<unsigned char*>(b.raw());
    for (std::size_t k = 0; k < b.nbytes(); ++k) bytes[k] = static_cast<unsigned char>((seed + 7 * k) & 0xffu);
    return b;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

std::string error_of(const std::filesystem::path& path) {
    try {
        SafetensorsFile file(path);
    } catch (const loom::Error& e) {
        return e.message();
    }
    return "<loaded>";
}

// The same, opened on demand (the header only).
std::string error_on_demand(const std::filesystem::path& path) {
    try {
        SafetensorsFile file(path, loom::io::SafetensorsRead::on_demand);
    } catch (const loom::Error& e) {
        return e.message();
    }
    return "<loaded>";
}

// A valid file of two tensors and a metadata entry, for the tests that damage it.
std::filesystem::path write_good_file(const TempDir& dir) {
    const auto good = dir / "good.st";
    Buffer<Host> w = patterned(DType::f32, Shape{3, 4}, 1);
    Buffer<Host> e = patterned(DType::i64, Shape{2}, 2);
    save_safetensors(good, {{"w", w.tensor()}, {"e", e.tensor()}}, {{"step", "9"}});
    return good;
}

}  // namespace

TEST_CASE("safetensors writes exactly the bytes of the format", "[safetensors]") {
    TempDir dir;
    const float a[] = {1.0f, 2.0f};
    const std::int32_t b = 7;
    save_safetensors(dir / "tiny.st",
                     {{"a", Tensor::of(a, Shape{2})}, {"b", Tensor::of(&b, Shape{})}}, {{"k", "v"}});
    const std::string expected =
        std::string("\x88\0\0\0\0\0\0\0", 8) +
        R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
        R"("b":{"dtype":"I32","shape":[],"data_offsets":[8,12]}})" +
        "    " + std::string("\x00\x00\x80\x3f\x00\x00\x00\x40\x07\x00\x00\x00", 12);
    CHECK(read_bytes(dir / "tiny.st") == expected);
    CHECK(dir.entries() == std::vector<std::string>{"tiny.st"});
}

TEST_CASE("safetensors reads a hand-made file with free whitespace and header order unlike data order",
          "[safetensors]") {
    TempDir dir;
    const std::string header = "{\n  \"second\" : {\"shape\": [1], \"data_offsets\": [2, 4], \"dtype\": \"BF16\"},\n"
                               "  \"first\": {\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]},\n"
                               "  \"__metadata__\": {\"format\": \"pt\", \"\\u00e9t\\u00e9\": \"\\\"q\\\"\"}\n}";
    write_bytes(dir / "hand.st", raw_file(header, std::string("\x00\x3c\x80\x3f", 4)));
    SafetensorsFile file(dir / "hand.st");
    CHECK(file.names() == std::vector<std::string>{"second", "first"});
    CHECK(file.metadata().to_map() == std::map<std::string, std::string>{{"format", "pt"}, {"\xc3\xa9t\xc3\xa9", "\"q\""}});
    CHECK(loom::to_float(file.tensor("first").data<loom::f16>()[0]) == 1.0f);    // 0x3c00
    CHECK(loom::to_float(file.tensor("second").data<loom::bf16>()[0]) == 1.0f);  // 0x3f80
}

TEST_CASE("safetensors round-trips every dtype, scalars, empty tensors and metadata", "[safetensors]") {
    TempDir dir;
    std::vector<Buffer<Host>> buffers;
    buffers.push_back(patterned(DType::f32, Shape{2, 3}, 1));
    buffers.push_back(patterned(DType::bf16, Shape{5}, 2));  // 10 bytes: what follows is misaligned
    buffers.push_back(patterned(DType::i64, Shape{2, 2}, 3));
    buffers.push_back(patterned(DType::f16, Shape{3, 1}, 4));
    buffers.push_back(patterned(DType::i32, Shape{4}, 5));
    buffers.push_back(patterned(DType::f32, Shape{}, 6));  // a scalar
    buffers.push_back(patterned(DType::f32, Shape{0, 4}, 7));
    buffers.push_back(patterned(DType::i64, Shape{0}, 8));
    buffers.push_back(patterned(DType::bf16, Shape{1, 1, 1, 1, 1, 3}, 9));  // the largest rank
    const std::vector<std::string> names{"w.f32", "w.bf16", "w.i64", "w.f16", "w.i32", "scalar", "empty", "none", "deep"};
    std::vector<NamedTensor> tensors;
    for (std::size_t i = 0; i < names.size(); ++i) tensors.push_back({names[i], buffers[i].tensor()});
    const std::map<std::string, std::string> metadata{
        {"step", "120"}, {"config", "{\"n_layer\": 2}"}, {"note", "tab\t newline\n quote\" \xc3\xbc"}, {"", ""}};
    save_safetensors(dir / "all.st", tensors, metadata);

    SafetensorsFile file(dir / "all.st");
    CHECK(file.path() == dir / "all.st");
    CHECK(file.names() == names);
    CHECK(file.size() == names.size());
    CHECK(file.metadata().to_map() == metadata);
    for (std::size_t i = 0; i < names.size(); ++i) {
        INFO(names[i]);
        const Tensor loaded = file.tensor(names[i]);
        CHECK(loaded.dtype() == buffers[i].dtype());
        CHECK(loaded.shape() == buffers[i].shape());
        CHECK(same_bytes(loaded, buffers[i].tensor()));
        // Typed access needs aligned elements even where the file has none.
        CHECK(reinterpret_cast<std::uintptr_t>(loaded.raw()) % loom::size_of(loaded.dtype()) == 0);
        Buffer<Host> into(buffers[i].dtype(), buffers[i].shape());
        file.read_into(names[i], into.tensor());
        CHECK(same_bytes(into.tensor(), buffers[i].tensor()));
        CHECK(file.contains(names[i]));
    }
    CHECK_FALSE(file.contains("w"));

    // Saving what was loaded reproduces the file byte for byte.
    std::vector<NamedTensor> again;
    for (const std::string& name : file.names()) again.push_back({name, file.tensor(name)});
    save_safetensors(dir / "again.st", again, file.metadata().to_map());
    CHECK(read_bytes(dir / "again.st") == read_bytes(dir / "all.st"));
}

TEST_CASE("safetensors stores an empty checkpoint as an empty header", "[safetensors]") {
    TempDir dir;
    save_safetensors(dir / "empty.st", {});
    CHECK(read_bytes(dir / "empty.st") == std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
    SafetensorsFile file(dir / "empty.st");
    CHECK(file.names().empty());
    CHECK(file.metadata().empty());
    CHECK_THROWS_WITH(file.tensor("x"), Catch::StartsWith("checkpoint " + (dir / "empty.st").string() +
                                                          " has no tensor x; it holds no tensors at all"));
}

TEST_CASE("safetensors replaces a checkpoint atomically and refuses bad tensors before touching it",
          "[safetensors][errors]") {
    TempDir dir;
    const auto path = dir / "run.st";
    const float one = 1.0f;
    save_safetensors(path, {{"x", Tensor::of(&one, Shape{})}});
    const std::string before = read_bytes(path);
    const std::string p = path.string();

    float values[6] = {};
    const Tensor matrix = Tensor::of(values, Shape{2, 3});
    CHECK_THROWS_WITH(save_safetensors(path, {{"a", matrix}, {"a", matrix}}),
                      Catch::StartsWith("checkpoint " + p + ": tensors 0 and 1 are both named a; names must be unique"));
    CHECK_THROWS_WITH(save_safetensors(path, {{"", matrix}}),
                      Catch::StartsWith("checkpoint " + p + ": tensor 0 has an empty name"));
    CHECK_THROWS_WITH(save_safetensors(path, {{"__metadata__", matrix}}),
                      Catch::StartsWith("checkpoint " + p + ": a tensor may not be named __metadata__"));
    CHECK_THROWS_WITH(save_safetensors(path, {{"bad\xff", matrix}}),
                      Catch::Contains("is not valid UTF-8; safetensors headers are UTF-8 JSON"));
    CHECK_THROWS_WITH(save_safetensors(path, {{"a", matrix}}, {{"k", "\xc0"}}),
                      Catch::StartsWith("checkpoint " + p + ": metadata entry \"k\" is not valid UTF-8"));
    CHECK_THROWS_WITH(save_safetensors(path, {{"col", matrix.slice(1, 0, 2)}}),
                      Catch::StartsWith("checkpoint " + p + ": tensor col with strides [3, 1] is not contiguous"));
    CHECK_THROWS_WITH(save_safetensors(path, {{"gpu", Tensor(values, DType::f32, Shape{6}, loom::cuda_device(0))}}),
                      Catch::StartsWith("checkpoint " + p + ": tensor gpu is Tensor(f32, [6], cuda:0); copy it to the host"));
    CHECK(read_bytes(path) == before);
    CHECK(dir.entries() == std::vector<std::string>{"run.st"});
}

TEST_CASE("read_into checks dtype and shape and names both", "[safetensors][errors]") {
    TempDir dir;
    const auto path = dir / "run.st";
    const std::string p = path.string();
    Buffer<Host> qkv = patterned(DType::f32, Shape{768, 256}, 1);
    Buffer<Host> bias = patterned(DType::f32, Shape{768}, 2);
    save_safetensors(path, {{"blocks.0.attn.qkv.weight", qkv.tensor()}, {"blocks.0.attn.qkv.bias", bias.tensor()}});
    SafetensorsFile file(path);

    Buffer<Host> small(DType::f32, Shape{384, 128});
    CHECK_THROWS_WITH(file.read_into("blocks.0.attn.qkv.weight", small.tensor()),
                      Catch::StartsWith("checkpoint " + p +
                                        ": tensor blocks.0.attn.qkv.weight has shape [768, 256] but the model "
                                        "expects [384, 128] ["));
    Buffer<Host> half(DType::bf16, Shape{768, 256});
    CHECK_THROWS_WITH(file.read_into("blocks.0.attn.qkv.weight", half.tensor()),
                      Catch::StartsWith("checkpoint " + p +
                                        ": tensor blocks.0.attn.qkv.weight holds f32 but the model expects bf16 ["));
    CHECK_THROWS_WITH(file.read_into("blocks.0.mlp.up.weight", small.tensor()),
                      Catch::StartsWith("checkpoint " + p + " has no tensor blocks.0.mlp.up.weight; it holds 2 "
                                                            "tensors: blocks.0.attn.qkv.weight, blocks.0.attn.qkv.bias ["));
    Buffer<Host> wide(DType::f32, Shape{768, 512});
    CHECK_THROWS_WITH(file.read_into("blocks.0.attn.qkv.weight", wide.tensor().slice(1, 0, 256)),
                      Catch::StartsWith("checkpoint " + p + ": cannot read tensor blocks.0.attn.qkv.weight into a "
                                                            "non-contiguous"));
    // A failed read leaves the target untouched.
    for (float v : small.tensor().span<float>()) REQUIRE(v == 0.0f);
}

TEST_CASE("missing, empty and short files name the file", "[safetensors][errors]") {
    TempDir dir;
    const auto path = dir / "bad.st";
    const std::string head = "checkpoint " + path.string() + ": ";
    CHECK(error_of(path) == head + "cannot open: No such file or directory");
    write_bytes(path, "");
    CHECK(error_of(path) == head + "the file is empty; a safetensors file starts with an 8-byte header length");
    write_bytes(path, "abcde");
    CHECK(error_of(path) ==
          head + "the file has 5 bytes, fewer than the 8-byte header length every safetensors file starts with");
    CHECK(error_of(dir.path()) == "checkpoint " + dir.path().string() + ": is not a regular file");
}

TEST_CASE("every truncation of a valid file fails with a message naming the file", "[safetensors][errors]") {
    TempDir dir;
    const std::string bytes = read_bytes(write_good_file(dir));
    const auto cut = dir / "cut.st";
    const std::string head = "checkpoint " + cut.string() + ": ";
    std::uint64_t header_length = 0;
    std::memcpy(&header_length, bytes.data(), 8);
    for (std::size_t length = 0; length < bytes.size(); ++length) {
        write_bytes(cut, std::string_view(bytes).substr(0, length));
        const std::string error = error_of(cut);
        INFO("truncated to " << length << " of " << bytes.size() << " bytes: " << error);
        REQUIRE(error.rfind(head, 0) == 0);
        if (length >= 8 && length < 8 + header_length)
            CHECK(error == head + "the header length " + std::to_string(header_length) +
                               " reaches beyond the end of the file (" + std::to_string(length) + " bytes, so at most " +
                               std::to_string(length - 8) + ")");
    }
    // Cut inside the data: the last tensor's offsets now run past the end.
    write_bytes(cut, std::string_view(bytes).substr(0, bytes.size() - 1));
    CHECK(error_of(cut) == head + "tensor e has data_offsets [48, 64] but the data section has only 63 bytes");
    write_bytes(cut, bytes + "x");
    CHECK(error_of(cut) ==
          head + "the data section has 65 bytes but the tensors cover only 64; bytes after the last tensor are not allowed");
}

TEST_CASE("flipped header bytes either still describe a valid file or fail naming the file", "[safetensors][errors]") {
    TempDir dir;
    Buffer<Host> w = patterned(DType::bf16, Shape{3, 3}, 1);
    Buffer<Host> b = patterned(DType::f32, Shape{3}, 2);
    save_safetensors(dir / "good.st", {{"w", w.tensor()}, {"b", b.tensor()}}, {{"k", "v"}});
    const std::string bytes = read_bytes(dir / "good.st");
    const auto flipped = dir / "flipped.st";
    const std::string head = "checkpoint " + flipped.string();
    std::uint64_t header_length = 0;
    std::memcpy(&header_length, bytes.data(), 8);
    int refused = 0;
    for (std::size_t at = 0; at < 8 + header_length; ++at) {
        for (unsigned mask : {0x01u, 0x20u, 0x80u}) {
            std::string damaged = bytes;
            damaged[at] = static_cast<char>(static_cast<unsigned char>(damaged[at]) ^ mask);
            write_bytes(flipped, damaged);
            const std::string error = error_of(flipped);  // any other exception type fails the test
            INFO("byte " << at << " ^ " << mask << ": " << error);
            if (error != "<loaded>") {
                REQUIRE(error.rfind(head, 0) == 0);
                ++refused;
            }
        }
    }
    CHECK(refused > static_cast<int>(header_length));  // most damage is caught
}

TEST_CASE("a damaged header is refused with the specific reason", "[safetensors][errors]") {
    TempDir dir;
    const auto path = dir / "x.st";
    const std::string head = "checkpoint " + path.string() + ": ";
    const std::string data8(8, '\0');
    const auto check = [&](const std::string& file_bytes, const std::string& expected) {
        write_bytes(path, file_bytes);
        CHECK(error_of(path) == head + expected);
    };
    const std::string f32_2 = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";

    check(le64(1ull << 40) + "{}      ", "the header length 1099511627776 reaches beyond the end of the file (16 bytes, so at most 8)");
    check(raw_file("[1, 2]", ""), "the header does not start with '{'; this is not a safetensors file");
    check(raw_file(" {}", ""), "the header does not start with '{'; this is not a safetensors file");
    check(le64(0) + "", "the header does not start with '{'; this is not a safetensors file");
    check(raw_file("{\"a\":{" + f32_2 + "}", data8),
          "the header is not valid JSON: expected ',' or '}' in an object but found the end of the text at byte 56 of "
          "the header");
    check(raw_file("{\"a\";{" + f32_2 + "}}", data8),
          "the header is not valid JSON: expected ':' after the object key \"a\" but found ';' at byte 4 of the header");
    check(raw_file("{}x", ""), "the header is not valid JSON: unexpected 'x' after the end of the value at byte 2 of the header");
    check(raw_file("{\"a\":{" + f32_2 + "},\"a\":{" + f32_2 + "}}", data8),
          "the header is not valid JSON: duplicate object key \"a\" at byte 54 of the header");
    check(raw_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", data8),
          "tensor a has the dtype \"F64\", which loom does not support; supported are F32, BF16, F16, I32, I64");
    check(raw_file(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,8]}})", data8),
          "tensor a has a dtype that is a number, not a string");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", data8), "tensor a lacks the field data_offsets");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"crc":"0"}})", data8),
          "tensor a has the unknown field \"crc\"; valid fields are dtype, shape and data_offsets");
    check(raw_file(R"({"a":[1]})", data8),
          "tensor a is described by an array; expected an object with dtype, shape and data_offsets");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
          "tensor a has the shape entry -2; extents must be non-negative integers");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data8),
          "tensor a has the shape entry 2.0; extents must be non-negative integers");
    check(raw_file(R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", data8),
          "tensor a has the shape entry a string; extents must be non-negative integers");
    check(raw_file(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", data8),
          "tensor a has a shape that is a number, not an array");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,2],"data_offsets":[0,8]}})", data8),
          "tensor a has 7 dimensions; loom tensors have at most 6");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", ""),
          "tensor a has a shape whose extents multiply past 2^63 - 1");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data8),
          "tensor a has data_offsets that are not two non-negative integers [begin, end]");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data8),
          "tensor a has data_offsets [8, 0] whose begin is after its end");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data8),
          "tensor a has data_offsets [0, 16] but the data section has only 8 bytes");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
          "tensor a has data_offsets [0, 8], 8 bytes, but F32 [3] needs 3 x 4 bytes");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   std::string(12, '\0')),
          "tensors a [0, 8] and b [4, 12] overlap; each byte of the data section belongs to exactly one tensor");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                   std::string(20, '\0')),
          "bytes [8, 12) of the data section belong to no tensor (a hole before b)");
    check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(12, '\0')),
          "the data section has 12 bytes but the tensors cover only 8; bytes after the last tensor are not allowed");
    check(raw_file(R"({"__metadata__":{"step":5}})", ""),
          "__metadata__ entry \"step\" is a number; metadata values must be strings");
    check(raw_file(R"({"__metadata__":["a"]})", ""), "__metadata__ is an array; it must be an object of strings");
}

TEST_CASE("safetensors accepts files whose tensors sit at unaligned offsets", "[safetensors]") {
    TempDir dir;
    // A one-element bf16 first pushes the f32 to offset 2.
    std::string data("\x80\x3f", 2);
    const float value = 3.5f;
    data.append(reinterpret_cast<const char*>(&value), 4);
    write_bytes(dir / "odd.st", raw_file(R"({"h":{"dtype":"BF16","shape":[],"data_offsets":[0,2]},)"
                                         R"("f":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                                         data));
    SafetensorsFile file(dir / "odd.st");
    const Tensor f = file.tensor("f");
    CHECK(reinterpret_cast<std::uintptr_t>(f.raw()) % 4 == 0);
    CHECK(f.data<float>()[0] == 3.5f);
    CHECK(loom::to_float(file.tensor("h").data<loom::bf16>()[0]) == 1.0f);
    // On demand, the bytes are read into the (aligned) target.
    const SafetensorsFile lazy(dir / "odd.st", loom::io::SafetensorsRead::on_demand);
    float read = 0;
    lazy.read_elements("f", 0, 1, Tensor::of(&read, {1}));
    CHECK(read == 3.5f);
}

TEST_CASE("safetensors on demand checks the header as a whole read does and reads only what is asked",
          "[safetensors]") {
    TempDir dir;
    const auto path = dir / "big.st";
    Buffer<Host> w = patterned(DType::f32, Shape{3, 4}, 1);
    Buffer<Host> e = patterned(DType::i64, Shape{5}, 2);
    Buffer<Host> h = patterned(DType::bf16, Shape{7}, 3);
    save_safetensors(path, {{"w", w.tensor()}, {"e", e.tensor()}, {"h", h.tensor()}}, {{"step", "9"}});
    const SafetensorsFile whole(path);
    const SafetensorsFile lazy(path, loom::io::SafetensorsRead::on_demand);
    CHECK(lazy.reads_on_demand());
    CHECK(whole.bytes_read() == std::filesystem::file_size(path));
    std::uint64_t header_length = 0;
    std::memcpy(&header_length, read_bytes(path).data(), 8);
    CHECK(lazy.bytes_read() == 8 + header_length);
    CHECK(lazy.names() == whole.names());
    CHECK(lazy.metadata().to_map() == whole.metadata().to_map());
    CHECK(lazy.dtype("e") == DType::i64);
    CHECK(lazy.shape("w") == Shape{3, 4});
    // A whole tensor, and a range of one, each read by itself.
    Buffer<Host> w_again(DType::f32, Shape{3, 4});
    lazy.read_into("w", w_again.tensor());
    CHECK(same_bytes(w_again.tensor(), w.tensor()));
    CHECK(lazy.bytes_read() == 8 + header_length + 48);
    std::int64_t middle[3] = {};
    lazy.read_elements("e", 1, 3, Tensor::of(middle, {3}));
    for (int k = 0; k < 3; ++k) CHECK(middle[k] == e.data<std::int64_t>()[k + 1]);
    CHECK(lazy.bytes_read() == 8 + header_length + 48 + 24);
    std::int64_t from_whole[3] = {};
    whole.read_elements("e", 1, 3, Tensor::of(from_whole, {3}));
    CHECK(std::memcmp(middle, from_whole, sizeof middle) == 0);
    std::int64_t none[1] = {};
    lazy.read_elements("e", 5, 0, Tensor::of(none, {0}));
    CHECK(lazy.bytes_read() == 8 + header_length + 48 + 24);
}

TEST_CASE("safetensors on demand fails as a whole read does, and names a file that shrank", "[safetensors][errors]") {
    TempDir dir;
    const std::string bytes = read_bytes(write_good_file(dir));
    const auto cut = dir / "cut.st";
    // Every truncation and a byte too many: the same message either way (one
    // validation, the data section's size taken from the file's).
    for (std::size_t length = 0; length <= bytes.size() + 1; ++length) {
        write_bytes(cut, length <= bytes.size() ? std::string_view(bytes).substr(0, length) : bytes + "x");
        INFO("length " << length << " of " << bytes.size());
        CHECK(error_on_demand(cut) == error_of(cut));
    }
    CHECK(error_on_demand(dir / "none.st") == error_of(dir / "none.st"));
    CHECK(error_on_demand(dir.path()) == error_of(dir.path()));

    write_bytes(cut, bytes);
    const SafetensorsFile lazy(cut, loom::io::SafetensorsRead::on_demand);
    std::filesystem::resize_file(cut, bytes.size() - 8);
    std::int64_t two[2] = {};
    CHECK(message_of([&] { lazy.read_into("e", Tensor::of(two, {2})); }) ==
                      "checkpoint " + cut.string() + ": the file shrank from " + std::to_string(bytes.size()) + " to " +
                          std::to_string(bytes.size() - 8) + " bytes while being read");
    float floats[2] = {};
    CHECK(message_of([&] { lazy.read_elements("w", 0, 2, Tensor::of(floats, {2})); }) ==
                      "checkpoint " + cut.string() + ": tensor w has shape [3, 4]; elements are read by range from 1-D "
                                                     "tensors only");
    CHECK(message_of([&] { lazy.read_elements("e", 1, 2, Tensor::of(two, {2})); }) ==
                      "checkpoint " + cut.string() + ": elements [1, 3) of tensor e asked for; it has 2 (valid: within [0, 2))");
    CHECK(message_of([&] { lazy.read_elements("e", 0, 1, Tensor::of(two, {2})); }) ==
                      "checkpoint " + cut.string() + ": 1 elements of tensor e read into Tensor(i64, [2], host), which has 2");
}

}  // namespace LOOM_TEST_FILE
