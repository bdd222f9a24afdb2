#!/usr/bin/env python3
"""Current PyTorch training loom's GPT, written as a user would: the peer of bench/train_gpt.

Usage (the interpreter is the private venv's, made by scripts/torch_venv.sh, not Debian's
PyTorch 1.13, which stays for the parity test; `scripts/torch_venv.sh --print-python` says
where it is):

    PY=$(scripts/torch_venv.sh --print-python)
    $PY bench/train_gpt_torch.py --config A [--mode eager|compile|autocast|compile-autocast]
                                 [--threads 1] [--batch 8] [--steps 20] [--warmup 3]
    $PY bench/train_gpt_torch.py --info | --sgemm THREADS
    $PY bench/train_gpt_torch.py --serve      # what bench/train_gpt runs

The model is loom's GPT (gpt/model.hpp) as a PyTorch user writes it today: pre-LN blocks of
nn.LayerNorm, nn.Linear (qkv and projection with bias), F.scaled_dot_product_attention with
is_causal=True, GELU (tanh), learned token and position embeddings, a final LayerNorm and an
untied head without bias; mean cross-entropy over every position. The optimizer is
torch.optim.AdamW(foreach=True) (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1). A step
is zero_grad(set_to_none=True), forward with the loss, backward and optimizer.step(), on
batches made before the clock starts. Modes:
  eager             as written
  compile           torch.compile(model, dynamic=False): forward and backward through Inductor;
                    the optimizer step stays eager (foreach), as a user's script has it
  autocast          eager under torch.autocast("cpu", dtype=torch.bfloat16) for the forward
                    (and so its backward), f32 master weights: PyTorch's CPU bf16
  compile-autocast  both
W warm-up steps run untimed (compilation happens in the first), then N steps are timed one by
one; tokens/s = batch * seq / median step time, loom's definition. Shapes per config
(vocab 256):
    A: layers 4, width 256, heads 4, seq 128, batch 8
    B: layers 2, width 64,  heads 4, seq 64,  batch 4
--batch overrides the batch (bench/train_gpt's two-core row trains batch 16).

--serve reads one command a line on stdin and answers each with one line on stdout, so that
bench/train_gpt can interleave PyTorch's timings with loom's in one run while the compiled
models and their warm state live on:
    info                                      -> torch info version=... mkl=... onednn=... capability=...
    sgemm THREADS                             -> torch sgemm n=1024 threads=T gflops=G
    train CONFIG MODE THREADS BATCH STEPS WARMUP
                                              -> torch train config=A mode=eager threads=1 batch=8
                                                 tokens_per_s=... step_ms=... loss=...
    quit
A command that fails answers `torch error <one line>` and the server reads on. Models (and
their optimizers) are kept per (config, mode, threads, batch) and train on across commands:
compilation happens once, in the first command's warm-up.
"""

import os

# Before torch is imported: OpenMP sizes its pool from these when it loads. The number of
# threads each measurement uses is set per command (torch.set_num_threads).
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
# Inductor compiles its kernels in this process instead of a pool of workers, so no idle
# compile workers sit beside the timings.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

try:
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
    from torch import nn  # noqa: E402
except ImportError:
    print("SKIPPED: PyTorch not importable by this interpreter (run scripts/torch_venv.sh and use "
          "the interpreter it prints)")
    sys.exit(77)

# torch.compile looks for a CUDA toolkit when it builds its C++ kernels and warns, on every
# CPU-only machine that has one installed, that no CUDA runtime is found: not this bench's concern.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

SKIP_EXIT_CODE = 77
MODES = ("eager", "compile", "autocast", "compile-autocast")
CONFIGS = {
    "A": {"layers": 4, "width": 256, "heads": 4, "seq": 128, "batch": 8, "vocab": 256},
    "B": {"layers": 2, "width": 64, "heads": 4, "seq": 64, "batch": 4, "vocab": 256},
}


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, width, heads, seq, vocab):
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        for parameter in self.parameters():
            if parameter.dim() == 2:
                nn.init.normal_(parameter, std=0.02)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Trainer:
    """One model, its optimizer and a step function for one (config, mode, threads, batch)."""

    def __init__(self, name, mode, threads, batch, seed=0):
        settings = CONFIGS[name]
        torch.manual_seed(seed)
        self.settings, self.batch, self.mode = settings, batch, mode
        self.model = Gpt(settings["layers"], settings["width"], settings["heads"], settings["seq"], settings["vocab"])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                           weight_decay=0.1, foreach=True)
        self.forward = torch.compile(self.model, dynamic=False) if mode.startswith("compile") else self.model
        self.autocast = mode.endswith("autocast")
        self.generator = torch.Generator().manual_seed(seed + 1)

    def batches(self, count):
        shape = (count, self.batch, self.settings["seq"])
        tokens = torch.randint(0, self.settings["vocab"], shape, generator=self.generator)
        targets = torch.randint(0, self.settings["vocab"], shape, generator=self.generator)
        return tokens, targets

    def step(self, tokens, targets):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            loss = self.forward(tokens, targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def run(self, steps, warmup):
        """Median seconds of `steps` timed steps after `warmup` untimed ones, and the last loss."""
        tokens, targets = self.batches(warmup + steps)
        times = []
        for step in range(warmup + steps):
            start = time.perf_counter()
            loss = self.step(tokens[step], targets[step])
            elapsed = time.perf_counter() - start
            if step >= warmup:
                times.append(elapsed)
        value = loss.item()
        if value != value or value in (float("inf"), float("-inf")):
            raise RuntimeError(f"loss became {value} during the bench")
        return statistics.median(times), value


def sgemm_gflops(threads, n=1024, repeats=9):
    """torch.mm on n x n f32 matrices (MKL or oneDNN, whichever PyTorch picks): median GFLOP/s."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)  # warm-up: the first call allocates the library's buffers
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - start)
    return 2.0 * n ** 3 / statistics.median(times) / 1e9


def info_line():
    config = torch.__config__.show()

    def find(pattern):
        match = re.search(pattern, config)
        return match.group(1).strip().replace(" ", "_") if match else "none"

    mkl = find(r"Math Kernel Library Version ([^\n]*?)(?: for| Product|\n)")
    onednn = find(r"MKL-DNN (v[0-9.]+)")
    capability = find(r"CPU capability usage: ([^\n]*)")
    return f"torch info version={torch.__version__} mkl={mkl} onednn={onednn} capability={capability}"


def checked_train_arguments(name, mode, threads, batch, steps, warmup):
    if name not in CONFIGS:
        raise ValueError(f"config {name!r} is not one of {', '.join(sorted(CONFIGS))}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if threads < 1 or batch < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"threads {threads} batch {batch} steps {steps} warmup {warmup}: valid are "
                         "threads >= 1, batch >= 1, steps >= 1, warmup >= 0")


def train_line(trainers, name, mode, threads, batch, steps, warmup):
    checked_train_arguments(name, mode, threads, batch, steps, warmup)
    torch.set_num_threads(threads)
    key = (name, mode, threads, batch)
    if key not in trainers:
        trainers[key] = Trainer(name, mode, threads, batch)
    seconds, loss = trainers[key].run(steps, warmup)
    tokens = batch * CONFIGS[name]["seq"]
    return (f"torch train config={name} mode={mode} threads={threads} batch={batch} "
            f"tokens_per_s={tokens / seconds:.1f} step_ms={seconds * 1e3:.2f} loss={loss:.4f}")


def serve():
    trainers = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] == "quit":
                break
            if words[0] == "info" and len(words) == 1:
                answer = info_line()
            elif words[0] == "sgemm" and len(words) == 2:
                threads = int(words[1])
                answer = f"torch sgemm n=1024 threads={threads} gflops={sgemm_gflops(threads):.1f}"
            elif words[0] == "train" and len(words) == 7:
                answer = train_line(trainers, words[1], words[2], *(int(w) for w in words[3:]))
            else:
                raise ValueError(f"unknown command {line.strip()!r}; valid: info, sgemm THREADS, "
                                 "train CONFIG MODE THREADS BATCH STEPS WARMUP, quit")
        except Exception as error:  # the bench reads on; it names the failure in its output
            answer = "torch error " + " ".join(f"{type(error).__name__}: {error}".split())
        print(answer, flush=True)
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS))
    parser.add_argument("--mode", choices=MODES, default="eager")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--batch", type=int, help="sequences per step (default: the config's)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--sgemm", type=int, metavar="THREADS", help="print torch.mm 1024^3 GFLOP/s on THREADS")
    parser.add_argument("--info", action="store_true", help="print the torch version and its CPU libraries")
    parser.add_argument("--serve", action="store_true", help="answer commands on stdin (see above)")
    args = parser.parse_args(argv)
    torch.set_num_interop_threads(1)
    if args.serve:
        return serve()
    if args.info:
        print(info_line())
    if args.sgemm is not None:
        if args.sgemm < 1:
            parser.error(f"--sgemm {args.sgemm}: pass at least 1 thread")
        print(f"torch sgemm n=1024 threads={args.sgemm} gflops={sgemm_gflops(args.sgemm):.1f}")
    if args.config is not None:
        batch = args.batch if args.batch is not None else CONFIGS[args.config]["batch"]
        try:
            checked_train_arguments(args.config, args.mode, args.threads, batch, args.steps, args.warmup)
        except ValueError as error:
            parser.error(str(error))
        print(train_line({}, args.config, args.mode, args.threads, batch, args.steps, args.warmup))
    elif not args.info and args.sgemm is None:
        parser.error("pass --config, --info, --sgemm or --serve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
