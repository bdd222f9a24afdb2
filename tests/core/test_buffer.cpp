// Buffer<Host>: owning, aligned, zero-filled, move-only storage with views.
#include <catch2/catch.hpp>

#include <loom/core/buffer.hpp>

#include <cstdint>
#include <type_traits>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Buffer;
using loom::DType;
using loom::Host;
using loom::Shape;

static_assert(!std::is_copy_constructible_v<Buffer<Host>>, "a Buffer owns its bytes: copies must be explicit");
static_assert(std::is_nothrow_move_constructible_v<Buffer<Host>>);

TEST_CASE("Buffer<Host> is aligned, zero-filled and sized by dtype", "[buffer]") {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64}) {
        Buffer<Host> b(dtype, Shape{3, 5});
        CHECK(b.numel() == 15);
        CHECK(b.nbytes() == 15 * loom::size_of(dtype));
        CHECK(reinterpret_cast<std::uintptr_t>(b.raw()) % loom::Allocator<Host>::alignment == 0);
        const auto* bytes = static_cast<const unsigned char*>(b.raw());
        for (std::size_t i = 0; i < b.nbytes(); ++i) REQUIRE(bytes[i] == 0);
    }
}

TEST_CASE("Buffer<Host> hands out views and moves without copying", "[buffer]") {
    Buffer<Host> a(DType::f32, Shape{4, 6});
    float* p = a.data<float>();
    p[23] = 7.0f;
    const auto view = a.tensor(Shape{2, 12});
    CHECK(view.data<float>()[23] == 7.0f);
    Buffer<Host> b = std::move(a);
    CHECK(b.raw() == p);
    CHECK(a.raw() == nullptr);
    CHECK(a.nbytes() == 0);
    a = std::move(b);
    CHECK(a.raw() == p);
    CHECK_THROWS_WITH(a.data<std::int64_t>(), Catch::Contains("holds f32 elements, not i64"));
    CHECK_THROWS_WITH(a.tensor(Shape{5, 5}), Catch::StartsWith("cannot reshape [4, 6] (24 elements) to [5, 5]"));
}

TEST_CASE("Buffer<Host> of zero elements owns nothing", "[buffer]") {
    Buffer<Host> empty(DType::f32, Shape{0, 4});
    CHECK(empty.raw() == nullptr);
    CHECK(empty.tensor().empty());
}

TEST_CASE("Buffer<Host> refuses sizes beyond the address space", "[buffer][errors]") {
    CHECK_THROWS_WITH(Buffer<Host>(DType::i64, Shape{1LL << 62}),
                      Catch::StartsWith("a Buffer of [4611686018427387904] i64 elements exceeds the address space"));
}

TEST_CASE("Buffer<Host> refuses a CUDA device", "[buffer][errors]") {
    CHECK_THROWS_WITH(Buffer<Host>(DType::f32, Shape{4}, loom::cuda_device(0)),
                      Catch::StartsWith("a Buffer<host> cannot live on cuda:0"));
}

}  // namespace LOOM_TEST_FILE
