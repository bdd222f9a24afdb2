// The keys and values a decoder has computed, kept so that a new token's
// attention reads them instead of recomputing every earlier position: per
// layer, per sequence slot, the K and V rows of every position so far (f32,
// host memory).
//
// Paged, as vLLM's PagedAttention: memory is a pool of blocks of
// `block_size` positions, handed out from a free list as a sequence grows and
// returned when it is released, and each slot has a block table (its blocks
// in position order). A sequence grows without a copy, a short one holds only
// the blocks it uses, and the pool may hold fewer blocks than slots x
// capacity (more sequences than would fit at full length). One block table
// serves every layer: block b of layer l is the same positions as block b of
// layer 0.
//
// Layout: a block is `block_size` rows of 2C floats, the key in columns
// [0, C) and the value in [C, 2C) -- the packed K/V block ring attention
// passes around (nn/ring_attention.hpp), so the block kernels
// (kernels/attention_block_ops.hpp) read a block with ld_kv = 2C.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::infer {

class KvCache {
public:
    // `slots` sequences of at most `capacity` positions each, for a model of
    // `layers` attention layers of width `width` (all heads together), in
    // blocks of `block_size` positions; `blocks` in the pool (0: enough for
    // every slot at full capacity).
    KvCache(std::int64_t layers, std::int64_t width, std::int64_t slots, std::int64_t capacity,
            std::int64_t block_size = 16, std::int64_t blocks = 0)
        : layers_(layers), width_(width), slots_(slots), capacity_(capacity), block_size_(block_size) {
        LOOM_CHECK(layers >= 1, "KvCache: layers = ", layers, " must be at least 1");
        LOOM_CHECK(width >= 1, "KvCache: width = ", width, " must be at least 1");
        LOOM_CHECK(slots >= 1, "KvCache: slots = ", slots, " must be at least 1");
        LOOM_CHECK(capacity >= 1, "KvCache: capacity = ", capacity, " must be at least 1 position");
        LOOM_CHECK(block_size >= 1, "KvCache: block_size = ", block_size, " must be at least 1 position");
        LOOM_CHECK(blocks >= 0, "KvCache: blocks = ", blocks, " must be >= 0 (0: every slot at full capacity)");
        blocks_ = blocks == 0 ? slots * blocks_for(capacity) : blocks;
        LOOM_CHECK(blocks_ <= INT32_MAX, "KvCache: ", blocks_, " blocks is more than a block table's ", INT32_MAX,
                   "; use larger blocks");
        // Checked in floats before allocating, so a wrong size names itself instead of bad_alloc.
        const double floats = static_cast<double>(layers) * static_cast<double>(blocks_) *
                              static_cast<double>(block_size) * 2.0 * static_cast<double>(width);
        LOOM_CHECK(floats <= static_cast<double>(max_floats), "KvCache: ", layers, " layers x ", blocks_,
                   " blocks x ", block_size, " positions x 2 x ", width, " floats is more than the ", max_floats,
                   " floats (64 GiB) a host cache may hold; use fewer blocks or slots");
        storage_.assign(static_cast<std::size_t>(floats), 0.0f);
        lengths_.assign(static_cast<std::size_t>(slots), 0);
        tables_.resize(static_cast<std::size_t>(slots));
        for (std::int64_t b = blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));
    }

    [[nodiscard]] std::int64_t layers() const noexcept { return layers_; }
    [[nodiscard]] std::int64_t width() const noexcept { return width_; }
    [[nodiscard]] std::int64_t slots() const noexcept { return slots_; }
    [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
    [[nodiscard]] std::int64_t block_size() const noexcept { return block_size_; }
    [[nodiscard]] std::int64_t blocks() const noexcept { return blocks_; }
    [[nodiscard]] std::int64_t free_blocks() const noexcept { return static_cast<std::int64_t>(free_.size()); }
    // Floats between one position's row and the next (key and value side by side).
    [[nodiscard]] std::int64_t row_stride() const noexcept { return 2 * width_; }
    // Blocks that hold `positions` positions.
    [[nodiscard]] std::int64_t blocks_for(std::int64_t positions) const noexcept {
        return (positions + block_size_ - 1) / block_size_;
    }

    // Positions slot `slot` holds.
    [[nodiscard]] std::int64_t length(std::int64_t slot) const {
        check_slot(slot);
        return lengths_[static_cast<std::size_t>(slot)];
    }

    // The slot's blocks, in position order: block i holds positions [i * block_size, (i + 1) * block_size).
    [[nodiscard]] std::span<const std::int32_t> block_table(std::int64_t slot) const {
        check_slot(slot);
        return tables_[static_cast<std::size_t>(slot)];
    }

    // Makes room for `count` more positions of `slot` (blocks from the free
    // list as needed), which the caller then writes (row()) and attends over;
    // the length grows now. Throws, before anything changes, when they do not fit.
    void reserve(std::int64_t slot, std::int64_t count) {
        check_slot(slot);
        LOOM_CHECK(count >= 1, "KvCache: reserving ", count, " positions for slot ", slot, "; reserve at least 1");
        const std::int64_t held = lengths_[static_cast<std::size_t>(slot)];
        LOOM_CHECK(count <= capacity_ - held, "KvCache: slot ", slot, " holds ", held, " positions and ", count,
                   " more would exceed its capacity of ", capacity_,
                   "; shorten the prompt or the generation, or build the cache with a larger capacity");
        auto& table = tables_[static_cast<std::size_t>(slot)];
        const std::int64_t more = blocks_for(held + count) - static_cast<std::int64_t>(table.size());
        LOOM_CHECK(more <= free_blocks(), "KvCache: slot ", slot, " needs ", more, " more blocks of ", block_size_,
                   " positions but ", free_blocks(), " of the ", blocks_,
                   " are free; release a sequence or build the cache with more blocks");
        for (std::int64_t i = 0; i < more; ++i) {
            table.push_back(free_.back());
            free_.pop_back();
        }
        lengths_[static_cast<std::size_t>(slot)] = held + count;
    }

    // The slot keeps only its first `length` positions (at most what it
    // holds); blocks past them go back to the free list. Speculative decoding
    // drops the keys and values of rejected draft tokens this way; the rows
    // kept are untouched.
    void truncate(std::int64_t slot, std::int64_t length) {
        const std::int64_t held = this->length(slot);
        LOOM_CHECK(length >= 0 && length <= held, "KvCache: truncating slot ", slot, " to ", length,
                   " positions; it holds ", held, ", so give a length in [0, ", held, "]");
        auto& table = tables_[static_cast<std::size_t>(slot)];
        while (static_cast<std::int64_t>(table.size()) > blocks_for(length)) {
            free_.push_back(table.back());
            table.pop_back();
        }
        lengths_[static_cast<std::size_t>(slot)] = length;
    }

    // The slot keeps its first `base` positions and then, at base, base + 1,
    // ..., the rows of `positions` (ascending, each in [base, length)), in
    // every layer; the rest are dropped (truncate). A token tree verified in
    // one pass (infer/cape.hpp) is compacted to its accepted path this way.
    // A row already in its place is not copied: a path that is the tree's
    // leading chain costs no copy at all.
    void keep(std::int64_t slot, std::int64_t base, std::span<const std::int64_t> positions) {
        const std::int64_t held = this->length(slot);
        const auto count = static_cast<std::int64_t>(positions.size());
        LOOM_CHECK(base >= 0 && base + count <= held, "KvCache: keeping ", count, " positions after the first ", base,
                   " of slot ", slot, ", which holds ", held, "; give base + positions in [0, ", held, "]");
        for (std::int64_t i = 0; i < count; ++i) {
            const std::int64_t from = positions[static_cast<std::size_t>(i)];
            const std::int64_t least = i == 0 ? base : positions[static_cast<std::size_t>(i - 1)] + 1;
            LOOM_CHECK(from >= least && from < held, "KvCache: position ", from, " kept as ", base + i, " of slot ",
                       slot, " must be in [", least, ", ", held, ") (ascending, after base ", base, ")");
        }
        // Forward in order: the row written (base + i <= positions[i]) is never one still to be read.
        const auto floats = static_cast<std::size_t>(row_stride());
        for (std::int64_t i = 0; i < count; ++i) {
            const std::int64_t from = positions[static_cast<std::size_t>(i)];
            if (from == base + i) continue;
            for (std::int64_t l = 0; l < layers_; ++l)
                std::copy_n(row(l, slot, from), floats, row(l, slot, base + i));
        }
        truncate(slot, base + count);
    }

    // The slot is empty again; its blocks go back to the free list.
    void release(std::int64_t slot) {
        check_slot(slot);
        auto& table = tables_[static_cast<std::size_t>(slot)];
        for (auto b = table.rbegin(); b != table.rend(); ++b) free_.push_back(*b);
        table.clear();
        lengths_[static_cast<std::size_t>(slot)] = 0;
    }

    // The first row of block `block` of `layer`: keys, with the values C floats on.
    [[nodiscard]] float* block_rows(std::int64_t layer, std::int32_t block) {
        LOOM_CHECK(layer >= 0 && layer < layers_, "KvCache: layer ", layer, " is not in [0, ", layers_, ")");
        LOOM_CHECK(block >= 0 && block < blocks_, "KvCache: block ", block, " is not in [0, ", blocks_, ")");
        return storage_.data() + (layer * blocks_ + block) * block_size_ * row_stride();
    }

    // The row (key, then value) of position `position` of `slot` in `layer`; the position must be reserved.
    [[nodiscard]] float* row(std::int64_t layer, std::int64_t slot, std::int64_t position) {
        LOOM_CHECK(position >= 0 && position < length(slot), "KvCache: position ", position, " of slot ", slot,
                   " is not in [0, ", length(slot), "); reserve it first");
        const auto& table = tables_[static_cast<std::size_t>(slot)];
        const std::int32_t block = table[static_cast<std::size_t>(position / block_size_)];
        return block_rows(layer, block) + (position % block_size_) * row_stride();
    }

private:
    static constexpr std::int64_t max_floats = std::int64_t{16} << 30;

    void check_slot(std::int64_t slot) const {
        LOOM_CHECK(slot >= 0 && slot < slots_, "KvCache: slot ", slot, " is not in [0, ", slots_, ")");
    }

    std::int64_t layers_, width_, slots_, capacity_, block_size_, blocks_ = 0;
    std::vector<float> storage_;
    std::vector<std::int64_t> lengths_;
    std::vector<std::vector<std::int32_t>> tables_;
    std::vector<std::int32_t> free_;  // popped from the back: block 0 first
};

}  // namespace loom::infer
