// loom_gpt_dump: the loom half of the PyTorch parity test. Writes, into
// --out DIR, a small GPT's initial weights, ten batches, the gradients of the
// first batch's loss, and the losses of ten AdamW steps; tests/parity/
// torch_gpt.py recomputes all of it in PyTorch and compares.
#include <loom/data/corpus.hpp>
#include <loom/gpt/model.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

int main(int argc, char** argv) {
    try {
        std::filesystem::path out;
        for (int i = 1; i + 1 < argc; i += 2)
            if (std::string_view(argv[i]) == "--out") out = argv[i + 1];
        LOOM_CHECK(!out.empty(), "loom_gpt_dump: usage: loom_gpt_dump --out DIR");
        std::filesystem::create_directories(out);

        const loom::gpt::Config config{.layers = 2, .width = 64, .heads = 4, .seq = 32, .vocab = 256};
        const std::int64_t batch = 4, steps = 10;
        const loom::optim::AdamWConfig adamw{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
        loom::gpt::Model model = loom::gpt::make_model(config);
        loom::nn::ParamArena arena(model);
        arena.initialize(model, 7);
        const auto names = loom::gpt::parameter_names(config);

        auto named = [&](auto view) {
            std::vector<loom::io::NamedTensor> tensors;
            for (std::size_t i = 0; i < names.size(); ++i)
                if (arena.entries()[i].param->numel() != 0) tensors.push_back({names[i], view(*arena.entries()[i].param)});
            return tensors;
        };
        auto number = [](double x) {
            std::ostringstream s;
            s << std::setprecision(9) << x;
            return s.str();
        };
        std::map<std::string, std::string> metadata{
            {"layers", std::to_string(config.layers)}, {"width", std::to_string(config.width)},
            {"heads", std::to_string(config.heads)},   {"seq", std::to_string(config.seq)},
            {"vocab", std::to_string(config.vocab)},   {"batch", std::to_string(batch)},
            {"steps", std::to_string(steps)},          {"lr", number(adamw.lr)},
            {"beta1", number(adamw.beta1)},            {"beta2", number(adamw.beta2)},
            {"eps", number(adamw.eps)},                {"weight_decay", number(adamw.weight_decay)}};
        loom::io::save_safetensors(out / "weights.safetensors", named([](const loom::Param& p) { return p.value; }), metadata);

        const auto corpus = loom::data::ByteCorpus::synthetic(1 << 16, 3);
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(steps * batch * config.seq)), targets(tokens.size());
        const auto per_step = static_cast<std::size_t>(batch * config.seq);
        for (std::int64_t s = 0; s < steps; ++s)
            corpus.batch(3, s, batch, config.seq,
                         std::span(tokens).subspan(static_cast<std::size_t>(s) * per_step, per_step),
                         std::span(targets).subspan(static_cast<std::size_t>(s) * per_step, per_step));
        loom::io::save_safetensors(out / "batches.safetensors",
                                   {{"tokens", loom::Tensor::of(tokens.data(), {steps, batch, config.seq})},
                                    {"targets", loom::Tensor::of(targets.data(), {steps, batch, config.seq})}});

        loom::nn::Context ctx;
        loom::optim::AdamW optimizer(arena.size(), adamw);
        std::vector<float> losses;
        for (std::int64_t s = 0; s < steps; ++s) {
            auto at = [&](std::vector<std::int32_t>& v) {
                return loom::Tensor::of(v.data() + static_cast<std::size_t>(s) * per_step, {batch, config.seq});
            };
            arena.zero_grads();
            losses.push_back(loom::nn::forward_backward(model, ctx, at(tokens), at(targets)));
            if (s == 0)
                loom::io::save_safetensors(out / "grads.safetensors", named([](const loom::Param& p) { return p.grad; }),
                                           {{"loss", number(losses[0])}});
            optimizer.step(arena.values(), arena.grads());
        }
        std::ofstream json(out / "losses.json");
        json << "{\"losses\": [";
        for (std::size_t i = 0; i < losses.size(); ++i) json << (i ? ", " : "") << number(losses[i]);
        json << "]}\n";
        std::printf("loom_gpt_dump: wrote %s (loss %.6f -> %.6f over %lld AdamW steps)\n", out.string().c_str(),
                    static_cast<double>(losses.front()), static_cast<double>(losses.back()), static_cast<long long>(steps));
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
