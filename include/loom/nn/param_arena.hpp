// ParamArena: every Param of a model bound to one contiguous allocation of
// values and one of gradients, in reflection order. A data-parallel bucket or
// a ZeRO shard is then a slice of these spans, never a copy, and an optimizer
// steps the whole model in one loop. The arena lives on the host or on a
// device (ParamArena(model, cuda_device(0))): the Params' tensors then point
// into device memory and the layers run there.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/device_buffer.hpp"
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

    // Binds every Param of `model` (which must outlive the arena and not move)
    // to zero-filled memory on `where`.
    template <class Model>
    explicit ParamArena(Model& model, Device where = host_device) {
        check_device_usable(where);
        std::int64_t total = 0;
        reflect::visit_params(model, [&](Param& p, std::string_view path) {
            LOOM_CHECK(p.dtype == DType::f32, "ParamArena: parameter ", path, " is ", p.dtype,
                       "; the host training path keeps f32 parameters");
            entries_.push_back({std::string(path), &p, total});
            total += p.numel();
        });
        values_ = DeviceBuffer(DType::f32, Shape{total}, where);
        grads_ = DeviceBuffer(DType::f32, Shape{total}, where);
        for (auto& entry : entries_) {
            float* value = values_.data<float>() + entry.offset;
            float* grad = grads_.data<float>() + entry.offset;
            entry.param->value = Tensor::of(value, entry.param->shape, where);
            entry.param->grad = Tensor::of(grad, entry.param->shape, where);
        }
    }

    ParamArena(const ParamArena&) = delete;
    ParamArena& operator=(const ParamArena&) = delete;
    ParamArena(ParamArena&&) noexcept = default;
    ParamArena& operator=(ParamArena&&) noexcept = default;

    [[nodiscard]] std::int64_t size() const noexcept { return values_.numel(); }
    [[nodiscard]] Device device() const noexcept { return values_.device(); }
    // The values and gradients as host spans: a host arena only (copy a
    // device arena's with values_tensor() and copy_tensor).
    [[nodiscard]] std::span<float> values() const { return host_span(values_); }
    [[nodiscard]] std::span<float> grads() const { return host_span(grads_); }
    // Both as one-dimensional tensors, wherever they are.
    [[nodiscard]] Tensor values_tensor() const { return values_.tensor(); }
    [[nodiscard]] Tensor grads_tensor() const { return grads_.tensor(); }
    [[nodiscard]] const std::vector<Entry>& entries() const noexcept { return entries_; }

    void zero_grads() const { fill_zero_bytes(grads_.raw(), grads_.device(), grads_.nbytes()); }

    // The model's initial values from the counter-based RNG: element k of a
    // parameter is a pure function of (seed, its path, k). A device arena's
    // are drawn on the host and copied, so they equal the host's bit for bit.
    template <class Model>
    void initialize(const Model& model, std::uint64_t seed) const {
        if (device().kind == DeviceKind::host) {
            initialize_range(model, seed, values(), 0);
            return;
        }
        std::vector<float> staged(static_cast<std::size_t>(size()));
        initialize_range(model, seed, std::span<float>(staged), 0);
        copy_tensor(values_tensor(), Tensor::of(staged.data(), {size()}));
    }

private:
    [[nodiscard]] std::span<float> host_span(const DeviceBuffer& b) const {
        LOOM_CHECK(b.device().kind == DeviceKind::host, "ParamArena: the parameters live on ", b.device(),
                   "; read them on the host through a copy (copy_tensor of values_tensor())");
        return {b.data<float>(), static_cast<std::size_t>(b.numel())};
    }

    std::vector<Entry> entries_;
    DeviceBuffer values_;
    DeviceBuffer grads_;
};

}  // namespace loom::nn
