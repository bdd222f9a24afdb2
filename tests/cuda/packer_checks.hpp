// The checks every CUDA packer of kernels/cuda/quantize.cuh (bf16/f16 casts,
// int8 blocks, 1-bit signs) meets against its host twin: pack on both sides
// (with a residual, then on the device without one, the kernel's other
// branch), unpack on both sides (overwriting, then adding), and both on a
// non-blocking stream; and their inputs' common base. A packer is described by four calls with its sizes
// bound, so one copy of each check serves all three. Test code only;
// include it as "packer_checks.hpp" from a file in tests/cuda.
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "device_support.hpp"
#include "support/packer_inputs.hpp"
#include "loom/core/check_cuda.hpp"

namespace loom_test {

// A packer under test:
//   host_pack(x, words, residual)              residual may be null;
//   device_pack(x, words, residual, stream)    the same on the device;
//   host_unpack(words, out, weight, add)
//   device_unpack(words, out, weight, add, stream)
template <class HostPack, class DevicePack, class HostUnpack, class DeviceUnpack>
struct Packer {
    HostPack host_pack;
    DevicePack device_pack;
    HostUnpack host_unpack;
    DeviceUnpack device_unpack;
};

// f with `sizes` bound after its first argument: the packers of
// kernels/{host,cuda}/quantize take their sizes (n, or n and block) right
// after their input.
template <class F, class... Sizes>
auto sizes_bound(F f, Sizes... sizes) {
    return [=](auto first, auto... rest) { f(first, sizes..., rest...); };
}

// The Packer of a kernel's four functions (host::pack_int8, dev::pack_int8,
// host::unpack_int8, dev::unpack_int8, say), its sizes bound.
template <class HostPack, class DevicePack, class HostUnpack, class DeviceUnpack, class... Sizes>
auto packer_of(HostPack host_pack, DevicePack device_pack, HostUnpack host_unpack, DeviceUnpack device_unpack,
               Sizes... sizes) {
    return Packer<decltype(sizes_bound(host_pack, sizes...)), decltype(sizes_bound(device_pack, sizes...)),
                  decltype(sizes_bound(host_unpack, sizes...)), decltype(sizes_bound(device_unpack, sizes...))>{
        sizes_bound(host_pack, sizes...), sizes_bound(device_pack, sizes...), sizes_bound(host_unpack, sizes...),
        sizes_bound(device_unpack, sizes...)};
}

// What pack_both wrote.
struct Packed {
    std::vector<std::uint32_t> host_words, device_words;
    std::vector<float> host_residual, device_residual;
    std::vector<std::uint32_t> device_words_without_residual;  // packed again, no residual
};

// Packs x into `words` words on both sides, each with a residual: the host
// into words filled with 0xab bytes, the device into 0xab garbage it must
// overwrite; then the device again, without a residual.
template <class P>
Packed pack_both(const P& packer, const std::vector<float>& x, std::size_t words) {
    Packed packed;
    packed.host_words.assign(words, 0xabab'ababu);
    packed.host_residual.resize(x.size());
    packer.host_pack(x.data(), packed.host_words.data(), packed.host_residual.data());

    DeviceArray<float> d_x(x), d_residual(x.size());
    DeviceArray<std::uint32_t> d_words(words);
    d_words.fill_bytes(0xab);
    packer.device_pack(d_x.get(), d_words.get(), d_residual.get(), nullptr);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    packed.device_words = d_words.to_host();
    packed.device_residual = d_residual.to_host();

    d_words.fill_bytes(0xab);
    packer.device_pack(d_x.get(), d_words.get(), nullptr, nullptr);
    packed.device_words_without_residual = d_words.to_host();
    return packed;
}

// Unpacks n values with `weight` on both sides, the host from host_words and
// the device from device_words: overwriting, then adding to values both
// sides start from (normal, from rng). Bit for bit, NaN as NaN.
template <class P>
void check_unpack_both(const P& packer, const std::vector<std::uint32_t>& host_words,
                       const std::vector<std::uint32_t>& device_words, std::size_t n, float weight,
                       std::mt19937& rng) {
    DeviceArray<std::uint32_t> d_words(device_words);
    for (const bool add : {false, true}) {
        INFO("add = " << add);
        std::vector<float> host_out = normal_values(n, rng);
        DeviceArray<float> d_out(host_out);
        packer.host_unpack(host_words.data(), host_out.data(), weight, add);
        packer.device_unpack(d_words.get(), d_out.get(), weight, add, nullptr);
        LOOM_CUDA_CHECK(cudaDeviceSynchronize());
        CHECK_NO_MISMATCHES("unpacked", compare_floats(d_out.to_host(), host_out, true));
    }
}

// Packs x (no residual) and unpacks the words (weight 1, overwriting) on a
// non-blocking stream: the host's words bit for bit, its values bit for
// bit (NaN as NaN where nan_as_nan).
template <class P>
void check_on_stream(const P& packer, const std::vector<float>& x, std::size_t words, bool nan_as_nan) {
    std::vector<std::uint32_t> host_words(words);
    packer.host_pack(x.data(), host_words.data(), nullptr);

    Stream stream(cudaStreamNonBlocking);
    DeviceArray<float> d_x(x), d_out(x.size());
    DeviceArray<std::uint32_t> d_words(host_words.size());
    uploads_done();
    packer.device_pack(d_x.get(), d_words.get(), nullptr, stream.get());
    packer.device_unpack(d_words.get(), d_out.get(), 1.0f, false, stream.get());
    stream.synchronize();
    CHECK_NO_MISMATCHES("packed words", compare_words(d_words.to_host(), host_words));
    std::vector<float> host_out(x.size());
    packer.host_unpack(host_words.data(), host_out.data(), 1.0f, false);
    CHECK_NO_MISMATCHES("unpacked", compare_floats(d_out.to_host(), host_out, nan_as_nan));
}

}  // namespace loom_test
