// Must not compile: a Strategy argument that is not a policy.
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<int>;
[[maybe_unused]] constexpr int stage = S::zero_stage;
