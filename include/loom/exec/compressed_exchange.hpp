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
//   PowerSGD              all-reduce of P, then of Q (exec/power_sgd.hpp);
//                         ZeRO keeps its block of the result
// Error feedback (top-k, PowerSGD, one-bit): `error` holds, per element, what
// earlier steps computed but did not send, laid out like the padded
// gradient arena; a step sends compress(gradient + error) and keeps the
// rest. One-bit also keeps the error of its second compression, per chunk
// (the shard layout), as 1-bit Adam does. Every rank of a bucket ends with
// the same bits, whatever it sent.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/exec/chunk_codec.hpp"
#include "loom/exec/power_sgd.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/grad_compress.hpp"
#include "loom/parallel/shard_layout.hpp"

namespace loom::exec {

// 1-bit Adam's exchange of momentum through a gradient exchange: before it,
// g becomes the momentum this step would make, beta1 m + (1 - beta1) g; after
// it, the average turns back into the gradient that makes AdamW's momentum
// that average, (avg - beta1 m) / (1 - beta1). m is the step's old momentum,
// the same on every rank.
inline void mix_momentum(std::span<float> grad, std::span<const float> m, float beta1) {
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = beta1 * m[i] + (1.0f - beta1) * grad[i];
}
inline void unmix_momentum(std::span<float> grad, std::span<const float> m, float beta1) {
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = (grad[i] - beta1 * m[i]) / (1.0f - beta1);
}

template <comm::Communicator C>
class CompressedExchange {
public:
    using Notice = PowerSgdBuckets::Notice;

    CompressedExchange(C& comm, const parallel::ShardLayout& layout, const std::vector<nn::Unit>& units,
                       const Compression& compression, const Notice& notice = {})
        : comm_(&comm), layout_(layout), compression_(compression) {
        compression.validate();
        LOOM_CHECK(compression.on(), "CompressedExchange: no compressor given");
        LOOM_CHECK(layout.ranks() == comm.size(), "CompressedExchange: a layout over ", layout.ranks(),
                   " ranks for a communicator of ", comm.size());
        if (compression.kind == CompressorKind::power_sgd)
            power_sgd_ = std::make_unique<PowerSgdBuckets>(layout, units, compression.rank, notice);
        else
            codec_ = std::make_unique<ChunkCodec>(compression);
        if (compression.error_feedback()) error_.assign(static_cast<std::size_t>(layout.padded_size()), 0.0f);
        if (compression.kind == CompressorKind::one_bit)
            server_error_.assign(static_cast<std::size_t>(layout.shard_size()), 0.0f);
        buffers_.resize(layout.groups().size());
    }

    [[nodiscard]] const Compression& compression() const noexcept { return compression_; }

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
        std::fill(error_.begin(), error_.end(), 0.0f);
        std::fill(server_error_.begin(), server_error_.end(), 0.0f);
        if (power_sgd_) power_sgd_->reset();
    }

    // This rank's state, for checkpoints: error feedback (the padded arena's
    // layout), one-bit's second error (the shard's), PowerSGD's Qs.
    [[nodiscard]] std::int64_t state_size() const noexcept {
        return static_cast<std::int64_t>(error_.size() + server_error_.size()) +
               (power_sgd_ ? power_sgd_->state_size() : 0);
    }
    void save_state(std::span<float> out) const {
        LOOM_CHECK(static_cast<std::int64_t>(out.size()) == state_size(), "CompressedExchange: ", out.size(),
                   " elements for a state of ", state_size());
        auto at = std::copy(error_.begin(), error_.end(), out.begin());
        at = std::copy(server_error_.begin(), server_error_.end(), at);
        if (power_sgd_) power_sgd_->save(std::span<float>(at, out.end()));
    }
    void load_state(std::span<const float> in) {
        LOOM_CHECK(static_cast<std::int64_t>(in.size()) == state_size(), "CompressedExchange: a saved state of ",
                   in.size(), " elements for ", compression_.describe(), " whose state has ", state_size());
        std::copy_n(in.begin(), error_.size(), error_.begin());
        std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(error_.size()), server_error_.size(), server_error_.begin());
        if (power_sgd_)
            power_sgd_->load(in.subspan(error_.size() + server_error_.size()));
    }
    [[nodiscard]] std::int64_t state_bytes() const noexcept { return 4 * state_size(); }
    // Working buffers of the buckets exchanged so far (allocated on first use).
    [[nodiscard]] std::int64_t buffer_bytes() const noexcept {
        std::int64_t words = 0;
        for (const auto& b : buffers_)
            words += static_cast<std::int64_t>(b.send.size() + b.recv.size() + b.sums.size() + b.gather_send.size() +
                                               b.gather_recv.size());
        return 4 * words + (power_sgd_ ? power_sgd_->buffer_bytes() : 0);
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

    struct Buffers {
        std::vector<std::uint32_t> send, recv, gather_send, gather_recv;
        std::vector<float> sums;
    };

    [[nodiscard]] std::span<float> error_of(int g) {
        const auto& group = layout_.group(g);
        return {error_.data() + group.offset, static_cast<std::size_t>(group.padded)};
    }
    [[nodiscard]] static Tensor words_tensor(std::vector<std::uint32_t>& v) {
        return Tensor(v.data(), DType::i32, Shape{static_cast<std::int64_t>(v.size())});
    }

    // Compresses chunk j of x (every rank's chunks) into send, with error
    // feedback when the compressor keeps one.
    void pack_chunks(int g, std::span<const float> grad, Buffers& b, std::int64_t words) {
        const auto& group = layout_.group(g);
        const int n = comm_->size();
        b.send.resize(static_cast<std::size_t>(n * words));
        const float* x = grad.data();
        if (compression_.error_feedback()) {
            const auto error = error_of(g);
            for (std::size_t i = 0; i < error.size(); ++i) error[i] += grad[i];
            x = error.data();
        }
        for (int j = 0; j < n; ++j) {
            float* chunk = const_cast<float*>(x) + j * group.block;
            codec_->pack(chunk, group.block, b.send.data() + j * words,
                         compression_.error_feedback() ? chunk : nullptr);
        }
    }

    comm::Request start_two_stage(int g, std::span<const float> grad) {
        Buffers& b = buffers_[static_cast<std::size_t>(g)];
        const std::int64_t words = codec_->words(layout_.group(g).block);
        pack_chunks(g, grad, b, words);
        b.recv.resize(b.send.size());
        return comm_->all_to_all_async(words_tensor(b.send), words_tensor(b.recv));
    }

    comm::Request start_top_k(int g, std::span<const float> grad, bool scatter) {
        Buffers& b = buffers_[static_cast<std::size_t>(g)];
        const std::int64_t words = codec_->words(layout_.group(g).block);
        pack_chunks(g, grad, b, words);
        if (scatter) {
            b.recv.resize(b.send.size());
            return comm_->all_to_all_async(words_tensor(b.send), words_tensor(b.recv));
        }
        b.recv.resize(b.send.size() * static_cast<std::size_t>(comm_->size()));
        return comm_->all_gather_async(words_tensor(b.send), words_tensor(b.recv));
    }

    void finish(int g, std::span<float> grad, std::span<float> out, bool scatter) {
        if (power_sgd_) {
            power_sgd_->finish(*comm_, g, grad, error_of(g));
            if (scatter) {
                const auto& group = layout_.group(g);
                std::copy_n(grad.data() + comm_->rank() * group.block, group.block, out.data());
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
                    codec_->unpack(b.recv.data() + (r * n + j) * words, group.block, grad.data() + j * group.block,
                                   weight, r > 0);
            return;
        }
        // This rank's chunk from every rank, summed in rank order.
        float* sums = out.data();
        if (!scatter) {
            b.sums.resize(static_cast<std::size_t>(group.block));
            sums = b.sums.data();
        }
        for (int r = 0; r < n; ++r) codec_->unpack(b.recv.data() + r * words, group.block, sums, weight, r > 0);
        if (scatter) return;
        // Second stage: the sums compressed again (one-bit with its own error
        // feedback), gathered, and decoded alike on every rank.
        b.gather_send.resize(static_cast<std::size_t>(words));
        b.gather_recv.resize(static_cast<std::size_t>(n * words));
        if (compression_.kind == CompressorKind::one_bit) {
            float* server = server_error_.data() + group.shard_offset;
            for (std::int64_t i = 0; i < group.block; ++i) sums[i] += server[i];
            codec_->pack(sums, group.block, b.gather_send.data(), server);
        } else {
            codec_->pack(sums, group.block, b.gather_send.data());
        }
        comm_->all_gather(words_tensor(b.gather_send), words_tensor(b.gather_recv));
        for (int r = 0; r < n; ++r)
            codec_->unpack(b.gather_recv.data() + r * words, group.block, grad.data() + r * group.block, 1.0f, false);
    }

    // The bucket's padding (past its parameters) leaves the exchange as zero,
    // as it entered: a decoded sign or a cast sum there would otherwise feed
    // AdamW's moments of elements that belong to nobody.
    void zero_padding(int g, std::span<float> out, bool scatter) const {
        const auto& group = layout_.group(g);
        const std::int64_t first = scatter ? comm_->rank() * group.block : 0;
        for (std::int64_t i = std::max(group.numel, first); i < first + static_cast<std::int64_t>(out.size()); ++i)
            out[static_cast<std::size_t>(i - first)] = 0.0f;
    }

    C* comm_;
    parallel::ShardLayout layout_;  // a copy: the executor that owns this may move
    Compression compression_;
    std::unique_ptr<ChunkCodec> codec_;
    std::unique_ptr<PowerSgdBuckets> power_sgd_;
    std::vector<float> error_;         // error feedback, the padded arena's layout
    std::vector<float> server_error_;  // one-bit's second error, the shard's layout
    std::vector<Buffers> buffers_;     // by bucket: several may be in flight at once
};

}  // namespace loom::exec
