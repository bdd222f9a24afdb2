// Device mirror of kernels/host/gemm.hpp: C[M, N] = alpha * op(A) * op(B) +
// beta * C on device arrays, through cuBLASLt, on the stream of a
// GemmContext. The host's semantics, arguments (in the same order, the
// context last where the other mirrors take the stream) and error messages:
// row-major matrices, lda/ldb/ldc their row strides as stored, beta = 0
// overwrites C (any NaN there included), K = 0 scales C by beta. As with the
// host's BLAS, alpha = 0 also just scales C by beta, without reading A or B.
// The host's int-range checks do not apply (cuBLASLt takes 64-bit sizes);
// the host's thread knobs and sgemm benchmark have no device twin.
//
// Precisions (the element types pick the overload):
//   f32  x f32  -> f32   CUBLAS_COMPUTE_32F: full f32 FMAs, no TF32 (that
//                        would be CUBLAS_COMPUTE_32F_FAST_TF32), so results
//                        equal the host's up to f32 reassociation;
//   bf16 x bf16 -> f32   bf16 inputs, f32 accumulation (tensor cores);
//   bf16 x bf16 -> bf16  the same, rounded once to bf16 after alpha and beta
//                        are applied in f32 (beta reads the bf16 C as f32).
// alpha and beta are f32 host values in every case (scale type f32). The
// environment can still change the math behind the library's back
// (NVIDIA_TF32_OVERRIDE, cuBLAS's emulation settings); loom sets neither.
//
// Row-major through the transpose identity. A row-major [r, c] matrix with
// row stride ld is, byte for byte, the column-major [c, r] matrix with
// leading dimension ld: its transpose. So C = op(A) op(B) in row-major is
// C^T = op(B)^T op(A)^T in column-major, and the call hands cuBLASLt B as its
// "A", A as its "B", with the transpose flags unchanged and m = N, n = M.
// This was chosen over row-ordered layouts (CUBLASLT_ORDER_ROW): column
// major is cuBLASLt's native order, the one its requirements are stated in
// and every algorithm takes, while row order is not supported uniformly
// (FP8 kernels, for one, want column-major A transposed and B not), so it
// could narrow the heuristic's choices, or leave none, for some dtype and
// transpose combinations when later precisions arrive. The identity costs
// nothing: no data moves, only the roles swap.
//
// GemmContext owns what cuBLASLt needs beyond the call:
//   - a cuBLASLt handle, for the device current when the context is made;
//   - a workspace (32 MiB by default, NVIDIA's advice for Hopper) from CUDA's
//     stream-ordered pool on the context's stream, freed on that stream;
//   - a cache of plans: the matmul descriptor, the three matrix layouts and
//     the algorithm the heuristic chose, per (dtypes, transposes, M, N, K,
//     lda, ldb, ldc, pointer alignments). Steady-state training repeats a
//     few shapes, so the heuristic runs once per shape and each later call is
//     a map lookup and cublasLtMatmul with that algorithm (passing no
//     algorithm would make cuBLASLt rerun its heuristic on every call).
// Pointer alignment is part of the key because cuBLASLt's preferences
// default to assuming 256-byte aligned matrices: an algorithm chosen under
// that assumption may fault on a sub-matrix at an odd offset. Each matrix's
// alignment (up to 256 bytes) is passed to the heuristic as a preference.
//
// A bias (gemm_bias: C = alpha op(A) op(B) + bias on every row) is
// cuBLASLt's bias epilogue, added to the f32 sums before C is written: one
// pass over C where a bias written first and read back by beta = 1 took two
// (a GPT-2 step's 48 biased products spent 1.1 ms writing the bias rows
// alone on an H200). Where cuBLASLt offers no algorithm with the epilogue, or
// the bias is not 16-byte aligned, the bias rows are written first and the
// product accumulates onto them, the host's order.
//
// The context is bound to one stream for its life: every product and the
// workspace are ordered on it, so one workspace serves all products. Not
// thread-safe; use one context per stream. The stream must outlive the
// context (the workspace is freed on it).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>

#include "loom/core/check_cuda.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/gemm_arguments.hpp"
#include "loom/kernels/trans.hpp"

namespace loom::kernels::cuda {

using kernels::Trans;  // op(X) = X or X^T, as stored row-major (kernels/trans.hpp), shared with the host GEMM

// cuBLASLt workspace a context allocates unless told otherwise.
inline constexpr std::size_t default_gemm_workspace_bytes = std::size_t{32} << 20;

namespace detail {

// The host's argument checks and their messages (kernels/gemm_arguments.hpp).
using kernels::check_gemm_arguments;
using kernels::trans_name;

[[nodiscard]] __host__ __device__ inline float gemm_load(float x) { return x; }
[[nodiscard]] __host__ __device__ inline float gemm_load(bf16 x) { return to_float(x); }
template <class T>
[[nodiscard]] __host__ __device__ inline T gemm_store(float x) {
    if constexpr (std::is_same_v<T, float>) return x;
    else return to_bf16(x);
}

// C = beta * C over the [M, N] part of C (row stride ldc): the whole product
// when K = 0 or alpha = 0. beta = 0 writes zeros without reading C, as BLAS
// does, so a NaN there is overwritten. Templated, like every kernel in these
// headers, so the definition may appear in every translation unit.
template <class T>
__global__ void gemm_scale_kernel(T* C, std::int64_t M, std::int64_t N, std::int64_t ldc, float beta) {
    const std::int64_t count = M * N;
    for (std::int64_t i = grid_index(); i < count; i += grid_stride()) {
        T& c = C[(i / N) * ldc + i % N];
        c = gemm_store<T>(beta == 0.0f ? 0.0f : beta * gemm_load(c));
    }
}

// C[r, c] = bias[c] over the [M, N] part of C: gemm_bias without a product
// (K = 0 or alpha = 0), and the first half of its fallback.
template <class T>
__global__ void gemm_bias_rows_kernel(T* C, std::int64_t M, std::int64_t N, std::int64_t ldc, const float* bias) {
    const std::int64_t count = M * N;
    for (std::int64_t i = grid_index(); i < count; i += grid_stride())
        C[(i / N) * ldc + i % N] = gemm_store<T>(bias[i % N]);
}

// RAII for the cuBLASLt descriptors: a plan owns them, the context owns plans.
struct LtMatmulDescDelete {
    void operator()(cublasLtMatmulDesc_t d) const noexcept { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDelete {
    void operator()(cublasLtMatrixLayout_t l) const noexcept { cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreferenceDelete {
    void operator()(cublasLtMatmulPreference_t p) const noexcept { cublasLtMatmulPreferenceDestroy(p); }
};
using LtMatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, LtMatmulDescDelete>;
using LtLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LtLayoutDelete>;
using LtPreference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, LtPreferenceDelete>;

// The row-major [rows, cols] matrix with row stride ld, described as what it
// is in memory to a column-major library: the [cols, rows] matrix with
// leading dimension ld.
[[nodiscard]] inline LtLayout row_major_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                                               std::int64_t ld) {
    cublasLtMatrixLayout_t raw = nullptr;
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, static_cast<std::uint64_t>(cols),
                                                 static_cast<std::uint64_t>(rows), ld));
    return LtLayout(raw);
}

// The largest power of two up to 256 that divides the address (256 for null).
[[nodiscard]] inline std::uint32_t pointer_alignment(const void* p) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    std::uint32_t alignment = 256;
    while (alignment > 1 && address % alignment != 0) alignment /= 2;
    return alignment;
}

// Everything the heuristic's choice depends on.
struct GemmKey {
    DType ab_type;
    DType c_type;
    Trans ta, tb;
    std::int64_t M, N, K, lda, ldb, ldc;
    std::uint32_t align_a, align_b, align_c;
    bool bias = false;  // cuBLASLt's bias epilogue (gemm_bias)
    auto operator<=>(const GemmKey&) const = default;
};

// A cached product: cuBLASLt's descriptors in its own (column-major) roles,
// where its A is our B and its B is our A, and the algorithm chosen for them.
struct GemmPlan {
    LtMatmulDesc operation;
    LtLayout lt_a;  // our B
    LtLayout lt_b;  // our A
    LtLayout lt_c;  // C, also D (in place)
    cublasLtMatmulAlgo_t algo;
    bool found = true;  // false: a bias key cuBLASLt has no algorithm for (gemm_bias falls back)
};

}  // namespace detail

// The cuBLASLt handle, workspace and plan cache behind cuda::gemm, bound to
// one stream on the device current at construction. Movable, not copyable.
class GemmContext {
public:
    explicit GemmContext(cudaStream_t stream = nullptr,
                         std::size_t workspace_bytes = default_gemm_workspace_bytes)
        : stream_(stream), workspace_bytes_(workspace_bytes) {
        LOOM_CUDA_CHECK(cudaGetDevice(&device_));
        LOOM_CUBLAS_CHECK(cublasLtCreate(&handle_));
        if (workspace_bytes_ > 0) {
            if (const cudaError_t status = cudaMallocAsync(&workspace_, workspace_bytes_, stream_);
                status != cudaSuccess) {
                cublasLtDestroy(handle_);  // nothing may leak on the error path
                loom::detail::cuda_failed(status, "cudaMallocAsync(&workspace_, workspace_bytes_, stream_)",
                                          loom::SourceLocation::current());
            }
        }
    }

    GemmContext(const GemmContext&) = delete;
    GemmContext& operator=(const GemmContext&) = delete;

    GemmContext(GemmContext&& other) noexcept
        : stream_(other.stream_),
          device_(other.device_),
          handle_(std::exchange(other.handle_, nullptr)),
          workspace_(std::exchange(other.workspace_, nullptr)),
          workspace_bytes_(std::exchange(other.workspace_bytes_, 0)),
          plans_(std::move(other.plans_)),
          heuristic_queries_(std::exchange(other.heuristic_queries_, 0)) {
        other.plans_.clear();
    }

    GemmContext& operator=(GemmContext&& other) noexcept {
        if (this != &other) {
            release();
            stream_ = other.stream_;
            device_ = other.device_;
            handle_ = std::exchange(other.handle_, nullptr);
            workspace_ = std::exchange(other.workspace_, nullptr);
            workspace_bytes_ = std::exchange(other.workspace_bytes_, 0);
            plans_ = std::move(other.plans_);
            other.plans_.clear();
            heuristic_queries_ = std::exchange(other.heuristic_queries_, 0);
        }
        return *this;
    }

    ~GemmContext() { release(); }

    [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] std::size_t workspace_bytes() const noexcept { return workspace_bytes_; }
    // Plans cached so far: one per distinct key (see the header comment).
    [[nodiscard]] std::size_t cache_size() const noexcept { return plans_.size(); }
    // How many times cuBLASLt's heuristic has run: once per cached plan.
    [[nodiscard]] std::int64_t heuristic_queries() const noexcept { return heuristic_queries_; }
    // Drops every plan (the next product of each shape queries again).
    void clear_cache() noexcept { plans_.clear(); }

    // The plan for `key`, made and cached on first use. Throws loom::Error
    // naming the product when cuBLASLt has no algorithm for it.
    const detail::GemmPlan& plan(const detail::GemmKey& key) {
        if (const auto found = plans_.find(key); found != plans_.end()) return found->second;
        detail::GemmPlan made = make_plan(key);
        return plans_.emplace(key, std::move(made)).first->second;
    }

    // Checks that the device current now is the context's.
    void check_device() const {
        int current = 0;
        LOOM_CUDA_CHECK(cudaGetDevice(&current));
        LOOM_CHECK(current == device_, "gemm: the GemmContext belongs to CUDA device ", device_,
                   " but device ", current, " is current; make device ", device_,
                   " current or use a context made on device ", current);
    }

    [[nodiscard]] cublasLtHandle_t handle() const noexcept { return handle_; }
    [[nodiscard]] void* workspace() const noexcept { return workspace_; }

private:
    void release() noexcept {
        plans_.clear();
        if (workspace_ != nullptr) cudaFreeAsync(workspace_, stream_);  // errors surface on a later call
        if (handle_ != nullptr) cublasLtDestroy(handle_);
        workspace_ = nullptr;
        handle_ = nullptr;
    }

    detail::GemmPlan make_plan(const detail::GemmKey& key) {
        const cudaDataType_t ab_type = key.ab_type == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
        const cudaDataType_t c_type = key.c_type == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;

        detail::GemmPlan plan{};
        cublasLtMatmulDesc_t operation = nullptr;
        LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        plan.operation.reset(operation);
        // cuBLASLt's op(A) is our op(B)^T: B stored as given, flag tb; likewise A.
        const cublasOperation_t lt_trans_a = key.tb == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
        const cublasOperation_t lt_trans_b = key.ta == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
        LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSA, &lt_trans_a,
                                                         sizeof lt_trans_a));
        LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSB, &lt_trans_b,
                                                         sizeof lt_trans_b));
        if (key.bias) {
            // An f32 bias of m = N elements (cuBLASLt's rows are our columns),
            // added to every column-major column, which is our row.
            const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
            const cudaDataType_t bias_type = CUDA_R_32F;
            LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                             sizeof epilogue));
            LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                             &bias_type, sizeof bias_type));
        }

        // Stored shapes, row-major: A is [M, K] or [K, M], B is [K, N] or [N, K].
        plan.lt_a = key.tb == Trans::no ? detail::row_major_layout(ab_type, key.K, key.N, key.ldb)
                                        : detail::row_major_layout(ab_type, key.N, key.K, key.ldb);
        plan.lt_b = key.ta == Trans::no ? detail::row_major_layout(ab_type, key.M, key.K, key.lda)
                                        : detail::row_major_layout(ab_type, key.K, key.M, key.lda);
        plan.lt_c = detail::row_major_layout(c_type, key.M, key.N, key.ldc);

        cublasLtMatmulPreference_t raw_preference = nullptr;
        LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_preference));
        const detail::LtPreference preference(raw_preference);
        const std::uint64_t workspace_limit = workspace_bytes_;
        LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            raw_preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_limit, sizeof workspace_limit));
        // Alignments in cuBLASLt's roles: its A is our B, its B our A, D is C.
        const std::uint32_t alignments[4] = {key.align_b, key.align_a, key.align_c, key.align_c};
        const cublasLtMatmulPreferenceAttributes_t alignment_attributes[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; ++i)
            LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_preference, alignment_attributes[i],
                                                                   &alignments[i], sizeof alignments[i]));

        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        ++heuristic_queries_;
        const cublasStatus_t status =
            cublasLtMatmulAlgoGetHeuristic(handle_, operation, plan.lt_a.get(), plan.lt_b.get(), plan.lt_c.get(),
                                           plan.lt_c.get(), raw_preference, 1, &result, &found);
        const bool none = status == CUBLAS_STATUS_NOT_SUPPORTED ||
                          (status == CUBLAS_STATUS_SUCCESS && (found < 1 || result.state != CUBLAS_STATUS_SUCCESS));
        if (none && key.bias) {  // gemm_bias writes the bias rows and accumulates instead
            plan.found = false;
            return plan;
        }
        if (none)
            LOOM_FAIL("gemm: cuBLASLt has no algorithm for M = ", key.M, ", N = ", key.N, ", K = ", key.K,
                      " (ta = ", detail::trans_name(key.ta), ", tb = ", detail::trans_name(key.tb),
                      ", lda = ", key.lda, ", ldb = ", key.ldb, ", ldc = ", key.ldc, ") with A and B ",
                      key.ab_type, ", C ", key.c_type, ", f32 accumulation, pointers aligned to ", key.align_a,
                      ", ", key.align_b, " and ", key.align_c, " bytes (A, B, C) and a workspace of ",
                      workspace_bytes_, " bytes");
        if (status != CUBLAS_STATUS_SUCCESS)
            loom::detail::cublas_failed(status, "cublasLtMatmulAlgoGetHeuristic(handle_, operation, ...)",
                                        loom::SourceLocation::current());
        plan.algo = result.algo;
        return plan;
    }

    cudaStream_t stream_ = nullptr;
    int device_ = 0;
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    std::size_t workspace_bytes_ = 0;
    std::map<detail::GemmKey, detail::GemmPlan> plans_;
    std::int64_t heuristic_queries_ = 0;
};

namespace detail {

// C = alpha op(A) op(B) + beta C, or with `bias` (beta 0) alpha op(A) op(B)
// + bias on every row.
template <class In, class Out>
void gemm_lt(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const In* A,
             std::int64_t lda, const In* B, std::int64_t ldb, float beta, Out* C, std::int64_t ldc,
             GemmContext& context, const float* bias = nullptr) {
    check_gemm_arguments(ta, tb, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return;  // nothing to write
    context.check_device();
    const auto bias_rows = [&] {
        gemm_bias_rows_kernel<Out><<<blocks_for(M * N), threads_per_block, 0, context.stream()>>>(C, M, N, ldc, bias);
        LOOM_CUDA_CHECK_LAUNCH();
    };
    if (K == 0 || alpha == 0.0f) {  // C = beta * C (or the bias rows); A and B are not read
        if (bias != nullptr) {
            bias_rows();
            return;
        }
        if (beta == 1.0f) return;
        gemm_scale_kernel<Out><<<blocks_for(M * N), threads_per_block, 0, context.stream()>>>(C, M, N, ldc, beta);
        LOOM_CUDA_CHECK_LAUNCH();
        return;
    }
    GemmKey key{dtype_of<In>,         dtype_of<Out>,           ta, tb, M, N, K, lda, ldb, ldc,
                pointer_alignment(A), pointer_alignment(B), pointer_alignment(C)};
    key.bias = bias != nullptr && pointer_alignment(bias) >= 16;
    const GemmPlan& plan = context.plan(key);
    if (bias != nullptr && (!key.bias || !plan.found)) {  // the bias rows, then the product onto them
        bias_rows();
        gemm_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc, context);
        return;
    }
    if (key.bias) {
        LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof bias));
        beta = 0.0f;
    }
    // cuBLASLt's A is our B and its B our A (the header comment's identity);
    // C is read (unless beta = 0) and written in place as D.
    LOOM_CUBLAS_CHECK(cublasLtMatmul(context.handle(), plan.operation.get(), &alpha, B, plan.lt_a.get(), A,
                                     plan.lt_b.get(), &beta, C, plan.lt_c.get(), C, plan.lt_c.get(), &plan.algo,
                                     context.workspace(), context.workspace_bytes(), context.stream()));
}

}  // namespace detail

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, f32 throughout
// (CUBLAS_COMPUTE_32F, no TF32), on context.stream(). A is stored [M, K]
// (ta = no) or [K, M] (ta = yes), B [K, N] or [N, K]; each row stride must
// cover its stored row. beta = 0 overwrites C (any NaN there included); K = 0
// or alpha = 0 scales C by beta. Device pointers; C overlaps neither A nor B.
inline void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
                 GemmContext& context) {
    detail::gemm_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, context);
}

// The same with bf16 A and B, f32 accumulation and an f32 C.
inline void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const bf16* A,
                 std::int64_t lda, const bf16* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
                 GemmContext& context) {
    detail::gemm_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, context);
}

// C[M, N] = alpha op(A) op(B) + bias, bias[N] added to every row in the
// product's epilogue; C is written, not read. f32 or bf16 A and B (f32
// accumulation), f32 C and bias, on context.stream().
inline void gemm_bias(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                      std::int64_t lda, const float* B, std::int64_t ldb, const float* bias, float* C,
                      std::int64_t ldc, GemmContext& context) {
    LOOM_CHECK(bias != nullptr || M == 0 || N == 0, "gemm_bias: the bias is null; pass N = ", N, " floats");
    detail::gemm_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, context, bias);
}
inline void gemm_bias(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const bf16* A,
                      std::int64_t lda, const bf16* B, std::int64_t ldb, const float* bias, float* C,
                      std::int64_t ldc, GemmContext& context) {
    LOOM_CHECK(bias != nullptr || M == 0 || N == 0, "gemm_bias: the bias is null; pass N = ", N, " floats");
    detail::gemm_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, context, bias);
}

// The same with a bf16 C, rounded to nearest even when written. With beta != 0
// cuBLASLt seems to round alpha * acc to bf16 before it adds beta * C: on an
// H200, up to 4% of a product's elements were more than one bf16 ulp off
// (1.24, say), never with beta = 0 (tests/cuda/test_kernels_gemm.cu bounds it).
inline void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const bf16* A,
                 std::int64_t lda, const bf16* B, std::int64_t ldb, float beta, bf16* C, std::int64_t ldc,
                 GemmContext& context) {
    detail::gemm_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, context);
}

}  // namespace loom::kernels::cuda
