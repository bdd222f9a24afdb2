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
    void start_step(int chunks, int micro_batches) {
        for (std::size_t at = 0; at < open_.size(); ++at)
            if (open_[at] >= 0) free_[at / static_cast<std::size_t>(micro_batches_)].push_back(open_[at]);
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
    }
    [[nodiscard]] Device device() const noexcept { return device_; }

    // A fresh context for (chunk, mb): its forward starts.
    nn::Context& open(int chunk, int mb) {
        int& at = open_[at_of(chunk, mb)];
        LOOM_CHECK(at < 0, "Executor: chunk ", chunk, " micro-batch ", mb, " started twice in one step");
        auto& free = free_[static_cast<std::size_t>(chunk)];
        if (free.empty()) {
            contexts_.push_back(std::make_unique<nn::Context>());
            contexts_.back()->set_tensor_group(group_);
            contexts_.back()->set_tensor_grid(grid_);
            contexts_.back()->set_sequence_parallelism(sequence_);
            contexts_.back()->set_matmul_precision(matmul_);
            contexts_.back()->set_device(device_);
            free.push_back(static_cast<int>(contexts_.size()) - 1);
        }
        at = free.back();
        free.pop_back();
        nn::Context& ctx = *contexts_[static_cast<std::size_t>(at)];
        ctx.reset();
        return ctx;
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
    std::vector<Tensor> inbox_, outbox_;
    std::vector<DeviceBuffer> inbox_parcels_, outbox_parcels_;
    DeviceBuffer header_, cast_words_;
};

}  // namespace loom::exec
