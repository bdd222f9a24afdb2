// Must not compile: GradCompress takes a compressor policy.
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::ZeroShard<2>>>;
[[maybe_unused]] constexpr auto compression = S::dp_compression;
