#!/usr/bin/python3
"""loom's GPT against a reference written in PyTorch: loss, gradients and AdamW steps.

Usage:
    /usr/bin/python3 tests/parity/torch_gpt.py DIR          # compare a dump of `loom_gpt_dump --out DIR`
    /usr/bin/python3 tests/parity/torch_gpt.py --self-test [DIR]

Use the system interpreter: Debian's python3-torch (PyTorch 1.13) is installed for
/usr/bin/python3 only. Without torch the script prints "SKIPPED: ..." and exits 77, which
ctest reports as skipped.

What DIR holds (written by loom's dump tool; every tensor f32 unless said):
  weights.safetensors  initial weights under loom's names (`embed.token`, `blocks.0.ln1.gain`,
                       ... `head.weight`, PyTorch layouts: Linear weights are [out, in]);
                       __metadata__: layers, width, heads, seq, vocab, batch, lr, beta1, beta2,
                       eps, weight_decay, steps (decimal strings)
  batches.safetensors  `tokens` and `targets`, I32 [steps, batch, seq]
  grads.safetensors    gradient of the mean loss at the initial weights on batch 0, same names;
                       __metadata__ "loss": that loss, 9 significant digits
  losses.json          {"losses": [...]}: at step s the loss on batch s, computed before
                       step s's AdamW update, for s = 0 .. steps-1

Checks and tolerances (relative errors; f32 against f32, two different summation orders):
  loss on batch 0        |l_loom - l_torch| / |l_torch|                  <= 1e-4
  every gradient tensor  ||g_loom - g_torch||_2 / max(||g_torch||_2, tiny) <= 1e-4
  loss at AdamW step s   |l_loom - l_torch| / |l_torch|                  <= 1e-4 at every step
The losses keep the 1e-4 bound over all the steps: `--self-test` measures how far an f32
run drifts from an f64 run of the same steps (the rounding one implementation can add to
the other). Measured: loss <= 2e-7, worst gradient <= 7e-7, losses over 10 steps <= 2e-7
(layers 2 width 64 seq 32 at lr 1e-3 and 1e-2, and layers 4 width 256 seq 128 batch 8 at
lr 1e-3): over 10 steps the drift does not grow measurably, so there is no reason to
loosen the bound for later steps. A relative 1e-4 is thus >100x above rounding, and far
below what a real bug costs (a wrong scale, a missing bias or a transposed weight moves
the loss or a gradient by percents).

One line on success: "parity passed: ..."; on a mismatch "parity FAILED: <what, which
tensor, the numbers>" and exit code 1.

--self-test writes its own weights and batches (numpy), computes the "loom" side with the
same model in float64 (gradients cast to f32, as the files hold), writes DIR in the exact
format above, runs the comparison on it, and then checks that the comparison fails on a
corrupted gradient and on a corrupted loss. It tests this script's reader, writer and
comparator end to end without the C++ tool.

The model (GptModel) is also what bench/data_parallel_torch.py trains. The speed peer of
bench/train_gpt (bench/train_gpt_torch.py) writes its own, as a user of current PyTorch would
(scaled_dot_product_attention), and runs in the private venv of scripts/torch_venv.sh.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile

SKIP_EXIT_CODE = 77

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    if __name__ == "__main__":
        print("SKIPPED: PyTorch not importable by /usr/bin/python3 (install python3-torch)")
        sys.exit(SKIP_EXIT_CODE)
    raise

LOSS_TOLERANCE = 1e-4
GRADIENT_TOLERANCE = 1e-4
STEP_LOSS_TOLERANCE = 1e-4
LAYER_NORM_EPS = 1e-5


class ParityFailure(Exception):
    """A mismatch or a malformed dump; the message is the one line printed after 'parity FAILED: '."""


# --------------------------------------------------------------------------------------
# safetensors, read and written with struct + json: the format is an 8-byte little-endian
# header length, a JSON header ({name: {dtype, shape, data_offsets}, "__metadata__": {}}),
# then the raw little-endian data. No dependency on the safetensors package.
# --------------------------------------------------------------------------------------

_NUMPY_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "BF16": np.dtype("<u2"),  # widened to f32 after reading: numpy has no bfloat16
}
_SAFETENSORS_DTYPES = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16",
                       np.dtype("<i8"): "I64", np.dtype("<i4"): "I32"}


def read_safetensors(path):
    """Returns ({name: numpy array}, {metadata key: string})."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise ParityFailure(f"cannot read {path}: {error.strerror}") from None
    if len(data) < 8:
        raise ParityFailure(f"{path} has {len(data)} bytes, fewer than the 8-byte header length")
    (header_length,) = struct.unpack_from("<Q", data, 0)
    if 8 + header_length > len(data):
        raise ParityFailure(f"{path}: header length {header_length} runs past the file's {len(data)} bytes")
    try:
        header = json.loads(data[8:8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ParityFailure(f"{path}: header is not JSON ({error})") from None
    metadata = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + header_length:]
    tensors = {}
    for name, entry in header.items():
        dtype_name = entry.get("dtype")
        if dtype_name not in _NUMPY_DTYPES:
            raise ParityFailure(f"{path}: tensor {name} has dtype {dtype_name!r}; valid: {', '.join(_NUMPY_DTYPES)}")
        dtype = _NUMPY_DTYPES[dtype_name]
        shape = [int(extent) for extent in entry["shape"]]
        begin, end = (int(offset) for offset in entry["data_offsets"])
        expected = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end <= len(body) or end - begin != expected:
            raise ParityFailure(f"{path}: tensor {name} data_offsets [{begin}, {end}] do not hold shape {shape} "
                                f"of {dtype_name} ({expected} bytes) inside the {len(body)}-byte data section")
        array = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape)
        if dtype_name == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: numpy array} in insertion order, header padded to 8 bytes as the format recommends."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(key): str(value) for key, value in metadata.items()}
    chunks = []
    offset = 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        little_endian = array.dtype.newbyteorder("<")
        if little_endian not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name} has dtype {array.dtype}; valid: f64, f32, f16, i64, i32")
        raw = array.astype(little_endian, copy=False).tobytes()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[little_endian], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for chunk in chunks:
            file.write(chunk)


# --------------------------------------------------------------------------------------
# The model. Module and attribute names are chosen so that state_dict() keys are exactly
# loom's parameter names; load_state_dict(strict=True) then checks names and shapes.
# --------------------------------------------------------------------------------------

class GptConfig:
    def __init__(self, layers, width, heads, seq, vocab):
        if layers < 1 or width < 1 or heads < 1 or seq < 1 or vocab < 1:
            raise ValueError(f"GPT config layers={layers} width={width} heads={heads} seq={seq} vocab={vocab}: "
                             "every value must be >= 1")
        if width % heads != 0:
            raise ValueError(f"GPT width {width} is not a multiple of heads {heads}")
        self.layers, self.width, self.heads, self.seq, self.vocab = layers, width, heads, seq, vocab

    def __repr__(self):
        return (f"layers={self.layers} width={self.width} heads={self.heads} seq={self.seq} "
                f"vocab={self.vocab}")


class LayerNorm(nn.Module):
    """loom's names (gain, shift) rather than nn.LayerNorm's (weight, bias)."""

    def __init__(self, width):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(width))
        self.shift = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.gain, self.shift, eps=LAYER_NORM_EPS)


class Embedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.token = nn.Parameter(torch.randn(config.vocab, config.width) * 0.02)
        self.position = nn.Parameter(torch.randn(config.seq, config.width) * 0.02)

    def forward(self, tokens):
        return self.token[tokens] + self.position[:tokens.shape[1]]


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        # Not persistent: the mask is no parameter and must not appear in state_dict().
        future = torch.triu(torch.ones(config.seq, config.seq, dtype=torch.bool), diagonal=1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x):
        batch, seq, width = x.shape
        head_dim = width // self.heads
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (part.view(batch, seq, self.heads, head_dim).transpose(1, 2) for part in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        scores = scores.masked_fill(self.future[:seq, :seq], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Mlp(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.width, 4 * config.width)
        self.proj = nn.Linear(4 * config.width, config.width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln1 = LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln2 = LayerNorm(config.width)
        self.mlp = Mlp(config)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GptModel(nn.Module):
    """Pre-LN, byte-level GPT; the head is untied from the token embedding and has no bias."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, tokens, targets):
        """Mean cross-entropy over all batch * seq positions."""
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(config, weights, dtype):
    """A model holding `weights` (numpy, loom's names) in `dtype`; names and shapes must match exactly."""
    model = GptModel(config)
    expected = model.state_dict()
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    if missing or unexpected:
        raise ParityFailure(f"weights.safetensors names differ from the model's: missing {missing[:4]}, "
                            f"unexpected {unexpected[:4]} (config {config})")
    for name, tensor in expected.items():
        if list(weights[name].shape) != list(tensor.shape):
            raise ParityFailure(f"weight {name} has shape {list(weights[name].shape)}; "
                                f"the model ({config}) needs {list(tensor.shape)}")
    model.load_state_dict({name: torch.from_numpy(np.array(weights[name], dtype=np.float32))
                           for name in expected}, strict=True)
    return model.to(dtype)


# --------------------------------------------------------------------------------------
# The comparison.
# --------------------------------------------------------------------------------------

def _metadata_value(metadata, key, convert, where):
    if key not in metadata:
        raise ParityFailure(f"{where} __metadata__ lacks {key!r}; it has {sorted(metadata)}")
    try:
        return convert(metadata[key])
    except ValueError:
        raise ParityFailure(f"{where} __metadata__ {key}={metadata[key]!r} is not a decimal "
                            f"{'integer' if convert is int else 'number'}") from None


def relative_error(loom_value, torch_value):
    return abs(loom_value - torch_value) / max(abs(torch_value), np.finfo(np.float32).tiny)


def load_dump(directory):
    """Reads and validates the four files; returns a dict with everything the comparison needs."""
    weights, metadata = read_safetensors(os.path.join(directory, "weights.safetensors"))
    where = "weights.safetensors"
    config = GptConfig(*(_metadata_value(metadata, key, int, where)
                         for key in ("layers", "width", "heads", "seq", "vocab")))
    batch = _metadata_value(metadata, "batch", int, where)
    steps = _metadata_value(metadata, "steps", int, where)
    optimizer = {key: _metadata_value(metadata, key, float, where)
                 for key in ("lr", "beta1", "beta2", "eps", "weight_decay")}

    batches, _ = read_safetensors(os.path.join(directory, "batches.safetensors"))
    for key in ("tokens", "targets"):
        if key not in batches:
            raise ParityFailure(f"batches.safetensors lacks {key!r}; it has {sorted(batches)}")
        array = batches[key]
        if list(array.shape) != [steps, batch, config.seq]:
            raise ParityFailure(f"batches.safetensors {key} has shape {list(array.shape)}; "
                                f"valid: [steps={steps}, batch={batch}, seq={config.seq}]")
        if array.dtype.kind != "i":
            raise ParityFailure(f"batches.safetensors {key} has dtype {array.dtype}; valid: I32 or I64")
        if array.size and (array.min() < 0 or array.max() >= config.vocab):
            raise ParityFailure(f"batches.safetensors {key} holds ids in [{array.min()}, {array.max()}]; "
                                f"valid: [0, {config.vocab - 1}]")

    grads, grad_metadata = read_safetensors(os.path.join(directory, "grads.safetensors"))
    loss = _metadata_value(grad_metadata, "loss", float, "grads.safetensors")

    losses_path = os.path.join(directory, "losses.json")
    try:
        with open(losses_path, encoding="utf-8") as file:
            losses = [float(value) for value in json.load(file)["losses"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ParityFailure(f"cannot read {losses_path} as {{\"losses\": [numbers]}}: {error}") from None
    if len(losses) != steps:
        raise ParityFailure(f"losses.json holds {len(losses)} losses; metadata steps={steps}")

    return {"config": config, "weights": weights, "optimizer": optimizer, "steps": steps,
            "tokens": torch.from_numpy(batches["tokens"].astype(np.int64)),
            "targets": torch.from_numpy(batches["targets"].astype(np.int64)),
            "grads": grads, "loss": loss, "losses": losses}


def compare_gradients(dump, model):
    """Loss and per-tensor gradient check on batch 0; returns (loss error, worst name, worst error)."""
    loss = model.loss(dump["tokens"][0], dump["targets"][0])
    loss.backward()
    torch_loss = loss.item()
    loss_error = relative_error(dump["loss"], torch_loss)
    print(f"loss on batch 0: loom {dump['loss']:.9g} torch {torch_loss:.9g} relative error {loss_error:.3g}")
    if not loss_error <= LOSS_TOLERANCE:
        raise ParityFailure(f"loss on batch 0: loom {dump['loss']:.9g} torch {torch_loss:.9g} "
                            f"relative error {loss_error:.3g} > {LOSS_TOLERANCE:g}")

    parameters = dict(model.named_parameters())
    missing = [name for name in parameters if name not in dump["grads"]]
    unexpected = [name for name in dump["grads"] if name not in parameters]
    if missing or unexpected:
        raise ParityFailure(f"grads.safetensors names differ from the model's: missing {missing[:4]}, "
                            f"unexpected {unexpected[:4]}")
    worst_name, worst_error = None, -1.0
    for name, parameter in parameters.items():
        loom_grad = np.asarray(dump["grads"][name], dtype=np.float64)
        if list(loom_grad.shape) != list(parameter.shape):
            raise ParityFailure(f"gradient {name} has shape {list(loom_grad.shape)}; valid: {list(parameter.shape)}")
        torch_grad = parameter.grad.detach().to(torch.float64).numpy()
        torch_norm = float(np.linalg.norm(torch_grad))
        error = float(np.linalg.norm(loom_grad - torch_grad)) / max(torch_norm, np.finfo(np.float32).tiny)
        if not error <= GRADIENT_TOLERANCE:
            raise ParityFailure(f"gradient {name}: relative error {error:.3g} > {GRADIENT_TOLERANCE:g} "
                                f"(||g_loom|| {np.linalg.norm(loom_grad):.6g}, ||g_torch|| {torch_norm:.6g})")
        if error > worst_error:
            worst_name, worst_error = name, error
    print(f"gradients: {len(parameters)} tensors, worst relative error {worst_error:.3g} ({worst_name})")
    return loss_error, worst_name, worst_error


def train_losses(model, dump):
    """At each step: the loss on batch s, then backward and one AdamW update (as the loom dump does)."""
    settings = dump["optimizer"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings["lr"],
                                  betas=(settings["beta1"], settings["beta2"]), eps=settings["eps"],
                                  weight_decay=settings["weight_decay"], foreach=False)
    losses = []
    for step in range(dump["steps"]):
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(dump["tokens"][step], dump["targets"][step])
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    return losses


def compare_steps(dump, model):
    torch_losses = train_losses(model, dump)
    worst_step, worst_error = 0, -1.0
    for step, (loom_loss, torch_loss) in enumerate(zip(dump["losses"], torch_losses)):
        error = relative_error(loom_loss, torch_loss)
        print(f"step {step}: loom {loom_loss:.9g} torch {torch_loss:.9g} relative error {error:.3g}")
        if not error <= STEP_LOSS_TOLERANCE:
            raise ParityFailure(f"loss at AdamW step {step}: loom {loom_loss:.9g} torch {torch_loss:.9g} "
                                f"relative error {error:.3g} > {STEP_LOSS_TOLERANCE:g}")
        if error > worst_error:
            worst_step, worst_error = step, error
    return worst_step, worst_error


def check_parity(directory):
    """Runs every comparison on a dump; returns the summary line or raises ParityFailure."""
    dump = load_dump(directory)
    settings = dump["optimizer"]
    print(f"config {dump['config']} batch {dump['tokens'].shape[1]} steps {dump['steps']} "
          f"AdamW lr={settings['lr']:g} betas=({settings['beta1']:g}, {settings['beta2']:g}) "
          f"eps={settings['eps']:g} weight_decay={settings['weight_decay']:g}")
    loss_error, worst_name, worst_grad_error = compare_gradients(
        dump, build_model(dump["config"], dump["weights"], torch.float32))
    # Re-loaded: the gradient check's backward must not leak into the training run.
    worst_step, worst_step_error = compare_steps(
        dump, build_model(dump["config"], dump["weights"], torch.float32))
    return (f"parity passed: loss rel err {loss_error:.2g}, worst gradient rel err {worst_grad_error:.2g} "
            f"({worst_name}), worst loss rel err over {dump['steps']} AdamW steps {worst_step_error:.2g} "
            f"(step {worst_step}); tolerances {LOSS_TOLERANCE:g}/{GRADIENT_TOLERANCE:g}/{STEP_LOSS_TOLERANCE:g}")


# --------------------------------------------------------------------------------------
# --self-test: the dump written by this script, the "loom" side computed in float64.
# --------------------------------------------------------------------------------------

def make_self_test_dump(directory, config, batch, steps, lr, seed=20240531):
    rng = np.random.default_rng(seed)
    shapes = {name: list(tensor.shape) for name, tensor in GptModel(config).state_dict().items()}
    weights = {}
    for name, shape in shapes.items():
        if name.endswith(".gain"):
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith((".shift", ".bias")):
            values = 0.02 * rng.standard_normal(shape)  # non-zero: every gradient path is exercised
        else:
            values = 0.02 * rng.standard_normal(shape)
        weights[name] = values.astype(np.float32)

    # Byte-level text (this file's docstring), so that training lowers the loss like real data.
    text = np.frombuffer((__doc__ * 64).encode("utf-8"), dtype=np.uint8).astype(np.int32) % config.vocab
    starts = rng.integers(0, len(text) - config.seq - 1, size=(steps, batch))
    windows = np.stack([np.stack([text[start:start + config.seq + 1] for start in row]) for row in starts])
    tokens, targets = windows[..., :-1].copy(), windows[..., 1:].copy()

    optimizer = {"lr": lr, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    dump = {"config": config, "weights": weights, "optimizer": optimizer, "steps": steps,
            "tokens": torch.from_numpy(tokens.astype(np.int64)),
            "targets": torch.from_numpy(targets.astype(np.int64))}

    reference = build_model(config, weights, torch.float64)
    loss = reference.loss(dump["tokens"][0], dump["targets"][0])
    loss.backward()
    grads = {name: parameter.grad.numpy().astype(np.float32) for name, parameter in reference.named_parameters()}
    losses = train_losses(build_model(config, weights, torch.float64), dump)

    os.makedirs(directory, exist_ok=True)
    metadata = {"layers": config.layers, "width": config.width, "heads": config.heads, "seq": config.seq,
                "vocab": config.vocab, "batch": batch, "steps": steps,
                **{key: repr(value) for key, value in optimizer.items()}}
    write_safetensors(os.path.join(directory, "weights.safetensors"), weights, metadata)
    write_safetensors(os.path.join(directory, "batches.safetensors"), {"tokens": tokens, "targets": targets})
    write_safetensors(os.path.join(directory, "grads.safetensors"), grads, {"loss": f"{loss.item():.9g}"})
    with open(os.path.join(directory, "losses.json"), "w", encoding="utf-8") as file:
        json.dump({"losses": [float(f"{value:.9g}") for value in losses]}, file)


def expect_failure(directory, corrupt, must_mention):
    """Copies the dump, applies `corrupt`, and checks that check_parity rejects it naming the right thing."""
    with tempfile.TemporaryDirectory(prefix="loom_parity_corrupt_") as corrupted:
        for name in os.listdir(directory):
            shutil.copy(os.path.join(directory, name), corrupted)
        corrupt(corrupted)
        try:
            check_parity(corrupted)
        except ParityFailure as failure:
            if must_mention not in str(failure):
                raise ParityFailure(f"self-test: corrupted dump failed for the wrong reason: {failure} "
                                    f"(expected a mention of {must_mention!r})") from None
            print(f"(expected) parity FAILED: {failure}")
            return
    raise ParityFailure(f"self-test: a dump corrupted in {must_mention} passed the comparison")


def self_test(directory, lr):
    config = GptConfig(layers=2, width=64, heads=4, seq=32, vocab=256)
    make_self_test_dump(directory, config, batch=4, steps=10, lr=lr)
    summary = check_parity(directory)
    print(summary)

    victim = "blocks.1.attn.qkv.bias"

    def corrupt_gradient(target):
        path = os.path.join(target, "grads.safetensors")
        grads, metadata = read_safetensors(path)
        grads = {name: np.array(value) for name, value in grads.items()}
        # One element off by 1e-3 of the tensor's norm: 10x the tolerance.
        grads[victim][0] += 1e-3 * np.linalg.norm(grads[victim])
        write_safetensors(path, grads, metadata)

    def corrupt_last_loss(target):
        path = os.path.join(target, "losses.json")
        with open(path, encoding="utf-8") as file:
            losses = json.load(file)["losses"]
        losses[-1] *= 1.0 + 1e-3
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"losses": losses}, file)

    print("self-test: a gradient off by 1e-3 must fail")
    expect_failure(directory, corrupt_gradient, victim)
    print("self-test: the last step's loss off by 1e-3 must fail")
    expect_failure(directory, corrupt_last_loss, "step 9")
    return "self-test passed: f32 torch vs the f64 reference within tolerance, corrupted dumps rejected; " + summary


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", help="the dump written by `loom_gpt_dump --out DIR`")
    parser.add_argument("--self-test", action="store_true",
                        help="write a dump from an f64 reference into DIR (a temporary one if omitted) and check it")
    parser.add_argument("--lr", type=float, default=1e-3, help="--self-test only: the AdamW learning rate")
    args = parser.parse_args(argv)
    if not args.self_test and args.directory is None:
        parser.error("give the dump directory, or --self-test")

    # One thread: the check is small and runs beside other tests under ctest.
    torch.set_num_threads(1)
    try:
        if args.self_test:
            if args.directory is None:
                with tempfile.TemporaryDirectory(prefix="loom_parity_self_test_") as directory:
                    print(self_test(directory, args.lr))
            else:
                print(self_test(args.directory, args.lr))
        else:
            print(check_parity(args.directory))
    except ParityFailure as failure:
        print(f"parity FAILED: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
