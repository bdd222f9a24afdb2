// loom's bf16/f16 conversions on the device agree bit for bit with CUDA's own
// intrinsics and with the same conversions run on the host.
#include <catch2/catch.hpp>

#include "device_support.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/dtype.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using loom_test::DeviceArray;
using loom_test::Mismatches;
using loom_test::same_bits_or_both_nan;

__global__ void narrow_kernel(const float* in, long long n, std::uint16_t* loom_bf16,
                              std::uint16_t* cuda_bf16, std::uint16_t* loom_f16,
                              std::uint16_t* cuda_f16) {
    const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const float value = in[i];
    loom_bf16[i] = loom::to_bf16(value).bits;
    cuda_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
    loom_f16[i] = loom::to_f16(value).bits;
    cuda_f16[i] = __half_as_ushort(__float2half_rn(value));
}

// Thread i widens the 16-bit pattern i; the results are float bit patterns.
__global__ void widen_kernel(std::uint32_t* loom_bf16, std::uint32_t* cuda_bf16,
                             std::uint32_t* loom_f16, std::uint32_t* cuda_f16) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i > 0xffff) return;
    const auto bits = static_cast<std::uint16_t>(i);
    loom_bf16[i] = __float_as_uint(loom::to_float(loom::bf16::from_bits(bits)));
    cuda_bf16[i] = __float_as_uint(__bfloat162float(__ushort_as_bfloat16(bits)));
    loom_f16[i] = __float_as_uint(loom::to_float(loom::f16::from_bits(bits)));
    cuda_f16[i] = __float_as_uint(__half2float(__ushort_as_half(bits)));
}

std::string hex(std::uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%x", value);
    return text;
}

// Every exact midpoint between adjacent 16-bit values of one format (both
// signs, up to the overflow midpoint), with the floats just either side.
template <class Narrow>
void add_midpoints(std::vector<float>& out, std::uint16_t max_finite, double beyond_max) {
    for (double sign : {1.0, -1.0}) {
        for (std::uint32_t i = 0; i <= max_finite; ++i) {
            const double a = loom::to_float(Narrow::from_bits(static_cast<std::uint16_t>(i)));
            const double b = i == max_finite
                                 ? beyond_max
                                 : loom::to_float(Narrow::from_bits(static_cast<std::uint16_t>(i + 1)));
            const auto mid = static_cast<float>(sign * (a + b) / 2);
            out.push_back(mid);
            out.push_back(std::nextafter(mid, 0.0f));
            out.push_back(std::nextafter(mid, static_cast<float>(sign) * INFINITY));
        }
    }
}

std::vector<float> test_inputs() {
    std::vector<float> inputs;
    add_midpoints<loom::bf16>(inputs, 0x7f7f, 0x1p128);
    add_midpoints<loom::f16>(inputs, 0x7bff, 65536.0);
    for (std::uint32_t bits :
         {0x0000'0000u, 0x8000'0000u, 0x7f80'0000u, 0xff80'0000u, 0x7f7f'ffffu, 0xff7f'ffffu,
          0x0000'0001u, 0x8000'0001u, 0x007f'ffffu, 0x0080'0000u, 0x7fc0'0000u, 0xffc0'0000u,
          0x7f80'0001u, 0xff80'0001u, 0x7fbf'ffffu, 0xffff'ffffu, 0x3300'0000u, 0x3880'0000u,
          0x477f'f000u, 0x477f'efffu, 0x3f80'0000u, 0x3f80'8000u, 0x3f81'8000u})
        inputs.push_back(std::bit_cast<float>(bits));
    // Random bit patterns reach every exponent and NaN payload; random values
    // in [-70000, 70000] stay where f16 is finite and most interesting.
    std::mt19937 rng(20240611);
    std::uniform_real_distribution<float> moderate(-70000.0f, 70000.0f);
    for (int i = 0; i < (1 << 20); ++i) inputs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
    for (int i = 0; i < (1 << 18); ++i) inputs.push_back(moderate(rng));
    return inputs;
}

bool both_nan_or_same(std::uint16_t loom_bits, std::uint16_t cuda_bits, std::uint16_t inf) {
    const bool loom_nan = (loom_bits & 0x7fff) > inf;
    const bool cuda_nan = (cuda_bits & 0x7fff) > inf;
    return loom_nan || cuda_nan ? loom_nan && cuda_nan : loom_bits == cuda_bits;
}

}  // namespace

TEST_CASE("loom's device bf16/f16 rounding matches CUDA's intrinsics and loom's host code",
          "[dtype][device]") {
    const std::vector<float> inputs = test_inputs();
    const auto n = static_cast<long long>(inputs.size());
    DeviceArray<float> in(inputs);
    DeviceArray<std::uint16_t> loom_bf16(inputs.size()), cuda_bf16(inputs.size());
    DeviceArray<std::uint16_t> loom_f16(inputs.size()), cuda_f16(inputs.size());

    constexpr int block = 256;
    narrow_kernel<<<static_cast<unsigned>((n + block - 1) / block), block>>>(
        in.get(), n, loom_bf16.get(), cuda_bf16.get(), loom_f16.get(), cuda_f16.get());
    LOOM_CUDA_CHECK(cudaGetLastError());
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());

    const auto dev_bf16 = loom_bf16.to_host(), ref_bf16 = cuda_bf16.to_host();
    const auto dev_f16 = loom_f16.to_host(), ref_f16 = cuda_f16.to_host();
    Mismatches vs_cuda_bf16, vs_cuda_f16, vs_host;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const std::string input = "float " + hex(std::bit_cast<std::uint32_t>(inputs[i]));
        if (!both_nan_or_same(dev_bf16[i], ref_bf16[i], 0x7f80))
            vs_cuda_bf16.add(input + ": loom " + hex(dev_bf16[i]) + ", CUDA " + hex(ref_bf16[i]));
        if (!both_nan_or_same(dev_f16[i], ref_f16[i], 0x7c00))
            vs_cuda_f16.add(input + ": loom " + hex(dev_f16[i]) + ", CUDA " + hex(ref_f16[i]));
        // Same code on both sides, so even NaN payloads must agree.
        const std::uint16_t host_bf16 = loom::to_bf16(inputs[i]).bits;
        const std::uint16_t host_f16 = loom::to_f16(inputs[i]).bits;
        if (dev_bf16[i] != host_bf16 || dev_f16[i] != host_f16)
            vs_host.add(input + ": device " + hex(dev_bf16[i]) + "/" + hex(dev_f16[i]) + ", host " +
                        hex(host_bf16) + "/" + hex(host_f16));
    }
    INFO(inputs.size() << " inputs");
    INFO("bf16 vs __float2bfloat16_rn: " << vs_cuda_bf16.count << vs_cuda_bf16.examples);
    INFO("f16 vs __float2half_rn: " << vs_cuda_f16.count << vs_cuda_f16.examples);
    INFO("device vs host: " << vs_host.count << vs_host.examples);
    CHECK(vs_cuda_bf16.count == 0);
    CHECK(vs_cuda_f16.count == 0);
    CHECK(vs_host.count == 0);
    CHECK(inputs.size() > 1'000'000);
}

TEST_CASE("loom's device bf16/f16 widening matches CUDA's for every bit pattern",
          "[dtype][device]") {
    constexpr std::size_t patterns = 0x10000;
    DeviceArray<std::uint32_t> loom_bf16(patterns), cuda_bf16(patterns);
    DeviceArray<std::uint32_t> loom_f16(patterns), cuda_f16(patterns);
    widen_kernel<<<patterns / 256, 256>>>(loom_bf16.get(), cuda_bf16.get(), loom_f16.get(),
                                          cuda_f16.get());
    LOOM_CUDA_CHECK(cudaGetLastError());
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());

    const auto dev_bf16 = loom_bf16.to_host(), ref_bf16 = cuda_bf16.to_host();
    const auto dev_f16 = loom_f16.to_host(), ref_f16 = cuda_f16.to_host();
    Mismatches bad;
    for (std::uint32_t i = 0; i < patterns; ++i) {
        const auto bits = static_cast<std::uint16_t>(i);
        const float host_bf16 = loom::to_float(loom::bf16::from_bits(bits));
        const float host_f16 = loom::to_float(loom::f16::from_bits(bits));
        const auto same = [](std::uint32_t x, std::uint32_t y) {
            return same_bits_or_both_nan(std::bit_cast<float>(x), std::bit_cast<float>(y));
        };
        if (!same(dev_bf16[i], ref_bf16[i]) || dev_bf16[i] != std::bit_cast<std::uint32_t>(host_bf16))
            bad.add("bf16 " + hex(i) + ": loom device " + hex(dev_bf16[i]) + ", CUDA " +
                    hex(ref_bf16[i]) + ", loom host " + hex(std::bit_cast<std::uint32_t>(host_bf16)));
        if (!same(dev_f16[i], ref_f16[i]) || dev_f16[i] != std::bit_cast<std::uint32_t>(host_f16))
            bad.add("f16 " + hex(i) + ": loom device " + hex(dev_f16[i]) + ", CUDA " +
                    hex(ref_f16[i]) + ", loom host " + hex(std::bit_cast<std::uint32_t>(host_f16)));
    }
    INFO(bad.count << " mismatches" << bad.examples);
    CHECK(bad.count == 0);
}
