// Must not compile: a Strategy lists DataParallel twice.
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::DataParallel<>, loom::DataParallel<>>;
[[maybe_unused]] constexpr int stage = S::zero_stage;
