// Must not compile: one compressor per axis.
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::CastBf16>, loom::GradCompress<loom::OneBit>>;
[[maybe_unused]] constexpr auto compression = S::dp_compression;
