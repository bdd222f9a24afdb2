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

#include <functional>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/communicator_nccl.cuh"
#include "loom/comm/device_processes.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/cuda_backend.cuh"

namespace loom::nccl_backend {

class NcclProcessJoiner final : public comm::DeviceProcessJoiner {
public:
    void run(comm::AnyComm& host, Device device, const std::function<void(comm::AnyComm&)>& body) const override {
        comm::Nccl nccl = comm::Nccl::bootstrap(host, device.index);
        const cuda_backend::StreamScope stream(nccl.stream());
        comm::AnyComm any = comm::AnyComm::view(nccl);
        body(any);
        nccl.synchronize();  // the body's last work is done before the communicator goes
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
