// run_process_on(device, host, body): this process's GPU joins the GPUs of
// the other processes of `host` (an MPI world, say) in one communicator that
// moves device memory, and body(comm) runs with it: one rank per process,
// ranks as `host`'s. The backend's joiner does the work (loom/cuda_backend_nccl.cuh
// registers one over NCCL, bootstrapped through `host`), so host code such as
// train_gpt trains on one GPU per process under mpirun without naming a CUDA
// or NCCL type. The body runs on the communicator's stream.
#pragma once

#include <functional>
#include <string_view>

#include "loom/comm/any_comm.hpp"
#include "loom/core/device.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

// What a backend provides: a communicator over the processes' devices.
class DeviceProcessJoiner {
public:
    virtual ~DeviceProcessJoiner() = default;
    virtual void run(AnyComm& host, Device device, const std::function<void(AnyComm&)>& body) const = 0;
};

// The device of the process that a launcher numbers `local_rank` on its node
// (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID: `variable` names which), where
// the process sees `visible` devices. One visible device is the process's own
// (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per process); with
// several, local rank r takes device r, and a rank past the last has none:
// two processes on one GPU cannot join one NCCL communicator. With none
// visible, the local rank is returned and check_device_usable names why.
[[nodiscard]] inline int device_of_local_rank(int local_rank, int visible, std::string_view variable) {
    LOOM_CHECK(local_rank >= 0, variable, " = ", local_rank, " is not a local rank; a launcher numbers a node's "
               "processes from 0");
    if (visible == 1) return 0;
    LOOM_CHECK(visible <= 0 || local_rank < visible, "local rank ", local_rank, " (", variable,
               ") has no GPU of its own: this process sees ", visible, " GPUs (cuda:0 to cuda:", visible - 1,
               "); start at most ", visible, " processes per node, or show each process one GPU "
               "(CUDA_VISIBLE_DEVICES, srun --gpus-per-task=1)");
    return local_rank;
}

// Collective over `host`: every process calls it with its own device.
inline void run_process_on(Device device, AnyComm& host, const std::function<void(AnyComm&)>& body) {
    LOOM_CHECK(device.kind != DeviceKind::host, "run_process_on: ", device,
               " is not a device; the processes' host communicator already moves host memory");
    check_device_usable(device);
    const DeviceProcessJoiner* joiner = loom::detail::backend_slot<DeviceProcessJoiner>(device.kind);
    LOOM_CHECK(joiner != nullptr, "processes on ", device, " need the ", device.kind,
               " backend's communicator between processes, which this program was built without: compile one .cu "
               "file that includes loom/cuda_backend_nccl.cuh and link loom::nccl");
    joiner->run(host, device, body);
}

}  // namespace loom::comm
