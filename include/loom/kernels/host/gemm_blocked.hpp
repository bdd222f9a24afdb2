// The host GEMM's blocked loops around a micro-kernel (kernels/host/
// gemm_kernel_*.hpp), Goto / BLIS style: C is walked in nc-column blocks,
// K in kc-deep blocks (op(B)'s kc x nc block packed into NR-wide panels,
// kernels/host/gemm_packing.hpp), M in mc-row blocks, then NR x MR tiles.
//
// B is packed unless it is plain (rows contiguous along N), its panels are
// whole and few row tiles read each one: then the kernel reads it in place
// through its row stride, as attention's P V products read V.
//
// A is packed (MR-row panels) only when transposed and reused across enough
// column panels to repay the copy; otherwise the kernel reads op(A) where it
// lies, through a row and a k stride (a transposed A is then already k-major,
// a plain one is read row by row).
//
// Determinism: the k blocks are the same kc-deep slices of K whatever the
// sizes of M and N, and each tile's arithmetic is fixed by its kernel, so
// C[i][j] = the kernel's sum over K's blocks in order, independent of how M
// or N are cut into blocks, tiles or threads. K is never split between
// threads (kernels/host/gemm_threads.hpp splits M or N only).
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/gemm_packing.hpp"
#include "loom/kernels/trans.hpp"

namespace loom::kernels::host::gemm_detail {

// Pack a transposed A when a block of it is read by more column panels than
// this: below, the kernel's strided reads cost less than the copy. A plain A
// (rows contiguous along k) is never packed: its packing is a transposing
// gather, and measured on the Xeon of docs/performance.md reading it in place
// was 5-20% faster at config A's and B's shapes and at 1024^3 (perf showed
// packing at a fifth of a training step's time when A was packed).
inline constexpr std::int64_t pack_a_min_panels = 4;

// Except when a plain A's rows alias: a row stride that is a multiple of the
// L1's way size (1024 floats on a 32 KiB 8-way L1) puts a tile's rows in one
// set, and with fewer ways than this they evict each other at every k step.
// Measured on an AMD EPYC (Zen 4, 8 ways) at 1024^3: 77 GFLOP/s in place, 91
// packed, 99 in place with a padded stride; the Xeon of docs/performance.md
// (12 ways) read in place faster even there. Packing changes no arithmetic.
inline constexpr int aliasing_rows_need_ways = 12;

// Whether a row stride of `ld` floats puts consecutive rows in one L1 set on
// a CPU with fewer ways than that: a plain A is then packed anyway, and a
// plain B is never read in place.
[[nodiscard]] inline bool rows_alias_in_l1(std::int64_t ld) noexcept {
    const CpuFeatures& cpu = cpu_features();
    return cpu.l1d_ways < aliasing_rows_need_ways && cpu.l1d_way_bytes > 0 &&
           (ld * static_cast<std::int64_t>(sizeof(float))) % cpu.l1d_way_bytes == 0;
}

// A plain B is read in place, not packed, when each of its panels is read by
// at most this many row tiles (MR rows each): below, the copy costs more than
// the kernel's reads of the unpacked rows, which stay in L1/L2. Measured on the
// AMD EPYC of docs/performance.md: a 1,024-token prefill's attention, whose
// P V products have 32 rows (3 row tiles) and 128 x 64 blocks of V at a row
// stride of 3C, spent 15% of the prefill packing B.
inline constexpr std::int64_t b_in_place_max_row_tiles = 4;

// Whether the kernel reads a plain B where it lies: its panels are whole
// (N a multiple of NR, and so is every nc block) and few row tiles read them,
// or B is one panel already laid out as packing would lay it (N = ldb = NR:
// attention's Q^T blocks, kernels/host/attention.hpp).
template <int MR, int NR>
[[nodiscard]] inline bool reads_b_in_place(Trans tb, std::int64_t M, std::int64_t N, std::int64_t ldb) noexcept {
    if (tb != Trans::no || N % NR != 0) return false;
    return (N == NR && ldb == NR) || ((M + MR - 1) / MR <= b_in_place_max_row_tiles && !rows_alias_in_l1(ldb));
}

// C = alpha op(A) op(B) + beta C for M, N, K >= 1, on one thread; with
// RoundBf16, of op(A) and op(B) rounded to bf16 as they are packed (A then
// always packed): MatmulPrecision::bf16 at the f32 kernels' rate. With a
// `bias` (N floats), C = alpha op(A) op(B) + bias on every row and beta is
// not read: the first k block's tiles add the bias row where they would add
// C, the same fma as a product onto rows that hold the bias (beta = 1), with
// no pass that writes those rows first.
template <class Kernel, bool RoundBf16 = false>
inline void blocked_gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                         const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                         std::int64_t ldc, const float* bias = nullptr) {
    constexpr int MR = Kernel::mr, NR = Kernel::nr;
    thread_local PackBuffer b_buffer, a_buffer;
    const std::int64_t kc_max = std::min<std::int64_t>(Kernel::kc, K);
    const std::int64_t nc_max = std::min<std::int64_t>(Kernel::nc, N);
    static_assert(Kernel::nc % NR == 0, "an nc block is whole panels");
    const bool b_in_place = !RoundBf16 && reads_b_in_place<MR, NR>(tb, M, N, ldb);
    float* bp = b_in_place ? nullptr : b_buffer.reserve(kc_max * ((nc_max + NR - 1) / NR) * NR);
    for (std::int64_t jc = 0; jc < N; jc += Kernel::nc) {
        const std::int64_t nc = std::min<std::int64_t>(Kernel::nc, N - jc);
        const bool packs_a = (ta == Trans::yes || rows_alias_in_l1(lda)) && (nc + NR - 1) / NR > pack_a_min_panels;
        for (std::int64_t pc = 0; pc < K; pc += Kernel::kc) {
            const std::int64_t kc = std::min<std::int64_t>(Kernel::kc, K - pc);
            const bool onto_bias = pc == 0 && bias != nullptr;
            const float beta_block = pc == 0 && bias == nullptr ? beta : 1.0f;
            if (!b_in_place) Kernel::template pack_b_panels<RoundBf16>(tb, B, ldb, pc, kc, jc, nc, bp);
            const float* b_block = b_in_place ? B + pc * ldb + jc : bp;
            const std::int64_t b_ks = b_in_place ? ldb : NR, b_panel_step = b_in_place ? NR : kc * NR;
            for (std::int64_t ic = 0; ic < M; ic += Kernel::mc) {
                const std::int64_t mc = std::min<std::int64_t>(Kernel::mc, M - ic);
                const float* a_block;
                std::int64_t a_rs, a_ks, a_panel_step;
                if (packs_a) {
                    float* ap = a_buffer.reserve(kc * ((Kernel::mc + MR - 1) / MR) * MR);
                    Kernel::template pack_a_panels<RoundBf16>(ta, A, lda, ic, mc, pc, kc, ap);
                    a_block = ap;
                    a_rs = 1;
                    a_ks = MR;
                    a_panel_step = kc * MR;
                } else if (RoundBf16) {
                    // The block rounded in its stored layout (rows contiguous
                    // along k, or along M when transposed): a vectorised copy.
                    float* ap = a_buffer.reserve(kc * mc);
                    Kernel::round_block(ta, A, lda, ic, mc, pc, kc, ap);
                    a_block = ap;
                    a_rs = ta == Trans::no ? kc : 1;
                    a_ks = ta == Trans::no ? 1 : mc;
                    a_panel_step = MR * a_rs;
                } else {
                    a_block = op_at(A, lda, ta, ic, pc);
                    a_rs = ta == Trans::no ? lda : 1;
                    a_ks = ta == Trans::no ? 1 : lda;
                    a_panel_step = MR * a_rs;
                }
                for (std::int64_t jr = 0; jr < nc; jr += NR) {
                    const int cols = static_cast<int>(std::min<std::int64_t>(NR, nc - jr));
                    const float* b_panel = b_block + (jr / NR) * b_panel_step;
                    for (std::int64_t ir = 0; ir < mc; ir += MR) {
                        const int rows = static_cast<int>(std::min<std::int64_t>(MR, mc - ir));
                        float* c_tile = C + (ic + ir) * ldc + jc + jr;
                        Kernel::tile(rows, cols, kc, a_block + (ir / MR) * a_panel_step, a_rs, a_ks, b_panel, b_ks,
                                     c_tile, ldc, alpha, beta_block, onto_bias ? bias + jc + jr : c_tile,
                                     onto_bias ? 0 : ldc);
                    }
                }
            }
        }
    }
}

}  // namespace loom::kernels::host::gemm_detail
