// CompressedExchange: the data-parallel gradient exchange of GradCompress.
// It replaces a bucket's averaging all-reduce, or ZeRO's reduce-scatter, by
// the compressor's collective, in two halves: start() compresses the bucket
// and starts its first collective as soon as backward has finished the
// bucket (so it overlaps the rest of backward, as the uncompressed one does);
// the returned Request's wait() runs the second half. Shapes (N ranks, each
// owning chunk r of every bucket, as in parallel/shard_layout.hpp):
//   casts, int8, one-bit  reduce-scatter = all-to-all of compressed chunks,
//                         each rank sums its N chunks in f32 (ZeRO 2/3 stops
//                         here); all-reduce = that, then an all-gather of the
//                         compressed sums, decoded alike on every rank
//   top-k                 all-reduce = all-gather of every rank's pairs,
//                         reduce-scatter = all-to-all of chunk j's pairs
//                         to rank j (N times fewer bytes)
//   PowerSGD              all-reduce of P, then of Q (parallel/power_sgd.hpp);
//                         ZeRO keeps its block of the result
// Error feedback (top-k, PowerSGD, one-bit): `error` holds, per element, what
// earlier steps computed but did not send, laid out like the padded
// gradient arena; a step sends compress(gradient + error) and keeps the
// rest. One-bit also keeps the error of its second compression, per chunk
// (the shard layout), as 1-bit Adam does. Every rank of a bucket ends with
// the same bits, whatever it sent. All of it (error feedback, the words,
// the sums) lives where the gradients do, the host or a device; only
// checkpoints cross to the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/parallel/chunk_codec.hpp"
#include "loom/kernels/compression_ops.hpp"
#include "loom/parallel/power_sgd.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/grad_compress.hpp"
#include "loom/parallel/shard_layout.hpp"

namespace loom::parallel {

template <comm::Communicator C>
class CompressedExchange {
public:
    using Notice = PowerSgdBuckets::Notice;

    // The gradients it exchanges are in memory on `where`.
    CompressedExchange(C& comm, const parallel::ShardLayout& layout, const std::vector<nn::Unit>& units,
                       const Compression& compression, const Notice& notice = {}, Device where = host_device)
        : comm_(&comm), layout_(layout), compression_(compression), where_(where) {
        compression.validate();
        LOOM_CHECK(compression.on(), "CompressedExchange: no compressor given");
        LOOM_CHECK(layout.ranks() == comm.size(), "CompressedExchange: a layout over ", layout.ranks(),
                   " ranks for a communicator of ", comm.size());
        if (compression.kind == CompressorKind::power_sgd)
            power_sgd_ = std::make_unique<PowerSgdBuckets>(layout, units, compression.rank, notice, where);
        else
            codec_ = std::make_unique<ChunkCodec>(compression, where);
        // Sized 0 when absent, so state_size() counts only what is kept.
        error_ = floats(compression.error_feedback() ? layout.padded_size() : 0);
        server_error_ = floats(compression.kind == CompressorKind::one_bit ? layout.shard_size() : 0);
        buffers_.resize(layout.groups().size());
    }

    [[nodiscard]] const Compression& compression() const noexcept { return compression_; }
    [[nodiscard]] const parallel::ShardLayout& layout() const noexcept { return layout_; }

    // Starts averaging bucket g's gradient `grad` (its padded elements) over
    // the ranks. `out` is `grad` itself (all-reduce: every rank gets the
    // whole average) or this rank's block of it (reduce-scatter). `grad` is
    // read here; `out` is written when the returned Request is waited for.
    [[nodiscard]] comm::Request reduce_async(int g, std::span<float> grad, std::span<float> out) {
        const auto& group = layout_.group(g);
        // Told apart by size, not address: rank 0's block starts where the bucket does.
        const bool scatter = static_cast<std::int64_t>(out.size()) == group.block && group.block != group.padded;
        LOOM_CHECK(static_cast<std::int64_t>(grad.size()) == group.padded && (scatter || out.data() == grad.data()),
                   "CompressedExchange: bucket ", g, " has ", group.padded, " elements and blocks of ", group.block,
                   "; got ", grad.size(), " in and ", out.size(), " out (all-reduce: out is in; reduce-scatter: "
                   "out is this rank's block)");
        comm::Request first = power_sgd_ ? power_sgd_->start(*comm_, g, grad, error_of(g))
                              : compression_.kind == CompressorKind::top_k ? start_top_k(g, grad, scatter)
                                                                           : start_two_stage(g, grad);
        return comm::Request(std::make_unique<Second>(this, g, grad, out, scatter, std::move(first)));
    }

    // Error feedback and warm starts back to zero and their initial values.
    void reset() {
        fill_zero_bytes(error_.raw(), where_, error_.nbytes());
        fill_zero_bytes(server_error_.raw(), where_, server_error_.nbytes());
        if (power_sgd_) power_sgd_->reset();
    }

    // This rank's state, for checkpoints (host memory): error feedback (the
    // padded arena's layout), one-bit's second error (the shard's), PowerSGD's Qs.
    [[nodiscard]] std::int64_t state_size() const noexcept {
        return error_.numel() + server_error_.numel() + (power_sgd_ ? power_sgd_->state_size() : 0);
    }
    void save_state(std::span<float> out) const {
        LOOM_CHECK(static_cast<std::int64_t>(out.size()) == state_size(), "CompressedExchange: ", out.size(),
                   " elements for a state of ", state_size());
        copy_bytes(out.data(), host_device, error_.raw(), where_, error_.nbytes());
        copy_bytes(out.data() + error_.numel(), host_device, server_error_.raw(), where_, server_error_.nbytes());
        if (power_sgd_) power_sgd_->save(out.subspan(static_cast<std::size_t>(error_.numel() + server_error_.numel())));
    }
    void load_state(std::span<const float> in) {
        LOOM_CHECK(static_cast<std::int64_t>(in.size()) == state_size(), "CompressedExchange: a saved state of ",
                   in.size(), " elements for ", compression_.describe(), " whose state has ", state_size());
        copy_bytes(error_.raw(), where_, in.data(), host_device, error_.nbytes());
        copy_bytes(server_error_.raw(), where_, in.data() + error_.numel(), host_device, server_error_.nbytes());
        if (power_sgd_) power_sgd_->load(in.subspan(static_cast<std::size_t>(error_.numel() + server_error_.numel())));
    }
    [[nodiscard]] std::int64_t state_bytes() const noexcept { return 4 * state_size(); }
    // Working buffers of the buckets exchanged so far (allocated on first use).
    [[nodiscard]] std::int64_t buffer_bytes() const noexcept {
        std::int64_t bytes = 0;
        for (const auto& b : buffers_)
            bytes += b.send.nbytes() + b.recv.nbytes() + b.sums.nbytes() + b.gather_send.nbytes() + b.gather_recv.nbytes();
        return bytes + (power_sgd_ ? power_sgd_->buffer_bytes() : 0);
    }

private:
    // The second half, run by the Request's wait().
    class Second final : public comm::Request::Pending {
    public:
        Second(CompressedExchange* owner, int g, std::span<float> grad, std::span<float> out, bool scatter,
               comm::Request first)
            : owner_(owner), g_(g), grad_(grad), out_(out), scatter_(scatter), first_(std::move(first)) {}
        bool test() override {
            if (done_) return true;
            if (!first_.test()) return false;
            finish();
            return true;
        }
        void wait() override {
            if (done_) return;
            first_.wait();
            finish();
        }

    private:
        void finish() {
            done_ = true;
            owner_->finish(g_, grad_, out_, scatter_);
            owner_->zero_padding(g_, out_, scatter_);
        }
        CompressedExchange* owner_;
        int g_;
        std::span<float> grad_, out_;
        bool scatter_;
        comm::Request first_;
        bool done_ = false;
    };

    // A bucket's working memory, on where_, sized exactly (the collectives
    // take a buffer's whole length). A size depends on the bucket and the
    // reduction (top-k's recv is N times larger for an all-reduce than for a
    // reduce-scatter), which a run fixes, so it is allocated on the bucket's
    // first exchange; a reallocation would only come at the start of the
    // bucket's next exchange, after the verified schedule waited for its last.
    struct Buffers {
        DeviceBuffer send, recv, gather_send, gather_recv;  // words (i32)
        DeviceBuffer sums;                                  // f32
    };

    [[nodiscard]] DeviceBuffer floats(std::int64_t n) const { return DeviceBuffer(DType::f32, Shape{n}, where_); }
    // `b` holding n elements of `dtype` (reallocated only when that size changes); its memory.
    [[nodiscard]] void* sized(DeviceBuffer& b, DType dtype, std::int64_t n) const {
        if (b.nbytes() != static_cast<std::size_t>(n) * size_of(dtype)) b = DeviceBuffer(dtype, Shape{n}, where_);
        return b.raw();
    }
    [[nodiscard]] std::uint32_t* words_of(DeviceBuffer& b, std::int64_t n) const {
        return static_cast<std::uint32_t*>(sized(b, DType::i32, n));
    }
    [[nodiscard]] static std::uint32_t* words_of(const DeviceBuffer& b) { return static_cast<std::uint32_t*>(b.raw()); }

    [[nodiscard]] std::span<float> error_of(int g) {
        const auto& group = layout_.group(g);
        return {error_.data<float>() + group.offset, static_cast<std::size_t>(group.padded)};
    }

    // Compresses chunk j of x (every rank's chunks) into send, with error
    // feedback when the compressor keeps one.
    void pack_chunks(int g, std::span<const float> grad, Buffers& b, std::int64_t words) {
        const auto& group = layout_.group(g);
        const int n = comm_->size();
        std::uint32_t* send = words_of(b.send, n * words);
        const float* x = grad.data();
        if (compression_.error_feedback()) {
            const auto error = error_of(g);
            kernels::accumulate(where_, error.data(), grad.data(), group.padded);
            x = error.data();
        }
        for (int j = 0; j < n; ++j) {
            float* chunk = const_cast<float*>(x) + j * group.block;
            codec_->pack(chunk, group.block, send + j * words, compression_.error_feedback() ? chunk : nullptr);
        }
    }

    comm::Request start_two_stage(int g, std::span<const float> grad) {
        Buffers& b = buffers_[static_cast<std::size_t>(g)];
        const std::int64_t words = codec_->words(layout_.group(g).block);
        pack_chunks(g, grad, b, words);
        (void)words_of(b.recv, b.send.numel());
        return comm_->all_to_all_async(words_tensor(b.send), words_tensor(b.recv));
    }

    comm::Request start_top_k(int g, std::span<const float> grad, bool scatter) {
        Buffers& b = buffers_[static_cast<std::size_t>(g)];
        const std::int64_t words = codec_->words(layout_.group(g).block);
        pack_chunks(g, grad, b, words);
        if (scatter) {
            (void)words_of(b.recv, b.send.numel());
            return comm_->all_to_all_async(words_tensor(b.send), words_tensor(b.recv));
        }
        (void)words_of(b.recv, b.send.numel() * comm_->size());
        return comm_->all_gather_async(words_tensor(b.send), words_tensor(b.recv));
    }

    void finish(int g, std::span<float> grad, std::span<float> out, bool scatter) {
        if (power_sgd_) {
            power_sgd_->finish(*comm_, g, grad, error_of(g));
            if (scatter) {
                const auto& group = layout_.group(g);
                copy_bytes(out.data(), where_, grad.data() + comm_->rank() * group.block, where_,
                           static_cast<std::size_t>(group.block) * sizeof(float));
            }
            return;
        }
        const auto& group = layout_.group(g);
        Buffers& b = buffers_[static_cast<std::size_t>(g)];
        const int n = comm_->size();
        const std::int64_t words = codec_->words(group.block);
        const float weight = 1.0f / static_cast<float>(n);
        if (compression_.kind == CompressorKind::top_k && !scatter) {
            // Every rank's pairs for every chunk: the whole average, summed in rank order.
            for (int j = 0; j < n; ++j)
                for (int r = 0; r < n; ++r)
                    codec_->unpack(words_of(b.recv) + (r * n + j) * words, group.block, grad.data() + j * group.block,
                                   weight, r > 0);
            return;
        }
        // This rank's chunk from every rank, summed in rank order.
        float* sums = out.data();
        if (!scatter) sums = static_cast<float*>(sized(b.sums, DType::f32, group.block));
        for (int r = 0; r < n; ++r) codec_->unpack(words_of(b.recv) + r * words, group.block, sums, weight, r > 0);
        if (scatter) return;
        // Second stage: the sums compressed again (one-bit with its own error
        // feedback), gathered, and decoded alike on every rank.
        std::uint32_t* gather_send = words_of(b.gather_send, words);
        const std::uint32_t* gather_recv = words_of(b.gather_recv, n * words);
        if (compression_.kind == CompressorKind::one_bit) {
            float* server = server_error_.data<float>() + group.shard_offset;
            kernels::accumulate(where_, sums, server, group.block);
            codec_->pack(sums, group.block, gather_send, server);
        } else {
            codec_->pack(sums, group.block, gather_send);
        }
        comm_->all_gather(words_tensor(b.gather_send), words_tensor(b.gather_recv));
        for (int r = 0; r < n; ++r)
            codec_->unpack(gather_recv + r * words, group.block, grad.data() + r * group.block, 1.0f, false);
    }

    // The bucket's padding (past its parameters) leaves the exchange as zero,
    // as it entered: a decoded sign or a cast sum there would otherwise feed
    // AdamW's moments of elements that belong to nobody.
    void zero_padding(int g, std::span<float> out, bool scatter) const {
        const auto& group = layout_.group(g);
        const std::int64_t first = scatter ? comm_->rank() * group.block : 0;
        const std::int64_t from = std::max(group.numel, first), to = first + static_cast<std::int64_t>(out.size());
        if (from < to)
            fill_zero_bytes(out.data() + (from - first), where_, static_cast<std::size_t>(to - from) * sizeof(float));
    }
    [[nodiscard]] Tensor words_tensor(const DeviceBuffer& b) const {
        return Tensor(b.raw(), DType::i32, Shape{b.numel()}, where_);
    }

    C* comm_;
    parallel::ShardLayout layout_;  // a copy: the executor that owns this may move
    Compression compression_;
    Device where_;
    std::unique_ptr<ChunkCodec> codec_;
    std::unique_ptr<PowerSgdBuckets> power_sgd_;
    DeviceBuffer error_;         // error feedback (f32, on where_), the padded arena's layout
    DeviceBuffer server_error_;  // one-bit's second error (f32, on where_), the shard's layout
    std::vector<Buffers> buffers_;     // by bucket: several may be in flight at once
};

}  // namespace loom::parallel
