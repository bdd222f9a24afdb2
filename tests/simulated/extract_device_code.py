#!/usr/bin/env python3
"""Pulls device code out of loom's CUDA headers for the host simulation
(tests/simulated/warp_simulator.hpp), into one file of C++:
  - launch.cuh and group_reduce.cuh: the block size, grid-stride indices and
    the group reductions every row kernel uses;
  - attention_tiles.cuh and attention.cuh: the f32 attention kernels and the
    tile machinery the mma kernels share with them, the tiles' dynamic shared
    memory the simulated block's buffer;
  - attention_blocks.cuh: ring attention's block kernels;
  - dev/kernel_lab/attention_wmma.cuh (the repository's, four folders above
    CUDA_KERNELS_DIR): the kernel lab's wmma attention kernels, not shipped
    but kept as the mma kernels' reference (the simulator has its own
    nvcuda::wmma), up to their launchers;
  - mma_fragments.cuh: its namespace without the four inline-asm wrappers
    (shared_address, ldmatrix_x4, ldmatrix_x4_trans, mma), which the
    simulator defines from the same PTX layouts;
  - attention_mma.cuh: the attention_mma_detail namespace up to its
    launchers, with the kernels' dynamic shared memory as the simulated
    block's buffer;
  - elementwise.cuh, gelu.cuh, layernorm.cuh, layernorm_grid.cuh,
    cross_entropy.cuh, quantize.cuh, low_rank.cuh, gemm_bf16_inputs.cuh:
    their detail namespaces' kernels (and the host-side launch shapes
    written there);
  - embedding.cuh and top_k.cuh: their detail namespaces' kernels and CUB
    predicates, up to the scratch classes that call the runtime (the tests
    stand in for CUB's sort, scan and compaction on the host);
  - gemm.cuh: the kernel that scales C by beta where cuBLASLt is not
    called (K = 0 or alpha = 0);
  - ../../optim/adamw.cuh: the AdamW kernel;
  - ../../comm/device_reduce.cuh and device_thread_reduce.cuh: the
    collectives' reduction kernels (widening, narrowing and dividing around
    NCCL's; the single-GPU world's rank-order reduction) and their launch
    shapes, up to their launchers.

    extract_device_code.py CUDA_KERNELS_DIR OUTPUT

Each static __shared__ array's declaration gets a call after it that fills
the array with NaN bytes once a block (warp_simulator.hpp's
fill_static_shared), as a GPU's shared memory holds garbage.

Fails, naming what it missed, if a header no longer has the shape this
expects: then the simulation would test something other than the kernels.
What it takes must be device code and host helpers only: a launch (<<<),
inline asm or a CUDA runtime call fails the extraction.
"""
import os
import re
import sys

WRAPPERS = ("shared_address", "ldmatrix_x4", "ldmatrix_x4_trans", "mma")
MMA_SHARED = "extern __shared__ __align__(128) unsigned char attention_mma_shared[];"
TILES_SHARED = "extern __shared__ float4 attention_shared[];"
WMMA_SHARED = "extern __shared__ __align__(128) unsigned char attention_bf16_shared[];"


class Header:
    def __init__(self, directory, name):
        self.name = name
        self.text = open(os.path.join(directory, name), encoding="utf-8").read()

    def fail(self, what):
        sys.exit(f"extract_device_code: {self.name} has no {what}; update tests/simulated")

    def between(self, begin, end, inclusive=False):
        """From `begin` up to (or through) the first `end` after it."""
        start = self.text.find(begin)
        if start < 0:
            self.fail(repr(begin))
        stop = self.text.find(end, start)
        if stop < 0:
            self.fail(f"{end!r} after {begin!r}")
        return self.text[start:stop + (len(end) if inclusive else 0)]


def without_wrappers(header, body):
    for name in WRAPPERS:
        m = re.search(r"__device__ inline \w+ " + name + r"\(", body)
        if m is None:
            header.fail(f"function {name}")
        close = body.find("\n}\n", m.start())  # the function's closing brace, at column 0
        if close < 0:
            header.fail(f"closing brace for {name} at column 0")
        cut = body[m.start():close + 3]
        if cut.count("__device__") != 1:  # the cut would take the functions after it too
            header.fail(f"{name} as one function whose closing brace is at column 0")
        body = body[:m.start()] + body[close + 3:]
    return body


def with_shared_memory(header, body, declaration, replacement):
    """`body` with the kernels' dynamic shared memory, `declaration`, made the
    simulated block's buffer by `replacement`."""
    if declaration not in body:
        header.fail("shared memory declared as " + repr(declaration))
    return body.replace(declaration, replacement)


# The one architecture test the kernels may hold: a trap below compute
# capability 8.0 whose #else is the kernel. Any other would make the
# simulator compile a branch the GPU does not run (or the reverse).
ARCH_GUARD = "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800"


# A static __shared__ array's declaration, in the kernels' forms:
# `__shared__ T name[dims]...;`.
STATIC_SHARED = re.compile(r"__shared__\s+([A-Za-z_][\w:<> ]*?)\s+(\w+)((?:\s*\[[^\]]+\])+)\s*;")


def with_static_shared_filled(header, code):
    """`code` with a call after each static __shared__ declaration that
    fills the array with NaN bytes for each block (warp_simulator.hpp's
    fill_static_shared): a GPU's shared memory holds garbage, and a
    function-local static would hold the previous block's values."""
    code, count = STATIC_SHARED.subn(r"__shared__ \1 \2\3; loom_sim::fill_static_shared(\2, sizeof \2);", code)
    if code.count("__shared__") != count:
        sys.exit(f"extract_device_code: {header.name} declares __shared__ memory in a form this does not know; "
                 "teach with_static_shared_filled")
    return code


def checked(header, code):
    forbidden = (("<<<", "a kernel launch"), (r"\basm\b", "inline asm"), (r"\bcuda[A-Z]", "a CUDA runtime call"))
    uncommented = re.sub(r"//[^\n]*", "", code)  # a comment may name the runtime ("cudaMalloc's alignment")
    for pattern, why in forbidden:
        if re.search(pattern, uncommented):
            sys.exit(f"extract_device_code: what it takes of {header.name} has {why}; "
                     "move it out of the extracted region or teach the simulator")
    if code.replace(ARCH_GUARD, "").count("__CUDA_ARCH__"):
        sys.exit(f"extract_device_code: what it takes of {header.name} tests __CUDA_ARCH__ other than as "
                 f"{ARCH_GUARD!r}; the simulator would compile another branch than the GPU runs")
    return with_static_shared_filled(header, code)


def extract(directory):
    include = os.path.dirname(os.path.dirname(os.path.abspath(directory)))  # include/loom
    lab = os.path.join(os.path.dirname(os.path.dirname(include)), "dev", "kernel_lab")
    adamw = Header(os.path.join(include, "optim"), "adamw.cuh")
    reduce = Header(os.path.join(include, "comm"), "device_reduce.cuh")
    thread_reduce = Header(os.path.join(include, "comm"), "device_thread_reduce.cuh")
    h = {name: Header(directory, name) for name in (
        "launch.cuh", "group_reduce.cuh", "attention_tiles.cuh", "attention.cuh", "attention_blocks.cuh",
        "mma_fragments.cuh", "attention_mma.cuh",
        "elementwise.cuh", "gelu.cuh", "layernorm.cuh", "layernorm_grid.cuh", "cross_entropy.cuh",
        "quantize.cuh", "low_rank.cuh", "gemm_bf16_inputs.cuh", "embedding.cuh", "top_k.cuh", "gemm.cuh")}
    parts = []

    def add(header, code):
        parts.append(f"// ---- from {header.name}\n" + checked(header, code))

    add(h["launch.cuh"], h["launch.cuh"].between("inline constexpr int threads_per_block",
                                                "// Set-up a launcher needs"))
    add(h["group_reduce.cuh"], h["group_reduce.cuh"].between("// Rows of up to this many values",
                                                            "}  // namespace loom::kernels::cuda"))
    tiles = h["attention_tiles.cuh"]
    body = tiles.between("// Rows of a query tile and of a key tile",
                         "}  // namespace loom::kernels::cuda::attention_detail")
    body = with_shared_memory(tiles, body, TILES_SHARED,
                              "auto* attention_shared = reinterpret_cast<float4*>(loom_sim::block_shared());")
    add(tiles, "namespace attention_detail {\n" + body + "}  // namespace attention_detail\n")
    add(h["attention.cuh"], h["attention.cuh"].between("namespace attention_detail {",
                                                      "template <class Kernel>\nvoid allow_shared")
        + "}  // namespace attention_detail\n")
    add(h["attention_blocks.cuh"], h["attention_blocks.cuh"].between("using host::BlockMask;", "inline void check_head")
        + "}  // namespace block_detail\n")
    wmma = Header(lab, "attention_wmma.cuh")
    body = wmma.between("namespace attention_bf16_detail {", "[[nodiscard]] inline Items items_of")
    body = with_shared_memory(wmma, body, WMMA_SHARED,
                              "unsigned char* attention_bf16_shared = loom_sim::block_shared();")
    add(wmma, body + "}  // namespace attention_bf16_detail\n")
    fragments = h["mma_fragments.cuh"]
    opening = "namespace loom::kernels::cuda::mma_fragments {"
    body = without_wrappers(fragments, fragments.between(opening, "}  // namespace loom::kernels::cuda::mma_fragments"))
    add(fragments, body.replace(opening, "namespace mma_fragments {", 1) + "}  // namespace mma_fragments\n")
    mma = h["attention_mma.cuh"]
    body = mma.between("namespace attention_mma_detail {", "// Four floats a load when")
    body = with_shared_memory(mma, body, MMA_SHARED, "unsigned char* attention_mma_shared = loom_sim::block_shared();")
    add(mma, body + "}  // namespace attention_mma_detail\n")
    add(h["elementwise.cuh"], h["elementwise.cuh"].between("namespace detail {", "}  // namespace detail",
                                                          inclusive=True) + "\n")
    for name in ("gelu.cuh", "layernorm_grid.cuh", "low_rank.cuh"):
        add(h[name], h[name].between("namespace detail {", "}  // namespace detail", inclusive=True) + "\n")
    add(h["layernorm.cuh"], h["layernorm.cuh"].between("namespace detail {", "}  // namespace detail",
                                                      inclusive=True) + "\n")
    add(h["cross_entropy.cuh"], h["cross_entropy.cuh"].between("namespace detail {", "// Stream-ordered device memory")
        + "}  // namespace detail\n")
    add(h["quantize.cuh"], h["quantize.cuh"].between("// The wire format is shared with the host",
                                                    "}  // namespace detail", inclusive=True) + "\n")
    add(h["gemm_bf16_inputs.cuh"], h["gemm_bf16_inputs.cuh"].between("namespace detail {",
                                                                     "// Rounds the rows x cols matrix x")
        + "}  // namespace detail\n")
    add(h["embedding.cuh"], h["embedding.cuh"].between("namespace detail {",
                                                      "// Device memory for one call from the stream-ordered pool")
        + "}  // namespace detail\n")
    add(h["top_k.cuh"], h["top_k.cuh"].between("namespace detail {", "// Device memory for one unpack check")
        + "}  // namespace detail\n")
    add(h["gemm.cuh"], "namespace detail {\n" + h["gemm.cuh"].between(
        "[[nodiscard]] __host__ __device__ inline float gemm_load(float x)", "// RAII for the cuBLASLt descriptors")
        + "}  // namespace detail\n")
    kernels = "namespace loom::kernels::cuda {\n" + "\n".join(parts) + "}  // namespace loom::kernels::cuda\n"
    optim = (f"// ---- from {adamw.name}\nnamespace loom::optim::cuda {{\n"
             + checked(adamw, adamw.between("namespace detail {", "}  // namespace detail", inclusive=True))
             + "\n}  // namespace loom::optim::cuda\n")
    comm = (f"// ---- from {reduce.name} and {thread_reduce.name}\nnamespace loom::comm::detail {{\n"
            + checked(reduce, reduce.between("// A float as an int32 whose signed order", "template <class Launch>"))
            + checked(thread_reduce, thread_reduce.between("// The most members one device group may have",
                                                           "inline void launch_rank_order_reduce"))
            + "}  // namespace loom::comm::detail\n")
    return kernels + optim + comm


def main(directory, output):
    code = extract(directory)
    with open(output, "w", encoding="utf-8") as out:
        out.write(f"// Generated from the headers in {directory} by tests/simulated/extract_device_code.py.\n")
        out.write(code)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: extract_device_code.py CUDA_KERNELS_DIR OUTPUT")
    main(sys.argv[1], sys.argv[2])
