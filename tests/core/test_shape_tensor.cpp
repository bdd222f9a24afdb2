// Shape, strides and Tensor views: sizes, layout, views, and the errors that
// name both shapes.
#include <catch2/catch.hpp>

#include <loom/core/tensor.hpp>

#include <sstream>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::DType;
using loom::Shape;
using loom::Tensor;

template <class T>
static std::string printed(const T& value) {
    std::ostringstream out;
    out << value;
    return out.str();
}

TEST_CASE("Shape counts elements, prints itself and indexes from the back", "[tensor]") {
    const Shape s{2, 3, 4};
    CHECK(s.rank() == 3);
    CHECK(s.numel() == 24);
    CHECK(s.dim(-1) == 4);
    CHECK(s.dim(0) == 2);
    CHECK(printed(s) == "[2, 3, 4]");
    CHECK(Shape{}.numel() == 1);
    CHECK(printed(Shape{}) == "[]");
    CHECK(Shape{5, 0}.numel() == 0);
    CHECK(loom::contiguous_strides(s) == Shape{12, 4, 1});
}

TEST_CASE("Shape rejects bad extents with the value and the valid range", "[tensor][errors]") {
    CHECK_THROWS_WITH(Shape({2, -1}), Catch::StartsWith("dimension 1 of [2, -1] is negative; sizes must be >= 0"));
    CHECK_THROWS_WITH(Shape({1, 1, 1, 1, 1, 1, 1}),
                      Catch::StartsWith("a tensor has at most 6 dimensions, got 7"));
    CHECK_THROWS_WITH(Shape({1LL << 40, 1LL << 30}),
                      Catch::StartsWith("shape [1099511627776, 1073741824] has more than 2^63 - 1 elements"));
    CHECK_THROWS_WITH(Shape{}.dim(0), Catch::StartsWith("dimension 0 of a scalar (shape []) does not exist"));
    CHECK_THROWS_WITH(Shape({2, 3}).dim(2),
                      Catch::StartsWith("dimension 2 is out of range for [2, 3] of rank 2; valid are -2..1"));
}

TEST_CASE("Tensor is a typed view that checks its element type", "[tensor]") {
    std::vector<float> storage(6);
    const Tensor t = Tensor::of(storage.data(), Shape{2, 3});
    CHECK(t.dtype() == DType::f32);
    CHECK(t.numel() == 6);
    CHECK(t.nbytes() == 24);
    CHECK(t.is_contiguous());
    CHECK(t.data<float>() == storage.data());
    CHECK(printed(t) == "Tensor(f32, [2, 3], host)");
    CHECK_THROWS_WITH(t.data<std::int32_t>(),
                      Catch::StartsWith("tensor Tensor(f32, [2, 3], host) holds f32 elements, not i32"));
    auto span = t.span<float>();
    CHECK(span.size() == 6);
}

TEST_CASE("Tensor slice and reshape are views with the right strides", "[tensor]") {
    std::vector<float> storage(12);
    for (std::size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<float>(i);
    const Tensor t = Tensor::of(storage.data(), Shape{3, 4});

    const Tensor rows = t.slice(0, 1, 3);
    CHECK(rows.shape() == Shape{2, 4});
    CHECK(rows.is_contiguous());
    CHECK(rows.data<float>()[0] == 4.0f);

    const Tensor cols = t.slice(-1, 1, 3);
    CHECK(cols.shape() == Shape{3, 2});
    CHECK(cols.strides() == Shape{4, 1});
    CHECK_FALSE(cols.is_contiguous());
    CHECK(cols.data<float>()[0] == 1.0f);

    const Tensor flat = t.reshape(Shape{12});
    CHECK(flat.data<float>()[11] == 11.0f);
    CHECK(t.slice(0, 2, 2).numel() == 0);
    CHECK(t.slice(1, 1, 1).is_contiguous());  // an empty view is contiguous, as in PyTorch
}

TEST_CASE("Tensor shape errors name both shapes", "[tensor][errors]") {
    std::vector<float> storage(12);
    const Tensor t = Tensor::of(storage.data(), Shape{3, 4});
    CHECK_THROWS_WITH(t.reshape(Shape{5, 2}),
                      Catch::StartsWith("cannot reshape [3, 4] (12 elements) to [5, 2] (10 elements)"));
    CHECK_THROWS_WITH(t.slice(1, 2, 5), Catch::StartsWith("slice [2, 5) of dimension 1 is out of range for "
                                                          "shape [3, 4]; need 0 <= begin <= end <= 4"));
    CHECK_THROWS_WITH(t.slice(0, 0, 2).slice(1, 0, 2).reshape(Shape{4}),
                      Catch::StartsWith("cannot reshape non-contiguous tensor"));
    CHECK_THROWS_WITH(loom::expect_shape(t, Shape{4, 3}, "weight"),
                      Catch::StartsWith("weight has shape [3, 4], expected [4, 3]"));
    std::vector<float> other(12);
    CHECK_THROWS_WITH(loom::expect_same_layout(t, "x", Tensor::of(other.data(), Shape{12}), "y"),
                      Catch::StartsWith("x has shape [3, 4] but y has shape [12]"));
    CHECK_THROWS_WITH(t.slice(0, 0, 2).slice(1, 0, 2).span<float>(), Catch::Contains("is not contiguous"));
    const Tensor on_gpu(storage.data(), DType::f32, Shape{12}, loom::cuda_device(1));
    CHECK(printed(on_gpu) == "Tensor(f32, [12], cuda:1)");
    CHECK_THROWS_WITH(on_gpu.span<float>(), Catch::Contains("is not in host memory"));
}

}  // namespace LOOM_TEST_FILE
