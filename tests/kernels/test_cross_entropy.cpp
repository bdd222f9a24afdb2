// Host cross-entropy: the mean loss and logsumexp against double precision,
// the backward against central finite differences of the double loss (the
// layer's gradient check), large and confident logits, and bad targets.
#include <catch2/catch.hpp>

#include "support/message_of.hpp"

#include <loom/core/error.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/cross_entropy.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;

constexpr std::int64_t rows = 7, V = 37;

// Ordinary logits, a row shifted by +1000 (exp would overflow without the
// max), a confident row (the target 15 above the rest), a row whose target is
// the least likely class.
struct Batch {
    std::vector<float> logits;
    std::vector<std::int32_t> targets{3, 0, 36, 17, 8, 22, 5};
};

Batch make_batch() {
    Batch batch;
    batch.logits.resize(rows * V);
    loom::RngStream{23, 1}.fill_normal(batch.logits, 0, 0.0f, 2.0f);
    for (std::int64_t j = 0; j < V; ++j) batch.logits[1 * V + j] += 1000.0f;
    batch.logits[2 * V + 36] += 15.0f;
    batch.logits[3 * V + 17] = -20.0f;
    return batch;
}

double reference_lse(const double* row) {
    const double top = *std::max_element(row, row + V);
    double sum = 0.0;
    for (std::int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - top);
    return top + std::log(sum);
}

double reference_loss(const std::vector<double>& logits, const std::vector<std::int32_t>& targets) {
    double total = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) total += reference_lse(&logits[r * V]) - logits[r * V + targets[r]];
    return total / rows;
}

using loom_test::message_of;

}  // namespace

TEST_CASE("cross_entropy_forward returns the mean loss and saves logsumexp per row", "[kernels][cross_entropy]") {
    const auto batch = make_batch();
    std::vector<float> lse(rows, 123.0f);
    const float loss = host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), rows, V);
    const std::vector<double> logits(batch.logits.begin(), batch.logits.end());
    for (std::int64_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        // logsumexp to float rounding of its size (1000 in row 1).
        const double expected = reference_lse(&logits[r * V]);
        CHECK(std::fabs(lse[r] - expected) <= 2e-7 * std::fabs(expected) + 1e-6);
    }
    // Each row's loss is lse - x_t, so its error is lse's rounding: ~6e-5 in
    // the row at 1000, averaged over 7 rows.
    CHECK(std::fabs(loss - reference_loss(logits, batch.targets)) <= 2e-5);
    CHECK(std::isfinite(loss));
}

TEST_CASE("cross_entropy_backward matches finite differences of the double-precision loss",
          "[kernels][cross_entropy][gradcheck]") {
    const auto batch = make_batch();
    std::vector<float> lse(rows);
    (void)host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), rows, V);
    const float dloss = 0.7f;
    std::vector<float> dlogits(rows * V, 123.0f);  // written, not accumulated
    host::cross_entropy_backward(batch.logits.data(), batch.targets.data(), lse.data(), dloss, dlogits.data(), rows,
                                 V);

    std::vector<double> logits(batch.logits.begin(), batch.logits.end());
    const double h = 1e-4;
    const double scale = double{dloss} / rows;
    for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = 0; j < V; ++j) {
            double& x = logits[r * V + j];
            const double saved = x;
            x = saved + h;
            const double up = dloss * reference_loss(logits, batch.targets);
            x = saved - h;
            const double down = dloss * reference_loss(logits, batch.targets);
            x = saved;
            const double numeric = (up - down) / (2 * h);
            CAPTURE(r, j, dlogits[r * V + j], numeric);
            // softmax p = e^(x - lse) with lse rounded to float: p is off by
            // ~|lse| * 6e-8 relative, so the tolerance scales with |lse|.
            const double tolerance = 1e-5 * std::fabs(numeric) + 2e-7 * scale * (1.0 + std::fabs(lse[r]));
            CHECK(std::fabs(dlogits[r * V + j] - numeric) <= tolerance);
        }
    }
    // The confident row: the target's gradient is small and negative, the
    // others tiny and positive; the row sums to zero.
    double row_sum = 0.0;
    for (std::int64_t j = 0; j < V; ++j) row_sum += dlogits[2 * V + j];
    CHECK(dlogits[2 * V + 36] < 0.0f);
    CHECK(dlogits[2 * V + 36] > -1e-4f);
    CHECK(std::fabs(row_sum) <= 5e-7);  // e^(lse error) - 1, times scale
}

TEST_CASE("cross_entropy names a target outside the classes and its row, before writing", "[kernels][cross_entropy]") {
    auto batch = make_batch();
    std::vector<float> lse(rows, 123.0f);
    batch.targets[4] = 37;
    CHECK(message_of([&] {
              (void)host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), rows, V);
          }) == "cross_entropy: target 37 at row 4 is outside the classes [0, 37)");
    CHECK(lse == std::vector<float>(rows, 123.0f));
    batch.targets[4] = 8;
    batch.targets[6] = -100;  // PyTorch's default ignore_index is not supported: every row counts
    std::vector<float> dlogits(rows * V, 5.0f);
    CHECK(message_of([&] {
              host::cross_entropy_backward(batch.logits.data(), batch.targets.data(), lse.data(), 1.0f,
                                           dlogits.data(), rows, V);
          }) == "cross_entropy: target -100 at row 6 is outside the classes [0, 37)");
    CHECK(dlogits == std::vector<float>(rows * V, 5.0f));
    CHECK(message_of([&] {
              (void)host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), 0, V);
          }) == "cross_entropy: rows = 0 has nothing to average; pass rows >= 1");
    CHECK(message_of([&] {
              (void)host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), rows, 0);
          }) == "cross_entropy: V = 0 has no classes; pass V >= 1");
}

TEST_CASE("cross_entropy over a large vocabulary agrees with double precision", "[kernels][cross_entropy]") {
    // A GPT-2-sized row exercises the lane sums over many blocks and a tail.
    const std::int64_t big_v = 50257;
    std::vector<float> logits(2 * big_v);
    loom::RngStream{23, 2}.fill_normal(logits, 0, 0.0f, 3.0f);
    const std::vector<std::int32_t> targets{50256, 17};
    std::vector<float> lse(2);
    const float loss = host::cross_entropy_forward(logits.data(), targets.data(), lse.data(), 2, big_v);
    const std::vector<double> wide(logits.begin(), logits.end());
    double expected = 0.0;
    for (std::int64_t r = 0; r < 2; ++r) {
        const double* row = &wide[r * big_v];
        const double top = *std::max_element(row, row + big_v);
        double sum = 0.0;
        for (std::int64_t j = 0; j < big_v; ++j) sum += std::exp(row[j] - top);
        const double row_lse = top + std::log(sum);
        CHECK(lse[r] == Approx(row_lse).epsilon(1e-6));
        expected += (row_lse - row[targets[r]]) / 2;
    }
    CHECK(loss == Approx(expected).epsilon(1e-6));
}

}  // namespace LOOM_TEST_FILE
