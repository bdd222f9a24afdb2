// Peer memory pooling, where the weights live (EnergonAI): a GPT served by
// one engine whose chosen blocks' weights are kept outside the engine's own
// memory, in a pool (the host's memory, for a GPU engine) or in a peer's
// memory (another replica that holds those blocks itself, over NVLink on a
// GPU). The engine keeps only the rest: embeddings, head and the blocks not
// pooled. infer/block_prefetcher.hpp then copies each pooled block into a
// small staging ring a few blocks ahead of the one computing, on a copy
// thread (a copy stream on a GPU), so the engine computes from its own memory.
//
// Every Param of the model is bound to where its values are: the resident
// ones to this object's buffer, the pooled ones to the pool or to the peer's
// buffer. So the model is always complete: an engine without a prefetcher
// reads the pooled blocks where they lie (zero-copy), one with it reads the
// staged copies. Both compute on the same bits, so both equal the resident
// model's tokens.
//
// A peer is another PooledGpt of the same process (rank threads: two replicas
// that each hold half the blocks serve with one model's weights between them),
// or another process's resident buffer mapped into this one: build each
// replica's resident values in a comm::SharedWindow (comm/shared_window_mpi.hpp,
// MPI_Win_allocate_shared among the processes of one node) and pool_from the
// peer's part of it with the list of blocks the peer pools.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"
#include "loom/gpt/model.hpp"

namespace loom::infer {

// Where a block's weights are: in the engine's memory, in the pool it owns
// (host memory), or in a peer's memory.
enum class BlockHome : std::uint8_t { resident, pool, peer };

[[nodiscard]] constexpr const char* to_string(BlockHome home) noexcept {
    switch (home) {
        case BlockHome::resident: return "resident";
        case BlockHome::pool: return "pool";
        case BlockHome::peer: return "peer";
    }
    return "unknown-home";
}

inline std::ostream& operator<<(std::ostream& out, BlockHome home) { return out << to_string(home); }

class PooledGpt {
public:
    // `whole`: the model's values in serial order (ParamArena::values() of a
    // whole model, or what gpt::load_checkpoint reads). Blocks `pooled`
    // (distinct indices in [0, layers)) are copied to a pool this object
    // owns, the rest to its resident buffer.
    PooledGpt(const gpt::Config& config, std::span<const float> whole, std::vector<std::int64_t> pooled)
        : PooledGpt(config, whole, std::move(pooled), std::span<float>{}) {}

    // The same, with the resident values in `resident_storage` (resident_floats
    // long), which must outlive this object: memory a peer process can map,
    // such as comm::SharedWindow's (comm/shared_window_mpi.hpp).
    PooledGpt(const gpt::Config& config, std::span<const float> whole, std::vector<std::int64_t> pooled,
              std::span<float> resident_storage)
        : config_(config), model_(gpt::make_model(config)), pooled_(std::move(pooled)) {
        config.validate();
        LOOM_CHECK(static_cast<std::int64_t>(whole.size()) == config.parameters(), "PooledGpt: ", whole.size(),
                   " values given but ", config, " has ", config.parameters(),
                   "; give the whole model's values in serial order");
        std::sort(pooled_.begin(), pooled_.end());
        for (std::size_t i = 0; i < pooled_.size(); ++i) {
            LOOM_CHECK(pooled_[i] >= 0 && pooled_[i] < config.layers, "PooledGpt: pooled block ", pooled_[i],
                       " does not exist; the model has blocks 0..", config.layers - 1);
            LOOM_CHECK(i == 0 || pooled_[i] != pooled_[i - 1], "PooledGpt: block ", pooled_[i],
                       " is pooled twice; list each block once");
        }
        const std::int64_t L = config.layers, block = block_floats(), embeddings = embedding_floats(config);
        const auto count = static_cast<std::int64_t>(pooled_.size());
        homes_.assign(static_cast<std::size_t>(L), BlockHome::resident);
        for (const std::int64_t b : pooled_) homes_[static_cast<std::size_t>(b)] = BlockHome::pool;
        const std::int64_t resident_count = resident_floats(config, pooled_);
        if (resident_storage.data() == nullptr) {
            owned_.resize(static_cast<std::size_t>(resident_count));
            resident_ = owned_;
        } else {
            LOOM_CHECK(static_cast<std::int64_t>(resident_storage.size()) == resident_count, "PooledGpt: ",
                       resident_storage.size(), " floats of resident storage for ", resident_count,
                       " resident values; give resident_floats(config, pooled) of them");
            resident_ = resident_storage;
        }
        pool_.resize(static_cast<std::size_t>(count * block));
        // The resident buffer holds the embeddings, the resident blocks and the tail in serial order.
        float* next = resident_.data();
        float* next_pooled = pool_.data();
        const auto take = [&](std::int64_t from, std::int64_t n, float*& to) {
            std::copy_n(whole.data() + from, n, to);
            const float* at = to;
            to += n;
            return at;
        };
        const float* embed_values = take(0, embeddings, next);
        sources_.resize(static_cast<std::size_t>(L));
        for (std::int64_t b = 0; b < L; ++b) {
            const std::int64_t from = embeddings + b * block;
            const auto at = static_cast<std::size_t>(b);
            sources_[at] = take(from, block, homes_[at] == BlockHome::resident ? next : next_pooled);
            bind(model_.blocks[at], sources_[at]);
        }
        const float* tail_values = take(embeddings + L * block, config.parameters() - embeddings - L * block, next);
        bind(model_.embed, embed_values);
        bind(model_.ln_f, tail_values);
        bind(model_.head, tail_values + 2 * config.width);
    }

    PooledGpt(const PooledGpt&) = delete;
    PooledGpt& operator=(const PooledGpt&) = delete;

    // From now on the pooled blocks are read from `peer`'s memory and this
    // object's pool is freed: `peer` serves the same config and holds each of
    // them resident. Call it before an engine or a prefetcher uses either.
    // Two replicas may pool from each other (each holding what the other
    // pools); `peer` must outlive this object and not move. Both only read
    // the weights, so their engines may then run at once on different threads.
    void pool_from(const PooledGpt& peer) {
        LOOM_CHECK(peer.config_ == config_, "PooledGpt: the peer serves ", peer.config_, " but this model is ",
                   config_, "; pool blocks with a replica of the same model");
        pool_from(peer.resident_, peer.pooled_);
    }

    // The same for a peer known only by its resident values (another
    // process's, mapped into this one) and the blocks it pools: its resident
    // values are laid out as this class lays them out for the same config.
    void pool_from(std::span<const float> peer_resident, std::vector<std::int64_t> peer_pooled) {
        std::sort(peer_pooled.begin(), peer_pooled.end());
        const std::int64_t block = block_floats(), expected = resident_floats(config_, peer_pooled);
        LOOM_CHECK(static_cast<std::int64_t>(peer_resident.size()) == expected, "PooledGpt: the peer's resident "
                   "values are ", peer_resident.size(), " floats but a replica of ", config_, " pooling ",
                   peer_pooled.size(), " blocks holds ", expected, "; give the peer's resident buffer whole");
        for (const std::int64_t b : pooled_)
            LOOM_CHECK(!std::binary_search(peer_pooled.begin(), peer_pooled.end(), b), "PooledGpt: block ", b,
                       " is pooled here but the peer pools it too; pool only blocks the peer keeps resident");
        const std::int64_t embeddings = embedding_floats(config_);
        for (const std::int64_t b : pooled_) {
            // The peer's resident buffer: the embeddings, then its resident blocks in order.
            const auto before = std::lower_bound(peer_pooled.begin(), peer_pooled.end(), b) - peer_pooled.begin();
            const auto at = static_cast<std::size_t>(b);
            homes_[at] = BlockHome::peer;
            sources_[at] = peer_resident.data() + embeddings + (b - before) * block;
            bind(model_.blocks[at], sources_[at]);
        }
        pool_ = {};
    }

    // The floats a replica of `config` pooling `pooled` (distinct blocks) keeps resident.
    [[nodiscard]] static std::int64_t resident_floats(const gpt::Config& config, std::span<const std::int64_t> pooled) {
        return config.parameters() - static_cast<std::int64_t>(pooled.size()) * gpt_block_floats(config);
    }

    [[nodiscard]] gpt::Model& model() noexcept { return model_; }
    [[nodiscard]] const gpt::Config& config() const noexcept { return config_; }
    [[nodiscard]] BlockHome home(std::int64_t block) const { return homes_[checked(block)]; }
    // The pooled blocks, ascending: the order a forward pass reads them in.
    [[nodiscard]] const std::vector<std::int64_t>& pooled() const noexcept { return pooled_; }
    // Block `block`'s values in serial order, wherever they are.
    [[nodiscard]] std::span<const float> block_values(std::int64_t block) const {
        return {sources_[checked(block)], static_cast<std::size_t>(block_floats())};
    }
    [[nodiscard]] std::int64_t block_floats() const noexcept { return gpt_block_floats(config_); }
    // Bytes in the engine's memory (resident) and outside it (pool or peer).
    [[nodiscard]] std::int64_t resident_bytes() const noexcept {
        return static_cast<std::int64_t>(resident_.size() * sizeof(float));
    }
    [[nodiscard]] std::int64_t pooled_bytes() const noexcept {
        return static_cast<std::int64_t>(pooled_.size()) * block_floats() * static_cast<std::int64_t>(sizeof(float));
    }

    // Points block `block`'s Params at `values` (its serial order: the
    // staging copy while it computes), or back at its home.
    void bind_block(std::int64_t block, const float* values) { bind(model_.blocks[checked(block)], values); }
    void bind_block_home(std::int64_t block) { bind_block(block, sources_[checked(block)]); }

    friend std::ostream& operator<<(std::ostream& out, const PooledGpt& p) {
        out << "PooledGpt(" << p.config_.layers << " blocks, pooled {";
        for (std::size_t i = 0; i < p.pooled_.size(); ++i) out << (i > 0 ? "," : "") << p.pooled_[i];
        return out << "} in " << (p.pooled_.empty() ? BlockHome::resident : p.homes_[p.pooled_.front()]) << ", "
                   << p.resident_bytes() << " bytes resident, " << p.pooled_bytes() << " pooled)";
    }

    // A GPT block's parameter count: its two LayerNorms, qkv, proj and the MLP's two Linears.
    [[nodiscard]] static constexpr std::int64_t gpt_block_floats(const gpt::Config& config) {
        return 12 * config.width * config.width + 13 * config.width;
    }

private:
    // The token and position tables, first in the serial order.
    [[nodiscard]] static constexpr std::int64_t embedding_floats(const gpt::Config& config) {
        return (config.vocab + config.seq) * config.width;
    }

    [[nodiscard]] std::size_t checked(std::int64_t block) const {
        LOOM_CHECK(block >= 0 && block < config_.layers, "PooledGpt: block ", block,
                   " does not exist; the model has blocks 0..", config_.layers - 1);
        return static_cast<std::size_t>(block);
    }

    // Each Param of `part`, in reflection (serial) order, at the next values.
    template <class Part>
    static void bind(Part& part, const float* values) {
        reflect::visit_params(part, [&](Param& p, std::string_view) {
            p.value = Tensor::of(values, p.shape);
            values += p.numel();
        });
    }

    gpt::Config config_;
    gpt::Model model_;
    std::vector<std::int64_t> pooled_;
    std::vector<BlockHome> homes_;
    std::vector<const float*> sources_;  // each block's values, wherever they are
    std::vector<float> owned_;     // the resident values, unless the caller gave storage
    std::span<float> resident_;    // the embeddings, the resident blocks and the tail, in serial order
    std::vector<float> pool_;
};

}  // namespace loom::infer
