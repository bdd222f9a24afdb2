// SharedWindow: memory that every process of an MPI communicator on one node
// can read, for peer memory pooling across processes (infer/pooled_gpt.hpp):
// each process allocates its part (MPI_Win_allocate_shared over the node's
// processes) and reads the others' parts in place (MPI_Win_shared_query), as
// a GPU reads a peer's memory over NVLink. Collective to build and to free.
//
// Writes are published by publish() (MPI_Win_sync, then a barrier, then
// MPI_Win_sync): write your part, publish, then read any part. The window
// stays locked for shared access (MPI_Win_lock_all) while it lives, so the
// processes read with plain loads. The barriers are the Mpi communicator's
// own (polled, so a stalled peer fails the others rather than hanging them);
// MPI's window calls have no nonblocking form, so each runs right after such
// a barrier, as Mpi::split does.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/communicator_mpi.hpp"
#include "loom/core/check_mpi.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

class SharedWindow {
public:
    // Collective over `comm` (which must outlive the window): this process's
    // part is `floats` long (parts may differ). Every process of `comm` must
    // be on this node.
    SharedWindow(Mpi& comm, std::int64_t floats) : comm_(&comm) {
        LOOM_CHECK(floats >= 0, "SharedWindow: a part of ", floats, " floats; give 0 or more");
        const int size = comm.size();
        int node_size = 0;
        comm.barrier();
        LOOM_MPI_CHECK(MPI_Comm_split_type(comm.native(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_));
        LOOM_MPI_CHECK(MPI_Comm_size(node_, &node_size));
        // The same answer on every process (each knows the world's size and its node's), so all refuse alike.
        std::int32_t negated = -node_size;  // the largest negated size: the smallest node
        comm.all_reduce(Tensor::of(&negated, {1}), Tensor::of(&negated, {1}), ReduceOp::max);
        const std::int32_t smallest = -negated;
        if (smallest != size) {
            MPI_Comm_free(&node_);
            LOOM_FAIL("SharedWindow: the ", size, " processes are not on one node (the smallest node holds ", smallest,
                      "); a peer's memory is readable only on its own node: start them on one host");
        }
        comm.barrier();
        void* base = nullptr;
        LOOM_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(floats) * static_cast<MPI_Aint>(sizeof(float)),
                                               static_cast<int>(sizeof(float)), MPI_INFO_NULL, node_, &base, &window_));
        LOOM_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_));
        LOOM_MPI_CHECK(MPI_Comm_rank(node_, &rank_));
        parts_.resize(static_cast<std::size_t>(node_size));
        for (int r = 0; r < node_size; ++r) {
            MPI_Aint bytes = 0;
            int unit = 0;
            void* at = nullptr;
            LOOM_MPI_CHECK(MPI_Win_shared_query(window_, r, &bytes, &unit, &at));
            parts_[static_cast<std::size_t>(r)] = {static_cast<float*>(at),
                                                   static_cast<std::size_t>(bytes) / sizeof(float)};
        }
    }

    SharedWindow(const SharedWindow&) = delete;
    SharedWindow& operator=(const SharedWindow&) = delete;

    // Collective: no process frees its part while another may still read it.
    // (A destructor cannot throw, so this one waits in MPI's own calls; call
    // publish() first to fail a stalled peer with one sentence.)
    ~SharedWindow() {
        MPI_Win_unlock_all(window_);
        MPI_Win_free(&window_);
        MPI_Comm_free(&node_);
    }

    // This process's part, to write.
    [[nodiscard]] std::span<float> mine() const { return parts_[static_cast<std::size_t>(rank_)]; }
    // Process `rank`'s part (its rank on the node communicator, which keeps
    // the order of the one given), to read after publish().
    [[nodiscard]] std::span<const float> of(int rank) const {
        LOOM_CHECK(rank >= 0 && rank < static_cast<int>(parts_.size()), "SharedWindow: process ", rank,
                   " is not in 0..", parts_.size() - 1);
        return parts_[static_cast<std::size_t>(rank)];
    }

    // Collective: every process's writes so far are visible to every process.
    void publish() const {
        LOOM_MPI_CHECK(MPI_Win_sync(window_));
        comm_->barrier();
        LOOM_MPI_CHECK(MPI_Win_sync(window_));
    }

private:
    Mpi* comm_;
    MPI_Comm node_ = MPI_COMM_NULL;
    MPI_Win window_ = MPI_WIN_NULL;
    int rank_ = 0;
    std::vector<std::span<float>> parts_;
};

}  // namespace loom::comm
