// ModelDescription: what the planner needs to know of a model, layer by
// layer, per sample of the batch (one sequence for a language model): the
// FLOPs of its forward and backward, its parameters, the activation it hands
// to the next layer (what a pipeline boundary after it sends), the
// activations it keeps for its backward, the bytes tensor and sequence
// parallelism exchange inside it, and what recomputing it keeps and costs
// (Recompute<Full> and Budget: the whole layer again; Recompute<Selective>:
// the layer again but its matrix products, which it keeps).
// Layers may differ (uneven blocks, a GAN's generator and discriminator):
// the planner partitions them as they are.
//
// Made from a loom model type (plan/gpt_description.hpp for the GPT), read
// from JSON (plan/model_json.hpp), or written by hand.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::plan {

// One of the executor's units (nn::units_of) that a layer folds: its
// parameters, of those the ones tp keeps whole, and the vectors an Optimus
// 2D grid cuts q ways (LayerSpec::grid_vector_params).
struct UnitParams {
    std::string name{};
    std::int64_t params = 0;
    std::int64_t tp_replicated_params = 0;
    std::int64_t grid_vector_params = 0;
};

// What one rank of an Optimus 2D grid (q x q ranks, SUMMA products;
// parallel/optimus2d.hpp, nn/summa.hpp) sends in one pass of a layer, in
// comm::Counted's payload bytes, times q: every block is 1/q^2 of its matrix
// and SUMMA passes each q times, so all but `scalars` shrink as 1/q.
struct GridBytes {
    // Per sample: activation blocks along the grid row (SUMMA's broadcasts of
    // the input or output gradient and its reduce-scatters of partial
    // products, LayerNorm's and the loss's row statistics).
    double row = 0;
    // Per sample: activation blocks along the grid column (a
    // vocabulary-parallel embedding's partial lookups, its gradient's gather).
    double column = 0;
    // Per micro-batch, not per sample: weight blocks and parameter gradients
    // along the grid column (SUMMA's weight broadcasts and weight-gradient
    // reduce-scatters, the sums of the vectors' gradients down the column).
    double weights = 0;
    // Per micro-batch, neither per sample nor times q: whole values summed
    // down the grid column (the loss's mean).
    double scalars = 0;

    [[nodiscard]] bool any() const { return row > 0 || column > 0 || weights > 0 || scalars > 0; }
    [[nodiscard]] bool valid() const {
        for (double v : {row, column, weights, scalars})
            if (!std::isfinite(v) || v < 0) return false;
        return true;
    }
    friend std::ostream& operator<<(std::ostream& out, const GridBytes& g) {
        return out << "{row " << g.row << ", column " << g.column << ", weights " << g.weights << ", scalars "
                   << g.scalars << "}";
    }
};

struct LayerSpec {
    std::string name;
    double forward_flops = 0;    // per sample
    double backward_flops = -1;  // per sample; negative: twice the forward (input and weight gradients)
    std::int64_t params = 0;     // parameter elements
    // Of those, the ones Megatron's cut keeps whole on every tp rank
    // (LayerNorms, the biases after row-parallel products, position tables).
    std::int64_t tp_replicated_params = 0;
    // Of those, the vectors an Optimus 2D grid of q x q ranks cuts q ways, not
    // q^2 (biases, LayerNorms, position tables: every grid row holds the same
    // copy); the rest it cuts in q x q blocks.
    std::int64_t grid_vector_params = 0;
    // The executor's units this layer folds, in order (the GPT's first layer
    // is the embedding and a block, its last a block, ln_f, the head and the
    // loss), their parameters adding up to the layer's; empty: one unit. The
    // planner's step programs schedule these units as the executor does, so
    // ZeRO-3's gathers and the gradient buckets come in the executor's sizes;
    // the layer's work and exchanges are priced on unit `main_unit`.
    std::vector<UnitParams> units{};
    int main_unit = 0;
    double output_bytes = 0;     // per sample: the activation it passes on
    double saved_bytes = 0;      // per sample: what its forward keeps until its backward
    // Per sample: what its backward allocates. loom's micro-batch contexts are
    // bump arenas, rewound only when the micro-batch ends, so the input
    // gradients stay until then and count in the peak beside saved_bytes.
    double backward_bytes = 0;
    double tp_bytes = 0;         // per sample: all-reduced over the tp group in its forward
    double tp_backward_bytes = -1;  // per sample: all-reduced in its backward; negative: tp_bytes again
    double sequence_bytes = 0;   // per sample: what sequence-parallel attention exchanges in its forward (K and V)
    // On an Optimus 2D grid: what its forward and its backward send (GridBytes).
    // Neither described (all 0): the planner estimates them from output_bytes
    // and params (describes_grid()).
    GridBytes grid_forward{}, grid_backward{};
    // Recomputation (Recompute<...>, schedule/recompute_solver.hpp): a
    // recomputed layer drops what it saved after its forward and runs that
    // forward again before its backward.
    bool recomputable = true;       // false: it holds only its output, so recomputing saves nothing
    double recomputed_bytes = -1;   // per sample: what it still holds when recomputed; negative: output_bytes
    double recompute_flops = -1;    // per sample: the forward a recompute runs again; negative: forward_flops
    // Per sample: the most its recompute and backward hold at once (its
    // largest recomputed unit's forward and backward bytes, when the layer
    // folds several units); negative: all it holds, saved + backward.
    double rerun_bytes = -1;
    // Recompute<Selective> recomputes the same layers but keeps the outputs of
    // their matrix products (every nn::Linear inside) and replays them: it
    // holds product_bytes more than a recomputed layer and its rerun skips
    // product_flops (the GEMMs, and the tensor-parallel exchanges that are
    // part of them). 0 and 0: no products described, Selective is Full.
    double product_bytes = 0;       // per sample: the matrix products' outputs, kept under Selective
    double product_flops = 0;       // per sample: their FLOPs, part of recompute_flops, not rerun under Selective

    [[nodiscard]] double backward() const { return backward_flops < 0 ? 2 * forward_flops : backward_flops; }
    [[nodiscard]] double tp_backward() const { return tp_backward_bytes < 0 ? tp_bytes : tp_backward_bytes; }
    // Whether it says what it sends on an Optimus 2D grid.
    [[nodiscard]] bool describes_grid() const { return grid_forward.any() || grid_backward.any(); }
    // Parameter elements one of `tp` ranks keeps: the cut ones shared out
    // (rounded up), the replicated ones whole; on an Optimus grid
    // (`grid`, tp = q^2) every parameter is cut, the vectors q ways.
    [[nodiscard]] std::int64_t params_per_tp_rank(int tp, bool grid) const {
        return per_tp_rank(params, tp_replicated_params, grid_vector_params, tp, grid);
    }
    [[nodiscard]] static std::int64_t per_tp_rank(std::int64_t params, std::int64_t replicated, std::int64_t vectors,
                                                  int tp, bool grid) {
        if (grid && tp > 1) {
            int q = 1;
            while ((q + 1) * (q + 1) <= tp) ++q;
            const std::int64_t cut_q = std::min(vectors, params);
            return (params - cut_q + tp - 1) / tp + (cut_q + q - 1) / q;
        }
        const std::int64_t whole = tp == 1 ? 0 : std::min(replicated, params);
        return (params - whole + tp - 1) / tp + whole;
    }
    // The units the executor schedules for it: `units`, or the layer as one.
    [[nodiscard]] std::vector<UnitParams> executor_units() const {
        if (!units.empty()) return units;
        return {UnitParams{name, params, tp_replicated_params, grid_vector_params}};
    }
    // What it holds until the micro-batch ends when it is not recomputed.
    [[nodiscard]] double held_bytes() const { return saved_bytes + backward_bytes; }
    // Never more than it holds kept: recomputing cannot cost memory.
    [[nodiscard]] double kept_when_recomputed() const {
        return std::min(held_bytes(), recomputed_bytes < 0 ? output_bytes : recomputed_bytes);
    }
    // What its rerun and backward take while they run; Selective's products
    // are held with the micro-batch instead (kept_when_selective).
    [[nodiscard]] double rerun_peak(bool selective) const {
        const double all = rerun_bytes < 0 ? held_bytes() : rerun_bytes;
        return selective ? std::max(0.0, all - product_bytes) : all;
    }
    [[nodiscard]] double recompute() const { return recompute_flops < 0 ? forward_flops : recompute_flops; }
    // Selective: what Full keeps plus the products, never more than it saves.
    [[nodiscard]] double kept_when_selective() const {
        return std::min(held_bytes(), kept_when_recomputed() + product_bytes);
    }
    // Selective's rerun: the recompute without the matrix products.
    [[nodiscard]] double selective_recompute() const { return std::max(0.0, recompute() - product_flops); }
    // Whether Selective differs from Full for this layer (it describes products).
    [[nodiscard]] bool keeps_products() const { return product_bytes > 0 || product_flops > 0; }
};

struct ModelDescription {
    std::string name;
    std::vector<LayerSpec> layers;
    std::int64_t batch = 1;       // samples per optimizer step, over all data-parallel ranks
    std::int64_t sequence = 0;    // tokens per sample; > 0 allows sequence parallelism (sp must divide it)
    std::int64_t heads = 0;       // attention heads; > 0: tensor parallelism must divide them
    std::int64_t width = 0;       // hidden width; > 0: a 2D tensor grid's side must divide it
    std::int64_t vocab = 0;       // vocabulary; > 0: tensor parallelism (vocab-parallel head) must divide it
    double bytes_per_param = 16;  // f32 value, gradient and AdamW's two moments
    double gradient_bytes = 4;    // per parameter, what data parallelism reduces

    [[nodiscard]] std::int64_t parameters() const {
        std::int64_t n = 0;
        for (const LayerSpec& l : layers) n += l.params;
        return n;
    }
    [[nodiscard]] double flops_per_step() const {
        double f = 0;
        for (const LayerSpec& l : layers) f += l.forward_flops + l.backward();
        return f * static_cast<double>(batch);
    }

    // Throws with the first field that cannot describe a model.
    void validate() const {
        LOOM_CHECK(!layers.empty(), "model ", name, ": it has no layers; describe at least one");
        LOOM_CHECK(batch >= 1, "model ", name, ": batch ", batch, " must be at least 1 sample");
        LOOM_CHECK(sequence >= 0 && heads >= 0 && width >= 0 && vocab >= 0, "model ", name, ": sequence ", sequence,
                   ", heads ", heads, ", width ", width, " and vocab ", vocab, " must be 0 (unknown) or more");
        LOOM_CHECK(bytes_per_param > 0 && gradient_bytes > 0, "model ", name, ": bytes_per_param ", bytes_per_param,
                   " and gradient_bytes ", gradient_bytes, " must be positive");
        for (const LayerSpec& l : layers) {
            LOOM_CHECK(l.forward_flops >= 0 && l.params >= 0 && l.output_bytes >= 0 && l.saved_bytes >= 0 &&
                           l.backward_bytes >= 0 && l.tp_bytes >= 0 && l.sequence_bytes >= 0,
                       "model ", name, ": layer ", l.name, " has a negative size (forward_flops ", l.forward_flops,
                       ", params ", l.params, ", output_bytes ", l.output_bytes, ", saved_bytes ", l.saved_bytes,
                       ", backward_bytes ", l.backward_bytes, ", tp_bytes ", l.tp_bytes, ", sequence_bytes ",
                       l.sequence_bytes, ")");
            LOOM_CHECK(l.grid_forward.valid() && l.grid_backward.valid(), "model ", name, ": layer ", l.name,
                       " has grid_forward ", l.grid_forward, " and grid_backward ", l.grid_backward,
                       "; give finite bytes of 0 or more (all 0: the planner estimates a 2D grid's messages)");
            LOOM_CHECK(l.grid_vector_params >= 0 && l.grid_vector_params <= l.params, "model ", name, ": layer ",
                       l.name, " has ", l.grid_vector_params, " vector parameters a 2D grid cuts q ways; give 0 to its ",
                       l.params, " parameters");
            if (!l.units.empty()) {
                std::int64_t params = 0, whole = 0, vectors = 0;
                for (const UnitParams& u : l.units) vectors += u.grid_vector_params;
                LOOM_CHECK(vectors == l.grid_vector_params, "model ", name, ": layer ", l.name, "'s ", l.units.size(),
                           " units hold ", vectors, " vector parameters a 2D grid cuts q ways; they must add up to its ",
                           l.grid_vector_params);
                for (const UnitParams& u : l.units) {
                    LOOM_CHECK(u.params >= 0 && u.tp_replicated_params >= 0 && u.tp_replicated_params <= u.params,
                               "model ", name, ": layer ", l.name, "'s unit ", u.name, " has ", u.params,
                               " parameters and keeps ", u.tp_replicated_params, " whole; give 0 to its parameters");
                    params += u.params;
                    whole += u.tp_replicated_params;
                }
                LOOM_CHECK(params == l.params && whole == l.tp_replicated_params && l.main_unit >= 0 &&
                               l.main_unit < static_cast<int>(l.units.size()),
                           "model ", name, ": layer ", l.name, "'s ", l.units.size(), " units hold ", params,
                           " parameters (", whole, " kept whole) and its main unit is ", l.main_unit,
                           "; they must add up to its ", l.params, " (", l.tp_replicated_params,
                           ") and the main unit be one of them");
            }
            LOOM_CHECK(l.tp_replicated_params >= 0 && l.tp_replicated_params <= l.params, "model ", name, ": layer ",
                       l.name, " keeps ", l.tp_replicated_params, " parameters whole on every tp rank; give 0 to its ",
                       l.params, " parameters");
            LOOM_CHECK(std::isfinite(l.backward_bytes) && std::isfinite(l.rerun_bytes), "model ", name, ": layer ",
                       l.name, " has backward_bytes ", l.backward_bytes, " and rerun_bytes ", l.rerun_bytes,
                       "; give finite numbers (rerun_bytes negative: saved_bytes + backward_bytes)");
            LOOM_CHECK(std::isfinite(l.recomputed_bytes) && std::isfinite(l.recompute_flops), "model ", name, ": layer ",
                       l.name, " has recomputed_bytes ", l.recomputed_bytes, " and recompute_flops ", l.recompute_flops,
                       "; give finite numbers (negative: its output_bytes and forward_flops)");
            LOOM_CHECK(std::isfinite(l.product_bytes) && std::isfinite(l.product_flops) && l.product_bytes >= 0 &&
                           l.product_flops >= 0,
                       "model ", name, ": layer ", l.name, " has product_bytes ", l.product_bytes, " and product_flops ",
                       l.product_flops, "; give finite numbers of 0 or more (0 and 0: Selective recomputes it as Full)");
            LOOM_CHECK(l.product_flops <= l.recompute(), "model ", name, ": layer ", l.name, " has product_flops ",
                       l.product_flops, " above the ", l.recompute(),
                       " FLOPs its recompute runs; its matrix products are part of that rerun");
            LOOM_CHECK(l.product_bytes <= l.saved_bytes, "model ", name, ": layer ", l.name, " has product_bytes ",
                       l.product_bytes, " above the ", l.saved_bytes,
                       " bytes it saves; its matrix products' outputs are part of what it saves");
        }
    }

    // "gpt2-24: 26 layers, 354.9 M parameters, batch 32, 2.1 PFLOP per step".
    friend std::ostream& operator<<(std::ostream& out, const ModelDescription& m) {
        return out << m.name << ": " << m.layers.size() << " layer" << (m.layers.size() == 1 ? "" : "s") << ", "
                   << static_cast<double>(m.parameters()) / 1e6 << " M parameters, batch " << m.batch << ", "
                   << m.flops_per_step() / 1e12 << " TFLOP per step";
    }
};

}  // namespace loom::plan
