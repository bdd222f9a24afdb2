// ParamArena: every Param of a model bound to one contiguous allocation of
// values and one of gradients, in reflection order. A data-parallel bucket or
// a ZeRO shard is then a slice of these spans, never a copy, and an optimizer
// steps the whole model in one loop.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/init.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"

namespace loom::nn {

class ParamArena {
public:
    struct Entry {
        std::string path;  // reflection path, e.g. "2.0.1.0"
        Param* param;
        std::int64_t offset;  // first element in the arena
    };

    // Binds every Param of `model` (which must outlive the arena and not move).
    template <class Model>
    explicit ParamArena(Model& model) {
        std::int64_t total = 0;
        reflect::visit_params(model, [&](Param& p, std::string_view path) {
            LOOM_CHECK(p.dtype == DType::f32, "ParamArena: parameter ", path, " is ", p.dtype,
                       "; the host training path keeps f32 parameters");
            entries_.push_back({std::string(path), &p, total});
            total += p.numel();
        });
        values_ = Buffer<Host>(DType::f32, Shape{total});
        grads_ = Buffer<Host>(DType::f32, Shape{total});
        for (auto& entry : entries_) {
            float* value = values_.data<float>() + entry.offset;
            float* grad = grads_.data<float>() + entry.offset;
            entry.param->value = Tensor::of(value, entry.param->shape);
            entry.param->grad = Tensor::of(grad, entry.param->shape);
        }
    }

    ParamArena(const ParamArena&) = delete;
    ParamArena& operator=(const ParamArena&) = delete;
    ParamArena(ParamArena&&) noexcept = default;
    ParamArena& operator=(ParamArena&&) noexcept = default;

    [[nodiscard]] std::int64_t size() const noexcept { return values_.numel(); }
    [[nodiscard]] std::span<float> values() const { return {values_.data<float>(), static_cast<std::size_t>(size())}; }
    [[nodiscard]] std::span<float> grads() const { return {grads_.data<float>(), static_cast<std::size_t>(size())}; }
    [[nodiscard]] const std::vector<Entry>& entries() const noexcept { return entries_; }

    void zero_grads() const {
        for (float& g : grads()) g = 0.0f;
    }

    // The model's initial values from the counter-based RNG: element k of a
    // parameter is a pure function of (seed, its path, k).
    template <class Model>
    void initialize(const Model& model, std::uint64_t seed) const {
        initialize_range(model, seed, values(), 0);
    }

private:
    std::vector<Entry> entries_;
    Buffer<Host> values_;
    Buffer<Host> grads_;
};

}  // namespace loom::nn
