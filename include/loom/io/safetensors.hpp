// Checkpoints in the safetensors format (github.com/huggingface/safetensors),
// so PyTorch, JAX and the Hugging Face tools read loom's weights directly:
//   u64 little-endian N | N bytes of JSON header, padded with spaces to a
//   multiple of 8 | the data section, every tensor's bytes back to back.
// The header maps each tensor name to {"dtype", "shape", "data_offsets"}
// (offsets relative to the data section) plus an optional "__metadata__"
// object of strings. A file is checked completely when it is opened, so a
// damaged checkpoint fails before any weight has been overwritten.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/core/buffer.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/io/atomic_file.hpp"
#include "loom/io/json.hpp"

namespace loom::io {

// The format stores raw little-endian bytes; a big-endian port would have to
// swap every element on the way in and out.
static_assert(std::endian::native == std::endian::little,
              "loom's safetensors code copies raw bytes and needs a little-endian host");

// A tensor and the name it is stored under. Host memory, contiguous.
struct NamedTensor {
    std::string name;
    loom::Tensor tensor;
};

class SafetensorsFile;

namespace safetensors {

// The Hugging Face reference implementation refuses headers above 100 MB;
// so do we, so that a corrupted length cannot ask for gigabytes.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

// The format's dtype spellings for the dtypes loom has.
[[nodiscard]] constexpr std::string_view dtype_name(DType type) {
    switch (type) {
        case DType::f32: return "F32";
        case DType::bf16: return "BF16";
        case DType::f16: return "F16";
        case DType::i32: return "I32";
        case DType::i64: return "I64";
    }
    return "?";
}

[[nodiscard]] constexpr std::optional<DType> parse_dtype_name(std::string_view text) {
    for (DType type : all_dtypes)
        if (dtype_name(type) == text) return type;
    return std::nullopt;
}

// "F32, BF16, F16, I32, I64", for messages.
[[nodiscard]] inline std::string valid_dtype_names() {
    std::string list;
    for (DType type : all_dtypes) list += (list.empty() ? "" : ", ") + std::string(dtype_name(type));
    return list;
}

// A header's "__metadata__": string keys and values, sorted by key, all in
// one buffer (16 bytes per entry beside the text: a header of a million
// tiny entries must not cost a million map nodes).
class Metadata {
public:
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }

    // The value under `key`, or nullopt.
    [[nodiscard]] std::optional<std::string_view> find(std::string_view key) const {
        const auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                                         [&](const Entry& e, std::string_view k) { return key_of(e) < k; });
        if (it == entries_.end() || key_of(*it) != key) return std::nullopt;
        return value_of(*it);
    }
    [[nodiscard]] bool contains(std::string_view key) const { return find(key).has_value(); }

    // Calls f(key, value) in key order.
    template <class F>
    void for_each(F&& f) const {
        for (const Entry& e : entries_) f(key_of(e), value_of(e));
    }

    // As the map save_safetensors takes.
    [[nodiscard]] std::map<std::string, std::string> to_map() const {
        std::map<std::string, std::string> out;
        for (const Entry& e : entries_) out.emplace(key_of(e), value_of(e));
        return out;
    }

private:
    friend class io::SafetensorsFile;
    struct Entry {
        std::uint32_t key_begin = 0, key_size = 0, value_begin = 0, value_size = 0;
    };
    [[nodiscard]] std::string_view key_of(const Entry& e) const noexcept { return {text_.data() + e.key_begin, e.key_size}; }
    [[nodiscard]] std::string_view value_of(const Entry& e) const noexcept {
        return {text_.data() + e.value_begin, e.value_size};
    }

    std::string text_;
    std::vector<Entry> entries_;
};

}  // namespace safetensors

namespace detail {

// 64-byte aligned bytes from the host allocator, so every tensor that starts
// on a multiple of its element size inside the file is aligned in memory too.
struct AlignedDelete {
    std::size_t bytes = 0;
    void operator()(std::byte* p) const noexcept { Allocator<Host>::deallocate(p, bytes, host_device); }
};
using AlignedBytes = std::unique_ptr<std::byte, AlignedDelete>;

[[nodiscard]] inline AlignedBytes allocate_aligned(std::size_t bytes) {
    return AlignedBytes(static_cast<std::byte*>(Allocator<Host>::allocate(bytes, host_device)), AlignedDelete{bytes});
}

// "[2, 3]" for a list of extents as the header spells them.
[[nodiscard]] inline std::string shape_json(const Shape& shape) {
    std::string out = "[";
    for (int i = 0; i < shape.rank(); ++i) {
        if (i) out += ',';
        out += std::to_string(shape[i]);  // appended separately: GCC 12's -Wrestrict misfires on "," + string
    }
    out += ']';
    return out;
}

// True when `text` is valid UTF-8 (a JSON string must be, or Python's
// json.loads rejects the whole header): the parser checks it for us.
[[nodiscard]] inline bool is_valid_utf8(std::string_view text) {
    std::string error;
    return json::parse(json::quote(text), error).has_value();
}

}  // namespace detail

// Writes `tensors` (in the order given) and `metadata` to `path`, replacing
// any old file atomically. The header is compact JSON with "__metadata__"
// first (omitted when empty), then each tensor as
// {"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}, padded with spaces to a
// multiple of 8 bytes so that the data section starts 8-byte aligned.
inline void save_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
    const std::string file = path.string();
    std::vector<std::string> members;
    if (!metadata.empty()) {
        std::string object = "{";
        for (const auto& [key, value] : metadata) {
            LOOM_CHECK(detail::is_valid_utf8(key) && detail::is_valid_utf8(value), "checkpoint ", file,
                       ": metadata entry ", json::quote(key), " is not valid UTF-8; safetensors headers are UTF-8 JSON");
            object += (object.size() > 1 ? "," : "") + json::quote(key) + ":" + json::quote(value);
        }
        members.push_back(json::quote("__metadata__") + ":" + object + "}");
    }

    std::map<std::string_view, std::size_t> seen;
    std::uint64_t offset = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const auto& [name, tensor] = tensors[i];
        LOOM_CHECK(!name.empty(), "checkpoint ", file, ": tensor ", i, " has an empty name");
        LOOM_CHECK(name != "__metadata__", "checkpoint ", file,
                   ": a tensor may not be named __metadata__; the format reserves that key");
        LOOM_CHECK(detail::is_valid_utf8(name), "checkpoint ", file, ": tensor name ", json::quote(name),
                   " is not valid UTF-8; safetensors headers are UTF-8 JSON");
        const auto [previous, inserted] = seen.emplace(name, i);
        LOOM_CHECK(inserted, "checkpoint ", file, ": tensors ", previous->second, " and ", i, " are both named ", name,
                   "; names must be unique");
        LOOM_CHECK(tensor.device().kind == DeviceKind::host, "checkpoint ", file, ": tensor ", name, " is ", tensor,
                   "; copy it to the host before saving");
        LOOM_CHECK(tensor.is_contiguous(), "checkpoint ", file, ": tensor ", name, " with strides ", tensor.strides(),
                   " is not contiguous; save a contiguous copy");
        LOOM_CHECK(tensor.defined(), "checkpoint ", file, ": tensor ", name, " has ", tensor.numel(),
                   " elements but no data");
        const std::uint64_t end = offset + tensor.nbytes();
        members.push_back(json::quote(name) + ":{\"dtype\":\"" + std::string(safetensors::dtype_name(tensor.dtype())) +
                          "\",\"shape\":" + detail::shape_json(tensor.shape()) + ",\"data_offsets\":[" +
                          std::to_string(offset) + "," + std::to_string(end) + "]}");
        offset = end;
    }

    std::string header = "{";
    for (std::size_t i = 0; i < members.size(); ++i) header += (i ? "," : "") + members[i];
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');

    write_file_atomically(path, [&](AtomicFile& out) {
        std::uint64_t length = header.size();
        std::byte length_bytes[8];
        std::memcpy(length_bytes, &length, sizeof length);  // little-endian host, checked above
        out.write(std::span<const std::byte>(length_bytes));
        out.write(header);
        for (const NamedTensor& named : tensors)
            if (named.tensor.nbytes() > 0)
                out.write(std::span<const std::byte>(static_cast<const std::byte*>(named.tensor.raw()),
                                                     named.tensor.nbytes()));
    });
}

// How a SafetensorsFile reads: the whole file into memory at once (views of
// every tensor, no further reads), or only the header, then each tensor's
// bytes on demand with pread (a shard of a model larger than this host's
// memory, of which a rank needs a part).
enum class SafetensorsRead : std::uint8_t { whole_file, on_demand };

// A safetensors file validated completely up front: header length, JSON,
// every field, dtype, shape, and that the tensors' byte ranges tile the data
// section exactly (no gaps, no overlaps, nothing after the last tensor: the
// spec forbids unindexed bytes so files cannot smuggle data), the data
// section's size taken from the file's. Read whole, or on demand (the header
// only, tensors' byte ranges later: read_into, read_elements). Every problem
// is one loom::Error "checkpoint <path>: <what>".
class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::filesystem::path& path, SafetensorsRead how = SafetensorsRead::whole_file)
        : path_(path), label_("checkpoint " + path.string()), on_demand_(how == SafetensorsRead::on_demand) {
        FileHandle file = open_regular_file();
        if (on_demand_) {
            read_header_on_demand(file);
            file_ = std::move(file);
        } else {
            read_whole_file(file);
            parse_and_validate(std::string_view(reinterpret_cast<const char*>(bytes_.get()) + 8, header_length_));
        }
    }

    SafetensorsFile(SafetensorsFile&&) = default;
    SafetensorsFile& operator=(SafetensorsFile&&) = default;

    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
    [[nodiscard]] const safetensors::Metadata& metadata() const noexcept { return metadata_; }
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    [[nodiscard]] bool reads_on_demand() const noexcept { return on_demand_; }
    // Bytes read from the file so far: all of it when read whole; the header
    // and the ranges asked for when read on demand.
    [[nodiscard]] std::uint64_t bytes_read() const noexcept { return bytes_read_; }

    // Tensor names in the order the header lists them.
    [[nodiscard]] std::vector<std::string> names() const {
        std::vector<std::string> result;
        result.reserve(entries_.size());
        for (const Entry& entry : entries_) result.emplace_back(name_of(entry));
        return result;
    }

    [[nodiscard]] bool contains(std::string_view name) const { return lookup(name) != nullptr; }
    // What the header says of tensor `name` (no data is read).
    [[nodiscard]] DType dtype(std::string_view name) const { return find(name).dtype; }
    [[nodiscard]] const Shape& shape(std::string_view name) const { return find(name).shape; }

    // A read-only view of the tensor's bytes in this object's memory (valid
    // while it lives). Do not write through it. Read whole only.
    [[nodiscard]] Tensor tensor(std::string_view name) const {
        const Entry& entry = find(name);
        LOOM_CHECK(!on_demand_, label_, ": tensor ", name,
                   " is not in memory (the file is read on demand); use read_into or read_elements");
        return Tensor(entry.data, entry.dtype, entry.shape);
    }

    // Copies tensor `name` into `into` (host, contiguous) after checking that
    // dtype and shape match exactly; no conversion happens behind the caller's back.
    void read_into(std::string_view name, const Tensor& into) const {
        const Entry& entry = find(name);
        check_target(name, into);
        LOOM_CHECK(into.dtype() == entry.dtype, label_, ": tensor ", name, " holds ", entry.dtype,
                   " but the model expects ", into.dtype());
        LOOM_CHECK(into.shape() == entry.shape, label_, ": tensor ", name, " has shape ", entry.shape,
                   " but the model expects ", into.shape());
        copy_bytes_of(entry, 0, into);
    }

    // Copies elements [first, first + count) of the 1-D tensor `name` into
    // `into` (host, contiguous, `count` elements of the tensor's dtype):
    // on demand, one pread of just those bytes.
    void read_elements(std::string_view name, std::int64_t first, std::int64_t count, const Tensor& into) const {
        const Entry& entry = find(name);
        check_target(name, into);
        LOOM_CHECK(entry.shape.rank() == 1, label_, ": tensor ", name, " has shape ", entry.shape,
                   "; elements are read by range from 1-D tensors only");
        LOOM_CHECK(into.dtype() == entry.dtype, label_, ": tensor ", name, " holds ", entry.dtype,
                   " but the elements are read as ", into.dtype());
        const std::int64_t n = entry.shape[0];
        LOOM_CHECK(first >= 0 && count >= 0 && first <= n - count, label_, ": elements [", first, ", ", first + count,
                   ") of tensor ", name, " asked for; it has ", n, " (valid: within [0, ", n, "))");
        LOOM_CHECK(into.numel() == count, label_, ": ", count, " elements of tensor ", name, " read into ", into,
                   ", which has ", into.numel());
        copy_bytes_of(entry, static_cast<std::uint64_t>(first) * size_of(entry.dtype), into);
    }

private:
    // Compact, because a 100 MB header may describe millions of tensors:
    // the name lives in names_, the index is a sorted list of positions.
    struct Entry {
        std::uint32_t name_begin = 0;  // in names_
        std::uint32_t name_size = 0;
        DType dtype = DType::f32;
        Shape shape;
        std::uint64_t begin = 0;  // data_offsets, relative to the data section
        std::uint64_t end = 0;
        std::byte* data = nullptr;  // read whole: in bytes_ (or realigned_)
    };

    // An open file descriptor, closed when the owner goes (movable with the file).
    struct FileHandle {
        int fd = -1;
        FileHandle() = default;
        explicit FileHandle(int descriptor) noexcept : fd(descriptor) {}
        FileHandle(FileHandle&& other) noexcept : fd(std::exchange(other.fd, -1)) {}
        FileHandle& operator=(FileHandle&& other) noexcept {
            if (this != &other) {
                if (fd >= 0) ::close(fd);
                fd = std::exchange(other.fd, -1);
            }
            return *this;
        }
        FileHandle(const FileHandle&) = delete;
        FileHandle& operator=(const FileHandle&) = delete;
        ~FileHandle() {
            if (fd >= 0) ::close(fd);
        }
    };

    [[nodiscard]] std::string_view name_of(const Entry& entry) const noexcept {
        return {names_.data() + entry.name_begin, entry.name_size};
    }

    [[nodiscard]] const Entry* lookup(std::string_view name) const {
        const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name, [&](std::uint32_t i, std::string_view n) {
            return name_of(entries_[i]) < n;
        });
        if (it == by_name_.end() || name_of(entries_[*it]) != name) return nullptr;
        return &entries_[*it];
    }

    const Entry& find(std::string_view name) const {
        if (const Entry* found = lookup(name)) return *found;
        // Name a few tensors that do exist: the usual cause is a renamed
        // layer or a checkpoint from another model.
        std::string some;
        const std::size_t shown = std::min<std::size_t>(entries_.size(), 5);
        for (std::size_t i = 0; i < shown; ++i) {
            if (i) some += ", ";
            some += name_of(entries_[i]);
        }
        if (entries_.empty()) LOOM_FAIL(label_, " has no tensor ", name, "; it holds no tensors at all");
        LOOM_FAIL(label_, " has no tensor ", name, "; it holds ", entries_.size(),
                  entries_.size() == 1 ? " tensor: " : " tensors: ", some,
                  entries_.size() > shown ? ", ..." : "");
    }

    void check_target(std::string_view name, const Tensor& into) const {
        LOOM_CHECK(into.device().kind == DeviceKind::host, label_, ": cannot read tensor ", name, " into ", into,
                   "; the target must be in host memory");
        LOOM_CHECK(into.is_contiguous(), label_, ": cannot read tensor ", name, " into a non-contiguous ", into,
                   " with strides ", into.strides());
        LOOM_CHECK(into.defined(), label_, ": cannot read tensor ", name, " into ", into, ", which has no memory");
    }

    // into.nbytes() bytes of `entry` from byte `skip` of it (checked by the caller).
    void copy_bytes_of(const Entry& entry, std::uint64_t skip, const Tensor& into) const {
        if (into.nbytes() == 0) return;
        if (!on_demand_) {
            std::memcpy(into.raw(), entry.data + skip, into.nbytes());
            return;
        }
        read_at(8 + header_length_ + entry.begin + skip, static_cast<std::byte*>(into.raw()), into.nbytes());
    }

    [[nodiscard]] FileHandle open_regular_file() {
        FileHandle file(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
        if (file.fd < 0) {
            const int error = errno;
            LOOM_FAIL(label_, ": cannot open: ", detail::errno_text(error));
        }
        struct ::stat status {};
        if (::fstat(file.fd, &status) != 0) {
            const int error = errno;
            LOOM_FAIL(label_, ": cannot stat: ", detail::errno_text(error));
        }
        LOOM_CHECK(S_ISREG(status.st_mode), label_, ": is not a regular file");
        size_ = static_cast<std::size_t>(status.st_size);
        LOOM_CHECK(size_ > 0, label_, ": the file is empty; a safetensors file starts with an 8-byte header length");
        return file;
    }

    // `bytes` bytes from `offset` of the file (pread: no shared position, so
    // a const read), through interruptions and short reads.
    void read_at(std::uint64_t offset, std::byte* into, std::size_t bytes, int fd = -1) const {
        if (fd < 0) fd = file_.fd;
        std::size_t done = 0;
        while (done < bytes) {
            const ::ssize_t got = ::pread(fd, into + done, bytes - done, static_cast<::off_t>(offset + done));
            if (got < 0) {
                const int error = errno;
                if (error == EINTR) continue;
                LOOM_FAIL(label_, ": cannot read: ", detail::errno_text(error));
            }
            LOOM_CHECK(got > 0, label_, ": the file shrank from ", size_, " to ", offset + done,
                       " bytes while being read");
            done += static_cast<std::size_t>(got);
        }
        bytes_read_ += bytes;
    }

    void read_whole_file(const FileHandle& file) {
        bytes_ = detail::allocate_aligned(size_);
        read_at(0, bytes_.get(), size_, file.fd);
        if (size_ >= 8) std::memcpy(&header_length_, bytes_.get(), sizeof header_length_);
        check_header_length();
    }

    void read_header_on_demand(const FileHandle& file) {
        if (size_ >= 8) read_at(0, reinterpret_cast<std::byte*>(&header_length_), sizeof header_length_, file.fd);
        check_header_length();
        std::string header(static_cast<std::size_t>(header_length_), '\0');
        read_at(8, reinterpret_cast<std::byte*>(header.data()), header.size(), file.fd);
        parse_and_validate(header);
    }

    void check_header_length() const {
        LOOM_CHECK(size_ >= 8, label_, ": the file has ", size_,
                   " bytes, fewer than the 8-byte header length every safetensors file starts with");
        LOOM_CHECK(header_length_ <= size_ - 8, label_, ": the header length ", header_length_,
                   " reaches beyond the end of the file (", size_, " bytes, so at most ", size_ - 8, ")");
        LOOM_CHECK(header_length_ <= safetensors::max_header_bytes, label_, ": the header length ", header_length_,
                   " exceeds the format's limit of ", safetensors::max_header_bytes, " bytes");
    }

    // The header (after its length, checked) against a data section of the
    // rest of the file; read whole, each entry then points into bytes_.
    void parse_and_validate(std::string_view header) {
        LOOM_CHECK(!header.empty() && header.front() == '{', label_,
                   ": the header does not start with '{'; this is not a safetensors file");

        const std::uint64_t data_size = size_ - 8 - header_length_;
        {
            // The parsed header lives only while the entries are read from it.
            std::string why;
            const std::optional<json::Document> parsed = json::parse(header, why);
            LOOM_CHECK(parsed.has_value(), label_, ": the header is not valid JSON: ", why, " of the header");
            const json::Value root = parsed->root();
            LOOM_CHECK(root.is_object(), label_, ": the header is ", json::kind_name(root.kind()), ", not an object");
            // Exact sizes up front: a growing vector's peak is three times its contents.
            std::size_t name_bytes = 0;
            for (const json::Member& member : root.members())
                if (member.key != "__metadata__") name_bytes += member.key.size();
            names_.reserve(name_bytes);
            entries_.reserve(root.size());
            for (const json::Member& member : root.members()) {
                if (member.key == "__metadata__") read_metadata(member.value);
                else entries_.push_back(read_entry(member.key, member.value, data_size));
            }
        }
        check_coverage(data_size);

        by_name_.resize(entries_.size());
        std::iota(by_name_.begin(), by_name_.end(), std::uint32_t{0});
        std::sort(by_name_.begin(), by_name_.end(),
                  [&](std::uint32_t a, std::uint32_t b) { return name_of(entries_[a]) < name_of(entries_[b]); });
        if (on_demand_) return;
        std::byte* const data = bytes_.get() + 8 + header_length_;
        for (Entry& entry : entries_) {
            entry.data = data + entry.begin;
            // Like a Buffer of zero elements, an empty tensor points nowhere
            // (rather than at a possibly misaligned spot between neighbours).
            if (entry.end == entry.begin) entry.data = nullptr;
            // The data section starts 8-aligned in a 64-aligned buffer, so a
            // tensor is aligned unless the writer placed it at an odd offset
            // (legal: the spec does not require alignment). Typed access to a
            // misaligned float is undefined, so such a tensor gets its own copy.
            if (entry.begin % size_of(entry.dtype) != 0 && entry.end > entry.begin) {
                const auto bytes = static_cast<std::size_t>(entry.end - entry.begin);
                detail::AlignedBytes copy = detail::allocate_aligned(bytes);
                std::memcpy(copy.get(), entry.data, bytes);
                entry.data = copy.get();
                realigned_.push_back(std::move(copy));
            }
        }
    }
    void read_metadata(const json::Value& value) {
        LOOM_CHECK(value.is_object(), label_, ": __metadata__ is ", json::kind_name(value.kind()),
                   "; it must be an object of strings");
        std::size_t bytes = 0;
        for (const json::Member& member : value.members()) {
            LOOM_CHECK(member.value.is_string(), label_, ": __metadata__ entry ", json::quote(member.key), " is ",
                       json::kind_name(member.value.kind()), "; metadata values must be strings");
            bytes += member.key.size() + member.value.text().size();
        }
        std::string& text = metadata_.text_;
        text.reserve(bytes);
        metadata_.entries_.reserve(value.size());
        for (const json::Member& member : value.members()) {
            safetensors::Metadata::Entry entry;
            entry.key_begin = static_cast<std::uint32_t>(text.size());
            entry.key_size = static_cast<std::uint32_t>(member.key.size());
            text += member.key;
            entry.value_begin = static_cast<std::uint32_t>(text.size());
            entry.value_size = static_cast<std::uint32_t>(member.value.text().size());
            text += member.value.text();
            metadata_.entries_.push_back(entry);
        }
        // Keys are unique (the JSON reader refuses a repeated key).
        std::sort(metadata_.entries_.begin(), metadata_.entries_.end(),
                  [&](const auto& a, const auto& b) { return metadata_.key_of(a) < metadata_.key_of(b); });
    }

    Entry read_entry(std::string_view name, const json::Value& value, std::uint64_t data_size) {
        const std::string what = label_ + ": tensor " + std::string(name);
        LOOM_CHECK(value.is_object(), what, " is described by ", json::kind_name(value.kind()),
                   "; expected an object with dtype, shape and data_offsets");
        std::optional<json::Value> dtype, shape, offsets;
        for (const json::Member& field : value.members()) {
            if (field.key == "dtype") dtype = field.value;
            else if (field.key == "shape") shape = field.value;
            else if (field.key == "data_offsets") offsets = field.value;
            else
                LOOM_FAIL(what, " has the unknown field ", json::quote(field.key),
                          "; valid fields are dtype, shape and data_offsets");
        }
        LOOM_CHECK(dtype && shape && offsets, what, " lacks the field ",
                   !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

        Entry entry;
        LOOM_CHECK(dtype->is_string(), what, " has a dtype that is ", json::kind_name(dtype->kind()), ", not a string");
        const std::optional<DType> type = safetensors::parse_dtype_name(dtype->text());
        LOOM_CHECK(type.has_value(), what, " has the dtype ", json::quote(dtype->text()),
                   ", which loom does not support; supported are ", safetensors::valid_dtype_names());
        entry.dtype = *type;

        LOOM_CHECK(shape->is_array(), what, " has a shape that is ", json::kind_name(shape->kind()), ", not an array");
        LOOM_CHECK(shape->size() <= static_cast<std::size_t>(Shape::max_rank), what, " has ", shape->size(),
                   " dimensions; loom tensors have at most ", Shape::max_rank);
        std::int64_t dims[Shape::max_rank] = {};
        std::size_t rank = 0;
        std::uint64_t numel = 1;
        for (const json::Value extent : shape->items()) {
            const std::optional<std::uint64_t> dim = extent.as_uint64();
            LOOM_CHECK(dim.has_value(), what, " has the shape entry ",
                       extent.is_number() ? std::string(extent.text()) : std::string(json::kind_name(extent.kind())),
                       "; extents must be non-negative integers");
            // Bounded so that no order of the extents overflows Shape's product.
            LOOM_CHECK(*dim == 0 || numel <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / *dim,
                       what, " has a shape whose extents multiply past 2^63 - 1");
            if (*dim != 0) numel *= *dim;
            dims[rank++] = static_cast<std::int64_t>(*dim);
        }
        entry.shape = Shape(dims, dims + rank);

        LOOM_CHECK(offsets->is_array() && offsets->size() == 2 && offsets->item(0).as_uint64() &&
                       offsets->item(1).as_uint64(),
                   what, " has data_offsets that are not two non-negative integers [begin, end]");
        entry.begin = *offsets->item(0).as_uint64();
        entry.end = *offsets->item(1).as_uint64();
        LOOM_CHECK(entry.begin <= entry.end, what, " has data_offsets [", entry.begin, ", ", entry.end,
                   "] whose begin is after its end");
        LOOM_CHECK(entry.end <= data_size, what, " has data_offsets [", entry.begin, ", ", entry.end,
                   "] but the data section has only ", data_size, " bytes");
        const auto element_count = static_cast<std::uint64_t>(entry.shape.numel());
        const std::uint64_t element_size = size_of(entry.dtype);
        LOOM_CHECK(element_count <= std::numeric_limits<std::uint64_t>::max() / element_size &&
                       entry.end - entry.begin == element_count * element_size,
                   what, " has data_offsets [", entry.begin, ", ", entry.end, "], ", entry.end - entry.begin,
                   " bytes, but ", safetensors::dtype_name(entry.dtype), " ", entry.shape, " needs ",
                   element_count, " x ", element_size, " bytes");
        entry.name_begin = static_cast<std::uint32_t>(names_.size());
        entry.name_size = static_cast<std::uint32_t>(name.size());
        names_ += name;
        return entry;
    }

    // The byte ranges, sorted, must follow each other from 0 to the end of
    // the data section without a gap or an overlap.
    void check_coverage(std::uint64_t data_size) const {
        std::vector<std::uint32_t> order(entries_.size());
        std::iota(order.begin(), order.end(), std::uint32_t{0});
        std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
            return std::tuple(entries_[a].begin, entries_[a].end, a) < std::tuple(entries_[b].begin, entries_[b].end, b);
        });
        std::uint64_t covered = 0;
        const Entry* previous = nullptr;
        for (std::uint32_t i : order) {
            const Entry& entry = entries_[i];
            LOOM_CHECK(entry.begin >= covered, label_, ": tensors ", name_of(*previous), " [", previous->begin, ", ",
                       previous->end, "] and ", name_of(entry), " [", entry.begin, ", ", entry.end,
                       "] overlap; each byte of the data section belongs to exactly one tensor");
            LOOM_CHECK(entry.begin == covered, label_, ": bytes [", covered, ", ", entry.begin,
                       ") of the data section belong to no tensor (a hole before ", name_of(entry), ")");
            covered = entry.end;
            previous = &entry;
        }
        LOOM_CHECK(covered == data_size, label_, ": the data section has ", data_size, " bytes but the tensors cover only ",
                   covered, "; bytes after the last tensor are not allowed");
    }

    std::filesystem::path path_;
    std::string label_;  // "checkpoint <path>", the start of every message
    bool on_demand_ = false;
    std::size_t size_ = 0;  // the file's, when opened
    std::uint64_t header_length_ = 0;
    mutable std::uint64_t bytes_read_ = 0;
    FileHandle file_;             // read on demand: open while this lives
    detail::AlignedBytes bytes_;  // read whole: the file
    std::vector<detail::AlignedBytes> realigned_;
    std::vector<Entry> entries_;
    std::string names_;                  // every tensor's name, back to back
    std::vector<std::uint32_t> by_name_;  // entries_ positions sorted by name
    safetensors::Metadata metadata_;
};

}  // namespace loom::io
