// Uses the installed headers: a reflected user layer, a Buffer, the RNG.
#include <cstdio>
#include <loom/core/buffer.hpp>
#include <loom/core/reflect.hpp>
#include <loom/core/rng.hpp>
#include <loom/version.hpp>
#ifdef CONSUMER_WITH_MPI
#include <loom/core/check_mpi.hpp>
#endif

struct TwoLayer {
    loom::Param w1{loom::Shape{8, 4}, loom::Init::normal(0.02f)};
    loom::Param w2{loom::Shape{4, 2}, loom::Init::normal(0.02f)};
};

int main() {
    TwoLayer layer;
    loom::Buffer<loom::Host> arena(loom::DType::f32, loom::Shape{loom::reflect::parameter_numel(layer)});
    std::printf("loom %d.%d.%d consumer: %zu params, %lld elements, %zu bytes\n", loom::version.major,
                loom::version.minor, loom::version.patch, loom::reflect::param_count(layer),
                static_cast<long long>(arena.numel()), arena.nbytes());
    return loom::reflect::param_count(layer) == 2 && arena.numel() == 40 ? 0 : 1;
}
