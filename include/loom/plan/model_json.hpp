// A ModelDescription read from a JSON file (the format: docs/plan_files.md):
//
//   {"name": "gpt2-24", "batch": 32, "sequence": 1024, "heads": 16, "width": 1024,
//    "layers": [{"name": "embed+block", "forward_flops": 2.6e10, "params": 63000000, "output_bytes": 4194304},
//               {"name": "block", "repeat": 22, "forward_flops": 2.6e10, ...}]}
//
// Sizes are per sample of the batch, as in ModelDescription. A layer with
// "repeat": k > 1 stands for k consecutive equal layers "block[0]" ..
// "block[k-1]". Optional per layer: "recomputable" (true), "recomputed_bytes"
// (what it keeps when recomputed; its output_bytes), "recompute_flops" (its
// rerun; its forward_flops), and "grid_forward" and "grid_backward" (what it
// sends on an Optimus 2D grid, GridBytes; absent: estimated). Every mistake
// is one line with the file, line and column, e.g.
//   model.json:9:40: layers[1].params is -5; give a whole number of parameters, 0 or more
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/plan/json_fields.hpp"
#include "loom/plan/model_description.hpp"

namespace loom::plan {

namespace detail_model_json {

// Layers in all after repeats: far more than any model has, few enough that
// a typo ("repeat": 1e9) fails here with a message instead of exhausting memory.
inline constexpr std::int64_t max_layers = 1'000'000;

// A layer's "grid_forward" or "grid_backward": {"row": ..., "column": ...,
// "weights": ..., "scalars": ...}, each 0 when absent (GridBytes).
[[nodiscard]] inline GridBytes grid_bytes(const json_fields::Object& layer, std::string_view key) {
    GridBytes g;
    const std::optional<json_fields::Node> field = layer.optional(key);
    if (!field) return g;
    const json_fields::Object grid = field->object({"row", "column", "weights", "scalars"});
    g.row = grid.non_negative_or("row", 0, "bytes per sample, times the grid side");
    g.column = grid.non_negative_or("column", 0, "bytes per sample, times the grid side");
    g.weights = grid.non_negative_or("weights", 0, "bytes per micro-batch, times the grid side");
    g.scalars = grid.non_negative_or("scalars", 0, "bytes per micro-batch");
    return g;
}

}  // namespace detail_model_json

// Parses a model file's text; `source` names it in messages ("model.json").
[[nodiscard]] inline ModelDescription read_model(std::string_view text, std::string_view source = "model") {
    namespace jf = json_fields;
    using detail_model_json::max_layers;
    const jf::Document doc(text, source);
    const jf::Object top = doc.top(
        {"name", "batch", "sequence", "heads", "width", "bytes_per_param", "gradient_bytes", "layers"});

    ModelDescription model;
    model.name = top.string("name", "the model's name");
    model.batch = top.integer("batch", 1, "samples per step");
    model.sequence = top.integer_or("sequence", 0, 0, "tokens per sample");
    model.heads = top.integer_or("heads", 0, 0, "attention heads");
    model.width = top.integer_or("width", 0, 0, "hidden units");
    model.bytes_per_param = top.positive_or("bytes_per_param", model.bytes_per_param, "bytes");
    model.gradient_bytes = top.positive_or("gradient_bytes", model.gradient_bytes, "bytes");

    const std::string layers_hint =
        R"(give a non-empty array of layers, e.g. [{"name": "block", "forward_flops": 1e9, "params": 1000, )"
        R"("output_bytes": 4096}])";
    const jf::Node layers_field = top.required("layers", layers_hint);
    const std::vector<jf::Node> layer_fields = layers_field.elements(layers_hint);
    if (layer_fields.empty()) layers_field.invalid(layers_hint);
    for (const jf::Node& field : layer_fields) {
        const jf::Object layer = field.object({"name", "repeat", "forward_flops", "backward_flops", "params",
                                               "output_bytes", "saved_bytes", "backward_bytes", "tp_bytes",
                                               "tp_backward_bytes", "tp_replicated_params", "grid_vector_params", "sequence_bytes", "recomputable", "recomputed_bytes", "recompute_flops",
                                               "rerun_bytes", "product_bytes", "product_flops", "grid_forward",
                                               "grid_backward"});
        LayerSpec spec;
        spec.name = layer.string("name", "the layer's name");
        const std::int64_t repeat = layer.integer_or("repeat", 1, 1, "consecutive copies");
        spec.forward_flops = layer.non_negative("forward_flops", "FLOPs per sample");
        spec.backward_flops = layer.non_negative_or("backward_flops", -1, "FLOPs per sample");  // -1: twice the forward
        spec.params = layer.integer("params", 0, "parameters");
        spec.tp_replicated_params = layer.integer_or("tp_replicated_params", 0, 0, "parameters kept whole on every tp rank");
        spec.grid_vector_params = layer.integer_or("grid_vector_params", 0, 0, "parameters a 2D grid cuts q ways");
        spec.output_bytes = layer.non_negative("output_bytes", "bytes per sample");
        spec.saved_bytes = layer.non_negative_or("saved_bytes", spec.output_bytes, "bytes per sample");
        spec.backward_bytes = layer.non_negative_or("backward_bytes", 0, "bytes per sample");
        spec.tp_bytes = layer.non_negative_or("tp_bytes", 0, "bytes per sample");
        spec.tp_backward_bytes = layer.non_negative_or("tp_backward_bytes", -1, "bytes per sample");  // -1: tp_bytes
        spec.sequence_bytes = layer.non_negative_or("sequence_bytes", 0, "bytes per sample");
        if (const std::optional<jf::Node> again = layer.optional("recomputable")) {
            if (again->value().kind() != io::json::Kind::boolean) again->invalid("give true or false");
            spec.recomputable = again->value().boolean();
        }
        spec.recomputed_bytes = layer.non_negative_or("recomputed_bytes", -1, "bytes per sample");  // -1: output_bytes
        spec.recompute_flops = layer.non_negative_or("recompute_flops", -1, "FLOPs per sample");    // -1: forward_flops
        spec.rerun_bytes = layer.non_negative_or("rerun_bytes", -1, "bytes per sample");  // -1: saved + backward
        spec.product_bytes = layer.non_negative_or("product_bytes", 0, "bytes per sample");
        spec.product_flops = layer.non_negative_or("product_flops", 0, "FLOPs per sample");
        spec.grid_forward = detail_model_json::grid_bytes(layer, "grid_forward");
        spec.grid_backward = detail_model_json::grid_bytes(layer, "grid_backward");
        const auto before = static_cast<std::int64_t>(model.layers.size());
        if (repeat > max_layers - before)
            layer.optional("repeat").value_or(field).fail("makes ", before, " + ", repeat,
                                                          " layers; a model may have at most ", max_layers, " in all");
        if (repeat == 1) {
            model.layers.push_back(std::move(spec));
            continue;
        }
        for (std::int64_t i = 0; i < repeat; ++i) {
            LayerSpec copy = spec;
            copy.name = spec.name + "[" + std::to_string(i) + "]";
            model.layers.push_back(std::move(copy));
        }
    }
    model.validate();
    return model;
}

// Reads and parses a model file; messages name `path`.
[[nodiscard]] inline ModelDescription load_model(const std::string& path) {
    return read_model(json_fields::read_file(path, "load_model",
                                             "give the path of a model file (its format: docs/plan_files.md)"),
                      path);
}

}  // namespace loom::plan
