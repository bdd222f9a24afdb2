// Must not compile: a top-k ratio is the fraction of each chunk sent, in (0, 1].
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::TopK<0.0>>>;
[[maybe_unused]] constexpr auto compression = S::dp_compression;
