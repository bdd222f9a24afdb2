// The groups one rank's layers talk to inside a step, built from the
// executor's tp and sp axes: the component TensorParallel, Optimus2D and
// SequenceParallel install in the executor, which only attaches it to the
// micro-batch contexts and hands it each step's batch:
//   - tensor parallelism: Megatron's tp group (its all-reduces cast to 16 bits
//     under GradCompress<Cast, TpAxis>), or the Optimus 2D grid over it;
//   - sequence parallelism: the sp group (ring attention's neighbours,
//     Ulysses' all-to-all), and for UlyssesRing<K> the Ulysses groups of K
//     consecutive sp ranks with rings across them.
// The micro-batch contexts point at them (attach), so they live on the heap:
// the executor moves, the addresses stay. Also here: the checks of the tp and
// sp axes against the plan, and the tp cut of the model, which come before
// the executor lays anything out; and what the groups ask of each step's
// batch (the grid's rows, the sp rank's positions of each sequence).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/parallel/cut_report.hpp"
#include "loom/parallel/grid2d.hpp"
#include "loom/parallel/optimus2d.hpp"
#include "loom/parallel/sequence_sharder.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/parallel/tensor_parallel_model.hpp"

namespace loom::parallel {

// Whether `tp` is a tensor-parallel axis of more than one rank; throws when
// it has ranks but the plan no TensorParallel.
template <comm::Communicator C>
[[nodiscard]] bool tensor_parallel_axis(const StrategySpec& plan, const C* tp) {
    LOOM_CHECK(plan.tensor_parallel || tp == nullptr || tp->size() == 1, "Executor: a tensor-parallel axis of ",
               tp->size(), " ranks for a strategy without TensorParallel; add TensorParallel or use a tp axis of 1");
    return plan.tensor_parallel && tp != nullptr && tp->size() > 1;
}

// Whether `sp` is a sequence-parallel axis of more than one rank (`tp`: the
// tensor-parallel axis in use, or null).
template <comm::Communicator C>
[[nodiscard]] bool sequence_parallel_axis(const StrategySpec& plan, const C* sp, const C* tp) {
    LOOM_CHECK(plan.sequence_parallel || sp == nullptr || sp->size() == 1, "Executor: a sequence-parallel axis "
               "of ", sp->size(), " ranks for a strategy without SequenceParallel; add SequenceParallel or use an "
               "sp axis of 1");
    const bool on = plan.sequence_parallel && sp != nullptr && sp->size() > 1;
    LOOM_CHECK(!on || !plan.tensor_grid || tp == nullptr, "Executor: SequenceParallel with Optimus2D is not "
               "supported; use TensorParallel (1D) with an sp axis");
    return on;
}

// The tp and sp axes the layers talk to, as the plan uses them: each null
// when absent or of one rank, after the checks above.
template <comm::Communicator C>
struct LayerAxes {
    C* tp = nullptr;
    C* sp = nullptr;
};

template <comm::Communicator C>
[[nodiscard]] LayerAxes<C> layer_axes(const StrategySpec& plan, C* tp, C* sp) {
    C* const used_tp = tensor_parallel_axis(plan, tp) ? tp : nullptr;
    return {used_tp, sequence_parallel_axis(plan, sp, used_tp) ? sp : nullptr};
}

// Cuts the model for this tp rank (before its units and layout exist), and
// says what was done to each layer, its units named as nn::units_of names
// them from `field_names` (empty without a tp axis).
template <comm::Communicator C, class Model>
[[nodiscard]] tp::CutReport cut_model(Model& model, const C* tp, bool grid,
                                      const std::vector<std::string>& field_names) {
    tp::CutReport report;
    if (tp != nullptr && grid) tp::shard_model_grid(model, tp->rank(), tp->size(), &report, field_names);
    else if (tp != nullptr) tp::shard_model(model, tp->rank(), tp->size(), &report, field_names);
    return report;
}

template <comm::Communicator C>
class LayerGroups {
public:
    LayerGroups() = default;

    // `tp` and `sp` as the checks above left them (null: no such axis);
    // `gradient_ranks`: the size of the group gradients are reduced over,
    // which must hold the sp ranks; `tp_cast`: GradCompress<Cast, TpAxis>.
    LayerGroups(C* tp, C* sp, const StrategySpec& plan, int gradient_ranks,
                std::optional<kernels::host::Cast> tp_cast) {
        if (tp != nullptr) {
            tp_group_ = tp_cast ? std::make_unique<nn::TensorGroupOf<C>>(*tp, *tp_cast)
                                : std::make_unique<nn::TensorGroupOf<C>>(*tp);
            if (plan.tensor_grid) grid_ = std::make_unique<Grid>(*tp);
        }
        if (sp == nullptr) return;
        // Without the sp ranks in the gradient group their weights would drift apart.
        LOOM_CHECK(gradient_ranks % sp->size() == 0, "Executor: a gradient axis of ", gradient_ranks,
                   " ranks cannot hold the ", sp->size(), " sp ranks; pass the dp x sp group as dp "
                   "(mesh.combined({\"dp\", \"sp\"}), which Executor::make does)");
        sp_group_ = std::make_unique<nn::TensorGroupOf<C>>(*sp);
        sequence_ = nn::SequenceParallelism{sp_group_.get(), plan.sequence_zigzag, plan.sequence_attention};
        if (plan.sequence_attention == nn::SequenceAttention::hybrid) {
            // Ulysses groups of K consecutive sp ranks, rings across them.
            const int k = plan.sequence_ulysses, r = sp->rank();
            LOOM_CHECK(k >= 2 && sp->size() % k == 0 && k < sp->size(), "Executor: UlyssesRing<", k,
                       "> over an sp axis of ", sp->size(), " ranks; K must divide the sp ranks and leave a ring "
                       "of 2 or more (use Ulysses for K = sp)");
            hybrid_ = std::make_unique<Hybrid>(*sp, k, r);
            sequence_.ulysses = k;
            sequence_.ulysses_group = &hybrid_->within_group;
            sequence_.ring_group = &hybrid_->across_group;
        }
    }

    // Points every context of `pool` (now and later; exec::MicroBatchPool) at these groups.
    template <class Pool>
    void attach(Pool& pool) const {
        if (tp_group_) pool.set_tensor_group(tp_group_.get());
        if (grid_) pool.set_tensor_grid(&grid_->view);
        if (sp_group_) pool.set_sequence_parallelism(sequence_);
    }

    // The rows (and columns) of the Optimus 2D grid; 1 without one.
    [[nodiscard]] int grid_side() const noexcept { return grid_ ? grid_->view.q : 1; }

    // Optimus 2D cuts each micro-batch's sequences over the grid rows; the
    // executor checks it on every rank, not in the first stage's embedding alone.
    void check_micro_batch_rows(std::int64_t rows) const {
        const int q = grid_side();
        LOOM_CHECK(rows % q == 0, "Executor::step: micro-batches of ", rows, " sequences do not split over the ", q,
                   " rows of the Optimus 2D grid; use rows per micro-batch that are a multiple of ", q);
    }

    // This rank's part of a step's batch ([rows, T] token ids in host
    // memory): the batch itself, or with an sp axis this rank's positions of
    // every sequence (parallel/sequence_sharder.hpp), held here until the next call.
    void keep_local_part(Tensor& inputs, Tensor& targets) {
        if (sp_group_) sharder_.keep_local_positions(sequence_.layout(), inputs, targets);
    }
    [[nodiscard]] const nn::SequenceParallelism& sequence() const noexcept { return sequence_; }

private:
    // The hybrid's Ulysses groups and rings, split from the sp axis.
    struct Hybrid {
        C within, across;
        nn::TensorGroupOf<C> within_group, across_group;
        Hybrid(C& sp, int k, int r)
            : within(sp.split(r / k, r % k)), across(sp.split(r % k, r / k)), within_group(within),
              across_group(across) {}
        Hybrid(const Hybrid&) = delete;
        Hybrid& operator=(const Hybrid&) = delete;
    };

    // The Optimus 2D grid and the view of it the contexts point at.
    struct Grid {
        tp::Grid2D<C> comms;
        nn::TensorGrid view;
        explicit Grid(C& tp) : comms(tp), view(comms.view()) {}
    };

    std::unique_ptr<nn::TensorGroupOf<C>> tp_group_;  // what sharded layers talk to
    std::unique_ptr<Grid> grid_;                      // Optimus2D only
    std::unique_ptr<nn::TensorGroupOf<C>> sp_group_;  // ring attention's neighbours
    std::unique_ptr<Hybrid> hybrid_;                  // UlyssesRing<K> only
    nn::SequenceParallelism sequence_{};
    SequenceSharder sharder_;  // this rank's positions of the step's sequences
};

}  // namespace loom::parallel
