// Faults that end an MPI job, one scenario per run (argv[1]):
//   throws  rank 1 throws inside Mpi::run; every other rank's pending call
//           (collective or receive) and later calls fail with
//           "rank 1 failed: injected failure", long before the timeout;
//   absent  the last rank never arrives at a collective; the others fail
//           after the 500 ms timeout with "all_reduce (call 1 of a N-rank
//           group) timed out after 500 ms: world rank N-1 never arrived", and
//           so does the late rank's next call;
//   stuck   every rank waits in a receive nobody sends; every rank fails
//           with the same "... no rank is missing, every one is waiting ...".
//   stalled the last rank stops itself (SIGSTOP) inside a 4 MiB all_reduce
//           (in MPI's entry point, see below): the others fail after the 500 ms timeout
//           with "... world rank N-1 never arrived" (a blocking MPI call would
//           have held them forever); they report to rank 0 point to point,
//           since the stopped rank joins no collective again.
// argv[2] == "check" turns check_calls on. Each rank records what it saw; rank
// 0 gathers the records over MPI_COMM_WORLD (untouched by loom's duplicates),
// verifies them and prints "fault test passed" or "FAIL: ...". Then
// MpiSession's destructor ends the faulted job with MPI_Abort; ctest matches
// the printed verdict and its timeout is the backstop against a hang.
#include <mpi.h>

#include <loom/comm/communicator_mpi.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using loom::Shape;
using loom::Tensor;
using loom::comm::CommOptions;
using loom::comm::Mpi;
using loom::comm::ReduceOp;
using Records = std::vector<std::pair<std::string, std::string>>;  // (what happened, its text)

namespace {

// Set on the rank that must stall: its next large collective stops the
// process from inside MPI (see the interposed calls below).
bool stall_armed = false;
void stall_if_armed(int count) {
    if (stall_armed && count >= (1 << 16)) std::raise(SIGSTOP);
}

}  // namespace

// MPI's profiling interface: these definitions replace the library's entry
// points in this program and forward to PMPI_*, so the stall happens inside
// the MPI call, whichever form loom uses. Before MPI has the call, so that no
// peer can complete it: with the blocking form (after a handshake every rank
// passed) the others would wait in MPI_Allreduce forever.
extern "C" int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    stall_if_armed(count);
    return PMPI_Allreduce(send, recv, count, type, op, comm);
}
extern "C" int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                              MPI_Request* request) {
    stall_if_armed(count);
    return PMPI_Iallreduce(send, recv, count, type, op, comm, request);
}

namespace {

Tensor view(std::vector<float>& v) { return Tensor::of(v.data(), Shape{static_cast<std::int64_t>(v.size())}); }

// Runs `call`, recording the text of what it threw (or that it did not throw).
template <class F>
void record(Records& records, const std::string& label, F&& call) {
    try {
        call();
        records.emplace_back(label, "no error");
    } catch (const std::exception& e) {
        records.emplace_back(label, e.what());
    }
}

std::string serialize(const Records& records) {
    std::string text;
    for (const auto& [label, what] : records) text += label + "\t" + what + "\n";
    return text;
}

Records parse(std::string_view text) {
    Records records;
    while (!text.empty()) {
        const auto end = text.find('\n');
        const auto line = text.substr(0, end);
        const auto tab = line.find('\t');
        records.emplace_back(std::string(line.substr(0, tab)), std::string(line.substr(tab + 1)));
        text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    }
    return records;
}

// Every rank's records, on rank 0.
std::vector<Records> gather(const Records& mine, int me, int n) {
    const std::string text = serialize(mine);
    int length = static_cast<int>(text.size());
    std::vector<int> lengths(static_cast<std::size_t>(n)), offsets(static_cast<std::size_t>(n));
    MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    int total = 0;
    for (int r = 0; r < n; ++r) {
        offsets[static_cast<std::size_t>(r)] = total;
        total += lengths[static_cast<std::size_t>(r)];
    }
    std::string all(static_cast<std::size_t>(me == 0 ? total : 0), '\0');
    MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
                MPI_COMM_WORLD);
    std::vector<Records> result;
    if (me == 0)
        for (int r = 0; r < n; ++r)
            result.push_back(parse(std::string_view(all).substr(static_cast<std::size_t>(offsets[r]),
                                                                 static_cast<std::size_t>(lengths[r]))));
    return result;
}

// What each rank must have recorded: (label, exact text). "COLLECTIVE" stands
// for the one MpiCollectiveError every rank must share: its message is
// `shared`, its what() is the same string on every rank.
struct Expectation {
    std::string shared;
    std::vector<Records> per_rank;
};

int verify(const std::vector<Records>& seen, const Expectation& expected) {
    int failures = 0;
    std::string shared_what;
    for (std::size_t r = 0; r < seen.size(); ++r) {
        for (const auto& [label, text] : seen[r]) std::printf("rank %zu: %s: %s\n", r, label.c_str(), text.c_str());
        const Records& want = expected.per_rank[r];
        if (seen[r].size() != want.size()) {
            std::printf("FAIL: rank %zu recorded %zu events, expected %zu\n", r, seen[r].size(), want.size());
            ++failures;
            continue;
        }
        for (std::size_t i = 0; i < want.size(); ++i) {
            const auto& [label, text] = seen[r][i];
            bool ok = label == want[i].first;
            if (want[i].second == "COLLECTIVE") {
                // what() is the message and one location suffix, the same everywhere.
                ok = ok && text.rfind(expected.shared + " [include/loom/comm/control_mpi.hpp:", 0) == 0;
                if (shared_what.empty()) shared_what = text;
                ok = ok && text == shared_what;
            } else {
                ok = ok && text == want[i].second;
            }
            if (!ok) {
                std::printf("FAIL: rank %zu event %zu is \"%s: %s\", expected \"%s: %s\"\n", r, i, label.c_str(),
                            text.c_str(), want[i].first.c_str(),
                            want[i].second == "COLLECTIVE" ? expected.shared.c_str() : want[i].second.c_str());
                ++failures;
            }
        }
    }
    return failures;
}

// Rank 1 throws after the first collective.
Expectation throws(Mpi& comm, Records& mine) {
    const int me = comm.rank(), n = comm.size(), failing = 1;
    std::vector<float> x(8, 1.0f), y(8, 1.0f), z(8, 1.0f);
    record(mine, "run", [&] {
        comm.run([&](Mpi& c) {
            c.all_reduce(view(x), view(x), ReduceOp::sum);
            // Every rank has finished that call before rank 1 fails; otherwise
            // it could still be pending, and fail, on a slow rank.
            MPI_Barrier(MPI_COMM_WORLD);
            if (me == failing) throw std::runtime_error("injected failure");
            // Pending calls the failed rank never joins: a collective on rank
            // 0, a receive from it on the others.
            // (With check_calls the collective already fails in its signature exchange.)
            loom::comm::Request pending;
            record(mine, "pending", [&] {
                pending = me == 0 ? c.all_reduce_async(view(y), view(y), ReduceOp::sum) : c.recv_async(view(y), failing, 3);
                pending.wait();
            });
            record(mine, "later recv", [&] { c.recv(view(z), failing, 4); });
            c.barrier();  // throws out of run
        });
    });
    record(mine, "after run", [&] { comm.barrier(); });
    Expectation e{"rank 1 failed: injected failure", std::vector<Records>(static_cast<std::size_t>(n))};
    for (int r = 0; r < n; ++r) {
        if (r == failing)
            e.per_rank[r] = {{"run", "injected failure"}, {"after run", "COLLECTIVE"}};
        else
            e.per_rank[r] = {{"pending", "COLLECTIVE"}, {"later recv", "COLLECTIVE"}, {"run", "COLLECTIVE"},
                             {"after run", "COLLECTIVE"}};
    }
    return e;
}

// The last rank skips a 4 MiB all_reduce (the handshake + blocking path), then
// calls again after the others gave up on it.
Expectation absent(Mpi& comm, Records& mine) {
    const int me = comm.rank(), n = comm.size(), missing = n - 1;
    std::vector<float> x(8, 1.0f), big(std::size_t{1} << 20, 1.0f);
    comm.all_reduce(view(x), view(x), ReduceOp::sum);
    if (me != missing) {
        record(mine, "stalled call", [&] { comm.all_reduce(view(big), view(big), ReduceOp::sum); });
        record(mine, "later call", [&] { comm.barrier(); });
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the others have given up: now the late rank calls
    if (me == missing) record(mine, "late call", [&] { comm.recv(view(x), 0, 7); });
    Expectation e{"all_reduce (call 1 of a " + std::to_string(n) + "-rank group) timed out after 500 ms: world rank " +
                      std::to_string(missing) + " never arrived",
                  std::vector<Records>(static_cast<std::size_t>(n))};
    for (int r = 0; r < n; ++r)
        e.per_rank[r] = r == missing ? Records{{"late call", "COLLECTIVE"}}
                                     : Records{{"stalled call", "COLLECTIVE"}, {"later call", "COLLECTIVE"}};
    return e;
}

// Every rank receives from the next one, which never sends.
Expectation stuck(Mpi& comm, Records& mine) {
    const int me = comm.rank(), n = comm.size();
    std::vector<float> x(8, 1.0f);
    record(mine, "recv", [&] { comm.recv(view(x), (me + 1) % n, 0); });
    std::string everyone;
    for (int r = 0; r < n; ++r) everyone += (r == 0 ? "" : ", ") + std::string("world rank ") + std::to_string(r) + " in recv";
    Expectation e{"recv (in a " + std::to_string(n) + "-rank group) timed out after 500 ms: no rank is missing, every "
                      "one is waiting (" + everyone + "); their calls do not match",
                  std::vector<Records>(static_cast<std::size_t>(n), Records{{"recv", "COLLECTIVE"}})};
    return e;
}

// The last rank stops inside a 4 MiB all_reduce; the others must end at the
// timeout naming it. Returns their records, on rank 0, gathered point to point.
Expectation stalled(Mpi& comm, Records& mine, std::vector<Records>& seen) {
    const int me = comm.rank(), n = comm.size(), stopping = n - 1;
    std::vector<float> x(8, 1.0f), big(std::size_t{1} << 20, 1.0f);
    comm.all_reduce(view(x), view(x), ReduceOp::sum);
    stall_armed = me == stopping;
    record(mine, "stalled call", [&] { comm.all_reduce(view(big), view(big), ReduceOp::sum); });
    record(mine, "later call", [&] { comm.barrier(); });
    const std::string text = serialize(mine);
    if (me != 0) {
        MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0, 99, MPI_COMM_WORLD);
    } else {
        seen.push_back(mine);
        for (int r = 1; r < stopping; ++r) {
            MPI_Status status;
            MPI_Probe(r, 99, MPI_COMM_WORLD, &status);
            int length = 0;
            MPI_Get_count(&status, MPI_CHAR, &length);
            std::string theirs(static_cast<std::size_t>(length), '\0');
            MPI_Recv(theirs.data(), length, MPI_CHAR, r, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            seen.push_back(parse(theirs));
        }
    }
    return Expectation{"all_reduce (call 1 of a " + std::to_string(n) +
                           "-rank group) timed out after 500 ms: world rank " + std::to_string(stopping) +
                           " never arrived",
                       std::vector<Records>(static_cast<std::size_t>(stopping),
                                            Records{{"stalled call", "COLLECTIVE"}, {"later call", "COLLECTIVE"}})};
}

}  // namespace

int main(int argc, char** argv) {
    const std::string scenario = argc > 1 ? argv[1] : "";
    // stalled: the stopped rank never reaches the session's end, so the others
    // abort the job after a short wait instead of the default 10 s.
    loom::comm::MpiSessionOptions session_options;
    if (scenario == "stalled") session_options.exit_timeout = std::chrono::milliseconds(500);
    loom::comm::MpiSession session(argc, argv, session_options);
    const bool check_calls = argc > 2 && std::string_view(argv[2]) == "check";
    // throws: a long timeout, so only the failure notice can end the waits in time.
    const auto timeout = scenario == "throws" ? std::chrono::milliseconds(20000) : std::chrono::milliseconds(500);
    Mpi comm = Mpi::world(CommOptions{timeout, check_calls});

    Records mine;
    Expectation expected;
    std::vector<Records> stalled_seen;
    const auto begin = std::chrono::steady_clock::now();
    if (scenario == "throws")
        expected = throws(comm, mine);
    else if (scenario == "absent")
        expected = absent(comm, mine);
    else if (scenario == "stuck")
        expected = stuck(comm, mine);
    else if (scenario == "stalled")
        expected = stalled(comm, mine, stalled_seen);
    else if (session.world_rank() == 0)
        std::printf("FAIL: unknown scenario \"%s\"; use throws, absent, stuck or stalled\n", scenario.c_str());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();

    const auto seen = scenario == "stalled" ? stalled_seen : gather(mine, session.world_rank(), session.world_size());
    if (session.world_rank() == 0 && !expected.per_rank.empty()) {
        const int failures = verify(seen, expected);
        if (failures == 0)
            std::printf("fault test passed: %s on %d processes%s, %.2f s on rank 0\n", scenario.c_str(),
                        session.world_size(), check_calls ? " with check_calls" : "", seconds);
        else
            std::printf("FAIL: %d events differ from the expected ones\n", failures);
    }
    if (!loom::comm::mpi_fault_happened() && session.world_rank() == 0)
        std::printf("FAIL: this process saw no fault\n");
    std::fflush(stdout);
    return 0;
}
