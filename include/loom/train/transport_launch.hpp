// Where a training run's ranks run, and what the run calls that: rank threads
// of this process (their links shaped as a described cluster's, or on one
// GPU with a stream each), or the processes an MPI launcher started (on the
// host, or one GPU each joined over the backend's communicator). A trainer
// hands over plain values and one body, body(world, transport, device), that
// trains on `world`; `transport` is the name a run prints ("4 rank threads on
// cuda:0 (NVIDIA H200 ...)") and `device` where each rank computes. Every
// transport reaches the body as one comm::AnyComm, so a trainer is compiled
// once, not once per communicator.
//
//   train::launch_rank_threads({.ranks = 4, .device = device}, train_on);
//   ...inside an MPI world's run():  train::launch_on_processes(host, device, per_process, false, train_on);
#pragma once

#include <functional>
#include <optional>
#include <sstream>
#include <string>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/device_processes.hpp"
#include "loom/comm/device_ranks.hpp"
#include "loom/comm/shaped.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/device.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/plan/cluster.hpp"
#include "loom/train/launcher.hpp"

namespace loom::train {

// What trains on one transport: the world, the transport's printed name, and
// the device each rank computes on.
using TransportBody = std::function<void(comm::AnyComm& world, const char* transport, Device device)>;

// A device the run cannot use: the message starts with the device ("cuda:0:
// no CUDA device is visible"), so a program can say which of its settings
// chose it. A separate type, because a body's own errors pass through the
// same calls and must not be mistaken for it.
class DeviceRefused : public Error {
public:
    using Error::Error;
};

// "`what` on cuda:0 (NVIDIA H200 (sm_90, 139 GiB))", after checking that
// `device` is there and usable: a run prints where it runs before it starts.
[[nodiscard]] inline std::string transport_name(const std::string& what, Device device) {
    std::ostringstream where;
    where << device;
    try {
        check_device_usable(device);
    } catch (const Error& e) {
        throw DeviceRefused(where.str() + ": " + e.message());
    }
    return what + " on " + where.str() + " (" + device_runtime(device).describe(device.index) + ")";
}

// This process's GPU under an MPI launcher: `device` itself when it names
// one index for every process (one process per node); with `per_process`,
// the process's rank on its node picks it (comm::device_of_local_rank: a
// process that sees one GPU takes it; a local rank past the visible GPUs is
// refused by name).
[[nodiscard]] inline Device process_device(Device device, bool per_process) {
    if (!per_process) return device;
    try {
        const LocalRank local = launcher_local_rank();
        if (local.rank < 0) return device;
        const int visible = device_runtime(device).device_count();
        return cuda_device(comm::device_of_local_rank(local.rank, visible, local.variable));
    } catch (const Error& e) {
        std::ostringstream kind;
        kind << device.kind;
        throw DeviceRefused(kind.str() + " under mpirun: " + e.message());
    }
}

// Rank threads of this process.
struct RankThreads {
    int ranks = 1;
    Device device = host_device;         // where each rank computes
    const plan::Cluster* cluster = nullptr;  // if given, the threads' traffic takes as long as over its links
    // The run's state and collectives stay on the host while each rank
    // computes on `device` (OptEx: its history is host memory); otherwise a
    // device run's ranks are the device backend's, each on its own stream.
    bool host_collectives = false;
};

// Runs body on `launch.ranks` rank threads and returns when all have. On a
// device without host collectives the ranks are the backend's world of
// threads (comm::run_ranks_on); otherwise host threads, their links shaped
// as the cluster's when one is given (the runs loom-plan's cost model is
// checked against). Shaped links delay threads by host clocks, which a
// device's asynchronous work does not follow, so a device run takes none.
inline void launch_rank_threads(const RankThreads& launch, const TransportBody& body) {
    const bool on_device = launch.device.kind != DeviceKind::host;
    LOOM_CHECK(!(on_device && launch.cluster != nullptr), "launch_rank_threads: shaped links delay host threads by host "
               "clocks while ", launch.device, "'s work runs asynchronously to them; shape links of host ranks only");
    LOOM_CHECK(launch.cluster == nullptr || launch.cluster->size() == launch.ranks, "launch_rank_threads: the cluster has ",
               launch.cluster == nullptr ? 0 : launch.cluster->size(), " devices for ", launch.ranks, " ranks");
    const std::string threads = launch.ranks == 1 ? "rank thread" : "rank threads";
    if (on_device && !launch.host_collectives) {
        const std::string transport = transport_name(threads, launch.device);
        comm::run_ranks_on(launch.device, launch.ranks,
                           [&](comm::AnyComm& world) { body(world, transport.c_str(), launch.device); });
        return;
    }
    // Named before any thread starts, so a refused device stops the run at once.
    const std::string transport = on_device ? transport_name(threads, launch.device)
                                  : launch.cluster != nullptr ? "rank threads" : threads;
    comm::ThreadWorld(launch.ranks).run([&](comm::ThreadComm& comm) {
        std::optional<comm::Shaped<comm::ThreadComm>> shaped;
        if (launch.cluster != nullptr) shaped.emplace(std::move(comm), launch.cluster->links());
        comm::AnyComm world = shaped ? comm::AnyComm::view(*shaped) : comm::AnyComm::view(comm);
        body(world, transport.c_str(), launch.device);
    });
}

// Inside the run of an MPI launcher's processes, `host` their world: body on
// the host over `host`; or, with a device, on this process's GPU
// (process_device), over `host` when the collectives stay on the host, else
// over the GPUs joined by the backend's communicator between processes
// (comm::run_process_on: NCCL, bootstrapped through `host`), each process
// training on its GPU's stream.
inline void launch_on_processes(comm::AnyComm& host, Device device, bool per_process, bool host_collectives,
                                const TransportBody& body) {
    if (device.kind == DeviceKind::host) {
        body(host, "MPI processes", host_device);
        return;
    }
    const Device mine = process_device(device, per_process);
    if (host_collectives) {
        body(host, transport_name("MPI processes, one GPU each, rank 0", mine).c_str(), mine);
        return;
    }
    const std::string transport = transport_name("NCCL processes, one GPU each, rank 0", mine);
    comm::run_process_on(mine, host, [&](comm::AnyComm& gpus) { body(gpus, transport.c_str(), mine); });
}

}  // namespace loom::train
