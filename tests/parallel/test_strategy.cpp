// Policies and Strategy: how they print, what a strategy asks for (data
// parallelism, ZeRO stage, bucket size), and byte counts as people read them.
// What must not compile is in tests/compile_fail/strategy_*.cpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#include <loom/exec/executor.hpp>
#include <loom/parallel/strategy.hpp>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

template <class S>
std::string printed() {
    std::ostringstream out;
    out << S{};
    return out.str();
}

}  // namespace

TEST_CASE("readable_bytes writes byte counts as people read them", "[parallel][strategy]") {
    // Bytes as they are; KiB and GiB with one decimal; MiB with one, except whole MiB (bucket sizes).
    CHECK(loom::readable_bytes(0) == "0 B");
    CHECK(loom::readable_bytes(100) == "100 B");
    CHECK(loom::readable_bytes(1023) == "1023 B");
    CHECK(loom::readable_bytes(1024) == "1.0 KiB");
    CHECK(loom::readable_bytes(1536) == "1.5 KiB");
    CHECK(loom::readable_bytes(512 << 10) == "512.0 KiB");
    CHECK(loom::readable_bytes((1 << 20) - 1024) == "1023.0 KiB");
    CHECK(loom::readable_bytes(1 << 20) == "1 MiB");
    CHECK(loom::readable_bytes(2 << 20) == "2 MiB");
    CHECK(loom::readable_bytes(1536 << 10) == "1.5 MiB");
    CHECK(loom::readable_bytes((2 << 20) + (1 << 19)) == "2.5 MiB");
    CHECK(loom::readable_bytes((2 << 20) + 1) == "2.0 MiB");  // not whole: the decimal stays
    CHECK(loom::readable_bytes(std::int64_t{1} << 30) == "1.0 GiB");
    CHECK(loom::readable_bytes(std::int64_t{64} << 30) == "64.0 GiB");
    CHECK(loom::readable_bytes((std::int64_t{1} << 30) + (std::int64_t{1} << 29)) == "1.5 GiB");
}

TEST_CASE("policies describe themselves in their own words", "[parallel][strategy]") {
    CHECK(loom::describe<loom::DataParallel<>>() == "DataParallel<bucket 2 MiB>");
    CHECK(loom::describe<loom::DataParallel<loom::BucketBytes<512 << 10>>>() == "DataParallel<bucket 512.0 KiB>");
    CHECK(loom::describe<loom::DataParallel<loom::BucketBytes<1000>>>() == "DataParallel<bucket 1000 B>");
    CHECK(loom::describe<loom::DataParallel<loom::BucketBytes<std::int64_t{1} << 30>>>() ==
          "DataParallel<bucket 1.0 GiB>");
    CHECK(loom::describe<loom::ZeroShard<1>>() == "ZeroShard<1>");
    CHECK(loom::describe<loom::ZeroShard<2>>() == "ZeroShard<2>");
    CHECK(loom::describe<loom::ZeroShard<3>>() == "ZeroShard<3>");

    CHECK(loom::name(loom::PolicyKind::data_parallel) == "DataParallel");
    CHECK(loom::name(loom::PolicyKind::zero_shard) == "ZeroShard");
    CHECK(loom::name(loom::PolicyKind::pipeline) == "Pipeline");
    CHECK(loom::name(loom::PolicyKind::tensor_parallel) == "TensorParallel");
    CHECK(loom::name(loom::PolicyKind::sequence_parallel) == "SequenceParallel");
    CHECK(loom::name(loom::PolicyKind::compression) == "GradCompress");
    CHECK(loom::name(loom::PolicyKind::optex) == "OptEx");

    STATIC_REQUIRE(loom::Policy<loom::DataParallel<>>);
    STATIC_REQUIRE(loom::Policy<loom::ZeroShard<2>>);
    STATIC_REQUIRE_FALSE(loom::Policy<int>);
    STATIC_REQUIRE_FALSE(loom::Policy<loom::BucketBytes<4>>);
    STATIC_REQUIRE_FALSE(loom::Policy<loom::Strategy<loom::DataParallel<>>>);  // a strategy is not a policy
    CHECK(loom::DataParallel<>::kind == loom::PolicyKind::data_parallel);
    CHECK(loom::ZeroShard<3>::kind == loom::PolicyKind::zero_shard);
}

TEST_CASE("a Strategy prints its policies in the order given", "[parallel][strategy]") {
    using namespace loom;
    CHECK(printed<Strategy<DataParallel<>, ZeroShard<2>>>() == "Strategy<DataParallel<bucket 2 MiB>, ZeroShard<2>>");
    CHECK(printed<Strategy<ZeroShard<2>, DataParallel<>>>() == "Strategy<ZeroShard<2>, DataParallel<bucket 2 MiB>>");
    CHECK(printed<Strategy<DataParallel<>>>() == "Strategy<DataParallel<bucket 2 MiB>>");
    CHECK(printed<Strategy<DataParallel<BucketBytes<4 << 20>>>>() == "Strategy<DataParallel<bucket 4 MiB>>");
    CHECK(printed<Strategy<DataParallel<BucketBytes<16 << 10>>, ZeroShard<3>>>() ==
          "Strategy<DataParallel<bucket 16.0 KiB>, ZeroShard<3>>");
    // ZeroShard alone implies DataParallel, but prints only what was written.
    CHECK(printed<Strategy<ZeroShard<1>>>() == "Strategy<ZeroShard<1>>");
    // (Strategy<> is not printed here: its describe() does not compile under
    // -Werror, "variable 'separator' set but not used", an empty fold.)

    // Strategy::describe writes the same words as operator<<.
    std::ostringstream out;
    Strategy<DataParallel<BucketBytes<100>>, ZeroShard<1>>::describe(out);
    CHECK(out.str() == "Strategy<DataParallel<bucket 100 B>, ZeroShard<1>>");
}

TEST_CASE("a Strategy's data parallelism, ZeRO stage and bucket size", "[parallel][strategy]") {
    using namespace loom;
    constexpr std::int64_t two_mib = std::int64_t{2} << 20;
    CHECK(default_bucket_bytes == two_mib);

    auto check = [](auto strategy, bool data_parallel, int zero_stage, std::int64_t bucket_bytes) {
        using S = decltype(strategy);
        INFO("data parallel " << data_parallel << ", stage " << zero_stage << ", bucket " << bucket_bytes);
        CHECK(S::data_parallel == data_parallel);
        CHECK(S::zero_stage == zero_stage);
        CHECK(S::bucket_bytes == bucket_bytes);
        // The executor reads the same values off the type.
        const auto plan = exec::ExecutionPlan::of<S>();
        CHECK(plan.zero_stage == zero_stage);
        CHECK(plan.bucket_bytes == bucket_bytes);
    };
    check(Strategy<>{}, false, 0, two_mib);
    check(Strategy<DataParallel<>>{}, true, 0, two_mib);
    check(Strategy<DataParallel<BucketBytes<4096>>>{}, true, 0, 4096);
    // ZeroShard alone implies DataParallel with the default bucket.
    check(Strategy<ZeroShard<1>>{}, true, 1, two_mib);
    check(Strategy<ZeroShard<2>>{}, true, 2, two_mib);
    check(Strategy<ZeroShard<3>>{}, true, 3, two_mib);
    check(Strategy<DataParallel<>, ZeroShard<2>>{}, true, 2, two_mib);
    // Order does not matter; the bucket option is kept with ZeRO.
    check(Strategy<ZeroShard<3>, DataParallel<BucketBytes<1 << 20>>>{}, true, 3, std::int64_t{1} << 20);
    check(Strategy<DataParallel<BucketBytes<1>>, ZeroShard<1>>{}, true, 1, 1);

    STATIC_REQUIRE(std::is_same_v<Strategy<ZeroShard<2>>::data_parallel_policy, DataParallel<>>);
    STATIC_REQUIRE(std::is_same_v<Strategy<ZeroShard<2>>::zero_policy, ZeroShard<2>>);
    STATIC_REQUIRE(std::is_void_v<Strategy<DataParallel<>>::zero_policy>);
    STATIC_REQUIRE(std::is_same_v<Strategy<ZeroShard<1>, DataParallel<BucketBytes<8>>>::data_parallel_policy,
                                  DataParallel<BucketBytes<8>>>);
    CHECK(DataParallel<BucketBytes<123>>::bucket_bytes == 123);
    CHECK(DataParallel<>::bucket_bytes == two_mib);
    CHECK(ZeroShard<2>::stage == 2);
}

}  // namespace LOOM_TEST_FILE
