// Context: the state of one micro-batch in flight. It owns the activation
// memory (a bump arena, rewound by reset() without freeing, so a steady
// training loop allocates nothing after its first step), each layer's saved
// state between forward and backward, and the micro-batch's targets and loss.
// Pipelines hold several contexts at once; zero-bubble schedules call a
// layer's backward_weight long after its backward_input, so saved state is
// found by the layer's address, not by a stack.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <functional>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/nn/sequence_layout.hpp"

namespace loom::nn {

struct TensorGrid;

class Context {
public:
    Context() = default;
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
    Context(Context&&) noexcept = default;
    Context& operator=(Context&&) noexcept = default;

    // Activation memory for this micro-batch, valid until reset(). Not zeroed
    // after the first step: kernels write every element they produce.
    [[nodiscard]] Tensor alloc(const Shape& shape, DType dtype = DType::f32) {
        const std::size_t bytes = (static_cast<std::size_t>(shape.numel()) * size_of(dtype) + 63) / 64 * 64;
        if (chunks_.empty() || used_ + bytes > chunks_.back().nbytes()) {
            // A new chunk; reset() later merges all of them into one.
            chunks_.push_back(chunk(std::max<std::size_t>(bytes, std::size_t{1} << 20)));
            used_ = 0;
        }
        void* at = static_cast<std::byte*>(chunks_.back().raw()) + used_;
        used_ += bytes;
        total_ += bytes;
        return Tensor(at, dtype, shape, device_);
    }

    // Where this context's activations live: the host (the default) or a
    // device whose backend is built in. Set before the first alloc, or
    // between micro-batches; the memory moves on the next alloc.
    void set_device(Device where) {
        if (where == device_) return;
        check_device_usable(where);
        chunks_.clear();
        used_ = 0;
        total_ = 0;
        device_ = where;
    }
    [[nodiscard]] Device device() const noexcept { return device_; }

    // `t` on this context's device: itself when it is there already, else a
    // copy in activation memory (valid until reset()). Inputs and targets
    // arrive from the host's data loader.
    [[nodiscard]] Tensor on_device(const Tensor& t) {
        if (t.device() == device_ || t.numel() == 0) return t;
        Tensor copy = alloc(t.shape(), t.dtype());
        copy_tensor(copy, t);
        return copy;
    }

    // Starts a new micro-batch: all activations are released at once. The
    // saved-state objects stay (their views are rewritten by the next forward).
    void reset() {
        if (chunks_.size() > 1) {
            // Next time everything fits in one chunk.
            const std::size_t peak = std::max(total_, capacity());
            chunks_.clear();
#if defined(__GLIBC__)
            // The small first-step chunks may have come from the heap (glibc
            // raises its mmap threshold after any large free); give their
            // pages back, or they stay resident beside the merged chunk.
            malloc_trim(0);
#endif
            chunks_.push_back(chunk(peak));
        }
        peak_ = std::max(peak_, total_);
        used_ = 0;
        total_ = 0;
        loss_ = 0;
        ++micro_batch_;
    }

    // The state `layer` saves between its forward and backward passes, one
    // object per (context, layer), default-constructed on first use.
    // Keyed by (address, state type): a layer and its first member share an
    // address (CausalSelfAttention and its qkv Linear), never a state type.
    template <class State>
    [[nodiscard]] State& saved(const void* layer) {
        auto& slot = saved_[Key{layer, std::type_index(typeid(State))}];
        if (!slot) slot = std::make_unique<Holder<State>>();
        return static_cast<Holder<State>&>(*slot).value;
    }

    // A matrix product of `layer` (its output, of `shape`): memory from
    // alloc(), filled by compute(tensor). While products are kept elsewhere
    // (keep_products_in, Recompute<Selective>), the tensor comes from the
    // keeper's memory instead, so it outlives this context's reset; and a
    // replay hands back what the first run computed, without computing it
    // again: the product is what costs most to recompute for its bytes.
    // `layer` keys the product: one product per key and micro-batch (a layer
    // that makes two passes the addresses of the members that make them).
    template <class Compute>
    [[nodiscard]] Tensor product(const void* layer, const Shape& shape, Compute&& compute) {
        if (keeper_ == nullptr) {
            Tensor y = alloc(shape);
            compute(y);
            return y;
        }
        KeptProduct& kept = keeper_->saved<KeptProduct>(layer);
        const std::uint64_t now = keeper_->micro_batch_;
        if (replaying_) {
            LOOM_CHECK(kept.made_in == now, "Context::product: the replay asks for a product its first run did not "
                       "make; a replayed forward must make the same products as its first run");
            LOOM_CHECK(kept.value.shape() == shape, "Context::product: the replay asks for shape ", shape,
                       " but the first run kept ", kept.value.shape(), "; a replayed forward must see the same input");
            return kept.value;
        }
        LOOM_CHECK(kept.made_in != now, "Context::product: a second product under the same key in one micro-batch; "
                   "give each product its own key (the address of the member that makes it)");
        kept.value = keeper_->alloc(shape);
        kept.made_in = now;
        compute(kept.value);
        return kept.value;
    }

    // Products go to `keeper` (and, when `replay`, come back from it) until
    // this is called again with null. The executor sets it around a unit's
    // forward and its recompute under Recompute<Selective>.
    void keep_products_in(Context* keeper, bool replay) noexcept {
        keeper_ = keeper;
        replaying_ = keeper != nullptr && replay;
    }
    // keep_products_in(keeper, replay) until the returned guard goes, even by
    // an exception (a pooled context must not keep pointing at a keeper).
    class KeepingProducts {
    public:
        explicit KeepingProducts(Context& ctx) noexcept : ctx_(&ctx) {}
        KeepingProducts(const KeepingProducts&) = delete;
        KeepingProducts& operator=(const KeepingProducts&) = delete;
        ~KeepingProducts() { ctx_->keep_products_in(nullptr, false); }

    private:
        Context* ctx_;
    };
    [[nodiscard]] KeepingProducts keeping_products_in(Context* keeper, bool replay) noexcept {
        keep_products_in(keeper, replay);
        return KeepingProducts(*this);
    }

    // The targets of this micro-batch (token ids, one per output row), read
    // by the loss layer.
    void set_targets(const Tensor& targets) { targets_ = targets; }
    [[nodiscard]] const Tensor& targets() const noexcept { return targets_; }

    // The tensor-parallel group sharded layers talk to (nn/tensor_group.hpp);
    // null when the model runs whole. Set by the executor, kept across reset().
    void set_tensor_group(const TensorGroup* group) noexcept { tensor_group_ = group; }
    [[nodiscard]] const TensorGroup* tensor_group() const noexcept { return tensor_group_; }

    // The Optimus 2D grid (nn/summa.hpp) that layers cut by Split::grid use;
    // null unless the tp axis is a 2D grid. Set by the executor.
    void set_tensor_grid(const TensorGrid* grid) noexcept { tensor_grid_ = grid; }
    [[nodiscard]] const TensorGrid* tensor_grid() const noexcept { return tensor_grid_; }

    // Sequence parallelism (nn/sequence_layout.hpp): this rank holds some
    // positions of every sequence; the embedding, attention and the data path
    // follow the layout. Inactive unless the executor has an sp axis.
    void set_sequence_parallelism(const SequenceParallelism& sp) noexcept { sequence_ = sp; }
    [[nodiscard]] const SequenceParallelism& sequence() const noexcept { return sequence_; }

    // The arithmetic of this micro-batch's matrix products (f32 unless the
    // trainer or executor was asked for bf16; kernels/matmul_precision.hpp).
    // Kept across reset().
    void set_matmul_precision(kernels::MatmulPrecision precision) noexcept { matmul_ = precision; }
    [[nodiscard]] kernels::MatmulPrecision matmul_precision() const noexcept { return matmul_; }

    void set_loss(float loss) noexcept { loss_ = loss; }
    [[nodiscard]] float loss() const noexcept { return loss_; }

    // Bytes handed out since reset(): what this micro-batch holds now.
    [[nodiscard]] std::size_t bytes_in_use() const noexcept { return total_; }

    // Bytes of activation memory the largest micro-batch so far needed.
    [[nodiscard]] std::size_t peak_bytes() const noexcept { return std::max(peak_, total_); }

private:
    struct HolderBase {
        virtual ~HolderBase() = default;
    };
    template <class State>
    struct Holder final : HolderBase {
        State value{};
    };
    struct KeptProduct {
        Tensor value;
        std::uint64_t made_in = 0;  // the keeper's micro-batch it was made in (0: never)
    };
    struct Key {
        const void* layer;
        std::type_index type;
        friend bool operator==(const Key&, const Key&) = default;
    };
    struct KeyHash {
        std::size_t operator()(const Key& k) const noexcept {
            return std::hash<const void*>()(k.layer) * 31 + k.type.hash_code();
        }
    };

    [[nodiscard]] DeviceBuffer chunk(std::size_t bytes) const {
        return DeviceBuffer(DType::f32, Shape{static_cast<std::int64_t>((bytes + 63) / 64 * 16)}, device_);
    }

    [[nodiscard]] std::size_t capacity() const {
        std::size_t sum = 0;
        for (const auto& c : chunks_) sum += c.nbytes();
        return sum;
    }

    std::vector<DeviceBuffer> chunks_;
    Device device_ = host_device;
    std::size_t used_ = 0;   // bytes used in the last chunk
    std::size_t total_ = 0;  // bytes handed out since reset()
    std::size_t peak_ = 0;
    std::unordered_map<Key, std::unique_ptr<HolderBase>, KeyHash> saved_;
    Tensor targets_;
    float loss_ = 0;
    const TensorGroup* tensor_group_ = nullptr;
    const TensorGrid* tensor_grid_ = nullptr;
    SequenceParallelism sequence_{};
    kernels::MatmulPrecision matmul_ = kernels::MatmulPrecision::f32;
    Context* keeper_ = nullptr;  // keep_products_in
    bool replaying_ = false;
    std::uint64_t micro_batch_ = 1;  // counts reset(): which micro-batch a kept product belongs to
};

}  // namespace loom::nn
