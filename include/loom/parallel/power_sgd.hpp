// PowerSGD (Vogels et al., 2019; PyTorch's powerSGD_hook) over the buckets
// of a ShardLayout. Per matrix M (n x m, the gradient plus its error
// feedback) of a bucket, with a rank-r Q (m x r) kept from the last step:
//   P = M Q; all-reduce(avg) P; orthonormalise P's columns (Gram-Schmidt);
//   Q = M^T P; all-reduce(avg) Q;  M^ = P Q^T;  error = M - M^
// M^ is the average gradient projected on span(P): exact when the matrices
// have rank r or less. Only matrices that r factors shrink 2x or more are
// compressed, (n + m) r 2 < n m; the rest (vectors, small matrices) are
// averaged whole in the same all-reduce as P. Each bucket has two
// collectives: P's (started when the bucket's backward is done) and Q's.
// Everything lives where the gradients do (the host or a device): the
// GEMMs, the orthonormalisation and the error update run there
// (kernels/ops.hpp, kernels/compression_ops.hpp); only Q's initial values
// and checkpoints cross to the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/kernels/compression_ops.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/shard_layout.hpp"

namespace loom::parallel {

// Q's initial values: a standard normal stream, the same on every rank.
inline constexpr std::uint64_t power_sgd_seed = 0x9057'5cd0'0000'0001ull;

class PowerSgdBuckets {
public:
    using Notice = std::function<void(const std::string&)>;

    // `notice` (may be empty) hears, once per matrix, that one is too small
    // for the rank. The gradients the buckets see are in memory on `where`.
    PowerSgdBuckets(const parallel::ShardLayout& layout, const std::vector<nn::Unit>& units, int rank,
                    const Notice& notice, Device where = host_device)
        : rank_(rank), where_(where) {
        LOOM_CHECK(rank >= 1, "PowerSGD: rank ", rank, " must be at least 1");
        for (const auto& g : layout.groups()) {
            Bucket bucket;
            std::int64_t at = 0;
            for (int u = g.first_unit; u <= g.last_unit; ++u) {
                const nn::Unit& unit = units[static_cast<std::size_t>(u)];
                for (std::size_t k = 0; k < unit.params.size(); ++k) {
                    const Param& p = *unit.params[k];
                    add_param(bucket, p, at, unit, k, notice);
                    at += p.numel();
                }
            }
            bucket.p_and_dense = floats(bucket.p_size + bucket.dense_size);
            bucket.q = floats(bucket.q_size);
            bucket.q_new = floats(bucket.q_size);
            buckets_.push_back(std::move(bucket));
        }
        q_offset_.push_back(0);
        for (const auto& b : buckets_) q_offset_.push_back(q_offset_.back() + b.q_size);
        reset();
    }

    // Every Q back to its initial values (error feedback is the caller's).
    void reset() {
        std::vector<float> initial;
        for (std::size_t g = 0; g < buckets_.size(); ++g) {
            const RngStream stream{power_sgd_seed, g};
            initial.resize(static_cast<std::size_t>(buckets_[g].q_size));
            for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = stream.normal(i);
            copy_bytes(buckets_[g].q.raw(), where_, initial.data(), host_device, initial.size() * sizeof(float));
        }
    }

    // First half: M = grad + error into `error`, P = M Q, dense parts copied;
    // returns the all-reduce of [P | dense] in flight.
    template <comm::Communicator C>
    [[nodiscard]] comm::Request start(C& comm, int g, std::span<const float> grad, std::span<float> error) {
        Bucket& b = bucket(g);
        kernels::accumulate(where_, error.data(), grad.data(), static_cast<std::int64_t>(grad.size()));
        float* p_and_dense = b.p_and_dense.data<float>();
        for (const Matrix& m : b.matrices)
            kernels::gemm(kernels::Trans::no, kernels::Trans::no, m.rows, rank_, m.cols, 1.0f,
                          view(error.data() + m.offset, m.rows * m.cols), m.cols, view(b.q.data<float>() + m.q_offset,
                          m.cols * rank_), rank_, 0.0f, view(p_and_dense + m.p_offset, m.rows * rank_), rank_);
        std::int64_t at = b.p_size;
        for (const auto& [offset, length] : b.dense) {
            copy_floats(p_and_dense + at, error.data() + offset, length);
            at += length;
        }
        const Tensor t = b.p_and_dense.tensor();
        return comm.all_reduce_async(t, t, comm::ReduceOp::avg);
    }

    // Second half, after start's request: orthonormalise P, Q = M^T P,
    // all-reduce Q, M^ = P Q^T into `out`, error = M - M^.
    template <comm::Communicator C>
    void finish(C& comm, int g, std::span<float> out, std::span<float> error) {
        Bucket& b = bucket(g);
        float* p_and_dense = b.p_and_dense.data<float>();
        float* q_new = b.q_new.data<float>();
        for (const Matrix& m : b.matrices) {
            float* p = p_and_dense + m.p_offset;
            kernels::orthonormalize_columns(where_, p, m.rows, rank_);
            kernels::gemm(kernels::Trans::yes, kernels::Trans::no, m.cols, rank_, m.rows, 1.0f,
                          view(error.data() + m.offset, m.rows * m.cols), m.cols, view(p, m.rows * rank_), rank_, 0.0f,
                          view(q_new + m.q_offset, m.cols * rank_), rank_);
        }
        if (!b.matrices.empty()) {
            const Tensor q = b.q_new.tensor();
            comm.all_reduce(q, q, comm::ReduceOp::avg);
        }
        for (const Matrix& m : b.matrices) {
            float* approx = out.data() + m.offset;
            kernels::gemm(kernels::Trans::no, kernels::Trans::yes, m.rows, m.cols, rank_, 1.0f,
                          view(p_and_dense + m.p_offset, m.rows * rank_), rank_, view(q_new + m.q_offset,
                          m.cols * rank_), rank_, 0.0f, view(approx, m.rows * m.cols), m.cols);
            kernels::subtract(where_, error.data() + m.offset, approx, m.rows * m.cols);
        }
        std::int64_t at = b.p_size;
        for (const auto& [offset, length] : b.dense) {
            // Averaged whole: nothing is left over for error feedback.
            copy_floats(out.data() + offset, p_and_dense + at, length);
            fill_zero_bytes(error.data() + offset, where_, static_cast<std::size_t>(length) * sizeof(float));
            at += length;
        }
        copy_floats(b.q.data<float>(), q_new, b.q_size);  // the next step's warm start
    }

    // The warm-start Qs of every bucket, one after the other (checkpoints;
    // `out` and `in` are host memory).
    [[nodiscard]] std::int64_t state_size() const noexcept { return q_offset_.back(); }
    void save(std::span<float> out) const {
        for (std::size_t g = 0; g < buckets_.size(); ++g)
            copy_bytes(out.data() + q_offset_[g], host_device, buckets_[g].q.raw(), where_,
                       static_cast<std::size_t>(buckets_[g].q_size) * sizeof(float));
    }
    void load(std::span<const float> in) {
        for (std::size_t g = 0; g < buckets_.size(); ++g)
            copy_bytes(buckets_[g].q.raw(), where_, in.data() + q_offset_[g], host_device,
                       static_cast<std::size_t>(buckets_[g].q_size) * sizeof(float));
    }
    // Working buffers ([P | dense] and the new Q of every bucket), in bytes.
    [[nodiscard]] std::int64_t buffer_bytes() const noexcept {
        std::int64_t n = 0;
        for (const auto& b : buckets_) n += b.p_and_dense.numel() + b.q_new.numel();
        return 4 * n;
    }
private:
    struct Matrix {
        std::int64_t offset = 0, rows = 0, cols = 0;  // in the bucket; M is rows x cols
        std::int64_t p_offset = 0, q_offset = 0;
    };
    struct Bucket {
        std::vector<Matrix> matrices;
        std::vector<std::pair<std::int64_t, std::int64_t>> dense;  // (offset, length): averaged whole
        std::int64_t p_size = 0, q_size = 0, dense_size = 0;
        DeviceBuffer p_and_dense, q, q_new;  // on where_
    };

    [[nodiscard]] DeviceBuffer floats(std::int64_t n) const { return DeviceBuffer(DType::f32, Shape{n}, where_); }
    [[nodiscard]] Tensor view(float* p, std::int64_t n) const { return Tensor(p, DType::f32, Shape{n}, where_); }
    void copy_floats(float* to, const float* from, std::int64_t n) const {
        copy_bytes(to, where_, from, where_, static_cast<std::size_t>(n) * sizeof(float));
    }

    void add_param(Bucket& bucket, const Param& p, std::int64_t at, const nn::Unit& unit, std::size_t k,
                   const Notice& notice) {
        const std::int64_t n = p.numel();
        if (n == 0) return;
        const std::int64_t rows = p.shape.rank() >= 2 ? p.shape[0] : 1, cols = n / rows;
        const bool matrix = p.shape.rank() >= 2;
        if (matrix && rank_ > std::min(rows, cols) && notice)
            notice(loom::detail::concat("PowerSGD<", rank_, ">: ", unit.name, "'s parameter ", k, " is ", rows,
                                        " x ", cols, "; rank ", rank_, " is larger than its dimension ",
                                        std::min(rows, cols), ", so it is exchanged uncompressed"));
        if (matrix && rank_ <= std::min(rows, cols) && (rows + cols) * rank_ * 2 < rows * cols) {
            bucket.matrices.push_back({at, rows, cols, bucket.p_size, bucket.q_size});
            bucket.p_size += rows * rank_;
            bucket.q_size += cols * rank_;
            return;
        }
        if (!bucket.dense.empty() && bucket.dense.back().first + bucket.dense.back().second == at)
            bucket.dense.back().second += n;  // neighbours merge into one run
        else
            bucket.dense.emplace_back(at, n);
        bucket.dense_size += n;
    }
    [[nodiscard]] Bucket& bucket(int g) { return buckets_.at(static_cast<std::size_t>(g)); }
    [[nodiscard]] const Bucket& bucket(int g) const { return buckets_.at(static_cast<std::size_t>(g)); }

    int rank_;
    Device where_;
    std::vector<Bucket> buckets_;
    std::vector<std::int64_t> q_offset_;
};

}  // namespace loom::parallel
