// Must not compile: loom has no dtype for double.
#include <loom/core/dtype.hpp>

loom::DType use() { return loom::dtype_of<double>; }
