// The planner's memory model: the bytes each device needs to run a
// Candidate, from the partition alone (no step programs built), so that the
// search drops what does not fit before pricing it (plan/cost_model.hpp).
// Per device: parameters, gradients and AdamW state (each divided over the
// dp x sp ranks from the ZeRO stage that shards it), ZeRO's working slots
// (two of the largest group it gathers or reduces at once), and the saved
// activations of the micro-batches the schedule keeps in flight.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "loom/parallel/data_parallel.hpp"
#include "loom/plan/candidate.hpp"
#include "loom/plan/cluster.hpp"
#include "loom/plan/model_description.hpp"
#include "loom/schedule/pipeline.hpp"

namespace loom::plan {

// What each device of the cluster needs, and whether every device holds it.
struct DeviceMemory {
    std::vector<double> bytes;  // per device, in world rank order
    double peak = 0;
    int peak_device = 0;
    bool fits = true;
};

namespace detail {

// Bytes per parameter element: the f32 value, the gradient, and the rest
// (AdamW's moments) of bytes_per_param.
struct StateBytes {
    double value = 4, gradient = 4, optimizer = 8;
};

[[nodiscard]] inline StateBytes state_bytes(const ModelDescription& model) {
    const double gradient = model.gradient_bytes;
    const double value = std::min(4.0, std::max(0.0, model.bytes_per_param - gradient));
    return {value, gradient, std::max(0.0, model.bytes_per_param - value - gradient)};
}

// Bytes one device keeps of `params` elements at ZeRO `zero` over `shards` ranks.
[[nodiscard]] inline double static_bytes(const StateBytes& b, double params, int zero, int shards) {
    const double n = shards;
    return params * (zero >= 3 ? b.value / n : b.value) + params * (zero >= 2 ? b.gradient / n : b.gradient) +
           params * (zero >= 1 ? b.optimizer / n : b.optimizer);
}

}  // namespace detail

// The bytes per device of `c` on `cluster` with `partition` layers per
// virtual stage (empty without a pipeline).
[[nodiscard]] inline DeviceMemory device_memory(const ModelDescription& model, const Cluster& cluster,
                                                const Candidate& c, const std::vector<int>& partition) {
    using detail::StateBytes;
    using detail::state_bytes;
    using detail::static_bytes;
    DeviceMemory out;
    const double samples = static_cast<double>(model.batch) / (c.dp * c.micro_batches);  // per micro-batch per replica
    const StateBytes b = state_bytes(model);
    const auto pipe = c.pp > 1 ? schedule::pipeline_program(c.schedule, c.pp, c.micro_batches, c.chunks)
                               : schedule::PipelineProgram{};
    std::vector<double> params(static_cast<std::size_t>(c.pp), 0.0), saved(params.size(), 0.0),
        chunk_saved(params.size(), 0.0), largest(params.size(), 0.0);
    std::size_t layer = 0;
    for (int v = 0; v < c.virtual_stages(); ++v) {
        const auto p = static_cast<std::size_t>(c.pp > 1 ? pipe.rank_of_chunk[static_cast<std::size_t>(v)] : 0);
        const int count = c.pp > 1 ? partition[static_cast<std::size_t>(v)] : static_cast<int>(model.layers.size());
        double chunk_params = 0, here = 0;
        for (int k = 0; k < count; ++k, ++layer) {
            const LayerSpec& l = model.layers[layer];
            const double n = static_cast<double>(l.params) / c.tp;
            chunk_params += n;
            here += l.saved_bytes;
            // ZeRO-3 without a pipeline gathers one layer at a time; ZeRO-2 reduces buckets.
            largest[p] = std::max(largest[p], c.zero == 2 && c.pp == 1
                                                  ? std::max(n, static_cast<double>(default_bucket_bytes) / 4)
                                                  : n);
        }
        params[p] += chunk_params;
        saved[p] += here;
        chunk_saved[p] = std::max(chunk_saved[p], here);
        if (c.pp > 1 && c.zero >= 2) largest[p] = std::max(largest[p], chunk_params);  // ZeroPP: a chunk at once
    }
    out.bytes.assign(static_cast<std::size_t>(cluster.size()), 0.0);
    for (int p = 0; p < c.pp; ++p) {
        const auto i = static_cast<std::size_t>(p);
        const double in_flight = c.pp > 1 ? pipe.activation_bound * chunk_saved[i] : saved[i];
        double bytes = static_bytes(b, params[i], c.zero, c.dp * c.sp) + in_flight * samples / (c.tp * c.sp);
        if (c.zero >= 2) bytes += 2 * largest[i] * (b.gradient + (c.zero >= 3 ? b.value : 0));
        for (int d = 0; d < c.dp; ++d)
            for (int s = 0; s < c.sp; ++s)
                for (int t = 0; t < c.tp; ++t) out.bytes[static_cast<std::size_t>(c.device(p, d, s, t))] = bytes;
    }
    for (int i = 0; i < cluster.size(); ++i) {
        const double need = out.bytes[static_cast<std::size_t>(i)];
        if (need > out.peak) {
            out.peak = need;
            out.peak_device = i;
        }
        if (need > cluster.device(i).memory) out.fits = false;
    }
    return out;
}

}  // namespace loom::plan
