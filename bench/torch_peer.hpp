// The PyTorch peer of bench/train_gpt: bench/train_gpt_torch.py --serve,
// started once under the private venv's interpreter (scripts/torch_venv.sh)
// and asked for one measurement at a time over a pipe, so that PyTorch's
// timings interleave with loom's in one run while its compiled models stay
// compiled. One command line out, one answer line back (the protocol is in
// the script's docstring).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace bench {

// The venv's interpreter if torch imports there (scripts/torch_venv.sh
// --print-python), else empty.
inline std::string torch_venv_python(const std::string& source_dir) {
    const std::string command = "'" + source_dir + "/scripts/torch_venv.sh' --print-python 2>/dev/null";
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return {};
    char line[4096];
    std::string path;
    if (std::fgets(line, sizeof line, pipe) != nullptr) path = line;
    const int status = pclose(pipe);
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
    return status == 0 ? path : std::string{};
}

// "key=value" fields of one answer line ("torch train config=A ... tokens_per_s=4012.5").
inline std::map<std::string, std::string> answer_fields(std::string_view line) {
    std::map<std::string, std::string> fields;
    while (!line.empty()) {
        const auto space = line.find(' ');
        const std::string_view word = line.substr(0, space);
        if (const auto eq = word.find('='); eq != std::string_view::npos)
            fields.emplace(std::string(word.substr(0, eq)), std::string(word.substr(eq + 1)));
        line = space == std::string_view::npos ? std::string_view{} : line.substr(space + 1);
    }
    return fields;
}

class TorchPeer {
public:
    // Starts `python script --serve`; running() says whether it did.
    TorchPeer(const std::string& python, const std::string& script) {
        signal(SIGPIPE, SIG_IGN);  // a peer that died answers EOF or EPIPE, never kills the bench
        int to_child[2], from_child[2];
        if (pipe(to_child) != 0) return;
        if (pipe(from_child) != 0) {
            close(to_child[0]);
            close(to_child[1]);
            return;
        }
        pid_ = fork();
        if (pid_ == 0) {
            dup2(to_child[0], STDIN_FILENO);
            dup2(from_child[1], STDOUT_FILENO);
            close(to_child[0]);
            close(to_child[1]);
            close(from_child[0]);
            close(from_child[1]);
            execl(python.c_str(), python.c_str(), script.c_str(), "--serve", static_cast<char*>(nullptr));
            _exit(127);
        }
        close(to_child[0]);
        close(from_child[1]);
        if (pid_ < 0) {
            close(to_child[1]);
            close(from_child[0]);
            return;
        }
        to_ = fdopen(to_child[1], "w");
        from_ = fdopen(from_child[0], "r");
    }
    TorchPeer(const TorchPeer&) = delete;
    TorchPeer& operator=(const TorchPeer&) = delete;
    ~TorchPeer() {
        if (to_ != nullptr) {
            std::fputs("quit\n", to_);
            std::fclose(to_);
        }
        if (from_ != nullptr) std::fclose(from_);
        if (pid_ > 0) waitpid(pid_, nullptr, 0);
    }

    [[nodiscard]] bool running() const { return to_ != nullptr && from_ != nullptr; }
    [[nodiscard]] pid_t pid() const { return pid_; }

    // The answer to one command, without its newline; nullopt once the peer
    // has gone (it died, or could not start), after which running() is false.
    std::optional<std::string> ask(const std::string& command) {
        if (!running()) return std::nullopt;
        if (std::fputs((command + "\n").c_str(), to_) < 0 || std::fflush(to_) != 0) return gone();
        std::string line;
        char chunk[1024];
        while (std::fgets(chunk, sizeof chunk, from_) != nullptr) {
            line += chunk;
            if (line.back() == '\n') {
                line.pop_back();
                return line;
            }
        }
        return gone();
    }

private:
    std::optional<std::string> gone() {
        std::fclose(to_);
        std::fclose(from_);
        to_ = from_ = nullptr;
        return std::nullopt;
    }

    pid_t pid_ = -1;
    FILE* to_ = nullptr;
    FILE* from_ = nullptr;
};

}  // namespace bench
