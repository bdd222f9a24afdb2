// serve_gpt's engine thread: the one thread that owns the model, the KV
// cache and loom::infer::Batcher (or, with a draft model,
// loom::infer::SpeculativeBatcher: a step is then a speculative round and
// may give a request several tokens). HTTP connections (other threads) hand it
// jobs and cancellations through a queue under a mutex; between two packed
// forwards it takes them, so a request that arrives while others run joins
// the continuous batch at the next step. Each job's pieces of text go back
// through the job's own `deliver` (called on the engine thread; the HTTP
// side posts them to its own thread).
//
// Tensor-parallel (Engine::TensorParallel): the engine thread becomes rank 0
// of a group of rank threads (loom::comm::ThreadWorld), each holding its
// Megatron shard (infer/tensor_parallel_gpt.hpp) and its own Batcher. Every
// Batcher must see the same submits and cancels between the same steps, so
// rank 0 alone reads the queue: before each step it broadcasts the step's
// Orders (the requests that join, in order, and the batcher ids that leave:
// client cancels and stop sequences), and every rank, rank 0 included,
// applies exactly those and steps. The requests themselves travel in the
// broadcast, so no rank can hold other ones. While idle, rank 0 broadcasts
// empty Orders every second, so the others' wait never reaches the
// communicator's timeout (which stays on, to name a rank that is stuck).
//
// Pipeline-parallel (Engine::Pipeline): the engine thread becomes stage 0 of
// N stage threads (infer/pipeline_parallel_gpt.hpp), and its batcher is
// loom::infer::PipelinedBatcher: stage 0 alone admits and cancels, and each
// group's meta message carries what the later stages need (slots, tokens, each
// request's sampling), so nothing else is broadcast. A step then reports one
// group's tokens while the other groups are in later stages. While idle,
// stage 0 sends the stages a keep-alive every second, for the same timeout.
// With tp too, every stage is a tp group and each tp position runs its own
// pipeline; stage 0's tp rank 0 leads its tp peers as a tensor-parallel
// rank 0 does (the orders broadcast, keep-alives at the same points), so the
// pipelines step alike and the stages' sums pair up.
//
// Stop sequences are matched here, on the tokens, so that a request that
// hits one leaves the batch at the next step; the text is held back while it
// ends in the beginning of a stop sequence, so a streamed reply never shows
// part of one.
#pragma once

#include <loom/comm/any_comm.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/batcher.hpp>
#include <loom/infer/cape.hpp>
#include <loom/infer/draft_engine.hpp>
#include <loom/infer/cached_gpt.hpp>
#include <loom/infer/pipeline_stage.hpp>
#include <loom/infer/pipelined_batcher.hpp>
#include <loom/infer/speculative_batcher.hpp>
#include <loom/infer/tensor_parallel_gpt.hpp>
#include <loom/nn/param_arena.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace serve_gpt {

// What a job hears back: new text of one choice, and its end.
struct Piece {
    std::size_t choice = 0;
    std::vector<std::int32_t> text;              // the choice's next tokens to show
    std::optional<loom::infer::Finish> finish;   // set on its last piece
    std::int64_t generated = 0;                  // tokens generated so far (stop sequences included)
    std::string error;                           // the engine failed this job (nothing else is set)
};

inline Piece failure(std::string why) {
    Piece piece;
    piece.error = std::move(why);
    return piece;
}

struct Job {
    std::vector<loom::infer::Request> choices;   // one request per choice
    std::vector<std::vector<std::int32_t>> stops;
    std::function<void(Piece)> deliver;          // called on the engine thread
};

// What every rank of a tensor-parallel engine does before one step, as rank
// 0 decided it: submit these jobs' choices (in this order, a job's choices
// together), then cancel these batcher ids; or end.
struct Orders {
    std::vector<std::vector<loom::infer::Request>> jobs;
    std::vector<std::uint64_t> cancels;
    bool quit = false;
};

namespace wire {

// Orders travel as one array of int32 (a broadcast needs one dtype); wider
// fields go as two halves and floats as their bits, so every rank rebuilds
// the same values to the bit.
inline void put64(std::vector<std::int32_t>& out, std::uint64_t value) {
    out.push_back(static_cast<std::int32_t>(static_cast<std::uint32_t>(value)));
    out.push_back(static_cast<std::int32_t>(static_cast<std::uint32_t>(value >> 32)));
}

inline void put_tokens(std::vector<std::int32_t>& out, const std::vector<std::int32_t>& tokens) {
    out.push_back(static_cast<std::int32_t>(tokens.size()));
    out.insert(out.end(), tokens.begin(), tokens.end());
}

// Reads what put* wrote, in the same order.
class Reader {
public:
    explicit Reader(std::span<const std::int32_t> in) : in_(in) {}
    std::int32_t next() { return in_[at_++]; }
    std::uint64_t next64() {
        const auto low = static_cast<std::uint32_t>(next());
        const auto high = static_cast<std::uint32_t>(next());
        return (std::uint64_t{high} << 32) | low;
    }
    std::vector<std::int32_t> tokens() {
        const auto n = static_cast<std::size_t>(next());
        std::vector<std::int32_t> out(in_.begin() + static_cast<std::ptrdiff_t>(at_),
                                      in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
        at_ += n;
        return out;
    }

private:
    std::span<const std::int32_t> in_;
    std::size_t at_ = 0;
};

inline std::vector<std::int32_t> pack(const Orders& orders) {
    std::vector<std::int32_t> out{orders.quit ? 1 : 0, static_cast<std::int32_t>(orders.jobs.size()),
                                  static_cast<std::int32_t>(orders.cancels.size())};
    for (const std::uint64_t id : orders.cancels) put64(out, id);
    for (const auto& job : orders.jobs) {
        out.push_back(static_cast<std::int32_t>(job.size()));
        for (const loom::infer::Request& r : job) {
            put_tokens(out, r.prompt);
            put64(out, static_cast<std::uint64_t>(r.max_new_tokens));
            put_tokens(out, r.stop_tokens);
            out.push_back(r.sampling.greedy ? 1 : 0);
            out.push_back(std::bit_cast<std::int32_t>(r.sampling.temperature));
            put64(out, static_cast<std::uint64_t>(r.sampling.top_k));
            out.push_back(std::bit_cast<std::int32_t>(r.sampling.top_p));
            put64(out, r.sampling.seed);
        }
    }
    return out;
}

inline Orders unpack(std::span<const std::int32_t> in) {
    Reader read(in);
    Orders orders;
    orders.quit = read.next() != 0;
    orders.jobs.resize(static_cast<std::size_t>(read.next()));
    orders.cancels.resize(static_cast<std::size_t>(read.next()));
    for (std::uint64_t& id : orders.cancels) id = read.next64();
    for (auto& job : orders.jobs) {
        job.resize(static_cast<std::size_t>(read.next()));
        for (loom::infer::Request& r : job) {
            r.prompt = read.tokens();
            r.max_new_tokens = static_cast<std::int64_t>(read.next64());
            r.stop_tokens = read.tokens();
            r.sampling.greedy = read.next() != 0;
            r.sampling.temperature = std::bit_cast<float>(read.next());
            r.sampling.top_k = static_cast<std::int64_t>(read.next64());
            r.sampling.top_p = std::bit_cast<float>(read.next());
            r.sampling.seed = read.next64();
        }
    }
    return orders;
}

}  // namespace wire

// Rank 0's orders to every rank of `group` (rank 0 passes them in, the
// others get them back): their length, then the packed array.
inline void share_orders(loom::comm::AnyComm& group, Orders& orders) {
    std::vector<std::int32_t> packed;
    if (group.rank() == 0) packed = wire::pack(orders);
    std::int32_t size = static_cast<std::int32_t>(packed.size());
    group.broadcast(loom::Tensor::of(&size, loom::Shape{1}), 0);
    packed.resize(static_cast<std::size_t>(size));
    group.broadcast(loom::Tensor::of(packed.data(), loom::Shape{size}), 0);
    if (group.rank() != 0) orders = wire::unpack(packed);
}

// Submits a job's choices in order and returns their ids; if the batcher
// refuses one, those already submitted leave again and `why` says why. Every
// rank runs exactly this on the same choices, so the ids stay the same on all.
template <class AnyBatcher>
std::vector<std::uint64_t> submit_job(AnyBatcher& batcher, const std::vector<loom::infer::Request>& choices,
                                      std::string& why) {
    std::vector<std::uint64_t> ids;
    try {
        for (const loom::infer::Request& choice : choices) ids.push_back(batcher.submit(choice));
    } catch (const std::exception& e) {
        for (const std::uint64_t id : ids) (void)batcher.cancel(id);
        why = e.what();
        ids.clear();
    }
    return ids;
}

class Engine {
public:
    // The whole model, on the engine thread.
    explicit Engine(loom::infer::CachedGpt& model) {
        launch([this, &model] {
            loom::infer::Batcher batcher(model);
            mark_ready();
            lead(batcher, false, [](Orders&) {});
        });
    }
    // Speculative decoding: `draft` (a plain or a GliDe draft) proposes
    // `gamma` tokens per target pass; with `cape`, a tree of candidates.
    Engine(loom::infer::CachedGpt& target, loom::infer::DraftEngine& draft, std::int64_t gamma,
           std::optional<loom::infer::CapeConfig> cape = std::nullopt) {
        launch([this, &target, &draft, gamma, cape] {
            loom::infer::SpeculativeBatcher batcher(target, draft, gamma, 0, cape);
            mark_ready();
            lead(batcher, false, [](Orders&) {});
        });
    }

    // The target served tensor-parallel on `ranks` rank threads: each cuts
    // its shard from `whole` (the whole model's values in serial order, as
    // ParamArena::values() holds them) and keeps a KV cache of its heads,
    // `slots` sequences of config.seq positions. With a draft (whole,
    // shared read-only by the ranks; each keeps its own cache of it) every
    // rank runs the same speculative rounds. Everything here must outlive
    // the Engine.
    struct TensorParallel {
        const loom::gpt::Config* config = nullptr;
        std::span<const float> whole;
        int ranks = 2;
        std::int64_t slots = 8, block_size = 16;
        loom::gpt::Model* draft = nullptr;
        const loom::gpt::Config* draft_config = nullptr;
        std::int64_t gamma = 4;
        std::optional<loom::infer::CapeConfig> cape;  // CaPE's trees, on every rank
    };
    explicit Engine(const TensorParallel& tp) {
        launch([this, tp] {
            loom::comm::ThreadWorld(tp.ranks).run([&](loom::comm::ThreadComm& comm) {
                loom::comm::AnyComm group = loom::comm::AnyComm::view(comm);
                const loom::gpt::Config& config = *tp.config;
                loom::gpt::Model shard = loom::gpt::make_model(config);
                loom::infer::shard_for_serving(shard, group.rank(), group.size());
                loom::nn::ParamArena arena(shard);
                loom::infer::load_whole_values(shard, tp.whole);
                loom::infer::KvCache cache =
                    loom::infer::serving_cache(config, group.size(), tp.slots, config.seq, tp.block_size);
                loom::infer::CachedGpt engine(shard, config, cache, group);
                if (tp.draft == nullptr) {
                    loom::infer::Batcher batcher(engine);
                    serve(batcher, group);
                    return;
                }
                const loom::gpt::Config& shape = *tp.draft_config;
                loom::infer::KvCache draft_cache(shape.layers, shape.width, tp.slots, shape.seq, tp.block_size);
                loom::infer::CachedGpt draft_engine(*tp.draft, shape, draft_cache);
                loom::infer::SpeculativeBatcher batcher(engine, draft_engine, tp.gamma, 0, tp.cape);
                serve(batcher, group);
            });
        });
    }

    // The target served pipeline-parallel in `stages` stage threads: stage s
    // copies blocks [s L/stages, (s+1) L/stages) from `whole` and keeps a KV
    // cache of them, `slots` sequences of config.seq positions. With `tp` > 1
    // each stage is a tp group of `tp` rank threads, each holding its Megatron
    // shard of the stage (stages x tp threads in all). Everything here must
    // outlive the Engine.
    struct Pipeline {
        const loom::gpt::Config* config = nullptr;
        std::span<const float> whole;
        int stages = 2;
        std::int64_t slots = 8, block_size = 16;
        int tp = 1;
        std::int64_t prefill_tokens = 0;  // the most prompt tokens a step admits (0: no limit)
    };
    explicit Engine(const Pipeline& pp) {
        launch([this, pp] {
            loom::comm::ThreadWorld(pp.stages * pp.tp).run([&](loom::comm::ThreadComm& comm) {
                loom::comm::Mesh<loom::comm::ThreadComm> mesh(comm, {{"pp", pp.stages}, {"tp", pp.tp}});
                loom::comm::AnyComm world = loom::comm::AnyComm::view(comm);
                loom::comm::AnyComm group = loom::comm::AnyComm::view(mesh.axis("pp"));
                loom::comm::AnyComm tp = loom::comm::AnyComm::view(mesh.axis("tp"));
                const loom::gpt::Config& config = *pp.config;
                const loom::infer::PipelineStage where = loom::infer::pipeline_stage(config, group.rank(), group.size());
                loom::gpt::Model stage = loom::infer::make_stage_model(config, where);
                loom::infer::shard_for_serving(stage, tp.rank(), tp.size());  // a tp group of 1 keeps it whole
                loom::nn::ParamArena arena(stage);
                loom::infer::load_stage_values(stage, config, where, pp.whole);
                loom::infer::KvCache cache(where.count, config.width / pp.tp, pp.slots, config.seq, pp.block_size);
                loom::infer::CachedGpt engine(stage, config, cache, tp, where);
                Orders first;  // every stage is built before the server says it listens
                share_orders(world, first);
                if (group.rank() != 0) return loom::infer::serve_pipeline_stage(engine, group);
                // Stage 0: one PipelinedBatcher per tp rank (its destructor ends its pipeline's later
                // stages); tp rank 0 leads, the others follow its orders, keep-alives included, so the tp
                // groups' pipelines make the same calls in the same order.
                loom::infer::PipelinedBatcher batcher(engine, group, {.prefill_tokens = pp.prefill_tokens});
                const auto idle_keep_alive = [&](const Orders& orders) {
                    if (!orders.quit && orders.jobs.empty() && orders.cancels.empty() && batcher.idle())
                        batcher.keep_alive();
                };
                if (tp.rank() != 0) return follow(batcher, tp, idle_keep_alive);
                mark_ready();
                lead(batcher, true, [&](Orders& orders) {
                    if (pp.tp > 1) share_orders(tp, orders);
                    idle_keep_alive(orders);
                });
            });
        });
    }

    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;
    ~Engine() { stop(); }

    void submit(std::shared_ptr<Job> job) {
        {
            const std::lock_guard lock(mutex_);
            if (!broken_) {
                incoming_.push_back(std::move(job));
                job = nullptr;
            }
        }
        if (job) {  // the engine has failed: nothing more will run
            job->deliver(failure(broken_message()));
            return;
        }
        wake_.notify_one();
    }

    // The job's choices leave the batch (or never join it) before the next
    // step; pieces delivered before that may still arrive.
    void cancel(std::shared_ptr<Job> job) {
        {
            const std::lock_guard lock(mutex_);
            cancels_.push_back(std::move(job));
        }
        wake_.notify_one();
    }

    // What the engine has done, for the summary line: steps run (forwards, or
    // speculative rounds), tokens generated, the most requests one step
    // carried, and with a draft what it proposed and the target accepted.
    struct Stats {
        std::int64_t steps = 0, tokens = 0;
        std::size_t widest = 0;
        std::optional<loom::infer::SpeculativeStats> speculative;
    };
    [[nodiscard]] Stats stats() const {
        const std::lock_guard lock(mutex_);
        return stats_;
    }

    // Ends the thread (and the rank threads); jobs still running are dropped
    // (the server stops only once its connections have their answers).
    void stop() {
        {
            const std::lock_guard lock(mutex_);
            quit_ = true;
        }
        wake_.notify_one();
        if (thread_.joinable()) thread_.join();
    }

private:
    struct Running {
        std::shared_ptr<Job> job;
        std::size_t choice = 0;
        std::vector<std::int32_t> tokens;  // generated so far
        std::size_t shown = 0;             // of which delivered
    };

    // Rank 0 broadcasts empty Orders this often while idle: the other ranks
    // wait in that broadcast, and a wait longer than the communicator's
    // timeout (minutes) would fail the group.
    static constexpr std::chrono::seconds heartbeat{1};

    // Starts the engine thread on `body` and waits until it serves (or has
    // failed to start: a rank's setup threw), so that a server prints its
    // address only once the model is ready.
    template <class Body>
    void launch(Body body) {
        thread_ = std::thread([this, body = std::move(body)]() mutable {
            try {
                body();
            } catch (const std::exception& e) {
                break_down(e.what());
            }
        });
        std::unique_lock lock(mutex_);
        ready_changed_.wait(lock, [&] { return ready_ || broken_; });
        if (ready_) return;
        const std::string why = *broken_;
        lock.unlock();
        thread_.join();
        throw std::runtime_error(why);
    }

    void mark_ready() {
        {
            const std::lock_guard lock(mutex_);
            ready_ = true;
        }
        ready_changed_.notify_all();
    }

    // The engine (or a rank) failed: every job in it or still queued hears
    // why, and so does every later one. Called on the engine thread once the
    // ranks have ended.
    void break_down(const std::string& why) {
        std::deque<std::shared_ptr<Job>> queued;
        {
            const std::lock_guard lock(mutex_);
            broken_ = why;
            queued.swap(incoming_);
        }
        ready_changed_.notify_all();
        std::set<const Job*> told;
        for (auto& [id, r] : running_)
            if (told.insert(r.job.get()).second) r.job->deliver(failure(why));
        running_.clear();
        for (const auto& job : queued) job->deliver(failure(why));
    }

    [[nodiscard]] std::string broken_message() const {
        const std::lock_guard lock(mutex_);
        return broken_.value_or("the engine has stopped");
    }

    // A tensor-parallel rank: rank 0 leads, the others follow its orders.
    template <class AnyBatcher>
    void serve(AnyBatcher& batcher, loom::comm::AnyComm& group) {
        Orders first;  // every rank has built its shard before the server says it listens
        share_orders(group, first);
        if (group.rank() != 0) return follow(batcher, group, [](const Orders&) {});
        mark_ready();
        lead(batcher, true, [&](Orders& orders) { share_orders(group, orders); });
    }

    // Rank 0, or the whole model's thread: reads the queue, decides the
    // step's orders, shares them with the other ranks (`share`; with `ranks`
    // there are some: the wait then wakes every heartbeat, and a failed step
    // is the group's, ending every rank), applies them and steps; then turns
    // the step's tokens into pieces.
    template <class AnyBatcher, class Share>
    void lead(AnyBatcher& batcher, bool ranks, Share share) {
        std::unique_lock lock(mutex_);
        for (;;) {
            const auto work = [&] {
                return quit_ || !incoming_.empty() || !cancels_.empty() || !leaving_.empty() || !batcher.idle();
            };
            if (ranks) wake_.wait_for(lock, heartbeat, work);
            else wake_.wait(lock, work);
            Orders orders;
            orders.quit = quit_;
            std::vector<std::shared_ptr<Job>> incoming(incoming_.begin(), incoming_.end()), cancels;
            incoming_.clear();
            cancels.swap(cancels_);
            lock.unlock();
            if (!orders.quit) {
                for (std::shared_ptr<Job>& job : incoming) {
                    orders.jobs.push_back(job->choices);
                    start(batcher, std::move(job));
                }
                for (const std::shared_ptr<Job>& job : cancels) drop(job.get(), orders.cancels);
                orders.cancels.insert(orders.cancels.end(), leaving_.begin(), leaving_.end());
                leaving_.clear();
            }
            share(orders);
            if (orders.quit) return;
            for (const std::uint64_t id : orders.cancels) (void)batcher.cancel(id);
            if (!batcher.idle()) {
                if (ranks) {
                    step(batcher);  // a failure here is the group's: it ends every rank (break_down)
                } else {
                    try {
                        step(batcher);
                    } catch (const std::exception& e) {  // not expected: requests are checked before they come here
                        fail_all(batcher, e.what());
                    }
                }
            }
            lock.lock();
        }
    }

    // Ranks 1..N-1: rank 0's orders, applied as rank 0 applied them; `after_share`
    // is what rank 0's share did after sending them (a pipeline's keep-alive).
    template <class AnyBatcher, class AfterShare>
    static void follow(AnyBatcher& batcher, loom::comm::AnyComm& group, AfterShare after_share) {
        for (;;) {
            Orders orders;
            share_orders(group, orders);
            if (orders.quit) return;
            std::string refused;
            for (const auto& job : orders.jobs) (void)submit_job(batcher, job, refused);
            after_share(orders);
            for (const std::uint64_t id : orders.cancels) (void)batcher.cancel(id);
            if (!batcher.idle()) (void)batcher.step();
        }
    }

    void step(loom::infer::Batcher& batcher) {
        const auto events = batcher.step();
        for (const loom::infer::Batcher::Event& e : events) advance(e.id, std::span(&e.token, 1), e.finish);
        record(events.size(), static_cast<std::int64_t>(events.size()), std::nullopt);
    }

    void step(loom::infer::PipelinedBatcher& batcher) {  // one group's tokens
        const auto events = batcher.step();
        for (const loom::infer::PipelinedBatcher::Event& e : events) advance(e.id, std::span(&e.token, 1), e.finish);
        record(events.size(), static_cast<std::int64_t>(events.size()), std::nullopt);
    }

    void step(loom::infer::SpeculativeBatcher& batcher) {
        const auto events = batcher.step();
        std::int64_t tokens = 0;
        for (const loom::infer::SpeculativeBatcher::Event& e : events) {
            tokens += static_cast<std::int64_t>(e.tokens.size());
            advance(e.id, e.tokens, e.finish);
        }
        record(events.size(), tokens, batcher.stats());
    }

    void record(std::size_t requests, std::int64_t tokens, std::optional<loom::infer::SpeculativeStats> speculative) {
        const std::lock_guard lock(mutex_);
        stats_.steps += 1;
        stats_.tokens += tokens;
        stats_.widest = std::max(stats_.widest, requests);
        stats_.speculative = speculative;
    }

    template <class AnyBatcher>
    void start(AnyBatcher& batcher, std::shared_ptr<Job> job) {
        std::string refused;
        const std::vector<std::uint64_t> ids = submit_job(batcher, job->choices, refused);
        if (ids.empty()) {
            job->deliver(failure(refused));
            return;
        }
        for (std::size_t c = 0; c < ids.size(); ++c) running_[ids[c]] = Running{job, c, {}, 0};
    }

    // A job's running choices leave: their ids join `leaving`.
    void drop(const Job* job, std::vector<std::uint64_t>& leaving) {
        for (auto it = running_.begin(); it != running_.end();) {
            if (it->second.job.get() == job) {
                leaving.push_back(it->first);
                it = running_.erase(it);
            } else {
                ++it;
            }
        }
    }

    template <class AnyBatcher>
    void fail_all(AnyBatcher& batcher, const std::string& why) {
        for (auto& [id, r] : running_) {
            (void)batcher.cancel(id);
            r.job->deliver(failure(why));
        }
        running_.clear();
    }

    // Length of the longest stop sequence that `tokens` ends with (0: none):
    // the text ends where the earliest-starting one begins.
    static std::size_t ends_with_stop(const std::vector<std::int32_t>& tokens, const Job& job) {
        std::size_t longest = 0;
        for (const auto& s : job.stops)
            if (s.size() > longest && s.size() <= tokens.size() &&
                std::equal(s.begin(), s.end(), tokens.end() - static_cast<std::ptrdiff_t>(s.size())))
                longest = s.size();
        return longest;
    }

    // Tokens at the end that begin some stop sequence: not shown yet.
    static std::size_t held_back(const std::vector<std::int32_t>& tokens, const Job& job) {
        std::size_t held = 0;
        for (const auto& s : job.stops)
            for (std::size_t k = std::min(s.size() - 1, tokens.size()); k > held; --k)
                if (std::equal(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k),
                               tokens.end() - static_cast<std::ptrdiff_t>(k))) {
                    held = k;
                    break;
                }
        return held;
    }

    // A step's tokens for request `id` (one, or a speculative round's
    // several); `finished` if the batcher says the last of them ends it.
    void advance(std::uint64_t id, std::span<const std::int32_t> tokens, std::optional<loom::infer::Finish> finished) {
        const auto it = running_.find(id);
        if (it == running_.end()) return;
        Running& r = it->second;
        std::optional<loom::infer::Finish> finish;
        std::size_t end = 0;
        for (const std::int32_t token : tokens) {  // a stop sequence may end before the round's last token
            r.tokens.push_back(token);
            if (const std::size_t stop = ends_with_stop(r.tokens, *r.job)) {
                finish = loom::infer::Finish::stop;
                end = r.tokens.size() - stop;
                // It leaves the batch before the next step (on every rank: through the orders);
                // the tokens after the stop are dropped.
                if (!finished) leaving_.push_back(id);
                break;
            }
        }
        if (!finish) {
            finish = finished;
            end = r.tokens.size();
            if (!finish) end -= held_back(r.tokens, *r.job);
        }
        end = std::max(end, r.shown);
        Piece piece{.choice = r.choice, .text = {r.tokens.begin() + static_cast<std::ptrdiff_t>(r.shown),
                                                 r.tokens.begin() + static_cast<std::ptrdiff_t>(end)},
                    .finish = finish, .generated = static_cast<std::int64_t>(r.tokens.size()), .error = {}};
        r.shown = end;
        const std::shared_ptr<Job> job = r.job;
        if (finish) running_.erase(it);
        if (!piece.text.empty() || piece.finish) job->deliver(std::move(piece));
    }

    // The leading thread's alone: the running choices by batcher id, and the
    // ids that stop sequences ended, which leave at the next step.
    std::map<std::uint64_t, Running> running_;
    std::vector<std::uint64_t> leaving_;
    mutable std::mutex mutex_;      // guards the members below it
    std::condition_variable wake_, ready_changed_;
    std::deque<std::shared_ptr<Job>> incoming_;
    std::vector<std::shared_ptr<Job>> cancels_;
    bool quit_ = false, ready_ = false;
    std::optional<std::string> broken_;  // why the engine failed, once it has
    Stats stats_;
    std::thread thread_;            // started last, once the rest is built
};

}  // namespace serve_gpt
