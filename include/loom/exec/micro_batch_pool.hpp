// The micro-batches in flight on one rank: a context (activation memory and
// saved layer state) for every (chunk, micro-batch) between its forward and
// its last backward, and the tensors that cross a chunk boundary.
//
// Contexts come from a pool per chunk: one is opened when a chunk's forward
// starts a micro-batch and returned after the chunk's last backward (or W)
// of it, so the pool grows to the schedule's activations in flight (1F1B: p
// on the first rank, GPipe: m) and a steady loop allocates nothing. Per
// chunk, because chunks differ in size (the last holds the logits): a
// context that served a small chunk and then a large one would outgrow its
// arena and re-allocate (and page-fault) every step.
//
// Boundary tensors are keyed by (payload, chunk, micro-batch):
//   inbox:  what chunk v consumes: its input activation (received, or the
//           output of chunk v-1 on this rank, still alive in that chunk's
//           context) or the gradient of its output (received, or copied from
//           chunk v+1 on this rank, whose context may close before v's B runs);
//   outbox: what chunk v produces for another rank, read by the send that
//           follows the compute (copied then into a parcel that lives until
//           the send is waited).
// Parcels live where the contexts' activations do (set_device): a device
// communicator moves device memory only.
//
// Recomputation (schedule/recompute.hpp): a unit whose forward keeps only its
// input runs that forward in a unit context of its own, returned right after
// (its output is copied into the chunk's context), and borrows one again from
// its Op::recompute to its backward. A whole backward hands its input
// gradient on through one of two gradient parcels (alternating by unit: each
// backward reads the other's) and returns the context at once; a split one
// (zero-bubble's B, whose W comes later and keeps that gradient as the next
// unit's dy) keeps its context until its W and the W of the unit below it are
// done (unit_backward_done). The input a dropped forward keeps is a view
// (kept_input): the previous unit's output, a received activation or the
// batch, all alive until the chunk's context closes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/schedule/program.hpp"

namespace loom::exec {

class MicroBatchPool {
public:
    // Sizes the tables for a step; contexts and parcels are kept from before.
    // Contexts a failed step left open go back to their pools.
    // `units`: the model's units when some are recomputed (else 0: no tables).
    void start_step(int chunks, int micro_batches, int units = 0) {
        for (std::size_t at = 0; at < open_.size(); ++at)
            if (open_[at] >= 0) free_[at / static_cast<std::size_t>(micro_batches_)].push_back(open_[at]);
        for (int& at : unit_open_)
            if (at >= 0) unit_free_.push_back(at);
        units_ = units;
        if (unit_need_.size() < static_cast<std::size_t>(units)) unit_need_.resize(static_cast<std::size_t>(units), 0);
        unit_open_.assign(static_cast<std::size_t>(chunks * micro_batches * units), -1);
        kept_inputs_.assign(unit_open_.size(), Tensor{});
        unit_done_.assign(unit_open_.size(), false);
        chunks_ = chunks;
        micro_batches_ = micro_batches;
        const auto n = static_cast<std::size_t>(2 * chunks * micro_batches);
        open_.assign(static_cast<std::size_t>(chunks * micro_batches), -1);
        if (free_.size() < static_cast<std::size_t>(chunks)) free_.resize(static_cast<std::size_t>(chunks));
        inbox_.assign(n, Tensor{});
        outbox_.assign(n, Tensor{});
        if (inbox_parcels_.size() < n) inbox_parcels_.resize(n);
        if (outbox_parcels_.size() < n) outbox_parcels_.resize(n);
    }

    // Every context's tensor-parallel group (null: the model runs whole).
    void set_tensor_group(const nn::TensorGroup* group) {
        group_ = group;
        for (auto& c : contexts_) c->set_tensor_group(group);
    }

    // Every context's Optimus 2D grid (null: the tp axis, if any, is 1D).
    void set_tensor_grid(const nn::TensorGrid* grid) {
        grid_ = grid;
        for (auto& c : contexts_) c->set_tensor_grid(grid);
    }

    // Every context's sequence parallelism (inactive: whole sequences).
    void set_sequence_parallelism(const nn::SequenceParallelism& sp) {
        sequence_ = sp;
        for (auto& c : contexts_) c->set_sequence_parallelism(sp);
    }

    // Every context's matrix-product precision (kernels/matmul_precision.hpp).
    void set_matmul_precision(kernels::MatmulPrecision precision) {
        matmul_ = precision;
        for (auto& c : contexts_) c->set_matmul_precision(precision);
    }

    // Where every context's activations and every parcel live (the host by
    // default); parcels from before are dropped.
    void set_device(Device where) {
        device_ = where;
        for (auto& c : contexts_) c->set_device(where);
        for (auto* parcels : {&inbox_parcels_, &outbox_parcels_})
            for (auto& b : *parcels) b = DeviceBuffer{};
        header_ = DeviceBuffer{};
        cast_words_ = DeviceBuffer{};
        for (auto& b : gradient_parcels_) b = DeviceBuffer{};
    }
    [[nodiscard]] Device device() const noexcept { return device_; }

    // A fresh context for (chunk, mb): its forward starts.
    nn::Context& open(int chunk, int mb) {
        int& at = open_[at_of(chunk, mb)];
        LOOM_CHECK(at < 0, "Executor: chunk ", chunk, " micro-batch ", mb, " started twice in one step");
        auto& free = free_[static_cast<std::size_t>(chunk)];
        if (free.empty()) {
            contexts_.push_back(configured());
            free.push_back(static_cast<int>(contexts_.size()) - 1);
        }
        at = free.back();
        free.pop_back();
        nn::Context& ctx = *contexts_[static_cast<std::size_t>(at)];
        ctx.reset();
        return ctx;
    }

    // A unit's own context (recomputation): borrowed for its dropped forward,
    // and from its recompute to its last backward. It reads the chunk's targets.
    nn::Context& open_unit(int chunk, int mb, int unit) {
        int& at = unit_open_[unit_at(chunk, mb, unit)];
        LOOM_CHECK(at < 0, "Executor: unit ", unit, " of micro-batch ", mb, " opened its own context twice");
        // A context keeps the size of the largest unit it served: the best
        // fit among the free ones (the smallest that held this unit's bytes
        // last time, else the largest), so that units of different sizes open
        // at once (zero-bubble's Bs before their Ws) do not all grow to the
        // largest, and one context serves a whole backward otherwise.
        if (unit_free_.empty()) {
            contexts_.push_back(configured());
            unit_free_.push_back(static_cast<int>(contexts_.size()) - 1);
        }
        const std::size_t need = unit_need_[static_cast<std::size_t>(unit)];
        const auto size = [&](int c) { return contexts_[static_cast<std::size_t>(c)]->peak_bytes(); };
        auto best = unit_free_.begin();
        for (auto it = unit_free_.begin(); it != unit_free_.end(); ++it) {
            const bool fits = size(*it) >= need, best_fits = size(*best) >= need;
            if ((fits && (!best_fits || size(*it) < size(*best))) || (!fits && !best_fits && size(*it) > size(*best))) best = it;
        }
        at = *best;
        unit_free_.erase(best);
        nn::Context& ctx = *contexts_[static_cast<std::size_t>(at)];
        ctx.reset();
        ctx.set_targets(context(chunk, mb).targets());
        return ctx;
    }
    [[nodiscard]] bool unit_open(int chunk, int mb, int unit) const {
        return units_ > 0 && unit_open_[unit_at(chunk, mb, unit)] >= 0;
    }
    [[nodiscard]] nn::Context& unit_context(int chunk, int mb, int unit) {
        const int at = unit_open_[unit_at(chunk, mb, unit)];
        LOOM_CHECK(at >= 0, "Executor: unit ", unit, " of micro-batch ", mb, " has no recomputed activations");
        return *contexts_[static_cast<std::size_t>(at)];
    }
    void close_unit(int chunk, int mb, int unit) {
        int& at = unit_open_[unit_at(chunk, mb, unit)];
        if (at >= 0) {
            std::size_t& need = unit_need_[static_cast<std::size_t>(unit)];
            need = std::max(need, contexts_[static_cast<std::size_t>(at)]->bytes_in_use());
            unit_free_.push_back(at);
        }
        at = -1;
    }
    // Unit `unit` of the chunk's units [first, end) finished its backward
    // (its W too, when split): unit contexts nothing reads any more go back.
    void unit_backward_done(int chunk, int mb, int unit, int first, int end) {
        unit_done_[unit_at(chunk, mb, unit)] = true;
        const auto done = [&](int k) { return unit_done_[unit_at(chunk, mb, k)]; };
        for (int k : {unit, unit + 1})
            if (k < end && done(k) && (k == first || done(k - 1))) close_unit(chunk, mb, k);
    }

    // Where a recomputed unit's input gradient goes, so that its context can
    // go back at once: one of two parcels by the unit's parity (the next
    // unit's backward reads it while writing its own into the other).
    [[nodiscard]] Tensor gradient_parcel(int unit, DType dtype, const Shape& shape) {
        const std::int64_t bytes = shape.numel() * static_cast<std::int64_t>(size_of(dtype));
        return Tensor(parcel(gradient_parcels_[static_cast<std::size_t>(unit % 2)], bytes), dtype, shape, device_);
    }

    // Frees the unit contexts (none may be in use), so that they grow back to
    // what the units recomputed from now on need: Budget's measuring step
    // recomputed more units than its choice does.
    void drop_unit_contexts() {
        for (int at : unit_open_) LOOM_CHECK(at < 0, "Executor: a unit context is dropped while in use");
        for (int at : unit_free_) contexts_[static_cast<std::size_t>(at)] = configured();
    }

    void keep_input(int chunk, int mb, int unit, const Tensor& x) { kept_inputs_[unit_at(chunk, mb, unit)] = x; }
    [[nodiscard]] const Tensor& kept_input(int chunk, int mb, int unit) const {
        const Tensor& x = kept_inputs_[unit_at(chunk, mb, unit)];
        LOOM_CHECK(x.raw() != nullptr, "Executor: unit ", unit, " of micro-batch ", mb,
                   " is recomputed but its forward kept no input");
        return x;
    }

    [[nodiscard]] nn::Context& context(int chunk, int mb) {
        const int at = open_[at_of(chunk, mb)];
        LOOM_CHECK(at >= 0, "Executor: chunk ", chunk, " micro-batch ", mb, " computes before its forward opened it");
        return *contexts_[static_cast<std::size_t>(at)];
    }

    // Its last backward is done: the context goes back to the pool.
    void close(int chunk, int mb) {
        int& at = open_[at_of(chunk, mb)];
        if (at >= 0) free_[static_cast<std::size_t>(chunk)].push_back(at);
        at = -1;
    }

    void put_inbox(schedule::Payload p, int chunk, int mb, const Tensor& t) { inbox_[key(p, chunk, mb)] = t; }
    [[nodiscard]] const Tensor& inbox(schedule::Payload p, int chunk, int mb) const {
        const Tensor& t = inbox_[key(p, chunk, mb)];
        LOOM_CHECK(t.raw() != nullptr, "Executor: chunk ", chunk, " micro-batch ", mb, " needs its ", name(p),
                   ", which has not arrived");
        return t;
    }
    void put_outbox(schedule::Payload p, int chunk, int mb, const Tensor& t) { outbox_[key(p, chunk, mb)] = t; }
    [[nodiscard]] const Tensor& outbox(schedule::Payload p, int chunk, int mb) const {
        const Tensor& t = outbox_[key(p, chunk, mb)];
        LOOM_CHECK(t.raw() != nullptr, "Executor: chunk ", chunk, " micro-batch ", mb, " has no ", name(p),
                   " to send yet");
        return t;
    }

    // Owned storage of `shape` for an inbox (recv target, same-rank gradient)
    // or outbox (send) entry, reused step after step.
    [[nodiscard]] Tensor inbox_parcel(schedule::Payload p, int chunk, int mb, DType dtype, const Shape& shape) {
        return Tensor(parcel(inbox_parcels_[key(p, chunk, mb)], shape.numel() * static_cast<std::int64_t>(size_of(dtype))),
                      dtype, shape, device_);
    }
    // `bytes` of storage on device() (a send's header and body).
    [[nodiscard]] void* outbox_parcel(schedule::Payload p, int chunk, int mb, std::int64_t bytes) {
        return parcel(outbox_parcels_[key(p, chunk, mb)], bytes);
    }
    // Where a received message header lands (on device()) before the host reads it.
    [[nodiscard]] Tensor header_parcel(std::int64_t longs) {
        return Tensor(parcel(header_, 8 * longs), DType::i64, Shape{longs}, device_);
    }
    // Where a cast message's words land (on device()) before they are widened.
    [[nodiscard]] Tensor cast_parcel(std::int64_t words) {
        return Tensor(parcel(cast_words_, 4 * words), DType::i32, Shape{words}, device_);
    }

    // Activation bytes: every pooled context's peak (they can all be live at once).
    [[nodiscard]] std::int64_t activation_bytes() const {
        std::int64_t sum = 0;
        for (const auto& c : contexts_) sum += static_cast<std::int64_t>(c->peak_bytes());
        return sum;
    }
    [[nodiscard]] std::int64_t parcel_bytes() const {
        std::int64_t sum = 0;
        for (const auto* parcels : {&inbox_parcels_, &outbox_parcels_})
            for (const auto& b : *parcels) sum += static_cast<std::int64_t>(b.nbytes());
        for (const auto* b : {&header_, &cast_words_})
            if (b->raw() != nullptr) sum += static_cast<std::int64_t>(b->nbytes());
        return sum;
    }
    [[nodiscard]] int contexts() const noexcept { return static_cast<int>(contexts_.size()); }

private:
    [[nodiscard]] std::size_t at_of(int chunk, int mb) const {
        LOOM_CHECK(chunk >= 0 && chunk < chunks_ && mb >= 0 && mb < micro_batches_, "Executor: chunk ", chunk,
                   " micro-batch ", mb, " is outside the step's ", chunks_, " chunk(s) x ", micro_batches_,
                   " micro-batch(es)");
        return static_cast<std::size_t>(chunk * micro_batches_ + mb);
    }
    [[nodiscard]] std::size_t unit_at(int chunk, int mb, int unit) const {
        LOOM_CHECK(unit >= 0 && unit < units_, "Executor: unit ", unit, " is outside the ", units_,
                   " units this step recomputes over");
        return at_of(chunk, mb) * static_cast<std::size_t>(units_) + static_cast<std::size_t>(unit);
    }
    // A new context with every setting the pool's contexts share.
    [[nodiscard]] std::unique_ptr<nn::Context> configured() const {
        auto ctx = std::make_unique<nn::Context>();
        ctx->set_tensor_group(group_);
        ctx->set_tensor_grid(grid_);
        ctx->set_sequence_parallelism(sequence_);
        ctx->set_matmul_precision(matmul_);
        ctx->set_device(device_);
        return ctx;
    }
    [[nodiscard]] std::size_t key(schedule::Payload p, int chunk, int mb) const {
        return static_cast<std::size_t>(p == schedule::Payload::gradient ? 1 : 0) * static_cast<std::size_t>(chunks_ * micro_batches_) +
               at_of(chunk, mb);
    }
    [[nodiscard]] void* parcel(DeviceBuffer& storage, std::int64_t bytes) const {
        if (storage.raw() == nullptr || static_cast<std::int64_t>(storage.nbytes()) < bytes)
            storage = DeviceBuffer(DType::f32, Shape{std::max<std::int64_t>((bytes + 3) / 4, 1)}, device_);
        return storage.raw();
    }

    int chunks_ = 0, micro_batches_ = 0;
    const nn::TensorGroup* group_ = nullptr;
    const nn::TensorGrid* grid_ = nullptr;
    nn::SequenceParallelism sequence_{};
    kernels::MatmulPrecision matmul_ = kernels::MatmulPrecision::f32;
    Device device_ = host_device;
    std::vector<std::unique_ptr<nn::Context>> contexts_;
    std::vector<std::vector<int>> free_;  // by chunk: contexts not in flight
    std::vector<int> open_;  // (chunk, mb) -> context index, -1 when not in flight
    int units_ = 0;                  // recomputation's tables cover this many units (0: none)
    std::vector<int> unit_open_;     // (chunk, mb, unit) -> its own context, -1 when none
    std::vector<int> unit_free_;           // unit contexts not in use
    std::vector<std::size_t> unit_need_;   // by unit: the most bytes its context held
    std::vector<Tensor> kept_inputs_;  // (chunk, mb, unit) -> the input a dropped forward kept
    std::vector<bool> unit_done_;      // (chunk, mb, unit) -> its backward (and W) ran this step
    DeviceBuffer gradient_parcels_[2];  // recomputed units' input gradients, by parity
    std::vector<Tensor> inbox_, outbox_;
    std::vector<DeviceBuffer> inbox_parcels_, outbox_parcels_;
    DeviceBuffer header_, cast_words_;
};

}  // namespace loom::exec
