// Where one rank keeps its parameters, gradients and AdamW moments, on the
// executor's device, as the strategy's parallel::Placement says: each array
// whole (the padded layout) or as this rank's blocks (the shard). ZeroShard<S>
// shards m and v from S = 1, the gradients from 2, the values at 3
// (Rajbhandari et al., arXiv 1910.02054); the store reads only the placement,
// plus the gradient and parameter slots the step program names (working
// space for one group at a time). The store also does what only depends on
// that placement: the serial run's initial values, the optimizer step on what
// this rank owns, and a checkpoint's dense arrays in and out. The executor
// decides when; the store knows where.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/tensor.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/placement.hpp"
#include "loom/parallel/shard_layout.hpp"

namespace loom::exec {

// Fills `out` with the model's initial values of its dense elements
// [first, first + out.size()) for `seed` (loom::initialize_range on the model).
using InitializeRange = std::function<void(std::uint64_t seed, std::span<float> out, std::int64_t first)>;

class ParameterStore {
public:
    ParameterStore() = default;
    // Sized for `layout` placed as `placement`, with the step program's slots,
    // on `where`; without `moments` (an optimizer outside the executor keeps
    // its own state) m and v stay empty and every call that reads them refuses.
    ParameterStore(const parallel::ShardLayout& layout, parallel::Placement placement, int grad_slot_count,
                   int param_slot_count, Device where, bool moments = true)
        : placement_(placement), device_(where), moments_(moments) {
        const std::int64_t padded = layout.padded_size(), shard = layout.shard_size();
        if (!placement.values_sharded) values = floats(padded);
        else value_shard = floats(shard);
        if (!placement.gradients_sharded) grads = floats(padded);
        else grad_shard = floats(shard);
        if (moments) {
            m = floats(placement.moments_sharded ? shard : padded);
            v = floats(placement.moments_sharded ? shard : padded);
        }
        for (int s = 0; s < grad_slot_count; ++s) grad_slots.push_back(floats(layout.largest_group()));
        for (int s = 0; s < param_slot_count; ++s) param_slots.push_back(floats(layout.largest_group()));
    }

    DeviceBuffer values, value_shard, grads, grad_shard, m, v;
    std::vector<DeviceBuffer> grad_slots, param_slots;

    [[nodiscard]] const parallel::Placement& placement() const noexcept { return placement_; }
    // Throws, naming `call`, when the store holds no AdamW moments.
    void check_moments(const char* call) const {
        LOOM_CHECK(moments_, call, ": this executor holds no optimizer state (ExecutorOptions::optimizer_state is ",
                   "false: an optimizer outside it keeps its own); gradient() and set_parameters() run without it");
    }
    // The gradients the backward writes and the optimizer reads: whole or this rank's shard.
    [[nodiscard]] const DeviceBuffer& gradient_array() const noexcept {
        return placement_.gradients_sharded ? grad_shard : grads;
    }

    [[nodiscard]] Device device() const noexcept { return device_; }
    // n floats of `b` from `offset`, as a tensor on the store's device.
    [[nodiscard]] Tensor slice(const DeviceBuffer& b, std::int64_t offset, std::int64_t n) const {
        return Tensor::of(b.data<float>() + offset, {n}, device_);
    }
    // n floats of scratch on the store's device.
    [[nodiscard]] DeviceBuffer floats(std::int64_t n) const { return DeviceBuffer(DType::f32, Shape{n}, device_); }

    // The serial run's initial values of what this rank keeps (every rank of
    // the shard group the same bits), and zero moments. On a device they are
    // drawn on the host and copied.
    void initialize(const parallel::ShardLayout& layout, int rank, std::uint64_t seed, const InitializeRange& init) {
        for (const auto& g : layout.groups()) {
            const bool block = placement_.values_sharded;
            const std::int64_t lo = block ? rank * g.block : 0;
            const std::int64_t hi = std::min(g.numel, block ? lo + g.block : g.numel);
            if (hi <= lo) continue;
            float* base = block ? value_shard.data<float>() + g.shard_offset : values.data<float>() + g.offset;
            const auto n = static_cast<std::size_t>(hi - lo);
            if (device_.kind == DeviceKind::host) {
                init(seed, {base, n}, g.dense_offset + lo);
                continue;
            }
            std::vector<float> staged(n);
            init(seed, staged, g.dense_offset + lo);
            copy_bytes(base, device_, staged.data(), host_device, n * sizeof(float));
        }
        fill_zero_bytes(m.raw(), device_, m.nbytes());
        fill_zero_bytes(v.raw(), device_, v.nbytes());
    }

    // AdamW step `step` on what this rank owns: everything when the moments
    // are whole, its blocks of every group when only they (and perhaps the
    // gradients) are sharded, its shards when everything is. On tensors: the
    // host's span update, or the device's kernel.
    void optimizer_step(const parallel::ShardLayout& layout, int rank, std::int64_t step,
                        const optim::AdamWConfig& adamw) {
        if (!placement_.moments_sharded) {
            optim::adamw_step(values.tensor(), grads.tensor(), m.tensor(), v.tensor(), step, adamw);
            return;
        }
        if (placement_.values_sharded) {
            optim::adamw_step(value_shard.tensor(), grad_shard.tensor(), m.tensor(), v.tensor(), step, adamw);
            return;
        }
        for (int gi = 0; gi < static_cast<int>(layout.groups().size()); ++gi) {
            const auto& g = layout.group(gi);
            const std::int64_t own = layout.block_offset(gi, rank);
            optim::adamw_step(slice(values, own, g.block),
                              !placement_.gradients_sharded ? slice(grads, own, g.block)
                                                            : slice(grad_shard, g.shard_offset, g.block),
                              slice(m, g.shard_offset, g.block), slice(v, g.shard_offset, g.block), step, adamw);
        }
    }

    // Values and moments from the dense (serial-order) arrays every rank
    // holds, keeping what this rank owns.
    void load(const parallel::ShardLayout& layout, int rank, std::span<const float> dense_values,
              std::span<const float> dense_m, std::span<const float> dense_v) {
        Buffer<Host> padded(DType::f32, Shape{layout.padded_size()});
        const std::span<float> whole(padded.data<float>(), static_cast<std::size_t>(padded.numel()));
        auto keep_blocks = [&](DeviceBuffer& sharded) {
            for (int gi = 0; gi < static_cast<int>(layout.groups().size()); ++gi) {
                const auto& g = layout.group(gi);
                copy_tensor(slice(sharded, g.shard_offset, g.block),
                            Tensor::of(whole.data() + layout.block_offset(gi, rank), {g.block}));
            }
        };
        layout.from_dense(dense_values, whole);
        if (placement_.values_sharded) keep_blocks(value_shard);
        else copy_tensor(values.tensor(), padded.tensor());
        for (auto [dense, state] : {std::pair{dense_m, &m}, std::pair{dense_v, &v}}) {
            layout.from_dense(dense, whole);
            if (!placement_.moments_sharded) copy_tensor(state->tensor(), padded.tensor());
            else keep_blocks(*state);
        }
    }

    // The elements [first, end) of group `g` this rank keeps of its values
    // (`moments` false) or of m and v: the whole group where the array is
    // whole, the rank's block (cut at the group's end) where it is sharded.
    [[nodiscard]] std::pair<std::int64_t, std::int64_t> kept(const parallel::ShardGroup& g, int rank,
                                                              bool moments) const {
        if (!by_block(moments)) return {0, g.numel};
        const std::int64_t first = std::min(g.numel, rank * g.block);
        return {first, std::min(g.numel, first + g.block)};
    }

    // Values and moments from just the elements this rank keeps (kept(),
    // group after group): what a sharded checkpoint's loader reads, so that
    // no rank needs the dense arrays. The same bits as load() from them.
    void load_kept(const parallel::ShardLayout& layout, int rank, std::span<const float> kept_values,
                   std::span<const float> kept_m, std::span<const float> kept_v) {
        const auto fill = [&](DeviceBuffer& target, std::span<const float> elements, bool moments) {
            Buffer<Host> staged(DType::f32, Shape{target.numel()});
            float* const base = staged.data<float>();
            std::fill(base, base + staged.numel(), 0.0f);  // the padding
            std::size_t at = 0;
            for (const auto& g : layout.groups()) {
                const auto [first, end] = kept(g, rank, moments);
                const std::int64_t to = by_block(moments) ? g.shard_offset + (first - rank * g.block) : g.offset + first;
                const auto n = static_cast<std::size_t>(end - first);
                LOOM_CHECK(at + n <= elements.size(), "ParameterStore::load_kept: ", elements.size(),
                           " elements for a rank that keeps more");
                std::copy_n(elements.begin() + static_cast<std::ptrdiff_t>(at), n, base + to);
                at += n;
            }
            LOOM_CHECK(at == elements.size(), "ParameterStore::load_kept: ", elements.size(),
                       " elements for a rank that keeps ", at);
            copy_tensor(target.tensor(), staged.tensor());
        };
        fill(placement_.values_sharded ? value_shard : values, kept_values, false);
        fill(m, kept_m, true);
        fill(v, kept_v, true);
    }

    // Every array whole only, for an optimizer that keeps its own
    // state (Executor::gradient): the values from the dense array, and the
    // gradient out into one. The moments are left as they are.
    void load_values(const parallel::ShardLayout& layout, std::span<const float> dense_values) {
        Buffer<Host> padded(DType::f32, Shape{device_.kind == DeviceKind::host ? 0 : layout.padded_size()});
        const std::span<float> whole = device_.kind == DeviceKind::host
                                           ? std::span<float>(values.data<float>(), static_cast<std::size_t>(values.numel()))
                                           : std::span<float>(padded.data<float>(), static_cast<std::size_t>(padded.numel()));
        layout.from_dense(dense_values, whole);
        if (device_.kind != DeviceKind::host) copy_tensor(values.tensor(), padded.tensor());
    }
    void gradient(const parallel::ShardLayout& layout, std::span<float> dense_grads) const {
        const Buffer<Host> padded(DType::f32, Shape{device_.kind == DeviceKind::host ? 0 : layout.padded_size()});
        layout.to_dense(on_host(grads, padded), dense_grads);
    }

    // Collective over `shards` (the group the layout shards over): the dense
    // arrays of values and moments, on every rank. Shards are gathered where
    // the communicator moves memory (the store's device), then read on the host.
    template <comm::Communicator C>
    void gather(const parallel::ShardLayout& layout, C& shards, std::span<float> dense_values,
                std::span<float> dense_m, std::span<float> dense_v) const {
        Buffer<Host> padded(DType::f32, Shape{layout.padded_size()});
        const DeviceBuffer gathered = placement_.all_whole() ? DeviceBuffer{} : floats(layout.padded_size());
        auto gather_into_padded = [&](const DeviceBuffer& sharded) {
            for (const auto& g : layout.groups())
                shards.all_gather(slice(sharded, g.shard_offset, g.block), slice(gathered, g.offset, g.padded));
            return on_host(gathered, padded);
        };
        const bool moments = placement_.moments_sharded;
        layout.to_dense(placement_.values_sharded ? gather_into_padded(value_shard) : on_host(values, padded), dense_values);
        layout.to_dense(moments ? gather_into_padded(m) : on_host(m, padded), dense_m);
        layout.to_dense(moments ? gather_into_padded(v) : on_host(v, padded), dense_v);
    }

    [[nodiscard]] std::int64_t parameter_bytes() const {
        return static_cast<std::int64_t>(values.nbytes() + value_shard.nbytes());
    }
    [[nodiscard]] std::int64_t gradient_bytes() const {
        return static_cast<std::int64_t>(grads.nbytes() + grad_shard.nbytes());
    }
    [[nodiscard]] std::int64_t optimizer_bytes() const { return static_cast<std::int64_t>(m.nbytes() + v.nbytes()); }
    [[nodiscard]] std::int64_t slot_bytes() const {
        std::int64_t sum = 0;
        for (const auto* slots : {&grad_slots, &param_slots})
            for (const auto& s : *slots) sum += static_cast<std::int64_t>(s.nbytes());
        return sum;
    }

private:
    // The elements of `b` readable on the host: itself, or a copy in
    // `scratch` (as large as b) when it lives on a device.
    [[nodiscard]] std::span<float> on_host(const DeviceBuffer& b, const Buffer<Host>& scratch) const {
        if (device_.kind == DeviceKind::host) return {b.data<float>(), static_cast<std::size_t>(b.numel())};
        copy_tensor(scratch.tensor(), b.tensor());
        return {scratch.data<float>(), static_cast<std::size_t>(scratch.numel())};
    }

    // Whether the rank keeps only its block of each group of this array.
    [[nodiscard]] bool by_block(bool moments) const noexcept {
        return moments ? placement_.moments_sharded : placement_.values_sharded;
    }

    parallel::Placement placement_{};
    Device device_ = host_device;
    bool moments_ = true;
};

}  // namespace loom::exec
