// TensorShards: how a tensor-parallel rank's parameters map onto the whole
// model's, for checkpoints. The executor's arrays are in the rank's own
// (local) order: its Params with their cut shapes, in reflection order. A
// checkpoint is the whole model in the serial order. Each Param is either
// whole on every tp rank (LayerNorm, a row-split Linear's bias), copied as
// is, or a shard (Param::slice): the tp ranks' shards are all-gathered and
// each element put back at its place in the whole tensor; or held whole by
// one tp rank and empty on the others (Param::held_by: Kraken's sub-layers),
// copied from its holder. So a rank's local arrays differ in size between
// tp ranks only by what each holds.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/staged.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"

namespace loom::exec {

class TensorShards {
public:
    TensorShards() = default;

    // `degree`: the tp axis size the model was cut for (1: nothing is cut).
    template <class Model>
    TensorShards(const Model& model, int degree) : degree_(degree) {
        std::int64_t local = 0, whole = 0;
        reflect::visit_params(model, [&](const Param& p, std::string_view) {
            entries_.push_back({p, local, whole});
            local += p.numel();
            whole += p.full_shape().numel();
        });
        local_size_ = local;
        whole_size_ = whole;
    }

    [[nodiscard]] std::int64_t local_size() const noexcept { return local_size_; }
    [[nodiscard]] std::int64_t whole_size() const noexcept { return whole_size_; }

    // Collective over `tp`: the whole model from every rank's local arrays.
    // `tp` moves memory on `where`: the shards are gathered there, then read
    // on the host.
    template <comm::Communicator C>
    void to_whole(C& tp, std::span<const float> local, std::span<float> whole, Device where = host_device) const {
        check(local.size(), whole.size());
        LOOM_CHECK(tp.size() == degree_, "TensorShards: a tp axis of ", tp.size(), " ranks for a model cut ", degree_,
                   " ways");
        std::vector<float> gathered;
        for (const Entry& e : entries_) {
            const std::int64_t n = e.param.numel();
            if (e.param.slice.held()) {
                copy_from_holder(tp, e, local, whole, where);
                continue;
            }
            if (!e.param.slice.sliced()) {
                std::copy_n(local.begin() + e.local, n, whole.begin() + e.whole);
                continue;
            }
            gathered.resize(static_cast<std::size_t>(n * degree_));
            comm::staged_all_gather(tp, Tensor::of(const_cast<float*>(local.data()) + e.local, {n}),
                                    Tensor::of(gathered.data(), {n * degree_}), where);
            const float* blocks = gathered.data();
            for (int q = 0; q < degree_; ++q) {
                const Param theirs = shard_of(e.param, q);
                const float* block = blocks + q * n;
                for (std::int64_t k = 0; k < n; ++k) whole[static_cast<std::size_t>(e.whole + theirs.full_index(k))] = block[k];
            }
        }
    }

    // Whether tp rank `q` is the one that counts its copy of `p` when a sum
    // runs over the tp axis: each element of the whole model has one owner.
    // A Param cut by rank is owned by every rank (each holds its own part);
    // one kept whole by rank 0; on a grid, one cut along rows only by the
    // ranks of column 0 (the others hold copies of it), and so on. One held by
    // a single rank is owned there (and has no elements anywhere else).
    [[nodiscard]] bool owns(const Param& p, int q) const {
        if (p.slice.held()) return q == p.slice.holder;
        int side = 1;
        while (side * side < degree_) ++side;
        bool by_rank = false, by_row = false, by_column = false;
        for (const ParamCut& c : p.slice.cuts) {
            if (c.dim < 0) continue;
            by_rank |= c.axis == CutAxis::rank;
            by_row |= c.axis == CutAxis::grid_row;
            by_column |= c.axis == CutAxis::grid_column;
        }
        if (by_rank) return true;
        if (!by_row && !by_column) return q == 0;
        return (by_row || q / side == 0) && (by_column || q % side == 0);
    }

    // The local ranges [first, end) of the Params tp rank `q` holds but does
    // not own (see owns): what a sum over the tp axis must leave out there.
    [[nodiscard]] std::vector<std::pair<std::int64_t, std::int64_t>> copies(int q) const {
        std::vector<std::pair<std::int64_t, std::int64_t>> out;
        for (const Entry& e : entries_) {
            if (owns(e.param, q)) continue;
            const std::int64_t end = e.local + e.param.numel();
            if (!out.empty() && out.back().second == e.local) out.back().second = end;
            else out.emplace_back(e.local, end);
        }
        return out;
    }

    // Where element `local` of this rank's local arrays is in the whole model.
    [[nodiscard]] std::int64_t whole_index(std::int64_t local) const {
        LOOM_CHECK(local >= 0 && local < local_size_, "TensorShards: element ", local, " of a rank with ", local_size_);
        const auto after = std::upper_bound(entries_.begin(), entries_.end(), local,
                                            [](std::int64_t at, const Entry& e) { return at < e.local; });
        const Entry& e = *(after - 1);
        return e.whole + e.param.full_index(local - e.local);
    }

    // Appends to `runs` the whole-model (first, count) runs of this rank's
    // local elements [first, end), in local order, merging a run that
    // continues the last one: a run per stretch of a cut row, not per element.
    void append_whole_runs(std::int64_t first, std::int64_t end, std::vector<std::int64_t>& runs) const {
        LOOM_CHECK(first >= 0 && first <= end && end <= local_size_, "TensorShards: elements [", first, ", ", end,
                   ") of a rank with ", local_size_);
        if (first == end) return;
        auto e = std::upper_bound(entries_.begin(), entries_.end(), first,
                                  [](std::int64_t at, const Entry& entry) { return at < entry.local; }) - 1;
        for (std::int64_t k = first; k < end;) {
            while (k >= e->local + e->param.numel()) ++e;
            const std::int64_t in = k - e->local;
            const std::int64_t n = std::min(end - k, e->param.contiguous_from(in));
            const std::int64_t whole = e->whole + e->param.full_index(in);
            if (!runs.empty() && runs[runs.size() - 2] + runs.back() == whole) runs.back() += n;
            else runs.insert(runs.end(), {whole, n});
            k += n;
        }
    }

    // This rank's local arrays from the whole model (no communication).
    void to_local(std::span<const float> whole, std::span<float> local) const {
        check(local.size(), whole.size());
        for (const Entry& e : entries_)
            for (std::int64_t k = 0; k < e.param.numel(); ++k)
                local[static_cast<std::size_t>(e.local + k)] = whole[static_cast<std::size_t>(e.whole + e.param.full_index(k))];
    }

private:
    struct Entry {
        Param param;  // shape and slice only (a copy; the values are not used)
        std::int64_t local, whole;
    };

    // A Param one rank holds whole: every rank sends a block of its whole
    // size (the holder its values, the others zeros) and takes the holder's,
    // so the gather is exact and the same collective on every rank.
    template <comm::Communicator C>
    void copy_from_holder(C& tp, const Entry& e, std::span<const float> local, std::span<float> whole,
                          Device where) const {
        const std::int64_t n = e.param.full_shape().numel();
        std::vector<float> mine(static_cast<std::size_t>(n), 0.0f), gathered(static_cast<std::size_t>(n * degree_));
        std::copy_n(local.begin() + e.local, e.param.numel(), mine.begin());
        comm::staged_all_gather(tp, Tensor::of(mine.data(), {n}), Tensor::of(gathered.data(), {n * degree_}), where);
        std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(e.param.slice.holder) * n, n,
                    whole.begin() + e.whole);
    }

    // Rank q's shard: the same cuts, at q's coordinates (its rank, or its
    // row and column on a square grid of degree_ ranks).
    [[nodiscard]] Param shard_of(const Param& mine, int q) const {
        Param theirs{mine.shape, mine.init, mine.dtype, {}, {}, mine.slice};
        int side = 1;
        while (side * side < degree_) ++side;
        for (ParamCut& c : theirs.slice.cuts) {
            if (c.dim < 0) continue;
            const int at = c.axis == CutAxis::rank ? q : c.axis == CutAxis::grid_row ? q / side : q % side;
            c.start = at * (mine.shape[c.dim] / c.groups);
        }
        return theirs;
    }

    void check(std::size_t local, std::size_t whole) const {
        LOOM_CHECK(static_cast<std::int64_t>(local) == local_size_ && static_cast<std::int64_t>(whole) == whole_size_,
                   "TensorShards: arrays of ", local, " (local) and ", whole, " (whole) elements; this rank has ",
                   local_size_, " and the model ", whole_size_);
    }

    int degree_ = 1;
    std::vector<Entry> entries_;
    std::int64_t local_size_ = 0, whole_size_ = 0;
};

}  // namespace loom::exec
