// Must not compile: an option of DataParallel that is not a DataParallel option.
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::DataParallel<int>>;
[[maybe_unused]] constexpr std::int64_t bucket = S::bucket_bytes;
