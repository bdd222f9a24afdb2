// The collectives' device reductions on simulated threads, against the host
// communicators' (comm/host_reduce.hpp), as tests/cuda/test_device_thread_world.cu
// and test_nccl_comm.cu hold a GPU to them:
//   - the single-GPU world's rank-order reduction (comm/device_thread_reduce.cuh):
//     every dtype and op, 1 to 8 ranks, every rank's output, in place;
//     bit for bit (max keeps the first NaN's payload as the host does; which
//     NaN a sum of two keeps is the compiler's operand order on x86, and
//     canonical on a GPU, so sums compare NaN as NaN);
//   - NCCL's staging around its collective (comm/device_reduce.cuh): bf16 and
//     f16 widened to f32 (or, for max, every float dtype to order keys), the
//     collective's sum or integer max stood in for on the host in rank order,
//     narrowed once (divided for avg); f32 and integer averages divided in
//     place after the sum. Bit for bit, except what NCCL's integer max over
//     keys cannot keep: a NaN comes back as the canonical NaN 0x7fffffff
//     (the host keeps the first rank's payload), and a tie of -0 and +0 as
//     +0 (the host keeps the first rank's zero). Both are written in
//     docs/communicators.md.
// The launches are the launchers' (reduce_grid blocks of reduce_block
// threads), and grids of 3 blocks so that each grid-stride loop turns.
#include <catch2/catch.hpp>

#include "loom/comm/host_reduce.hpp"
#include "support/comparisons.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from their headers by extract_device_code.py at build time.
#include "device_code.inc"

namespace {

using loom::DType;
using loom::comm::ReduceOp;
namespace comm = loom::comm::detail;
using Bytes = std::vector<unsigned char>;

constexpr int block = static_cast<int>(comm::reduce_block);
constexpr std::int64_t count = 1000;

loom_sim::Grid grid(unsigned cap) { return {std::min(comm::reduce_grid(count), cap), 1}; }

const char* name_of(DType dtype) {
    switch (dtype) {
        case DType::f32: return "f32";
        case DType::bf16: return "bf16";
        case DType::f16: return "f16";
        case DType::i32: return "i32";
        case DType::i64: return "i64";
    }
    return "?";
}

// Rank r's input: uniform values in [-1, 1) (integers in [-1000, 1000)),
// and for the float dtypes NaNs of a different payload on each rank, signed
// zeros in both orders, and an Inf against a -Inf (their sum is NaN).
template <class T>
Bytes input(int rank) {
    std::mt19937 rng(1234u + static_cast<unsigned>(rank) * 7919u + sizeof(T) * 31u);
    std::uniform_real_distribution<float> real(-1.0f, 1.0f);
    std::uniform_int_distribution<int> integer(-1000, 999);
    std::vector<T> values(count);
    for (std::int64_t i = 0; i < count; ++i) {
        float value = real(rng);
        if (i % 11 == 3) value = loom_test::from_bits(0x7fc0'0000u | static_cast<std::uint32_t>(rank + 1) << 16);
        if (i % 13 == 5) value = rank % 2 == 0 ? -0.0f : 0.0f;
        if (i % 17 == 7) value = rank % 2 == 0 ? 0.0f : -0.0f;
        if (i % 19 == 9) value = rank % 2 == 0 ? INFINITY : -INFINITY;
        if constexpr (std::is_integral_v<T>)
            values[static_cast<std::size_t>(i)] = static_cast<T>(integer(rng));
        else if constexpr (std::is_same_v<T, float>)
            values[static_cast<std::size_t>(i)] = value;
        else
            values[static_cast<std::size_t>(i)] = T(value);
    }
    Bytes bytes(values.size() * sizeof(T));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
}

// Every rank's input.
template <class T>
std::vector<Bytes> inputs_of(int ranks) {
    std::vector<Bytes> inputs;
    for (int r = 0; r < ranks; ++r) inputs.push_back(input<T>(r));
    return inputs;
}

// host_reduce over the ranks' inputs: the reference.
Bytes host_result(DType dtype, ReduceOp op, const std::vector<Bytes>& inputs) {
    std::vector<const void*> in;
    for (const Bytes& b : inputs) in.push_back(b.data());
    Bytes out(inputs[0].size(), 0xab);
    void* const outs[] = {out.data()};
    loom::comm::host_reduce(dtype, op, in, outs, 0, static_cast<std::size_t>(count));
    return out;
}

// How closely a result must equal the host's, beyond equal bytes.
enum class Allow {
    nothing,
    any_nan,            // a sum of NaNs: which payload an addition keeps is the compiler's operand order on
                        // x86 (this file and host_reduce.hpp are built differently), canonical on a GPU
    any_nan_or_zero,    // NCCL's max through order keys (see the top of this file)
};

// Element by element: equal bytes, or what `allow` lets through.
template <class T>
loom_test::Mismatches compare(const Bytes& got, const Bytes& want, Allow allow) {
    loom_test::Mismatches bad;
    for (std::int64_t i = 0; i < count; ++i) {
        T g, w;
        std::memcpy(&g, got.data() + i * sizeof(T), sizeof(T));
        std::memcpy(&w, want.data() + i * sizeof(T), sizeof(T));
        if (std::memcmp(&g, &w, sizeof(T)) == 0) continue;
        if constexpr (!std::is_integral_v<T>) {
            const float gf = comm::widen_to_float(g), wf = comm::widen_to_float(w);
            if (allow != Allow::nothing && std::isnan(gf) && std::isnan(wf)) continue;
            if (allow == Allow::any_nan_or_zero && gf == 0.0f && wf == 0.0f) continue;
        }
        bad.add("element " + std::to_string(i) + " differs");
    }
    return bad;
}

template <class T>
void check_rank_order(DType dtype) {
    for (const int ranks : {1, 2, 3, 8})
        for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
            for (const bool in_place : {false, true})
                for (const unsigned cap : {4096u, 3u}) {
                    INFO(name_of(dtype) << ", " << ranks << " ranks, op " << static_cast<int>(op)
                                        << (in_place ? ", in place" : "") << ", grid cap " << cap);
                    const std::vector<Bytes> inputs = inputs_of<T>(ranks);
                    const Bytes want = host_result(dtype, op, inputs);
                    // Every rank's output (the all-reduce); in place, rank k's output is its input.
                    std::vector<Bytes> outputs(static_cast<std::size_t>(ranks), Bytes(want.size(), 0xab));
                    std::vector<Bytes> in_place_inputs = inputs;
                    comm::RankPointers pointers{};
                    for (int k = 0; k < ranks; ++k) {
                        pointers.in[k] = (in_place ? in_place_inputs : inputs)[static_cast<std::size_t>(k)].data();
                        pointers.out[k] = in_place ? in_place_inputs[static_cast<std::size_t>(k)].data()
                                                   : outputs[static_cast<std::size_t>(k)].data();
                    }
                    loom_sim::launch_each(grid(cap), block, [&] {
                        comm::rank_order_reduce_kernel<T>(pointers, ranks, ranks, count, op);
                    });
                    for (int k = 0; k < ranks; ++k) {
                        INFO("rank " << k);
                        const Bytes& got = in_place ? in_place_inputs[static_cast<std::size_t>(k)]
                                                    : outputs[static_cast<std::size_t>(k)];
                        CHECK_NO_MISMATCHES("result", compare<T>(got, want, op == ReduceOp::max ? Allow::nothing : Allow::any_nan));
                    }
                }
}

// NCCL's path for dtype and op (communicator_nccl.cuh's reduce), with the
// collective stood in for: sum in rank order, or integer max.
template <class T>
Bytes staged_result(ReduceOp op, const std::vector<Bytes>& inputs, unsigned cap) {
    const bool keys = op == ReduceOp::max && !std::is_integral_v<T>;
    const auto ranks = static_cast<int>(inputs.size());
    Bytes out(inputs[0].size(), 0xab);
    if constexpr (std::is_same_v<T, float> || std::is_integral_v<T>) {
      if (!keys) {
        // NCCL reduces these as they are; avg divides the sum afterwards.
        std::vector<T> reduced(count);
        for (std::int64_t i = 0; i < count; ++i) {
            T acc;
            std::memcpy(&acc, inputs[0].data() + i * sizeof(T), sizeof(T));
            for (int k = 1; k < ranks; ++k) {
                T x;
                std::memcpy(&x, inputs[static_cast<std::size_t>(k)].data() + i * sizeof(T), sizeof(T));
                acc = op == ReduceOp::max ? std::max(acc, x) : static_cast<T>(acc + x);
            }
            reduced[static_cast<std::size_t>(i)] = acc;
        }
        if (op == ReduceOp::avg)
            loom_sim::launch_each(grid(cap), block, [&] {
                comm::divide_kernel<T>(reduced.data(), count, static_cast<T>(ranks));
            });
        std::memcpy(out.data(), reduced.data(), out.size());
        return out;
      }
    }
    if constexpr (!std::is_integral_v<T>) {
        std::vector<std::vector<float>> wide(static_cast<std::size_t>(ranks), std::vector<float>(count));
        std::vector<std::vector<std::int32_t>> key(static_cast<std::size_t>(ranks), std::vector<std::int32_t>(count));
        for (int k = 0; k < ranks; ++k) {
            const auto* in = reinterpret_cast<const T*>(inputs[static_cast<std::size_t>(k)].data());
            loom_sim::launch_each(grid(cap), block, [&] {
                if (keys)
                    comm::widen_key_kernel<T>(in, key[static_cast<std::size_t>(k)].data(), count);
                else
                    comm::widen_kernel<T>(in, wide[static_cast<std::size_t>(k)].data(), count);
            });
        }
        for (std::int64_t i = 0; i < count; ++i)
            for (int k = 1; k < ranks; ++k) {
                const auto j = static_cast<std::size_t>(i);
                wide[0][j] += wide[static_cast<std::size_t>(k)][j];
                key[0][j] = std::max(key[0][j], key[static_cast<std::size_t>(k)][j]);
            }
        auto* result = reinterpret_cast<T*>(out.data());
        const float divisor = op == ReduceOp::avg ? static_cast<float>(ranks) : 1.0f;
        loom_sim::launch_each(grid(cap), block, [&] {
            if (keys)
                comm::narrow_key_kernel<T>(key[0].data(), result, count);
            else
                comm::narrow_kernel<T>(wide[0].data(), result, count, divisor);
        });
    }
    return out;
}

template <class T>
void check_staged(DType dtype) {
    for (const int ranks : {1, 2, 3, 8})
        for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
            for (const unsigned cap : {4096u, 3u}) {
                INFO(name_of(dtype) << ", " << ranks << " ranks, op " << static_cast<int>(op) << ", grid cap " << cap);
                const std::vector<Bytes> inputs = inputs_of<T>(ranks);
                const Bytes want = host_result(dtype, op, inputs);
                const Bytes got = staged_result<T>(op, inputs, cap);
                const bool keys = op == ReduceOp::max && !std::is_integral_v<T>;
                CHECK_NO_MISMATCHES("result", compare<T>(got, want, keys ? Allow::any_nan_or_zero : Allow::any_nan));
            }
}

}  // namespace

TEST_CASE("the single-GPU world's reduction kernel on simulated threads gives host_reduce's results, max bit for bit",
          "[simulated][collectives]") {
    check_rank_order<float>(DType::f32);
    check_rank_order<loom::bf16>(DType::bf16);
    check_rank_order<loom::f16>(DType::f16);
    check_rank_order<std::int32_t>(DType::i32);
    check_rank_order<std::int64_t>(DType::i64);
}

TEST_CASE("NCCL's widening, narrowing and dividing kernels on simulated threads give host_reduce's results",
          "[simulated][collectives]") {
    check_staged<float>(DType::f32);
    check_staged<loom::bf16>(DType::bf16);
    check_staged<loom::f16>(DType::f16);
    check_staged<std::int32_t>(DType::i32);
    check_staged<std::int64_t>(DType::i64);
}

TEST_CASE("NCCL's float max through order keys loses NaN payloads and the first rank's zero sign, and nothing else",
          "[simulated][collectives]") {
    // What the loose comparison above lets through, shown: two ranks, a NaN
    // with a payload first, then -0 before +0.
    const std::vector<float> a{loom_test::from_bits(0x7fc0'1234u), -0.0f, 1.0f, -2.0f};
    const std::vector<float> b{3.0f, 0.0f, -1.0f, -3.0f};
    std::vector<std::int32_t> ka(4), kb(4);
    std::vector<float> out(4, 7.0f);
    loom_sim::launch_each(loom_sim::Grid{1, 1}, block, [&] {
        comm::widen_key_kernel<float>(a.data(), ka.data(), 4);
        comm::widen_key_kernel<float>(b.data(), kb.data(), 4);
    });
    for (std::size_t i = 0; i < 4; ++i) ka[i] = std::max(ka[i], kb[i]);
    loom_sim::launch_each(loom_sim::Grid{1, 1}, block, [&] { comm::narrow_key_kernel<float>(ka.data(), out.data(), 4); });
    CHECK(loom_test::bits_of(out[0]) == 0x7fff'ffffu);  // the host: 0x7fc01234, rank 0's NaN
    CHECK(loom_test::bits_of(out[1]) == 0x0000'0000u);  // the host: -0, rank 0's zero
    CHECK(out[2] == 1.0f);
    CHECK(out[3] == -2.0f);
}
