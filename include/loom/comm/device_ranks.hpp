// run_ranks_on(device, ranks, body): ranks as threads of this process, each
// with an AnyComm that moves `device`'s memory, body(comm) once per rank. On
// the host that is ThreadWorld; on a GPU it is the backend's world of rank
// threads on that one device (DeviceThreadWorld, each rank on its own stream,
// its layers on the same stream), registered by loom/cuda_backend.cuh, so
// host code such as train_gpt runs data parallelism on a GPU without naming a
// CUDA type.
#pragma once

#include <functional>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/device.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

// What a backend provides: its world of rank threads on one device.
class DeviceRankRunner {
public:
    virtual ~DeviceRankRunner() = default;
    virtual void run(int ranks, Device device, const std::function<void(AnyComm&)>& body) const = 0;
};

inline void run_ranks_on(Device device, int ranks, const std::function<void(AnyComm&)>& body) {
    LOOM_CHECK(ranks >= 1, "run_ranks_on: ", ranks, " ranks requested; a world has at least 1 rank");
    if (device.kind == DeviceKind::host) {
        ThreadWorld(ranks).run([&](ThreadComm& comm) {
            AnyComm any = AnyComm::view(comm);
            body(any);
        });
        return;
    }
    check_device_usable(device);
    const DeviceRankRunner* runner = loom::detail::backend_slot<DeviceRankRunner>(device.kind);
    LOOM_CHECK(runner != nullptr, "ranks on ", device, " need the ", device.kind,
               " backend's communicator, which this program was built without: compile one .cu file that includes "
               "loom/cuda_backend.cuh and link loom::cuda");
    runner->run(ranks, device, body);
}

}  // namespace loom::comm
