// cluster_on_one_machine: eight ranks as threads of this process, arranged on a
// dp x tp mesh, talking over links shaped like two 4-GPU nodes joined by a
// slow network. Prints where each rank sits and how long the same all-reduce
// takes inside a node (tp group) and across nodes (dp group), next to what the
// link model predicts.
//
//   cluster_on_one_machine [--mib M] [--gbit G]
#include <loom/comm/mesh.hpp>
#include <loom/comm/shaped.hpp>
#include <loom/comm/thread_world.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>
#include <vector>

using loom::Tensor;
using namespace loom::comm;

int main(int argc, char** argv) {
    double mib = 16, gbit = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (flag == "--mib") mib = std::atof(argv[i + 1]);
        else if (flag == "--gbit") gbit = std::atof(argv[i + 1]);
        else {
            std::fprintf(stderr, "cluster_on_one_machine: unknown flag %s; flags are --mib M, --gbit G\n", argv[i]);
            return 2;
        }
    }
    if (!(mib > 0 && mib <= 1024) || !(gbit > 0 && gbit <= 10000)) {
        std::fprintf(stderr, "cluster_on_one_machine: --mib %g --gbit %g is not valid; use --mib in (0, 1024] and --gbit in (0, 10000]\n", mib, gbit);
        return 2;
    }
    const int ranks = 8;
    // Two nodes of four ranks: NVLink-like inside (200 GB/s, 2 us), a slow
    // network between (G Gbit/s, 10 us).
    const Links links = Links::nodes(ranks, 4, Link::gbytes(200, 2e-6), Link::gbit(gbit, 10e-6));
    const auto count = static_cast<std::int64_t>(mib * (1 << 20) / sizeof(float));
    std::printf("%s\n", "8 rank threads, mesh dp=2 x tp=4, two nodes of 4 ranks");
    std::printf("%s\n\n", [&] { std::ostringstream s; s << links; return s.str(); }().c_str());

    std::vector<double> seconds(2);
    std::vector<std::pair<int, int>> coordinates(ranks);
    ThreadWorld(ranks).run([&](ThreadComm& comm) {
        Shaped<ThreadComm> shaped(std::move(comm), links);
        Mesh<Shaped<ThreadComm>> mesh(shaped, {{"dp", 2}, {"tp", 4}});
        coordinates[static_cast<std::size_t>(shaped.rank())] = {mesh.coordinate("dp"), mesh.coordinate("tp")};
        std::vector<float> grad(static_cast<std::size_t>(count), 1.0f);
        auto t = Tensor::of(grad.data(), {count});
        int slot = 0;
        for (const char* axis : {"tp", "dp"}) {
            auto& group = mesh.axis(axis);
            group.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            group.all_reduce(t, t, ReduceOp::sum);
            if (shaped.rank() == 0)
                seconds[static_cast<std::size_t>(slot)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            ++slot;
        }
    });
    for (int r = 0; r < ranks; ++r)
        std::printf("world rank %d: dp=%d tp=%d\n", r, coordinates[static_cast<std::size_t>(r)].first,
                    coordinates[static_cast<std::size_t>(r)].second);
    const std::vector<int> tp_group{0, 1, 2, 3}, dp_group{0, 4};
    const double bytes = static_cast<double>(count) * sizeof(float);
    std::printf("\nall_reduce of %.0f MiB   measured    link model\n", mib);
    std::printf("  tp group (in a node)   %7.2f ms   %7.2f ms\n", seconds[0] * 1e3,
                links.cost(OpKind::all_reduce, tp_group, bytes) * 1e3);
    std::printf("  dp group (two nodes)   %7.2f ms   %7.2f ms\n", seconds[1] * 1e3,
                links.cost(OpKind::all_reduce, dp_group, bytes) * 1e3);
    std::printf("(an operation ends at the model's time or when the real copy on this machine ends, if later)\n");
    return 0;
}
