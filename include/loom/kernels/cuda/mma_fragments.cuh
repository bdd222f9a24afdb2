// Warp-level bf16 tensor-core fragments: mma.sync.m16n8k16 (bf16 x bf16 ->
// f32) and the ldmatrix loads that feed it, as inline PTX, with the layout
// bookkeeping every kernel on them needs. The attention kernels of
// attention_mma.cuh are built on these; so can any kernel whose products'
// results must stay in registers (which wmma, its layout unspecified, cannot
// promise).
//
// The layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane l = 4g + t
// of a warp:
//   A (16 x 16, row-major), 4 registers of two bf16 each: rows g and g + 8,
//     columns 2t, 2t + 1 (registers 0, 1) and 2t + 8, 2t + 9 (2, 3);
//   B (16 x 8), 2 registers: rows 2t, 2t + 1 (register 0) and 2t + 8, 2t + 9
//     (register 1), column g;
//   C (16 x 8, f32), 4 floats: row g columns 2t, 2t + 1, then row g + 8.
// So two adjacent C blocks of a row band, rounded in pairs, are the A operand
// of a product over those 16 columns (as_operand): a result feeds the next
// product without leaving registers. ldmatrix.x4 loads A, or two B blocks,
// from rows of shared memory (16-byte aligned, 16 bytes each); with .trans
// it loads B from a matrix stored with k as its rows.
//
// Needs compute capability 8.0. tests/simulated/warp_simulator.hpp runs this
// code on the CPU with the four PTX wrappers below restated from the same
// layouts (tests/simulated/extract_device_code.py drops them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>

namespace loom::kernels::cuda::mma_fragments {

using bf16_t = __nv_bfloat16;

inline constexpr unsigned full_mask = 0xffff'ffffu;

__device__ inline unsigned shared_address(const void* pointer) {
    return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// Four 8 x 8 bf16 matrices; lanes 8i..8i+7 give the rows of matrix i.
__device__ inline void ldmatrix_x4(unsigned (&r)[4], const bf16_t* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
}
__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const bf16_t* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
}

// c += a b: a 16 x 16, b 16 x 8 (b0, b1), c 16 x 8 in f32.
__device__ inline void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (nearest, ties to even), `low` in the low half:
// the lower column of an operand register.
__device__ inline unsigned packed(float low, float high) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const unsigned*>(&pair);
}

__device__ inline int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// A: rows [row0, row0 + 16) x columns [col0, col0 + 16) of a row-major
// matrix whose rows are `ld` elements apart.
__device__ inline void load_a(unsigned (&a)[4], const bf16_t* matrix, int ld, int row0, int col0) {
    const int lane = lane_id();
    ldmatrix_x4(a, matrix + (row0 + lane % 8 + (lane / 8) % 2 * 8) * ld + col0 + lane / 16 * 8);
}

// B of two adjacent 8-column blocks, B[k][n] = matrix[n][k] (the matrix's
// rows are the product's columns: k in S = q k^T), n in [n0, n0 + 16) and k
// in [k0, k0 + 16): b[0], b[1] for columns n0.., b[2], b[3] for n0 + 8...
__device__ inline void load_b_rows(unsigned (&b)[4], const bf16_t* matrix, int ld, int n0, int k0) {
    const int lane = lane_id();
    ldmatrix_x4(b, matrix + (n0 + lane % 8 + lane / 16 * 8) * ld + k0 + (lane / 8) % 2 * 8);
}

// The same pair of B blocks with B[k][n] = matrix[k][n] (the matrix's rows
// are the sum's index: v in P v).
__device__ inline void load_b_columns(unsigned (&b)[4], const bf16_t* matrix, int ld, int k0, int n0) {
    const int lane = lane_id();
    ldmatrix_x4_trans(b, matrix + (k0 + lane % 8 + (lane / 8) % 2 * 8) * ld + n0 + lane / 16 * 8);
}

// The A operand over columns [16 kk, 16 kk + 16) of a warp's 16 x 8 Blocks
// f32 results, rounded to bf16: C blocks 2 kk and 2 kk + 1.
template <int Blocks>
__device__ inline void as_operand(unsigned (&a)[4], const float (&c)[Blocks][4], int kk) {
    a[0] = packed(c[2 * kk][0], c[2 * kk][1]);
    a[1] = packed(c[2 * kk][2], c[2 * kk][3]);
    a[2] = packed(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = packed(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

template <int Blocks>
__device__ inline void zero(float (&c)[Blocks][4]) {
#pragma unroll
    for (int n = 0; n < Blocks; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
}

// Where a lane's results sit in its warp's 16 x 8n block: rows g and g + 8
// (half 0 and 1), columns 8 n + 2 t and 8 n + 2 t + 1 (pair 0 and 1).
struct Lane {
    int g, t;
    __device__ Lane() : g(lane_id() / 4), t(lane_id() % 4) {}
    [[nodiscard]] __device__ int row(int half) const { return g + 8 * half; }
    [[nodiscard]] __device__ int column(int block, int pair) const { return 8 * block + 2 * t + pair; }
};

// Over the four lanes of a row of results, each holding a quarter of its
// columns: every lane gets the same value.
__device__ inline float row_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(full_mask, v, 1));
    return fmaxf(v, __shfl_xor_sync(full_mask, v, 2));
}
__device__ inline float row_sum(float v) {
    v += __shfl_xor_sync(full_mask, v, 1);
    return v + __shfl_xor_sync(full_mask, v, 2);
}

}  // namespace loom::kernels::cuda::mma_fragments
