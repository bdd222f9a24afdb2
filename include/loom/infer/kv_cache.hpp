// The keys and values a decoder has computed, kept so that a new token's
// attention reads them instead of recomputing every earlier position: per
// layer, per sequence slot, the K and V rows of every position so far (f32,
// host memory).
//
// This first slice is contiguous: each slot owns `capacity` positions from
// the start, so a sequence grows without a copy but a short one wastes the
// rest of its slot. The paged cache of issue 39 (fixed-size blocks handed out
// from a free list, a block table per sequence) replaces the slot's single
// run; the interface below (keys/values of a slot, length, reserve, release)
// is what the decoder needs from either.
//
// Layout: one run per (layer, slot) of `capacity` rows of 2C floats, the key
// in columns [0, C) and the value in [C, 2C) -- the packed K/V block ring
// attention passes around (nn/ring_attention.hpp), so the same block kernels
// (kernels/attention_block_ops.hpp) read it with ld_kv = 2C.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::infer {

class KvCache {
public:
    // `slots` sequences of at most `capacity` positions each, for a model of
    // `layers` attention layers of width `width` (all heads together).
    KvCache(std::int64_t layers, std::int64_t width, std::int64_t slots, std::int64_t capacity)
        : layers_(layers), width_(width), slots_(slots), capacity_(capacity) {
        LOOM_CHECK(layers >= 1, "KvCache: layers = ", layers, " must be at least 1");
        LOOM_CHECK(width >= 1, "KvCache: width = ", width, " must be at least 1");
        LOOM_CHECK(slots >= 1, "KvCache: slots = ", slots, " must be at least 1");
        LOOM_CHECK(capacity >= 1, "KvCache: capacity = ", capacity, " must be at least 1 position");
        // Checked in floats before allocating, so a wrong size names itself instead of bad_alloc.
        const double floats = static_cast<double>(layers) * static_cast<double>(slots) *
                              static_cast<double>(capacity) * 2.0 * static_cast<double>(width);
        LOOM_CHECK(floats <= static_cast<double>(max_floats), "KvCache: ", layers, " layers x ", slots, " slots x ",
                   capacity, " positions x 2 x ", width, " floats is more than the ", max_floats,
                   " floats (64 GiB) a host cache may hold; use fewer slots or a shorter capacity");
        storage_.assign(static_cast<std::size_t>(floats), 0.0f);
        lengths_.assign(static_cast<std::size_t>(slots), 0);
    }

    [[nodiscard]] std::int64_t layers() const noexcept { return layers_; }
    [[nodiscard]] std::int64_t width() const noexcept { return width_; }
    [[nodiscard]] std::int64_t slots() const noexcept { return slots_; }
    [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
    // Floats between one position's row and the next (key and value side by side).
    [[nodiscard]] std::int64_t row_stride() const noexcept { return 2 * width_; }
    [[nodiscard]] std::int64_t bytes() const noexcept {
        return static_cast<std::int64_t>(storage_.size() * sizeof(float));
    }

    // Positions slot `slot` holds.
    [[nodiscard]] std::int64_t length(std::int64_t slot) const {
        check_slot(slot);
        return lengths_[static_cast<std::size_t>(slot)];
    }

    // Makes room for `count` more positions of `slot`, which the caller
    // writes (keys(), values() at rows length() .. length() + count - 1) and
    // then attends over; the length grows now. Throws, before anything is
    // written, when they do not fit.
    void reserve(std::int64_t slot, std::int64_t count) {
        check_slot(slot);
        LOOM_CHECK(count >= 1, "KvCache: reserving ", count, " positions for slot ", slot, "; reserve at least 1");
        const std::int64_t held = lengths_[static_cast<std::size_t>(slot)];
        LOOM_CHECK(count <= capacity_ - held, "KvCache: slot ", slot, " holds ", held, " positions and ", count,
                   " more would exceed its capacity of ", capacity_,
                   "; shorten the prompt or the generation, or build the cache with a larger capacity");
        lengths_[static_cast<std::size_t>(slot)] = held + count;
    }

    // The slot is free again (its rows are overwritten by the next sequence).
    void release(std::int64_t slot) {
        check_slot(slot);
        lengths_[static_cast<std::size_t>(slot)] = 0;
    }

    // Row 0 of the keys of (layer, slot); rows are row_stride() apart.
    [[nodiscard]] float* keys(std::int64_t layer, std::int64_t slot) { return run(layer, slot); }
    [[nodiscard]] const float* keys(std::int64_t layer, std::int64_t slot) const {
        return const_cast<KvCache*>(this)->run(layer, slot);
    }
    // Row 0 of the values: the keys' rows, C floats on.
    [[nodiscard]] float* values(std::int64_t layer, std::int64_t slot) { return run(layer, slot) + width_; }
    [[nodiscard]] const float* values(std::int64_t layer, std::int64_t slot) const {
        return const_cast<KvCache*>(this)->run(layer, slot) + width_;
    }

private:
    static constexpr std::int64_t max_floats = std::int64_t{16} << 30;

    void check_slot(std::int64_t slot) const {
        LOOM_CHECK(slot >= 0 && slot < slots_, "KvCache: slot ", slot, " is not in [0, ", slots_, ")");
    }

    [[nodiscard]] float* run(std::int64_t layer, std::int64_t slot) {
        LOOM_CHECK(layer >= 0 && layer < layers_, "KvCache: layer ", layer, " is not in [0, ", layers_, ")");
        check_slot(slot);
        const std::int64_t at = ((layer * slots_ + slot) * capacity_) * row_stride();
        return storage_.data() + at;
    }

    std::int64_t layers_, width_, slots_, capacity_;
    std::vector<float> storage_;
    std::vector<std::int64_t> lengths_;
};

}  // namespace loom::infer
