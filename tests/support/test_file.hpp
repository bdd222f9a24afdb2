// LOOM_TEST_FILE: the namespace each test file's code lives in. The test
// binaries are unity builds (tests/CMakeLists.txt): several test files are
// compiled as one translation unit, so that the library's templates are
// parsed and instantiated once per batch rather than once per file, which
// halved the tests' build. Two files' helpers of the same name (a `seed`, a
// `config()`) would then clash; CMake defines LOOM_TEST_FILE to a name unique
// to each file of a batch (UNITY_BUILD_UNIQUE_ID). Compiled alone, a file's
// namespace is this one.
#ifndef LOOM_TEST_FILE
#define LOOM_TEST_FILE loom_test_file
#endif
