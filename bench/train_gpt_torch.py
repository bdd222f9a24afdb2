#!/usr/bin/python3
"""PyTorch's training speed on loom's GPT, single-threaded: the peer for loom's train_gpt bench.

Usage:
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
        /usr/bin/python3 bench/train_gpt_torch.py --config A|B [--steps N] [--warmup W] [--sgemm]

Trains the GPT of tests/parity/torch_gpt.py (the model the parity test checks loom against:
pre-LN, nn.Linear, F.layer_norm, F.gelu(approximate="tanh"), attention as matmuls with a
causal mask, since PyTorch 1.13 has no F.scaled_dot_product_attention) with AdamW on random
tokens, in f32 on one CPU thread. A step is zero_grad(set_to_none=True), forward, mean
cross-entropy, backward and opt.step(); the batches are made before the clock starts. W
warm-up steps are run untimed (allocator and BLAS buffers settle), then N steps are timed
one by one and the median is reported, which a busy neighbour on a shared machine moves
less than the mean. One machine-readable line:

    torch config=A tokens_per_s=4412.3 step_ms=232.1 steps=20

tokens_per_s = batch * seq / median step time. --sgemm adds a line with the f32 GFLOP/s
torch.mm reaches on 1024x1024 matrices on the same single thread (median of 20), the
ceiling that the step time should be read against:

    torch sgemm n=1024 threads=1 gflops=61.2

Configs (vocab 256: bytes):
    A: layers 4, width 256, heads 4, seq 128, batch 8
    B: layers 2, width 64,  heads 4, seq 64,  batch 4
Use the system interpreter (/usr/bin/python3): Debian's python3-torch is installed for it.
"""

import os

# Before torch is imported: the BLAS and OpenMP pools size themselves when loaded.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))

try:
    import torch  # noqa: E402
    from torch_gpt import GptConfig, GptModel  # noqa: E402
except ImportError:
    print("SKIPPED: PyTorch not importable by this interpreter (use /usr/bin/python3 with python3-torch)")
    sys.exit(77)

CONFIGS = {
    "A": {"layers": 4, "width": 256, "heads": 4, "seq": 128, "batch": 8, "vocab": 256},
    "B": {"layers": 2, "width": 64, "heads": 4, "seq": 64, "batch": 4, "vocab": 256},
}


def median_seconds(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sgemm_gflops(n=1024, repeats=20):
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)  # warm-up: first call allocates BLAS buffers
    seconds = median_seconds(lambda: torch.mm(a, b, out=out), repeats)
    return 2.0 * n ** 3 / seconds / 1e9


def train_step_times(name, steps, warmup, seed):
    settings = CONFIGS[name]
    torch.manual_seed(seed)
    config = GptConfig(settings["layers"], settings["width"], settings["heads"], settings["seq"],
                       settings["vocab"])
    model = GptModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1)
    total = warmup + steps
    shape = (total, settings["batch"], settings["seq"])
    tokens = torch.randint(0, settings["vocab"], shape)
    targets = torch.randint(0, settings["vocab"], shape)

    times = []
    for step in range(total):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(tokens[step], targets[step])
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
    if not torch.isfinite(loss):
        raise RuntimeError(f"config {name}: loss became {loss.item()} during the bench")
    return settings["batch"] * settings["seq"], times


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sgemm", action="store_true", help="also print torch.mm 1024^3 GFLOP/s on one thread")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps {args.steps} --warmup {args.warmup}: valid are steps >= 1, warmup >= 0")

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)

    tokens_per_step, times = train_step_times(args.config, args.steps, args.warmup, args.seed)
    step_seconds = statistics.median(times)
    print(f"torch config={args.config} tokens_per_s={tokens_per_step / step_seconds:.1f} "
          f"step_ms={step_seconds * 1e3:.1f} steps={args.steps}")
    if args.sgemm:
        print(f"torch sgemm n=1024 threads={torch.get_num_threads()} gflops={sgemm_gflops():.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
