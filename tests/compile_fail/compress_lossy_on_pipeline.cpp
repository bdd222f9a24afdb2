// Must not compile: activations have no error feedback, so the pp axis takes casts only.
#include <loom/parallel/strategy.hpp>

using S = loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::OneFOneB>,
                         loom::GradCompress<loom::PowerSGD<4>, loom::PpAxis>>;
[[maybe_unused]] constexpr auto compression = S::pp_compression;
