// The executor: runs a model's step program on one rank. It owns where the
// parameters live for the strategy (a padded arena, or a shard and working
// slots for ZeRO), the AdamW state (whole or sharded), the micro-batch
// context, and the communication in flight; the step program says what to
// do, in which order. Every rank of the dp axis constructs one with the same
// model shape and strategy and calls step() with its own rows of the global
// batch; the losses, gradients and parameters are those of the serial run
// of the whole batch, up to the order of floating-point sums.
//
//   using S = loom::Strategy<loom::DataParallel<>, loom::ZeroShard<2>>;
//   auto exec = loom::exec::Executor<ThreadComm>::make<S>(model, mesh.axis("dp"), {.micro_batches = 4});
//   exec.initialize(seed);
//   float loss = exec.step(my_inputs, my_targets, lr);
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/init.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/memory.hpp"
#include "loom/exec/trace.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/units.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/parallel/strategy.hpp"
#include "loom/schedule/data_parallel.hpp"
#include "loom/schedule/verify.hpp"

namespace loom::exec {

struct ExecutorOptions {
    int micro_batches = 1;
    optim::AdamWConfig adamw{};
    bool trace = false;                      // record a Trace of every step
    std::vector<std::string> field_names{};  // names of the model's top-level fields, for traces
};

// What a Strategy asks of the executor, as run-time values.
struct ExecutionPlan {
    int zero_stage = 0;
    std::int64_t bucket_bytes = default_bucket_bytes;

    template <class S>
    [[nodiscard]] static ExecutionPlan of() {
        return ExecutionPlan{S::zero_stage, S::bucket_bytes};
    }
};

template <comm::Communicator C>
class Executor {
public:
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, C& dp, const ExecutorOptions& options = {}) {
        return Executor(model, dp, ExecutionPlan::of<Strategy>(), options);
    }

    // `model` must outlive the executor and not move; its Params are bound to
    // the executor's storage.
    template <class Model>
    Executor(Model& model, C& dp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : comm_(&dp),
          units_(nn::units_of(model, options.field_names)),
          stage_(plan.zero_stage),
          micro_batches_(options.micro_batches),
          adamw_(options.adamw),
          layout_(units_, dp.size(), plan.zero_stage == 3 ? parallel::Grouping::per_unit : parallel::Grouping::buckets,
                  plan.bucket_bytes),
          program_(schedule::data_parallel_program(layout_, static_cast<int>(units_.size()), plan.zero_stage,
                                                   options.micro_batches)),
          trace_(options.trace) {
        optim::check_config(options.adamw);
        schedule::verify(program_, layout_, static_cast<int>(units_.size()));
        initialize_range_ = [&model](std::uint64_t seed, std::span<float> out, std::int64_t first) {
            loom::initialize_range(model, seed, out, first);
        };
        allocate();
        pending_.resize(program_.code.size());
    }

    Executor(Executor&&) noexcept = default;
    Executor(const Executor&) = delete;
    Executor& operator=(const Executor&) = delete;

    [[nodiscard]] const schedule::StepProgram& program() const noexcept { return program_; }
    [[nodiscard]] const parallel::ShardLayout& layout() const noexcept { return layout_; }
    [[nodiscard]] const std::vector<nn::Unit>& units() const noexcept { return units_; }
    [[nodiscard]] int zero_stage() const noexcept { return stage_; }
    [[nodiscard]] int micro_batches() const noexcept { return micro_batches_; }
    [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return optimizer_steps_; }
    [[nodiscard]] Trace& trace() noexcept { return trace_; }
    [[nodiscard]] C& communicator() const noexcept { return *comm_; }

    // The parameters' initial values from the counter-based RNG: the serial
    // run's values, on every rank, whatever it keeps of them.
    void initialize(std::uint64_t seed) {
        const int r = comm_->rank();
        for (const auto& g : layout_.groups()) {
            const std::int64_t lo = stage_ == 3 ? r * g.block : 0;
            const std::int64_t hi = std::min(g.numel, stage_ == 3 ? lo + g.block : g.numel);
            float* base = stage_ == 3 ? value_shard_.data<float>() + g.shard_offset : values_.data<float>() + g.offset;
            if (hi > lo) initialize_range_(seed, {base, static_cast<std::size_t>(hi - lo)}, g.dense_offset + lo);
        }
        optimizer_steps_ = 0;
        std::fill_n(m_.data<float>(), m_.numel(), 0.0f);
        std::fill_n(v_.data<float>(), v_.numel(), 0.0f);
    }

    // One training step on this rank's rows of the global batch (inputs and
    // targets [rows, T], rows divisible by the micro-batches). Returns the
    // loss averaged over the global batch, the same on every rank.
    float step(const Tensor& inputs, const Tensor& targets, float lr) {
        LOOM_CHECK(inputs.rank() == 2 && targets.shape() == inputs.shape(), "Executor::step: inputs ", inputs.shape(),
                   " and targets ", targets.shape(), " must both be [rows, T]");
        const std::int64_t rows = inputs.dim(0);
        LOOM_CHECK(rows % micro_batches_ == 0, "Executor::step: ", rows, " rows on this rank do not split into ",
                   micro_batches_, " micro-batches; the rows per rank must be a multiple of the micro-batches");
        adamw_.lr = lr;
        optim::check_config(adamw_);
        inputs_ = inputs;
        targets_ = targets;
        rows_per_micro_batch_ = rows / micro_batches_;
        loss_sum_ = 0;
        for (std::size_t i = 0; i < program_.code.size(); ++i) execute(static_cast<int>(i), program_.code[i]);
        ++step_count_;
        return loss_;
    }

    [[nodiscard]] MemoryReport memory_report() const {
        MemoryReport report;
        report.rank = comm_->rank();
        report.parameters = (values_.nbytes() + value_shard_.nbytes());
        report.gradients = (grads_.nbytes() + grad_shard_.nbytes());
        report.optimizer_state = m_.nbytes() + v_.nbytes();
        report.activations = static_cast<std::int64_t>(context_.peak_bytes());
        for (const auto& s : grad_slots_) report.communication_buffers += s.nbytes();
        for (const auto& s : param_slots_) report.communication_buffers += s.nbytes();
        return report;
    }

    // Collective: the whole model's parameters and AdamW moments in the serial
    // (dense, reflection) order, on every rank: what a checkpoint holds.
    void gather_state(std::span<float> values, std::span<float> m, std::span<float> v) {
        Buffer<Host> padded(DType::f32, Shape{layout_.padded_size()});
        const auto whole = all(padded);
        auto gather_into_padded = [&](const Buffer<Host>& sharded) {
            for (const auto& g : layout_.groups())
                comm_->all_gather(Tensor::of(sharded.data<float>() + g.shard_offset, {g.block}),
                                  Tensor::of(whole.data() + g.offset, {g.padded}));
        };
        if (stage_ == 3) {
            gather_into_padded(value_shard_);
            layout_.to_dense(whole, values);
        } else {
            layout_.to_dense(all(values_), values);
        }
        if (stage_ == 0) {
            layout_.to_dense(all(m_), m);
            layout_.to_dense(all(v_), v);
        } else {
            gather_into_padded(m_);
            layout_.to_dense(whole, m);
            gather_into_padded(v_);
            layout_.to_dense(whole, v);
        }
    }

    // Sets parameters and moments from the dense arrays every rank holds (a
    // checkpoint), keeping what this rank owns; the next step continues the
    // one after `optimizer_steps`.
    void load_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                    std::int64_t optimizer_steps) {
        Buffer<Host> padded(DType::f32, Shape{layout_.padded_size()});
        const auto whole = all(padded);
        auto keep_blocks = [&](Buffer<Host>& sharded) {
            for (int gi = 0; gi < static_cast<int>(layout_.groups().size()); ++gi) {
                const auto& g = layout_.group(gi);
                std::copy_n(whole.data() + layout_.block_offset(gi, comm_->rank()), g.block,
                            sharded.data<float>() + g.shard_offset);
            }
        };
        layout_.from_dense(values, whole);
        if (stage_ == 3) keep_blocks(value_shard_);
        else std::copy(whole.begin(), whole.end(), values_.data<float>());
        for (auto [dense, state] : {std::pair{m, &m_}, std::pair{v, &v_}}) {
            layout_.from_dense(dense, whole);
            if (stage_ == 0) std::copy(whole.begin(), whole.end(), state->template data<float>());
            else keep_blocks(*state);
        }
        LOOM_CHECK(optimizer_steps >= 0, "Executor::load_state: optimizer_steps = ", optimizer_steps, " is negative");
        optimizer_steps_ = optimizer_steps;
    }

private:
    struct InFlight {
        comm::Request request;
        std::chrono::steady_clock::time_point issued;
        bool in_flight = false;
    };

    [[nodiscard]] static Buffer<Host> floats(std::int64_t n) { return Buffer<Host>(DType::f32, Shape{n}); }
    [[nodiscard]] static std::span<float> all(const Buffer<Host>& b) {
        return {b.data<float>(), static_cast<std::size_t>(b.numel())};
    }

    void allocate() {
        const std::int64_t padded = layout_.padded_size(), shard = layout_.shard_size();
        if (stage_ < 3) values_ = floats(padded);
        else value_shard_ = floats(shard);
        if (stage_ < 2) grads_ = floats(padded);
        else grad_shard_ = floats(shard);
        m_ = floats(stage_ == 0 ? padded : shard);
        v_ = floats(stage_ == 0 ? padded : shard);
        for (int s = 0; s < program_.grad_slots; ++s) grad_slots_.push_back(floats(layout_.largest_group()));
        for (int s = 0; s < program_.param_slots; ++s) param_slots_.push_back(floats(layout_.largest_group()));
        // Unsharded parameters and gradients are bound once, here.
        for (int g = 0; g < static_cast<int>(layout_.groups().size()); ++g) {
            const auto& group = layout_.group(g);
            bind(g, stage_ < 3 ? values_.data<float>() + group.offset : nullptr,
                 stage_ < 2 ? grads_.data<float>() + group.offset : nullptr);
        }
    }

    // Points the Params of group g at `values` / `grads` (the group's first
    // element; nullptr unbinds, so a use outside the schedule fails loudly).
    void bind(int g, float* values, float* grads, bool set_values = true, bool set_grads = true) {
        const auto& group = layout_.group(g);
        std::int64_t at = 0;
        for (int u = group.first_unit; u <= group.last_unit; ++u)
            for (Param* p : units_[static_cast<std::size_t>(u)].params) {
                if (set_values) p->value = values ? Tensor::of(values + at, p->shape) : Tensor{};
                if (set_grads) p->grad = grads ? Tensor::of(grads + at, p->shape) : Tensor{};
                at += p->numel();
            }
    }

    [[nodiscard]] Tensor rows_of(const Tensor& t, int mb) const {
        const std::int64_t T = t.dim(1);
        return Tensor(static_cast<std::byte*>(t.raw()) + mb * rows_per_micro_batch_ * T * size_of(t.dtype()), t.dtype(),
                      Shape{rows_per_micro_batch_, T});
    }

    [[nodiscard]] Tensor slice(const Buffer<Host>& b, std::int64_t offset, std::int64_t n) const {
        return Tensor::of(const_cast<float*>(b.data<float>()) + offset, {n});
    }

    // Runs f; with tracing on, records it under the name `name_of()` gives,
    // which is only built then (no string work per instruction otherwise).
    template <class Name, class F>
    void timed(Name&& name_of, const char* category, int mb, F&& f) {
        if (!trace_.enabled()) {
            f();
            return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        f();
        trace_.add(name_of(), category, compute_lane, t0, std::chrono::steady_clock::now(), step_count_, mb);
    }

    void issue(int index, comm::Request request) {
        pending_[static_cast<std::size_t>(index)] = InFlight{std::move(request), std::chrono::steady_clock::now(), true};
    }

    [[nodiscard]] std::string describe_comm(const schedule::Instruction& in) const {
        const auto& g = layout_.group(in.group);
        std::string what = in.op == schedule::Op::gather_params ? "all_gather"
                           : in.reduction == schedule::Reduction::all_reduce ? "all_reduce"
                                                                              : "reduce_scatter";
        return what + " g" + std::to_string(in.group) + " (" + readable_bytes(g.padded * 4) + ")";
    }

    void execute(int index, const schedule::Instruction& in) {
        using schedule::Op;
        const int r = comm_->rank();
        switch (in.op) {
            case Op::zero_grads:
                timed([] { return std::string("zero gradients"); }, "zero_grads", -1, [&] {
                    Buffer<Host>& g = stage_ < 2 ? grads_ : grad_shard_;
                    std::fill_n(g.data<float>(), g.numel(), 0.0f);
                });
                return;
            case Op::forward: {
                auto& unit = units_[static_cast<std::size_t>(in.unit)];
                timed([&] { return "forward " + unit.name; }, "forward", in.micro_batch, [&] {
                    if (in.unit == 0) {
                        context_.reset();
                        context_.set_targets(rows_of(targets_, in.micro_batch));
                        activation_ = rows_of(inputs_, in.micro_batch);
                    }
                    activation_ = unit.forward(context_, activation_);
                    if (in.unit + 1 == static_cast<int>(units_.size())) loss_sum_ += context_.loss();
                });
                return;
            }
            case Op::backward:
            case Op::backward_input:
            case Op::backward_weight: {
                auto& unit = units_[static_cast<std::size_t>(in.unit)];
                const char* category = in.op == Op::backward ? "backward"
                                       : in.op == Op::backward_input ? "backward_input" : "backward_weight";
                timed([&] { return std::string(category) + " " + unit.name; }, category, in.micro_batch, [&] {
                    if (in.op != Op::backward_weight) {
                        if (in.unit + 1 == static_cast<int>(units_.size())) {
                            // Each micro-batch's mean loss counts 1/M of the step's.
                            seed_ = 1.0f / static_cast<float>(micro_batches_);
                            activation_ = Tensor::of(&seed_, {1});
                        }
                        activation_ = unit.backward_input(context_, activation_);
                    }
                    if (in.op != Op::backward_input) unit.backward_weight(context_);
                });
                return;
            }
            case Op::gather_params: {
                const auto& g = layout_.group(in.group);
                if (in.slot >= 0) {
                    Buffer<Host>& slot = param_slots_[static_cast<std::size_t>(in.slot)];
                    issue(index, comm_->all_gather_async(slice(value_shard_, g.shard_offset, g.block),
                                                         slice(slot, 0, g.padded)));
                    bind(in.group, slot.data<float>(), nullptr, true, false);
                } else {
                    issue(index, comm_->all_gather_async(slice(values_, layout_.block_offset(in.group, r), g.block),
                                                         slice(values_, g.offset, g.padded)));
                }
                return;
            }
            case Op::release_params:
                bind(in.group, nullptr, nullptr, true, false);
                return;
            case Op::bind_grads: {
                Buffer<Host>& slot = grad_slots_[static_cast<std::size_t>(in.slot)];
                timed([&] { return "zero gradient slot " + std::to_string(in.slot); }, "zero_grads", in.micro_batch,
                      [&] { std::fill_n(slot.data<float>(), layout_.group(in.group).padded, 0.0f); });
                bind(in.group, nullptr, slot.data<float>(), false, true);
                return;
            }
            case Op::reduce_grads: {
                const auto& g = layout_.group(in.group);
                if (in.reduction == schedule::Reduction::all_reduce) {
                    const Tensor whole = slice(grads_, g.offset, g.padded);
                    issue(index, comm_->all_reduce_async(whole, whole, comm::ReduceOp::avg));
                } else if (in.slot < 0) {
                    issue(index, comm_->reduce_scatter_async(slice(grads_, g.offset, g.padded),
                                                             slice(grads_, layout_.block_offset(in.group, r), g.block),
                                                             comm::ReduceOp::avg));
                } else {
                    // The first micro-batch writes the shard; later ones reduce
                    // in place and are added when waited for.
                    const Buffer<Host>& slot = grad_slots_[static_cast<std::size_t>(in.slot)];
                    const Tensor out = in.micro_batch == 0 ? slice(grad_shard_, g.shard_offset, g.block)
                                                           : slice(slot, r * g.block, g.block);
                    issue(index, comm_->reduce_scatter_async(slice(slot, 0, g.padded), out, comm::ReduceOp::avg));
                }
                return;
            }
            case Op::wait: {
                finish(in.target);
                return;
            }
            case Op::optimizer_step:
                timed([] { return std::string("optimizer step"); }, "optimizer", -1, [&] { optimizer_step(); });
                return;
            case Op::send:
            case Op::recv:
                // verify() refuses pipeline instructions in a data-parallel program.
                LOOM_FAIL("Executor: ", in, " at #", index, " needs a pipeline executor");
            case Op::reduce_loss: {
                float loss = loss_sum_ / static_cast<float>(micro_batches_);
                const Tensor t = Tensor::of(&loss, {1});
                comm_->all_reduce(t, t, comm::ReduceOp::avg);
                loss_ = loss;
                return;
            }
        }
    }

    void finish(int target) {
        LOOM_CHECK(target >= 0 && target < static_cast<int>(pending_.size()) &&
                       pending_[static_cast<std::size_t>(target)].in_flight,
                   "Executor: wait for #", target, ", which is not in flight");
        InFlight& flight = pending_[static_cast<std::size_t>(target)];
        const auto& in = program_.code[static_cast<std::size_t>(target)];
        const auto t0 = std::chrono::steady_clock::now();
        flight.request.wait();
        const auto t1 = std::chrono::steady_clock::now();
        if (trace_.enabled()) {
            const std::string what = describe_comm(in);
            const auto& timing = flight.request.timing();
            const auto start = timing.known ? timing.started : flight.issued;
            const auto end = timing.known ? timing.finished : t1;
            trace_.add(what, what.substr(0, what.find(' ')).c_str(), communication_lane, start, end, step_count_,
                       in.micro_batch);
            if (t1 - t0 >= std::chrono::microseconds(5))
                trace_.add("wait for " + what, "wait", compute_lane, t0, t1, step_count_, in.micro_batch);
        }
        if (in.op == schedule::Op::reduce_grads && in.slot >= 0 && in.micro_batch > 0) {
            const auto& g = layout_.group(in.group);
            const Buffer<Host>& slot = grad_slots_[static_cast<std::size_t>(in.slot)];
            kernels::host::accumulate(grad_shard_.data<float>() + g.shard_offset,
                                      slot.data<float>() + comm_->rank() * g.block, g.block);
        }
        flight.in_flight = false;
    }

    void optimizer_step() {
        const std::int64_t step = ++optimizer_steps_;
        auto span_of = [](Buffer<Host>& b, std::int64_t offset, std::int64_t n) {
            return std::span<float>(b.data<float>() + offset, static_cast<std::size_t>(n));
        };
        if (stage_ == 0) {
            optim::adamw_step(all(values_), all(grads_), all(m_), all(v_), step,
                              adamw_);
        } else if (stage_ == 3) {
            optim::adamw_step(all(value_shard_), all(grad_shard_), all(m_), all(v_),
                              step, adamw_);
        } else {
            const int r = comm_->rank();
            for (int gi = 0; gi < static_cast<int>(layout_.groups().size()); ++gi) {
                const auto& g = layout_.group(gi);
                const std::int64_t own = layout_.block_offset(gi, r);
                optim::adamw_step(span_of(values_, own, g.block),
                                  stage_ == 1 ? span_of(grads_, own, g.block) : span_of(grad_shard_, g.shard_offset, g.block),
                                  span_of(m_, g.shard_offset, g.block), span_of(v_, g.shard_offset, g.block), step, adamw_);
            }
        }
    }

    C* comm_;
    std::vector<nn::Unit> units_;
    int stage_;
    int micro_batches_;
    optim::AdamWConfig adamw_;
    parallel::ShardLayout layout_;
    schedule::StepProgram program_;
    Trace trace_;
    std::function<void(std::uint64_t, std::span<float>, std::int64_t)> initialize_range_;

    Buffer<Host> values_, value_shard_, grads_, grad_shard_, m_, v_;
    std::vector<Buffer<Host>> grad_slots_, param_slots_;
    std::int64_t optimizer_steps_ = 0;
    std::int64_t step_count_ = 0;

    nn::Context context_;
    std::vector<InFlight> pending_;  // by instruction index: no allocation per step
    Tensor inputs_, targets_, activation_;
    std::int64_t rows_per_micro_batch_ = 0;
    float seed_ = 1.0f;
    float loss_sum_ = 0, loss_ = 0;
};

}  // namespace loom::exec

namespace loom {

// What one rank holds for training, by purpose (see exec/memory.hpp).
template <comm::Communicator C>
[[nodiscard]] MemoryReport memory_report(const exec::Executor<C>& executor) {
    return executor.memory_report();
}

}  // namespace loom
