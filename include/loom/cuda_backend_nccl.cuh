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
#include <optional>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/communicator_nccl.cuh"
#include "loom/comm/device_processes.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/cuda_backend.cuh"

namespace loom::nccl_backend {

class NcclProcessJoiner final : public comm::DeviceProcessJoiner {
public:
    // The ranks learn whether any of them failed before the communicator
    // ends: a rank whose bootstrap or body threw (after its peers' own NCCL
    // timeouts, where they were waiting on it) says so over the host
    // communicator; if any did, every rank aborts its communicator (stopping
    // NCCL work no peer will match), and the ranks that finished throw too,
    // saying so, rather than return as if the job had succeeded.
    void run(comm::AnyComm& host, Device device, const std::function<void(comm::AnyComm&)>& body) const override {
        std::optional<comm::Nccl> nccl;
        std::exception_ptr failure;
        try {
            nccl.emplace(comm::Nccl::bootstrap(host, device.index));
            const cuda_backend::StreamScope stream(nccl->stream());
            comm::AnyComm any = comm::AnyComm::view(*nccl);
            body(any);
            nccl->synchronize();  // the body's last work is done before the communicator goes
        } catch (...) {
            failure = std::current_exception();
        }
        std::int32_t failed = failure != nullptr ? 1 : 0;
        try {
            host.all_reduce(Tensor::of(&failed, Shape{1}), Tensor::of(&failed, Shape{1}), comm::ReduceOp::max);
        } catch (...) {  // the host communicator failed too: this rank's own error first
            if (nccl) nccl->abort("the host communicator failed while the ranks compared their outcomes");
            if (failure != nullptr) std::rethrow_exception(failure);
            throw;
        }
        if (failed != 0 && nccl) nccl->abort("another rank's work on this communicator failed; it was aborted");
        if (failure != nullptr) std::rethrow_exception(failure);
        LOOM_CHECK(failed == 0, "rank ", host.rank(), " of ", host.size(), " (", device,
                   ") finished, but another rank failed: the NCCL communicator was aborted on every rank (that "
                   "rank's error says why)");
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
