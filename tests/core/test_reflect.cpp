// Reflection: a model's Params and nested layers, found in field order from
// plain aggregates, sequences, and the loom_fields customisation point.
#include <catch2/catch.hpp>

#include <loom/core/reflect.hpp>

#include <array>
#include <map>
#include <string>
#include <tuple>
#include <vector>

using loom::Init;
using loom::Param;
using loom::Shape;

namespace {

struct Dense {
    Param weight{Shape{4, 3}, Init::normal(0.02f)};
    Param bias{Shape{4}};
};

struct Norm {
    float eps = 1e-5f;
    Param gain{Shape{4}, Init::ones()};
    Param shift{Shape{4}};
};

struct Block {
    Norm norm;
    Dense up;
    int heads = 2;
    std::string name = "block";
    Dense down;
};

struct Model {
    std::vector<Block> blocks;
    std::array<Dense, 2> heads;
    std::vector<float> schedule{1.0f, 0.5f};
};

// A layer with a constructor opts in through a member loom_fields.
class Gated {
public:
    explicit Gated(std::int64_t width) : gate_{Shape{width}}, value_{Shape{width, width}} {}
    auto loom_fields() { return std::tie(value_, gate_); }  // order chosen here: value first

private:
    Param gate_;
    Param value_;
};

// ...or through a free function found by argument-dependent lookup.
struct Legacy {
    Legacy() : table{Shape{10, 2}} {}
    Param table;
};
auto loom_fields(Legacy& l) { return std::tie(l.table); }

struct Lookup {
    std::map<int, int> cache;  // not a layer: marked as configuration below
    Param embedding{Shape{5, 4}};
};

struct Mixed {
    Gated gated{3};
    Legacy legacy;
    Lookup lookup;
};

std::vector<std::string> param_paths(auto& model) {
    std::vector<std::string> paths;
    loom::reflect::visit_params(model, [&](const Param&, std::string_view path) { paths.emplace_back(path); });
    return paths;
}

}  // namespace

template <>
inline constexpr bool loom::is_config_field<std::map<int, int>> = true;

static_assert(loom::reflect::pfr_reflectable<Block>);
static_assert(!loom::reflect::pfr_reflectable<Gated>);
static_assert(loom::reflect::has_custom_fields<Gated> && loom::reflect::has_custom_fields<Legacy>);

TEST_CASE("reflection finds every Param of nested aggregates in field order", "[reflect]") {
    Block block;
    std::vector<std::string> shapes;
    loom::reflect::visit_params(block, [&](Param& p, std::string_view path) {
        shapes.push_back(std::string(path) + "=" + p.shape.str());
    });
    CHECK(shapes == std::vector<std::string>{"0.1=[4]", "0.2=[4]", "1.0=[4, 3]", "1.1=[4]", "4.0=[4, 3]",
                                             "4.1=[4]"});
    CHECK(loom::reflect::param_count(block) == 6);
    CHECK(loom::reflect::parameter_numel(block) == 2 * 4 + 2 * (12 + 4));
}

TEST_CASE("reflection walks vectors and arrays of layers and skips configuration", "[reflect]") {
    Model model{std::vector<Block>(3), {}, {}};
    const auto paths = param_paths(model);
    REQUIRE(paths.size() == 3 * 6 + 2 * 2);
    CHECK(paths.front() == "0.0.0.1");
    CHECK(paths[6] == "0.1.0.1");
    CHECK(paths[17] == "0.2.4.1");
    CHECK(paths[18] == "1.0.0");
    CHECK(paths.back() == "1.1.1");
    // visiting mutably lets a caller bind parameters
    loom::reflect::visit_params(model, [](Param& p, std::string_view) { p.dtype = loom::DType::bf16; });
    CHECK(model.blocks[2].down.bias.dtype == loom::DType::bf16);
}

TEST_CASE("reflection visits layers pre-order, the model first", "[reflect]") {
    Model model{std::vector<Block>(2), {}, {}};
    std::vector<std::string> layers;
    loom::reflect::visit_layers(model, [&](auto&, std::string_view path) { layers.emplace_back(path); });
    // model, then per block: the block, its norm, up and down; then the 2 heads
    CHECK(layers == std::vector<std::string>{"", "0.0", "0.0.0", "0.0.1", "0.0.4", "0.1", "0.1.0", "0.1.1",
                                             "0.1.4", "1.0", "1.1"});
}

TEST_CASE("loom_fields customises reflection for types PFR cannot see", "[reflect]") {
    Mixed mixed;
    std::vector<std::string> found;
    loom::reflect::visit_params(mixed, [&](const Param& p, std::string_view path) {
        found.push_back(std::string(path) + "=" + p.shape.str());
    });
    CHECK(found == std::vector<std::string>{"0.0=[3, 3]", "0.1=[3]", "1.0=[10, 2]", "2.1=[5, 4]"});
}

TEST_CASE("reflection over a const model yields const Params", "[reflect]") {
    const Block block;
    int count = 0;
    loom::reflect::visit_params(block, [&](auto& p, std::string_view) {
        static_assert(std::is_const_v<std::remove_reference_t<decltype(p)>>);
        ++count;
    });
    CHECK(count == 6);
}

TEST_CASE("for_each_field passes every field with its index", "[reflect]") {
    Norm norm;
    std::vector<std::size_t> indices;
    loom::reflect::for_each_field(norm, [&](auto&, std::size_t i) { indices.push_back(i); });
    CHECK(indices == std::vector<std::size_t>{0, 1, 2});
}
