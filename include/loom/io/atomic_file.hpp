// Atomic file replacement: a checkpoint on disk is always either the old file
// or the complete new one, never half of each, even if the process dies or
// the machine loses power mid-write. The bytes go to "<path>.tmp-<pid>" in the
// same directory (rename is atomic only within one file system), are fsynced,
// renamed over <path>, and the directory is fsynced so the rename itself is
// durable. POSIX only, like the rest of loom's host code.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::io {

namespace detail {

// Thread-safe text for an errno value (std::strerror is not).
[[nodiscard]] inline std::string errno_text(int error) { return std::generic_category().message(error); }

}  // namespace detail

// One pending replacement of `path`. Write the new contents, then commit();
// destroying it uncommitted (an exception on the way) removes the temporary
// file and leaves `path` exactly as it was.
class AtomicFile {
public:
    explicit AtomicFile(std::filesystem::path path)
        : path_(std::move(path)), temp_(temp_path_for(path_)) {
        LOOM_CHECK(!path_.empty(), "cannot write a file with an empty path");
        LOOM_CHECK(path_.has_filename(), "cannot write ", path_.string(), ": the path names a directory, not a file");
        // Permissions 0666 filtered by the umask, as for any newly created file.
        fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        const int error = errno;
        LOOM_CHECK(fd_ >= 0, "cannot create the temporary file ", temp_.string(), " to write ", path_.string(), ": ",
                   detail::errno_text(error));
    }

    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    ~AtomicFile() { abandon(); }

    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
    [[nodiscard]] const std::filesystem::path& temp_path() const noexcept { return temp_; }

    // Appends bytes; short writes and EINTR are retried, real errors throw
    // (and the destructor then removes the temporary file).
    void write(std::span<const std::byte> bytes) {
        LOOM_CHECK(fd_ >= 0, "cannot write to ", path_.string(), " after commit()");
        const std::byte* next = bytes.data();
        std::size_t left = bytes.size();
        while (left > 0) {
            const ::ssize_t written = ::write(fd_, next, left);
            if (written < 0) {
                const int error = errno;
                if (error == EINTR) continue;
                LOOM_FAIL("cannot write ", temp_.string(), " (the new ", path_.string(), "): ", detail::errno_text(error));
            }
            next += written;
            left -= static_cast<std::size_t>(written);
        }
    }
    void write(std::string_view text) { write(std::as_bytes(std::span<const char>(text.data(), text.size()))); }

    // Makes the new contents durable and visible under path(), replacing any
    // old file in one step.
    void commit() {
        LOOM_CHECK(fd_ >= 0, "commit() of ", path_.string(), " was already called");
        if (::fsync(fd_) != 0) fail_errno("cannot flush ", temp_, " to disk");
        const int fd = std::exchange(fd_, -1);
        if (::close(fd) != 0) fail_errno("cannot close ", temp_, "");  // NFS reports write errors here
        if (::rename(temp_.c_str(), path_.c_str()) != 0) fail_errno("cannot rename ", temp_, " over it");
        renamed_ = true;
        sync_directory();
    }

private:
    static std::filesystem::path temp_path_for(const std::filesystem::path& path) {
        std::filesystem::path temp = path;
        temp += ".tmp-" + std::to_string(::getpid());
        return temp;
    }

    // Throws "cannot <what> <file><tail> (writing <path>): <errno text>",
    // removing the temporary file first.
    [[noreturn]] void fail_errno(std::string_view what, const std::filesystem::path& file, std::string_view tail) {
        const int error = errno;
        abandon();
        LOOM_FAIL(what, file.string(), tail, " (writing ", path_.string(), "): ", detail::errno_text(error));
    }

    // Without this the rename may be lost on power failure even though the
    // data blocks were flushed. Some file systems cannot fsync a directory
    // (EINVAL); there durability is the file system's business.
    void sync_directory() const {
        const std::filesystem::path parent = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
        const int dir = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) {
            const int error = errno;
            LOOM_FAIL("wrote ", path_.string(), " but cannot open its directory ", parent.string(),
                      " to make the rename durable: ", detail::errno_text(error));
        }
        const int status = ::fsync(dir);
        const int error = errno;
        ::close(dir);
        LOOM_CHECK(status == 0 || error == EINVAL, "wrote ", path_.string(), " but cannot flush its directory ",
                   parent.string(), " to make the rename durable: ", detail::errno_text(error));
    }

    // Idempotent and noexcept: closes and removes the temporary file unless
    // it has already become `path`.
    void abandon() noexcept {
        if (fd_ >= 0) ::close(std::exchange(fd_, -1));
        if (!renamed_ && !removed_) {
            ::unlink(temp_.c_str());
            removed_ = true;
        }
    }

    std::filesystem::path path_;
    std::filesystem::path temp_;
    int fd_ = -1;
    bool renamed_ = false;
    bool removed_ = false;
};

// Replaces `path` with exactly `bytes`, atomically (see AtomicFile).
// Errors are loom::Error naming the path and the system's reason.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
    AtomicFile file(path);
    file.write(bytes);
    file.commit();
}

// Replaces `path` with whatever `fill(file)` writes through file.write(...),
// for contents too large to assemble in memory first. If `fill` throws, the
// old file stays and the exception propagates.
template <class Fill>
    requires std::invocable<Fill&, AtomicFile&>
void write_file_atomically(const std::filesystem::path& path, Fill&& fill) {
    AtomicFile file(path);
    fill(file);
    file.commit();
}

// Checks, before hours of work, that `path` can be written the way it will
// be: creates its temporary file in the target directory and removes it.
// Throws "cannot create the temporary file ..." naming the system's reason
// (no such directory, permission denied, read-only file system).
inline void probe_writable(const std::filesystem::path& path) {
    std::error_code error;
    LOOM_CHECK(!std::filesystem::is_directory(path, error), "cannot write ", path.string(),
               ": it is a directory; give a file name");
    const AtomicFile probe(path);  // destroyed uncommitted: the temporary is removed, `path` untouched
}

// A process killed by SIGKILL or a power cut leaves its "<path>.tmp-<pid>"
// behind, and the next run (another pid) a new one beside it. Removes, from
// path's directory, every "<path's name>*.tmp-<pid>" whose process no longer
// exists (a live writer's file is left alone), and returns what it removed
// so the caller can say so. Errors are ignored: this only tidies.
inline std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& path) {
    std::vector<std::filesystem::path> removed;
    const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    const std::string prefix = path.filename().string();
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
        const std::string name = entry.path().filename().string();
        const std::size_t mark = name.rfind(".tmp-");
        if (mark == std::string::npos || mark < prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string digits = name.substr(mark + 5);
        if (digits.empty() || digits.size() > 9 ||
            !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
            continue;
        const auto pid = static_cast<::pid_t>(std::stol(digits));
        if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
        std::error_code gone;
        if (std::filesystem::remove(entry.path(), gone)) removed.push_back(entry.path());
    }
    return removed;
}

}  // namespace loom::io
