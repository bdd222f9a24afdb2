// MatrixModel: one unit of a [24, 40] weight and a [40] bias, whose layout is
// one bucket: what a test of a gradient exchange alone needs, without a
// model or an executor. Test code only.
#pragma once

#include <vector>

#include "loom/core/param.hpp"
#include "loom/nn/units.hpp"

namespace loom_test {

struct MatrixModel {
    loom::Param weight{.shape = loom::Shape{24, 40}};
    loom::Param bias{.shape = loom::Shape{40}};
    std::vector<loom::nn::Unit> units() {
        loom::nn::Unit unit;
        unit.name = "layer";
        unit.params = {&weight, &bias};
        unit.numel = weight.numel() + bias.numel();
        return {unit};
    }
};

}  // namespace loom_test
