// Shape and Strides: small fixed-capacity extents of a tensor (no heap), with
// printing so that shape errors can name both shapes.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>

#include "loom/core/error.hpp"

namespace loom {

// Extents along up to max_rank dimensions. Also used for strides, counted in
// elements (not bytes) like PyTorch's.
class Extents {
public:
    static constexpr int max_rank = 6;

    constexpr Extents() = default;
    Extents(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
    template <std::input_iterator It>
    Extents(It first, It last) { assign(first, last); }

    [[nodiscard]] constexpr int rank() const noexcept { return rank_; }
    [[nodiscard]] constexpr std::int64_t operator[](int i) const noexcept { return dims_[i]; }
    [[nodiscard]] constexpr std::int64_t& operator[](int i) noexcept { return dims_[i]; }
    [[nodiscard]] constexpr const std::int64_t* begin() const noexcept { return dims_.data(); }
    [[nodiscard]] constexpr const std::int64_t* end() const noexcept { return dims_.data() + rank_; }

    // Dimension `i`, where a negative i counts from the back (-1 is the last).
    [[nodiscard]] std::int64_t dim(int i) const {
        LOOM_CHECK(rank_ > 0, "dimension ", i, " of a scalar (shape []) does not exist; a scalar has no dimensions");
        const int at = i < 0 ? i + rank_ : i;
        LOOM_CHECK(at >= 0 && at < rank_, "dimension ", i, " is out of range for ", *this,
                   " of rank ", rank_, "; valid are ", -rank_, "..", rank_ - 1);
        return dims_[at];
    }

    // Product of the extents; 1 for rank 0 (a scalar).
    [[nodiscard]] constexpr std::int64_t numel() const noexcept {
        std::int64_t n = 1;
        for (int i = 0; i < rank_; ++i) n *= dims_[i];
        return n;
    }

    friend constexpr bool operator==(const Extents& a, const Extents& b) noexcept {
        return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
    }

    // Prints "[2, 3, 4]"; a scalar prints "[]".
    friend std::ostream& operator<<(std::ostream& out, const Extents& e) {
        out << '[';
        for (int i = 0; i < e.rank_; ++i) out << (i ? ", " : "") << e.dims_[i];
        return out << ']';
    }

    [[nodiscard]] std::string str() const {
        std::ostringstream out;
        out << *this;
        return std::move(out).str();
    }

private:
    template <class It>
    void assign(It first, It last) {
        int n = 0;
        for (; first != last; ++first, ++n)
            if (n < max_rank) dims_[n] = static_cast<std::int64_t>(*first);
        LOOM_CHECK(n <= max_rank, "a tensor has at most ", max_rank, " dimensions, got ", n);
        rank_ = n;
        // numel() multiplies without checks on the hot path, so every shape
        // that exists must have a product that fits in 63 bits.
        std::int64_t product = 1;
        for (int i = 0; i < rank_; ++i) {
            LOOM_CHECK(dims_[i] >= 0, "dimension ", i, " of ", *this, " is negative; sizes must be >= 0");
            LOOM_CHECK(dims_[i] == 0 || product <= std::numeric_limits<std::int64_t>::max() / dims_[i], "shape ",
                       *this, " has more than 2^63 - 1 elements");
            product *= dims_[i];
        }
    }

    std::array<std::int64_t, max_rank> dims_{};
    int rank_ = 0;
};

using Shape = Extents;
using Strides = Extents;

// Row-major strides (last dimension contiguous) for `shape`.
[[nodiscard]] inline Strides contiguous_strides(const Shape& shape) {
    Strides strides = shape;
    std::int64_t step = 1;
    for (int i = shape.rank() - 1; i >= 0; --i) {
        strides[i] = step;
        step *= shape[i];
    }
    return strides;
}

}  // namespace loom
