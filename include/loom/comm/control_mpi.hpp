// The control channel of loom's MPI communicators: how a process learns that
// a peer failed or never arrived, so that no wait hangs and every rank reports
// the same sentence. It is a private duplicate of the root communicator that
// carries only three kinds of small messages:
//   fault   "the communicator is broken, because <text>": every later call throws <text>;
//   query   "are you inside a loom call?", sent by a rank whose wait timed out;
//   answer  "yes, in <op>, call <n>", sent from inside any loom wait.
// Every loom wait polls its MPI request and this channel (MpiControl::wait).
// Ranks in fault and timeout messages are numbered in the root communicator
// (the one Mpi was constructed from, usually MPI_COMM_WORLD), since the notice
// reaches every communicator split from it.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/flight_recorder.hpp"
#include "loom/core/check_mpi.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

// Thrown with the same text on every rank that reports it: two ranks' calls
// differ, a rank failed (`rank R failed: ...`), or a rank did not arrive in
// time. All of them are raised from one line, so even the location suffix of
// what() is identical.
class MpiCollectiveError : public Error {
public:
    using Error::Error;
};

namespace detail {

// Set once this process has seen a fault. MPI offers no way to cancel the
// collectives the broken communicator still has in flight, so MpiSession then
// ends the job with MPI_Abort instead of MPI_Finalize.
inline std::atomic<bool> mpi_fault_seen{false};

}  // namespace detail

// True once any loom MPI communicator of this process saw a fault.
[[nodiscard]] inline bool mpi_fault_happened() noexcept { return detail::mpi_fault_seen.load(); }

namespace detail {

enum MpiControlTag : int { fault_tag = 1, query_tag = 2, answer_tag = 3 };

// Notices stay far below every transport's eager limit, so a posted notice is
// delivered without the receiver's help and a receive after a probe never blocks.
inline constexpr std::size_t max_notice_bytes = 1024;

// Where a wait is: what a timed-out wait asks about and names.
struct MpiWaitSite {
    OpKind kind;
    std::int64_t call;             // collective call number in its communicator; -1 for send/recv
    int group_size;                // ranks in that communicator
    std::span<const int> members;  // their control ranks
    std::chrono::milliseconds timeout;
};

// The one place a collective failure is thrown from.
[[noreturn]] inline void raise_collective(const std::string& text) { throw MpiCollectiveError(text); }

// How long a rank whose wait timed out collects answers: ranks inside a loom
// wait answer within microseconds, but oversubscribed nodes deschedule them.
[[nodiscard]] inline std::chrono::milliseconds answer_grace(std::chrono::milliseconds timeout) {
    return std::clamp(timeout / 2, std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
}

inline bool mpi_finalized() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    return finalized != 0;
}

// NaN-propagating max over float, like host_reduce: MPI_MAX keeps whichever
// operand its comparison prefers, so a NaN from one rank could vanish.
// Branch-free blocks of 8 with a fixed trip count: compilers vectorise those
// at -O2, where a loop of unknown length over possibly aliased arrays is not.
inline float max_nan(float x, float y) {
    const float r = x < y ? y : x;
    return x != x ? x : (y != y ? y : r);  // NOLINT(misc-redundant-expression): x != x tests for NaN
}

inline void mpi_max_nan_f32(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
    const float* a = static_cast<const float*>(in);
    float* b = static_cast<float*>(inout);
    const int n = *length;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        float x[8], y[8];
        std::memcpy(x, a + i, sizeof x);
        std::memcpy(y, b + i, sizeof y);
        for (int k = 0; k < 8; ++k) y[k] = max_nan(x[k], y[k]);
        std::memcpy(b + i, y, sizeof y);
    }
    for (; i < n; ++i) b[i] = max_nan(a[i], b[i]);
}

// One per root communicator, shared by it and every communicator split from
// it: a fault anywhere breaks them all.
class MpiControl {
public:
    explicit MpiControl(MPI_Comm parent) {
        LOOM_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
        LOOM_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
        LOOM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        LOOM_MPI_CHECK(MPI_Comm_size(comm_, &size_));
        LOOM_MPI_CHECK(MPI_Op_create(&mpi_max_nan_f32, 1, &max_op_));
        answers_.assign(static_cast<std::size_t>(size_), no_answer);
        recorder_ = std::make_unique<FlightRecorder>(FlightRecorder::directory_from_environment(), rank_, size_);
    }
    MpiControl(const MpiControl&) = delete;
    MpiControl& operator=(const MpiControl&) = delete;

    ~MpiControl() {
        // After a fault, collectives may still be in flight on these handles
        // and the job ends in MPI_Abort: leave them alone.
        if (fault_ || mpi_finalized()) return;
        for (Outgoing& out : outbox_)
            if (out.request != MPI_REQUEST_NULL) MPI_Request_free(&out.request);
        MPI_Op_free(&max_op_);
        MPI_Comm_free(&comm_);
    }

    [[nodiscard]] MPI_Comm comm() const noexcept { return comm_; }
    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] int size() const noexcept { return size_; }
    [[nodiscard]] MPI_Op max_op() const noexcept { return max_op_; }
    [[nodiscard]] bool faulted() const noexcept { return fault_.has_value(); }
    // The calls of every communicator sharing this channel (flight_recorder.hpp).
    [[nodiscard]] FlightRecorder& recorder() noexcept { return *recorder_; }

    void throw_if_faulted() const {
        if (fault_) raise_collective(*fault_);
    }

    // Handles every control message that has arrived. `kind` and `call` say
    // where this rank is, for answers to queries.
    void service(OpKind kind, std::int64_t call) {
        reap_outbox();
        for (;;) {
            int found = 0;
            MPI_Status status;
            LOOM_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &found, &status));
            if (found == 0) return;
            const int from = status.MPI_SOURCE;
            if (status.MPI_TAG == fault_tag) {
                int length = 0;
                LOOM_MPI_CHECK(MPI_Get_count(&status, MPI_CHAR, &length));
                std::string text(static_cast<std::size_t>(length), '\0');
                LOOM_MPI_CHECK(MPI_Recv(text.data(), length, MPI_CHAR, from, fault_tag, comm_, MPI_STATUS_IGNORE));
                if (!fault_) mark_faulted(std::move(text));  // the first word wins: it came first
                raise_collective(*fault_);
            }
            std::array<std::int64_t, 3> message{};
            LOOM_MPI_CHECK(MPI_Recv(message.data(), 3, MPI_INT64_T, from, status.MPI_TAG, comm_, MPI_STATUS_IGNORE));
            if (status.MPI_TAG == query_tag) {
                post_words(from, answer_tag, {message[0], static_cast<std::int64_t>(kind), call});
            } else if (status.MPI_TAG == answer_tag && message[0] == round_) {
                answers_[static_cast<std::size_t>(from)] = {message[1], message[2]};  // older rounds' are stale
            }
        }
    }

    // Polls `request` until it completes. A fault notice throws its text; past
    // the timeout this rank asks the communicator's members where they are,
    // and those that do not answer are the missing ones.
    void wait(MPI_Request& request, const MpiWaitSite& site, MPI_Status* status = MPI_STATUS_IGNORE) {
        using clock = std::chrono::steady_clock;
        throw_if_faulted();
        const auto start = clock::now();
        bool asking = false, patient = false;
        clock::time_point give_up{};
        for (unsigned spin = 0;; ++spin) {
            // A call that completed returns its (valid) result even when a
            // notice arrived meanwhile; the next call reports the fault.
            int done = 0;
            LOOM_MPI_CHECK(MPI_Test(&request, &done, status));
            if (done != 0) return;
            service(site.kind, site.call);
            // The clock costs more than a poll, but once this wait sleeps
            // between polls every poll reads it.
            if (spin % 64 != 0 && !patient) continue;
            const auto now = clock::now();
            patient = back_off(now - start);
            if (!asking && now - start >= site.timeout) {
                ask(site.members);
                asking = true;
                give_up = now + answer_grace(site.timeout);
            } else if (asking && (all_answered(site.members) || now >= give_up)) {
                fail(verdict(site));
                raise_collective(*fault_);
            }
        }
    }

    // A wait that has lasted a while is waiting for a slow or stalled peer,
    // not for the network: it sleeps between polls instead of burning a core.
    // The first milliseconds spin, so a collective's own rounds are not
    // delayed; after that each sleep is short next to the time already waited.
    // Returns whether it slept.
    static bool back_off(std::chrono::steady_clock::duration waited) {
        using std::chrono::microseconds, std::chrono::milliseconds;
        if (waited < milliseconds(5)) return false;
        std::this_thread::sleep_for(waited < milliseconds(100) ? microseconds(50) : microseconds(500));
        return true;
    }

    // Breaks the communicator with `text` (unless it is broken already) and
    // tells every rank of the root communicator, so their waits end with it.
    void fail(std::string text) {
        if (fault_) return;
        if (text.size() > max_notice_bytes) text = text.substr(0, max_notice_bytes - 3) + "...";
        mark_faulted(std::move(text));
        for (int peer = 0; peer < size_; ++peer)
            if (peer != rank_) post(peer, fault_tag, std::vector<char>(fault_->begin(), fault_->end()));
    }

    // Keeps memory an abandoned request may still write into until the end of
    // the process (it only happens after a fault, which ends the job).
    void bury(std::shared_ptr<void> memory) {
        if (memory) graveyard_.push_back(std::move(memory));
    }

private:
    struct Outgoing {
        std::vector<char> bytes;  // owned until MPI is done with them
        MPI_Request request = MPI_REQUEST_NULL;
    };

    void post(int to, int tag, std::vector<char> bytes) {
        Outgoing out{std::move(bytes)};
        LOOM_MPI_CHECK(MPI_Isend(out.bytes.data(), static_cast<int>(out.bytes.size()), MPI_CHAR, to, tag, comm_,
                                 &out.request));
        outbox_.push_back(std::move(out));  // the vector's heap block does not move with it
    }
    void post_words(int to, int tag, std::initializer_list<std::int64_t> words) {
        std::vector<char> bytes(words.size() * sizeof(std::int64_t));
        std::memcpy(bytes.data(), words.begin(), bytes.size());
        Outgoing out{std::move(bytes)};
        LOOM_MPI_CHECK(MPI_Isend(out.bytes.data(), static_cast<int>(words.size()), MPI_INT64_T, to, tag, comm_,
                                 &out.request));
        outbox_.push_back(std::move(out));
    }

    void reap_outbox() {
        std::erase_if(outbox_, [](Outgoing& out) {
            int done = 0;
            LOOM_MPI_CHECK(MPI_Test(&out.request, &done, MPI_STATUS_IGNORE));
            return done != 0;
        });
    }

    void mark_faulted(std::string text) {
        fault_ = std::move(text);
        mpi_fault_seen.store(true);
        recorder_->write(*fault_);  // the moment the ranks can still say what they did
    }

    void ask(std::span<const int> members) {
        ++round_;
        std::fill(answers_.begin(), answers_.end(), no_answer);
        for (int peer : members)
            if (peer != rank_) post_words(peer, query_tag, {round_, 0, 0});
    }

    [[nodiscard]] bool all_answered(std::span<const int> members) const {
        return std::all_of(members.begin(), members.end(),
                           [&](int m) { return m == rank_ || answered(m); });
    }

    [[nodiscard]] bool answered(int m) const { return answers_[static_cast<std::size_t>(m)][0] >= 0; }

    // The sentence for a timeout, built only from what every observer sees
    // alike, never from the observer's own rank: who answered, and where the
    // lowest-ranked member present waits (an observer knows that from its
    // answer, or is that member).
    [[nodiscard]] std::string verdict(const MpiWaitSite& site) const {
        std::array<std::int64_t, 2> where{static_cast<std::int64_t>(site.kind), site.call};
        std::string missing, waiting;
        bool first_present = true;
        for (int m : site.members) {
            if (m != rank_ && !answered(m)) {
                missing += (missing.empty() ? "" : ", ") + std::to_string(m);
                continue;
            }
            const auto at = m == rank_ ? std::array<std::int64_t, 2>{static_cast<std::int64_t>(site.kind), site.call}
                                       : answers_[static_cast<std::size_t>(m)];
            if (first_present) where = at;
            first_present = false;
            waiting += loom::detail::concat(waiting.empty() ? "" : ", ", "world rank ", m, " in ",
                                            static_cast<OpKind>(at[0]));
        }
        const auto kind = static_cast<OpKind>(where[0]);
        const std::string head =
            where[1] >= 0 ? loom::detail::concat(kind, " (call ", where[1], " of a ", site.group_size, "-rank group)")
                          : loom::detail::concat(kind, " (in a ", site.group_size, "-rank group)");
        if (!missing.empty())
            return loom::detail::concat(head, " timed out after ", site.timeout.count(), " ms: world rank ", missing,
                                        " never arrived");
        return loom::detail::concat(head, " timed out after ", site.timeout.count(),
                                    " ms: no rank is missing, every one is waiting (", waiting,
                                    "); their calls do not match");
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0;
    int size_ = 1;
    MPI_Op max_op_ = MPI_OP_NULL;
    std::optional<std::string> fault_;
    std::vector<Outgoing> outbox_;
    static constexpr std::array<std::int64_t, 2> no_answer{-1, -1};
    std::int64_t round_ = 0;  // this rank's latest query round
    std::vector<std::array<std::int64_t, 2>> answers_;  // per control rank: its OpKind and call, or no_answer
    std::vector<std::shared_ptr<void>> graveyard_;
    std::unique_ptr<FlightRecorder> recorder_;
};

}  // namespace detail
}  // namespace loom::comm
