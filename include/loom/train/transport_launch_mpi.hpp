// launch_mpi_processes: transport_launch.hpp's launch on the processes an
// MPI launcher started, inside the session a program opened (MpiSession):
// the world's run, the body on the host, on one GPU per process over the
// host, or on the GPUs joined over NCCL (launch_on_processes), and an error
// printed by every process before the session ends the job with MPI_Abort,
// so that none is lost with the job.
//
//   comm::MpiSession session(argc, argv);
//   if (!train::launch_mpi_processes(comm::Mpi::world(), {.device = device}, train_on)) return 1;
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/communicator_mpi.hpp"
#include "loom/core/device.hpp"
#include "loom/train/transport_launch.hpp"

namespace loom::train {

// Where the processes train (launch_on_processes says what each means).
struct MpiProcesses {
    Device device = host_device;
    bool per_process = false;       // each process takes its node rank's GPU
    bool host_collectives = false;  // the collectives stay on the host (OptEx), the GPU computes
};

// Runs body on the processes of `world`; true when every process returned.
// An error is printed on standard error by each process that saw it, as
// `words(error)` says it (by default its what(): a program words a
// DeviceRefused by its own setting), and false is returned: the session
// then ends the job.
inline bool launch_mpi_processes(comm::Mpi world, const MpiProcesses& processes, const TransportBody& body,
                                 const std::function<std::string(const std::exception&)>& words = {}) {
    try {
        world.run([&](comm::Mpi& comm) {
            comm::AnyComm host = comm::AnyComm::view(comm);
            launch_on_processes(host, processes.device, processes.per_process, processes.host_collectives, body);
        });
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", words ? words(e).c_str() : e.what());
        return false;
    }
    return true;
}

}  // namespace loom::train
