// The training loop's guard against a diverged run: a non-finite loss or
// parameter stops it with the step and the tensor named.
#include <catch2/catch.hpp>

#include <loom/core/tensor.hpp>
#include <loom/train/finite_check.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using Catch::Contains;
using loom_test::message_of;

TEST_CASE("finite_check finds the first non-finite element of every floating dtype", "[finite]") {
    std::vector<float> values(10, 1.0f);
    CHECK_FALSE(loom::train::first_non_finite(loom::Tensor::of(values.data(), loom::Shape{10})).has_value());
    values[7] = std::numeric_limits<float>::infinity();
    values[9] = std::nanf("");
    const auto found = loom::train::first_non_finite(loom::Tensor::of(values.data(), loom::Shape{2, 5}));
    REQUIRE(found.has_value());
    CHECK(found->index == 7);
    CHECK(std::isinf(found->value));

    std::vector<loom::bf16> half(4, loom::bf16(2.0f));
    CHECK_FALSE(loom::train::first_non_finite(loom::Tensor::of(half.data(), loom::Shape{4})).has_value());
    half[2] = loom::bf16(std::nanf(""));
    REQUIRE(loom::train::first_non_finite(loom::Tensor::of(half.data(), loom::Shape{4})).has_value());
    CHECK(loom::train::first_non_finite(loom::Tensor::of(half.data(), loom::Shape{4}))->index == 2);

    std::vector<std::int32_t> ints(3, 1);  // integers are always finite
    CHECK_FALSE(loom::train::first_non_finite(loom::Tensor::of(ints.data(), loom::Shape{3})).has_value());
}

TEST_CASE("finite_check stops on a non-finite loss or tensor, naming the step and the tensor", "[finite]") {
    CHECK_NOTHROW(loom::train::check_finite_loss(2.5, 3));
    CHECK_THAT(message_of([] { loom::train::check_finite_loss(std::nan(""), 12); }),
               Contains("step 12") && Contains("loss is nan"));
    CHECK_THAT(message_of([] { loom::train::check_finite_loss(-std::numeric_limits<double>::infinity(), 4); }),
               Contains("step 4") && Contains("loss is -inf"));

    std::vector<float> values(6, 0.5f);
    const auto t = loom::Tensor::of(values.data(), loom::Shape{2, 3});
    CHECK_NOTHROW(loom::train::check_finite(t, "blocks.0.mlp.w", "step 5"));
    values[4] = -std::numeric_limits<float>::infinity();
    CHECK_THAT(message_of([&] { loom::train::check_finite(t, "blocks.0.mlp.w", "step 5"); }),
               Contains("step 5: tensor blocks.0.mlp.w holds -inf at element 4 of 6"));
}

}  // namespace LOOM_TEST_FILE
