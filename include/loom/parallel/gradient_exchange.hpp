// The gradient exchange: the component the executor calls at each
// reduce_grads instruction of its step program, to average one bucket of
// gradients over the gradient axis (dp, or dp x sp). The executor says which
// bucket, where its gradient is and where the average goes (the whole bucket,
// or this rank's block under ZeRO); the exchange decides how the bytes travel
// and owns whatever run-time state that takes: AveragingExchange, below, is
// the all-reduce or reduce-scatter of the f32 values; GradCompress on the dp
// axis is parallel/compressed_gradient_exchange.hpp. Which one a plan asks
// for is parallel/plan_exchanges.hpp's to say, so the executor names none.
//
// The interface lives here rather than in exec/ because the compressed
// exchange, beside its codecs in parallel/, implements it, and a folder only
// includes the ones above it (docs/design.md).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/parallel/grad_compress.hpp"

namespace loom::parallel {

// One reduce_grads instruction's bucket: group `group` of the shard layout,
// its padded gradient `grad`, and `out`, where the average goes: `grad`
// itself (all-reduce: every rank gets the whole average) or this rank's block
// of it (reduce-scatter). `grad` is read when the exchange starts; `out` is
// written when the returned request has been waited for.
struct GradientBucket {
    int group = 0;
    Tensor grad, out;
    bool all_reduce = true;
};

// What an exchange may read of the optimizer besides the bucket. Passed per
// call, since the executor that owns it may move: the optimizer steps taken
// before this step's, and the gradient arena and AdamW's first moment (whole
// arrays in the padded layout at ZeRO 0, the shard's otherwise).
struct OptimizerArrays {
    std::int64_t optimizer_steps = 0;
    Tensor grads, first_moment;
};

// What a user chooses of the exchange besides the strategy (ExecutorOptions::exchange).
struct ExchangeOptions {
    // GradCompress: steps of uncompressed exchange before the dp compressor
    // starts (PowerSGD and one-bit want some; the others need none).
    std::int64_t compress_warmup = 0;
};

// How the exchange is set up besides the plan (parallel/plan_exchanges.hpp).
struct ExchangeSetup {
    std::int64_t warmup = 0;  // ExchangeOptions::compress_warmup
    // Where this rank's one-time notices go (PowerSGD's matrices too small
    // for its rank); empty: this rank says nothing, so one rank of each
    // gradient group speaks. Any rank may pass one; the executor passes it
    // on the first rank of each gradient group at tp position 0.
    std::function<void(const std::string&)> notice{};
    Device device = host_device;  // where the gradients are
};

// The setup from a user's options: `notice`, where this rank's notices go
// (empty: this rank says nothing); `device`, where the gradients are.
[[nodiscard]] inline ExchangeSetup exchange_setup(const ExchangeOptions& options,
                                                  std::function<void(const std::string&)> notice, Device device) {
    return {options.compress_warmup, std::move(notice), device};
}

template <comm::Communicator C>
class GradientExchange {
public:
    GradientExchange() = default;
    GradientExchange(const GradientExchange&) = delete;
    GradientExchange& operator=(const GradientExchange&) = delete;
    virtual ~GradientExchange() = default;

    // Starts averaging `bucket` over the gradient axis.
    [[nodiscard]] virtual comm::Request reduce_async(const GradientBucket& bucket, const OptimizerArrays& optimizer) = 0;
    // Called before each optimizer step reads the reduced gradients: puts
    // back whatever the exchange changed in the optimizer's arrays.
    virtual void before_optimizer_step(const OptimizerArrays&) {}
    // Throws when a policy named `policy`, run between the exchange and the
    // optimizer step (exec/policy_component.hpp), would not read the
    // gradients it expects.
    virtual void check_readable_by(const std::string& policy) const { (void)policy; }
    // Why what this exchange hands the optimizer step may differ from the
    // averaged gradient (a compressor's estimate, momentum mixed in), for an
    // optimizer that reads the gradient itself (Executor::gradient); empty
    // when it is the average.
    [[nodiscard]] virtual std::string not_the_average() const { return {}; }

    // Back to the state of a fresh run (the executor's initialize()).
    virtual void reset() {}
    // The compressor it applies; off for a plain exchange.
    [[nodiscard]] virtual Compression compression() const noexcept { return {}; }
    // This rank's state that a checkpoint keeps for an exact resume (host
    // memory, f32 elements): none for a plain exchange.
    [[nodiscard]] virtual std::int64_t state_size() const noexcept { return 0; }
    virtual void save_state(std::span<float> out) const { (void)out; }
    virtual void load_state(std::span<const float> in) {
        LOOM_CHECK(in.empty(), "GradientExchange::load_state: ", in.size(),
                   " elements of compressor state for an executor without a dp compressor");
    }
    // Bytes of that state, and of working buffers (memory_report).
    [[nodiscard]] virtual std::int64_t state_bytes() const noexcept { return 0; }
    [[nodiscard]] virtual std::int64_t buffer_bytes() const noexcept { return 0; }
};

// The plain exchange: the communicator's averaging all-reduce, or
// reduce-scatter into this rank's block, of the f32 gradient.
template <comm::Communicator C>
class AveragingExchange final : public GradientExchange<C> {
public:
    explicit AveragingExchange(C& comm) : comm_(&comm) {}

    [[nodiscard]] comm::Request reduce_async(const GradientBucket& bucket, const OptimizerArrays&) override {
        return average_async(*comm_, bucket);
    }

    // The same averaging, for exchanges that fall back on it (a compressor's warm-up).
    [[nodiscard]] static comm::Request average_async(C& comm, const GradientBucket& bucket) {
        if (bucket.all_reduce) return comm.all_reduce_async(bucket.grad, bucket.out, comm::ReduceOp::avg);
        return comm.reduce_scatter_async(bucket.grad, bucket.out, comm::ReduceOp::avg);
    }

private:
    C* comm_;
};

}  // namespace loom::parallel
