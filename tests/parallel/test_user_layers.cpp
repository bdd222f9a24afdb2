// User layers are first-class: a layer of the user's own that declares its
// nn::TensorCut is cut by Megatron 1D and Optimus 2D exactly as loom's own
// layers are, and trains to the serial run; one that declares nothing runs
// whole (1D, and the executor says so once) or is refused by name (2D). The
// cut report of a GPT block, as train_gpt prints it.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/parallel/optimus2d.hpp>
#include <loom/parallel/tensor_parallel_model.hpp>

#include "support/message_of.hpp"

namespace nn = loom::nn;
using loom::Shape;
using loom::Tensor;

namespace {

// x * sigmoid(x), on the host: the forward and backward of both Swishes.
struct SwishSaved {
    Tensor x;
};
Tensor swish_forward(const void* layer, nn::Context& ctx, const Tensor& x) {
    ctx.saved<SwishSaved>(layer).x = x;
    Tensor y = ctx.alloc(x.shape());
    const auto in = x.span<const float>();
    const auto out = y.span<float>();
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] / (1.0f + std::exp(-in[i]));
    return y;
}
Tensor swish_backward(const void* layer, nn::Context& ctx, const Tensor& dy) {
    const auto x = ctx.saved<SwishSaved>(layer).x.span<const float>();
    Tensor dx = ctx.alloc(dy.shape());
    const auto g = dy.span<const float>();
    const auto out = dx.span<float>();
    for (std::size_t i = 0; i < x.size(); ++i) {
        const float s = 1.0f / (1.0f + std::exp(-x[i]));
        out[i] = g[i] * (s + x[i] * s * (1.0f - s));
    }
    return dx;
}

// A user's elementwise layer that declares its cut (and its name).
struct Swish {
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::elementwise;
    static constexpr std::string_view name = "Swish";
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) { return swish_forward(this, ctx, x); }
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) { return swish_backward(this, ctx, dy); }
};

// The same layer declaring nothing.
struct PlainSwish {
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) { return swish_forward(this, ctx, x); }
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) { return swish_backward(this, ctx, dy); }
};

// The spelling before TensorCut, deprecated but still honoured.
struct LegacySwish {
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) { return swish_forward(this, ctx, x); }
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) { return swish_backward(this, ctx, dy); }
};

}  // namespace
template <>
inline constexpr bool loom::tp::keeps_features_sharded<LegacySwish> = true;
namespace {

// An elementwise layer with a Param: refused, it would see a slice of the features.
struct Scaled {
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::elementwise;
    static constexpr std::string_view name = "Scaled";
    loom::Param gain{Shape{4}, loom::Init::ones()};
    [[nodiscard]] Tensor forward(nn::Context&, const Tensor& x) { return x; }
    [[nodiscard]] Tensor backward_input(nn::Context&, const Tensor& dy) { return dy; }
};
struct WithScaled {
    nn::Linear up;
    Scaled scale;
    nn::Linear down;
};

template <class Act>
struct Net {
    nn::Embedding embed;
    nn::Residual<nn::LayerNorm, nn::Linear, Act, nn::Linear> mlp;
    nn::LayerNorm norm;
    nn::Linear head;
    nn::CrossEntropy loss;
};

constexpr std::int64_t V = 256, T = 8, C = 16, rows = 4;  // V: the byte corpus

template <class Act>
Net<Act> make_net() {
    return {nn::Embedding::make(V, T, C),
            {{nn::LayerNorm::make(C), nn::Linear::make(C, 4 * C), Act{}, nn::Linear::make(4 * C, C)}},
            nn::LayerNorm::make(C),
            nn::Linear::make(C, V),
            {}};
}

const std::vector<std::string> net_fields{"embed", "mlp", "norm", "head", "loss"};

struct Trained {
    std::vector<float> losses, params;
    std::string report, notice;
    int noticed = 0;  // ranks that heard a notice
};

// Three steps of `Strategy` over `tp` ranks; rank 0's losses, parameters
// (whole, serial layout), cut report and notice.
template <class Strategy, class Act>
Trained train(int tp) {
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 12, 1);
    Trained result;
    std::atomic<int> noticed{0};
    loom::comm::ThreadWorld(tp).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::Mesh<loom::comm::ThreadComm> mesh(comm, {{"dp", 1}, {"tp", tp}});
        auto model = make_net<Act>();
        std::string notice;
        auto exec = loom::exec::Executor<loom::comm::ThreadComm>::make<Strategy>(
            model, mesh, {.field_names = net_fields, .notice = [&](const std::string& line) {
                        notice += line;
                        ++noticed;
                    }});
        exec.initialize(7);
        std::vector<std::int32_t> x(rows * T), y(rows * T);
        std::vector<float> losses;
        for (int step = 0; step < 3; ++step) {
            corpus.rows(1, step, 0, rows, T, x, y);
            losses.push_back(exec.step(Tensor::of(x.data(), {rows, T}), Tensor::of(y.data(), {rows, T}), 1e-2f));
        }
        const auto n = static_cast<std::size_t>(exec.parameter_count());
        std::vector<float> values(n), m(n), v(n);
        exec.gather_state(values, m, v);
        if (comm.rank() == 0) {
            std::ostringstream report;
            report << exec.cut_report();
            result = {losses, values, report.str(), notice};
        }
    });
    result.noticed = noticed.load();
    return result;
}

void check_equal(const Trained& parallel, const Trained& serial) {
    REQUIRE(parallel.losses.size() == serial.losses.size());
    for (std::size_t i = 0; i < serial.losses.size(); ++i)
        CHECK(std::abs(parallel.losses[i] - serial.losses[i]) <= 1e-5f * std::abs(serial.losses[i]));
    float scale = 0;
    for (float p : serial.params) scale = std::max(scale, std::abs(p));
    REQUIRE(parallel.params.size() == serial.params.size());
    float worst = 0;
    for (std::size_t k = 0; k < serial.params.size(); ++k)
        worst = std::max(worst, std::abs(parallel.params[k] - serial.params[k]) / scale);
    CHECK(worst <= 1e-5f);
}

using Serial = loom::Strategy<loom::DataParallel<>>;
using Megatron = loom::Strategy<loom::DataParallel<>, loom::TensorParallel>;
using Optimus = loom::Strategy<loom::DataParallel<>, loom::Optimus2D>;

}  // namespace

TEST_CASE("a user's elementwise layer is cut by Megatron 1D as Gelu is, and trains as the serial run",
          "[parallel][tp][user-layer]") {
    auto gelu = make_net<nn::Gelu>();
    auto swish = make_net<Swish>();
    loom::tp::CutReport gelu_report, swish_report;
    const auto g = loom::tp::shard_model(gelu, 1, 2, &gelu_report, net_fields);
    const auto s = loom::tp::shard_model(swish, 1, 2, &swish_report, net_fields);
    CHECK(s.linear_pairs == 1);
    CHECK(s.linear_pairs == g.linear_pairs);
    CHECK(s.vocab_heads == g.vocab_heads);
    CHECK(std::get<1>(swish.mlp.layers).split == nn::Split::columns);
    CHECK(std::get<1>(swish.mlp.layers).weight.shape == Shape{32, 16});  // 4C / 2 outputs
    CHECK(std::get<3>(swish.mlp.layers).split == nn::Split::rows);
    REQUIRE(swish_report.layers().size() == gelu_report.layers().size());
    for (std::size_t i = 0; i < swish_report.layers().size(); ++i)
        CHECK(swish_report.layers()[i].action == gelu_report.layers()[i].action);
    std::ostringstream text;
    text << swish_report;
    CHECK(text.str().find("mlp Residual: 0 LayerNorm replicated; 1 Linear column-parallel (output features cut); "
                          "2 Swish elementwise on the shard; 3 Linear row-parallel (input features cut)") !=
          std::string::npos);

    const Trained serial = train<Serial, Swish>(1);
    const Trained tp2 = train<Megatron, Swish>(2);
    check_equal(tp2, serial);
    CHECK(tp2.notice.empty());  // every unit with weights is cut

    auto legacy = make_net<LegacySwish>();
    CHECK(loom::tp::shard_model(legacy, 1, 2).linear_pairs == 1);  // tp::keeps_features_sharded still works
}

TEST_CASE("Optimus 2D accepts a user's elementwise layer and trains as the serial run", "[parallel][tp][2d][user-layer]") {
    auto swish = make_net<Swish>();
    CHECK(loom::tp::shard_model_grid(swish, 3, 4) == 7);  // embed, 2 LayerNorms, 3 Linears, the loss
    check_equal(train<Optimus, Swish>(4), train<Serial, Swish>(1));
}

TEST_CASE("a user layer that declares no cut runs whole under 1D, is reported once, and is refused by 2D by name",
          "[parallel][tp][user-layer]") {
    auto plain = make_net<PlainSwish>();
    loom::tp::CutReport report;
    CHECK(loom::tp::shard_model(plain, 0, 2, &report, net_fields).linear_pairs == 0);
    CHECK(std::get<1>(plain.mlp.layers).split == nn::Split::none);
    const std::string warning =
        "TensorParallel over 2 ranks cuts nothing in mlp Residual: it runs whole on every tp rank (PlainSwish "
        "declares no tensor_cut; give an elementwise layer `static constexpr loom::nn::TensorCut tensor_cut = "
        "loom::nn::TensorCut::elementwise;`)";
    CHECK(report.warning() == warning);
    CHECK(report.uncut_units() == std::vector<std::string>{"mlp Residual"});

    // The executor says it once, from rank 0, and still trains as serial.
    const Trained tp2 = train<Megatron, PlainSwish>(2);
    CHECK(tp2.notice == warning);
    CHECK(tp2.noticed == 1);  // once, not per rank nor per step
    check_equal(tp2, train<Serial, PlainSwish>(1));

    auto grid = make_net<PlainSwish>();
    const std::string refused = loom_test::message_of([&] { (void)loom::tp::shard_model_grid(grid, 0, 4); });
    CHECK(refused.find("Optimus 2D: layer (anonymous namespace)::PlainSwish has no 2D form: it computes itself and "
                       "declares no nn::TensorCut") == 0);
    CHECK(refused.find("5Swish") == std::string::npos);

    // An elementwise layer with Params would see a slice of the features.
    WithScaled scaled{nn::Linear::make(4, 4), {}, nn::Linear::make(4, 4)};
    CHECK(loom_test::message_of([&] { (void)loom::tp::shard_model(scaled, 0, 2); }) ==
          "Megatron 1D: layer Scaled declares TensorCut::elementwise but holds 1 Params; an elementwise layer sees a "
          "slice of the features, so declare it TensorCut::replicated (1D runs it whole) or split it into a "
          "parameter-free elementwise layer and a loom layer");
}

TEST_CASE("the cut report of the GPT names what each policy did to every block", "[parallel][tp][user-layer]") {
    const loom::gpt::Config config{.layers = 2, .width = 32, .heads = 4, .seq = 8, .vocab = 64};
    const std::vector<std::string> fields{"embed", "blocks", "ln_f", "head", "loss"};
    auto model = loom::gpt::make_model(config);
    loom::tp::CutReport report;
    (void)loom::tp::shard_model(model, 0, 2, &report, fields);
    std::ostringstream text;
    text << report;
    CHECK(text.str() ==
          "TensorParallel over 2 ranks:\n"
          "  embed Embedding: Embedding vocabulary cut\n"
          "  blocks[0] Block: 0.0 LayerNorm replicated; 0.1 CausalSelfAttention heads cut; 1.0 LayerNorm replicated; "
          "1.1 Linear column-parallel (output features cut); 1.2 Gelu elementwise on the shard; 1.3 Linear "
          "row-parallel (input features cut)\n"
          "  blocks[1] Block: 0.0 LayerNorm replicated; 0.1 CausalSelfAttention heads cut; 1.0 LayerNorm replicated; "
          "1.1 Linear column-parallel (output features cut); 1.2 Gelu elementwise on the shard; 1.3 Linear "
          "row-parallel (input features cut)\n"
          "  ln_f LayerNorm: LayerNorm replicated\n"
          "  head Linear: Linear column-parallel (output features cut)\n"
          "  loss CrossEntropy: CrossEntropy vocabulary cut");
    CHECK(report.warning().empty());
    CHECK(report.summary() == "TensorParallel over 2 ranks: 3 column-parallel (output features cut), 2 row-parallel "
                              "(input features cut), 2 heads cut, 2 vocabulary cut, 2 elementwise on the shard, "
                              "5 replicated");

    auto grid = loom::gpt::make_model(config);
    loom::tp::CutReport grid_report;
    (void)loom::tp::shard_model_grid(grid, 0, 4, &grid_report, fields);
    CHECK(grid_report.summary() == "Optimus2D over 4 ranks: 14 q x q block, 2 elementwise on the shard");
}
