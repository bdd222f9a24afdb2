// run_process_on (comm/device_processes.hpp): "processes" (rank threads
// standing in for MPI processes) join their devices through the registered
// joiner, here the fenced test device's (tests/support/fenced_comm.hpp), and
// the body's communicator moves device memory; without a joiner, or for the
// host, the call is refused by name. device_of_local_rank, the GPU a
// launcher's local rank takes, is checked here too.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/device_processes.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/device_buffer.hpp"
#include "support/fenced_comm.hpp"
#include "support/fenced_device.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("run_process_on joins the processes' devices and its communicator sums device memory", "[comm][device]") {
    loom_test::FencedDevice device;
    loom_test::FencedProcesses joiner;
    std::vector<std::vector<float>> sums(3);
    loom::comm::ThreadWorld(3).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm host = loom::comm::AnyComm::view(comm);
        loom::comm::run_process_on(loom::cuda_device(0), host, [&](loom::comm::AnyComm& gpus) {
            CHECK(gpus.size() == 3);
            CHECK(gpus.rank() == comm.rank());
            const loom::DeviceBuffer x(loom::DType::f32, loom::Shape{4}, loom::cuda_device(0));
            loom::fill_floats(x.tensor(), static_cast<float>(gpus.rank() + 1));
            gpus.all_reduce(x.tensor(), x.tensor(), loom::comm::ReduceOp::sum);
            sums[static_cast<std::size_t>(comm.rank())] = loom::to_host<float>(x.tensor());
        });
    });
    for (const auto& s : sums) CHECK(s == std::vector<float>(4, 6.0f));
}

TEST_CASE("run_process_on refuses the host and a build without the joiner, by name", "[comm][device]") {
    loom_test::FencedDevice device;  // a usable device, but no joiner registered
    std::vector<std::string> messages(2), host_messages(2);
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm host = loom::comm::AnyComm::view(comm);
        const auto r = static_cast<std::size_t>(comm.rank());
        messages[r] = loom_test::message_of(
            [&] { loom::comm::run_process_on(loom::cuda_device(0), host, [](loom::comm::AnyComm&) {}); });
        host_messages[r] = loom_test::message_of(
            [&] { loom::comm::run_process_on(loom::host_device, host, [](loom::comm::AnyComm&) {}); });
    });
    for (const std::string& m : messages)
        CHECK(m == "processes on cuda:0 need the cuda backend's communicator between processes, which this program was "
                   "built without: compile one .cu file that includes loom/cuda_backend_nccl.cuh and link loom::nccl");
    for (const std::string& m : host_messages)
        CHECK(m == "run_process_on: host is not a device; the processes' host communicator already moves host memory");
}

TEST_CASE("device_of_local_rank gives a node's processes one GPU each, and names a rank left without one",
          "[comm][device]") {
    using loom::comm::device_of_local_rank;
    // Several visible GPUs: local rank r takes GPU r.
    CHECK(device_of_local_rank(0, 4, "OMPI_COMM_WORLD_LOCAL_RANK") == 0);
    CHECK(device_of_local_rank(3, 4, "OMPI_COMM_WORLD_LOCAL_RANK") == 3);
    // One visible GPU is the process's own, whatever its local rank (srun --gpus-per-task=1).
    CHECK(device_of_local_rank(5, 1, "SLURM_LOCALID") == 0);
    // None visible: the rank's own index, for check_device_usable to name the reason.
    CHECK(device_of_local_rank(2, 0, "SLURM_LOCALID") == 2);
    CHECK(loom_test::message_of([] { (void)device_of_local_rank(4, 4, "OMPI_COMM_WORLD_LOCAL_RANK"); }) ==
          "local rank 4 (OMPI_COMM_WORLD_LOCAL_RANK) has no GPU of its own: this process sees 4 GPUs (cuda:0 to "
          "cuda:3); start at most 4 processes per node, or show each process one GPU (CUDA_VISIBLE_DEVICES, srun "
          "--gpus-per-task=1)");
    CHECK(loom_test::message_of([] { (void)device_of_local_rank(-1, 2, "PMI_LOCAL_RANK"); }) ==
          "PMI_LOCAL_RANK = -1 is not a local rank; a launcher numbers a node's processes from 0");
}

}  // namespace LOOM_TEST_FILE
