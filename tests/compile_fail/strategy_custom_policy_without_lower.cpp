// A policy of kind custom that does not say how it lowers itself into the
// step program: Strategy refuses it with loom's sentence.
#include <loom/parallel/strategy.hpp>

#include <ostream>

struct Unlowered {
    static constexpr loom::PolicyKind kind = loom::PolicyKind::custom;
    static void describe(std::ostream& out) { out << "Unlowered"; }
};

[[maybe_unused]] loom::Strategy<loom::DataParallel<>, Unlowered> strategy;
