// A progress line for long training runs. On a terminal it is one line
// redrawn in place with '\r' (a bar, the loss, the throughput, the time
// left); in a pipe or a CI log, where '\r' would pile up as garbage, it is a
// plain line every few steps instead.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "loom/core/error.hpp"

namespace loom::train {

// "45s", "1m12s", "3h05m", "2d04h": two units at most, the way a person
// reads a remaining time. Negative or non-finite durations (an ETA before
// any step finished) print as "?".
[[nodiscard]] inline std::string format_duration(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0.0 || seconds > 1e15) return "?";
    const auto total = static_cast<long long>(std::llround(seconds));
    char text[48];
    if (total < 60) std::snprintf(text, sizeof text, "%llds", total);
    else if (total < 3600) std::snprintf(text, sizeof text, "%lldm%02llds", total / 60, total % 60);
    else if (total < 86400) std::snprintf(text, sizeof text, "%lldh%02lldm", total / 3600, total % 3600 / 60);
    else std::snprintf(text, sizeof text, "%lldd%02lldh", total / 86400, total % 86400 / 3600);
    return text;
}

// "950", "12.3k", "4.56M", "1.23G": a rate with three significant digits.
[[nodiscard]] inline std::string format_rate(double per_second) {
    if (!std::isfinite(per_second) || per_second < 0.0) return "?";
    char text[48];
    if (per_second < 999.5) std::snprintf(text, sizeof text, "%.0f", per_second);
    else if (per_second < 999.5e3) std::snprintf(text, sizeof text, "%.1fk", per_second / 1e3);
    else if (per_second < 999.5e6) std::snprintf(text, sizeof text, "%.2fM", per_second / 1e6);
    else std::snprintf(text, sizeof text, "%.2fG", per_second / 1e9);
    return text;
}

class Progress {
public:
    // automatic: terminal when the stream's file descriptor is a tty.
    enum class Style { automatic, terminal, plain };

    static constexpr int bar_width = 24;
    // A terminal redraw costs a write; more than ten a second is invisible.
    static constexpr double redraw_interval_s = 0.1;

    Progress(std::int64_t total_steps, std::FILE* out = stderr, std::int64_t plain_every = 10,
             Style style = Style::automatic)
        : total_(total_steps), out_(out), every_(plain_every), start_(Clock::now()) {
        // Zero is allowed: a run resumed at its last step has nothing left to show.
        LOOM_CHECK(total_steps >= 0, "a progress line needs a number of steps >= 0, got ", total_steps);
        LOOM_CHECK(out != nullptr, "a progress line needs an output stream, got nullptr");
        LOOM_CHECK(plain_every > 0, "the progress line's plain_every must be positive, got ", plain_every);
        terminal_ = style == Style::terminal || (style == Style::automatic && ::isatty(::fileno(out)) == 1);
    }

    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    // Ends a terminal line, so an exception's message starts on a line of its own.
    ~Progress() { finish(); }

    [[nodiscard]] bool is_terminal() const noexcept { return terminal_; }

    // `step` counts the steps completed so far (1..total). Plain output
    // prints steps that are multiples of plain_every and the last step.
    void update(std::int64_t step, float loss, double tokens_per_second) {
        if (finished_) return;
        const Clock::time_point now = Clock::now();
        if (!updated_) first_step_ = step - 1;  // the step before the first update began with us
        updated_ = true;
        step_ = step;
        loss_ = loss;
        rate_ = tokens_per_second;
        elapsed_ = std::chrono::duration<double>(now - start_).count();
        drawn_ = false;
        if (terminal_) {
            const bool due = step >= total_ || last_draw_ == Clock::time_point{} ||
                             std::chrono::duration<double>(now - last_draw_).count() >= redraw_interval_s;
            if (due) {
                draw();
                last_draw_ = now;
            }
        } else if (step % every_ == 0 || step >= total_) {
            draw();
        }
    }

    // Shows the last update if it was not shown and ends the line. Idempotent.
    void finish() noexcept {
        if (finished_) return;
        finished_ = true;
        if (!updated_) return;  // nothing to show
        if (!drawn_) draw();
        if (terminal_) std::fputc('\n', out_);
        std::fflush(out_);
    }

    // The text of one line without the bar, e.g.
    // "step  120/1000  loss 2.3141  12.3k tok/s  ETA 1m12s".
    [[nodiscard]] std::string text(bool with_bar) const {
        const int width = static_cast<int>(std::to_string(total_).size());
        char head[96];
        std::snprintf(head, sizeof head, "step %*lld/%lld", width, static_cast<long long>(step_),
                      static_cast<long long>(total_));
        // Appends only: GCC 12 reports a false -Wrestrict on "literal" + std::string.
        std::string line = head;
        if (with_bar) {
            line += ' ';
            line += bar();
        }
        char loss[48];
        std::snprintf(loss, sizeof loss, "  loss %.4f  ", static_cast<double>(loss_));
        line += loss;
        line += format_rate(rate_);
        line += " tok/s  ";
        if (step_ >= total_) {
            line += "done in ";
            line += format_duration(elapsed_);
        } else {
            const double done = static_cast<double>(step_ - first_step_);
            const double left = static_cast<double>(total_ - step_);
            line += "ETA ";
            line += done > 0 ? format_duration(elapsed_ / done * left) : std::string("?");
        }
        return line;
    }

private:
    using Clock = std::chrono::steady_clock;

    // "[=====>                  ]"
    [[nodiscard]] std::string bar() const {
        const std::int64_t clamped = std::clamp<std::int64_t>(step_, 0, total_);
        const auto filled = total_ == 0 ? bar_width : static_cast<int>(clamped * bar_width / total_);
        std::string result = "[";
        result.append(static_cast<std::size_t>(filled), '=');
        if (filled < bar_width) {
            result += '>';
            result.append(static_cast<std::size_t>(bar_width - filled - 1), ' ');
        }
        return result + "]";
    }

    void draw() noexcept {
        try {
            std::string line = text(terminal_);
            if (terminal_) {
                // Blank out what is left of a longer previous line.
                const std::size_t length = line.size();
                if (length < shown_length_) line.append(shown_length_ - length, ' ');
                shown_length_ = length;
                std::fputc('\r', out_);
                std::fputs(line.c_str(), out_);
            } else {
                std::fputs(line.c_str(), out_);
                std::fputc('\n', out_);
            }
            std::fflush(out_);
            drawn_ = true;
        } catch (...) {
            // A progress line is never worth failing a run for (only
            // std::bad_alloc can get here).
        }
    }

    std::int64_t total_;
    std::FILE* out_;
    std::int64_t every_;
    bool terminal_ = false;
    Clock::time_point start_;
    Clock::time_point last_draw_{};
    bool updated_ = false;
    std::int64_t first_step_ = 0;
    std::int64_t step_ = 0;
    float loss_ = 0.0f;
    double rate_ = 0.0;
    double elapsed_ = 0.0;
    std::size_t shown_length_ = 0;
    bool drawn_ = false;
    bool finished_ = false;
};

}  // namespace loom::train
