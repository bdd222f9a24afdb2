// Param: a trainable tensor that a layer declares by shape and initialiser.
// Reflection finds every Param in a model; the parameter arena binds each
// one's value and gradient to a slice of one contiguous allocation per rank.
#pragma once

#include <cstdint>
#include <ostream>

#include "loom/core/dtype.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"

namespace loom {

// How a parameter's initial values are drawn. Values come from the
// counter-based RNG keyed by (seed, the parameter's path), so a rank that
// holds a shard regenerates exactly the serial run's values for that shard.
struct Init {
    enum class Kind : std::uint8_t { zeros, ones, normal, uniform };
    Kind kind = Kind::zeros;
    float a = 0.0f;  // normal: mean; uniform: low
    float b = 0.0f;  // normal: standard deviation; uniform: high

    static constexpr Init zeros() { return {Kind::zeros, 0.0f, 0.0f}; }
    static constexpr Init ones() { return {Kind::ones, 0.0f, 0.0f}; }
    static constexpr Init normal(float stddev, float mean = 0.0f) { return {Kind::normal, mean, stddev}; }
    static constexpr Init uniform(float low, float high) { return {Kind::uniform, low, high}; }

    friend constexpr bool operator==(const Init&, const Init&) = default;

    friend std::ostream& operator<<(std::ostream& out, const Init& init) {
        switch (init.kind) {
            case Kind::zeros: return out << "zeros";
            case Kind::ones: return out << "ones";
            case Kind::normal: return out << "normal(mean=" << init.a << ", std=" << init.b << ')';
            case Kind::uniform: return out << "uniform(" << init.a << ", " << init.b << ')';
        }
        return out << "unknown-init";
    }
};

// Where a tensor-parallel shard sits in its whole tensor: dimension `dim` of
// `full` is `groups` equal blocks (1; 3 for an attention's q, k, v), and the
// Param holds [start, start + shape[dim] / groups) of each block, in block
// order. dim < 0: the Param is whole. Initial values and checkpoints are the
// whole tensor's, so a shard is a view into the serial run's parameter.
struct ParamSlice {
    Shape full{};
    int dim = -1;
    std::int64_t start = 0;
    std::int64_t groups = 1;

    [[nodiscard]] bool sliced() const noexcept { return dim >= 0; }
    friend constexpr bool operator==(const ParamSlice&, const ParamSlice&) = default;
};

struct Param {
    Shape shape;
    Init init = Init::zeros();
    DType dtype = DType::f32;
    Tensor value{};  // bound by the parameter arena; empty until then
    Tensor grad{};
    ParamSlice slice{};  // a tensor-parallel shard of a larger tensor, when sliced

    [[nodiscard]] std::int64_t numel() const noexcept { return shape.numel(); }
    [[nodiscard]] bool bound() const noexcept { return value.raw() != nullptr || numel() == 0; }

    // The whole tensor this Param is (a shard of).
    [[nodiscard]] const Shape& full_shape() const noexcept { return slice.sliced() ? slice.full : shape; }
    // Element k of this Param (row-major) is element full_index(k) of the whole tensor.
    [[nodiscard]] std::int64_t full_index(std::int64_t k) const noexcept {
        if (!slice.sliced()) return k;
        const Run r = run_of(k);
        const std::int64_t a = r.along / r.per_group, within = r.along % r.per_group;
        const std::int64_t full_along = a * (slice.full[slice.dim] / slice.groups) + slice.start + within;
        return r.outer * slice.full[slice.dim] * r.inner + full_along * r.inner + r.element;
    }
    // Elements from k on that are also consecutive in the whole tensor.
    [[nodiscard]] std::int64_t contiguous_from(std::int64_t k) const noexcept {
        if (!slice.sliced()) return numel() - k;
        const Run r = run_of(k);
        return (r.per_group - r.along % r.per_group) * r.inner - r.element;
    }

    // Prints "Param(f32, [768, 3072], normal(mean=0, std=0.02))", and for a
    // shard "Param(f32, [768, 768] of [768, 3072] from 768 along dim 1, ...)".
    friend std::ostream& operator<<(std::ostream& out, const Param& p) {
        out << "Param(" << p.dtype << ", " << p.shape;
        if (p.slice.sliced()) {
            out << " of " << p.slice.full << " from " << p.slice.start << " along dim " << p.slice.dim;
            if (p.slice.groups > 1) out << " in each of " << p.slice.groups << " blocks";
        }
        return out << ", " << p.init << ')';
    }

private:  // functions only: Param stays an aggregate
    // Element k's coordinates around the sliced dimension.
    struct Run {
        std::int64_t outer, along, element, inner, per_group;
    };
    [[nodiscard]] Run run_of(std::int64_t k) const noexcept {
        std::int64_t inner = 1;
        for (int d = slice.dim + 1; d < shape.rank(); ++d) inner *= shape[d];
        const std::int64_t local = shape[slice.dim];
        return {k / (local * inner), (k / inner) % local, k % inner, inner, local / slice.groups};
    }
};

}  // namespace loom
