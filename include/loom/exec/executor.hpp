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
//
// How each instruction runs is exec/executor_instructions.hpp, and how the
// checkpoint state is gathered and loaded exec/executor_state.hpp: this
// header is what an executor holds and offers.
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
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/staged.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/init.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/rank_program.hpp"
#include "loom/exec/execution_plan.hpp"
#include "loom/exec/memory.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/exec/layer_groups.hpp"
#include "loom/exec/micro_batch_pool.hpp"
#include "loom/exec/parameter_store.hpp"
#include "loom/exec/policy_component.hpp"
#include "loom/exec/recomputation.hpp"
#include "loom/exec/stage_messages.hpp"
#include "loom/exec/tensor_shards.hpp"
#include "loom/exec/trace.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/nn/units.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/cut_report.hpp"
#include "loom/parallel/gradient_exchange.hpp"
#include "loom/parallel/plan_exchanges.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/parallel/strategy.hpp"
#include "loom/schedule/partition.hpp"
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
        Executor exec(model, dp, nullptr, ExecutionPlan::of<Strategy>(), options);
        exec.adopt_policies<Strategy>();
        return exec;
    }
    // A pipelined strategy: `pp` is the pipeline axis (its rank is the stage).
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, C& dp, C& pp, const ExecutorOptions& options = {}) {
        Executor exec(model, dp, &pp, ExecutionPlan::of<Strategy>(), options);
        exec.adopt_policies<Strategy>();
        return exec;
    }

    // Every axis of `mesh` the strategy uses: dp always, pp with a Pipeline,
    // tp and sp with the policies that cut layers over them (an axis the mesh
    // lacks counts as size 1). With an sp axis, gradients are reduced over dp x sp.
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, comm::Mesh<C>& mesh, const ExecutorOptions& options = {}) {
        const bool sp = mesh.has("sp") && mesh.size("sp") > 1;
        Executor exec(model, sp ? mesh.combined({"dp", "sp"}) : mesh.axis("dp"),
                      mesh.has("pp") ? &mesh.axis("pp") : nullptr, mesh.has("tp") ? &mesh.axis("tp") : nullptr,
                      sp ? &mesh.axis("sp") : nullptr, ExecutionPlan::of<Strategy>(), options);
        exec.adopt_policies<Strategy>();
        return exec;
    }

    // A policy of kind custom in the strategy, by type: this rank's instance
    // of it (its run-time state); null when the strategy has none.
    template <class P>
    [[nodiscard]] const P* policy() const {
        for (std::size_t i = 0; i < components_.size(); ++i)
            if (component_types_[i] == std::type_index(typeid(P))) return static_cast<const P*>(components_[i]->policy());
        return nullptr;
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

    // `sp` may be null: each rank holds whole rows. With an sp axis, `dp`
    // must be the dp x sp group (gradients are partial over tokens), and each
    // rank's step() gets its data-parallel replica's whole rows; the layer
    // groups keep this rank's part of them (LayerGroups::keep_local_part).
    template <class Model>
    Executor(Model& model, C& dp, C* pp, C* tp, C* sp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : Executor(model, dp, pp, layer_axes(plan, tp, sp), plan, options) {}

private:
    // The constructor above, with the tp and sp axes checked against the plan.
    template <class Model>
    Executor(Model& model, C& dp, C* pp, LayerAxes<C> axes, const ExecutionPlan& plan, const ExecutorOptions& options)
        : comm_(&dp),
          pp_(pp),
          tp_(axes.tp),
          sp_(axes.sp),
          cuts_(cut_model(model, tp_, plan.tensor_grid, options.field_names)),
          shards_(model, tp_ != nullptr ? tp_->size() : 1),
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
        if (plan.recompute.on()) {
            std::vector<bool> held(units_.size());
            for (std::size_t u = 0; u < held.size(); ++u) held[u] = holds_unit(static_cast<int>(u));
            recompute_ = Recomputation(plan.recompute, units_, std::move(held));
            relower_recompute(recompute_.full());
            notice_ = options.notice;
        }
        pending_.resize(rank_.program.code.size());
        exchange_ = parallel::gradient_exchange_for<C>(plan, dp, rank_.layout, units_,
                                                       exchange_setup(options, exchange_notice(options)), adamw_);
        const parallel::MessageCasts casts = parallel::message_casts(plan);
        stage_cast_ = casts.stage;
        groups_ = LayerGroups<C>(tp_, sp_, plan, dp.size(), casts.tensor);
        groups_.attach(pool_);
        warn_uncut(options);
    }

public:
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
    // What the tensor-parallel policy did to each layer, by unit (the same on
    // every rank; empty without a tp axis). `std::cout << exec.cut_report()`.
    [[nodiscard]] const tp::CutReport& cut_report() const noexcept { return cuts_; }
    [[nodiscard]] const std::vector<nn::Unit>& units() const noexcept { return units_; }
    [[nodiscard]] int zero_stage() const noexcept { return stage_; }
    [[nodiscard]] int micro_batches() const noexcept { return micro_batches_; }
    [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return optimizer_steps_; }
    [[nodiscard]] Trace& trace() noexcept { return trace_; }
    [[nodiscard]] C& communicator() const noexcept { return *comm_; }
    // Recompute<...>'s state: its choice, after Budget's first step.
    [[nodiscard]] const Recomputation& recomputation() const noexcept { return recompute_; }

    // The parameters' initial values from the counter-based RNG: the serial
    // run's values, on every rank, whatever it keeps of them.
    void initialize(std::uint64_t seed) {
        store_.initialize(rank_.layout, comm_->rank(), seed, initialize_range_);
        optimizer_steps_ = 0;
        exchange_->reset();
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
        groups_.check_micro_batch_rows(rows / micro_batches_);
        adamw_.lr = lr;
        optim::check_config(adamw_);
        inputs_ = inputs;
        targets_ = targets;
        groups_.keep_local_part(inputs_, targets_);
        rows_per_micro_batch_ = rows / micro_batches_;
        loss_sum_ = 0;
        pool_.start_step(rank_.stages.stages(), micro_batches_, recompute_.on() ? static_cast<int>(units_.size()) : 0);
        for (std::size_t i = 0; i < rank_.program.code.size(); ++i) execute(static_cast<int>(i), rank_.program.code[i]);
        ++step_count_;
        if (recompute_.measuring()) choose_recomputation();
        return loss_;
    }

    // Tokens of each row this rank's model saw in the last step: the whole
    // row, or this rank's positions of it when the layer groups split rows.
    [[nodiscard]] std::int64_t tokens_per_sequence() const { return inputs_.rank() == 2 ? inputs_.dim(1) : 0; }

    [[nodiscard]] MemoryReport memory_report() const {
        MemoryReport report;
        report.rank = comm_->rank();
        report.parameters = store_.parameter_bytes();
        report.gradients = store_.gradient_bytes();
        report.optimizer_state = store_.optimizer_bytes();
        report.compression_state = exchange_->state_bytes();
        report.communication_buffers += exchange_->buffer_bytes();
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
    void gather_state(std::span<float> values, std::span<float> m, std::span<float> v);

    // Sets parameters and moments from the dense arrays every rank holds (a
    // checkpoint), keeping what this rank owns; the next step continues the
    // one after `optimizer_steps`.
    void load_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                    std::int64_t optimizer_steps);

    // This rank's part of a sharded checkpoint (exec/sharded_checkpoint.hpp):
    // the parameters and AdamW moments it owns, each element of the model
    // owned by exactly one rank of the world, with their places in the whole
    // model's serial order. No communication.
    struct OwnedState {
        std::vector<float> values, m, v;
        std::vector<std::int64_t> runs;  // (first whole index, count) pairs, in the order of the values
    };
    [[nodiscard]] OwnedState owned_state() const;

    // What a loader must read for this rank alone (exec/sharded_checkpoint.hpp):
    // the whole-model (first, count) runs of the parameters and of the AdamW
    // moments this rank keeps, in the order load_held_state takes them. Its
    // pipeline stage's and tp cut's part of the model; of that, ZeRO 3 keeps
    // the rank's blocks of the values, ZeRO 1 to 3 of the moments. No
    // communication.
    struct HeldRuns {
        std::vector<std::int64_t> values, moments;
    };
    [[nodiscard]] HeldRuns held_runs() const;
    // Sets parameters and moments from the elements held_runs names, in its
    // order: the same state as load_state from the whole arrays.
    void load_held_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                         std::int64_t optimizer_steps);

    // The gradient exchange's per-rank state (parallel/gradient_exchange.hpp):
    // what a checkpoint must keep for an exact resume. Empty for a plain exchange.
    [[nodiscard]] Compression compression() const noexcept { return exchange_->compression(); }
    [[nodiscard]] std::int64_t compression_state_size() const noexcept { return exchange_->state_size(); }
    void save_compression_state(std::span<float> out) const { exchange_->save_state(out); }
    void load_compression_state(std::span<const float> in) { exchange_->load_state(in); }

private:
    // This rank's (tp-cut) state in its local dense order, on every rank of
    // its tp position: collective over dp and pp. gather_state, load_state and
    // these two are defined in exec/executor_state.hpp.
    void gather_local_state(std::span<float> values, std::span<float> m, std::span<float> v);

    void load_local_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                          std::int64_t optimizer_steps);

    // This rank's units' state into the dense arrays (collective over dp).
    void gather_held_state(std::span<float> values, std::span<float> m, std::span<float> v) {
        store_.gather(rank_.layout, *comm_, values, m, v);
    }

    // Where this rank's one-time notices from the gradient exchange go: the
    // first rank of each gradient group at tp position 0 speaks (so each
    // matrix is named once), through options.notice or stderr.
    [[nodiscard]] std::function<void(const std::string&)> exchange_notice(const ExecutorOptions& options) const {
        if (comm_->rank() != 0 || (tp_ != nullptr && tp_->rank() != 0)) return {};
        if (options.notice) return options.notice;
        return [](const std::string& line) { std::cerr << "loom: " << line << "\n"; };
    }

    struct InFlight {
        comm::Request request;
        comm::Request second;  // a send's payload (request is its header)
        std::chrono::steady_clock::time_point issued;
        bool in_flight = false;
        bool accumulate = false;  // a slot reduction whose block is added to the shard when done
    };

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

    // Running the step program: defined in exec/executor_instructions.hpp.
    //
    // timed runs f; with tracing on, it records f under the name `name_of()`
    // gives, which is only built then (no string work per instruction
    // otherwise). On a device the clock waits for the device's work before
    // and after f, so a span is f's time there, not its launch's (tracing
    // costs that wait).
    template <class Name, class F>
    void timed(Name&& name_of, const char* category, int mb, F&& f);
    void issue(int index, comm::Request request);  // instruction `index`'s request, now in flight
    [[nodiscard]] std::string describe_comm(const schedule::Instruction& in) const;  // its name in the trace
    void execute(int index, const schedule::Instruction& in);

    // Passes what chunk `from` produced for micro-batch mb on to chunk `to`:
    // into its inbox when it is here (a gradient is copied, since chunk
    // `from`'s context may close before `to` runs), else to the outbox the
    // next send reads.
    void hand_on(schedule::Payload payload, int from, int to, int mb, const Tensor& t);
    [[nodiscard]] bool chunk_held(int v) const {
        return !pipelined_ || rank_.pipe.rank_of_chunk.at(static_cast<std::size_t>(v)) == pp_rank();
    }

    // The world's first rank: the first of the gradient, pipeline and tp
    // groups (where one-time notices come from).
    [[nodiscard]] bool first_of_world() const {
        return comm_->rank() == 0 && (tp_ == nullptr || tp_->rank() == 0) && (pp_ == nullptr || pp_->rank() == 0);
    }

    // A tensor-parallel strategy that cuts nothing in a unit with weights
    // says so once, from the world's first rank (the first of the gradient,
    // pipeline and tp groups), through options.notice or stderr.
    void warn_uncut(const ExecutorOptions& options) const {
        const std::string line = cuts_.warning();
        if (line.empty() || !first_of_world()) return;
        if (options.notice) options.notice(line);
        else std::cerr << "loom: " << line << "\n";
    }

    // The policies of kind custom in Strategy, in order: each lowers itself
    // into this rank's program (verified again after) and its instance runs
    // the Op::policy instructions it put there.
    template <class Strategy>
    void adopt_policies() {
        Strategy::for_each_policy([&]<class P>(std::type_identity<P>) {
            if constexpr (Policy<P>) {
                if constexpr (P::kind == PolicyKind::custom) {
                    static_assert(ComponentPolicy<P, C>,
                                  "loom::Executor: a policy of kind custom needs a default constructor and "
                                  "`template <class View> void run(View& gradients)` (exec/policy_component.hpp)");
                    adopt(describe<P>(), [](schedule::StepProgram& program, int self) { P::lower(program, self); },
                          std::make_unique<PolicyComponentOf<P, C>>(), typeid(P));
                }
            }
        });
    }

    void adopt(std::string name, void (*lower)(schedule::StepProgram&, int),
               std::unique_ptr<PolicyComponent<C>> component, std::type_index type) {
        LOOM_CHECK(device_.kind == DeviceKind::host, "Executor: policy ", name, " runs on gradients in host memory; ",
                   "the executor's device is ", device_, "; run it on the host");
        exchange_->check_readable_by(name);
        const int self = static_cast<int>(rank_.program.policies.size());
        rank_.program.policies.push_back(name);
        lower(rank_.program, self);
        verify(rank_);
        pending_.resize(rank_.program.code.size());
        components_.push_back(std::move(component));
        component_types_.push_back(type);
    }

    // Lowers recomputation of the units `which` names into the program (an
    // earlier lowering undone first) and verifies it again.
    void relower_recompute(const std::vector<bool>& which) {
        schedule::lower_recompute(rank_.program, which, recompute_.keep());
        verify(rank_);
        pending_.resize(rank_.program.code.size());
    }

    // Budget, after its measuring step: the choice, agreed with every rank.
    void choose_recomputation() {
        std::function<void(const std::string&)> say;
        if (first_of_world()) say = notice_ ? notice_ : [](const std::string& line) { std::cerr << "loom: " << line << "\n"; };
        relower_recompute(recompute_.choose<C>({comm_, pipelined_ ? pp_ : nullptr, tp_}, rank_, device_, say));
        pool_.drop_unit_contexts();
    }

    // Calls f(group, first, a, b, owner) for each run [a, b) of a group's
    // elements that this rank's optimizer step updates (its storage starts
    // at element `first` of the group: 0 at ZeRO 0, the rank's block after),
    // split where the owner changes (exec/policy_component.hpp): every dp
    // rank's runs at ZeRO 0 are copies of the first's; a tp rank's copy of a
    // Param the cut left whole is owned by one tp rank (TensorShards::owns).
    template <class F>
    void for_each_updated_run(F&& f) const {
        const int r = comm_->rank();
        const bool dp_owner = stage_ > 0 || r == 0;
        const auto copies = tp_ != nullptr ? shards_.copies(tp_->rank())
                                           : std::vector<std::pair<std::int64_t, std::int64_t>>{};
        for (int gi = 0; gi < static_cast<int>(rank_.layout.groups().size()); ++gi) {
            const auto& g = rank_.layout.group(gi);
            const std::int64_t lo = stage_ == 0 ? 0 : r * g.block;
            const std::int64_t end = std::min(g.numel, stage_ == 0 ? g.numel : lo + g.block);
            const auto emit = [&](std::int64_t from, std::int64_t to, bool owner) {
                if (to > from) f(gi, lo, from, to, owner && dp_owner);
            };
            std::int64_t k = lo;
            for (const auto& [first, last] : copies) {
                const std::int64_t a = std::clamp(first - g.dense_offset, k, std::max(k, end));
                const std::int64_t b = std::clamp(last - g.dense_offset, a, std::max(a, end));
                emit(k, a, true);
                emit(a, b, false);
                k = b;
            }
            emit(k, end, true);
        }
    }

    // The gradients this rank's optimizer step updates, as the runs above.
    [[nodiscard]] std::vector<GradientBlock> gradient_blocks() {
        std::vector<GradientBlock> blocks;
        for_each_updated_run([&](int gi, std::int64_t first, std::int64_t a, std::int64_t b, bool owner) {
            const auto& g = rank_.layout.group(gi);
            float* base = stage_ >= 2 ? store_.grad_shard.data<float>() + g.shard_offset
                                      : store_.grads.data<float>() + g.offset + first;
            blocks.push_back({{base + (a - first), static_cast<std::size_t>(b - a)}, owner});
        });
        return blocks;
    }

    void run_policy(int index) {
        if (gradients_.blocks.empty()) {
            gradients_.blocks = gradient_blocks();
            for (C* axis : {comm_, pipelined_ ? pp_ : nullptr, tp_})
                if (axis != nullptr && axis->size() > 1) gradients_.axes.push_back(axis);
        }
        gradients_.optimizer_steps = optimizer_steps_;
        components_.at(static_cast<std::size_t>(index))->run(gradients_);
    }

    // Defined in exec/executor_instructions.hpp, as hand_on and finish are.
    void send(int index, const schedule::Instruction& in);
    void recv(const schedule::Instruction& in);
    // Waits for instruction `target`'s communication, traces it, and adds a
    // slot reduction's block into the shard.
    void finish(int target);

    // What the gradient exchange may read of the optimizer (parallel/gradient_exchange.hpp).
    [[nodiscard]] parallel::OptimizerArrays optimizer_arrays() const {
        return {optimizer_steps_, store_.grads.tensor(), store_.m.tensor()};
    }

    void optimizer_step() {
        const std::int64_t step = ++optimizer_steps_;
        exchange_->before_optimizer_step(optimizer_arrays());
        store_.optimizer_step(rank_.layout, comm_->rank(), step, adamw_);
    }

    C* comm_;
    C* pp_;
    C* tp_;
    C* sp_;  // the axis the layer groups split rows over; null without one
    tp::CutReport cuts_;  // what the tensor-parallel policy did to each layer
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
    MicroBatchPool pool_;
    Recomputation recompute_;  // Recompute<...>: off without one
    std::function<void(const std::string&)> notice_;  // options.notice, for Budget's one line
    // Before pending_: an exchange's request still in flight when the executor
    // goes (after a failure) may finish into the exchange, which must still exist.
    std::unique_ptr<parallel::GradientExchange<C>> exchange_;  // the plan's (parallel/plan_exchanges.hpp)
    // The policies of kind custom, by their index in the program's policies.
    std::vector<std::unique_ptr<PolicyComponent<C>>> components_;
    std::vector<std::type_index> component_types_;
    GradientView<C> gradients_;  // what a component sees (blocks found at its first run)
    std::vector<InFlight> pending_;  // by instruction index: no allocation per step
    std::vector<bool> reduced_;      // by group: reduced already this step
    std::optional<kernels::host::Cast> stage_cast_;  // what stage messages are cast to; none: f32
    Tensor inputs_, targets_, activation_;
    std::int64_t rows_per_micro_batch_ = 0;
    float seed_ = 1.0f;
    float loss_sum_ = 0, loss_ = 0;
};

}  // namespace loom::exec

// The out-of-class members: running the step program, and the checkpoint state.
#include "loom/exec/executor_instructions.hpp"  // IWYU pragma: keep
#include "loom/exec/executor_state.hpp"         // IWYU pragma: keep

namespace loom {

// What one rank holds for training, by purpose (see exec/memory.hpp).
template <comm::Communicator C>
[[nodiscard]] MemoryReport memory_report(const exec::Executor<C>& executor) {
    return executor.memory_report();
}

}  // namespace loom
