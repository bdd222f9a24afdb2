// loom::Error and LOOM_CHECK: one line, the message as written, the place.
#include <catch2/catch.hpp>

#include <loom/core/error.hpp>

#include <string>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("LOOM_CHECK throws loom::Error with the parts joined and the place appended", "[error]") {
    const int layers = 8;
    const int degree = 3;
    try {
        LOOM_CHECK(layers % degree == 0, "pipeline degree ", degree, " does not divide ", layers,
                   " layers; use 1, 2, 4 or 8");
        FAIL("LOOM_CHECK did not throw");
    } catch (const loom::Error& e) {
        CHECK(e.message() == "pipeline degree 3 does not divide 8 layers; use 1, 2, 4 or 8");
        const std::string expected_suffix = " [tests/core/test_error.cpp:" + std::to_string(e.where().line()) + "]";
        CHECK(std::string(e.what()) == e.message() + expected_suffix);
        CHECK(e.where().line() > 0);
        // loom::Error is a std::runtime_error, so generic handlers see it too.
        const std::runtime_error& base = e;
        CHECK(std::string(base.what()) == e.what());
    }
}

TEST_CASE("LOOM_CHECK does not evaluate its message when the condition holds", "[error]") {
    int evaluated = 0;
    auto count = [&] { return ++evaluated; };
    LOOM_CHECK(true, "never built ", count());
    CHECK(evaluated == 0);
    CHECK_THROWS_AS([&] { LOOM_CHECK(false, "built ", count()); }(), loom::Error);
    CHECK(evaluated == 1);
}

TEST_CASE("loom::Error keeps messages to one line", "[error]") {
    try {
        LOOM_FAIL("first line\nsecond line\r\nthird");
        FAIL("LOOM_FAIL did not throw");
    } catch (const loom::Error& e) {
        CHECK(e.message() == "first line second line  third");
        CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
}

TEST_CASE("loom::Error built directly is one line too", "[error]") {
    const loom::Error e("two\nlines");
    CHECK(e.message() == "two lines");
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
}

TEST_CASE("loom::Error records where it was constructed", "[error]") {
    const loom::Error e("bad value");
    CHECK(e.message() == "bad value");
    CHECK_THAT(std::string(e.where().file_name()), Catch::EndsWith("test_error.cpp"));
    CHECK_THAT(e.what(), Catch::StartsWith("bad value [tests/core/test_error.cpp:"));
}

}  // namespace LOOM_TEST_FILE
