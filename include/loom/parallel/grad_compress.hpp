// GradCompress<Compressor, Axis>: less traffic on slow links. On the dp axis
// (the default) the gradient exchange sends compressed gradients: each
// bucket's all-reduce, or ZeRO's reduce-scatter, becomes the compressor's
// collective (parallel/compressed_exchange.hpp). On the pp or tp axis a cast
// halves the activations and activation gradients that cross it; that is the
// hybrid of the hybrid-compression paper: an aggressive compressor for dp
// gradients, a mild one for the traffic a step cannot do without.
//
//   using S = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::PowerSGD<4>>>;
//   using H = loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::OneFOneB>,
//                            loom::GradCompress<loom::TopK<0.01>>, loom::GradCompress<loom::CastBf16, loom::PpAxis>>;
//
// The compressors (REFERENCE.md, gradient compression):
//   CastBf16, CastFp16   16-bit values on the wire, sums in f32             2x
//   Int8Block<B>         int8 with one absmax scale per B values            ~4x
//   TopK<ratio>          the largest ratio of each chunk, error feedback     1/(2 ratio)
//   PowerSGD<rank>       rank-r factors of each matrix, error feedback,
//                        warm start, only where it saves 2x or more
//   OneBit (OneBitBlock<B>) sign x mean |x| per B values of the momentum (1-bit
//                        Adam; of the gradient under ZeRO), error feedback  ~20x
// Error feedback keeps what a step did not send and adds it to the next
// step's gradient, so nothing is lost, only delayed. PowerSGD and OneBit
// start after ExecutorOptions::exchange.compress_warmup uncompressed steps.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom {

enum class CompressorKind : std::uint8_t { none, bf16, fp16, int8, top_k, power_sgd, one_bit };

inline constexpr std::int64_t default_int8_block = 128;
inline constexpr std::int64_t default_one_bit_block = 64;  // measured: 1024 trains 20% worse (config B)

// A compressor as a run-time value: what the executor runs, what train_gpt's
// --compress parses, what a checkpoint records.
struct Compression {
    CompressorKind kind = CompressorKind::none;
    double ratio = 1.0;       // TopK: the fraction of each chunk sent
    int rank = 0;             // PowerSGD: the factors' rank
    std::int64_t block = 0;   // Int8Block and OneBit: values per scale

    [[nodiscard]] constexpr bool on() const noexcept { return kind != CompressorKind::none; }
    // Keeps a residual per element and adds it to the next step's gradient.
    [[nodiscard]] constexpr bool error_feedback() const noexcept {
        return kind == CompressorKind::top_k || kind == CompressorKind::power_sgd || kind == CompressorKind::one_bit;
    }
    // Compressed twice: a reduce-scatter of compressed chunks, summed in f32,
    // then an all-gather of the compressed sums.
    [[nodiscard]] constexpr bool two_stage() const noexcept {
        return kind == CompressorKind::bf16 || kind == CompressorKind::fp16 || kind == CompressorKind::int8 ||
               kind == CompressorKind::one_bit;
    }
    [[nodiscard]] constexpr bool is_cast() const noexcept { return kind == CompressorKind::bf16 || kind == CompressorKind::fp16; }
    // 1-bit Adam: what is compressed is the momentum the step would make,
    // beta1 m + (1 - beta1) g, smoother than g, where every rank holds the
    // whole m (ZeRO 0); under ZeRO 1-3, the gradient.
    [[nodiscard]] constexpr bool compresses_momentum() const noexcept { return kind == CompressorKind::one_bit; }

    // One line naming the bad value and what would be valid.
    void validate() const {
        if (kind == CompressorKind::top_k)
            LOOM_CHECK(ratio > 0 && ratio <= 1, "TopK: ratio ", ratio,
                       " is outside (0, 1]; it is the fraction of each chunk sent, e.g. 0.01 for 1%");
        if (kind == CompressorKind::power_sgd)
            LOOM_CHECK(rank >= 1, "PowerSGD: rank ", rank, " must be at least 1 (1 to 4 is typical)");
        if (kind == CompressorKind::int8 || kind == CompressorKind::one_bit)
            LOOM_CHECK(block >= 1, describe(), ": a block of ", block, " values; it must hold at least 1");
    }

    // "TopK<0.01>", as the policy type prints.
    void describe(std::ostream& out) const {
        switch (kind) {
            case CompressorKind::none: out << "NoCompression"; return;
            case CompressorKind::bf16: out << "CastBf16"; return;
            case CompressorKind::fp16: out << "CastFp16"; return;
            case CompressorKind::int8: out << "Int8Block<" << block << ">"; return;
            case CompressorKind::top_k: {
                // The shortest digits that read back as this ratio.
                char digits[32];
                const auto printed = std::to_chars(digits, digits + sizeof digits, ratio);
                out << "TopK<" << std::string_view(digits, static_cast<std::size_t>(printed.ptr - digits)) << ">";
                return;
            }
            case CompressorKind::power_sgd: out << "PowerSGD<" << rank << ">"; return;
            case CompressorKind::one_bit:
                out << "OneBit";
                if (block != default_one_bit_block) out << "<" << block << ">";
                return;
        }
        out << "?";
    }
    [[nodiscard]] std::string describe() const {
        std::ostringstream out;
        describe(out);
        return out.str();
    }
    friend bool operator==(const Compression&, const Compression&) = default;
};


// "none", "bf16", "fp16", "int8", "int8:64", "topk:0.01", "powersgd:4", "onebit", "onebit:256":
// the spellings of train_gpt's --compress.
[[nodiscard]] inline Compression parse_compression(std::string_view text) {
    const auto colon = text.find(':');
    const std::string_view name = text.substr(0, colon);
    const std::string_view arg = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
    const auto number = [&](const char* what) {
        const std::string s(arg);
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        LOOM_CHECK(!s.empty() && end == s.c_str() + s.size(), "compressor '", text, "': '", arg, "' is not ", what);
        return v;
    };
    const auto no_argument = [&] {
        LOOM_CHECK(arg.empty() && colon == std::string_view::npos, "compressor '", text, "' takes no ':' argument");
    };
    Compression c;
    if (name == "none") no_argument();
    else if (name == "bf16") { no_argument(); c.kind = CompressorKind::bf16; }
    else if (name == "fp16") { no_argument(); c.kind = CompressorKind::fp16; }
    else if (name == "int8" || name == "onebit") {
        const bool int8 = name == "int8";
        c.kind = int8 ? CompressorKind::int8 : CompressorKind::one_bit;
        const double b = arg.empty() ? static_cast<double>(int8 ? default_int8_block : default_one_bit_block)
                                     : number("a block size");
        LOOM_CHECK(b >= 1 && b <= (1 << 24) && b == static_cast<double>(static_cast<std::int64_t>(b)),
                   "compressor '", text, "': the ", name, " block ", arg, " must be a whole number in 1..16777216");
        c.block = static_cast<std::int64_t>(b);
    } else if (name == "topk") {
        LOOM_CHECK(!arg.empty(), "compressor 'topk' needs its ratio, e.g. topk:0.01");
        c.kind = CompressorKind::top_k;
        c.ratio = number("a ratio");
    } else if (name == "powersgd") {
        LOOM_CHECK(!arg.empty(), "compressor 'powersgd' needs its rank, e.g. powersgd:4");
        const double r = number("a rank");
        LOOM_CHECK(r >= 1 && r <= 1024 && r == static_cast<double>(static_cast<int>(r)), "compressor '", text,
                   "': PowerSGD rank ", arg, " must be a whole number in 1..1024");
        c.kind = CompressorKind::power_sgd;
        c.rank = static_cast<int>(r);
    } else {
        LOOM_FAIL("unknown compressor '", text, "'; use none, bf16, fp16, int8, topk:RATIO, powersgd:RANK or onebit");
    }
    c.validate();
    return c;
}

// The compressor policies.
struct CastBf16 {
    static constexpr Compression compression{CompressorKind::bf16};
};
struct CastFp16 {
    static constexpr Compression compression{CompressorKind::fp16};
};
template <std::int64_t Block = default_int8_block>
struct Int8Block {
    static_assert(Block >= 1, "Int8Block<Block>: a block holds at least 1 value (128 is typical)");
    static constexpr Compression compression{CompressorKind::int8, 1.0, 0, Block};
};
template <double Ratio>
struct TopK {
    static_assert(Ratio > 0 && Ratio <= 1, "TopK<ratio>: the ratio is the fraction of each chunk sent, in (0, 1]");
    static constexpr Compression compression{CompressorKind::top_k, Ratio};
};
template <int Rank>
struct PowerSGD {
    static_assert(Rank >= 1, "PowerSGD<rank>: the rank is at least 1 (1 to 4 is typical)");
    static constexpr Compression compression{CompressorKind::power_sgd, 1.0, Rank};
};
template <std::int64_t Block = default_one_bit_block>
struct OneBitBlock {
    static_assert(Block >= 1, "OneBitBlock<Block>: a block holds at least 1 value");
    static constexpr Compression compression{CompressorKind::one_bit, 1.0, 0, Block};
};
using OneBit = OneBitBlock<>;

// Which traffic a GradCompress applies to.
enum class CompressedAxis : std::uint8_t { dp, pp, tp };
struct DpAxis {
    static constexpr CompressedAxis axis = CompressedAxis::dp;
};
struct PpAxis {
    static constexpr CompressedAxis axis = CompressedAxis::pp;
};
struct TpAxis {
    static constexpr CompressedAxis axis = CompressedAxis::tp;
};

[[nodiscard]] constexpr std::string_view name(CompressedAxis axis) {
    switch (axis) {
        case CompressedAxis::dp: return "DpAxis";
        case CompressedAxis::pp: return "PpAxis";
        case CompressedAxis::tp: return "TpAxis";
    }
    return "?";
}

template <class Compressor>
concept CompressorPolicy = requires {
    { Compressor::compression } -> std::convertible_to<Compression>;
};

namespace detail {
// What a compressor policy holds; for anything else, nothing, so that only
// GradCompress's own sentence reports it.
template <class Compressor>
constexpr Compression compression_of() {
    if constexpr (CompressorPolicy<Compressor>) return Compressor::compression;
    else return Compression{};
}
}  // namespace detail

template <class Compressor, class Axis = DpAxis>
struct GradCompress {
    static_assert(CompressorPolicy<Compressor>,
                  "GradCompress<Compressor, Axis>: the compressor must be CastBf16, CastFp16, Int8Block<B>, "
                  "TopK<ratio>, PowerSGD<rank> or OneBit");
    static_assert(Axis::axis == CompressedAxis::dp || !CompressorPolicy<Compressor> ||
                      detail::compression_of<Compressor>().is_cast(),
                  LOOM_RULE_ACTIVATION_CAST);

    static constexpr PolicyKind kind = PolicyKind::compression;
    static constexpr Compression compression = detail::compression_of<Compressor>();
    static constexpr CompressedAxis axis = Axis::axis;

    static void describe(std::ostream& out) {
        out << "GradCompress<";
        compression.describe(out);
        if (axis != CompressedAxis::dp) out << ", " << name(axis);
        out << ">";
    }
};

}  // namespace loom
