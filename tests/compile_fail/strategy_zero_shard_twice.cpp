// Must not compile: a Strategy lists ZeroShard twice (two ZeRO stages).
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::ZeroShard<1>, loom::ZeroShard<2>>;
[[maybe_unused]] constexpr int stage = S::zero_stage;
