// DataParallel<Options...>: every rank of the dp axis holds the whole model and
// a slice of the global batch; gradients are averaged over the axis in buckets
// (slices of the gradient arena), each bucket's all-reduce started as soon as
// backward has finished its gradients and overlapped with the rest of
// backward. With micro-batches, gradients accumulate locally and only the last
// micro-batch communicates.
//
//   using S = loom::Strategy<loom::DataParallel<loom::BucketBytes<4 << 20>>>;
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "loom/parallel/policy.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom {

// The bucket size: a bucket closes once its layers' gradients reach this many
// bytes. Smaller buckets start communicating earlier; larger ones pay less
// per-call latency.
template <std::int64_t Bytes>
struct BucketBytes {
    static_assert(Bytes >= 1, LOOM_RULE_BUCKET_BYTES);
    static constexpr std::int64_t value = Bytes;
};

// 2 MiB: about one transformer block of width 256, so a step of the reference
// GPT has several buckets to overlap (PyTorch's 25 MB would be one bucket).
inline constexpr std::int64_t default_bucket_bytes = std::int64_t{2} << 20;

namespace detail {
template <class T>
struct is_bucket_bytes : std::false_type {};
template <std::int64_t B>
struct is_bucket_bytes<BucketBytes<B>> : std::true_type {};

template <class... Options>
constexpr std::int64_t bucket_bytes_of() {
    std::int64_t bytes = default_bucket_bytes;
    (
        [&] {
            if constexpr (is_bucket_bytes<Options>::value) bytes = Options::value;
        }(),
        ...);
    return bytes;
}
}  // namespace detail

// A bucket size in words: "512 B", "16.0 KiB", "2 MiB", "1.5 MiB", "1.0 GiB"
// as readable_bytes writes it, and its inverse; a size those words would
// round ("1000000 B") is written in bytes, so the text always reads back.
[[nodiscard]] inline std::optional<std::int64_t> parse_bucket_size(std::string_view number, std::string_view unit) {
    double value = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
    double scale = 0;
    if (unit == "B") scale = 1;
    else if (unit == "KiB") scale = 1 << 10;
    else if (unit == "MiB") scale = 1 << 20;
    else if (unit == "GiB") scale = 1 << 30;
    const double bytes = value * scale;
    if (error != std::errc{} || end != number.data() + number.size() || scale == 0 || !(bytes >= 1) ||
        bytes > 9e18 || bytes != static_cast<double>(static_cast<std::int64_t>(bytes)))
        return std::nullopt;
    return static_cast<std::int64_t>(bytes);
}
[[nodiscard]] inline std::string bucket_size_text(std::int64_t bytes) {
    const std::string words = readable_bytes(bytes);
    const auto space = words.find(' ');
    const auto back = parse_bucket_size(std::string_view(words).substr(0, space), std::string_view(words).substr(space + 1));
    return back == bytes ? words : std::to_string(bytes) + " B";
}

template <class... Options>
struct DataParallel {
    static_assert((detail::is_bucket_bytes<Options>::value && ...),
                  "DataParallel<Options...>: every option must be a DataParallel option (BucketBytes<N>)");
    static_assert((0 + ... + (detail::is_bucket_bytes<Options>::value ? 1 : 0)) <= 1, LOOM_RULE_ONE_BUCKET_SIZE);

    static constexpr PolicyKind kind = PolicyKind::data_parallel;
    static constexpr std::int64_t bucket_bytes = detail::bucket_bytes_of<Options...>();

    static void describe(std::ostream& out) { out << "DataParallel<bucket " << bucket_size_text(bucket_bytes) << ">"; }
};

}  // namespace loom
