// bench/compression: what GradCompress's dp compressors save and cost, on the
// real GPT training step through the executor, beside the formulas.
//
//   bench_compression [--compressors none,bf16,fp16,int8,topk:0.01,powersgd:4,onebit]
//                     [--gbit 0.1,1,10,100] [--steps 5] [--warmup 2] [--dp 4] [--config A|B] [--batch 4]
//                     [--bucket BYTES] [--mib 64] [--chunk 131072] [--reps 5] [--quick]
//
// Compressors are parse_compression's spellings (train_gpt's --compress).
// The GPT is config A of bench/data_parallel.cpp (layers 4, width 256, heads
// 4, seq 128, vocab 256) with --batch 4 sequences per rank, half config A's
// 8: four rank threads share two cores, so 4 sequences on half a core take
// about as long as 8 on a core of their own (and the run stays near 3
// minutes). It trains with Strategy<DataParallel<>> (ZeRO stage 0, 2 MiB
// buckets) on dp rank threads of a ThreadWorld, ExecutionPlan::dp_compression
// set to the compressor and ExecutorOptions::exchange.compress_warmup = 0, so every
// step's gradient exchange is compressed (PowerSGD and one-bit included).
// Each world (one per link setting) holds one executor per compressor, all on
// the same communicator, stepped in turn with the first one rotating every
// round: a neighbour's burst of load falls on every compressor alike. --warmup
// untimed rounds, then --steps timed ones; a step's time is its slowest rank's.
// --quick: config B, 1 + 2 steps, a 4 MiB kernel buffer.
//
// 1. Bytes per training step per rank, counted by comm::Counted wrapped
//    around each rank's ThreadComm, the only communicator the executor has
//    (its dp axis): what it counts is the gradient exchange plus the step's
//    loss all-reduce (one f32: 4 bytes of payload, 6 on the wire at dp 4),
//    which the formulas (compression_formulas.hpp) include too. payload = the ops' own sizes
//    (all_reduce: the buffer; all_to_all: the send buffer; all_gather: the
//    receive buffer); wire = what this rank sends under the ring algorithms
//    (Counted's wire_bytes). Beside it the formula, per bucket g of P_g
//    padded elements (ShardLayout: rounded up to 16 x N), block b = P_g / N,
//    N = dp, and w(b) the compressed words of a block (ChunkCodec::words,
//    kernels/host/quantize.hpp and top_k.hpp):
//      none       all-reduce of P floats:       payload 4P,        wire 2(N-1)/N 4P
//      casts      w = ceil(b/2)                 two stages (all-to-all of the N
//      int8       w = ceil(b/128) + ceil(b/4)   compressed chunks, all-gather of
//      one-bit    w = ceil(b/64) + ceil(b/32)   the compressed sums):
//                                               payload 2 N w 4,   wire 2 (N-1) w 4
//      top-k      w = 2k, k = ceil(ratio b)     all-gather of every rank's pairs
//                                               for every chunk:   payload N^2 w 4, wire (N-1) N w 4
//      PowerSGD   per matrix n x m with r <= min(n, m) and 2 (n+m) r < n m:
//                 P = n r, Q = m r floats; every other parameter whole (dense);
//                 all-reduce of [P | dense], then of Q: payload 4 (P + dense + Q),
//                 wire 2(N-1)/N of it
//    plus the loss: payload 4, wire 2(N-1)/N 4. "link ms" is the time that
//    traffic holds one link if the collectives ran one after the other:
//    wire / bandwidth + 5 us x (2(N-1) per all-reduce, N-1 per all-to-all or
//    all-gather), as Links::cost sums.
// 2. Step time with every link Shaped to each --gbit Gbit/s (5 us latency),
//    each compressor against uncompressed in the same round, and the
//    unshaped step (part 1's Counted world) for the compressors' CPU cost;
//    "wait" is the compute thread's time waiting for collectives (executor
//    trace): what backward did not hide, and for a compressed exchange its
//    second half, which runs inside that wait. Shaped models each collective
//    on its own, so buckets in flight together do not share the bandwidth:
//    where several uncompressed all-reduces overlap (low link speeds), each
//    gets the whole link, which flatters the uncompressed step.
// 3. Compression kernel throughput on one thread: ChunkCodec pack and unpack
//    (add, weight 1/N, as the exchange sums) over --mib MiB of f32 gradient
//    in chunks of --chunk values (the default is a 2 MiB bucket's block at dp
//    4: what the exchange packs at a time), error feedback in place where the
//    compressor keeps one (as the exchange does), the input restored before
//    each repetition outside the clock; GB/s of f32 gradient processed (4 n
//    bytes / time), beside std::memcpy of the same buffer in the same run
//    (also 4 n bytes / time; its traffic is twice that, read + write).
//    PowerSGD: every bucket's start + finish (PowerSgdBuckets, the exchange's
//    own) over the GPT's gradient on a 1-rank world, and the kernels alone
//    (P = M Q, orthonormalise P, Q = M^T P, M^ = P Q^T, error = M - M^) on
//    one square matrix of the --mib buffer. Median of --reps.
//
// Output is markdown. Four rank threads (plus their progress threads) on a
// 2-core machine are oversubscribed, so step times carry scheduling noise:
// compare compressors at the same link speed. other_cores: cores' worth of
// CPU other processes used meanwhile (/proc/stat); near 0 is a quiet machine.
//
// The pieces: the training runs (compression_runs.hpp), the formulas
// (compression_formulas.hpp), the kernel rows (compression_kernels.hpp); here
// the flags and the report.
#include <loom/comm/counted.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/parallel/grad_compress.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "compression_formulas.hpp"
#include "compression_kernels.hpp"
#include "compression_runs.hpp"
#include "gpt_bench_configs.hpp"
#include "timing.hpp"

namespace {

using namespace bench::compression;
using bench::BenchConfig;
using bench::configs;
using bench::ForeignLoad;
using bench::keep_memory;
using bench::median_seconds;
using bench::usable_cores;

// ---------------------------------------------------------------------------
// Flags.

std::vector<std::string> split_list(std::string_view text) {
    std::vector<std::string> out;
    for (std::string_view rest = text;;) {
        const auto comma = rest.find(',');
        out.emplace_back(rest.substr(0, comma));
        if (comma == std::string_view::npos) break;
        rest = rest.substr(comma + 1);
    }
    return out;
}

[[noreturn]] void fail(const std::string& message) {
    std::fprintf(stderr, "bench_compression: %s\n", message.c_str());
    std::exit(2);
}

long long parse_int(std::string_view flag, const std::string& text, long long lo, long long hi) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < lo || v > hi)
        fail(std::string(flag) + " " + text + " is not a whole number in " + std::to_string(lo) + ".." +
             std::to_string(hi));
    return v;
}

std::string with_commas(double v) {
    const auto n = static_cast<long long>(std::llround(v));
    std::string digits = std::to_string(n < 0 ? -n : n), out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return n < 0 ? "-" + out : out;
}

std::string gbit_name(double g) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", g);
    return buf;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> spellings{"none", "bf16", "fp16", "int8", "topk:0.01", "powersgd:4", "onebit"};
    std::vector<double> gbits{0.1, 1, 10, 100};
    int steps = 5, warmup = 2, dp = 4, reps = 5;
    std::string config_name = "A";
    std::int64_t bucket = loom::default_bucket_bytes, mib = 64, chunk = 131072;
    // Sequences per rank: half config A's 8. Four rank threads share two cores,
    // so a rank computes on half a core; 4 sequences there take about as long
    // as 8 on a core of its own, keeping compute against communication near
    // what dp 4 on four cores would see (and the run within ~3 minutes).
    std::int64_t batch = 4;
    bool quick = false;
    for (int i = 1; i < argc; ++i)
        if (std::string_view(argv[i]) == "--quick") quick = true;
    if (quick) {  // a tiny run: config B (its batch is 4 too), few steps, a small kernel buffer; later flags still apply
        config_name = "B";
        steps = 2;
        warmup = 1;
        mib = 4;
        chunk = 16384;
        reps = 3;
    }
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--quick") continue;
        if (i + 1 >= argc) fail(flag + " needs a value (or is not a flag); see the usage at the top of bench/compression.cpp");
        const std::string value = argv[++i];
        if (flag == "--compressors") spellings = split_list(value);
        else if (flag == "--gbit") {
            gbits.clear();
            for (const auto& item : split_list(value)) {
                char* end = nullptr;
                const double g = std::strtod(item.c_str(), &end);
                if (item.empty() || *end != '\0' || !(g > 0) || !std::isfinite(g))
                    fail("--gbit " + value + ": '" + item + "' is not a positive link speed in Gbit/s");
                gbits.push_back(g);
            }
        } else if (flag == "--steps") steps = static_cast<int>(parse_int(flag, value, 1, 1000));
        else if (flag == "--warmup") warmup = static_cast<int>(parse_int(flag, value, 0, 1000));
        else if (flag == "--dp") dp = static_cast<int>(parse_int(flag, value, 2, 64));
        else if (flag == "--reps") reps = static_cast<int>(parse_int(flag, value, 1, 1000));
        else if (flag == "--mib") mib = parse_int(flag, value, 1, 4096);
        else if (flag == "--chunk") chunk = parse_int(flag, value, 1, 1 << 26);
        else if (flag == "--bucket") bucket = parse_int(flag, value, 1, std::int64_t{1} << 34);
        else if (flag == "--config") config_name = value;
        else if (flag == "--batch") batch = parse_int(flag, value, 1, 1 << 20);
        else
            fail("unknown flag " + flag + "; flags are --compressors LIST, --gbit LIST, --steps N, --warmup N, --dp N, "
                 "--config A|B, --batch N, --bucket BYTES, --mib N, --chunk N, --reps N, --quick");
    }
    if (!configs().contains(config_name)) fail("--config " + config_name + " is not one of A, B");
    std::vector<Compression> compressors;
    for (const auto& s : spellings) {
        try {
            compressors.push_back(loom::parse_compression(s));
        } catch (const std::exception& e) {
            fail(std::string("--compressors: ") + e.what());
        }
    }
    const auto floats = mib * (1 << 20) / 4;
    if (chunk > floats) fail("--chunk " + std::to_string(chunk) + " is larger than the --mib buffer");
    BenchConfig config = configs().at(config_name);
    config.batch = batch;
    const int cores = usable_cores();
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    loom::kernels::host::set_blas_threads(1);
    const auto& m = config.model;

    std::printf("# bench_compression\n\n");
    std::printf("Configuration: GPT config %s (layers %lld, width %lld, heads %lld, seq %lld, vocab %lld; %s "
                "parameters), batch %lld sequences per rank (--batch; bench_data_parallel's config A has 8); dp %d "
                "rank threads (ThreadWorld), "
                "Strategy<DataParallel<>> (ZeRO stage 0), bucket %lld KiB, ExecutorOptions::exchange.compress_warmup 0 (every "
                "step compressed), one executor per compressor in each world, stepped in turn; %d untimed then %d timed "
                "rounds, step time = slowest rank, median over the timed rounds; links Shaped at %s Gbit/s, %g us latency; kernels on one thread over %lld MiB of f32 in "
                "chunks of %lld values, median of %d; %d usable cores, %d BLAS thread per rank.\n",
                config_name.c_str(), static_cast<long long>(m.layers), static_cast<long long>(m.width),
                static_cast<long long>(m.heads), static_cast<long long>(m.seq), static_cast<long long>(m.vocab),
                with_commas(static_cast<double>(m.parameters())).c_str(), static_cast<long long>(config.batch), dp,
                static_cast<long long>(bucket >> 10), warmup, steps,
                [&] {
                    std::string s;
                    for (double g : gbits) s += (s.empty() ? "" : ", ") + gbit_name(g);
                    return s;
                }()
                    .c_str(),
                latency_s * 1e6, static_cast<long long>(mib), static_cast<long long>(chunk), reps, cores,
                loom::kernels::host::blas_threads());
    if (dp > cores)
        std::printf("\nNote: %d rank threads (each with a progress thread for its async collectives) share %d cores: "
                    "oversubscribed. Step times include that contention and are not a scaling figure; compare "
                    "compressors at the same link speed.\n",
                    dp, cores);
    std::fflush(stdout);

    // 1. Bytes per step (Counted) and the unshaped step time.
    const ForeignLoad load1;
    const std::vector<StepRun> counted = run_counted(config, dp, compressors, bucket, steps, warmup);
    const double other1 = load1.cores();
    std::size_t none_index = compressors.size();
    for (std::size_t i = 0; i < compressors.size(); ++i)
        if (!compressors[i].on()) none_index = i;
    const bool with_none = none_index < compressors.size();
    // The uncompressed reference: measured if listed, else the formula's.
    const double none_wire = with_none ? counted[none_index].counts.total().wire_bytes
                                       : predicted_bytes(Compression{}, dp, counted.front()).wire;
    std::printf("\n## 1. Bytes per training step per rank (comm::Counted on the dp communicator)\n\n");
    std::printf("Counted wraps each rank's only communicator (the executor's dp axis), so it counts the gradient "
                "exchange plus the step's loss all-reduce (one f32: 4 B payload, %.0f B on the wire; the formula "
                "includes it). Rank 0's last timed step; \"same\": every timed step on every rank counted the same. "
                "payload = the ops' own sizes; wire = what this rank sends under ring algorithms "
                "(Counted::wire_bytes). link ms = that traffic's time on one link if the collectives ran one after "
                "the other (wire / bandwidth + 5 us per ring step). loss = after %d steps. other_cores=%.2f.\n\n",
                2.0 * (dp - 1) / dp * 4, warmup + steps, other1);
    std::printf("| compressor | calls | payload B | formula | wire B | formula | measured / formula | wire / none |");
    for (double g : gbits) std::printf(" link ms %s Gbit/s |", gbit_name(g).c_str());
    std::printf(" same | loss |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (std::size_t k = 0; k < gbits.size(); ++k) std::printf(" ---: |");
    std::printf(" --- | ---: |\n");
    for (std::size_t i = 0; i < compressors.size(); ++i) {
        const auto total = counted[i].counts.total();
        const Bytes predicted = predicted_bytes(compressors[i], dp, counted[i]);
        std::printf("| %s | %lld | %s | %s | %s | %s | %.4f | %.4f |", compressors[i].describe().c_str(),
                    static_cast<long long>(total.calls), with_commas(static_cast<double>(total.bytes)).c_str(),
                    with_commas(predicted.payload).c_str(), with_commas(total.wire_bytes).c_str(),
                    with_commas(predicted.wire).c_str(), total.wire_bytes / predicted.wire, total.wire_bytes / none_wire);
        for (double g : gbits) std::printf(" %.2f |", 1e3 * serial_link_seconds(counted[i].counts, dp, g));
        std::printf(" %s | %.4f |\n", counted[i].bytes_constant ? "yes" : "NO", static_cast<double>(counted[i].loss));
    }
    std::printf("\nPer op (rank 0, one step): ");
    for (std::size_t i = 0; i < compressors.size(); ++i) {
        std::printf("%s%s:", i ? "; " : "", compressors[i].describe().c_str());
        bool first = true;
        for (std::size_t k = 0; k < loom::comm::CommCounts::kinds; ++k) {
            const auto& op = counted[i].counts.ops[k];
            if (op.calls == 0) continue;
            std::printf("%s %s %lld x, %s B", first ? "" : ",",
                        std::string(loom::comm::name(static_cast<loom::comm::OpKind>(k))).c_str(),
                        static_cast<long long>(op.calls), with_commas(static_cast<double>(op.bytes)).c_str());
            first = false;
        }
    }
    std::printf(".\nBuckets: %zu, padded elements", counted.front().groups.size());
    for (const auto& g : counted.front().groups) std::printf(" %lld", static_cast<long long>(g.padded));
    std::printf(" (blocks of padded / %d).\n", dp);
    for (std::size_t i = 0; i < compressors.size(); ++i)
        if (compressors[i].kind == CompressorKind::power_sgd) {
            PowerSgdSizes total;
            for (const auto& shapes : counted[i].group_shapes) {
                const PowerSgdSizes s = power_sgd_sizes(shapes, compressors[i].rank);
                total.p += s.p;
                total.q += s.q;
                total.dense += s.dense;
            }
            std::printf("%s: P %s + Q %s floats of the compressed matrices, %s floats sent whole (vectors).\n",
                        compressors[i].describe().c_str(), with_commas(static_cast<double>(total.p)).c_str(),
                        with_commas(static_cast<double>(total.q)).c_str(),
                        with_commas(static_cast<double>(total.dense)).c_str());
        }
    for (const auto& run : counted)
        for (const auto& line : run.notices) std::printf("Notice: %s\n", line.c_str());
    std::fflush(stdout);

    // 2. Step time under shaped links.
    std::vector<std::vector<StepRun>> shaped;  // [link][compressor]
    std::string other2;                        // other_cores of each world
    for (double g : gbits) {
        const ForeignLoad world_load;
        shaped.push_back(run_shaped(config, dp, compressors, bucket, steps, warmup, g));
        char item[64];
        std::snprintf(item, sizeof item, "%s%s Gbit/s %.2f", other2.empty() ? "" : ", ", gbit_name(g).c_str(),
                      world_load.cores());
        other2 += item;
    }
    std::printf("\n## 2. Step time (ms) under Shaped links, dp %d\n\n", dp);
    std::printf("One world per link speed with one executor per compressor, stepped in turn (the first one rotating "
                "every round), so load bursts fall on all alike; median of %d timed rounds after %d untimed. x none = "
                "the median over rounds of the uncompressed step over this one in the same round (1.01x or more, in bold: "
                "compression wins). wait = the compute thread's time waiting for collectives (executor trace, slowest "
                "rank, median): the communication backward did not hide, plus, compressed, the exchange's second "
                "half (decode, re-encode, second collective, decode), which runs in that wait. unshaped = part 1's "
                "world (Counted, no link model): the compressors' CPU cost alone. Shaped models each collective on "
                "its own, so buckets in flight together do not share a link's bandwidth: at low speeds, where several "
                "buckets' all-reduces overlap, the uncompressed step is flattered (each gets the whole link). Absolute times of different "
                "worlds are not comparable when other_cores differs between them (unshaped %.2f, %s); the ratios, "
                "taken within a round, are.\n\n",
                steps, warmup, other1, other2.c_str());
    std::printf("| compressor | unshaped ms | x none | wait ms |");
    for (double g : gbits) std::printf(" %s Gbit/s ms | x none | wait ms |", gbit_name(g).c_str());
    std::printf("\n| --- | ---: | ---: | ---: |");
    for (std::size_t k = 0; k < gbits.size(); ++k) std::printf(" ---: | ---: | ---: |");
    std::printf("\n");
    const auto ratio_cell = [&](const std::vector<StepRun>& world, std::size_t i) {
        char cell[32] = "-";
        if (with_none) {
            const double faster = speedup(world[none_index], world[i]);
            std::snprintf(cell, sizeof cell, faster >= 1.005 && i != none_index ? "**%.2fx**" : "%.2fx", faster);
        }
        return std::string(cell);
    };
    for (std::size_t i = 0; i < compressors.size(); ++i) {
        std::printf("| %s | %.1f | %s | %.1f |", compressors[i].describe().c_str(), counted[i].median_ms(),
                    ratio_cell(counted, i).c_str(), counted[i].median_wait_ms());
        for (std::size_t k = 0; k < gbits.size(); ++k)
            std::printf(" %.1f | %s | %.1f |", shaped[k][i].median_ms(), ratio_cell(shaped[k], i).c_str(),
                        shaped[k][i].median_wait_ms());
        std::printf("\n");
    }
    if (with_none) {
        std::printf("\nWhere compression stops winning (x none at each link speed; a win is 1.01x or more as printed):\n\n");
        for (std::size_t i = 0; i < compressors.size(); ++i) {
            if (i == none_index) continue;
            std::string wins, loses;
            for (std::size_t k = 0; k < gbits.size(); ++k) {
                const double faster = speedup(shaped[k][none_index], shaped[k][i]);
                char item[64];
                std::snprintf(item, sizeof item, "%s (%.2fx)", gbit_name(gbits[k]).c_str(), faster);
                std::string& list = faster >= 1.005 ? wins : loses;
                list += (list.empty() ? "" : ", ") + std::string(item);
            }
            std::printf("- %s: wins at %s; loses at %s\n", compressors[i].describe().c_str(),
                        wins.empty() ? "no listed speed" : (wins + " Gbit/s").c_str(),
                        loses.empty() ? "no listed speed" : (loses + " Gbit/s").c_str());
        }
    }
    std::fflush(stdout);

    // 3. Kernel throughput.
    const ForeignLoad load3;
    const auto n = static_cast<std::size_t>(floats / chunk * chunk);
    std::vector<float> x(n), pristine(n), out(n);
    fill_gradient(pristine, 7);
    x = pristine;
    const double t_copy = median_seconds(reps, [&] {
        std::memcpy(out.data(), x.data(), n * sizeof(float));
        keep_memory(out.data());
    });
    const double copy_gbs = 4.0 * static_cast<double>(n) / t_copy / 1e9;
    std::vector<KernelRow> rows;
    std::vector<std::int64_t> psgd_elements;
    for (std::size_t i = 0; i < compressors.size(); ++i) {
        const auto& c = compressors[i];
        if (!c.on()) continue;
        if (c.kind == CompressorKind::power_sgd) {
            std::int64_t elements = 0;
            rows.push_back(power_sgd_buckets_row(c, spellings[i], config, dp, bucket, reps, elements));
            rows.back().compressor = i;
            rows.back().whole_exchange = true;
            psgd_elements.push_back(elements);
            auto side = static_cast<std::int64_t>(std::sqrt(static_cast<double>(n)));
            rows.push_back(power_sgd_kernels_row(c.rank, x, pristine, out, side, side, reps));
            rows.back().compressor = i;
            rows.back().estimate = false;
            x = pristine;
        } else {
            rows.push_back(chunk_codec_row(c, spellings[i], x, pristine, out, static_cast<std::int64_t>(chunk), dp, reps));
            rows.back().compressor = i;
            x = pristine;
        }
    }
    // One step's codec work on a rank's compute thread for the GPT's gradient
    // (G bytes, padded), from the rates above: two-stage compressors pack G,
    // decode the N chunks they receive (G), pack their sums (G / N) and decode
    // the gathered sums (G); top-k packs G, fills G with zeros and adds N
    // ranks' pairs for every chunk; PowerSGD is measured whole. An exchange
    // can save at most the uncompressed all-reduce's link time, so above the
    // link speed where that equals this work, compression cannot win.
    double gradient_bytes = 0;
    for (const auto& g : counted.front().groups) gradient_bytes += 4.0 * static_cast<double>(g.padded);
    const auto codec_ms = [&](const KernelRow& r) {
        const Compression& c = compressors[r.compressor];
        const double G = gradient_bytes / 1e9;  // GB
        if (r.whole_exchange) return r.pack_ms;
        if (c.kind == CompressorKind::top_k)
            return 1e3 * (G / r.pack_gbs + G / copy_gbs + dp * G / r.unpack_gbs);
        return 1e3 * (G / r.pack_gbs + 2 * G / r.unpack_gbs + G / dp / r.pack_gbs);
    };
    const auto break_even_gbit = [&](double ms) { return none_wire * 8 / (ms * 1e-3) / 1e9; };
    const double other3 = load3.cores();
    std::printf("\n## 3. Compression kernel throughput (one thread)\n\n");
    std::printf("GB/s of f32 gradient processed (4 bytes per value / time), median of %d, over %s values (%lld MiB) "
                "in chunks of %lld; memcpy of the same buffer in the same run: %.2f GB/s (%.2f ms; its traffic is "
                "twice that, read + write). Unpack adds weight 1/%d into f32 sums, as the exchange does. "
                "other_cores=%.2f.\n\n",
                reps, with_commas(static_cast<double>(n)).c_str(), static_cast<long long>(mib),
                static_cast<long long>(chunk), copy_gbs, t_copy * 1e3, dp, other3);
    std::printf("| kernel | pack ms | pack GB/s | of memcpy | unpack ms | unpack GB/s | of memcpy | codec ms per "
                "step | cannot win above |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    std::printf("| memcpy | %.2f | %.2f | 100%% | | | | | |\n", t_copy * 1e3, copy_gbs);
    for (const auto& r : rows) {
        std::printf("| %s | %.2f | %.2f | %.1f%% |", r.what.c_str(), r.pack_ms, r.pack_gbs, 100 * r.pack_gbs / copy_gbs);
        if (r.unpack_ms > 0)
            std::printf(" %.2f | %.2f | %.1f%% |", r.unpack_ms, r.unpack_gbs, 100 * r.unpack_gbs / copy_gbs);
        else
            std::printf(" (in the same pass) | | |");
        if (r.estimate)
            std::printf(" %.1f | %.1f Gbit/s |\n", codec_ms(r), break_even_gbit(codec_ms(r)));
        else
            std::printf(" | |\n");
    }
    std::printf("\ncodec ms per step: one step's compression work on one rank's thread for the GPT's %s-byte padded "
                "gradient, from these rates: two-stage compressors pack it, decode the N chunks received, pack their "
                "sums (1/N) and decode the gathered sums; top-k packs it, zero-fills it and adds N ranks' pairs per "
                "chunk; PowerSGD is its measured start + finish. Error feedback's add (one pass) is left out. cannot "
                "win above: the link speed at which the uncompressed all-reduce's serial link time (%s wire bytes) "
                "equals that work; compression saves at most that link time, so above it, it loses even with nothing "
                "hidden (the uncompressed all-reduce's own reduction work on the host aside). With %d ranks on %d cores each rank gets about %.2f of a core, which divides these speeds "
                "by as much again.\n",
                with_commas(gradient_bytes).c_str(), with_commas(none_wire).c_str(), dp, cores,
                std::min(1.0, static_cast<double>(cores) / dp));
    if (!psgd_elements.empty())
        std::printf("\nPowerSGD GPT buckets: %s padded elements, every bucket's start (M = grad + error, P = M Q) and "
                    "finish (orthonormalise, Q = M^T P, M^ = P Q^T, error) with a 1-rank ThreadWorld's all-reduces; "
                    "its pack column is the whole per-step compression work.\n",
                    with_commas(static_cast<double>(psgd_elements.front())).c_str());
    std::printf("\nFor scale: an uncompressed ring all-reduce at dp %d moves 2(N-1)/N = %.2f bytes per gradient byte, "
                "so a link of",
                dp, 2.0 * (dp - 1) / dp);
    for (std::size_t k = 0; k < gbits.size(); ++k)
        std::printf("%s %s Gbit/s reduces %.2f GB/s of gradient", k ? "," : "", gbit_name(gbits[k]).c_str(),
                    gbits[k] / 8 / (2.0 * (dp - 1) / dp));
    std::printf(".\n");

    // Summary.
    std::printf("\nSummary: wire bytes per step per rank over none:");
    for (std::size_t i = 0; i < compressors.size(); ++i)
        if (compressors[i].on())
            std::printf(" %s %.3f,", compressors[i].describe().c_str(),
                        counted[i].counts.total().wire_bytes / none_wire);
    std::printf(" all equal to the formulas: %s;", [&] {
        for (std::size_t i = 0; i < compressors.size(); ++i)
            if (std::abs(counted[i].counts.total().wire_bytes / predicted_bytes(compressors[i], dp, counted[i]).wire - 1) > 1e-9)
                return "NO";
        return "yes";
    }());
    if (with_none) {
        std::printf(" fastest step:");
        for (std::size_t k = 0; k < gbits.size(); ++k) {
            std::size_t best = none_index;
            double best_x = 1;
            for (std::size_t i = 0; i < compressors.size(); ++i) {
                const double faster = speedup(shaped[k][none_index], shaped[k][i]);
                if (faster > best_x) {
                    best = i;
                    best_x = faster;
                }
            }
            std::printf("%s %s Gbit/s %s %.2fx", k ? "," : "", gbit_name(gbits[k]).c_str(),
                        best == none_index ? "none" : compressors[best].describe().c_str(), best_x);
        }
        std::printf(";");
    }
    std::printf(" pack kernels at");
    for (const auto& r : rows)
        if (r.estimate) std::printf(" %s %.2f,", r.what.substr(0, r.what.find(' ')).c_str(), r.pack_gbs);
    std::printf(" memcpy %.1f GB/s; codec work alone rules compression out above", copy_gbs);
    bool first_row = true;
    for (const auto& r : rows)
        if (r.estimate) {
            std::printf("%s %s %.1f", first_row ? "" : ",", r.what.substr(0, r.what.find(' ')).c_str(),
                        break_even_gbit(codec_ms(r)));
            first_row = false;
        }
    std::printf(" Gbit/s (one core per rank).\n");
    return 0;
}
