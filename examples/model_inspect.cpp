// model_inspect: defines a small GPT-like model as plain aggregates, lets loom
// find its parameters by reflection, lays them out in one arena, initialises
// them from the counter-based RNG on N rank threads (each only its shard) and
// checks the result equals the serial initialisation bit for bit.
//
//   model_inspect [--ranks N] [--seed S] [--layers L] [--width C]
#include <loom/core/buffer.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/init.hpp>
#include <loom/core/reflect.hpp>
#include <loom/version.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using loom::Init;
using loom::Param;
using loom::Shape;

// --- the user's layer types: aggregates of Params, nothing registered ------
struct LayerNorm {
    Param gain, shift;
};
struct Linear {
    Param weight, bias;
};
struct Block {
    LayerNorm ln1;
    Linear qkv, proj;
    LayerNorm ln2;
    Linear up, down;
};
struct Gpt {
    Param token_embedding, position_embedding;
    std::vector<Block> blocks;
    LayerNorm final_norm;
    Linear head;
};

static LayerNorm layer_norm(std::int64_t c) { return {{Shape{c}, Init::ones()}, {Shape{c}}}; }
static Linear linear(std::int64_t in, std::int64_t out) {
    return {{Shape{out, in}, Init::normal(0.02f)}, {Shape{out}}};
}

static Gpt make_gpt(std::int64_t vocab, std::int64_t context, std::int64_t width, int layers) {
    Gpt gpt{{Shape{vocab, width}, Init::normal(0.02f)}, {Shape{context, width}, Init::normal(0.01f)}, {}, {}, {}};
    for (int l = 0; l < layers; ++l)
        gpt.blocks.push_back({layer_norm(width), linear(width, 3 * width), linear(width, width), layer_norm(width),
                              linear(width, 4 * width), linear(4 * width, width)});
    gpt.final_norm = layer_norm(width);
    gpt.head = linear(width, vocab);
    return gpt;
}

static long long parse_flag(std::string_view flag, std::string_view text, long long lo, long long hi) {
    long long value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    LOOM_CHECK(ec == std::errc{} && end == text.data() + text.size() && value >= lo && value <= hi, flag, " ", text,
               " is not valid; use ", lo, " to ", hi);
    return value;
}

int main(int argc, char** argv) try {
    int ranks = 4, layers = 2;
    long long width = 64;
    std::uint64_t seed = 42;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        LOOM_CHECK(i + 1 < argc, "flag ", flag, " needs a value; flags are --ranks, --seed, --layers, --width");
        const std::string_view value = argv[++i];
        if (flag == "--ranks") ranks = static_cast<int>(parse_flag(flag, value, 1, 64));
        else if (flag == "--seed") seed = static_cast<std::uint64_t>(parse_flag(flag, value, 0, 1LL << 62));
        else if (flag == "--layers") layers = static_cast<int>(parse_flag(flag, value, 1, 96));
        else if (flag == "--width") width = parse_flag(flag, value, 8, 4096);
        else LOOM_FAIL("unknown flag ", flag, "; flags are --ranks, --seed, --layers, --width");
    }

    std::printf("loom %d.%d.%d model_inspect: a %d-layer, width-%lld GPT-shaped model, seed %llu\n",
                loom::version.major, loom::version.minor, loom::version.patch, layers, width,
                static_cast<unsigned long long>(seed));
    Gpt gpt = make_gpt(512, 128, width, layers);

    // 1. Reflection: every Param, in field order, with its path.
    std::printf("\nparameters found by reflection (path: shape, initialiser):\n");
    loom::reflect::visit_params(gpt, [&](const Param& p, std::string_view path) {
        if (path.starts_with("2.") && !path.starts_with("2.0.")) return;  // blocks > 0 repeat block 0
        std::cout << "  " << path << ": " << p.shape << ", " << p.init << "\n";
    });
    if (layers == 2) std::printf("  (block 2.1 repeats block 2.0)\n");
    if (layers > 2) std::printf("  (blocks 2.1 .. 2.%d repeat block 2.0)\n", layers - 1);
    const std::int64_t total = loom::reflect::parameter_numel(gpt);
    std::printf("%zu Params, %lld scalars\n", loom::reflect::param_count(gpt), static_cast<long long>(total));

    // 2. One contiguous arena; each Param's value is a slice of it.
    loom::Buffer<loom::Host> arena(loom::DType::f32, Shape{total});
    std::int64_t offset = 0;
    loom::reflect::visit_params(gpt, [&](Param& p, std::string_view) {
        p.value = arena.tensor().slice(0, offset, offset + p.numel()).reshape(p.shape);
        offset += p.numel();
    });
    std::cout << "arena: " << arena << ", " << static_cast<double>(arena.nbytes()) / (1 << 20) << " MiB"
              << std::endl;

    // 3. Serial initialisation: each Param whole.
    loom::reflect::visit_params(gpt, [&](const Param& p, std::string_view path) {
        loom::initialize(p, path, seed, p.value);
    });

    // 4. The same on N rank threads, each regenerating only its slice of the
    //    arena, cutting through Params as a ZeRO shard would.
    std::vector<float> sharded(static_cast<std::size_t>(total));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
            const std::int64_t begin = total * r / ranks, end = total * (r + 1) / ranks;
            loom::initialize_range(gpt, seed,
                                   std::span<float>(sharded.data() + begin, static_cast<std::size_t>(end - begin)),
                                   begin);
        });
    }
    for (auto& t : threads) t.join();
    const bool same = std::memcmp(sharded.data(), arena.raw(), arena.nbytes()) == 0;
    std::printf("\nsharded initialisation on %d rank threads %s the serial one bit for bit\n", ranks,
                same ? "matches" : "DOES NOT match");

    // 5. What bf16 and f16 storage would cost in accuracy for these weights.
    //    f16 has 10 mantissa bits but a narrow range: weights below its
    //    smallest normal (2^-14) lose relative precision as subnormals.
    constexpr double f16_min_normal = 6.103515625e-05;
    double worst_bf16 = 0, worst_f16 = 0;
    std::int64_t f16_subnormal = 0, nonzero = 0;
    for (float w : std::span<const float>(arena.data<float>(), static_cast<std::size_t>(total))) {
        if (w == 0.0f) continue;
        ++nonzero;
        worst_bf16 = std::max(worst_bf16, std::abs(double(float(loom::bf16(w))) - w) / std::abs(w));
        if (std::abs(w) < f16_min_normal) ++f16_subnormal;
        else worst_f16 = std::max(worst_f16, std::abs(double(float(loom::f16(w))) - w) / std::abs(w));
    }
    std::printf("worst relative rounding error of the weights: bf16 %.2e, f16 %.2e (normal range; %lld of %lld "
                "weights fall below f16's smallest normal)\n",
                worst_bf16, worst_f16, static_cast<long long>(f16_subnormal), static_cast<long long>(nonzero));
    return same ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "model_inspect: %s\n", e.what());
    return 2;
}
