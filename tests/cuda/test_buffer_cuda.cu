// Buffer<Cuda>: stream-ordered device memory, zero-filled, movable, and a
// kernel writing through its Tensor view reads back on the host.
#include <catch2/catch.hpp>

#include <loom/core/buffer_cuda.hpp>

#include <vector>

namespace {

__global__ void iota_kernel(float* out, long long n) {
    const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (i < n) out[i] = static_cast<float>(i);
}

}  // namespace

TEST_CASE("Buffer<Cuda> is zero-filled and a kernel writes through its view", "[buffer][device]") {
    constexpr long long n = 1000;
    loom::Buffer<loom::Cuda> buffer(loom::DType::f32, loom::Shape{10, 100});
    REQUIRE(buffer.device() == loom::cuda_device(0));
    REQUIRE(buffer.nbytes() == n * sizeof(float));

    std::vector<float> host(n, -1.0f);
    LOOM_CUDA_CHECK(cudaMemcpy(host.data(), buffer.raw(), buffer.nbytes(), cudaMemcpyDeviceToHost));
    for (float v : host) REQUIRE(v == 0.0f);

    iota_kernel<<<(n + 255) / 256, 256>>>(buffer.data<float>(), n);
    LOOM_CUDA_CHECK(cudaGetLastError());
    loom::Buffer<loom::Cuda> moved = std::move(buffer);
    LOOM_CUDA_CHECK(cudaMemcpy(host.data(), moved.raw(), moved.nbytes(), cudaMemcpyDeviceToHost));
    for (long long i = 0; i < n; ++i) REQUIRE(host[i] == static_cast<float>(i));
    REQUIRE(buffer.raw() == nullptr);
}

TEST_CASE("Buffer<Cuda> refuses a host device", "[buffer][device]") {
    REQUIRE_THROWS_WITH(loom::Buffer<loom::Cuda>(loom::DType::f32, loom::Shape{4}, loom::host_device),
                        Catch::StartsWith("a Buffer<cuda> cannot live on host"));
}
