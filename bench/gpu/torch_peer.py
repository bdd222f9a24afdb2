#!/usr/bin/env python3
"""PyTorch on the same GPU: the peer figures for bench_gpu_kernels and bench_gpu_train.

Usage:
    python3 bench/gpu/torch_peer.py --kernels [--gemm 8192] [--elements 268435456]
    python3 bench/gpu/torch_peer.py --gpt [--layers 12 --width 768 --heads 12 --seq 1024 --vocab 50257 --batch 8]
                                    [--compile]

--kernels prints, in bench_gpu_kernels' format:
    torch gemm_bf16 m=8192 tflops=780.2
    torch copy_d2d bytes=1073741824 gbps=3000.1
    torch gelu_forward n=268435456 gbps=2700.3 of_copy=0.900
    torch adamw n=... gbps=... of_copy=...     (torch.optim.AdamW, fused=True, one tensor of n)
    torch cast_bf16 n=... gbps=... of_copy=...
    torch attention seq=1024 heads=12 head_dim=64 batch=8 dtype=bf16 fwd_bwd_tflops=...
    torch attention ... dtype=f32 ...          (SDPA in f32, beside loom's f32 attention)
--gpt prints bench_gpu_train's line for GPT-2-shaped training with bf16 autocast and SDPA
(the model of loom's gpt/model.hpp: pre-LN, learned positions, GELU tanh, untied head
without bias), eager, and with --compile also under torch.compile:
    torch gpt mode=eager ... tokens_per_s=... step_ms=...
Times: CUDA events (kernels) or a synchronised wall clock per step (GPT), median of --reps
or --steps after --warmup. Without CUDA it prints why and exits 77.
"""

import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIPPED: PyTorch is not importable here")
    sys.exit(77)


def median_seconds(work, reps, warmup):
    for _ in range(warmup):
        work()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times)


def kernels(args):
    n = args.gemm
    a = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    b = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    s = median_seconds(lambda: torch.matmul(a, b.t()), args.reps, args.warmup)
    print(f"torch gemm_bf16 m={n} tflops={2 * n**3 / s / 1e12:.1f}")
    del a, b

    e = args.elements
    x = torch.rand(e, device="cuda") - 0.5
    y = torch.empty_like(x)
    copy = median_seconds(lambda: y.copy_(x), args.reps, args.warmup)
    copy_gbps = 2 * e * 4 / copy / 1e9
    print(f"torch copy_d2d bytes={e * 4} gbps={copy_gbps:.1f}")

    def report(name, nbytes, seconds):
        gbps = nbytes / seconds / 1e9
        print(f"torch {name} n={e} gbps={gbps:.1f} of_copy={gbps / copy_gbps:.3f}")

    report("gelu_forward", 2 * e * 4, median_seconds(lambda: F.gelu(x, approximate="tanh"), args.reps, args.warmup))
    p = torch.nn.Parameter(x.clone())
    p.grad = torch.rand_like(p) * 1e-2
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    report("adamw", 7 * e * 4, median_seconds(opt.step, args.reps, args.warmup))
    del p, opt
    report("cast_bf16", 6 * e, median_seconds(lambda: x.to(torch.bfloat16), args.reps, args.warmup))
    del x, y

    for seq, batch in ((1024, 8), (4096, 2)):
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
            q, k, v = (torch.randn(batch, 12, seq, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
            dout = torch.randn(batch, 12, seq, 64, device="cuda", dtype=dtype)

            def step():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(dout)

            s = median_seconds(step, args.reps, args.warmup)
            matmul = 2.0 * batch * 12 * seq * seq * 64 / 2.0  # one causal matmul; 7 of them as loom counts
            print(f"torch attention seq={seq} heads=12 head_dim=64 batch={batch} dtype={name} "
                  f"fwd_bwd_tflops={7 * matmul / s / 1e12:.2f}")


class Block(torch.nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.qkv, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.fc, self.out = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, layers, width, heads, seq, vocab):
        super().__init__()
        self.token, self.position = torch.nn.Embedding(vocab, width), torch.nn.Embedding(seq, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.token(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def gpt(args):
    torch.manual_seed(1)
    for mode in ("eager", "compile") if args.compile else ("eager",):
        model = Gpt(args.layers, args.width, args.heads, args.seq, args.vocab).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        run = torch.compile(model) if mode == "compile" else model
        tokens = torch.randint(args.vocab, (args.batch, args.seq), device="cuda")
        targets = torch.randint(args.vocab, (args.batch, args.seq), device="cuda")
        times = []
        for step in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = run(tokens, targets)
            loss.backward()
            opt.step()
            loss_value = loss.item()  # loom reads its loss back too
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
        s = statistics.median(times)
        print(f"torch gpt mode={mode} layers={args.layers} width={args.width} heads={args.heads} seq={args.seq} "
              f"vocab={args.vocab} batch={args.batch} tokens_per_s={args.batch * args.seq / s:.1f} "
              f"step_ms={s * 1e3:.2f} loss={loss_value:.4f}")
        del model, opt, run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--gpt", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--gemm", type=int, default=8192)
    parser.add_argument("--elements", type=int, default=1 << 28)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    for name, default in (("layers", 12), ("width", 768), ("heads", 12), ("seq", 1024), ("vocab", 50257), ("batch", 8)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: torch.cuda.is_available() is False; no GPU here")
        sys.exit(77)
    print(f"device {torch.cuda.get_device_name(0)} torch {torch.__version__}")
    if args.kernels:
        kernels(args)
    if args.gpt:
        gpt(args)
    if not (args.kernels or args.gpt):
        parser.error("give --kernels, --gpt or both")


if __name__ == "__main__":
    main()
