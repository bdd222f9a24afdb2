// MetricsWriter: the training curve as JSON Lines, one object per step,
//   {"step": 3, "loss": 2.5, "tokens_per_s": 12345.6, "lr": 0.001}
// flushed after every line, so a crashed or killed run keeps every step it
// finished and a plotting script can tail the file while the run goes on.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/io/json.hpp"

namespace loom::train {

class MetricsWriter {
public:
    // replace starts a fresh file; append continues one, for a resumed run.
    enum class Mode { replace, append };

    explicit MetricsWriter(const std::filesystem::path& path, Mode mode = Mode::replace)
        : path_(path), file_(std::fopen(path.c_str(), mode == Mode::append ? "ae" : "we")) {
        const int error = errno;
        LOOM_CHECK(file_ != nullptr, "cannot open the metrics file ", path.string(), ": ",
                   std::generic_category().message(error));
    }

    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

    // Appends {"step": .., "loss": .., "tokens_per_s": .., <extra>...}.
    // Each extra field is (name, JSON text of its value), e.g.
    // {"lr", io::json::number(3e-4)} or {"phase", io::json::quote("warmup")};
    // a value that is not valid JSON is refused, so every line parses.
    // A non-finite loss is written as null (JSON has no NaN).
    void write(std::int64_t step, float loss, double tokens_per_second,
               const std::vector<std::pair<std::string, std::string>>& extra_json_fields = {}) {
        std::string line = "{\"step\": " + io::json::number(step) + ", \"loss\": " + io::json::number(loss) +
                           ", \"tokens_per_s\": " + io::json::number(tokens_per_second);
        std::vector<std::string_view> names{"step", "loss", "tokens_per_s"};
        for (const auto& [name, value] : extra_json_fields) {
            for (std::string_view taken : names)
                LOOM_CHECK(name != taken, "metrics field ", io::json::quote(name), " appears twice in the line for step ",
                           step, "; field names must be unique");
            names.push_back(name);
            LOOM_CHECK(value.find_first_of("\n\r") == std::string::npos, "metrics field ", io::json::quote(name),
                       " has a value spanning lines; each metrics record must stay on one line");
            std::string why;
            LOOM_CHECK(io::json::parse(value, why).has_value(), "metrics field ", io::json::quote(name), " has the value `",
                       value, "`, which is not valid JSON (", why, "); quote strings with io::json::quote");
            line += ", " + io::json::quote(name) + ": " + value;
        }
        line += "}\n";
        const bool written = std::fputs(line.c_str(), file_.get()) >= 0 && std::fflush(file_.get()) == 0;
        const int error = errno;
        LOOM_CHECK(written, "cannot write to the metrics file ", path_.string(), ": ",
                   std::generic_category().message(error));
    }

private:
    struct Close {
        void operator()(std::FILE* file) const noexcept { std::fclose(file); }
    };

    std::filesystem::path path_;
    std::unique_ptr<std::FILE, Close> file_;
};

}  // namespace loom::train
