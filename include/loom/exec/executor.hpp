// The executor: the interpreter of one rank's step program. It holds the
// components the program's instructions act on (the parameter store, the
// gradient exchange, the micro-batch pool, the layer groups, the requests in
// flight, the program components and the adopted policies) and runs the program,
// in order, for each step. Every rank constructs one with the same model and strategy
// and calls step() with its rows of the global batch; the losses, gradients
// and parameters are the serial run's, up to the order of floating-point sums.
//
//   using S = loom::Strategy<loom::DataParallel<>, loom::ZeroShard<2>>;
//   auto exec = loom::exec::Executor<ThreadComm>::make<S>(model, mesh, {.micro_batches = 4});
//   exec.initialize(seed);
//   float loss = exec.step(my_inputs, my_targets, lr);
//
// How it assembles its components is exec/executor_assembly.hpp, how each
// instruction runs exec/executor_instructions.hpp, the checkpoint state
// exec/executor_state.hpp: this header is what an executor holds and offers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/init.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/adopted_policies.hpp"
#include "loom/exec/execution_plan.hpp"
#include "loom/exec/memory.hpp"
#include "loom/exec/micro_batch_pool.hpp"
#include "loom/exec/parameter_store.hpp"
#include "loom/exec/rank_program.hpp"
#include "loom/exec/requests_in_flight.hpp"
#include "loom/exec/step_batch.hpp"
#include "loom/exec/tensor_shards.hpp"
#include "loom/exec/trace.hpp"
#include "loom/exec/updated_runs.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/nn/units.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/cut_report.hpp"
#include "loom/parallel/gradient_exchange.hpp"
#include "loom/parallel/layer_groups.hpp"
#include "loom/parallel/plan_exchanges.hpp"
#include "loom/parallel/program_component.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/parallel/strategy.hpp"  // Strategy<...>, what make<Strategy> takes

namespace loom::exec {

template <comm::Communicator C>
class Executor {
public:
    // Every axis of `mesh` the strategy uses: dp always, pp with a Pipeline,
    // tp and sp with the policies that cut layers over them (an axis the mesh
    // lacks counts as size 1). With an sp axis, gradients are reduced over dp x sp.
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, comm::Mesh<C>& mesh, const ExecutorOptions& options = {}) {
        const bool sp = mesh.has("sp") && mesh.size("sp") > 1;
        return made<Strategy>(Executor(model, sp ? mesh.combined({"dp", "sp"}) : mesh.axis("dp"),
                                       mesh.has("pp") ? &mesh.axis("pp") : nullptr, mesh.has("tp") ? &mesh.axis("tp") : nullptr,
                                       sp ? &mesh.axis("sp") : nullptr, ExecutionPlan::of<Strategy>(), options));
    }
    // Only a dp axis, or (a pipelined strategy) dp and pp, whose rank is the stage.
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, C& dp, const ExecutorOptions& options = {}) {
        return made<Strategy>(Executor(model, dp, nullptr, ExecutionPlan::of<Strategy>(), options));
    }
    template <class Strategy, class Model>
    [[nodiscard]] static Executor make(Model& model, C& dp, C& pp, const ExecutorOptions& options = {}) {
        return made<Strategy>(Executor(model, dp, &pp, ExecutionPlan::of<Strategy>(), options));
    }

    // From a strategy's value: `model` must outlive the executor and not move
    // (its Params are bound to the executor's storage). A null axis has one
    // rank. With a tp axis the model is cut here (tp::shard_model) before
    // anything is laid out; with an sp axis, `dp` must be the dp x sp group
    // (gradients are partial over tokens), each rank's step() gets its
    // replica's whole rows, and the layer groups keep this rank's part.
    template <class Model>
    Executor(Model& model, C& dp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : Executor(model, dp, nullptr, nullptr, nullptr, plan, options) {}
    template <class Model>
    Executor(Model& model, C& dp, C* pp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : Executor(model, dp, pp, nullptr, nullptr, plan, options) {}
    template <class Model>
    Executor(Model& model, C& dp, C* pp, C* tp, C* sp, const ExecutionPlan& plan, const ExecutorOptions& options)
        : Executor(model, dp, pp, parallel::layer_axes(plan, tp, sp), plan, options) {}

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
    // What the tensor-parallel cut did to each layer, by unit (the same on
    // every rank; empty without a tp axis). `std::cout << exec.cut_report()`.
    [[nodiscard]] const tp::CutReport& cut_report() const noexcept { return cuts_; }
    [[nodiscard]] const std::vector<nn::Unit>& units() const noexcept { return units_; }
    [[nodiscard]] int micro_batches() const noexcept { return micro_batches_; }
    [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return optimizer_steps_; }
    [[nodiscard]] Trace& trace() noexcept { return trace_; }
    [[nodiscard]] C& communicator() const noexcept { return *comm_; }
    [[nodiscard]] Device device() const noexcept { return device_; }  // where its state and work live
    // This rank's instance of a policy's run-time state of type P: a policy of
    // kind custom, or a component a built-in policy installed
    // (parallel::Recomputation: Budget's choice()); null when it has none.
    template <class P>
    [[nodiscard]] const P* policy() const {
        if (const P* custom = adopted_.template find<P>()) return custom;
        return parallel::find_component<P>(components_);
    }

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
        adamw_.lr = lr;
        return run_program(inputs, targets, true);
    }

    // For an optimizer that keeps its own state and steps outside the
    // executor (OptEx, optim/optex.hpp): the parameters set from the whole
    // model's values (the serial order); and one step's program run without
    // its optimizer step, returning step()'s loss and writing the averaged
    // gradient, as the optimizer step would read it, into g (the serial
    // order, the same on every rank). Recompute<...> and any custom policy
    // run as in step(). Both need every array whole on every rank: ZeRO
    // stage 0, no pipeline, no tensor or sequence cut.
    void set_parameters(std::span<const float> values);
    [[nodiscard]] float gradient(const Tensor& inputs, const Tensor& targets, std::span<float> g);

    // Tokens of each row this rank's model saw in the last step: the whole
    // row, or this rank's positions of it when the layer groups split rows.
    [[nodiscard]] std::int64_t tokens_per_sequence() const { return batch_.tokens_per_sequence(); }

    // The state, defined in exec/executor_state.hpp: what this rank holds, by
    // purpose; the whole model gathered or loaded (collective); a sharded
    // checkpoint's part of it (no communication).
    [[nodiscard]] MemoryReport memory_report() const;
    void gather_state(std::span<float> values, std::span<float> m, std::span<float> v);
    void load_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                    std::int64_t optimizer_steps);
    [[nodiscard]] OwnedState owned_state() const;
    [[nodiscard]] HeldRuns held_runs() const;
    void load_held_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                         std::int64_t optimizer_steps);

    // The gradient exchange (parallel/gradient_exchange.hpp): its per-rank
    // state is what a checkpoint keeps for an exact resume (none for a plain one).
    [[nodiscard]] parallel::GradientExchange<C>& gradient_exchange() noexcept { return *exchange_; }
    [[nodiscard]] const parallel::GradientExchange<C>& gradient_exchange() const noexcept { return *exchange_; }

private:
    // The public constructors' work, with the tp and sp axes checked against the plan.
    template <class Model>
    Executor(Model& model, C& dp, C* pp, parallel::LayerAxes<C> axes, const ExecutionPlan& plan, const ExecutorOptions& options)
        : comm_(&dp), pp_(pp), tp_(axes.tp), sp_(axes.sp),
          cuts_(parallel::cut_model(model, tp_, plan.tensor_grid, options.field_names)),
          shards_(model, tp_ != nullptr ? tp_->size() : 1),
          units_(nn::units_of(model, options.field_names)),
          micro_batches_(options.micro_batches), adamw_(options.adamw), device_(options.device),
          pipelined_(parallel::check_pipeline_axis(plan, pp != nullptr ? pp->size() : 1)),
          rank_(exec::rank_program(units_, dp.size(), pp_size(), pp_rank(), plan, options)),
          trace_(options.trace),
          initialize_range_([&model](std::uint64_t seed, std::span<float> out, std::int64_t first) {
              loom::initialize_range(model, seed, out, first);
          }) {
        assemble(plan, options);
    }

    // The policies of kind custom in Strategy, in order: each lowers itself
    // into this rank's program (verified again) and runs its Op::policy instructions.
    template <class Strategy>
    [[nodiscard]] static Executor made(Executor exec) {
        exec.adopted_.template adopt_all<Strategy>(exec.rank_, exec.device_, *exec.exchange_);
        exec.in_flight_.resize(exec.rank_.program.code.size());
        return exec;
    }

    [[nodiscard]] int pp_size() const { return pp_ != nullptr ? pp_->size() : 1; }
    [[nodiscard]] int pp_rank() const { return pp_ != nullptr ? pp_->rank() : 0; }
    // DP programs name no chunk: the whole model is chunk 0.
    [[nodiscard]] static int chunk_of(const schedule::Instruction& in) { return in.chunk < 0 ? 0 : in.chunk; }
    [[nodiscard]] bool chunk_held(int v) const {
        return !pipelined_ || rank_.pipe.rank_of_chunk.at(static_cast<std::size_t>(v)) == pp_rank();
    }
    // The world's first rank: the first of the gradient, pipeline and tp groups.
    [[nodiscard]] bool first_of_world() const {
        return comm_->rank() == 0 && (tp_ == nullptr || tp_->rank() == 0) && (pp_ == nullptr || pp_->rank() == 0);
    }

    // The components, assembled from the plan (exec/executor_assembly.hpp).
    void assemble(const ExecutionPlan& plan, const ExecutorOptions& options);
    // One step's program on this rank's rows, with or without its optimizer step.
    float run_program(const Tensor& inputs, const Tensor& targets, bool optimizer);
    // Why gradient() and set_parameters() cannot run here ("" when they can).
    [[nodiscard]] std::string whole_arrays_refusal() const;
    // Binds the Params of layout group g (nn::bind_units).
    void bind(int g, float* values, float* grads, nn::Bind which = nn::Bind::both);
    void run_policy(int index);  // Op::policy: the adopted policy `index`
    void optimizer_step();
    // What the gradient exchange may read of the optimizer (parallel/gradient_exchange.hpp).
    [[nodiscard]] parallel::OptimizerArrays optimizer_arrays() const;
    // After a component lowered itself: the program verified again, and what the step keeps sized for it.
    void lowered();
    // After a measured step: each component lowers itself again, with its peers.
    void relower_components();

    // Running the step program, defined in exec/executor_instructions.hpp.
    // timed runs f, and with tracing on records it under the name name_of()
    // gives (built only then); on a device the clock waits for the device's
    // work before and after f, so a span is f's time there.
    template <class Name, class F>
    void timed(Name&& name_of, const char* category, int mb, F&& f);
    [[nodiscard]] std::string describe_comm(const schedule::Instruction& in) const;  // its name in the trace
    void execute(int index, const schedule::Instruction& in);
    // What chunk `from` produced for micro-batch mb, on to chunk `to`: its
    // inbox here (a gradient copied, since `from`'s context may close first),
    // else the outbox the next send reads.
    void hand_on(schedule::Payload payload, int from, int to, int mb, const Tensor& t);
    void send(int index, const schedule::Instruction& in);
    void recv(const schedule::Instruction& in);
    // Waits for instruction `target`'s communication, traces it, and adds a
    // slot reduction's block into the shard.
    void finish(int target);
    void gather_local_state(std::span<float> values, std::span<float> m, std::span<float> v);
    void load_local_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                          std::int64_t optimizer_steps);

    // The elements this rank's optimizer step updates (exec/updated_runs.hpp).
    [[nodiscard]] UpdatedElements updated_elements() const {
        return {&rank_.layout, store_.placement(), comm_->rank(),
                tp_ != nullptr ? shards_.copies(tp_->rank()) : decltype(UpdatedElements::copies){}};
    }

    C* comm_;            // the gradient axis: dp, or dp x sp
    C *pp_, *tp_, *sp_;  // null: one rank (sp_: the axis the layer groups split rows over)
    tp::CutReport cuts_;  // what the tensor-parallel cut did to each layer
    TensorShards shards_;
    std::vector<nn::Unit> units_;
    int micro_batches_;
    optim::AdamWConfig adamw_;
    Device device_;
    bool pipelined_;
    RankProgram rank_;  // the schedule, this rank's units and layout, and its verified step program
    Trace trace_;
    InitializeRange initialize_range_;

    ParameterStore store_;      // parameters, gradients, moments and slots, placed as the strategy says
    DeviceBuffer loss_buffer_;  // the step's loss on a device, for a device communicator
    std::int64_t optimizer_steps_ = 0, step_count_ = 0;

    parallel::LayerGroups<C> groups_;  // the tp and sp groups the layers talk to
    MicroBatchPool pool_;
    parallel::ProgramComponents<C> components_;       // the policies' run-time lowerings
    bool measuring_ = false;                          // this step measures the units for them
    bool drops_activations_ = false;                  // the program recomputes: per-unit contexts
    std::function<void(const std::string&)> notice_;  // options.notice, for the components' lines
    // Before in_flight_: an exchange's request still in flight when the executor
    // goes (after a failure) may finish into the exchange, which must still exist.
    std::unique_ptr<parallel::GradientExchange<C>> exchange_;  // the plan's (parallel/plan_exchanges.hpp)
    AdoptedPolicies<C> adopted_;     // the policies of kind custom, by their index in the program's policies
    RequestsInFlight in_flight_;
    std::vector<bool> reduced_;      // by group: reduced already this step
    std::optional<kernels::host::Cast> stage_cast_;  // what stage messages are cast to; none: f32
    StepBatch batch_;  // this rank's rows of the step's batch
    Tensor activation_;
    float seed_ = 1.0f, loss_sum_ = 0, loss_ = 0;
};

}  // namespace loom::exec

// The out-of-class members: assembling, running the step program, and the checkpoint state.
#include "loom/exec/executor_assembly.hpp"      // IWYU pragma: keep
#include "loom/exec/executor_instructions.hpp"  // IWYU pragma: keep
#include "loom/exec/executor_state.hpp"         // IWYU pragma: keep
