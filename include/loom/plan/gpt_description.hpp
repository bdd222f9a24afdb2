// The planner's description of loom's reference GPT (gpt/model.hpp): one
// layer per transformer block, the embedding folded into the first and the
// final layernorm, head and loss into the last, which is how train_gpt's
// --partition counts layers (blocks per stage). Per sample of T tokens,
// width C, H heads, vocabulary V, f32 activations:
//   - a block's forward: 24 T C^2 FLOPs of matmuls (QKV, projection, the
//     MLP's two) and 2 T^2 C of causal attention; 12 C^2 + 13 C parameters;
//     it passes on T C floats and keeps 18 T C + T H + 2 T for its backward
//     (the LayerNorms' outputs and statistics, QKV, the attention's output
//     and log-sum-exps, the projection, the MLP's 4 C twice, the residual
//     sums), and its backward allocates 18 T C more (every input gradient),
//     which loom's arenas hold until the micro-batch ends; bench_recompute's
//     measured bytes are these to the 64-byte alignment;
//     Megatron all-reduces two T x C activations in its forward; K and V
//     are 2 T C floats;
//   - ln_f keeps T C + 2 T, the head its T x V logits, the loss its T
//     log-sum-exps; their backwards allocate T C, T C and T V.
// Recomputation follows train_gpt's units (embed, blocks[i], ln_f, head,
// loss; nn/units.hpp): the embedding and the head are Linear-like layers
// not worth recomputing (they hold only their output), the blocks, ln_f and
// the loss are recomputed. So every layer is recomputable; a recomputed
// block holds its output (T C floats), the first layer also the embedding's
// output, the last also ln_f's output and the head's T x V logits and its
// input gradient (the head is never recomputed); while a layer reruns, its
// block's whole 36 T C + T H + 2 T are held (its largest unit); a
// recompute reruns the blocks (and the loss's softmax), not the embedding or
// the head's matmul.
// Recompute<Selective> keeps each recomputed block's matrix products, the
// outputs of its four Linears: QKV (3 T C floats), the attention projection
// (T C), the MLP's fc (4 T C) and projection (T C), 9 T C floats; its rerun
// skips their 24 T C^2 FLOPs (and Megatron's all-reduces, inside the
// projections), leaving the attention core's 2 T^2 C and the LayerNorms,
// GeLU and residual sums (elementwise, which the planner's FLOPs do not
// count). The first and last layers hold the same products: the embedding
// and the head are their own units, never recomputed, as under Full.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/plan/model_description.hpp"

namespace loom::plan {

[[nodiscard]] inline ModelDescription describe_gpt(const gpt::Config& config, std::int64_t batch) {
    config.validate();
    const auto T = static_cast<double>(config.seq), C = static_cast<double>(config.width),
               H = static_cast<double>(config.heads), V = static_cast<double>(config.vocab);
    ModelDescription m;
    m.name = "gpt(layers " + std::to_string(config.layers) + ", width " + std::to_string(config.width) + ", heads " +
             std::to_string(config.heads) + ", seq " + std::to_string(config.seq) + ", vocab " +
             std::to_string(config.vocab) + ")";
    m.batch = batch;
    m.sequence = config.seq;
    m.heads = config.heads;
    m.width = config.width;
    m.vocab = config.vocab;
    for (std::int64_t i = 0; i < config.layers; ++i) {
        LayerSpec block;
        block.name = "blocks[" + std::to_string(i) + "]";
        block.forward_flops = 24 * T * C * C + 2 * T * T * C;
        block.params = 12 * config.width * config.width + 13 * config.width;
        block.tp_replicated_params = 6 * config.width;  // two LayerNorms, the two row-parallel products' biases
        block.grid_vector_params = 13 * config.width;   // two LayerNorms and the four biases (9 C)
        block.output_bytes = 4 * T * C;
        block.saved_bytes = 4 * (18 * T * C + T * H + 2 * T);
        block.backward_bytes = 4 * 18 * T * C;
        block.tp_bytes = 2 * 4 * T * C;
        block.sequence_bytes = 2 * 4 * T * C;
        // On an Optimus 2D grid (times q; GridBytes): each of the four Linears
        // (out x in: 3C x C, C x C, 4C x C, C x 4C) reduce-scatters its
        // partial products (T out) along the row and broadcasts its weight
        // (out in) down the column forward; backward it broadcasts the output
        // gradient along the row twice (for the input gradient, then the
        // weight gradient), its weight down the column again, reduce-scatters
        // the weight gradient down the column and sums the bias gradient
        // (out) there. Each LayerNorm all-reduces T means and T variances
        // along the row forward, 2 T sums backward, and sums its gain and
        // shift gradients (2 C) down the column.
        block.grid_forward = {.row = 4 * (9 * T * C + 2 * 2 * T), .weights = 4 * 12 * C * C};
        block.grid_backward = {.row = 4 * (2 * 9 * T * C + 2 * 2 * T), .weights = 4 * (2 * 12 * C * C + 9 * C + 2 * 2 * C)};
        block.recomputable = true;
        block.recomputed_bytes = 4 * T * C;
        block.recompute_flops = block.forward_flops;
        block.product_bytes = 4 * 9 * T * C;
        block.product_flops = 24 * T * C * C;
        block.rerun_bytes = block.held_bytes();
        m.layers.push_back(block);
    }
    LayerSpec& first = m.layers.front();
    first.name = "embed + " + first.name;
    first.params += config.vocab * config.width + config.seq * config.width;
    first.tp_replicated_params += config.seq * config.width;  // the position table
    first.grid_vector_params += config.seq * config.width;    // the position table, cut by features
    first.forward_flops += T * C;  // the position add; the lookup is a copy
    first.saved_bytes += 4 * T * C;
    // Megatron's block: two all-reduces forward (attention's and the MLP's
    // outputs), two backward (their inputs' gradients). The embedding's
    // vocab-parallel lookup sums forward only; the head's input gradient is
    // summed backward only; the loss's row maxima, sums and target logits
    // (3 floats a position) forward only.
    first.tp_backward_bytes = first.tp_bytes;
    first.tp_bytes += 4 * T * C;
    first.recomputed_bytes += 4 * T * C;  // the embedding's output, kept (it is not recomputed)
    // On a grid, the embedding reduce-scatters the whole micro-batch's partial
    // lookups (T C a sample) down the column and gathers their gradient there.
    first.grid_forward.column += 4 * T * C;
    first.grid_backward.column += 4 * T * C;
    LayerSpec& last = m.layers.back();
    last.name += " + ln_f, head, loss";
    last.params += 2 * config.width + config.vocab * config.width;
    last.tp_replicated_params += 2 * config.width;  // ln_f
    last.grid_vector_params += 2 * config.width;    // ln_f (the head has no bias)
    last.forward_flops += 2 * T * C * V + 5 * T * V;  // the head's matmul, then softmax and the loss
    last.saved_bytes += 4 * (T * C + 2 * T + T * V + T);
    last.backward_bytes += 4 * (2 * T * C + T * V);
    last.tp_backward_bytes = last.tp_backward() + 4 * T * C;
    last.tp_bytes += 4 * 3 * T;
    last.recomputed_bytes += 4 * (2 * T * C + T * V);  // ln_f's output, the head's logits and input gradient
    last.recompute_flops += 5 * T * V;            // the loss's softmax again; the head's matmul is kept
    // On a grid: ln_f as a block's LayerNorm; the head (V x C, no bias) as a
    // block's Linear; the loss all-reduces its rows' maxima (T) and sums and
    // target logits (2 T) along the row and the mean (one float) down the
    // column, forward only.
    last.grid_forward.row += 4 * (2 * T + T * V + 3 * T);
    last.grid_forward.weights += 4 * V * C;
    last.grid_forward.scalars += 4;
    last.grid_backward.row += 4 * (2 * T + 2 * T * V);
    last.grid_backward.weights += 4 * (2 * C + 2 * V * C);
    // The executor's units (nn::units_of the GPT): the first and last layers
    // fold the embedding, and ln_f, the head and the loss, into their blocks.
    const std::int64_t w = config.width;
    const auto block_unit = [&](std::int64_t i) {
        return UnitParams{"blocks[" + std::to_string(i) + "]", 12 * w * w + 13 * w, 6 * w, 13 * w};
    };
    const UnitParams embed{"embed", config.vocab * w + config.seq * w, config.seq * w, config.seq * w};
    const std::vector<UnitParams> tail{{"ln_f", 2 * w, 2 * w, 2 * w}, {"head", config.vocab * w, 0, 0}, {"loss", 0, 0, 0}};
    first.units = {embed, block_unit(0)};
    first.main_unit = 1;
    if (config.layers == 1) {
        first.units.insert(first.units.end(), tail.begin(), tail.end());
    } else {
        last.units = {block_unit(config.layers - 1)};
        last.units.insert(last.units.end(), tail.begin(), tail.end());
        last.main_unit = 0;
    }
    return m;
}

// Scales each layer's FLOPs of `m` (describe_gpt's) by how much slower than
// `gemm_flops` (this machine's GEMM speed, measure_gemm_flops) its units ran
// when profiled (plan::profile_units on `rows` samples; one time per unit
// of the GPT: embed, blocks, ln_f, head, loss). A narrow layer runs below
// GEMM speed, and the attention core, LayerNorms, GeLU and softmax are time
// the GEMM FLOPs do not count; after this the FLOPs are effective ones, so
// a device's "tflops" keeps meaning its GEMM speed. Forward, backward and
// recompute FLOPs take the layer's one factor.
inline void calibrate_gpt(ModelDescription& m, const std::vector<double>& unit_seconds, std::int64_t rows,
                          double gemm_flops) {
    const std::size_t layers = m.layers.size();
    LOOM_CHECK(unit_seconds.size() == layers + 4, "calibrate_gpt: ", unit_seconds.size(), " unit times for ", layers,
               " layers; give one per unit (embed, the blocks, ln_f, head, loss): ", layers + 4);
    LOOM_CHECK(rows >= 1 && gemm_flops > 0 && std::isfinite(gemm_flops), "calibrate_gpt: rows ", rows,
               " and GEMM speed ", gemm_flops, " must be positive");
    for (std::size_t i = 0; i < layers; ++i) {
        // Unit i + 1 is block i; the first layer folds the embedding, the last ln_f, head and loss.
        double seconds = unit_seconds[i + 1];
        if (i == 0) seconds += unit_seconds[0];
        if (i + 1 == layers) seconds += unit_seconds[layers + 1] + unit_seconds[layers + 2] + unit_seconds[layers + 3];
        LayerSpec& l = m.layers[i];
        const double at_gemm_speed = (l.forward_flops + l.backward()) * static_cast<double>(rows) / gemm_flops;
        LOOM_CHECK(seconds > 0 && std::isfinite(seconds) && at_gemm_speed > 0, "calibrate_gpt: layer ", l.name, " took ",
                   seconds, " s for ", at_gemm_speed, " s of GEMM work; give positive times");
        const double slower = seconds / at_gemm_speed;
        const double recompute = l.recompute();
        l.backward_flops = l.backward() * slower;
        l.forward_flops *= slower;
        l.recompute_flops = recompute * slower;
        l.product_flops *= slower;
    }
}

}  // namespace loom::plan
