// The open policy protocol (parallel/policy.hpp, exec/policy_component.hpp):
// a policy of kind custom lowers itself into the step program, the program
// stays verified and prints it by name, and its component sees each rank's
// gradients with exactly one owner per element, whatever the strategy: the
// global gradient norm it computes equals the serial run's under dp at every
// ZeRO stage, Megatron 1D, Optimus 2D, sequence parallelism and a pipeline.
// examples/custom_policy.cpp trains with such a policy (gradient clipping)
// and checks the result against serial clipping.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/parallel/grad_compress.hpp>
#include <loom/parallel/optimus2d.hpp>
#include <loom/parallel/sequence_parallel.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/parallel/tensor_parallel.hpp>
#include <loom/schedule/data_parallel.hpp>
#include <loom/schedule/verify.hpp>

#include "support/message_of.hpp"
#include "support/small_gpt_units.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::schedule::Op;

namespace {

// Records the whole model's gradient norm each step; changes nothing.
struct NormProbe {
    static constexpr loom::PolicyKind kind = loom::PolicyKind::custom;
    static void describe(std::ostream& out) { out << "NormProbe"; }
    static void lower(loom::schedule::StepProgram& program, int self) {
        program.insert_before(Op::optimizer_step, {.op = Op::policy, .policy = self});
    }
    template <class View>
    void run(View& gradients) {
        norms.push_back(std::sqrt(gradients.sum_over_axes(static_cast<float>(gradients.owned_squared_norm()))));
        runs += 1;
    }
    std::vector<float> norms;
    int runs = 0;
};

const loom::gpt::Config config{.layers = 2, .width = 32, .heads = 4, .seq = 16, .vocab = 64};
constexpr std::int64_t batch = 16;
constexpr std::uint64_t seed = 11;

const loom::data::ByteCorpus& corpus() {
    static const auto c = loom::data::ByteCorpus::synthetic(1 << 14, seed, 64);
    return c;
}

// The serial run's first-step gradient norm.
float serial_norm() {
    auto model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, seed);
    std::vector<std::int32_t> x(static_cast<std::size_t>(batch * config.seq)), y(x.size());
    corpus().batch(seed, 0, batch, config.seq, x, y);
    loom::nn::Context ctx;
    arena.zero_grads();
    (void)loom::nn::forward_backward(model, ctx, loom::Tensor::of(x.data(), {batch, config.seq}),
                                     loom::Tensor::of(y.data(), {batch, config.seq}));
    double squares = 0;
    for (float g : arena.grads()) squares += static_cast<double>(g) * g;
    return static_cast<float>(std::sqrt(squares));
}

struct Axes {
    int dp = 1, pp = 1, tp = 1, sp = 1;
};

// One step of Strategy on dp x pp x tp x sp rank threads: every rank's
// probe's norm (they must all be equal) and the policy line of rank 0's program.
template <class Strategy>
std::vector<float> probe_norms(Axes a, std::string* program_text = nullptr) {
    const int ranks = a.dp * a.pp * a.tp * a.sp;
    std::vector<float> norms(static_cast<std::size_t>(ranks), -1.0f);
    loom::comm::ThreadWorld(ranks).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::Mesh<loom::comm::ThreadComm> mesh(comm, {{"dp", a.dp}, {"pp", a.pp}, {"tp", a.tp}, {"sp", a.sp}});
        auto model = loom::gpt::make_model(config);
        auto exec = loom::exec::Executor<loom::comm::ThreadComm>::make<Strategy>(model, mesh, {.micro_batches = 2});
        exec.initialize(seed);
        const std::int64_t rows = batch / a.dp;
        std::vector<std::int32_t> x(static_cast<std::size_t>(rows * config.seq)), y(x.size());
        corpus().rows(seed, 0, mesh.coordinate("dp") * rows, rows, config.seq, x, y);
        (void)exec.step(loom::Tensor::of(x.data(), {rows, config.seq}), loom::Tensor::of(y.data(), {rows, config.seq}),
                        1e-3f);
        const NormProbe* probe = exec.template policy<NormProbe>();
        norms[static_cast<std::size_t>(comm.rank())] = probe != nullptr && probe->runs == 1 ? probe->norms[0] : -1.0f;
        if (comm.rank() == 0 && program_text != nullptr) {
            std::ostringstream out;
            out << exec.program();
            *program_text = out.str();
        }
    });
    return norms;
}

void check_norms(const std::vector<float>& norms, float serial) {
    for (std::size_t r = 0; r < norms.size(); ++r) {
        INFO("rank " << r << ": " << norms[r] << ", serial " << serial);
        CHECK(std::abs(norms[r] - serial) <= 1e-5f * serial);
        CHECK(norms[r] == norms[0]);  // the same value on every rank, bit for bit
    }
}

}  // namespace

TEST_CASE("a policy's instruction goes into the program; later waits follow it", "[parallel][policy]") {
    loom::schedule::StepProgram program;
    program.emit({.op = Op::reduce_grads, .group = 0, .reduction = loom::schedule::Reduction::all_reduce});
    program.emit({.op = Op::wait, .target = 0});
    program.emit({.op = Op::gather_params, .group = 0});
    program.emit({.op = Op::optimizer_step});
    program.emit({.op = Op::wait, .target = 2});
    program.policies.push_back("NormProbe");
    CHECK(program.insert_before(Op::optimizer_step, {.op = Op::policy, .policy = 0}) == 1);
    REQUIRE(program.code.size() == 6);
    CHECK(program.code[3].op == Op::policy);
    CHECK(program.code[1].target == 0);  // before the insertion: unchanged
    CHECK(program.code[5].target == 2);  // a target before the insertion point keeps its index
    program.insert(0, {.op = Op::policy, .policy = 0});
    CHECK(program.code[2].target == 1);
    CHECK(program.code[6].target == 3);
    std::ostringstream out;
    out << program;
    CHECK(out.str().find("#4 policy p0 NormProbe") != std::string::npos);
}

TEST_CASE("the verifier refuses a policy instruction that names no policy", "[parallel][policy]") {
    namespace small = loom_test::small_gpt;
    const auto layout = small::layout_for(0, 1);
    auto program = loom::schedule::data_parallel_program(layout, small::unit_count, 0, 1);
    program.insert_before(Op::optimizer_step, {.op = Op::policy, .policy = 0});
    CHECK(small::verify_message(program, layout).find("names policy 0 but the program has 0") != std::string::npos);
    program.policies.push_back("NormProbe");
    CHECK(small::verify_message(program, layout) == "(no error)");
}

TEST_CASE("a strategy prints its custom policy, and its value ignores it", "[parallel][policy]") {
    using S = loom::Strategy<loom::DataParallel<>, loom::ZeroShard<2>, NormProbe>;
    std::ostringstream out;
    out << S{};
    CHECK(out.str() == "Strategy<DataParallel<bucket 2 MiB>, ZeroShard<2>, NormProbe>");
    CHECK(S::spec == loom::Strategy<loom::DataParallel<>, loom::ZeroShard<2>>::spec);
}

TEST_CASE("a custom policy sees each gradient element once: its global norm equals serial", "[parallel][policy]") {
    const float serial = serial_norm();
    std::string program;
    SECTION("dp 2 at ZeRO 0, 1, 2 and 3") {
        check_norms(probe_norms<loom::Strategy<loom::DataParallel<>, NormProbe>>({.dp = 2}, &program), serial);
        CHECK(program.find("policy p0 NormProbe") != std::string::npos);
        check_norms(probe_norms<loom::Strategy<loom::ZeroShard<1>, NormProbe>>({.dp = 2}), serial);
        check_norms(probe_norms<loom::Strategy<loom::ZeroShard<2>, NormProbe>>({.dp = 2}), serial);
        check_norms(probe_norms<loom::Strategy<loom::ZeroShard<3>, NormProbe>>({.dp = 2}), serial);
    }
    SECTION("Megatron tp 2 with dp 2, and Optimus 2D on a 2 x 2 grid") {
        check_norms(probe_norms<loom::Strategy<loom::TensorParallel, NormProbe>>({.dp = 2, .tp = 2}), serial);
        check_norms(probe_norms<loom::Strategy<loom::Optimus2D, NormProbe>>({.tp = 4}), serial);
    }
    SECTION("sequence parallel sp 2, and a 1F1B pipeline pp 2 with tp 2 at ZeRO 3") {
        check_norms(probe_norms<loom::Strategy<loom::SequenceParallel<>, NormProbe>>({.sp = 2}), serial);
        check_norms(probe_norms<loom::Strategy<loom::Pipeline<loom::OneFOneB>, loom::TensorParallel, loom::ZeroShard<3>,
                                               NormProbe>>({.dp = 2, .pp = 2, .tp = 2}),
                    serial);
    }
}

TEST_CASE("a custom policy is refused where the gradients it would read are not the step's", "[parallel][policy]") {
    // OneBit at ZeRO 0 mixes the gradients into the momentum before they are reduced.
    std::vector<std::string> messages(2);
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        auto model = loom::gpt::make_model(config);
        messages[static_cast<std::size_t>(comm.rank())] = loom_test::message_of([&] {
            (void)loom::exec::Executor<loom::comm::ThreadComm>::make<
                loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::OneBit>, NormProbe>>(model, comm);
        });
    });
    for (const std::string& message : messages)
        CHECK(message == "Executor: policy NormProbe would read gradients that OneBit mixes into the momentum at ZeRO 0; "
                         "use ZeroShard<1> or more");
}

TEST_CASE("an executor without the policy has no instance of it", "[parallel][policy]") {
    loom::comm::ThreadWorld(1).run([&](loom::comm::ThreadComm& comm) {
        auto model = loom::gpt::make_model(config);
        auto exec = loom::exec::Executor<loom::comm::ThreadComm>::make<loom::Strategy<loom::DataParallel<>>>(model, comm);
        CHECK(exec.policy<NormProbe>() == nullptr);
        CHECK(exec.program().count(Op::policy) == 0);
    });
}

}  // namespace LOOM_TEST_FILE
