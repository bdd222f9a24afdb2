// Must not compile: PFR cannot see fields inherited from a base class.
#include <loom/core/reflect.hpp>

struct Base {
    loom::Param weight;
};
struct Derived : Base {
    loom::Param bias;
};

void use() {
    Derived layer{};
    loom::reflect::visit_params(layer, [](loom::Param&, std::string_view) {});
}
