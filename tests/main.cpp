// The main of the host test binaries; Catch2 itself is compiled once, in
// catch_session.cpp.
#include "catch_session.hpp"

int main(int argc, char** argv) { return loom_test::run_catch(argc, argv); }
