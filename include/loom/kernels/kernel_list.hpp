// Every kernel a device backend provides, one line each: its name and its
// host function. The list declares each kernel's tag (kernels::kernel::X:
// its name, host function and device entry type, kernels/kernel_table.hpp)
// and the table a backend fills (BackendKernels). cuda_backend.cuh fills
// every entry from its launchers, the tests' FencedDevice from the host
// functions; installing a table with an empty entry is refused, naming the
// kernel, so a kernel added here and not to a backend fails when the
// program starts, not mid-training.
//
// Adding a kernel: its host function (kernels/host/), its CUDA function
// (kernels/cuda/: the host function's arguments, then the stream), and its
// line here. The operations that run kernels on Tensors (kernels/ops.hpp
// and its siblings) call kernels::run<kernel::X>.
#pragma once

#include <string>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/chunk_encoding.hpp"
#include "loom/kernels/host/adamw.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_bf16.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/attention_blocks_bf16.hpp"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/embedding.hpp"
#include "loom/kernels/host/gelu.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/kernels/host/layernorm.hpp"
#include "loom/kernels/host/layernorm_grid.hpp"
#include "loom/kernels/host/low_rank.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/kernels/kernel_table.hpp"

// X(name, host function) for every kernel a device backend provides.
#define LOOM_BACKEND_KERNELS(X)                                                          \
    X(gemm, host::gemm)                                                                  \
    X(gemm_bf16_inputs, host::gemm_bf16_inputs)                                          \
    X(repeat_rows, host::repeat_rows)                                                    \
    X(gemm_bias, host::gemm_bias)                                                        \
    X(add, host::add)                                                                    \
    X(accumulate, host::accumulate)                                                      \
    X(add_bias, host::add_bias)                                                          \
    X(bias_grad, host::bias_grad)                                                        \
    X(subtract, host::subtract)                                                          \
    X(gelu_forward, host::gelu_forward)                                                  \
    X(gelu_backward, host::gelu_backward)                                                \
    X(layernorm_forward, host::layernorm_forward)                                        \
    X(layernorm_backward_input, host::layernorm_backward_input)                          \
    X(layernorm_backward_weight, host::layernorm_backward_weight)                        \
    X(layernorm_grid_row_sums, host::layernorm_grid_row_sums)                            \
    X(layernorm_grid_centered_squares, host::layernorm_grid_centered_squares)            \
    X(layernorm_grid_normalize, host::layernorm_grid_normalize)                          \
    X(layernorm_grid_backward_sums, host::layernorm_grid_backward_sums)                  \
    X(layernorm_grid_backward_apply, host::layernorm_grid_backward_apply)                \
    X(embedding_forward, host::embedding_forward)                                        \
    X(embedding_backward, host::embedding_backward)                                      \
    X(embedding_slice_lookup, host::embedding_slice_lookup)                              \
    X(embedding_slice_backward, host::embedding_slice_backward)                          \
    X(attention_forward, host::attention_forward)                                        \
    X(attention_backward, host::attention_backward)                                      \
    X(attention_forward_bf16_inputs, host::attention_forward_bf16_inputs)                \
    X(attention_backward_bf16_inputs, host::attention_backward_bf16_inputs)              \
    X(attention_block_forward, host::attention_block_forward)                            \
    X(attention_merge, host::attention_merge)                                            \
    X(attention_block_backward, host::attention_block_backward)                          \
    X(attention_block_forward_bf16_inputs, host::attention_block_forward_bf16_inputs)    \
    X(attention_block_backward_bf16_inputs, host::attention_block_backward_bf16_inputs)  \
    X(cross_entropy_forward, host::cross_entropy_forward)                                \
    X(cross_entropy_backward, host::cross_entropy_backward)                              \
    X(cross_entropy_slice_max, host::cross_entropy_slice_max)                            \
    X(cross_entropy_slice_sums, host::cross_entropy_slice_sums)                          \
    X(cross_entropy_slice_backward, host::cross_entropy_slice_backward)                  \
    X(pack_cast, host::pack_cast)                                                        \
    X(unpack_cast, host::unpack_cast)                                                    \
    X(pack_chunk, host::pack_chunk_own_scratch)                                          \
    X(unpack_chunk, host::unpack_chunk)                                                  \
    X(orthonormalize_columns, host::orthonormalize_columns)                              \
    X(mix_momentum, host::mix_momentum)                                                  \
    X(unmix_momentum, host::unmix_momentum)                                              \
    X(adamw_update, host::adamw_update)

namespace loom::kernels {

// The kernels' tags.
namespace kernel {
#define LOOM_KERNEL_TAG(k, host_function) LOOM_DEVICE_KERNEL(k, host_function);
LOOM_BACKEND_KERNELS(LOOM_KERNEL_TAG)
#undef LOOM_KERNEL_TAG
}  // namespace kernel

// One device kind's entries, a field per kernel of the list.
struct BackendKernels {
#define LOOM_BACKEND_ENTRY(k, host_function) DeviceEntry<kernel::k> k = nullptr;
    LOOM_BACKEND_KERNELS(LOOM_BACKEND_ENTRY)
#undef LOOM_BACKEND_ENTRY

    // The kernels left empty, in the list's order.
    [[nodiscard]] std::vector<std::string> missing() const {
        std::vector<std::string> empty;
#define LOOM_BACKEND_MISSING(k, host_function) \
    if (k == nullptr) empty.emplace_back(kernel::k::name);
        LOOM_BACKEND_KERNELS(LOOM_BACKEND_MISSING)
#undef LOOM_BACKEND_MISSING
        return empty;
    }

    // The entries installed for `kind` now.
    [[nodiscard]] static BackendKernels installed(DeviceKind kind) {
        BackendKernels table;
#define LOOM_BACKEND_READ(k, host_function) table.k = device_entry<kernel::k>(kind);
        LOOM_BACKEND_KERNELS(LOOM_BACKEND_READ)
#undef LOOM_BACKEND_READ
        return table;
    }
};

namespace detail {

inline void write_entries(DeviceKind kind, const BackendKernels& table) {
#define LOOM_BACKEND_WRITE(k, host_function) device_entry<kernel::k>(kind) = table.k;
    LOOM_BACKEND_KERNELS(LOOM_BACKEND_WRITE)
#undef LOOM_BACKEND_WRITE
}

}  // namespace detail

// Makes `table` the kernels of `kind`; refuses a table with an empty entry,
// naming the first (a backend that misses a kernel fails at start-up).
// Returns the entries it replaced, so a scope can put them back.
inline BackendKernels install_kernels(DeviceKind kind, const BackendKernels& table) {
    const std::vector<std::string> empty = table.missing();
    LOOM_CHECK(empty.empty(), "install_kernels: the ", kind, " backend leaves ", empty.size(), " kernel",
               empty.size() == 1 ? "" : "s", " empty, the first ", empty.empty() ? std::string{} : empty.front(),
               "; a backend fills every kernel of loom/kernels/kernel_list.hpp");
    BackendKernels previous = BackendKernels::installed(kind);
    detail::write_entries(kind, table);
    return previous;
}

// Installs a table for a scope and restores the previous entries (tests, and
// programs that bring a backend of their own).
class KernelsScope {
public:
    KernelsScope(DeviceKind kind, const BackendKernels& table) : kind_(kind), previous_(install_kernels(kind, table)) {}
    KernelsScope(const KernelsScope&) = delete;
    KernelsScope& operator=(const KernelsScope&) = delete;
    ~KernelsScope() { detail::write_entries(kind_, previous_); }

private:
    DeviceKind kind_;
    BackendKernels previous_;
};

}  // namespace loom::kernels
