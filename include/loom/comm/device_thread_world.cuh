// DeviceThreadWorld: N ranks as threads of one process sharing one CUDA
// device, each with its own stream, so every policy can be exercised on one
// GPU. The device twin of ThreadWorld; collectives and their ordering are
// described in device_thread_comm.cuh.
//
//   loom::comm::DeviceThreadWorld(4, /*device_index=*/0).run([&](loom::comm::DeviceThreadComm& comm) {
//       comm.all_reduce(grad, grad, loom::comm::ReduceOp::avg);  // grad: a cuda tensor
//   });
//
// run() returns when every rank has returned and its stream has drained. If a
// rank throws, every other rank's pending and future calls fail with "rank R
// failed: <its message>", and run() rethrows the first rank's exception once
// all threads are joined. A rank that stops calling fails the others after
// CommOptions::timeout, naming it. Each rank thread runs with the world's
// device current.
//
// What it refuses, at construction: fewer than 1 or more than max_ranks (64)
// ranks (the reduction kernel takes every rank's address as one parameter),
// a device this process cannot see, and a device with less than
// min_free_bytes_per_rank (32 MiB) free per rank: a floor for the ranks'
// streams, events and staging, not a promise that the caller's own buffers
// fit. Communicator calls refuse host buffers and buffers on another device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "loom/comm/communicator.hpp"
#include "loom/comm/device_thread_comm.cuh"
#include "loom/comm/device_thread_group.cuh"
#include "loom/comm/device_thread_reduce.cuh"
#include "loom/comm/thread_sync.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

namespace detail {

// The memory refusal, separate so its message can be tested without a GPU.
inline void check_device_room(int ranks, int device, std::size_t free_bytes, std::size_t total_bytes,
                              std::size_t per_rank) {
    constexpr std::size_t mib = std::size_t{1} << 20;
    const std::size_t needed = static_cast<std::size_t>(ranks) * per_rank;
    LOOM_CHECK(free_bytes >= needed, "DeviceThreadWorld: ", ranks, " ranks on ", cuda_device(device), " need at least ",
               needed / mib, " MiB free (", per_rank / mib, " MiB per rank); the device has ", free_bytes / mib,
               " MiB free of ", total_bytes / mib, " MiB. Use fewer ranks or free device memory");
}

}  // namespace detail

class DeviceThreadWorld {
public:
    static constexpr int max_ranks = detail::device_group_max_members;
    static constexpr std::size_t min_free_bytes_per_rank = std::size_t{32} << 20;

    explicit DeviceThreadWorld(int ranks, int device_index = 0, CommOptions options = {})
        : ranks_(ranks), device_(device_index), options_(options) {
        LOOM_CHECK(ranks >= 1, "DeviceThreadWorld: ", ranks, " ranks requested; a world has at least 1 rank");
        LOOM_CHECK(ranks <= max_ranks, "DeviceThreadWorld: ", ranks, " ranks requested; at most ", max_ranks,
                   " ranks share one device (the reduction kernel takes every rank's buffer address as one "
                   "parameter)");
        LOOM_CHECK(options.timeout.count() > 0, "DeviceThreadWorld: timeout ", options.timeout.count(),
                   " ms must be positive");
        int count = 0;
        const cudaError_t status = cudaGetDeviceCount(&count);
        if (status != cudaSuccess) count = 0;
        LOOM_CHECK(device_index >= 0 && device_index < count, "DeviceThreadWorld: CUDA device ", device_index,
                   " does not exist; this process sees ", count, " device(s)",
                   status == cudaSuccess ? std::string()
                                         : loom::detail::concat(" (cudaGetDeviceCount: ", cudaGetErrorString(status), ")"));
        std::size_t free_bytes = 0, total_bytes = 0;
        {
            loom::detail::CudaDeviceScope scope(device_index);
            LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        }
        detail::check_device_room(ranks, device_index, free_bytes, total_bytes, min_free_bytes_per_rank);
    }

    [[nodiscard]] int size() const noexcept { return ranks_; }
    [[nodiscard]] Device device() const noexcept { return cuda_device(device_); }
    [[nodiscard]] const CommOptions& options() const noexcept { return options_; }

    // Runs body(DeviceThreadComm&) once per rank, rank 0 on the calling thread
    // (whose current device is restored afterwards).
    template <class Body>
        requires std::is_invocable_v<Body&, DeviceThreadComm&>
    void run(Body&& body) const {
        auto fault = std::make_shared<FaultState>(ranks_, options_.timeout);
        auto group = std::make_shared<detail::DeviceGroup>(fault, detail::first_world_ranks(ranks_), device_);
        detail::run_rank_threads(*fault, ranks_, [&](int rank) {
            // Declared outside the try: the failure is recorded before the
            // communicator's destructor waits for its queued async calls,
            // so those fail at once instead of timing out.
            std::optional<loom::detail::CudaDeviceScope> on_device;
            std::optional<DeviceThreadComm> comm;
            try {
                on_device.emplace(device_);
                comm.emplace(DeviceThreadComm(group, rank, std::make_shared<detail::DeviceStream>(device_)));
                body(*comm);
                comm->synchronize();  // the rank's asynchronous device errors are its own failure
            } catch (...) {
                detail::record_rank_failure(*fault, rank);
            }
        });
    }

private:
    int ranks_;
    int device_;
    CommOptions options_;
};

}  // namespace loom::comm
