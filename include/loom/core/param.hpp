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

struct Param {
    Shape shape;
    Init init = Init::zeros();
    DType dtype = DType::f32;
    Tensor value{};  // bound by the parameter arena; empty until then
    Tensor grad{};

    [[nodiscard]] std::int64_t numel() const noexcept { return shape.numel(); }
    [[nodiscard]] bool bound() const noexcept { return value.raw() != nullptr || numel() == 0; }

    // Prints "Param(f32, [768, 3072], normal(mean=0, std=0.02))".
    friend std::ostream& operator<<(std::ostream& out, const Param& p) {
        return out << "Param(" << p.dtype << ", " << p.shape << ", " << p.init << ')';
    }
};

}  // namespace loom
