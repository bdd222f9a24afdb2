// Must not compile: a polymorphic type is not aggregate-initialisable by PFR.
#include <loom/core/reflect.hpp>

struct Layer {
    virtual ~Layer() = default;
    loom::Param weight;
};

void use() {
    Layer layer{};
    loom::reflect::visit_params(layer, [](loom::Param&, std::string_view) {});
}
