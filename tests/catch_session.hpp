// The test binaries' one way into Catch2's session, whose implementation is
// compiled once (catch_session.cpp).
#pragma once

namespace loom_test {

// Catch2's command line and test run: the exit code Catch2's own main returns.
int run_catch(int argc, char const* const* argv);

}  // namespace loom_test
