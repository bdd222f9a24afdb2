// DataParallel<Options...>: every rank of the dp axis holds the whole model and
// a slice of the global batch; gradients are averaged over the axis in buckets
// (slices of the gradient arena), each bucket's all-reduce started as soon as
// backward has finished its gradients and overlapped with the rest of
// backward. With micro-batches, gradients accumulate locally and only the last
// micro-batch communicates.
//
//   using S = loom::Strategy<loom::DataParallel<loom::BucketBytes<4 << 20>>>;
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "loom/parallel/policy.hpp"

namespace loom {

// The bucket size: a bucket closes once its layers' gradients reach this many
// bytes. Smaller buckets start communicating earlier; larger ones pay less
// per-call latency.
template <std::int64_t Bytes>
struct BucketBytes {
    static_assert(Bytes >= 1, "BucketBytes<N>: a bucket must hold at least 1 byte");
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

template <class... Options>
struct DataParallel {
    static_assert((detail::is_bucket_bytes<Options>::value && ...),
                  "DataParallel<Options...>: every option must be a DataParallel option (BucketBytes<N>)");
    static_assert((0 + ... + (detail::is_bucket_bytes<Options>::value ? 1 : 0)) <= 1,
                  "DataParallel<Options...>: BucketBytes is given twice; give one bucket size");

    static constexpr PolicyKind kind = PolicyKind::data_parallel;
    static constexpr std::int64_t bucket_bytes = detail::bucket_bytes_of<Options...>();

    static void describe(std::ostream& out) { out << "DataParallel<bucket " << readable_bytes(bucket_bytes) << ">"; }
};

}  // namespace loom
