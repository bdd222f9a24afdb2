#!/usr/bin/env python3
"""Pulls the device code of kernels/cuda/attention_mma.cuh out for the host
simulation (tests/simulated/warp_simulator.hpp): the attention_mma_detail
namespace up to its launchers, without the four inline-asm wrappers (the
simulator defines them) and with the kernels' dynamic shared memory as the
simulated block's buffer.

    extract_device_code.py HEADER OUTPUT

Fails, naming what it missed, if the header no longer has the shape this
expects: then the simulation would test something other than the kernels.
"""
import re
import sys


def main(header, output):
    src = open(header, encoding="utf-8").read()

    def need(text, what):
        if text not in src:
            sys.exit(f"extract_device_code: {header} has no {what} ({text!r}); update tests/simulated")

    begin, end = "namespace attention_mma_detail {", "// Four floats a load when"
    need(begin, "detail namespace")
    need(end, "launcher section")
    body = src[src.index(begin):src.index(end)]
    for name in (r"__device__ inline unsigned shared_address\(", r"__device__ inline void ldmatrix_x4\(",
                 r"__device__ inline void ldmatrix_x4_trans\(", r"__device__ inline void mma\("):
        m = re.search(name, body)
        if m is None:
            sys.exit(f"extract_device_code: {header} has no function matching {name}; update tests/simulated")
        close = body.index("\n}\n", m.start()) + 3  # the function's closing brace, at column 0
        body = body[:m.start()] + body[close:]
    shared = "extern __shared__ __align__(128) unsigned char attention_mma_shared[];"
    if shared not in body:
        sys.exit(f"extract_device_code: {header} declares its shared memory differently; update tests/simulated")
    body = body.replace(shared, "unsigned char* attention_mma_shared = loom_sim::block_shared();")
    with open(output, "w", encoding="utf-8") as out:
        out.write(f"// Generated from {header} by tests/simulated/extract_device_code.py: do not edit.\n")
        out.write("namespace loom::kernels::cuda {\n" + body + "}  // namespace attention_mma_detail\n"
                  "}  // namespace loom::kernels::cuda\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: extract_device_code.py HEADER OUTPUT")
    main(sys.argv[1], sys.argv[2])
