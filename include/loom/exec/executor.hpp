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
//
// With Pipeline<Schedule> in the strategy, make() also takes the pp axis: the
// units are split into stages x chunks virtual stages (options.partition, or
// balanced over options.unit_costs), each rank keeps only its own units'
// parameters and state, and runs its schedule's program with activations and
// gradients passed to its neighbours by send/recv; every rank of a dp group
// (same pp rank) calls step() with the same rows.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/staged.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/init.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/compressed_exchange.hpp"
#include "loom/kernels/compression_ops.hpp"
#include "loom/exec/rank_program.hpp"
#include "loom/exec/execution_plan.hpp"
#include "loom/exec/memory.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/exec/layer_groups.hpp"
#include "loom/exec/micro_batch_pool.hpp"
#include "loom/exec/parameter_store.hpp"
#include "loom/exec/stage_messages.hpp"
#include "loom/exec/tensor_shards.hpp"
#include "loom/exec/trace.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/sequence_layout.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/nn/units.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/parallel/strategy.hpp"
#include "loom/parallel/optimus2d.hpp"
#include "loom/plan/partition.hpp"
#include "loom/schedule/data_parallel.hpp"
#include "loom/schedule/pipeline.hpp"
#include "loom/schedule/pipeline_step.hpp"
#include "loom/schedule/verify.hpp"
#include "loom/schedule/verify_pipeline.hpp"

namespace loom::exec {

template <comm::Communicator C>
class Executor {
public:
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, C& dp, const ExecutorOptions& options = {}) {
        return Executor(model, dp, nullptr, ExecutionPlan::of<Strategy>(), options);
    }
    // A pipelined strategy: `pp` is the pipeline axis (its rank is the stage).
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, C& dp, C& pp, const ExecutorOptions& options = {}) {
        return Executor(model, dp, &pp, ExecutionPlan::of<Strategy>(), options);
    }

    // Every axis of `mesh` the strategy uses: dp always, pp with a Pipeline,
    // tp with TensorParallel, sp with SequenceParallel (an axis the mesh lacks
    // counts as size 1). With an sp axis, gradients are reduced over dp x sp.
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, comm::Mesh<C>& mesh, const ExecutorOptions& options = {}) {
        const bool sp = mesh.has("sp") && mesh.size("sp") > 1;
        return Executor(model, sp ? mesh.combined({"dp", "sp"}) : mesh.axis("dp"),
                        mesh.has("pp") ? &mesh.axis("pp") : nullptr, mesh.has("tp") ? &mesh.axis("tp") : nullptr,
                        sp ? &mesh.axis("sp") : nullptr, ExecutionPlan::of<Strategy>(), options);
    }

    template <class Model>
    Executor(Model& model, C& dp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : Executor(model, dp, nullptr, nullptr, plan, options) {}
    template <class Model>
    Executor(Model& model, C& dp, C* pp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : Executor(model, dp, pp, nullptr, plan, options) {}

    // `model` must outlive the executor and not move; its Params are bound to
    // the executor's storage. `pp` may be null: a pipeline of one stage;
    // `tp` may be null: no tensor parallelism. With a tp axis, the model is
    // cut here (tp::shard_model) before anything is laid out.
    template <class Model>
    Executor(Model& model, C& dp, C* pp, C* tp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : Executor(model, dp, pp, tp, nullptr, plan, options) {}

    // `sp` may be null: each rank holds whole sequences. With an sp axis,
    // `dp` must be the dp x sp group (gradients are partial over tokens), and
    // each rank's step() gets its data-parallel replica's whole sequences; the
    // executor keeps this rank's positions of them (nn/sequence_layout.hpp).
    template <class Model>
    Executor(Model& model, C& dp, C* pp, C* tp, C* sp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : comm_(&dp),
          pp_(pp),
          tp_(tensor_parallel_axis(plan, tp) ? tp : nullptr),
          sp_(sequence_parallel_axis(plan, sp, tp_) ? sp : nullptr),
          shards_(cut_model(model, tp_, plan.tensor_grid)),
          units_(nn::units_of(model, options.field_names)),
          stage_(plan.zero_stage),
          micro_batches_(options.micro_batches),
          adamw_(options.adamw),
          device_(options.device),
          pipelined_(check_pipeline(plan, pp)),
          rank_(exec::rank_program(units_, dp.size(), pp_size(), pp_rank(), plan, options)),
          trace_(options.trace) {
        optim::check_config(options.adamw);
        check_device(plan);
        pool_.set_device(device_);
        pool_.set_matmul_precision(options.matmul);
        initialize_range_ = [&model](std::uint64_t seed, std::span<float> out, std::int64_t first) {
            loom::initialize_range(model, seed, out, first);
        };
        allocate();
        pending_.resize(rank_.program.code.size());
        if (plan.dp_compression.on() && dp.size() > 1) start_compression(plan.dp_compression, options);
        LOOM_CHECK(!plan.pp_compression.on() || plan.pipelined, "Executor: GradCompress<",
                   plan.pp_compression.describe(), ", PpAxis> casts what pipeline stages send; add Pipeline<Schedule>");
        LOOM_CHECK(!plan.tp_compression.on() || (plan.tensor_parallel && !plan.tensor_grid), "Executor: GradCompress<",
                   plan.tp_compression.describe(), ", TpAxis> casts Megatron's all-reduces; add TensorParallel (1D)");
        if (plan.pp_compression.on()) pp_cast_ = cast_of(plan.pp_compression);
        groups_ = LayerGroups<C>(tp_, sp_, plan, dp.size(),
                                 plan.tp_compression.on() ? std::optional(cast_of(plan.tp_compression)) : std::nullopt);
        groups_.attach(pool_);
    }

    Executor(Executor&&) noexcept = default;
    Executor(const Executor&) = delete;
    Executor& operator=(const Executor&) = delete;

    [[nodiscard]] const schedule::StepProgram& program() const noexcept { return rank_.program; }
    // The pipeline schedule (every rank's chunk-level program; empty unless pipelined).
    [[nodiscard]] const schedule::PipelineProgram& pipeline() const noexcept { return rank_.pipe; }
    [[nodiscard]] const schedule::StageBounds& stage_bounds() const noexcept { return rank_.stages; }
    [[nodiscard]] bool pipelined() const noexcept { return pipelined_; }
    // Elements of the whole model (what gather_state and load_state exchange);
    // layout().dense_size() is this rank's, smaller when tp cuts the model.
    [[nodiscard]] std::int64_t parameter_count() const noexcept { return shards_.whole_size(); }
    // Whether this rank holds unit u (every unit, without a pipeline).
    [[nodiscard]] bool holds_unit(int u) const { return rank_.chunk_of_unit.at(static_cast<std::size_t>(u)) >= 0; }
    [[nodiscard]] const parallel::ShardLayout& layout() const noexcept { return rank_.layout; }
    [[nodiscard]] const std::vector<nn::Unit>& units() const noexcept { return units_; }
    [[nodiscard]] int zero_stage() const noexcept { return stage_; }
    [[nodiscard]] int micro_batches() const noexcept { return micro_batches_; }
    [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return optimizer_steps_; }
    [[nodiscard]] Trace& trace() noexcept { return trace_; }
    [[nodiscard]] C& communicator() const noexcept { return *comm_; }

    // The parameters' initial values from the counter-based RNG: the serial
    // run's values, on every rank, whatever it keeps of them.
    void initialize(std::uint64_t seed) {
        store_.initialize(rank_.layout, comm_->rank(), seed, initialize_range_);
        optimizer_steps_ = 0;
        if (compress_) compress_->reset();
    }

    // One training step on this rank's rows of the global batch (inputs and
    // targets [rows, T], rows divisible by the micro-batches). Returns the
    // loss averaged over the global batch, the same on every rank.
    float step(const Tensor& inputs, const Tensor& targets, float lr) {
        LOOM_CHECK(inputs.rank() == 2 && targets.shape() == inputs.shape(), "Executor::step: inputs ", inputs.shape(),
                   " and targets ", targets.shape(), " must both be [rows, T]");
        LOOM_CHECK(inputs.device().kind == DeviceKind::host && targets.device().kind == DeviceKind::host,
                   "Executor::step: the batch is on ", inputs.device(), " and ", targets.device(),
                   "; pass it in host memory (each micro-batch is copied to ", device_, ")");
        const std::int64_t rows = inputs.dim(0);
        LOOM_CHECK(rows % micro_batches_ == 0, "Executor::step: ", rows, " rows on this rank do not split into ",
                   micro_batches_, " micro-batches; the rows per rank must be a multiple of the micro-batches");
        // Optimus 2D cuts each micro-batch's sequences over the grid rows; checked
        // here, on every rank, not in the first stage's embedding alone.
        const int q = groups_.grid_side();
        LOOM_CHECK((rows / micro_batches_) % q == 0, "Executor::step: micro-batches of ",
                   rows / micro_batches_, " sequences do not split over the ", q,
                   " rows of the Optimus 2D grid; use rows per micro-batch that are a multiple of ",
                   q);
        adamw_.lr = lr;
        optim::check_config(adamw_);
        inputs_ = inputs;
        targets_ = targets;
        if (sp_ != nullptr) keep_local_positions();
        rows_per_micro_batch_ = rows / micro_batches_;
        loss_sum_ = 0;
        pool_.start_step(rank_.stages.stages(), micro_batches_);
        for (std::size_t i = 0; i < rank_.program.code.size(); ++i) execute(static_cast<int>(i), rank_.program.code[i]);
        ++step_count_;
        return loss_;
    }

    // Tokens of each sequence this rank's model saw in the last step: the
    // whole sequence, or under sequence parallelism its positions of it.
    [[nodiscard]] std::int64_t tokens_per_sequence() const { return inputs_.rank() == 2 ? inputs_.dim(1) : 0; }

    [[nodiscard]] MemoryReport memory_report() const {
        MemoryReport report;
        report.rank = comm_->rank();
        report.parameters = store_.parameter_bytes();
        report.gradients = store_.gradient_bytes();
        report.optimizer_state = store_.optimizer_bytes();
        if (compress_) {
            report.compression_state = compress_->state_bytes();
            report.communication_buffers += compress_->buffer_bytes();
        }
        report.activations = pool_.activation_bytes();
        report.communication_buffers += pool_.parcel_bytes();
        report.communication_buffers += store_.slot_bytes();
        return report;
    }

    // Collective: the whole model's parameters and AdamW moments in the serial
    // (dense, reflection) order, on every rank: what a checkpoint holds.
    // Pipelines: every stage fills in its units and a sum over the pp axis
    // (of values and zeros, so exact) completes the arrays everywhere. Tensor
    // parallelism: each tp rank's cut arrays are put back together whole.
    void gather_state(std::span<float> values, std::span<float> m, std::span<float> v) {
        if (tp_ == nullptr) {
            gather_local_state(values, m, v);
            return;
        }
        const auto n = static_cast<std::size_t>(shards_.local_size());
        std::vector<float> lv(n), lm(n), lvv(n);
        gather_local_state(lv, lm, lvv);
        shards_.to_whole(*tp_, lv, values, device_);
        shards_.to_whole(*tp_, lm, m, device_);
        shards_.to_whole(*tp_, lvv, v, device_);
    }

    // Sets parameters and moments from the dense arrays every rank holds (a
    // checkpoint), keeping what this rank owns; the next step continues the
    // one after `optimizer_steps`.
    void load_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                    std::int64_t optimizer_steps) {
        if (tp_ != nullptr) {
            const auto n = static_cast<std::size_t>(shards_.local_size());
            std::vector<float> lv(n), lm(n), lvv(n);
            shards_.to_local(values, lv);
            shards_.to_local(m, lm);
            shards_.to_local(v, lvv);
            load_local_state(lv, lm, lvv, optimizer_steps);
            return;
        }
        load_local_state(values, m, v, optimizer_steps);
    }

    // GradCompress's per-rank state (error feedback, warm starts): what a
    // checkpoint must keep for an exact resume. Empty without a dp compressor.
    [[nodiscard]] Compression compression() const noexcept { return compress_ ? compress_->compression() : Compression{}; }
    [[nodiscard]] std::int64_t compression_state_size() const noexcept {
        return compress_ ? compress_->state_size() : 0;
    }
    void save_compression_state(std::span<float> out) const {
        if (compress_) compress_->save_state(out);
    }
    void load_compression_state(std::span<const float> in) {
        LOOM_CHECK(compress_ || in.empty(), "Executor::load_compression_state: ", in.size(),
                   " elements of compressor state for an executor without a dp compressor");
        if (compress_) compress_->load_state(in);
    }

private:
    // This rank's (tp-cut) state in its local dense order, on every rank of
    // its tp position: collective over dp and pp.
    void gather_local_state(std::span<float> values, std::span<float> m, std::span<float> v) {
        if (pipelined_)
            for (auto dense : {values, m, v}) std::fill(dense.begin(), dense.end(), 0.0f);
        gather_held_state(values, m, v);
        if (pipelined_ && pp_ != nullptr)
            for (auto dense : {values, m, v})
                comm::staged_all_reduce(*pp_, Tensor::of(dense.data(), {static_cast<std::int64_t>(dense.size())}),
                                        comm::ReduceOp::sum, device_);
    }

    void load_local_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                          std::int64_t optimizer_steps) {
        LOOM_CHECK(optimizer_steps >= 0, "Executor::load_state: optimizer_steps = ", optimizer_steps, " is negative");
        store_.load(rank_.layout, comm_->rank(), values, m, v);
        optimizer_steps_ = optimizer_steps;
    }

    // This rank's units' state into the dense arrays (collective over dp).
    void gather_held_state(std::span<float> values, std::span<float> m, std::span<float> v) {
        store_.gather(rank_.layout, *comm_, values, m, v);
    }

    // GradCompress on the dp axis. Notices come from one rank of each
    // gradient group and tp position 0, so each matrix is named once.
    void start_compression(const Compression& compression, const ExecutorOptions& options) {
        compress_warmup_ = options.compress_warmup;
        LOOM_CHECK(compress_warmup_ >= 0, "Executor: compress_warmup = ", compress_warmup_,
                   " steps; it must be 0 or more");
        // Error feedback delivers late what a step did not send; AdamW's
        // variance freezes when compression starts (unless the options chose
        // a step), so that arrives in full.
        if (compression.error_feedback() && compress_warmup_ > 0 && options.adamw.freeze_variance_after == 0)
            adamw_.freeze_variance_after = compress_warmup_;
        PowerSgdBuckets::Notice notice;
        if (comm_->rank() == 0 && (tp_ == nullptr || tp_->rank() == 0))
            notice = options.notice ? options.notice : PowerSgdBuckets::Notice([](const std::string& line) {
                std::cerr << "loom: " << line << "\n";
            });
        compress_ = std::make_unique<CompressedExchange<C>>(*comm_, rank_.layout, units_, compression, notice, device_);
    }
    // After the warm-up: compressed from the step whose optimizer step is compress_warmup_ + 1.
    [[nodiscard]] bool compressing() const noexcept { return compress_ && optimizer_steps_ >= compress_warmup_; }
    // OneBit at ZeRO 0 exchanges momentum (mix before, unmix at the optimizer step).
    [[nodiscard]] bool momentum_exchange() const noexcept {
        return compressing() && stage_ == 0 && compress_->compression().compresses_momentum();
    }

    void reduce_compressed(int index, const schedule::Instruction& in) {
        const auto& g = rank_.layout.group(in.group);
        const int r = comm_->rank();
        const auto span_of = [](const DeviceBuffer& b, std::int64_t offset, std::int64_t n) {
            return std::span<float>(b.data<float>() + offset, static_cast<std::size_t>(n));
        };
        if (in.slot < 0) {
            const auto grad = span_of(store_.grads, g.offset, g.padded);
            if (momentum_exchange()) {
                kernels::mix_momentum(device_, grad.data(), store_.m.data<float>() + g.offset, g.padded, adamw_.beta1);
                momentum_mixed_ = true;
            }
            issue(index, compress_->reduce_async(in.group, grad,
                                                 in.reduction == schedule::Reduction::all_reduce
                                                     ? grad
                                                     : span_of(store_.grads, rank_.layout.block_offset(in.group, r), g.block)));
            return;
        }
        // As the uncompressed slot reduction: the first writes the shard, later ones are added when done.
        const DeviceBuffer& slot = store_.grad_slots[static_cast<std::size_t>(in.slot)];
        const bool first = !reduced_[static_cast<std::size_t>(in.group)];
        reduced_[static_cast<std::size_t>(in.group)] = true;
        issue(index, compress_->reduce_async(in.group, span_of(slot, 0, g.padded),
                                             first ? span_of(store_.grad_shard, g.shard_offset, g.block)
                                                   : span_of(slot, r * g.block, g.block)));
        pending_[static_cast<std::size_t>(index)].accumulate = !first;
    }

    struct InFlight {
        comm::Request request;
        comm::Request second;  // a send's payload (request is its header)
        std::chrono::steady_clock::time_point issued;
        bool in_flight = false;
        bool accumulate = false;  // a slot reduction whose block is added to the shard when done
    };

    // Sequence parallelism: inputs_ and targets_ become this rank's positions
    // of every sequence, in its layout's order.
    void keep_local_positions() {
        const std::int64_t rows = inputs_.dim(0), T = inputs_.dim(1);
        const nn::SequenceLayout layout = groups_.sequence().layout();
        const std::int64_t local = layout.local_tokens(T);
        local_inputs_.resize(static_cast<std::size_t>(rows * local));
        local_targets_.resize(local_inputs_.size());
        const auto runs = layout.runs(T);
        for (std::int64_t r = 0; r < rows; ++r)
            for (const nn::SequenceRun& run : runs)
                for (std::int64_t t = 0; t < run.length; ++t) {
                    const auto at = static_cast<std::size_t>(r * local + run.local + t);
                    local_inputs_[at] = inputs_.data<std::int32_t>()[r * T + run.position + t];
                    local_targets_[at] = targets_.data<std::int32_t>()[r * T + run.position + t];
                }
        inputs_ = Tensor::of(local_inputs_.data(), {rows, local});
        targets_ = Tensor::of(local_targets_.data(), {rows, local});
    }

    [[nodiscard]] int pp_size() const { return pp_ != nullptr ? pp_->size() : 1; }
    [[nodiscard]] int pp_rank() const { return pp_ != nullptr ? pp_->rank() : 0; }

    [[nodiscard]] static bool check_pipeline(const ExecutionPlan& plan, const C* pp) {
        LOOM_CHECK(plan.pipelined || pp == nullptr || pp->size() == 1, "Executor: a pipeline axis of ", pp->size(),
                   " ranks for a strategy without Pipeline<...>; add Pipeline<Schedule> or use a pp axis of 1");
        return plan.pipelined;
    }
    // DP programs name no chunk: the whole model is chunk 0.
    [[nodiscard]] static int chunk_of(const schedule::Instruction& in) { return in.chunk < 0 ? 0 : in.chunk; }

    // Every strategy runs on a device; what is checked there, before anything
    // is allocated, is that the device is usable.
    void check_device(const ExecutionPlan&) const {
        if (device_.kind != DeviceKind::host) check_device_usable(device_);
    }

    void allocate() {
        store_ = ParameterStore(rank_.layout, stage_, rank_.program.grad_slots, rank_.program.param_slots, device_);
        // Unsharded parameters and gradients are bound once, here.
        for (int g = 0; g < static_cast<int>(rank_.layout.groups().size()); ++g) {
            const auto& group = rank_.layout.group(g);
            bind(g, stage_ < 3 ? store_.values.data<float>() + group.offset : nullptr,
                 stage_ < 2 ? store_.grads.data<float>() + group.offset : nullptr);
        }
    }

    // Points the Params of group g at `values` / `grads` (the group's first
    // element; nullptr unbinds, so a use outside the schedule fails loudly).
    void bind(int g, float* values, float* grads, bool set_values = true, bool set_grads = true) {
        const auto& group = rank_.layout.group(g);
        std::int64_t at = 0;
        for (int u = group.first_unit; u <= group.last_unit; ++u)
            for (Param* p : units_[static_cast<std::size_t>(u)].params) {
                if (set_values) p->value = values ? Tensor::of(values + at, p->shape, device_) : Tensor{};
                if (set_grads) p->grad = grads ? Tensor::of(grads + at, p->shape, device_) : Tensor{};
                at += p->numel();
            }
    }

    [[nodiscard]] Tensor rows_of(const Tensor& t, int mb) const {
        const std::int64_t T = t.dim(1);
        return Tensor(static_cast<std::byte*>(t.raw()) + mb * rows_per_micro_batch_ * T * size_of(t.dtype()), t.dtype(),
                      Shape{rows_per_micro_batch_, T});
    }

    [[nodiscard]] Tensor slice(const DeviceBuffer& b, std::int64_t offset, std::int64_t n) const {
        return store_.slice(b, offset, n);
    }

    // Runs f; with tracing on, records it under the name `name_of()` gives,
    // which is only built then (no string work per instruction otherwise). On
    // a device the clock waits for the device's work before and after f, so
    // a span is f's time there, not its launch's (tracing costs that wait).
    template <class Name, class F>
    void timed(Name&& name_of, const char* category, int mb, F&& f) {
        if (!trace_.enabled()) {
            f();
            return;
        }
        synchronize_device(device_);
        const auto t0 = std::chrono::steady_clock::now();
        f();
        synchronize_device(device_);
        trace_.add(name_of(), category, compute_lane, t0, std::chrono::steady_clock::now(), step_count_, mb);
    }

    void issue(int index, comm::Request request) {
        pending_[static_cast<std::size_t>(index)] = InFlight{std::move(request), {}, std::chrono::steady_clock::now(), true, false};
    }

    [[nodiscard]] std::string describe_comm(const schedule::Instruction& in) const {
        if (in.op == schedule::Op::send)
            return loom::detail::concat("send ", name(in.payload), " c", in.chunk, " mb", in.micro_batch, " to rank ",
                                        in.peer);
        const auto& g = rank_.layout.group(in.group);
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
                    const DeviceBuffer& g = stage_ < 2 ? store_.grads : store_.grad_shard;
                    fill_zero_bytes(g.raw(), device_, g.nbytes());
                });
                reduced_.assign(rank_.layout.groups().size(), false);
                return;
            case Op::forward: {
                auto& unit = units_[static_cast<std::size_t>(in.unit)];
                const int v = chunk_of(in), mb = in.micro_batch;
                timed([&] { return "forward " + unit.name; }, "forward", mb, [&] {
                    if (in.unit == rank_.stages.first(v)) {
                        nn::Context& ctx = pool_.open(v, mb);
                        // The host's batch goes to the context's device (a copy there, none on the host).
                        ctx.set_targets(ctx.on_device(rows_of(targets_, mb)));
                        activation_ = v == 0 ? ctx.on_device(rows_of(inputs_, mb))
                                             : pool_.inbox(schedule::Payload::activation, v, mb);
                    }
                    nn::Context& ctx = pool_.context(v, mb);
                    activation_ = unit.forward(ctx, activation_);
                    if (in.unit + 1 == static_cast<int>(units_.size())) loss_sum_ += ctx.loss();
                    if (in.unit + 1 == rank_.stages.end(v) && v + 1 < rank_.stages.stages()) hand_on(schedule::Payload::activation, v, v + 1, mb, activation_);
                });
                return;
            }
            case Op::backward:
            case Op::backward_input:
            case Op::backward_weight: {
                auto& unit = units_[static_cast<std::size_t>(in.unit)];
                const int v = chunk_of(in), mb = in.micro_batch;
                const char* category = in.op == Op::backward ? "backward"
                                       : in.op == Op::backward_input ? "backward_input" : "backward_weight";
                timed([&] { return std::string(category) + " " + unit.name; }, category, mb, [&] {
                    nn::Context& ctx = pool_.context(v, mb);
                    if (in.op != Op::backward_weight) {
                        if (in.unit + 1 == static_cast<int>(units_.size())) {
                            // Each micro-batch's mean loss counts 1/M of the step's.
                            seed_ = 1.0f / static_cast<float>(micro_batches_);
                            activation_ = Tensor::of(&seed_, {1});
                        } else if (in.unit + 1 == rank_.stages.end(v)) {
                            activation_ = pool_.inbox(schedule::Payload::gradient, v, mb);
                        }
                        activation_ = unit.backward_input(ctx, activation_);
                        if (in.unit == rank_.stages.first(v) && v > 0) hand_on(schedule::Payload::gradient, v, v - 1, mb, activation_);
                    }
                    if (in.op != Op::backward_input) unit.backward_weight(ctx);
                    // The chunk's last use of this micro-batch: its memory goes back to the pool.
                    if (in.unit == rank_.stages.first(v) && in.op != Op::backward_input) pool_.close(v, mb);
                });
                return;
            }
            case Op::gather_params: {
                const auto& g = rank_.layout.group(in.group);
                if (in.slot >= 0) {
                    DeviceBuffer& slot = store_.param_slots[static_cast<std::size_t>(in.slot)];
                    issue(index, comm_->all_gather_async(slice(store_.value_shard, g.shard_offset, g.block),
                                                         slice(slot, 0, g.padded)));
                    bind(in.group, slot.data<float>(), nullptr, true, false);
                } else {
                    issue(index, comm_->all_gather_async(slice(store_.values, rank_.layout.block_offset(in.group, r), g.block),
                                                         slice(store_.values, g.offset, g.padded)));
                }
                return;
            }
            case Op::release_params:
                bind(in.group, nullptr, nullptr, true, false);
                return;
            case Op::bind_grads: {
                DeviceBuffer& slot = store_.grad_slots[static_cast<std::size_t>(in.slot)];
                // The group's padded elements: all it writes and reduces (the slot fits the largest group).
                const auto bytes = static_cast<std::size_t>(rank_.layout.group(in.group).padded) * sizeof(float);
                timed([&] { return "zero gradient slot " + std::to_string(in.slot); }, "zero_grads", in.micro_batch,
                      [&] { fill_zero_bytes(slot.raw(), device_, bytes); });
                bind(in.group, nullptr, slot.data<float>(), false, true);
                return;
            }
            case Op::reduce_grads: {
                const auto& g = rank_.layout.group(in.group);
                if (compressing()) {
                    reduce_compressed(index, in);
                } else if (in.reduction == schedule::Reduction::all_reduce) {
                    const Tensor whole = slice(store_.grads, g.offset, g.padded);
                    issue(index, comm_->all_reduce_async(whole, whole, comm::ReduceOp::avg));
                } else if (in.slot < 0) {
                    issue(index, comm_->reduce_scatter_async(slice(store_.grads, g.offset, g.padded),
                                                             slice(store_.grads, rank_.layout.block_offset(in.group, r), g.block),
                                                             comm::ReduceOp::avg));
                } else {
                    // The group's first reduction of the step writes the
                    // shard; later ones reduce in place and are added when
                    // waited for.
                    const DeviceBuffer& slot = store_.grad_slots[static_cast<std::size_t>(in.slot)];
                    const bool first = !reduced_[static_cast<std::size_t>(in.group)];
                    reduced_[static_cast<std::size_t>(in.group)] = true;
                    const Tensor out = first ? slice(store_.grad_shard, g.shard_offset, g.block)
                                             : slice(slot, r * g.block, g.block);
                    issue(index, comm_->reduce_scatter_async(slice(slot, 0, g.padded), out, comm::ReduceOp::avg));
                    pending_[static_cast<std::size_t>(index)].accumulate = !first;
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
            case Op::send: send(index, in); return;
            case Op::recv: recv(in); return;
            case Op::reduce_loss: {
                // Only the rank holding the loss unit has a loss; the pp sum
                // (of it and zeros) gives it to every stage.
                float loss = loss_sum_ / static_cast<float>(micro_batches_);
                if (device_.kind != DeviceKind::host) {
                    // A device communicator sums and averages device memory.
                    if (loss_buffer_.raw() == nullptr) loss_buffer_ = store_.floats(1);
                    const Tensor t = loss_buffer_.tensor();
                    write_scalar(t, loss);
                    if (pipelined_ && pp_ != nullptr) pp_->all_reduce(t, t, comm::ReduceOp::sum);
                    comm_->all_reduce(t, t, comm::ReduceOp::avg);
                    loss_ = read_scalar<float>(loss_buffer_.tensor());
                    return;
                }
                const Tensor t = Tensor::of(&loss, {1});
                if (pipelined_ && pp_ != nullptr) pp_->all_reduce(t, t, comm::ReduceOp::sum);
                comm_->all_reduce(t, t, comm::ReduceOp::avg);
                loss_ = loss;
                return;
            }
        }
    }

    // Passes what chunk `from` produced for micro-batch mb on to chunk `to`:
    // into its inbox when it is here (a gradient is copied, since chunk
    // `from`'s context may close before `to` runs), else to the outbox the
    // next send reads.
    void hand_on(schedule::Payload payload, int from, int to, int mb, const Tensor& t) {
        if (chunk_held(to)) {
            if (payload == schedule::Payload::activation) {
                pool_.put_inbox(payload, to, mb, t);
            } else {
                const Tensor copy = pool_.inbox_parcel(payload, to, mb, t.dtype(), t.shape());
                copy_tensor(copy, t);
                pool_.put_inbox(payload, to, mb, copy);
            }
        } else {
            pool_.put_outbox(payload, from, mb, t);
        }
    }
    [[nodiscard]] bool chunk_held(int v) const {
        return !pipelined_ || rank_.pipe.rank_of_chunk.at(static_cast<std::size_t>(v)) == pp_rank();
    }

    [[nodiscard]] static kernels::host::Cast cast_of(const Compression& c) {
        LOOM_CHECK(c.is_cast(), "Executor: ", c.describe(), " on the pp or tp axis; activations take CastBf16 or CastFp16");
        return c.kind == CompressorKind::bf16 ? kernels::host::Cast::bf16 : kernels::host::Cast::f16;
    }

    void send(int index, const schedule::Instruction& in) {
        auto [header, body] = send_stage_tensor(*pp_, pool_, in, pp_cast_);
        pending_[static_cast<std::size_t>(index)] =
            InFlight{std::move(header), std::move(body), std::chrono::steady_clock::now(), true, false};
    }

    void recv(const schedule::Instruction& in) {
        timed([&] { return describe_recv(in); }, "recv", in.micro_batch, [&] { recv_stage_tensor(*pp_, pool_, in); });
    }

    void finish(int target) {
        LOOM_CHECK(target >= 0 && target < static_cast<int>(pending_.size()) &&
                       pending_[static_cast<std::size_t>(target)].in_flight,
                   "Executor: wait for #", target, ", which is not in flight");
        InFlight& flight = pending_[static_cast<std::size_t>(target)];
        const auto& in = rank_.program.code[static_cast<std::size_t>(target)];
        const auto t0 = std::chrono::steady_clock::now();
        flight.request.wait();
        flight.second.wait();
        const auto t1 = std::chrono::steady_clock::now();
        if (trace_.enabled()) {
            const std::string what = describe_comm(in);
            const auto& timing = flight.request.timing();
            // A send is its header, then its body: it ends when the body arrived.
            const auto& last = flight.second.timing().known ? flight.second.timing() : timing;
            const auto start = timing.known ? timing.started : flight.issued;
            const auto end = last.known ? last.finished : t1;
            trace_.add(what, what.substr(0, what.find(' ')).c_str(), communication_lane, start, end, step_count_,
                       in.micro_batch);
            if (t1 - t0 >= std::chrono::microseconds(5))
                trace_.add("wait for " + what, "wait", compute_lane, t0, t1, step_count_, in.micro_batch);
        }
        if (flight.accumulate) {
            const auto& g = rank_.layout.group(in.group);
            const DeviceBuffer& slot = store_.grad_slots[static_cast<std::size_t>(in.slot)];
            kernels::accumulate(slice(store_.grad_shard, g.shard_offset, g.block), slice(slot, comm_->rank() * g.block, g.block),
                                g.block);
        }
        flight.in_flight = false;
    }

    void optimizer_step() {
        const std::int64_t step = ++optimizer_steps_;
        if (momentum_mixed_) {
            kernels::unmix_momentum(device_, store_.grads.data<float>(), store_.m.data<float>(), store_.grads.numel(),
                                    adamw_.beta1);
            momentum_mixed_ = false;
        }
        store_.optimizer_step(rank_.layout, comm_->rank(), step, adamw_);
    }

    C* comm_;
    C* pp_;
    C* tp_;
    C* sp_;  // sequence parallel axis; null without one
    TensorShards shards_;
    std::vector<nn::Unit> units_;
    int stage_;
    int micro_batches_;
    optim::AdamWConfig adamw_;
    Device device_;
    bool pipelined_;
    RankProgram rank_;  // the schedule, this rank's units and layout, and its verified step program
    Trace trace_;
    InitializeRange initialize_range_;

    ParameterStore store_;      // parameters, gradients, moments and slots, placed for the ZeRO stage
    DeviceBuffer loss_buffer_;  // the step's loss on a device, for a device communicator
    std::int64_t optimizer_steps_ = 0;
    std::int64_t step_count_ = 0;

    LayerGroups<C> groups_;  // the tp and sp groups the layers talk to
    std::vector<std::int32_t> local_inputs_, local_targets_;  // this rank's positions of the step's sequences
    MicroBatchPool pool_;
    // Before pending_: a compressed request still in flight when the executor
    // goes (after a failure) finishes into the exchange, which must still exist.
    std::unique_ptr<CompressedExchange<C>> compress_;  // null without one (or with one dp rank)
    std::int64_t compress_warmup_ = 0;
    bool momentum_mixed_ = false;  // this step's gradients were mixed into momentum (OneBit, ZeRO 0)
    std::vector<InFlight> pending_;  // by instruction index: no allocation per step
    std::vector<bool> reduced_;      // by group: reduced already this step
    std::optional<kernels::host::Cast> pp_cast_;  // GradCompress<Cast, PpAxis>
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
