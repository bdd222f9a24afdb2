// ShardLayout: where every parameter element lives when a model trains on the
// ranks of a dp axis. The model's units are grouped (data parallel and ZeRO
// 1/2: buckets of consecutive units of about the bucket size, closed from the
// last unit backwards, since backward finishes them in that order; ZeRO-3: one
// group per unit, the grain of its gathers). Each group is one contiguous
// slice of a padded arena, its length rounded up to a multiple of 16 x ranks,
// so that rank r owns block r of every group, every block is 64-byte aligned
// and equally long: a reduce-scatter or all-gather of a group is one
// equal-count collective, with no copies, whatever the parameter counts.
// A rank's shard is its blocks of all groups, one after the other.
//
// Pipelines: a rank holds only some units, in segments (its virtual stages).
// `segment_of_unit` says which (-1: held elsewhere); groups never cross a
// segment, so every group is one contiguous run of the serial arena and a
// segment's reductions finish with its own backward. Grouping::per_segment
// (ZeroPP) makes one group of each segment: gathered once and reduced once
// per step. The dense size stays the whole model's; to_dense/from_dense touch
// only the groups held here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/nn/units.hpp"

namespace loom::parallel {

struct ShardGroup {
    int first_unit = 0, last_unit = 0;  // the units whose parameters it holds (inclusive)
    std::int64_t numel = 0;             // parameter elements
    std::int64_t dense_offset = 0;      // where they start in the serial (unpadded) arena
    std::int64_t offset = 0;            // where the group starts in the padded arena
    std::int64_t padded = 0;            // numel rounded up to a multiple of 16 x ranks
    std::int64_t block = 0;             // padded / ranks: what one rank owns
    std::int64_t shard_offset = 0;      // where the block sits in a rank's shard
};

enum class Grouping : std::uint8_t { buckets, per_unit, per_segment };

class ShardLayout {
public:
    ShardLayout(const std::vector<nn::Unit>& units, int ranks, Grouping grouping, std::int64_t bucket_bytes,
                const std::vector<int>& segment_of_unit = {})
        : ranks_(ranks) {
        LOOM_CHECK(ranks >= 1, "ShardLayout: ", ranks, " ranks; there must be at least one");
        LOOM_CHECK(bucket_bytes >= 1, "ShardLayout: bucket size ", bucket_bytes, " bytes; it must be at least 1");
        LOOM_CHECK(segment_of_unit.empty() || segment_of_unit.size() == units.size(), "ShardLayout: ",
                   segment_of_unit.size(), " segment entries for ", units.size(), " units");
        const auto segment = [&](std::size_t k) { return segment_of_unit.empty() ? 0 : segment_of_unit[k]; };
        unit_group_.assign(units.size(), -1);
        std::vector<std::int64_t> dense_start(units.size() + 1, 0);
        for (std::size_t k = 0; k < units.size(); ++k) dense_start[k + 1] = dense_start[k] + units[k].numel;
        // Close groups from the last unit backwards: backward finishes them in that order.
        std::vector<ShardGroup> reversed;
        ShardGroup open{};
        bool has_open = false;
        int open_segment = -1;
        for (std::size_t k = units.size(); k-- > 0;) {
            const std::int64_t n = units[k].numel;
            if (n == 0) continue;
            if (has_open && (segment(k) != open_segment || dense_start[k + 1] != dense_start[open.first_unit])) {
                reversed.push_back(open);  // a segment (or a gap of units held elsewhere) ends the group
                has_open = false;
            }
            if (segment(k) < 0) continue;
            if (!has_open) {
                open = ShardGroup{static_cast<int>(k), static_cast<int>(k), 0, 0, 0, 0, 0, 0};
                has_open = true;
                open_segment = segment(k);
            }
            open.first_unit = static_cast<int>(k);
            open.numel += n;
            if (grouping == Grouping::per_unit || (grouping == Grouping::buckets && open.numel * 4 >= bucket_bytes)) {
                reversed.push_back(open);
                has_open = false;
            }
        }
        if (has_open) reversed.push_back(open);
        groups_.assign(reversed.rbegin(), reversed.rend());

        const std::int64_t multiple = std::int64_t{16} * ranks;
        std::int64_t padded = 0, shard = 0;
        for (std::size_t g = 0; g < groups_.size(); ++g) {
            ShardGroup& group = groups_[g];
            group.dense_offset = dense_start[static_cast<std::size_t>(group.first_unit)];
            group.offset = padded;
            group.padded = (group.numel + multiple - 1) / multiple * multiple;
            group.block = group.padded / ranks;
            group.shard_offset = shard;
            padded += group.padded;
            shard += group.block;
            for (int u = group.first_unit; u <= group.last_unit; ++u)
                if (units[static_cast<std::size_t>(u)].numel > 0) unit_group_[static_cast<std::size_t>(u)] = static_cast<int>(g);
        }
        dense_size_ = dense_start.back();
        padded_size_ = padded;
        shard_size_ = shard;
    }

    [[nodiscard]] int ranks() const noexcept { return ranks_; }
    [[nodiscard]] const std::vector<ShardGroup>& groups() const noexcept { return groups_; }
    [[nodiscard]] const ShardGroup& group(int g) const { return groups_.at(static_cast<std::size_t>(g)); }
    // The group holding unit u's parameters; -1 for a unit without any.
    [[nodiscard]] int group_of_unit(int u) const { return unit_group_.at(static_cast<std::size_t>(u)); }
    [[nodiscard]] std::int64_t dense_size() const noexcept { return dense_size_; }    // the whole model's parameters
    [[nodiscard]] std::int64_t padded_size() const noexcept { return padded_size_; }  // the padded arena
    [[nodiscard]] std::int64_t shard_size() const noexcept { return shard_size_; }    // one rank's blocks
    [[nodiscard]] std::int64_t largest_group() const noexcept {
        std::int64_t largest = 0;
        for (const auto& g : groups_) largest = std::max(largest, g.padded);
        return largest;
    }

    // Rank r's block of group g within a padded array (arena or group buffer
    // starting at the group's offset, `group_relative`).
    [[nodiscard]] std::int64_t block_offset(int g, int rank) const { return group(g).offset + rank * group(g).block; }

    // Copies between the serial (dense) order and the padded arena; padding
    // is left untouched by to_dense and zeroed by from_dense.
    void to_dense(std::span<const float> padded, std::span<float> dense) const {
        check_sizes(padded.size(), dense.size());
        for (const auto& g : groups_)
            std::copy_n(padded.begin() + g.offset, g.numel, dense.begin() + g.dense_offset);
    }
    void from_dense(std::span<const float> dense, std::span<float> padded) const {
        check_sizes(padded.size(), dense.size());
        for (const auto& g : groups_) {
            std::copy_n(dense.begin() + g.dense_offset, g.numel, padded.begin() + g.offset);
            std::fill(padded.begin() + g.offset + g.numel, padded.begin() + g.offset + g.padded, 0.0f);
        }
    }

    friend std::ostream& operator<<(std::ostream& out, const ShardLayout& layout) {
        out << "ShardLayout(" << layout.groups_.size() << " groups over " << layout.ranks_ << " ranks, "
            << layout.dense_size_ << " parameters, padded " << layout.padded_size_ << ", shard "
            << layout.shard_size_ << ")";
        return out;
    }

private:
    void check_sizes(std::size_t padded, std::size_t dense) const {
        LOOM_CHECK(static_cast<std::int64_t>(padded) == padded_size_ && static_cast<std::int64_t>(dense) == dense_size_,
                   "ShardLayout: arrays of ", padded, " (padded) and ", dense, " (dense) elements; this layout has ",
                   padded_size_, " and ", dense_size_);
    }

    int ranks_;
    std::vector<ShardGroup> groups_;
    std::vector<int> unit_group_;
    std::int64_t dense_size_ = 0, padded_size_ = 0, shard_size_ = 0;
};

}  // namespace loom::parallel
