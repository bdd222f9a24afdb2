// Tensor-core operations for the warp simulator (warp_simulator.hpp):
// ldmatrix and mma.m16n8k16 as the PTX ISA documents their fragment layouts
// (lane l = 4g + t):
//   ldmatrix .x4: lanes 8i..8i+7 give the rows of matrix i; lane l receives
//     row g, elements 2t and 2t+1 of each (with .trans: rows 2t and 2t+1 of
//     column g);
//   mma A: rows g, g+8, columns 2t.. and 2t+8..; B: rows 2t.., 2t+8.. of
//     column g; C: row g columns 2t, 2t+1, then row g+8;
// the wrappers of kernels/cuda/mma_fragments.cuh on them; and nvcuda::wmma.
// Each exchanges values between a warp's lanes through the block's slots,
// between two per-warp barriers, and counts what the hardware would refuse.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "simulated/warp_simulator.hpp"

namespace loom_sim {

// ldmatrix rows that were not 16-byte aligned 16-byte pieces of the block's
// shared memory (the hardware's requirement), over every launch so far.
inline long bad_ldmatrix_rows = 0;
// wmma loads and stores whose pointer was not 32-byte aligned or whose
// stride was not a multiple of 16 bytes (the CUDA Programming Guide's
// requirements), over every launch so far.
inline long bad_wmma_accesses = 0;

inline float bf16_value(std::uint16_t bits) { return loom::detail::bf16_bits_to_float(bits); }
inline float low_half(unsigned word) { return bf16_value(static_cast<std::uint16_t>(word & 0xffffu)); }
inline float high_half(unsigned word) { return bf16_value(static_cast<std::uint16_t>(word >> 16)); }
inline unsigned pack(std::uint16_t low, std::uint16_t high) { return low | (static_cast<unsigned>(high) << 16); }

template <bool Transposed>
void ldmatrix_x4(unsigned (&r)[4], const __nv_bfloat16* row) {
    const int me = static_cast<int>(threadIdx.x), base = me / 32 * 32, lane = me % 32, g = lane / 4, t = lane % 4;
    const auto* byte = reinterpret_cast<const unsigned char*>(row);
    Block& b = block();
    if (byte < b.shared || byte + 16 > b.shared + b.shared_bytes || (byte - b.shared) % 16 != 0) {
        ++bad_ldmatrix_rows;
        row = reinterpret_cast<const __nv_bfloat16*>(b.shared);  // read something harmless instead
    }
    b.rows[me] = row;
    warp_barrier({"ldmatrix"});
    check_warp_load("ldmatrix", row, 16);  // the row goes to other lanes
    for (int i = 0; i < 4; ++i) {
        const __nv_bfloat16* const* matrix = b.rows.data() + base + 8 * i;
        r[i] = Transposed ? pack(matrix[2 * t][g].bits, matrix[2 * t + 1][g].bits)
                          : pack(matrix[g][2 * t].bits, matrix[g][2 * t + 1].bits);
    }
    warp_barrier({"ldmatrix"});
}

// c += a b for the warp: every lane's fragments gathered into A (16 x 16)
// and B (16 x 8), each lane's four results summed over k in order.
inline void mma_m16n8k16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int me = static_cast<int>(threadIdx.x), base = me / 32 * 32, lane = me % 32;
    Block& b = block();
    for (int i = 0; i < 4; ++i) b.words[me][i] = a[i];
    b.words[me][4] = b0;
    b.words[me][5] = b1;
    warp_barrier({"mma.m16n8k16"});
    float A[16][16], B[16][8];
    for (int x = 0; x < 32; ++x) {
        const int g = x / 4, t = x % 4;
        const unsigned* w = b.words[base + x].data();
        for (int half = 0; half < 2; ++half) {
            A[g + 8 * half][2 * t] = low_half(w[half]);
            A[g + 8 * half][2 * t + 1] = high_half(w[half]);
            A[g + 8 * half][2 * t + 8] = low_half(w[2 + half]);
            A[g + 8 * half][2 * t + 9] = high_half(w[2 + half]);
            B[2 * t + 8 * half][g] = low_half(w[4 + half]);
            B[2 * t + 8 * half + 1][g] = high_half(w[4 + half]);
        }
    }
    warp_barrier({"mma.m16n8k16"});  // every lane has read the slots before any writes them again
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), column = 2 * t + e % 2;
        float sum = c[e];
        for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][column];
        c[e] = sum;
    }
}

}  // namespace loom_sim

// nvcuda::wmma for 16 x 16 x 16 bf16 products with f32 accumulators. The
// hardware spreads a fragment over the warp in an unspecified layout, so
// kernels only load, multiply, store and fill whole fragments; here every
// lane holds the whole 16 x 16 fragment. A load is each lane's own (the
// same values), a store writes the lane's share of the matrix; mma_sync is computed once per warp, by lane 0,
// sums over k in order from the accumulator, and handed to every lane,
// after every lane's operands are checked to be lane 0's (a warp whose
// lanes loaded different fragments is a bug a per-lane copy would hide).
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the simulator has 16 x 16 x 16 fragments only");
    static constexpr int num_elements = 256;
    T x[256];
};

namespace detail {
inline void check_access(const void* pointer, unsigned ldm, std::size_t element_bytes) {
    if (reinterpret_cast<std::uintptr_t>(pointer) % 32 != 0 || ldm * element_bytes % 16 != 0)
        ++loom_sim::bad_wmma_accesses;
}
// A wmma load reads 16 lines (rows, or columns when col-major) of 16
// elements; which lane gets which element is unspecified, so every line
// must be ordered before the load for the whole warp.
inline void check_ordered(const void* pointer, unsigned ldm, std::size_t element_bytes) {
    const auto* line = static_cast<const unsigned char*>(pointer);
    for (int i = 0; i < 16; ++i) loom_sim::check_warp_load("wmma::load_matrix_sync", line + i * ldm * element_bytes, 16 * element_bytes);
}
inline float value_of(float v) { return v; }
inline float value_of(__nv_bfloat16 v) { return loom::detail::bf16_bits_to_float(v.bits); }
}  // namespace detail

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T value) {
    for (T& e : f.x) e = value;
}

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>);
    detail::check_access(p, ldm, sizeof(T));
    detail::check_ordered(p, ldm, sizeof(T));
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c)
            f.x[r * 16 + c] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
    detail::check_access(p, ldm, sizeof(float));
    detail::check_ordered(p, ldm, sizeof(float));
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

// Each lane stores only its share of the fragment, as on the hardware: the
// eight elements an sm_80 accumulator gives lane 4g + t (rows g and g + 8,
// columns 2t, 2t + 1, 2t + 8, 2t + 9, as mma's C). So until every lane has
// stored (a __syncwarp), a lane reading the stored matrix finds what was
// there before in the other lanes' elements, as it may on a GPU.
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
    detail::check_access(p, ldm, sizeof(float));
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int r = lane / 4; r < 16; r += 8)
        for (const int c : {2 * (lane % 4), 2 * (lane % 4) + 1, 2 * (lane % 4) + 8, 2 * (lane % 4) + 9})
            (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

template <class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
    loom_sim::Block& block = loom_sim::block();
    loom_sim::WmmaSlot& slot = block.wmma[threadIdx.x / 32];
    static_assert(sizeof a + sizeof b + sizeof c <= sizeof slot.operands);
    if (threadIdx.x % 32 == 0) {
        for (int r = 0; r < 16; ++r)
            for (int n = 0; n < 16; ++n) {
                float sum = c.x[r * 16 + n];
                for (int k = 0; k < 16; ++k)
                    sum += detail::value_of(a.x[r * 16 + k]) * detail::value_of(b.x[k * 16 + n]);
                slot.product[static_cast<std::size_t>(r * 16 + n)] = sum;
            }
        std::memcpy(slot.operands.data(), &a, sizeof a);
        std::memcpy(slot.operands.data() + sizeof a, &b, sizeof b);
        std::memcpy(slot.operands.data() + sizeof a + sizeof b, &c, sizeof c);
    }
    loom_sim::warp_barrier({"wmma::mma_sync"});
    if (std::memcmp(slot.operands.data(), &a, sizeof a) != 0 ||
        std::memcmp(slot.operands.data() + sizeof a, &b, sizeof b) != 0 ||
        std::memcmp(slot.operands.data() + sizeof a + sizeof b, &c, sizeof c) != 0)
        loom_sim::fail("the lanes of a warp passed wmma::mma_sync different fragments");
    std::copy(slot.product.begin(), slot.product.end(), d.x);
    loom_sim::warp_barrier({"wmma::mma_sync"});  // every lane has its copy before lane 0 computes the next
}
}  // namespace nvcuda::wmma

namespace loom::kernels::cuda::mma_fragments {
using bf16_t = __nv_bfloat16;
inline void ldmatrix_x4(unsigned (&r)[4], const bf16_t* row) { loom_sim::ldmatrix_x4<false>(r, row); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], const bf16_t* row) { loom_sim::ldmatrix_x4<true>(r, row); }
inline void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    loom_sim::mma_m16n8k16(c, a, b0, b1);
}
}  // namespace loom::kernels::cuda::mma_fragments
