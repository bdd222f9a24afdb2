// Parameter initialisation is split-invariant: ranks (threads here) that each
// regenerate their own shard reproduce the serial initial values bit for bit.
#include <catch2/catch.hpp>

#include <loom/core/init.hpp>
#include <loom/core/reflect.hpp>

#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Init;
using loom::Param;
using loom::Shape;

namespace {

struct Mlp {
    Param up{Shape{64, 16}, Init::normal(0.02f)};
    Param up_bias{Shape{64}};
    Param down{Shape{16, 64}, Init::uniform(-0.1f, 0.1f)};
    Param gain{Shape{16}, Init::ones()};
};

struct Net {
    std::vector<Mlp> layers;
};

// Serial reference: every Param initialised whole, concatenated in visit order.
std::vector<float> serial_init(Net& net, std::uint64_t seed) {
    std::vector<float> all;
    loom::reflect::visit_params(net, [&](const Param& p, std::string_view path) {
        std::vector<float> values(static_cast<std::size_t>(p.numel()));
        loom::initialize(p, path, seed, loom::Tensor::of(values.data(), p.shape));
        all.insert(all.end(), values.begin(), values.end());
    });
    return all;
}

}  // namespace

TEST_CASE("sharded initialisation on N threads equals the serial initialisation", "[init][rng]") {
    Net net{std::vector<Mlp>(3)};
    const std::uint64_t seed = 1234;
    const std::vector<float> serial = serial_init(net, seed);
    REQUIRE(serial.size() == static_cast<std::size_t>(loom::reflect::parameter_numel(net)));

    for (int ranks : {1, 2, 3, 5, 7}) {
        // Each rank owns an uneven contiguous slice of the flattened arena,
        // cutting through Params, and regenerates only that slice.
        std::vector<float> gathered(serial.size(), -1.0f);
        std::vector<std::thread> threads;
        for (int r = 0; r < ranks; ++r) {
            threads.emplace_back([&, r] {
                const std::int64_t total = static_cast<std::int64_t>(serial.size());
                const std::int64_t begin = total * r / ranks, end = total * (r + 1) / ranks;
                const Net local{std::vector<Mlp>(3)};
                loom::initialize_range(local, seed,
                                       std::span<float>(gathered.data() + begin, static_cast<std::size_t>(end - begin)),
                                       begin);
            });
        }
        for (auto& t : threads) t.join();
        INFO("ranks = " << ranks);
        REQUIRE(std::memcmp(gathered.data(), serial.data(), serial.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("initialisers draw what they say", "[init]") {
    Net net{std::vector<Mlp>(1)};
    const std::vector<float> v = serial_init(net, 7);
    const auto up = std::span<const float>(v).subspan(0, 64 * 16);
    const auto bias = std::span<const float>(v).subspan(64 * 16, 64);
    const auto down = std::span<const float>(v).subspan(64 * 16 + 64, 16 * 64);
    const auto gain = std::span<const float>(v).subspan(64 * 16 + 64 + 16 * 64, 16);
    double sum = 0, sq = 0;
    for (float x : up) sum += x, sq += double(x) * x;
    const auto n_up = static_cast<double>(up.size());
    CHECK(std::abs(sum / n_up) < 0.003);
    CHECK(std::sqrt(sq / n_up) == Approx(0.02).epsilon(0.1));
    for (float x : bias) CHECK(x == 0.0f);
    for (float x : down) CHECK((x >= -0.1f && x <= 0.1f));
    for (float x : gain) CHECK(x == 1.0f);
    // a different seed gives different weights; zeros and ones do not depend on it
    const std::vector<float> w = serial_init(net, 8);
    CHECK(std::memcmp(w.data(), v.data(), up.size() * sizeof(float)) != 0);
}

TEST_CASE("initialisation errors name the Param and the bad range", "[init][errors]") {
    const Net net{std::vector<Mlp>(1)};
    std::vector<float> too_many(10);
    CHECK_THROWS_WITH(loom::initialize_range(net, 1, too_many, 2125),
                      Catch::StartsWith("range [2125, 2135) is outside the model's 2128 parameter elements"));
    const Param p{Shape{4, 4}, Init::normal(1.0f)};
    std::vector<float> out(8);
    CHECK_THROWS_WITH(loom::initialize_shard(p, "0.1", 1, out, 10),
                      Catch::StartsWith("shard [10, 18) is outside Param 0.1 of 16 elements"));
    CHECK_THROWS_WITH(loom::initialize(p, "0.1", 1, loom::Tensor::of(out.data(), Shape{8})),
                      Catch::StartsWith("Param 0.1 Param(f32, [4, 4], normal(mean=0, std=1)) cannot be initialised "
                                        "into Tensor(f32, [8], host) of 8 elements"));
}

}  // namespace LOOM_TEST_FILE
