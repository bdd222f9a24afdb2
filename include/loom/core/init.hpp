// Parameter initialisation from the counter-based RNG: element k of a Param
// is a pure function of (seed, the Param's path, k), so a rank holding any
// shard of a Param writes exactly the values the serial run writes there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/rng.hpp"
#include "loom/core/tensor.hpp"

namespace loom {

// The RNG stream a Param at `path` draws its initial values from.
[[nodiscard]] constexpr RngStream init_stream(std::uint64_t seed, std::string_view path) {
    return RngStream{seed, stream_id(path)};
}

// Writes elements [first, first + out.size()) of the flattened Param `p`'s
// initial values (drawn for the Param at `path` under `seed`) into `out`.
inline void initialize_shard(const Param& p, std::string_view path, std::uint64_t seed, std::span<float> out,
                             std::int64_t first = 0) {
    LOOM_CHECK(first >= 0 && first <= p.numel() && static_cast<std::int64_t>(out.size()) <= p.numel() - first,
               "shard [", first, ", ",
               first + static_cast<std::int64_t>(out.size()), ") is outside Param ", path, " of ", p.numel(),
               " elements");
    const RngStream rng = init_stream(seed, path);
    // A tensor-parallel shard draws the whole tensor's values at its elements'
    // places there, one contiguous run at a time.
    for (std::int64_t k = first, end = first + static_cast<std::int64_t>(out.size()); k < end;) {
        const std::int64_t run = std::min(end - k, p.contiguous_from(k));
        const auto part = out.subspan(static_cast<std::size_t>(k - first), static_cast<std::size_t>(run));
        const auto offset = static_cast<std::uint64_t>(p.full_index(k));
        switch (p.init.kind) {
            case Init::Kind::zeros: std::fill(part.begin(), part.end(), 0.0f); break;
            case Init::Kind::ones: std::fill(part.begin(), part.end(), 1.0f); break;
            case Init::Kind::normal: rng.fill_normal(part, offset, p.init.a, p.init.b); break;
            case Init::Kind::uniform: rng.fill_uniform(part, offset, p.init.a, p.init.b); break;
            default: LOOM_FAIL("Param ", path, " has an unknown initialiser kind ", static_cast<int>(p.init.kind));
        }
        k += run;
    }
}

// Initialises the whole of `p` into `value` (f32, host, p.numel() elements).
inline void initialize(const Param& p, std::string_view path, std::uint64_t seed, const Tensor& value) {
    LOOM_CHECK(value.numel() == p.numel(), "Param ", path, " ", p, " cannot be initialised into ", value,
               " of ", value.numel(), " elements");
    initialize_shard(p, path, seed, value.span<float>(), 0);
}

// Writes elements [first, first + out.size()) of `model`'s flattened initial
// parameters, in arena order (visit_params order, each Param's elements
// row-major) into `out`. The range may cut through Params, as a ZeRO shard
// or a rank's slice of the arena does; only that range is generated.
template <class Model>
void initialize_range(const Model& model, std::uint64_t seed, std::span<float> out, std::int64_t first = 0) {
    const std::int64_t total = reflect::parameter_numel(model);
    const std::int64_t count = static_cast<std::int64_t>(out.size());
    LOOM_CHECK(first >= 0 && first <= total && count <= total - first, "range [", first, ", ", first + count,
               ") is outside the model's ", total, " parameter elements");
    const std::int64_t last = first + count;
    std::int64_t base = 0;  // arena offset of the current Param
    reflect::visit_params(model, [&](const Param& p, std::string_view path) {
        const std::int64_t lo = std::max(first, base), hi = std::min(last, base + p.numel());
        if (lo < hi)
            initialize_shard(p, path, seed, out.subspan(static_cast<std::size_t>(lo - first),
                                                        static_cast<std::size_t>(hi - lo)),
                             lo - base);
        base += p.numel();
    });
}

}  // namespace loom
