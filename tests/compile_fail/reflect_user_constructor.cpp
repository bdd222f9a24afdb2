// Must not compile: a user-declared constructor makes the type non-aggregate.
#include <loom/core/reflect.hpp>

struct Layer {
    explicit Layer(int width) : weight{loom::Shape{width}} {}
    loom::Param weight;
};

void use() {
    Layer layer(4);
    loom::reflect::visit_params(layer, [](loom::Param&, std::string_view) {});
}
