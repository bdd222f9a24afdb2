#!/usr/bin/env python3
"""Generation beside current PyTorch, in the same run: loom's KV-cached decode against the same
GPT written in PyTorch with a KV cache, as a user writes it today.

GPT config A (4 layers, width 256, 4 heads, sequence 128, vocabulary 256), random weights,
batch 1, one thread each: a 16-token prompt, then 100 new tokens drawn at temperature 1.
PyTorch's model is loom's architecture (nn.Linear, nn.LayerNorm, GELU (tanh), learned
positions, an untied head without bias); its cache is preallocated per layer ([1, H, T, D]
keys and values written in place), attention is F.scaled_dot_product_attention (causal over
the prompt, the cached prefix for each new token), under torch.inference_mode(). Eager only:
torch.compile would recompile for every new cache length unless told the shapes are dynamic.

The repetitions interleave: loom (`bench_generate --reps 1`, its paged-cache row) and PyTorch
in turn, so the machine's drift falls on both; the ratio is the median of the per-repetition
ratios. Run it with the private venv's interpreter (scripts/torch_venv.sh):

    ~/.cache/loom/torch-venv/bin/python bench/generate_torch.py [--build build/release] [--reps 5]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS, WIDTH, HEADS, SEQ, VOCAB = 4, 256, 4, 128, 256
PROMPT, NEW = 16, 100


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x, keys, values, at):
        t = x.shape[1]
        q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=2)
        heads = lambda z: z.view(1, t, HEADS, WIDTH // HEADS).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        keys[:, :, at:at + t] = k
        values[:, :, at:at + t] = v
        a = F.scaled_dot_product_attention(q, keys[:, :, :at + t], values[:, :, :at + t], is_causal=t > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(1, t, WIDTH))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.token, self.position = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens, cache, at):
        t = tokens.shape[1]
        x = self.token(tokens) + self.position(torch.arange(at, at + t))
        for block, (keys, values) in zip(self.blocks, cache):
            x = block(x, keys, values, at)
        return self.head(self.ln_f(x[:, -1]))  # the last position's logits


def torch_generate(model, prompt, generator):
    """Seconds for the prompt and NEW tokens, sampled at temperature 1."""
    shape = (1, HEADS, SEQ, WIDTH // HEADS)
    cache = [(torch.empty(shape), torch.empty(shape)) for _ in range(LAYERS)]
    start = time.perf_counter()
    with torch.inference_mode():
        logits = model(prompt, cache, 0)
        at = prompt.shape[1]
        for _ in range(NEW):
            token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            if at == SEQ:
                break
            logits = model(token, cache, at)
            at += 1
    return time.perf_counter() - start


def read_bandwidth(nbytes, repeats):
    """Bytes per second one thread reads summing a float32 tensor of nbytes (the best of `repeats`)."""
    data = torch.ones(nbytes // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def loom_generate(binary):
    out = subprocess.run([binary, "--reps", "1", "--tokens", str(NEW)], capture_output=True, text=True,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    if out.returncode != 0:
        sys.exit(f"generate_torch: {binary} failed: {out.stderr.strip()}")
    row = re.search(r"KV cache, blocks of 16 \(infer::generate\) \| ([0-9.]+) ms", out.stdout)
    cpu = re.search(r"^CPU: (.*)$", out.stdout, re.M)
    if not row:
        sys.exit(f"generate_torch: no paged-cache row in {binary}'s output:\n{out.stdout}")
    return float(row.group(1)) * 1e-3, cpu.group(1) if cpu else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build/release")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    binary = os.path.join(args.build, "bench", "bench_generate")
    if not os.path.exists(binary):
        sys.exit(f"generate_torch: {binary} is missing; build the bench_generate target first")
    torch.set_num_threads(1)
    torch.manual_seed(5)
    model = Gpt().eval()
    prompt = torch.randint(0, VOCAB, (1, PROMPT))
    generator = torch.Generator().manual_seed(5)
    torch_generate(model, prompt, generator)  # warm-up
    loom_s, torch_s, ratios, cpu = [], [], [], "?"
    for rep in range(args.reps):
        order = ("loom", "torch") if rep % 2 == 0 else ("torch", "loom")
        measured = {}
        for side in order:
            if side == "loom":
                measured["loom"], cpu = loom_generate(binary)
            else:
                measured["torch"] = torch_generate(model, prompt, generator)
        loom_s.append(measured["loom"])
        torch_s.append(measured["torch"])
        ratios.append(measured["torch"] / measured["loom"])
        print(f"rep {rep + 1}: loom {NEW / measured['loom']:.0f} tokens/s, PyTorch {NEW / measured['torch']:.0f} "
              f"tokens/s", flush=True)
    print(f"\nCPU: {cpu}; PyTorch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), 1 thread each")
    print(f"GPT config A, batch 1, {NEW} new tokens after a {PROMPT}-token prompt, temperature 1, "
          f"median of {args.reps} interleaved repetitions\n")
    print("| path | tokens/s | range |\n| --- | ---: | --- |")
    for name, times in (("loom, paged KV cache (infer::generate)", loom_s), ("PyTorch eager, KV cache", torch_s)):
        print(f"| {name} | {NEW / statistics.median(times):.0f} | {NEW / max(times):.0f}–{NEW / min(times):.0f} |")
    print(f"\nloom / PyTorch: {statistics.median(ratios):.2f} (per-repetition ratios {min(ratios):.2f}–{max(ratios):.2f})")
    # The physical limit: a decode step reads every weight once (batch 1 is matrix-vector
    # products), so weight bytes x tokens/s against what one thread can read, from a working
    # set of the weights' size (caches) and from one far larger (memory).
    weights = sum(p.numel() for p in model.parameters()) * 4
    cached, dram = read_bandwidth(weights, 50), read_bandwidth(512 << 20, 5)
    for name, times in (("loom", loom_s), ("PyTorch", torch_s)):
        rate = weights * NEW / statistics.median(times)
        print(f"{name}: reads its {weights / 1e6:.1f} MB of weights at {rate / 1e9:.1f} GB/s per token stream: "
              f"{rate / cached:.0%} of one thread's read rate over a set that size ({cached / 1e9:.1f} GB/s), "
              f"{rate / dram:.0%} of its rate from memory ({dram / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
