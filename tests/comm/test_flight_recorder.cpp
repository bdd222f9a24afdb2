// The flight recorder (flight_recorder.hpp) and the merge of its files
// (flight_report.hpp): the ring, the file format read back, the merge's
// findings on hand-made records, every bad input's message, and ThreadWorld
// writing one file per rank on a fault.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/flight_recorder.hpp"
#include "loom/comm/flight_report.hpp"
#include "loom/comm/thread_world.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::DType;
using loom::comm::CallSignature;
using loom::comm::FlightLog;
using loom::comm::FlightRecorder;
using loom::comm::OpKind;
using loom::comm::ReduceOp;
using Catch::Matchers::Contains;

namespace {

CallSignature all_reduce(std::int64_t count) { return CallSignature{OpKind::all_reduce, DType::f32, count}; }

// A file's text as a rank of a `size`-rank job would write it.
std::string file_text(int rank, int size, double written, const std::string& records) {
    return "# loom flight recorder\nrank " + std::to_string(rank) + " of " + std::to_string(size) +
           "\nreason a fault\nwritten " + std::to_string(written) + "\n" + records;
}

// One record line: seq, group, call, then an all_reduce of `count` f32 at time `t`.
std::string line(int seq, const std::string& group, int call, int count, double t, int kind = 0) {
    return std::to_string(seq) + "\t" + group + "\t" + std::to_string(call) + "\t" + std::to_string(kind) + "\t0\t" +
           std::to_string(count) + "\t-1\t0\t-1\t" + std::to_string(t) + "\tall_reduce\n";
}

std::vector<FlightLog> parse_all(const std::vector<std::string>& texts) {
    std::vector<FlightLog> logs;
    for (std::size_t r = 0; r < texts.size(); ++r) logs.push_back(loom::comm::parse_flight_log(texts[r], "f"));
    return logs;
}

// A fresh directory, named by LOOM_FLIGHT_RECORDER_DIR while it lives.
struct RecorderDirectory {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("loom_flight_test_" + std::to_string(::getpid()));
    RecorderDirectory() {
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
        ::setenv("LOOM_FLIGHT_RECORDER_DIR", path.c_str(), 1);
    }
    ~RecorderDirectory() {
        ::unsetenv("LOOM_FLIGHT_RECORDER_DIR");
        std::filesystem::remove_all(path);
    }
    [[nodiscard]] std::vector<FlightLog> logs(int ranks) const {
        std::vector<FlightLog> out;
        for (int r = 0; r < ranks; ++r)
            out.push_back(loom::comm::read_flight_log((path / ("flight-rank" + std::to_string(r) + ".tsv")).string()));
        return out;
    }
};

}  // namespace

TEST_CASE("flight recorder: the ring keeps the last calls, and the file reads back", "[flight]") {
    FlightRecorder off("", 0, 2);
    off.record(0, 0, all_reduce(8));
    CHECK(off.records().empty());

    FlightRecorder recorder("/nonexistent-dir", 1, 2, 3);
    const auto group = recorder.group({0, 1});
    CHECK(recorder.group({0, 1}) == group);
    CHECK(recorder.group({1}) != group);
    for (int call = 0; call < 5; ++call) recorder.record(group, call, all_reduce(8 + call));
    const auto kept = recorder.records();
    REQUIRE(kept.size() == 3);
    CHECK(kept.front().seq == 2);
    CHECK(kept.back().call == 4);
    CHECK(kept.back().sig.count == 12);
    recorder.write("cannot be written");  // a directory that does not exist: no throw

    const FlightLog log = loom::comm::parse_flight_log(recorder.text("why\tit\nfailed"), "text");
    CHECK(log.rank == 1);
    CHECK(log.size == 2);
    CHECK(log.reason == "why it failed");
    CHECK(log.written > 1.6e9);
    REQUIRE(log.entries.size() == 3);
    CHECK(log.entries[0].group == "0,1");
    CHECK(log.entries[2].sig == all_reduce(12));
}

TEST_CASE("flight recorder: the merge names the diverged rank and call", "[flight]") {
    std::vector<std::string> texts;
    for (int r = 0; r < 4; ++r)
        texts.push_back(file_text(r, 4, 10.0,
                                  line(0, "0,1,2,3", 0, 8, 1.0) + line(1, "0,1,2,3", 1, 8, 1.1) +
                                      line(2, "0,1,2,3", 2, r == 2 ? 7 : 8, 1.2) +
                                      line(3, "0,1,2,3", 3, r == 2 ? 8 : 9, 1.3)));
    const auto report = loom::comm::merge_flight_logs(parse_all(texts));
    REQUIRE(report.size() == 1);  // only the first difference
    CHECK(report[0] == "diverged: call 2 of group [0,1,2,3]: world rank 2 called all_reduce of 7 x f32 (sum), "
                       "world ranks 0, 1, 3 called all_reduce of 8 x f32 (sum)");
}

TEST_CASE("flight recorder: the merge names a rank behind, a late rank and a rank without a file", "[flight]") {
    SECTION("behind") {
        std::vector<std::string> texts;
        for (int r = 0; r < 3; ++r)
            texts.push_back(file_text(r, 3, 10.0, line(0, "0,1,2", 0, 8, 1.0) + (r == 1 ? "" : line(1, "0,1,2", 1, 4, 1.1))));
        const auto report = loom::comm::merge_flight_logs(parse_all(texts));
        REQUIRE(report.size() == 1);
        CHECK(report[0] == "stalled: world rank 1 in group [0,1,2]: its last call was 0 (all_reduce of 8 x f32 (sum)); "
                           "world ranks 0, 2 reached call 1 (all_reduce of 4 x f32 (sum))");
    }
    SECTION("late") {
        const auto report = loom::comm::merge_flight_logs(parse_all(
            {file_text(0, 2, 5.0, line(0, "0,1", 0, 8, 1.0)), file_text(1, 2, 9.0, line(0, "0,1", 0, 8, 7.5))}));
        REQUIRE(report.size() == 1);
        CHECK(report[0] == "stalled: world rank 1 arrived late at call 0 of group [0,1] (all_reduce of 8 x f32 (sum)), "
                           "2.5 s after world rank 0 had given up");
    }
    SECTION("no file") {
        const auto report = loom::comm::merge_flight_logs(
            parse_all({file_text(0, 3, 5.0, line(0, "0,1,2", 0, 8, 1.0)), file_text(2, 3, 5.0, line(0, "0,1,2", 0, 8, 1.0))}));
        REQUIRE(report.size() == 1);
        CHECK(report[0] == "stalled: world rank 1 wrote no file (stopped, killed, or stuck outside loom); world rank 0's "
                           "last call was call 0 of group [0,1,2] (all_reduce of 8 x f32 (sum))");
    }
    SECTION("nothing wrong") {
        const auto report = loom::comm::merge_flight_logs(
            parse_all({file_text(0, 2, 5.0, line(0, "0,1", 0, 8, 1.0)), file_text(1, 2, 5.0, line(0, "0,1", 0, 8, 1.0))}));
        CHECK(report == std::vector<std::string>{"no divergence and no stall found in the recorded calls"});
    }
}

TEST_CASE("flight recorder: bad files and bad merges are named", "[flight]") {
    CHECK_THROWS_WITH(FlightRecorder("d", 0, 1, 0), Contains("FlightRecorder: capacity is 0; keep at least one call"));
    CHECK_THROWS_WITH(loom::comm::parse_flight_log("# loom flight recorder\n", "a.tsv"),
                      Contains("a.tsv: no 'rank R of N' line; is this a loom flight recorder file?"));
    CHECK_THROWS_WITH(loom::comm::parse_flight_log("rank 4 of 4\n", "a.tsv"),
                      Contains("a.tsv:1: expected 'rank R of N' with 0 <= R < N, got 'rank 4 of 4'"));
    CHECK_THROWS_WITH(loom::comm::parse_flight_log("rank 0 of 1\nwritten soon\n", "a.tsv"),
                      Contains("a.tsv:2: expected 'written <seconds>', got 'written soon'"));
    CHECK_THROWS_WITH(loom::comm::parse_flight_log("rank 0 of 1\n0\t0\t0\t99\t0\t8\t-1\t0\t-1\t1.0\tx\n", "a.tsv"),
                      Contains("a.tsv:2: expected a record '<seq> <group> <call> <kind> <dtype> <count> <root> <op> "
                               "<peer> <seconds> ...', got '0\t0\t0\t99"));
    CHECK_THROWS_WITH(loom::comm::read_flight_log("/nonexistent/flight-rank0.tsv"),
                      Contains("cannot read the flight recorder file /nonexistent/flight-rank0.tsv"));
    CHECK_THROWS_WITH(loom::comm::merge_flight_logs({}), Contains("loom-flight: no flight recorder files to merge"));
    CHECK_THROWS_WITH(loom::comm::merge_flight_logs(parse_all({file_text(0, 2, 1, ""), file_text(1, 3, 1, "")})),
                      Contains("loom-flight: world rank 1's file is of a 3-rank job, world rank 0's of a 2-rank one; "
                               "merge the files of one job"));
    CHECK_THROWS_WITH(loom::comm::merge_flight_logs(parse_all({file_text(0, 2, 1, ""), file_text(0, 2, 1, "")})),
                      Contains("loom-flight: two files of world rank 0; merge one file per rank"));
}

TEST_CASE("flight recorder: ThreadWorld writes every rank's file on a fault", "[flight]") {
    const RecorderDirectory directory;
    SECTION("a mismatched call") {
        CHECK_THROWS(loom::comm::ThreadWorld(3).run([](loom::comm::ThreadComm& c) {
            std::vector<float> x(8);
            auto t = loom::Tensor::of(x.data(), {std::int64_t{c.rank() == 1 ? 7 : 8}});
            c.barrier();
            c.all_reduce(t, t, ReduceOp::sum);
        }));
        CHECK(loom::comm::merge_flight_logs(directory.logs(3)) ==
              std::vector<std::string>{"diverged: call 1 of group [0,1,2]: world rank 1 called all_reduce of 7 x f32 "
                                       "(sum), world ranks 0, 2 called all_reduce of 8 x f32 (sum)"});
    }
    SECTION("a stalled rank") {
        CHECK_THROWS(loom::comm::ThreadWorld(3, {std::chrono::milliseconds(100)}).run([](loom::comm::ThreadComm& c) {
            c.barrier();
            if (c.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(400));
            c.barrier();
        }));
        const auto report = loom::comm::merge_flight_logs(directory.logs(3));
        REQUIRE(!report.empty());
        CHECK_THAT(report[0], Contains("stalled: world rank 2 in group [0,1,2]: its last call was 0 (barrier); world "
                                       "ranks 0, 1 reached call 1 (barrier)"));
    }
    SECTION("a send nobody receives: the sender's file names it and its peer, as under Mpi") {
        CHECK_THROWS(loom::comm::ThreadWorld(2, {std::chrono::milliseconds(100)}).run([](loom::comm::ThreadComm& c) {
            std::vector<float> x(5);
            const auto t = loom::Tensor::of(x.data(), {5});
            c.barrier();
            if (c.rank() == 0) c.send(t, 1, 3);
            else c.recv(loom::Tensor::of(x.data(), {4}), 0, 4);  // another tag: the two never meet
        }));
        const auto logs = directory.logs(2);
        REQUIRE(logs.size() == 2);
        REQUIRE(!logs[0].entries.empty());
        REQUIRE(!logs[1].entries.empty());
        const auto& sent = logs[0].entries.back();
        CHECK(sent.sig.kind == OpKind::send);
        CHECK(sent.sig.count == 5);
        CHECK(sent.peer == 1);
        CHECK(sent.call == -1);
        const auto& expected = logs[1].entries.back();
        CHECK(expected.sig.kind == OpKind::recv);
        CHECK(expected.sig.count == 4);
        CHECK(expected.peer == 0);
    }
}

}  // namespace LOOM_TEST_FILE
