// The NCCL backend of loom's host code: registers a DeviceProcessJoiner
// (comm/device_processes.hpp) for DeviceKind::cuda that joins one GPU per
// process into an Nccl communicator, bootstrapped through the processes'
// host communicator, and runs the body on its stream. Includes the CUDA
// backend (loom/cuda_backend.cuh: memory, kernels, rank threads on one GPU).
// Include it from one .cu file of the program, compiled by nvcc, linked with
// loom::nccl:
//
//   // nccl_backend.cu
//   #include "loom/cuda_backend_nccl.cuh"
#pragma once

#include <cstdint>
#include <exception>
#include <functional>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/communicator_nccl.cuh"
#include "loom/comm/device_processes.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/cuda_backend.cuh"

namespace loom::nccl_backend {

class NcclProcessJoiner final : public comm::DeviceProcessJoiner {
public:
    // The ranks agree on how the communicator ends before it does:
    // ncclCommDestroy ends in a barrier with the node's other ranks, which
    // ncclCommAbort skips, so one rank aborting while another destroys would
    // leave the other waiting for ever. A rank whose body threw (after its
    // peers' own timeouts, if they were waiting on it) says so over the host
    // communicator; if any did, every rank aborts, and the ranks whose body
    // finished throw too, naming the failure as theirs does not.
    void run(comm::AnyComm& host, Device device, const std::function<void(comm::AnyComm&)>& body) const override {
        comm::Nccl nccl = comm::Nccl::bootstrap(host, device.index);
        std::exception_ptr failure;
        try {
            const cuda_backend::StreamScope stream(nccl.stream());
            comm::AnyComm any = comm::AnyComm::view(nccl);
            body(any);
            nccl.synchronize();  // the body's last work is done before the communicator goes
        } catch (...) {
            failure = std::current_exception();
        }
        std::int32_t failed = failure != nullptr ? 1 : 0;
        host.all_reduce(Tensor::of(&failed, Shape{1}), Tensor::of(&failed, Shape{1}), comm::ReduceOp::max);
        if (failed != 0) nccl.abort("another rank's work on this communicator failed; it was aborted on every rank");
        if (failure != nullptr) std::rethrow_exception(failure);
        LOOM_CHECK(failed == 0, "rank ", host.rank(), " of ", host.size(), " finished, but another rank failed on ",
                   device, ": the NCCL communicator was aborted on every rank (that rank's error says why)");
    }
};

[[nodiscard]] inline NcclProcessJoiner& joiner() {
    static NcclProcessJoiner instance;
    return instance;
}

// Installs the joiner; idempotent (the CUDA backend installs itself).
inline bool install() {
    install_backend<comm::DeviceProcessJoiner>(DeviceKind::cuda, &joiner());
    return true;
}

// Initialised once per program, before main.
inline const bool installed = install();

}  // namespace loom::nccl_backend
