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
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/kernels/host/low_rank.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/shard_layout.hpp"

namespace loom::exec {

// Q's initial values: a standard normal stream, the same on every rank.
inline constexpr std::uint64_t power_sgd_seed = 0x9057'5cd0'0000'0001ull;

class PowerSgdBuckets {
public:
    using Notice = std::function<void(const std::string&)>;

    // `notice` (may be empty) hears, once per matrix, that one is too small for the rank.
    PowerSgdBuckets(const parallel::ShardLayout& layout, const std::vector<nn::Unit>& units, int rank,
                    const Notice& notice)
        : rank_(rank) {
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
            bucket.p_and_dense.resize(static_cast<std::size_t>(bucket.p_size + bucket.dense_size));
            bucket.q_new.resize(static_cast<std::size_t>(bucket.q_size));
            buckets_.push_back(std::move(bucket));
        }
        q_offset_.push_back(0);
        for (const auto& b : buckets_) q_offset_.push_back(q_offset_.back() + b.q_size);
        reset();
    }

    // Every Q back to its initial values (error feedback is the caller's).
    void reset() {
        for (std::size_t g = 0; g < buckets_.size(); ++g) {
            const RngStream stream{power_sgd_seed, g};
            auto& q = buckets_[g].q;
            q.resize(static_cast<std::size_t>(buckets_[g].q_size));
            for (std::size_t i = 0; i < q.size(); ++i) q[i] = stream.normal(i);
        }
    }

    // First half: M = grad + error into `error`, P = M Q, dense parts copied;
    // returns the all-reduce of [P | dense] in flight.
    template <comm::Communicator C>
    [[nodiscard]] comm::Request start(C& comm, int g, std::span<const float> grad, std::span<float> error) {
        Bucket& b = bucket(g);
        for (std::size_t i = 0; i < grad.size(); ++i) error[i] += grad[i];
        for (const Matrix& m : b.matrices)
            kernels::host::gemm(kernels::host::Trans::no, kernels::host::Trans::no, m.rows, rank_, m.cols, 1.0f,
                                error.data() + m.offset, m.cols, b.q.data() + m.q_offset, rank_, 0.0f,
                                b.p_and_dense.data() + m.p_offset, rank_);
        std::int64_t at = b.p_size;
        for (const auto& [offset, length] : b.dense)
            std::copy_n(error.data() + offset, length, b.p_and_dense.data() + (at += length) - length);
        const Tensor t = Tensor::of(b.p_and_dense.data(), {static_cast<std::int64_t>(b.p_and_dense.size())});
        return comm.all_reduce_async(t, t, comm::ReduceOp::avg);
    }

    // Second half, after start's request: orthonormalise P, Q = M^T P,
    // all-reduce Q, M^ = P Q^T into `out`, error = M - M^.
    template <comm::Communicator C>
    void finish(C& comm, int g, std::span<float> out, std::span<float> error) {
        Bucket& b = bucket(g);
        for (const Matrix& m : b.matrices) {
            float* p = b.p_and_dense.data() + m.p_offset;
            kernels::host::orthonormalize_columns(p, m.rows, rank_);
            kernels::host::gemm(kernels::host::Trans::yes, kernels::host::Trans::no, m.cols, rank_, m.rows, 1.0f,
                                error.data() + m.offset, m.cols, p, rank_, 0.0f, b.q_new.data() + m.q_offset, rank_);
        }
        if (!b.matrices.empty()) {
            const Tensor q = Tensor::of(b.q_new.data(), {b.q_size});
            comm.all_reduce(q, q, comm::ReduceOp::avg);
        }
        for (const Matrix& m : b.matrices) {
            float* approx = out.data() + m.offset;
            kernels::host::gemm(kernels::host::Trans::no, kernels::host::Trans::yes, m.rows, m.cols, rank_, 1.0f,
                                b.p_and_dense.data() + m.p_offset, rank_, b.q_new.data() + m.q_offset, rank_, 0.0f,
                                approx, m.cols);
            for (std::int64_t i = 0; i < m.rows * m.cols; ++i) error[m.offset + i] -= approx[i];
        }
        std::int64_t at = b.p_size;
        for (const auto& [offset, length] : b.dense) {
            // Averaged whole: nothing is left over for error feedback.
            std::copy_n(b.p_and_dense.data() + at, length, out.data() + offset);
            std::fill_n(error.data() + offset, length, 0.0f);
            at += length;
        }
        std::copy(b.q_new.begin(), b.q_new.end(), b.q.begin());  // the next step's warm start
    }

    // The warm-start Qs of every bucket, one after the other (checkpoints).
    [[nodiscard]] std::int64_t state_size() const noexcept { return q_offset_.back(); }
    void save(std::span<float> out) const {
        for (std::size_t g = 0; g < buckets_.size(); ++g)
            std::copy(buckets_[g].q.begin(), buckets_[g].q.end(), out.begin() + q_offset_[g]);
    }
    void load(std::span<const float> in) {
        for (std::size_t g = 0; g < buckets_.size(); ++g)
            std::copy_n(in.begin() + q_offset_[g], buckets_[g].q_size, buckets_[g].q.begin());
    }
    // Working buffers ([P | dense] and the new Q of every bucket), in bytes.
    [[nodiscard]] std::int64_t buffer_bytes() const noexcept {
        std::int64_t n = 0;
        for (const auto& b : buckets_) n += static_cast<std::int64_t>(b.p_and_dense.size() + b.q_new.size());
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
        std::vector<float> p_and_dense, q, q_new;
    };

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
    std::vector<Bucket> buckets_;
    std::vector<std::int64_t> q_offset_;
};

}  // namespace loom::exec
