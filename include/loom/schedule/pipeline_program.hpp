// A pipeline schedule's output: one step program per pipeline rank, plus what
// the schedule promises about itself. The model is cut into
// `stages * chunks` virtual stages, numbered in model order; virtual stage v
// lives on rank rank_of_chunk[v] (Interleaved<V>: rank v % stages; a V-shape:
// rank s holds s and 2p-1-s). In the rank programs, forward / backward /
// backward_input / backward_weight name their virtual stage in `chunk` and
// their micro-batch; a `send` names the sender's chunk, a `recv` the
// receiver's; an activation goes from v to v+1, a gradient from v to v-1,
// and consecutive virtual stages on one rank exchange nothing. Sends are
// asynchronous (each is finished by a `wait` later in the same program);
// recvs block.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "loom/schedule/program.hpp"

namespace loom::schedule {

struct PipelineProgram {
    std::string schedule;          // "GPipe", "1F1B", "Interleaved<2>", "ZB-H1", "ZB-V"
    int stages = 1;                // pipeline ranks, p
    int micro_batches = 1;         // m
    int chunks = 1;                // virtual stages per rank
    bool split_backward = false;   // backward_input and backward_weight instead of backward
    int activation_bound = 0;      // the most micro-batch-chunk activations any rank holds at once, as promised
    std::vector<int> rank_of_chunk;     // virtual stage -> rank
    std::vector<StepProgram> ranks;     // ranks[r]: rank r's program

    [[nodiscard]] int virtual_stages() const noexcept { return stages * chunks; }

    friend std::ostream& operator<<(std::ostream& out, const PipelineProgram& p) {
        out << p.schedule << " over " << p.stages << " stages, " << p.micro_batches << " micro-batches, " << p.chunks
            << " chunk" << (p.chunks == 1 ? "" : "s") << " per rank (activations in flight <= " << p.activation_bound
            << ")\n";
        for (std::size_t r = 0; r < p.ranks.size(); ++r) out << "rank " << r << ": " << p.ranks[r];
        return out;
    }
};

}  // namespace loom::schedule
