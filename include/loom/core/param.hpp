// Param: a trainable tensor that a layer declares by shape and initialiser.
// Reflection finds every Param in a model; the parameter arena binds each
// one's value and gradient to a slice of one contiguous allocation per rank.
#pragma once

#include <algorithm>
#include <array>
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

// Which coordinate of its tp rank a cut follows: the rank itself (Megatron
// 1D), or its row or column on an Optimus q x q grid (rank = row * q + column);
// or `holder`: one tp rank holds the whole tensor and the others none of it
// (a layer that places its own parts, nn::TensorCut::own: Kraken's sub-layer
// i on rank i). A held cut is always {dim 0, start 0}: dimension 0 is whole
// on the holder and empty (extent 0) on every other rank.
enum class CutAxis : std::uint8_t { rank, grid_row, grid_column, holder };

// One cut of a shard: dimension `dim` of the whole tensor is `groups` equal
// blocks (1; 3 for an attention's q, k, v) and the shard holds
// [start, start + its extent / groups) of each, in block order.
struct ParamCut {
    int dim = -1;
    std::int64_t start = 0;
    std::int64_t groups = 1;
    CutAxis axis = CutAxis::rank;

    friend constexpr bool operator==(const ParamCut&, const ParamCut&) = default;
};

// Where a tensor-parallel shard sits in its whole tensor `full`: up to two
// cuts (1D tp cuts one dimension, 2D tp a matrix's two), cuts[0] first. No
// cuts: the Param is whole. Initial values and checkpoints are the whole
// tensor's, so a shard is a view into the serial run's parameter.
struct ParamSlice {
    Shape full{};
    std::array<ParamCut, 2> cuts{};
    int holder = -1;  // the tp rank holding it whole, for a CutAxis::holder cut

    [[nodiscard]] bool sliced() const noexcept { return cuts[0].dim >= 0; }
    [[nodiscard]] int count() const noexcept { return (cuts[0].dim >= 0) + (cuts[1].dim >= 0); }
    // The cut along `dim`, or null when that dimension is whole.
    [[nodiscard]] const ParamCut* along(int dim) const noexcept {
        for (const ParamCut& c : cuts)
            if (c.dim >= 0 && c.dim == dim) return &c;
        return nullptr;
    }
    // The first cut's start (1D shards have only that one).
    [[nodiscard]] std::int64_t start() const noexcept { return cuts[0].start; }
    // Whether one tp rank holds the whole tensor and the others none of it.
    [[nodiscard]] bool held() const noexcept { return cuts[0].dim >= 0 && cuts[0].axis == CutAxis::holder; }
    // Whether this rank has a part of the tensor that the tp ranks split (a
    // Megatron or Optimus cut), so the layer computes on a part and sums or
    // gathers over the group; a held Param is whole wherever it is held.
    [[nodiscard]] bool shard() const noexcept { return sliced() && !held(); }
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
        std::int64_t whole = 0, stride = 1;
        for (int d = shape.rank() - 1; d >= 0; --d) {
            const std::int64_t local = shape[d], along = k % local;
            k /= local;
            whole += full_along(d, along) * stride;
            stride *= slice.full[d];
        }
        return whole;
    }
    // Elements from k on that are also consecutive in the whole tensor: up to
    // the end of the current run of the innermost cut dimension.
    [[nodiscard]] std::int64_t contiguous_from(std::int64_t k) const noexcept {
        if (!slice.sliced()) return numel() - k;
        const int dim = std::max(slice.cuts[0].dim, slice.cuts[1].dim);
        std::int64_t inner = 1;
        for (int d = dim + 1; d < shape.rank(); ++d) inner *= shape[d];
        const std::int64_t per_group = shape[dim] / slice.along(dim)->groups;
        const std::int64_t along = (k / inner) % shape[dim];
        return (per_group - along % per_group) * inner - k % inner;
    }

    // Prints "Param(f32, [768, 3072], normal(mean=0, std=0.02))", and for a
    // shard "Param(f32, [768, 768] of [768, 3072] from 768 along dim 1, ...)".
    friend std::ostream& operator<<(std::ostream& out, const Param& p) {
        out << "Param(" << p.dtype << ", " << p.shape;
        if (p.slice.held()) {
            out << " of " << p.slice.full << " held by tp rank " << p.slice.holder;
        } else if (p.slice.sliced()) {
            out << " of " << p.slice.full;
            for (const ParamCut& c : p.slice.cuts) {
                if (c.dim < 0) continue;
                out << (&c == &p.slice.cuts[0] ? " from " : ", from ") << c.start << " along dim " << c.dim;
                if (c.groups > 1) out << " in each of " << c.groups << " blocks";
            }
        }
        return out << ", " << p.init << ')';
    }

    // Tensor-parallel rank `rank`'s view of a Param that rank `holder` holds
    // whole: the Param itself there, an empty one (dimension 0 of extent 0)
    // that still knows its whole shape everywhere else. The checkpoint's
    // layout and each element's initial value stay the whole model's.
    [[nodiscard]] Param held_by(int holder, int rank) const {
        Param out{shape, init, dtype, {}, {}, {shape, {ParamCut{0, 0, 1, CutAxis::holder}, ParamCut{}}, holder}};
        if (rank != holder) out.shape[0] = 0;
        return out;
    }

private:  // functions only: Param stays an aggregate
    // Where local index `along` of dimension d lies in the whole tensor.
    [[nodiscard]] std::int64_t full_along(int d, std::int64_t along) const noexcept {
        const ParamCut* c = slice.along(d);
        if (c == nullptr) return along;
        const std::int64_t per_group = shape[d] / c->groups;
        return along / per_group * (slice.full[d] / c->groups) + c->start + along % per_group;
    }
};

}  // namespace loom
