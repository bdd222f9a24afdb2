// Packing for the host GEMM's blocked loops (kernels/host/gemm_blocked.hpp):
// copying a block of op(B) into panels of NR columns, k-major, so that a
// micro-kernel reads one aligned NR-wide row of B per k step from contiguous
// memory whatever B's transpose and row stride; and, for larger products, a
// block of op(A) into panels of MR rows, k-major, so that the MR values one
// k step broadcasts are adjacent. Panels are padded with zeros to a full NR
// (the kernels' loads never mask) or MR. Only the layout changes: the values
// are copied exactly, so packing never changes a result; or, for
// MatmulPrecision::bf16 (RoundBf16), rounded to bf16 on the way (to nearest,
// ties to even, loom::to_bf16), which is then the only rounding of the
// operands the f32 kernels see.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "loom/core/dtype.hpp"
#include "loom/kernels/trans.hpp"

namespace loom::kernels::host::gemm_detail {

// op(X)(row, col) of a row-major X with row stride ld.
[[nodiscard]] inline const float* op_at(const float* x, std::int64_t ld, Trans t, std::int64_t row,
                                        std::int64_t col) noexcept {
    return t == Trans::no ? x + row * ld + col : x + col * ld + row;
}

// x rounded to bf16 and widened back: loom::to_bf16's bits (nearest even, a
// NaN kept quiet with its sign), written without a branch so that the
// packing loops vectorise (a branch per element made packing cost more than
// a config-B product itself).
[[nodiscard]] inline float round_to_bf16_value(float x) noexcept {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const std::uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
    return std::bit_cast<float>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// x, or x rounded to bf16 and widened back.
template <bool RoundBf16>
[[nodiscard]] inline float packed_value(float x) noexcept {
    if constexpr (RoundBf16)
        return round_to_bf16_value(x);
    else
        return x;
}

// op(B)[k0 .. k0 + kc) x [j0 .. j0 + nc) into ceil(nc / NR) panels of kc x NR
// floats each, panel after panel; columns past nc are zero.
template <int NR, bool RoundBf16 = false>
inline void pack_b(Trans tb, const float* B, std::int64_t ldb, std::int64_t k0, std::int64_t kc, std::int64_t j0,
                   std::int64_t nc, float* out) noexcept {
    for (std::int64_t jp = 0; jp < nc; jp += NR) {
        const std::int64_t cols = nc - jp < NR ? nc - jp : NR;
        float* panel = out + (jp / NR) * kc * NR;
        if (tb == Trans::no) {
            // Rows of B are contiguous: one copy of `cols` floats per k.
            for (std::int64_t p = 0; p < kc; ++p) {
                const float* src = B + (k0 + p) * ldb + j0 + jp;
                if constexpr (RoundBf16)
                    for (std::int64_t c = 0; c < cols; ++c) panel[p * NR + c] = packed_value<true>(src[c]);
                else
                    std::memcpy(panel + p * NR, src, static_cast<std::size_t>(cols) * 4);
                for (std::int64_t c = cols; c < NR; ++c) panel[p * NR + c] = 0.0f;
            }
        } else {
            // B stored [N, K]: column c of the panel is a contiguous row of B.
            for (std::int64_t c = 0; c < cols; ++c) {
                const float* src = B + (j0 + jp + c) * ldb + k0;
                for (std::int64_t p = 0; p < kc; ++p) panel[p * NR + c] = packed_value<RoundBf16>(src[p]);
            }
            for (std::int64_t c = cols; c < NR; ++c)
                for (std::int64_t p = 0; p < kc; ++p) panel[p * NR + c] = 0.0f;
        }
    }
}

// op(A)[i0 .. i0 + mc) x [k0 .. k0 + kc) into ceil(mc / MR) panels of kc x MR
// floats each; rows past mc are zero.
template <int MR, bool RoundBf16 = false>
inline void pack_a(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc, std::int64_t k0,
                   std::int64_t kc, float* out) noexcept {
    for (std::int64_t ip = 0; ip < mc; ip += MR) {
        const std::int64_t rows = mc - ip < MR ? mc - ip : MR;
        float* panel = out + (ip / MR) * kc * MR;
        if (ta == Trans::yes) {
            // A stored [K, M]: the MR values of one k are contiguous.
            for (std::int64_t p = 0; p < kc; ++p) {
                const float* src = A + (k0 + p) * lda + i0 + ip;
                if constexpr (RoundBf16)
                    for (std::int64_t r = 0; r < rows; ++r) panel[p * MR + r] = packed_value<true>(src[r]);
                else
                    std::memcpy(panel + p * MR, src, static_cast<std::size_t>(rows) * 4);
                for (std::int64_t r = rows; r < MR; ++r) panel[p * MR + r] = 0.0f;
            }
        } else {
            for (std::int64_t r = 0; r < rows; ++r) {
                const float* src = A + (i0 + ip + r) * lda + k0;
                for (std::int64_t p = 0; p < kc; ++p) panel[p * MR + r] = packed_value<RoundBf16>(src[p]);
            }
            for (std::int64_t r = rows; r < MR; ++r)
                for (std::int64_t p = 0; p < kc; ++p) panel[p * MR + r] = 0.0f;
        }
    }
}

// op(A)[i0 .. i0 + mc) x [k0 .. k0 + kc) rounded to bf16, in A's stored
// orientation: out[i * kc + k] (A as stored [M, K]) or out[k * mc + i]
// (stored [K, M]).
inline void round_block_bf16(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc,
                             std::int64_t k0, std::int64_t kc, float* out) noexcept {
    const std::int64_t rows = ta == Trans::no ? mc : kc, cols = ta == Trans::no ? kc : mc;
    const float* src = ta == Trans::no ? A + i0 * lda + k0 : A + k0 * lda + i0;
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = round_to_bf16_value(src[r * lda + c]);
}

// A 64-byte-aligned scratch buffer that grows and is kept: one per thread and
// purpose, so packing allocates only on the first products of a run.
class PackBuffer {
public:
    PackBuffer() = default;
    PackBuffer(const PackBuffer&) = delete;
    PackBuffer& operator=(const PackBuffer&) = delete;
    ~PackBuffer() { std::free(data_); }

    // At least `floats` floats, aligned to 64 bytes; the contents are not kept.
    [[nodiscard]] float* reserve(std::int64_t floats) {
        if (floats > capacity_) {
            std::free(data_);
            const std::size_t bytes = (static_cast<std::size_t>(floats) * 4 + 63) / 64 * 64;
            data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
            if (data_ == nullptr) {
                capacity_ = 0;
                throw std::bad_alloc();
            }
            capacity_ = floats;
        }
        return data_;
    }

private:
    float* data_ = nullptr;
    std::int64_t capacity_ = 0;
};

}  // namespace loom::kernels::host::gemm_detail
