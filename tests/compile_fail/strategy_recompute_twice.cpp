// Must not compile: a Strategy lists Recompute twice (two recomputation policies).
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::Recompute<loom::Full>, loom::Recompute<loom::Budget<1024>>>;
[[maybe_unused]] constexpr auto mode = S::recompute.mode;
