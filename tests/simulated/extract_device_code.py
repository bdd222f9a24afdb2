#!/usr/bin/env python3
"""Pulls device code out of loom's CUDA headers for the host simulation
(tests/simulated/warp_simulator.hpp):
  - kernels/cuda/mma_fragments.cuh: its namespace without the four inline-asm
    wrappers (shared_address, ldmatrix_x4, ldmatrix_x4_trans, mma), which
    the simulator defines from the same PTX layouts;
  - kernels/cuda/attention_mma.cuh: the attention_mma_detail namespace up to
    its launchers, with the kernels' dynamic shared memory as the simulated
    block's buffer.

    extract_device_code.py FRAGMENTS_HEADER ATTENTION_HEADER OUTPUT

Fails, naming what it missed, if a header no longer has the shape this
expects: then the simulation would test something other than the kernels.
"""
import re
import sys

WRAPPERS = ("shared_address", "ldmatrix_x4", "ldmatrix_x4_trans", "mma")


def fail(header, what):
    sys.exit(f"extract_device_code: {header} has no {what}; update tests/simulated")


def between(header, src, begin, end):
    if begin not in src:
        fail(header, repr(begin))
    if end not in src:
        fail(header, repr(end))
    return src[src.index(begin):src.index(end)]


def without_wrappers(header, body):
    for name in WRAPPERS:
        m = re.search(r"__device__ inline \w+ " + name + r"\(", body)
        if m is None:
            fail(header, f"function {name}")
        close = body.find("\n}\n", m.start())  # the function's closing brace, at column 0
        if close < 0:
            fail(header, f"closing brace for {name} at column 0")
        body = body[:m.start()] + body[close + 3:]
    return body


def main(fragments, attention, output):
    src = open(fragments, encoding="utf-8").read()
    begin = "namespace loom::kernels::cuda::mma_fragments {"
    frag = without_wrappers(fragments, between(fragments, src, begin, "}  // namespace loom::kernels::cuda::mma_fragments"))
    src = open(attention, encoding="utf-8").read()
    body = between(attention, src, "namespace attention_mma_detail {", "// Four floats a load when")
    if "asm" in body:
        sys.exit(f"extract_device_code: {attention} has inline asm of its own; move it to {fragments}")
    shared = "extern __shared__ __align__(128) unsigned char attention_mma_shared[];"
    if shared not in body:
        fail(attention, "shared memory declared as " + repr(shared))
    body = body.replace(shared, "unsigned char* attention_mma_shared = loom_sim::block_shared();")
    with open(output, "w", encoding="utf-8") as out:
        out.write(f"// Generated from {fragments} and {attention} by tests/simulated/extract_device_code.py.\n")
        out.write(frag + "}  // namespace loom::kernels::cuda::mma_fragments\n\n")
        out.write("namespace loom::kernels::cuda {\n" + body + "}  // namespace attention_mma_detail\n"
                  "}  // namespace loom::kernels::cuda\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: extract_device_code.py FRAGMENTS_HEADER ATTENTION_HEADER OUTPUT")
    main(sys.argv[1], sys.argv[2], sys.argv[3])
