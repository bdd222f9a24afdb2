// The activation buffers of a cached forward over a model's layers
// (infer/cached_model.hpp): each layer writes its output rows into a buffer
// other than its input's and any a skip connection still holds, so a chain of
// L layers needs a few buffers, not L. The buffers are kept between forwards
// and only grow, so a warm decode step allocates and zero-fills nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <span>
#include <vector>

namespace loom::infer {

// `rows` x `features` floats in buffer `buffer` of a RowPool.
struct Rows {
    int buffer = -1;
    std::int64_t rows = 0, features = 0;
    float* data = nullptr;
};

class RowPool {
public:
    // A buffer for rows x features that is none of `avoid` and not held.
    [[nodiscard]] Rows take(std::int64_t rows, std::int64_t features, std::span<const int> avoid) {
        std::size_t b = 0;
        while (b < buffers_.size() &&
               (held_[b] > 0 || std::find(avoid.begin(), avoid.end(), static_cast<int>(b)) != avoid.end()))
            ++b;
        if (b == buffers_.size()) {
            buffers_.emplace_back();
            held_.push_back(0);
        }
        // Grown, never shrunk: a buffer holds rows of different widths in turn, and shrinking then
        // growing it again would zero-fill the difference on every step.
        const auto floats = static_cast<std::size_t>(rows * features);
        if (buffers_[b].size() < floats) buffers_[b].resize(floats);
        return {static_cast<int>(b), rows, features, buffers_[b].data()};
    }
    [[nodiscard]] Rows take(std::int64_t rows, std::int64_t features, std::initializer_list<int> avoid) {
        return take(rows, features, std::span<const int>(avoid.begin(), avoid.size()));
    }

    // A skip connection keeps `rows` until release: no take hands its buffer out.
    void hold(const Rows& rows) { ++held_[static_cast<std::size_t>(rows.buffer)]; }
    void release(const Rows& rows) { --held_[static_cast<std::size_t>(rows.buffer)]; }
    // Nothing held (after a forward that failed halfway).
    void release_all() { std::fill(held_.begin(), held_.end(), 0); }

private:
    std::deque<std::vector<float>> buffers_;  // a deque: a new buffer never moves the others
    std::vector<int> held_;                   // per buffer: how many skips keep it
};

}  // namespace loom::infer
