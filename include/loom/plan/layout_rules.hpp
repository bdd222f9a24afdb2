// Layout: the degrees a run cuts a model by (dp, pp, tp, sp), its
// micro-batches, its strategy and its pipeline partition; and
// why_invalid(model, layout, ranks), the rules those must keep against the
// model and the ranks there are, each broken rule one sentence that names the
// wrong value and what would be valid ("tp 4 does not divide the 6 attention
// heads; use 1, 2, 3 or 6"). The planner (plan/candidate.hpp) and the
// programs that take degrees from their users (train_gpt) call the same
// function, so a layout the planner prints is one they accept, and they
// refuse the others in the same words. The sentences name values, not
// command-line flags: a program adds its own spellings around them. Every
// rank that asks gets the same sentence, so all stop alike.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/plan/model_description.hpp"
#include "loom/schedule/pipeline.hpp"

namespace loom::plan {

struct Layout {
    int dp = 1, pp = 1, tp = 1, sp = 1;
    int micro_batches = 1;
    StrategySpec strategy{};      // the tensor grid, sequence attention and layout, schedule and chunks, compressors
    std::vector<int> partition{};  // layers per virtual stage; empty: the program or the planner balances them

    [[nodiscard]] int ranks() const noexcept { return dp * pp * tp * sp; }
    [[nodiscard]] int virtual_stages() const noexcept { return pp > 1 ? pp * strategy.chunks : 1; }
};

// "1, 2 or 4": the divisors of n (with `squared`, their squares), as a sentence's list.
[[nodiscard]] inline std::string divisors_text(std::int64_t n, bool squared = false) {
    std::vector<std::int64_t> d;
    for (std::int64_t k = 1; k <= n; ++k)
        if (n % k == 0) d.push_back(squared ? k * k : k);
    std::string out;
    for (std::size_t i = 0; i < d.size(); ++i)
        out += (i == 0 ? "" : i + 1 == d.size() ? " or " : ", ") + std::to_string(d[i]);
    return out;
}

// The side of a square grid of `tp` ranks, or 0 if `tp` is not a square.
[[nodiscard]] constexpr int grid_side(int tp) noexcept {
    int q = 1;
    while ((q + 1) * (q + 1) <= tp) ++q;
    return q * q == tp ? q : 0;
}

namespace layout_detail {

// "dp 2 x pp 2 x tp 2": the degrees above 1 (dp always).
[[nodiscard]] inline std::string degrees_text(const Layout& l) {
    std::ostringstream out;
    out << "dp " << l.dp;
    if (l.pp > 1) out << " x pp " << l.pp;
    if (l.tp > 1) out << " x tp " << l.tp;
    if (l.sp > 1) out << " x sp " << l.sp;
    return out.str();
}

// A degree above 1 needs the policy that cuts along it, and a policy needs
// its degree (a Strategy names what to cut, the mesh how many ways).
inline void policy_rules(std::ostream& why, const Layout& l) {
    const auto agree = [&](bool named, const char* policy, const char* axis, int degree) {
        if (why.tellp() > 0) return;
        if (named && degree == 1)
            why << "the strategy names " << policy << " but " << axis << " is 1; use " << axis << " 2 or more";
        else if (!named && degree > 1)
            why << axis << " " << degree << " needs " << policy << " in the strategy; add it";
    };
    agree(l.strategy.pipelined, "Pipeline<...>", "pp", l.pp);
    agree(l.strategy.tensor_parallel, "TensorParallel or Optimus2D", "tp", l.tp);
    agree(l.strategy.sequence_parallel, "SequenceParallel<...>", "sp", l.sp);
}

// Megatron 1D cuts attention by heads (and so the MLP's 4C features, which
// the heads divide) and the embedding and the head by vocabulary; Optimus 2D
// cuts the same, and each micro-batch's samples, by the grid's side q.
inline void tensor_rules(std::ostream& why, const ModelDescription& model, const Layout& l) {
    const int tp = l.tp;
    if (!l.strategy.tensor_grid) {
        if (model.heads > 0 && model.heads % tp != 0)
            why << "tp " << tp << " does not divide the " << model.heads << " attention heads; use "
                << divisors_text(model.heads);
        else if (model.vocab > 0 && model.vocab % tp != 0)
            why << "tp " << tp << " does not divide the vocabulary of " << model.vocab << " tokens; use "
                << divisors_text(model.vocab);
        return;
    }
    const int q = grid_side(tp);
    if (q == 0) {
        int below = 1;  // the side of the largest square under tp
        while ((below + 1) * (below + 1) <= tp) ++below;
        why << "a 2D tensor grid of " << tp << " ranks is not a square; use " << below * below << " or "
            << (below + 1) * (below + 1) << " (q x q)";
        return;
    }
    const std::int64_t samples = model.batch / (static_cast<std::int64_t>(l.dp) * l.micro_batches);
    const auto need = [&](std::int64_t n, const char* what) {
        if (why.tellp() > 0 || n <= 0 || n % q == 0) return;
        why << "the 2D grid's side " << q << " (tp " << tp << ") does not divide the " << n << " " << what
            << "; use a 2D tp of " << divisors_text(n, /*squared=*/true);
    };
    need(model.heads, "attention heads");  // and so the width, which the heads divide
    need(model.vocab, "tokens of the vocabulary");
    need(samples, "samples of each rank's micro-batch (batch / (dp x micro-batches))");
}

// Sequence parallelism cuts every sequence into chunks (2 per rank in the
// zigzag layout); Ulysses also gives each sp rank heads/sp of its heads.
inline void sequence_rules(std::ostream& why, const ModelDescription& model, const Layout& l) {
    const StrategySpec& s = l.strategy;
    const int sp = l.sp, chunks = s.sequence_zigzag ? 2 * sp : sp;
    const std::int64_t heads = model.heads / l.tp;
    const char* per_tp = l.tp > 1 ? " per tp rank" : "";
    if (s.tensor_grid) {
        why << "sequence parallelism does not combine with a 2D tensor grid; cut tp in 1D (TensorParallel) with it";
    } else if (model.sequence == 0) {
        why << "sequence parallelism needs the model's sequence length";
    } else if (s.sequence_attention == nn::SequenceAttention::hybrid &&
               (sp % s.sequence_ulysses != 0 || s.sequence_ulysses == sp)) {
        why << "UlyssesRing<" << s.sequence_ulysses << "> does not leave a ring of 2 or more in sp " << sp
            << "; use an sp that is a multiple of " << 2 * s.sequence_ulysses << " (or Ulysses for a group of all sp ranks)";
    } else if (s.sequence_attention == nn::SequenceAttention::hybrid && heads > 0 && heads % s.sequence_ulysses != 0) {
        why << "UlyssesRing<" << s.sequence_ulysses << "> does not divide the " << heads << " attention heads" << per_tp
            << "; use a group size dividing " << heads;
    } else if (model.sequence % chunks != 0) {
        why << "sp " << sp << " does not cut the sequence of " << model.sequence << " tokens into " << chunks
            << " equal chunks" << (s.sequence_zigzag ? " (the zigzag layout, 2 per rank)" : "")
            << "; use a sequence that is a multiple of " << chunks;
    } else if (s.sequence_attention == nn::SequenceAttention::ulysses && heads > 0 && heads % sp != 0) {
        why << "Ulysses over sp " << sp << " does not divide the " << heads << " attention heads" << per_tp << "; use sp "
            << divisors_text(heads) << ", or RingAttention";
    }
}

// A pipeline's virtual stages each need a layer, its partition counts them
// all, and its schedule has its own rules (interleaving's micro-batches).
inline void pipeline_rules(std::ostream& why, const ModelDescription& model, const Layout& l) {
    const auto layers = static_cast<int>(model.layers.size());
    const int chunks = l.strategy.chunks, stages = l.virtual_stages();
    const std::string stage_words =
        "pp " + std::to_string(l.pp) + (chunks > 1 ? " x " + std::to_string(chunks) + " chunks" : "");
    if (stages > layers) {
        why << stage_words << " = " << stages << " stages but the model has " << layers
            << (layers == 1 ? " layer" : " layers") << "; every stage needs at least one layer: use pp <= "
            << layers / chunks << (chunks > 1 ? ", fewer chunks" : "") << " or more layers";
        return;
    }
    if (!l.partition.empty()) {
        int sum = 0;
        for (int n : l.partition) sum += n < 1 ? layers + 1 : n;
        if (static_cast<int>(l.partition.size()) != stages || sum != layers) {
            why << "a partition of " << l.partition.size() << " stages summing to " << sum << " layers for "
                << stage_words << " = " << stages << " stages; give " << stages << " counts of 1 or more summing to "
                << layers;
            return;
        }
    }
    try {
        (void)schedule::pipeline_program(l.strategy.schedule, l.pp, l.micro_batches, chunks);
    } catch (const Error& e) {
        why << e.message();
    }
}

}  // namespace layout_detail

// Empty when `l` can train `model` on `ranks` ranks; else the first rule it
// breaks, as one sentence naming the values and what would be valid.
[[nodiscard]] inline std::string why_invalid(const ModelDescription& model, const Layout& l, int ranks) {
    std::ostringstream why;
    const std::int64_t split = static_cast<std::int64_t>(l.dp) * l.micro_batches;
    if (l.dp < 1 || l.pp < 1 || l.tp < 1 || l.sp < 1)
        why << "the degrees dp " << l.dp << ", pp " << l.pp << ", tp " << l.tp << ", sp " << l.sp << " must be 1 or more";
    else if (l.ranks() != ranks)
        why << layout_detail::degrees_text(l) << " = " << l.ranks() << " ranks, but there are " << ranks
            << "; the degrees must multiply to " << ranks;
    if (why.tellp() == 0) layout_detail::policy_rules(why, l);
    if (why.tellp() > 0) return why.str();
    if (l.micro_batches < 1 || model.batch % split != 0)
        why << "batch " << model.batch << " does not split into dp " << l.dp << " x " << l.micro_batches
            << " micro-batches of whole samples; use a batch that is a multiple of " << split;
    else if (l.strategy.zero_stage < 0 || l.strategy.zero_stage > 3)
        why << "ZeRO stage " << l.strategy.zero_stage << " is not 0, 1, 2 or 3";
    else if (l.strategy.dp_compression.on() && l.dp * l.sp == 1)
        why << "GradCompress<" << l.strategy.dp_compression.describe()
            << "> compresses the data-parallel gradient exchange, which one rank does not have; use dp 2 or more";
    if (why.tellp() == 0 && l.tp > 1) layout_detail::tensor_rules(why, model, l);
    if (why.tellp() == 0 && l.sp > 1) layout_detail::sequence_rules(why, model, l);
    if (why.tellp() == 0 && l.pp > 1) layout_detail::pipeline_rules(why, model, l);
    return why.str();
}

}  // namespace loom::plan
