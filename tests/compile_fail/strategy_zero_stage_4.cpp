// Must not compile: ZeRO has stages 1, 2 and 3 only.
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::DataParallel<>, loom::ZeroShard<4>>;
[[maybe_unused]] constexpr int stage = S::zero_stage;
