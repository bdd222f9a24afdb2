// Catch2's implementation, compiled once and linked into every test binary.
// Compiled into each of the ten binaries instead, it cost about 40 s of CPU
// per binary: more than two minutes of a 2-core CI run. catch.hpp declares
// Catch::Session only with the implementation, so the mains call it here.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

namespace loom_test {

int run_catch(int argc, char const* const* argv) { return Catch::Session().run(argc, argv); }

}  // namespace loom_test
