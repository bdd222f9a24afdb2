// loom-flight: merges the flight recorder's files (one per rank, written on a
// communicator fault when LOOM_FLIGHT_RECORDER_DIR is set) and says where the
// ranks diverged or which rank stalled.
//   loom-flight DIR            every flight-rank*.tsv in DIR
//   loom-flight FILE...        these files
#include <loom/comm/flight_report.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    try {
        std::vector<std::string> paths;
        for (int i = 1; i < argc; ++i) {
            const std::filesystem::path arg(argv[i]);
            if (!std::filesystem::is_directory(arg)) {
                paths.push_back(arg.string());
                continue;
            }
            for (const auto& entry : std::filesystem::directory_iterator(arg)) {
                const std::string name = entry.path().filename().string();
                if (name.rfind("flight-rank", 0) == 0 && entry.path().extension() == ".tsv")
                    paths.push_back(entry.path().string());
            }
        }
        if (paths.empty()) {
            std::fprintf(stderr, "loom-flight: no flight recorder files; usage: loom-flight DIR | FILE...\n");
            return 2;
        }
        std::vector<loom::comm::FlightLog> logs;
        for (const std::string& path : paths) logs.push_back(loom::comm::read_flight_log(path));
        std::printf("loom flight report: %zu file(s) of a %d-rank job\n", logs.size(), logs.front().size);
        for (const auto& log : logs)
            std::printf("world rank %d: %zu call(s) recorded; fault: %s\n", log.rank, log.entries.size(),
                        log.reason.c_str());
        for (const std::string& line : loom::comm::merge_flight_logs(logs)) std::printf("%s\n", line.c_str());
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "loom-flight: %s\n", e.what());
        return 1;
    }
}
