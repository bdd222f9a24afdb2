// loom_gpt_greedy: the loom half of the transformers parity test
// (tests/parity/hf_gpt2.py). Reads a train_gpt checkpoint (its shape from the
// file's own metadata), decodes every --prompt greedily with loom's inference
// engine (infer::generate: one prefill, then KV-cached decode steps, the
// prompts batched, as examples/generate_gpt runs them), and writes --out, a
// safetensors file holding for prompt i:
//   prompt.i  I32 [P]       the prompt's tokens (byte % vocab, as generate_gpt)
//   greedy.i  I32 [N]       the new tokens
//   logits.i  F32 [P+N-1, V] logits by full recomputation (gpt::logits) over
//                            the prompt and all new tokens but the last
//
//   loom_gpt_greedy --checkpoint FILE --out FILE --max-new N --prompt TEXT [--prompt TEXT]...
#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/generate.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/nn/param_arena.hpp>

#include <charconv>
#include <cstdio>
#include <string>
#include <system_error>
#include <string_view>
#include <vector>

namespace {

// A whole number >= 1, or one line naming `what` and the text.
std::int64_t positive(std::string_view what, std::string_view text) {
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    LOOM_CHECK(error == std::errc{} && end == text.data() + text.size() && value >= 1, "loom_gpt_greedy: ", what,
               " is '", text, "'; give a whole number >= 1");
    return value;
}

std::int64_t metadata_number(const loom::io::SafetensorsFile& file, const std::string& path, const char* key) {
    const auto value = file.metadata().find(key);
    LOOM_CHECK(value.has_value(), "loom_gpt_greedy: ", path, " has no '", key, "' metadata; give a train_gpt --save checkpoint");
    return positive(std::string(path) + " metadata '" + key + "'", *value);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string checkpoint, out;
        std::vector<std::string> prompts;
        std::int64_t max_new = 0;
        for (int i = 1; i + 1 < argc; i += 2) {
            const std::string_view flag = argv[i];
            if (flag == "--checkpoint") checkpoint = argv[i + 1];
            else if (flag == "--out") out = argv[i + 1];
            else if (flag == "--prompt") prompts.emplace_back(argv[i + 1]);
            else if (flag == "--max-new") max_new = positive("--max-new", argv[i + 1]);
            else LOOM_CHECK(false, "loom_gpt_greedy: unknown flag ", flag, "; valid: --checkpoint, --out, --max-new, --prompt");
        }
        LOOM_CHECK(!checkpoint.empty() && !out.empty() && !prompts.empty() && max_new >= 1,
                   "loom_gpt_greedy: usage: loom_gpt_greedy --checkpoint FILE --out FILE --max-new N --prompt TEXT...");

        loom::gpt::Config config;
        {
            const loom::io::SafetensorsFile file(checkpoint);
            config = {metadata_number(file, checkpoint, "layers"), metadata_number(file, checkpoint, "width"),
                      metadata_number(file, checkpoint, "heads"), metadata_number(file, checkpoint, "seq"),
                      metadata_number(file, checkpoint, "vocab")};
        }
        loom::gpt::Model model = loom::gpt::make_model(config);
        loom::nn::ParamArena arena(model);
        std::vector<float> m(arena.values().size()), v(m.size());
        (void)loom::gpt::load_checkpoint(checkpoint, config, arena.values(), m, v);

        std::vector<loom::infer::Request> requests(prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            for (char c : prompts[i])
                requests[i].prompt.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c) % config.vocab));
            requests[i].max_new_tokens = max_new;
            requests[i].sampling.greedy = true;
        }
        const auto done = loom::infer::generate(model, config, requests);

        // Full recomputation, one prompt at a time: [1, T] tokens -> [1, T, V] logits.
        std::vector<std::vector<std::int32_t>> sequences(prompts.size());
        std::vector<std::vector<float>> logits(prompts.size());
        loom::nn::Context ctx;
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            auto& sequence = sequences[i];
            sequence = requests[i].prompt;
            sequence.insert(sequence.end(), done[i].tokens.begin(), done[i].tokens.end() - 1);
            const auto length = static_cast<std::int64_t>(sequence.size());
            const loom::Tensor out_logits =
                loom::gpt::logits(model, ctx, loom::Tensor::of(sequence.data(), {1, length}));
            logits[i].assign(out_logits.data<float>(), out_logits.data<float>() + length * config.vocab);
        }

        std::vector<loom::io::NamedTensor> tensors;
        std::vector<std::vector<std::int32_t>> greedy(prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            greedy[i] = done[i].tokens;
            const std::string at = "." + std::to_string(i);
            tensors.push_back({"prompt" + at, loom::Tensor::of(requests[i].prompt.data(),
                                                               {static_cast<std::int64_t>(requests[i].prompt.size())})});
            tensors.push_back({"greedy" + at, loom::Tensor::of(greedy[i].data(), {static_cast<std::int64_t>(greedy[i].size())})});
            tensors.push_back({"logits" + at, loom::Tensor::of(logits[i].data(),
                                                               {static_cast<std::int64_t>(sequences[i].size()), config.vocab})});
            std::printf("prompt %zu: %zu tokens, %zu greedy tokens\n", i, requests[i].prompt.size(), greedy[i].size());
        }
        loom::io::save_safetensors(out, tensors, {{"prompts", std::to_string(prompts.size())}});
        return 0;
    } catch (const loom::Error& e) {
        std::fprintf(stderr, "%s\n", e.message().c_str());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "loom_gpt_greedy: %s\n", e.what());
        return 1;
    }
}
