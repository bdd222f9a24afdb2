// GradCompress on the dp axis as the executor's gradient exchange
// (parallel/gradient_exchange.hpp): CompressedExchange's collectives and
// error feedback, plus what a run adds around them:
//   - the warm-up: the first `warmup` optimizer steps exchange plain f32
//     averages (PowerSGD and one-bit want some; the others need none);
//   - one-bit's momentum exchange at ZeRO 0 (1-bit Adam): each bucket's
//     gradient is mixed into AdamW's first moment before it is compressed,
//     and unmixed before the optimizer step, so what travels is the momentum;
//   - its state for checkpoints, and its bytes for memory_report.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/compression_ops.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/compressed_exchange.hpp"
#include "loom/parallel/grad_compress.hpp"
#include "loom/parallel/gradient_exchange.hpp"
#include "loom/parallel/shard_layout.hpp"

namespace loom::parallel {

template <comm::Communicator C>
class CompressedGradientExchange final : public GradientExchange<C> {
public:
    using Notice = typename CompressedExchange<C>::Notice;

    // `zero_stage` and `beta1`: the executor's ZeRO stage and AdamW's beta1
    // (one-bit mixes the momentum only where it is whole, at ZeRO 0).
    CompressedGradientExchange(C& comm, const ShardLayout& layout, const std::vector<nn::Unit>& units,
                               const Compression& compression, std::int64_t warmup, int zero_stage, float beta1,
                               const Notice& notice, Device where)
        : comm_(&comm),
          exchange_(comm, layout, units, compression, notice, where),
          warmup_(warmup),
          zero_stage_(zero_stage),
          beta1_(beta1),
          where_(where) {}

    [[nodiscard]] comm::Request reduce_async(const GradientBucket& bucket, const OptimizerArrays& optimizer) override {
        // After the warm-up: compressed from the step whose optimizer step is warmup + 1.
        if (optimizer.optimizer_steps < warmup_) return AveragingExchange<C>::average_async(*comm_, bucket);
        const auto span_of = [](const Tensor& t) {
            return std::span<float>(t.data<float>(), static_cast<std::size_t>(t.numel()));
        };
        if (mixes_momentum()) {
            const auto& g = exchange_.layout().group(bucket.group);
            kernels::mix_momentum(where_, bucket.grad.data<float>(), optimizer.first_moment.data<float>() + g.offset,
                                  g.padded, beta1_);
            momentum_mixed_ = true;
        }
        return exchange_.reduce_async(bucket.group, span_of(bucket.grad), span_of(bucket.out));
    }

    void before_optimizer_step(const OptimizerArrays& optimizer) override {
        if (!momentum_mixed_) return;
        kernels::unmix_momentum(where_, optimizer.grads.data<float>(), optimizer.first_moment.data<float>(),
                                optimizer.grads.numel(), beta1_);
        momentum_mixed_ = false;
    }

    void check_readable_by(const std::string& policy) const override {
        LOOM_CHECK(!mixes_momentum(), "Executor: policy ", policy, " would read gradients that ",
                   compression().describe(), " mixes into the momentum at ZeRO 0; use ZeroShard<1> or more");
    }

    [[nodiscard]] std::string not_the_average() const override {
        return "GradCompress<" + compression().describe() + "> changes what the exchange hands the optimizer step";
    }

    void reset() override { exchange_.reset(); }
    [[nodiscard]] Compression compression() const noexcept override { return exchange_.compression(); }
    [[nodiscard]] std::int64_t state_size() const noexcept override { return exchange_.state_size(); }
    void save_state(std::span<float> out) const override { exchange_.save_state(out); }
    void load_state(std::span<const float> in) override { exchange_.load_state(in); }
    [[nodiscard]] std::int64_t state_bytes() const noexcept override { return exchange_.state_bytes(); }
    [[nodiscard]] std::int64_t buffer_bytes() const noexcept override { return exchange_.buffer_bytes(); }

private:
    // One-bit at ZeRO 0 exchanges momentum (mixed before, unmixed at the optimizer step).
    [[nodiscard]] bool mixes_momentum() const noexcept {
        return zero_stage_ == 0 && exchange_.compression().compresses_momentum();
    }

    C* comm_;
    CompressedExchange<C> exchange_;
    std::int64_t warmup_;
    int zero_stage_;
    float beta1_;
    Device where_;
    bool momentum_mixed_ = false;  // this step's gradients were mixed into the momentum
};

}  // namespace loom::parallel
