// Reading a sharded checkpoint (exec/sharded_checkpoint.hpp) by the element:
// a rank asks for the whole-model elements it needs and reads only those
// bytes, so no rank holds, or even reads, the whole model.
//
// Each shard is opened on demand (io::SafetensorsRead::on_demand: its header,
// checked completely, and nothing else) and its runs tensor read once. A
// request is a list of sorted, disjoint (first, count) runs of whole-model
// indices; each shard's runs say where its elements are (element i of a
// tensor is at the i-th position of the runs, concatenated), so the reader
// intersects the two, merges what is adjacent in the file, and preads those
// ranges only. A shard whose runs miss the request is not read past its
// header and runs. Every element asked for must be found exactly once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/sharded_index.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/train/finite_check.hpp"

namespace loom::exec {

class ShardedReader {
public:
    ShardedReader(std::filesystem::path directory, const ShardedIndex& index)
        : directory_(std::move(directory)),
          where_("sharded checkpoint " + directory_.string()),
          parameters_(index.parameters),
          names_(index.shards),
          files_(index.shards.size()) {}

    [[nodiscard]] int shards() const noexcept { return static_cast<int>(names_.size()); }
    // Bytes read from the shards so far (headers included).
    [[nodiscard]] std::uint64_t bytes_read() const noexcept {
        std::uint64_t sum = 0;
        for (const auto& file : files_)
            if (file) sum += file->bytes_read();
        return sum;
    }

    [[nodiscard]] bool has(int shard, std::string_view name) { return file(shard).contains(name); }

    // All of the small 1-D tensor `name` (f32 or i64, as T) of one shard.
    template <class T>
    [[nodiscard]] std::vector<T> read_whole(int shard, std::string_view name) {
        static_assert(std::is_same_v<T, float> || std::is_same_v<T, std::int64_t>,
                      "ShardedReader::read_whole reads f32 (float) or i64 (std::int64_t) tensors");
        io::SafetensorsFile& f = file(shard);
        const DType type = f.dtype(name);
        const Shape& shape = f.shape(name);
        LOOM_CHECK(type == dtype_of<T> && shape.rank() == 1, where_, ": ", shard_name(shard), "'s tensor ", name,
                   " is ", type, " ", shape, "; expected 1-D ", dtype_of<T>);
        std::vector<T> out(static_cast<std::size_t>(shape[0]));
        f.read_elements(name, 0, shape[0], Tensor::of(out.data(), {shape[0]}));
        return out;
    }

    // Fills `out` with the elements `wanted` names ((first, count) pairs of
    // whole-model indices, sorted and disjoint; out.size() their total) of
    // the 1-D f32 tensor `name`, from the shards whose `runs_name` runs hold
    // them (a shard without `runs_name`, or whose runs place nothing and that
    // has no `name`, holds none). Values read are checked finite.
    void read(std::string_view name, std::string_view runs_name, std::span<const std::int64_t> wanted,
              std::span<float> out) {
        const std::vector<std::int64_t> at = check_wanted(wanted, out.size());
        std::vector<std::uint8_t> found(out.size(), 0);
        for (int s = 0; s < shards(); ++s) {
            io::SafetensorsFile& f = file(s);
            if (!f.contains(runs_name)) continue;
            const std::vector<std::int64_t>& runs = runs_of(s, runs_name);
            const std::int64_t count = runs_total(s, runs_name);
            if (count == 0 && !f.contains(name)) continue;  // it places nothing, so it need not hold the tensor
            LOOM_CHECK(f.contains(name) && f.dtype(name) == DType::f32 && f.shape(name) == Shape{count}, where_, ": ",
                       shard_name(s), "'s ", name, " is ",
                       f.contains(name) ? to_string(f.dtype(name)) + " " + to_string(f.shape(name)) : "missing",
                       "; its ", runs_name, " place ", count, " f32 elements");
            if (!runs.empty()) read_pieces(s, name, overlaps(runs, wanted, at), found, out);
        }
        for (std::size_t k = 0; k < found.size(); ++k)
            LOOM_CHECK(found[k] == 1, where_, ": element ", whole_of(k, wanted, at),
                       " of the model is in no shard; the checkpoint is incomplete");
    }

private:
    // A stretch of elements that are consecutive both in a shard's tensor
    // and in the output.
    struct Piece {
        std::int64_t in_shard = 0, in_out = 0, count = 0, whole = 0;
    };

    io::SafetensorsFile& file(int shard) {
        LOOM_CHECK(shard >= 0 && shard < shards(), where_, " has ", shards(), " shards; shard ", shard,
                   " is not one of them");
        auto& f = files_[static_cast<std::size_t>(shard)];
        if (!f) f.emplace(directory_ / names_[static_cast<std::size_t>(shard)], io::SafetensorsRead::on_demand);
        return *f;
    }

    [[nodiscard]] const std::string& shard_name(int shard) const { return names_[static_cast<std::size_t>(shard)]; }

    template <class T>
    [[nodiscard]] static std::string to_string(const T& x) {
        std::ostringstream text;
        text << x;
        return text.str();
    }

    // The shard's `runs_name` pairs, read and checked once (empty: it has none).
    const std::vector<std::int64_t>& runs_of(int shard, std::string_view runs_name) {
        const auto key = std::pair(shard, std::string(runs_name));
        if (const auto it = runs_.find(key); it != runs_.end()) return it->second;
        std::vector<std::int64_t> pairs;
        io::SafetensorsFile& f = file(shard);
        if (f.contains(runs_name)) {
            const Shape& shape = f.shape(runs_name);
            LOOM_CHECK(f.dtype(runs_name) == DType::i64 && shape.rank() == 2 && shape[1] == 2, where_, ": ",
                       shard_name(shard), "'s ", runs_name, " are ", f.dtype(runs_name), " ", shape,
                       "; expected i64 [R, 2]");
            pairs.resize(static_cast<std::size_t>(shape.numel()));
            f.read_into(runs_name, Tensor::of(pairs.data(), shape));
            for (std::size_t i = 0; i < pairs.size(); i += 2) {
                const std::int64_t first = pairs[i], length = pairs[i + 1];
                LOOM_CHECK(first >= 0 && length >= 0 && first <= parameters_ - length, where_, ": ", shard_name(shard),
                           " has a run of ", length, " elements from ", first, "; the model has ", parameters_);
            }
        }
        return runs_.emplace(key, std::move(pairs)).first->second;
    }

    [[nodiscard]] std::int64_t runs_total(int shard, std::string_view runs_name) {
        std::int64_t total = 0;
        const auto& runs = runs_of(shard, runs_name);
        for (std::size_t i = 1; i < runs.size(); i += 2) total += runs[i];
        return total;
    }

    // Where each wanted run starts in the output, after checking the request.
    [[nodiscard]] std::vector<std::int64_t> check_wanted(std::span<const std::int64_t> wanted, std::size_t out) const {
        LOOM_CHECK(wanted.size() % 2 == 0, where_, ": ", wanted.size(),
                   " numbers asked for; a request is (first, count) pairs");
        std::vector<std::int64_t> at;
        std::int64_t total = 0, end = 0;
        for (std::size_t i = 0; i < wanted.size(); i += 2) {
            const std::int64_t first = wanted[i], count = wanted[i + 1];
            LOOM_CHECK(count >= 0 && first >= end && first <= parameters_ - count, where_, ": run ", i / 2,
                       " asked for is ", count, " elements from ", first, "; runs must be sorted, disjoint and within the ",
                       parameters_, " elements of the model (the previous ends at ", end, ")");
            at.push_back(total);
            total += count;
            end = first + count;
        }
        LOOM_CHECK(static_cast<std::size_t>(total) == out, where_, ": ", total, " elements asked for into ", out);
        return at;
    }

    // The whole index of output element k.
    [[nodiscard]] static std::int64_t whole_of(std::size_t k, std::span<const std::int64_t> wanted,
                                               const std::vector<std::int64_t>& at) {
        const auto run = static_cast<std::size_t>(
            std::upper_bound(at.begin(), at.end(), static_cast<std::int64_t>(k)) - at.begin() - 1);
        return wanted[2 * run] + (static_cast<std::int64_t>(k) - at[run]);
    }

    // Where a shard's runs meet the request, in the shard's order.
    [[nodiscard]] static std::vector<Piece> overlaps(const std::vector<std::int64_t>& runs,
                                                     std::span<const std::int64_t> wanted,
                                                     const std::vector<std::int64_t>& at) {
        std::vector<Piece> pieces;
        const std::size_t wanted_runs = wanted.size() / 2;
        std::int64_t position = 0;
        for (std::size_t i = 0; i < runs.size(); position += runs[i + 1], i += 2) {
            const std::int64_t first = runs[i], end = first + runs[i + 1];
            // The first wanted run that ends after `first`.
            std::size_t lo = 0, hi = wanted_runs;
            while (lo < hi) {
                const std::size_t mid = (lo + hi) / 2;
                if (wanted[2 * mid] + wanted[2 * mid + 1] <= first) lo = mid + 1;
                else hi = mid;
            }
            for (std::size_t w = lo; w < wanted_runs && wanted[2 * w] < end; ++w) {
                const std::int64_t a = std::max(first, wanted[2 * w]);
                const std::int64_t b = std::min(end, wanted[2 * w] + wanted[2 * w + 1]);
                if (b > a) pieces.push_back({position + (a - first), at[w] + (a - wanted[2 * w]), b - a, a});
            }
        }
        return pieces;
    }

    // Marks the pieces found (each element once), then reads them: pieces
    // adjacent in the file are one pread, straight into `out` when they are
    // adjacent there too, else through a buffer.
    void read_pieces(int shard, std::string_view name, std::vector<Piece> pieces, std::vector<std::uint8_t>& found,
                     std::span<float> out) {
        for (const Piece& p : pieces)
            for (std::int64_t k = 0; k < p.count; ++k) {
                auto& seen = found[static_cast<std::size_t>(p.in_out + k)];
                LOOM_CHECK(seen == 0, where_, ": element ", p.whole + k, " is in two shards (", shard_name(shard),
                           " and an earlier one)");
                seen = 1;
            }
        std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.in_shard < b.in_shard; });
        io::SafetensorsFile& f = file(shard);
        std::vector<float> staged;
        for (std::size_t i = 0; i < pieces.size();) {
            std::size_t j = i + 1;
            bool straight = true;
            while (j < pieces.size() && pieces[j].in_shard == pieces[j - 1].in_shard + pieces[j - 1].count) {
                straight = straight && pieces[j].in_out == pieces[j - 1].in_out + pieces[j - 1].count;
                ++j;
            }
            const std::int64_t first = pieces[i].in_shard, count = pieces[j - 1].in_shard + pieces[j - 1].count - first;
            if (straight) {
                f.read_elements(name, first, count, Tensor::of(out.data() + pieces[i].in_out, {count}));
            } else {
                staged.resize(static_cast<std::size_t>(count));
                f.read_elements(name, first, count, Tensor::of(staged.data(), {count}));
                for (std::size_t k = i; k < j; ++k)
                    std::copy_n(staged.begin() + (pieces[k].in_shard - first), pieces[k].count,
                                out.begin() + pieces[k].in_out);
            }
            for (std::size_t k = i; k < j; ++k) check_finite(shard, name, pieces[k], out);
            i = j;
        }
    }

    // A diverged run's checkpoint must not be resumed.
    void check_finite(int shard, std::string_view name, const Piece& p, std::span<const float> out) const {
        const auto bad = train::first_non_finite(Tensor::of(out.data() + p.in_out, {p.count}));
        if (!bad) return;
        LOOM_FAIL(where_, ": tensor ", name, " holds ", train::detail::non_finite_name(bad->value), " at element ",
                  p.whole + static_cast<std::int64_t>(bad->index), " of the model (in ", shard_name(shard),
                  "); only finite values are valid");
    }

    std::filesystem::path directory_;
    std::string where_;  // "sharded checkpoint <directory>", the start of every message
    std::int64_t parameters_;
    std::vector<std::string> names_;
    std::vector<std::optional<io::SafetensorsFile>> files_;
    std::map<std::pair<int, std::string>, std::vector<std::int64_t>> runs_;
};

}  // namespace loom::exec
