// train_gpt --device cuda[:N]: the same training loop, executor and
// checkpoints as on the host, with the executor's buffers and the layers'
// activations on that GPU and --dp rank threads sharing it (the backend's
// world of rank threads, each on its own stream; train_gpt_cuda.cu builds the
// backend in). Under mpirun, each process trains on its own GPU instead, the
// processes joined by NCCL (loom/cuda_backend_nccl.cuh, when the build has NCCL). Every strategy of the executor runs there: data parallelism
// at every ZeRO stage, pipelines of every schedule, Megatron (1D) and Optimus
// (2D) tensor parallelism, sequence parallelism, with any micro-batches and
// every compressor. OptEx runs its own loop (train_gpt_optex.hpp): host rank
// threads or MPI processes keep its state, each computing gradients on the
// GPU. --cluster (links shaped between host threads) and heads wider than
// the CUDA attention kernels take are refused here, before anything runs.
// Included by train_gpt.cpp inside its anonymous namespace, after its Flags;
// train_gpt.cpp includes the loom headers this uses at its top.
#pragma once

inline void check_device_flags(const Flags& flags) {
    if (flags.device.kind == loom::DeviceKind::host) return;
    std::ostringstream where;
    where << flags.device;
    // Shaped links delay host threads by host clocks, while a GPU's work runs
    // asynchronously to them: the modelled times would not be the run's.
    if (!flags.cluster.empty())
        usage_error("--device " + where.str() + " runs every flag but --cluster, whose links delay rank threads by "
                    "host clocks while the GPU's work runs asynchronously to them; drop --cluster or use "
                    "--device host");
    // The CUDA attention kernels' limit, checked before anything is built.
    const std::int64_t width = flags.model.width, limit = loom::kernels::cuda_attention_max_head_size;
    const std::int64_t head_size = width / flags.model.heads;
    if (flags.device.kind == loom::DeviceKind::cuda && head_size > limit) {
        // The fewest heads that divide the width into heads of at most `limit`
        // (width itself always does: heads of one feature).
        std::int64_t fits = (width + limit - 1) / limit;
        while (width % fits != 0) ++fits;
        usage_error("--device " + where.str() + ": --width " + std::to_string(width) + " over --heads " +
                    std::to_string(flags.model.heads) + " gives heads of " + std::to_string(head_size) +
                    " features; the CUDA attention kernels take at most " + std::to_string(limit) + ": use --heads " +
                    std::to_string(fits) + " (or another divisor of --width giving heads of at most " +
                    std::to_string(limit) + "), or --device host");
    }
}

// The ranks the degrees name, --dp x --pp x --tp x --sp (the rank threads a --device run starts).
inline int device_ranks(const Flags& flags) {
    return (flags.dp > 0 ? flags.dp : 1) * flags.pp * flags.tp * flags.sp;
}

// "`what` on cuda:0 (NVIDIA H200 (sm_90, 139 GiB))", after checking that
// `device` is there: the one-line reason otherwise.
inline std::string device_transport(loom::Device device, const std::string& what) {
    std::ostringstream where;
    where << device;
    try {
        loom::check_device_usable(device);
    } catch (const loom::Error& e) {
        usage_error("--device " + where.str() + ": " + e.message());
    }
    return what + " on " + where.str() + " (" + loom::device_runtime(device).describe(device.index) + ")";
}

// This process's GPU under an MPI launcher: --device cuda:N names it for
// every process (one process per node); --device cuda takes the process's
// rank on its node, one GPU per process (comm::device_of_local_rank: a
// process that sees one GPU takes it; a local rank past the visible GPUs is
// refused by name).
inline loom::Device process_device(const Flags& flags) {
    if (!flags.device_per_process) return flags.device;
    try {
        const loom::train::LocalRank local = loom::train::launcher_local_rank();
        if (local.rank < 0) return flags.device;
        const int visible = loom::device_runtime(flags.device).device_count();
        return loom::cuda_device(loom::comm::device_of_local_rank(local.rank, visible, local.variable));
    } catch (const loom::Error& e) {
        usage_error("--device cuda under mpirun: " + e.message());
    }
}
