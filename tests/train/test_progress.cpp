// The progress line: plain lines at the right steps off a terminal, one line
// redrawn in place on one, and durations a person can read.
#include <catch2/catch.hpp>

#include <loom/train/progress.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::train::format_duration;
using loom::train::format_rate;
using loom::train::Progress;

namespace {

struct CloseFile {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, CloseFile>;

File temporary_file() {
    File f(std::tmpfile());
    REQUIRE(f != nullptr);
    return f;
}

std::string contents(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string text;
    for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) text += static_cast<char>(c);
    return text;
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> result;
    std::size_t begin = 0;
    for (std::size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', begin)) {
        result.push_back(text.substr(begin, end - begin));
        begin = end + 1;
    }
    if (begin < text.size()) result.push_back(text.substr(begin));
    return result;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("format_duration reads like a person writes it", "[progress]") {
    CHECK(format_duration(0) == "0s");
    CHECK(format_duration(0.4) == "0s");
    CHECK(format_duration(45) == "45s");
    CHECK(format_duration(59.4) == "59s");
    CHECK(format_duration(59.6) == "1m00s");
    CHECK(format_duration(72) == "1m12s");
    CHECK(format_duration(3599) == "59m59s");
    CHECK(format_duration(3600) == "1h00m");
    CHECK(format_duration(3 * 3600 + 5 * 60 + 30) == "3h05m");
    CHECK(format_duration(2 * 86400 + 4 * 3600) == "2d04h");
    CHECK(format_duration(-1) == "?");
    CHECK(format_duration(std::nan("")) == "?");
    CHECK(format_duration(1.0 / 0.0) == "?");
}

TEST_CASE("format_rate keeps three significant digits", "[progress]") {
    CHECK(format_rate(0) == "0");
    CHECK(format_rate(950) == "950");
    CHECK(format_rate(12345) == "12.3k");
    CHECK(format_rate(999'999) == "1.00M");
    CHECK(format_rate(4.56e6) == "4.56M");
    CHECK(format_rate(1.234e9) == "1.23G");
    CHECK(format_rate(-5) == "?");
}

TEST_CASE("off a terminal Progress prints a plain line every few steps and at the end", "[progress]") {
    File out = temporary_file();
    {
        Progress progress(25, out.get(), 10);
        CHECK_FALSE(progress.is_terminal());  // a tmpfile is no tty
        for (std::int64_t step = 1; step <= 25; ++step) progress.update(step, 2.5f, 12345.0);
        progress.finish();
        progress.finish();  // idempotent
    }
    const std::string text = contents(out.get());
    CHECK(text.find('\r') == std::string::npos);
    const std::vector<std::string> printed = lines(text);
    REQUIRE(printed.size() == 3);
    CHECK(starts_with(printed[0], "step 10/25  loss 2.5000  12.3k tok/s  ETA "));
    CHECK(starts_with(printed[1], "step 20/25  loss 2.5000  12.3k tok/s  ETA "));
    CHECK(starts_with(printed[2], "step 25/25  loss 2.5000  12.3k tok/s  done in "));
}

TEST_CASE("a run that stops early still prints its last step", "[progress]") {
    File out = temporary_file();
    {
        Progress progress(1000, out.get(), 5);
        for (std::int64_t step = 1; step <= 13; ++step) progress.update(step, 1.0f / static_cast<float>(step), 950.0);
    }  // the destructor finishes
    const std::vector<std::string> printed = lines(contents(out.get()));
    REQUIRE(printed.size() == 3);
    CHECK(starts_with(printed[0], "step    5/1000  loss 0.2000  950 tok/s  ETA "));
    CHECK(starts_with(printed[1], "step   10/1000  loss 0.1000"));
    CHECK(starts_with(printed[2], "step   13/1000  loss 0.0769"));
}

TEST_CASE("on a terminal Progress redraws one line with a bar and ends it", "[progress]") {
    File out = temporary_file();
    {
        Progress progress(4, out.get(), 10, Progress::Style::terminal);
        CHECK(progress.is_terminal());
        for (std::int64_t step = 1; step <= 4; ++step) progress.update(step, 3.0f, 2.0e6);
        progress.finish();
    }
    const std::string text = contents(out.get());
    REQUIRE(!text.empty());
    CHECK(text.front() == '\r');
    CHECK(text.back() == '\n');
    CHECK(text.find('\n') == text.size() - 1);  // one line, redrawn
    const std::string last = text.substr(text.rfind('\r') + 1);
    CHECK(starts_with(last, "step 4/4 [========================]  loss 3.0000  2.00M tok/s  done in "));
    CHECK(text.find("step 1/4 [======>                 ]  loss 3.0000  2.00M tok/s  ETA ") != std::string::npos);
}

TEST_CASE("Progress text shows the bar, the loss, the rate and an ETA", "[progress]") {
    File out = temporary_file();
    Progress progress(1000, out.get(), 1000);
    progress.update(120, 2.3141f, 12'300.0);
    const std::string text = progress.text(true);
    CHECK(starts_with(text, "step  120/1000 [==>                     ]  loss 2.3141  12.3k tok/s  ETA "));
    CHECK(progress.text(false).find('[') == std::string::npos);
}

TEST_CASE("a run with no steps left prints nothing", "[progress]") {
    File out = temporary_file();
    {
        Progress progress(0, out.get());
        progress.finish();
    }
    CHECK(contents(out.get()).empty());
}

TEST_CASE("Progress refuses nonsense arguments", "[progress][errors]") {
    File out = temporary_file();
    CHECK_THROWS_WITH(Progress(-1, out.get()), Catch::StartsWith("a progress line needs a number of steps >= 0, got -1"));
    CHECK_THROWS_WITH(Progress(10, nullptr), Catch::StartsWith("a progress line needs an output stream"));
    CHECK_THROWS_WITH(Progress(10, out.get(), 0), Catch::StartsWith("the progress line's plain_every must be positive, got 0"));
}

}  // namespace LOOM_TEST_FILE
