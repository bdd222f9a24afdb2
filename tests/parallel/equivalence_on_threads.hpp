// The equivalence suite on rank threads: runs one case on dp x pp x tp
// ThreadWorld ranks, then checks every rank's result on the main thread
// (Catch2's assertions are not thread-safe): losses and final parameters
// within 1e-5 of the serial run, and every rank's losses bit-identical.
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include <loom/comm/thread_world.hpp>

#include "parallel/equivalence_suite.hpp"

namespace loom_test {

inline void check_equivalence_on_threads(const EquivalenceCase& c, const SerialRun& serial,
                                         EquivalenceBounds bounds = {}) {
    const int ranks = c.dp * c.pp * c.tp * c.sp;
    std::vector<EquivalenceResult> results(static_cast<std::size_t>(ranks));
    loom::comm::ThreadWorld(ranks).run([&](loom::comm::ThreadComm& comm) {
        results[static_cast<std::size_t>(comm.rank())] = run_equivalence(comm, c, serial);
    });
    for (int r = 0; r < ranks; ++r) {
        const auto& result = results[static_cast<std::size_t>(r)];
        INFO(c << ", rank " << r << ": " << result.describe());
        CHECK(result.worst_loss_error <= bounds.loss);
        CHECK(result.worst_param_error <= bounds.param);
        CHECK(result.param_norm_error <= bounds.param_norm);
        CHECK(result.losses == results[0].losses);  // every rank reports the same loss, bit for bit
        // Sequence parallel ranks really held 1/sp of each sequence.
        CHECK(result.tokens_per_sequence * c.sp == equivalence_model(c.layers, c.heads, c.width, c.vocab).seq);
    }
}

}  // namespace loom_test
