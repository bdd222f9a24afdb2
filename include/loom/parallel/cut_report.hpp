// CutReport: what a tensor-parallel policy did to each layer of a model, unit
// by unit (embed, blocks[0], ...), as the walkers of tp::shard_model and
// tp::shard_model_grid recorded it. The executor keeps one (exec.cut_report())
// and says once, through ExecutorOptions::notice, when a tensor-parallel
// strategy cuts nothing in a unit that holds weights: that unit then runs
// whole on every tp rank, which is correct but not what tensor parallelism
// is for, and usually means a layer of the user's own declares no cut.
// (Recompute<...> reports in the step program instead: forwards marked
// `(keep input)`; parallel/recomputation.hpp's choice prints itself.)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::tp {

// What happened to one layer.
enum class LayerAction : std::uint8_t {
    column,       // 1D: output features cut (first of a pair, or the vocabulary head)
    row,          // 1D: input features cut, partial outputs summed over the group
    heads,        // 1D: attention heads cut
    vocabulary,   // 1D: token table, or the loss, cut by vocabulary
    grid,         // 2D: a q x q block of its weights and activations
    own,          // 1D: the layer placed its own parts on the ranks (nn::TensorCut::own)
    on_shard,     // elementwise, on whatever slice or block arrives
    whole,        // runs whole, replicated on every tp rank
    undeclared,   // runs whole: computes itself and declares no nn::TensorCut
};

[[nodiscard]] constexpr std::string_view describe(LayerAction action) noexcept {
    switch (action) {
        case LayerAction::column: return "column-parallel (output features cut)";
        case LayerAction::row: return "row-parallel (input features cut)";
        case LayerAction::heads: return "heads cut";
        case LayerAction::vocabulary: return "vocabulary cut";
        case LayerAction::grid: return "q x q block";
        case LayerAction::own: return "its own parts placed per rank";
        case LayerAction::on_shard: return "elementwise on the shard";
        case LayerAction::whole: return "replicated";
        case LayerAction::undeclared: return "replicated (declares no tensor_cut)";
    }
    return "?";
}

[[nodiscard]] constexpr bool is_cut(LayerAction action) noexcept {
    return action == LayerAction::column || action == LayerAction::row || action == LayerAction::heads ||
           action == LayerAction::vocabulary || action == LayerAction::grid || action == LayerAction::own;
}

struct LayerCut {
    std::string unit;       // "blocks[0] Block": as nn::units_of names it
    std::string path;       // field indices inside the unit ("1.2"), empty for the unit itself
    std::string layer;      // the layer's declared or demangled short name
    LayerAction action = LayerAction::whole;
    bool holds_weights = false;  // it has Params (outside normalisation: LayerNorm is never cut by 1D)
};

class CutReport {
public:
    CutReport() = default;
    CutReport(std::string policy, int ranks) : policy_(std::move(policy)), ranks_(ranks) {}

    // Whether a tensor-parallel policy cut the model (false: no tp axis).
    [[nodiscard]] bool empty() const noexcept { return policy_.empty(); }
    [[nodiscard]] const std::string& policy() const noexcept { return policy_; }
    [[nodiscard]] int ranks() const noexcept { return ranks_; }
    [[nodiscard]] const std::vector<LayerCut>& layers() const noexcept { return layers_; }

    // The walkers' side: a layer met, and its action once a pair is decided.
    std::size_t add(LayerCut cut) {
        layers_.push_back(std::move(cut));
        return layers_.size() - 1;
    }
    void set(std::size_t index, LayerAction action) { layers_.at(index).action = action; }

    // Units where the policy cut no layer although some layer holds weights.
    [[nodiscard]] std::vector<std::string> uncut_units() const {
        std::vector<std::string> units;
        for (std::size_t begin = 0; begin < layers_.size();) {
            std::size_t end = begin;
            bool cut = false, weights = false;
            while (end < layers_.size() && layers_[end].unit == layers_[begin].unit) {
                cut = cut || is_cut(layers_[end].action);
                weights = weights || layers_[end].holds_weights;
                ++end;
            }
            if (!cut && weights) units.push_back(layers_[begin].unit);
            begin = end;
        }
        return units;
    }

    // One line, the same on every rank, when some unit is left whole
    // (empty when every unit with weights is cut).
    [[nodiscard]] std::string warning() const {
        const auto units = uncut_units();
        if (units.empty()) return {};
        std::ostringstream out;
        out << policy_ << " over " << ranks_ << " ranks cuts nothing in ";
        for (std::size_t i = 0; i < units.size(); ++i) out << (i == 0 ? "" : ", ") << units[i];
        out << ": " << (units.size() == 1 ? "it runs" : "they run") << " whole on every tp rank";
        std::vector<std::string> undeclared;
        for (const LayerCut& l : layers_)
            if (l.action == LayerAction::undeclared && std::find(undeclared.begin(), undeclared.end(), l.layer) ==
                                                           undeclared.end())
                undeclared.push_back(l.layer);
        if (!undeclared.empty()) {
            out << " (";
            for (std::size_t i = 0; i < undeclared.size(); ++i) out << (i == 0 ? "" : ", ") << undeclared[i];
            out << " declare" << (undeclared.size() == 1 ? "s" : "") << " no tensor_cut; give an elementwise layer "
                << "`static constexpr loom::nn::TensorCut tensor_cut = loom::nn::TensorCut::elementwise;`)";
        } else {
            out << " (no Linear pair, attention or embedding in it)";
        }
        return out.str();
    }

    // Per unit, one line: each layer and what was done to it.
    friend std::ostream& operator<<(std::ostream& out, const CutReport& report) {
        if (report.empty()) return out << "no tensor parallelism";
        out << report.policy_ << " over " << report.ranks_ << " ranks:";
        std::string_view unit;
        bool first_in_unit = true;
        for (const LayerCut& l : report.layers_) {
            if (l.unit != unit) {
                unit = l.unit;
                out << "\n  " << l.unit << ":";
                first_in_unit = true;
            }
            out << (first_in_unit ? " " : "; ") << (l.path.empty() ? "" : l.path + " ") << l.layer << " "
                << describe(l.action);
            first_in_unit = false;
        }
        return out;
    }

    // One line for a run's header: how many layers each action took.
    [[nodiscard]] std::string summary() const {
        if (empty()) return "no tensor parallelism";
        constexpr LayerAction order[] = {LayerAction::column,   LayerAction::row,   LayerAction::heads,
                                         LayerAction::vocabulary, LayerAction::grid, LayerAction::on_shard,
                                         LayerAction::whole,    LayerAction::undeclared};
        std::ostringstream out;
        out << policy_ << " over " << ranks_ << " ranks:";
        const char* separator = " ";
        for (const LayerAction action : order) {
            int n = 0;
            for (const LayerCut& l : layers_) n += l.action == action ? 1 : 0;
            if (n == 0) continue;
            out << separator << n << " " << describe(action);
            separator = ", ";
        }
        return out.str();
    }

private:
    std::string policy_;
    int ranks_ = 1;
    std::vector<LayerCut> layers_;
};

}  // namespace loom::tp
