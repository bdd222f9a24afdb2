#!/usr/bin/python3
"""PyTorch DistributedDataParallel on loom's GPT, one CPU thread per rank: the peer for loom's data-parallel bench.

Usage:
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/data_parallel_torch.py --config A|B --ranks N \\
        [--steps S] [--warmup W] [--port P] [--seed K] [--timeout T] [--no-ddp]

Starts N worker processes (this script again, with --worker RANK) that join a gloo process
group over tcp://127.0.0.1:P and train the GPT of tests/parity/torch_gpt.py (the model the
parity test checks loom against) wrapped in
DistributedDataParallel, with AdamW, on random tokens, in f32. Every rank seeds identically,
so the replicas start equal (DDP also broadcasts rank 0's weights when it wraps the model);
the tokens differ per rank and are made before the clock starts. The batch is PER RANK: a
step trains ranks * batch sequences. A step is zero_grad(set_to_none=True), forward, mean
cross-entropy, backward (DDP all-reduces the gradient buckets, averaged over the ranks,
while the backward pass runs) and opt.step(). W warm-up steps are run untimed (allocator,
BLAS buffers and DDP's bucket order settle), then S steps are timed one by one on rank 0
with time.perf_counter around the step alone, no barrier: the all-reduce in the backward
already keeps the ranks in lock-step. The median is reported, which a busy neighbour moves
less than the mean. One machine-readable line, from rank 0, on stdout:

    torch_ddp config=A ranks=2 tokens_per_s=8012.3 step_ms=255.6 steps=20

tokens_per_s = ranks * batch * seq / median step time: the global throughput, all ranks'
tokens. With --ranks 1 the same DDP code runs at world size 1 (the gradient hooks and the
bucket copies stay, the all-reduce is trivial), so ranks=2 / ranks=1 is the scaling ratio
measured like for like. --no-ddp (only with --ranks 1) trains the plain model, no process
group, to show what DDP itself costs; its line says ddp=off:

    torch_ddp config=A ranks=1 ddp=off tokens_per_s=4412.3 step_ms=232.1 steps=20

DDP settings chosen: the default bucket sizes (25 MiB, and 1 MiB for the first bucket). After
the first steps DDP rebuilds its buckets in the order the gradients become ready; config A's
3.3M f32 parameters (13.3 MB) then fall into two buckets, 1.3 MB (the head and the last
layers, all-reduced while the rest of the backward runs) and 12.0 MB (all-reduced after the
backward is done, nothing left to overlap it with); config B's 0.55 MB are one bucket. The
bench measures DDP as a user gets it. gradient_as_bucket_view=True: the gradients live in
the buckets, saving a copy into and out of them on every step. The model's only buffers are
the constant boolean causal masks: gloo cannot broadcast bool tensors ("Invalid scalar
type" when DDP syncs the module at construction), so they are excluded from DDP's syncing
(DistributedDataParallel._set_params_and_buffers_to_ignore_for_model, PyTorch's own
workaround) and broadcast_buffers=False; every rank builds the identical mask anyway.
After the timed steps the ranks compare a checksum of their weights and fail if the
replicas diverged, so a run that prints a number did train data-parallel.

Threads: each worker gets OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1 and MKL_NUM_THREADS=1
in the environment it is started with (the BLAS and OpenMP pools size themselves when torch
is loaded, so setting them later is too late), and calls torch.set_num_threads(1) and
torch.set_num_interop_threads(1). This matters: on the 2-core machine the bench was written
on, unpinned (none of the variables, no set_num_threads) each rank's OpenBLAS and OpenMP
pools start a thread per core, the two ranks' threads oversubscribe the 2 cores, and config
A at 2 ranks fell from about 8.7k tokens/s to anywhere between 4.3k and 8.7k, differing run
to run (9 runs; the lead measured about 4.6k against 8.0k), while pinned runs agree within
a few percent. Debian's OpenBLAS (the pthread build torch links here) takes its thread
count from OMP_NUM_THREADS when OPENBLAS_NUM_THREADS is unset, so it is the pair that
matters; the script sets all three rather than rely on that. For the same reason --ranks
may not exceed the cores this process may run on.

Configs (vocab 256: bytes; batch per rank):
    A: layers 4, width 256, heads 4, seq 128, batch 8
    B: layers 2, width 64,  heads 4, seq 64,  batch 4

Errors: any failure (torch or its gloo backend missing, the port in use, a worker dying or
raising) ends the run with a non-zero exit and one line on stderr saying what happened; the
other workers are killed at once. The parent waits at most --timeout seconds (default 600)
for the whole run and then kills the workers. Exit codes: 0 success, 1 a worker failed or
the run timed out, 2 bad arguments or the port is in use, 77 PyTorch (with gloo) not
importable by this interpreter (ctest's skip code). Use the system
interpreter (/usr/bin/python3): Debian's python3-torch is installed for it.
"""

import os

# Before torch can be imported (the workers import it; the parent never does): the BLAS and
# OpenMP pools size themselves when loaded. The parent also passes these to every worker.
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
for _variable in THREAD_VARIABLES:
    os.environ[_variable] = "1"

import argparse  # noqa: E402
import errno  # noqa: E402
import importlib.util  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

PROGRAM = "data_parallel_torch"
PARITY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity")
WORKER_ERROR = f"{PROGRAM} worker error: "  # the prefix of a worker's one failure line
SKIP_EXIT_CODE = 77

CONFIGS = {
    "A": {"layers": 4, "width": 256, "heads": 4, "seq": 128, "batch": 8, "vocab": 256},
    "B": {"layers": 2, "width": 64, "heads": 4, "seq": 64, "batch": 4, "vocab": 256},
}


def fail(message, code):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    return code


# --------------------------------------------------------------------------------------
# Worker: one rank. Imports torch only here, after the environment above is in place.
# --------------------------------------------------------------------------------------

def run_worker(args):
    # The thread variables are "1" here twice over: the parent started this process with
    # them, and this module set them again at the top, before any import of torch.
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, PARITY_DIR)
    from torch_gpt import GptConfig, GptModel

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)

    rank, ranks = args.worker, args.ranks
    use_ddp = not args.no_ddp
    if use_ddp:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                                world_size=ranks, timeout=datetime.timedelta(seconds=args.timeout))

    settings = CONFIGS[args.config]
    torch.manual_seed(args.seed)  # the same on every rank: equal replicas
    config = GptConfig(settings["layers"], settings["width"], settings["heads"], settings["seq"],
                       settings["vocab"])
    model = GptModel(config)
    if use_ddp:
        # Default bucket sizes; the masks (bool buffers, which gloo cannot broadcast) stay out
        # of DDP's syncing. See the module docstring.
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [name for name, _ in model.named_buffers()])
        trained = DistributedDataParallel(model, gradient_as_bucket_view=True, broadcast_buffers=False)
    else:
        trained = model
    optimizer = torch.optim.AdamW(trained.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1)

    total = args.warmup + args.steps
    shape = (total, settings["batch"], settings["seq"])
    generator = torch.Generator().manual_seed(args.seed + 1 + rank)  # different tokens per rank
    tokens = torch.randint(0, settings["vocab"], shape, generator=generator)
    targets = torch.randint(0, settings["vocab"], shape, generator=generator)

    times = []
    for step in range(total):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        # Through the wrapper's forward (not model.loss), so DDP prepares its reducer.
        logits = trained(tokens[step])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[step].reshape(-1))
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
    if not torch.isfinite(loss):
        raise RuntimeError(f"rank {rank}: config {args.config}: loss became {loss.item()} during the bench")

    if use_ddp:
        # Untimed: the replicas must still be equal, else the all-reduce did not do its job.
        with torch.no_grad():
            checksum = torch.stack([p.double().sum() for p in model.parameters()]).sum().reshape(1)
        sums = [torch.zeros(1, dtype=torch.float64) for _ in range(ranks)]
        dist.all_gather(sums, checksum)
        values = [s.item() for s in sums]
        if max(values) - min(values) > 1e-9 * max(1.0, max(abs(v) for v in values)):
            raise RuntimeError(f"rank {rank}: the replicas diverged: weight checksums {values}")
        dist.barrier()
        dist.destroy_process_group()

    if rank == 0:
        step_seconds = statistics.median(times)
        tokens_per_step = ranks * settings["batch"] * settings["seq"]
        mode = "" if use_ddp else " ddp=off"
        print(f"torch_ddp config={args.config} ranks={ranks}{mode} tokens_per_s={tokens_per_step / step_seconds:.1f} "
              f"step_ms={step_seconds * 1e3:.1f} steps={args.steps}", flush=True)
    return 0


def worker_main(args):
    try:
        return run_worker(args)
    except ImportError as error:
        print(f"{WORKER_ERROR}rank {args.worker}: cannot import ({error})", file=sys.stderr, flush=True)
        return SKIP_EXIT_CODE
    except BaseException as error:  # noqa: BLE001 - one line for the parent, whatever it was
        text = " ".join(str(error).split())[:500] or "(no message)"
        print(f"{WORKER_ERROR}rank {args.worker}: {type(error).__name__}: {text}", file=sys.stderr, flush=True)
        return 1


# --------------------------------------------------------------------------------------
# Parent: checks, starts the workers, watches them, relays rank 0's line.
# --------------------------------------------------------------------------------------

def torch_available():
    """Whether this interpreter has torch with gloo, without importing torch here."""
    if importlib.util.find_spec("torch") is None:
        return False, f"PyTorch is not importable by {sys.executable} (use /usr/bin/python3 with python3-torch)"
    probe = subprocess.run([sys.executable, "-c",
                            "import torch.distributed as d; raise SystemExit(0 if d.is_available() and "
                            "d.is_gloo_available() else 3)"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    if probe.returncode != 0:
        return False, f"torch.distributed with the gloo backend is not available to {sys.executable}"
    return True, ""


def port_in_use(port):
    """True when 127.0.0.1:port cannot be bound (SO_REUSEADDR as TCPStore uses, so TIME_WAIT is fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def last_error_line(stderr_text):
    lines = [line.strip() for line in stderr_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith(WORKER_ERROR):
            return line[len(WORKER_ERROR):]
    return lines[-1] if lines else "(nothing on stderr)"


def describe_exit(code):
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def parent_main(args):
    ok, why = torch_available()
    if not ok:
        return fail(why, SKIP_EXIT_CODE)
    if not args.no_ddp and port_in_use(args.port):
        return fail(f"port {args.port} on 127.0.0.1 is in use; pick another with --port", 2)

    environment = dict(os.environ)
    environment.update({variable: "1" for variable in THREAD_VARIABLES})
    common = [sys.executable, os.path.abspath(__file__), "--config", args.config, "--ranks", str(args.ranks),
              "--steps", str(args.steps), "--warmup", str(args.warmup), "--port", str(args.port),
              "--seed", str(args.seed), "--timeout", str(args.timeout)] + (["--no-ddp"] if args.no_ddp else [])

    # A terminated parent still runs the cleanup below: no orphaned workers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workers = []
    with tempfile.TemporaryDirectory(prefix=f"{PROGRAM}-") as scratch:
        try:
            for rank in range(args.ranks):
                out = open(os.path.join(scratch, f"rank{rank}.out"), "w+")
                err = open(os.path.join(scratch, f"rank{rank}.err"), "w+")
                process = subprocess.Popen(common + ["--worker", str(rank)], env=environment,
                                           stdin=subprocess.DEVNULL, stdout=out, stderr=err)
                workers.append((rank, process, out, err))

            deadline = time.monotonic() + args.timeout
            failure = None
            while failure is None:
                running, failed = 0, []
                for rank, process, _, err in workers:
                    code = process.poll()
                    if code is None:
                        running += 1
                    elif code != 0:
                        err.seek(0)
                        failed.append((rank, code, last_error_line(err.read())))
                if failed:  # all that failed since the last look: the cause and its echoes
                    failure = ("; ".join(f"rank {rank} {describe_exit(code)}: {line}" for rank, code, line in failed),
                               SKIP_EXIT_CODE if all(code == SKIP_EXIT_CODE for _, code, _ in failed) else 1)
                    break
                if running == 0:
                    break
                if time.monotonic() > deadline:
                    failure = (f"timed out after {args.timeout} s with {running} of {args.ranks} workers "
                               "still running; killed them", 1)
                time.sleep(0.05)
            if failure is not None:
                return fail(failure[0], failure[1])

            rank0_out = workers[0][2]
            rank0_out.seek(0)
            lines = [line.strip() for line in rank0_out if line.startswith("torch_ddp ")]
            if len(lines) != 1:
                return fail(f"rank 0 finished but printed {len(lines)} result lines instead of 1", 1)
            for rank, _, _, err in workers:  # warnings the workers printed, for the record
                err.seek(0)
                for line in err.read().splitlines():
                    if line.strip():
                        print(f"{PROGRAM}: rank {rank}: {line}", file=sys.stderr)
            print(lines[0], flush=True)
            return 0
        finally:
            for _, process, out, err in workers:
                if process.poll() is None:
                    process.kill()
                process.wait()
                out.close()
                err.close()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--ranks", type=int, required=True, help="worker processes, one CPU thread each")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--port", type=int, default=29531, help="rendezvous port on 127.0.0.1 (default 29531)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=600,
                        help="seconds the whole run may take before the workers are killed (default 600)")
    parser.add_argument("--no-ddp", action="store_true", help="with --ranks 1: the plain model, no DDP")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.steps < 1 or args.warmup < 0:
        return fail(f"--steps {args.steps} --warmup {args.warmup}: valid are steps >= 1, warmup >= 0", 2)
    if args.ranks < 1:
        return fail(f"--ranks {args.ranks}: must be at least 1", 2)
    if args.no_ddp and args.ranks != 1:
        return fail(f"--no-ddp with --ranks {args.ranks}: a plain model is one process; use --ranks 1", 2)
    if not 1 <= args.port <= 65535:
        return fail(f"--port {args.port}: must be 1..65535", 2)
    if args.timeout < 1:
        return fail(f"--timeout {args.timeout}: must be at least 1", 2)
    if args.worker is not None:
        if not 0 <= args.worker < args.ranks:
            return fail(f"--worker {args.worker} with --ranks {args.ranks}", 2)
        return worker_main(args)

    cores = len(os.sched_getaffinity(0))
    if args.ranks > cores:
        return fail(f"--ranks {args.ranks} with one thread each would oversubscribe the {cores} cores "
                    "this process may run on", 2)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
