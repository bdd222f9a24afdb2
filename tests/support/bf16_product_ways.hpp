// The ways this process can run MatmulPrecision::bf16 products on the host:
// rounding the operands into the f32 kernels while packing them (every CPU),
// and vdpbf16ps dot products (AVX512_BF16 with loom's AVX-512 kernels in
// use; the default on AMD's, kernels/host/gemm_dispatch.hpp). The first is
// the f32 GEMM of the rounded operands bit for bit; the second sums the same
// exact products in another order (pairs first), so it equals it up to f32
// reassociation. for_each_bf16_product_way(body) runs body(dot) once per way
// this CPU has, the process's setting switched, and restores the setting.
#pragma once

#include <loom/kernels/host/gemm.hpp>

namespace loom_test {

template <class Body>
void for_each_bf16_product_way(Body&& body) {
    namespace host = loom::kernels::host;
    auto& setting = host::gemm_detail::bf16_dot_setting();
    struct Restore {
        decltype(setting)& to;
        bool value;
        ~Restore() { to.store(value); }
    } restore{setting, setting.load()};
    for (const bool dot : {false, true}) {
        setting.store(dot);
        if (dot && !host::gemm_detail::bf16_dot_products(host::host_gemm())) continue;
        body(dot);
    }
}

}  // namespace loom_test
