#!/usr/bin/python3
"""loom's GPT against Hugging Face transformers' GPT-2: greedy tokens and logits.

    /usr/bin/python3 tests/parity/hf_gpt2.py --run --train-gpt BIN --generate-gpt BIN --greedy BIN --work DIR
    /usr/bin/python3 tests/parity/hf_gpt2.py --converter-errors DIR
    VENV_PYTHON tests/parity/hf_gpt2.py --compare DIR      (what --run calls)

--run (the ctest test, tests/parity/parity.cmake):
  1. scripts/transformers_venv.sh makes (or finds) a venv holding transformers 4.45.2 over
     Debian's torch 1.13. If that fails (no network, no python3-torch), the script prints
     "SKIPPED: <why>" and exits 77, which ctest reports as skipped.
  2. train_gpt trains a small GPT (2 layers, width 64, 4 heads, 64 positions, 256 byte tokens)
     for 300 steps on four English sentences repeated (to loss ~1.2: its greedy text varies
     from token to token, unlike a barely trained model's run of spaces) and saves a checkpoint.
  3. scripts/loom_to_hf_gpt2.py converts it into DIR/hf (config.json, model.safetensors).
  4. examples/generate_gpt --greedy writes its completions of three prompts (the user's path;
     DIR/generate_gpt.txt), and loom_gpt_greedy decodes the same prompts with the same engine
     (infer::generate, KV-cached) and writes the token ids and loom's logits (full
     recomputation) to DIR/loom.safetensors.
  5. --compare, in the venv: GPT2LMHeadModel.from_pretrained(DIR/hf), then for each prompt
     generate(do_sample=False, use_cache=True) and a full forward pass.

Checks (--compare):
  - the head is untied (lm_head and wte are different tensors) and every HF parameter was
    loaded from the file (none missing, none left over);
  - greedy tokens: transformers' equal loom's, every one of them (40 per prompt), and printed
    as generate_gpt prints them, they are generate_gpt's text;
  - logits: at every position, |loom - HF| <= LOGIT_TOLERANCE * max(1, max |HF logit|), for the
    full forward pass and for the scores generate() computed from its KV cache;
  - the comparison is not vacuous: with the first block's attention projection left in loom's
    [out, in] layout (square, so from_pretrained would load it without a word) and with the head
    tied to the token embedding (a config without tie_word_embeddings false), the logits check fails.
  It prints the worst logit error and the smallest gap between the top two logits at a greedy
  step (a gap far above the logit error: equal tokens are not luck of a near-tie).

--converter-errors writes broken checkpoints into DIR and checks that loom_to_hf_gpt2.py
  refuses each with exit status 1 and its one-line message. Standard library only.

One line on success: "hf parity passed: ..." (or "converter errors passed: ..."); on a mismatch
"hf parity FAILED: ..." and exit status 1.
"""

import json
import os
import re
import struct
import subprocess
import sys

SKIP_EXIT_CODE = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONVERTER = os.path.join(REPO, "scripts", "loom_to_hf_gpt2.py")
VENV_SCRIPT = os.path.join(REPO, "scripts", "transformers_venv.sh")

SHAPE = ["--layers", "2", "--width", "64", "--heads", "4", "--seq", "64"]
PROMPTS = ["The ", "loom trains", "tensor parallel "]
CORPUS = ("the quick brown fox jumps over the lazy dog. loom trains and serves neural networks. "
          "tensor parallel layers cut every weight matrix in two. "
          "a pipeline runs its stages on different requests at once. ") * 30
MAX_NEW = 40
# f32 on both sides with different summation orders. Measured worst relative error: 5.0e-7
# (docs/inference.md); a wrong layout or a missing bias moves logits by tens of percents.
LOGIT_TOLERANCE = 1e-4


class Failure(Exception):
    """The one line printed after 'hf parity FAILED: '."""


def run(command, what):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise Failure(f"{what} exited {result.returncode}: {result.stdout.strip()[-2000:]}")
    return result.stdout


def drive(train_gpt, generate_gpt, greedy_tool, work):
    setup = subprocess.run(["bash", VENV_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(setup.stdout.strip())
    if setup.returncode != 0:
        lines = setup.stdout.strip().splitlines() or ["transformers_venv.sh failed with no output"]
        print(f"SKIPPED: transformers is not available: {lines[-1]}")
        return SKIP_EXIT_CODE
    venv_python = subprocess.run(["bash", VENV_SCRIPT, "--print-python"], stdout=subprocess.PIPE,
                                 text=True).stdout.strip()

    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as file:
        file.write(CORPUS)
    checkpoint = os.path.join(work, "tiny.safetensors")
    trained = run([train_gpt, *SHAPE, "--batch", "8", "--steps", "300", "--lr", "1e-2", "--data", corpus,
                   "--save", checkpoint], "train_gpt")
    print(next(line for line in trained.splitlines() if line.startswith("final loss")))
    print(run([sys.executable, CONVERTER, checkpoint, os.path.join(work, "hf")], "loom_to_hf_gpt2.py").strip())
    prompt_flags = [flag for prompt in PROMPTS for flag in ("--prompt", prompt)]
    generated = run([generate_gpt, "--checkpoint", checkpoint, *SHAPE, "--greedy", "--max-new", str(MAX_NEW),
                     *prompt_flags], "generate_gpt")
    with open(os.path.join(work, "generate_gpt.txt"), "w", encoding="utf-8") as file:
        file.write(generated)
    run([greedy_tool, "--checkpoint", checkpoint, "--out", os.path.join(work, "loom.safetensors"),
         "--max-new", str(MAX_NEW), *prompt_flags], "loom_gpt_greedy")
    return subprocess.run([venv_python, os.path.abspath(__file__), "--compare", work]).returncode


def printable(tokens):
    """Tokens as generate_gpt prints them: printable bytes and newlines as they are, others as '.'."""
    return "".join(chr(t) if t == 10 or 32 <= t < 127 else "." for t in tokens)


def generate_gpt_texts(path):
    """The completions' texts in generate_gpt's output, in order."""
    with open(path, encoding="utf-8") as file:
        output = file.read()
    pieces = re.split(r"^--- completion \d+: \d+ new tokens, finished at [a-z ]+ ---\n", output, flags=re.M)
    texts = [piece.split("\n")[0] for piece in pieces[1:]]
    if len(texts) != len(PROMPTS):
        raise Failure(f"generate_gpt printed {len(texts)} completions, not {len(PROMPTS)}: {output!r}")
    return texts


# --------------------------------------------------------------------------------------
# --compare: in the venv (torch, transformers).
# --------------------------------------------------------------------------------------

def compare(work):
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    model, info = GPT2LMHeadModel.from_pretrained(os.path.join(work, "hf"), output_loading_info=True)
    model.eval()
    if any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise Failure(f"from_pretrained did not load every weight from the file: {info}")
    if model.config.tie_word_embeddings or model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr():
        raise Failure("the loaded model's head is tied to its token embedding; loom's is not")
    loom = load_file(os.path.join(work, "loom.safetensors"))
    generate_gpt = generate_gpt_texts(os.path.join(work, "generate_gpt.txt"))

    worst_absolute = 0.0

    def logit_error(loom_logits, hf_logits):
        nonlocal worst_absolute
        scale = max(1.0, hf_logits.abs().max().item())
        absolute = (loom_logits - hf_logits).abs().max().item()
        worst_absolute = max(worst_absolute, absolute)
        return absolute / scale

    worst, smallest_gap, tokens = 0.0, float("inf"), 0
    with torch.no_grad():
        for i in range(len(PROMPTS)):
            prompt = loom[f"prompt.{i}"].long()
            loom_tokens = loom[f"greedy.{i}"].long()
            loom_logits = loom[f"logits.{i}"]
            ids = prompt.unsqueeze(0)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(loom_tokens),
                                 do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None,
                                 output_scores=True, return_dict_in_generate=True)
            hf_tokens = out.sequences[0, len(prompt):]
            if hf_tokens.tolist() != loom_tokens.tolist():
                first = next((k for k, (a, b) in enumerate(zip(hf_tokens.tolist(), loom_tokens.tolist())) if a != b),
                             min(len(hf_tokens), len(loom_tokens)))
                raise Failure(f"prompt {i} {PROMPTS[i]!r}: greedy tokens differ from new token {first}: "
                              f"loom {loom_tokens.tolist()} transformers {hf_tokens.tolist()}")
            text = printable(prompt.tolist() + hf_tokens.tolist())
            if text != generate_gpt[i]:
                raise Failure(f"prompt {i} {PROMPTS[i]!r}: transformers wrote {text!r} but generate_gpt "
                              f"{generate_gpt[i]!r}")
            tokens += len(hf_tokens)
            # generate()'s scores come from its KV cache: step k predicts new token k.
            scores = torch.cat(out.scores, dim=0)
            cached = logit_error(loom_logits[len(prompt) - 1:], scores)
            sequence = torch.cat([prompt, loom_tokens[:-1]]).unsqueeze(0)
            full = model(sequence).logits[0]
            recomputed = logit_error(loom_logits, full)
            for name, error in (("KV-cached scores", cached), ("full forward", recomputed)):
                if not error <= LOGIT_TOLERANCE:
                    raise Failure(f"prompt {i} {PROMPTS[i]!r}: {name} logits differ from loom's by "
                                  f"{error:.3g} (relative to the largest logit) > {LOGIT_TOLERANCE:g}")
            worst = max(worst, cached, recomputed)
            checked_absolute = worst_absolute
            top2 = scores.topk(2, dim=-1).values
            smallest_gap = min(smallest_gap, (top2[:, 0] - top2[:, 1]).min().item())

        # Not vacuous: two wrong conversions must fail the logits check. An attention projection left in
        # loom's [out, in] layout (square, so from_pretrained loads it silently), and the head tied to the
        # embedding (what a config without tie_word_embeddings false gives).
        prompt = loom["prompt.0"].long()
        controls = {}
        c_proj = model.transformer.h[0].attn.c_proj.weight
        c_proj.copy_(c_proj.t().clone())
        controls["c_proj untransposed"] = logit_error(loom["logits.0"][:len(prompt)], model(prompt.unsqueeze(0)).logits[0])
        c_proj.copy_(c_proj.t().clone())
        model.lm_head.weight = model.transformer.wte.weight
        controls["head tied"] = logit_error(loom["logits.0"][:len(prompt)], model(prompt.unsqueeze(0)).logits[0])
        for name, error in controls.items():
            if error <= LOGIT_TOLERANCE:
                raise Failure(f"with a wrong conversion ({name}) the logits still agree ({error:.3g}); "
                              "the comparison cannot tell a wrong conversion")

    print(f"hf parity passed: transformers {transformers.__version__} on torch {torch.__version__}, "
          f"{len(PROMPTS)} prompts, {tokens} greedy tokens equal (and generate_gpt's text); worst logit error "
          f"{worst:.3g} of the largest logit (tolerance {LOGIT_TOLERANCE:g}), {checked_absolute:.3g} absolute; "
          f"smallest top-2 logit gap at a greedy step {smallest_gap:.3g}; "
          "wrong conversions (negative controls) err by "
          + ", ".join(f"{error:.3g} ({name})" for name, error in controls.items()))
    return 0


# --------------------------------------------------------------------------------------
# --converter-errors: standard library only.
# --------------------------------------------------------------------------------------

def write_safetensors(path, tensors, metadata):
    """tensors: {name: (dtype, shape, raw bytes)}."""
    header = {"__metadata__": metadata} if metadata is not None else {}
    offset, chunks = 0, []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    encoded = json.dumps(header).encode("utf-8")
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


def tiny_checkpoint(layers=1, width=4, heads=2, seq=8, vocab=16):
    """A well-formed loom checkpoint of zeros: (tensors, metadata)."""
    C, V, T = width, vocab, seq
    shapes = {"embed.token": [V, C], "embed.position": [T, C]}
    for i in range(layers):
        b = f"blocks.{i}."
        shapes.update({b + "ln1.gain": [C], b + "ln1.shift": [C], b + "attn.qkv.weight": [3 * C, C],
                       b + "attn.qkv.bias": [3 * C], b + "attn.proj.weight": [C, C], b + "attn.proj.bias": [C],
                       b + "ln2.gain": [C], b + "ln2.shift": [C], b + "mlp.fc.weight": [4 * C, C],
                       b + "mlp.fc.bias": [4 * C], b + "mlp.proj.weight": [C, 4 * C], b + "mlp.proj.bias": [C]})
    shapes.update({"ln_f.gain": [C], "ln_f.shift": [C], "head.weight": [V, C]})
    tensors = {}
    for name, shape in shapes.items():
        count = 1
        for extent in shape:
            count *= extent
        tensors[name] = ("F32", shape, bytes(4 * count))
    metadata = {"format": "loom-gpt-checkpoint-1", "layers": str(layers), "width": str(width),
                "heads": str(heads), "seq": str(seq), "vocab": str(vocab), "step": "0"}
    return tensors, metadata


def converter_errors(work):
    os.makedirs(work, exist_ok=True)
    cases = []

    def case(what, name, expected):
        cases.append((what, os.path.join(work, name), expected))

    path = os.path.join(work, "short.safetensors")
    with open(path, "wb") as file:
        file.write(b"loom")
    case("a 4-byte file", "short.safetensors", "has 4 bytes, fewer than safetensors' 8-byte header length")
    with open(os.path.join(work, "text.safetensors"), "wb") as file:
        file.write(b"this is a text file, not a checkpoint\n")
    case("a text file", "text.safetensors", "does not fit the file's 38 bytes; it is not a safetensors file")
    with open(os.path.join(work, "notjson.safetensors"), "wb") as file:
        file.write(struct.pack("<Q", 4) + b"{{{{")
    case("a header that is not JSON", "notjson.safetensors", "the safetensors header is not JSON")
    tensors, metadata = tiny_checkpoint()
    write_safetensors(os.path.join(work, "hf_model.safetensors"), tensors, {"format": "pt"})
    case("another model's safetensors", "hf_model.safetensors",
         "has metadata format 'pt', not 'loom-gpt-checkpoint-1'; give a train_gpt --save checkpoint")
    write_safetensors(os.path.join(work, "sharded.safetensors"), tensors, dict(metadata, format="loom-gpt-sharded-1"))
    case("a sharded checkpoint's shard format", "sharded.safetensors",
         "has metadata format 'loom-gpt-sharded-1', not 'loom-gpt-checkpoint-1'")
    write_safetensors(os.path.join(work, "badwidth.safetensors"), tensors, dict(metadata, width="four"))
    case("a metadata width that is no number", "badwidth.safetensors",
         "metadata 'width' is 'four'; expected a whole number >= 1")
    write_safetensors(os.path.join(work, "badheads.safetensors"), tensors, dict(metadata, heads="3"))
    case("heads that do not divide the width", "badheads.safetensors", "metadata heads 3 does not divide width 4")
    missing = dict(tensors)
    del missing["head.weight"]
    write_safetensors(os.path.join(work, "nohead.safetensors"), missing, metadata)
    case("a checkpoint without its head", "nohead.safetensors",
         "has no tensor 'head.weight'; it is not a complete loom GPT checkpoint of "
         "GPT(layers=1, width=4, heads=2, seq=8, vocab=16)")
    wrong_dtype = dict(tensors)
    wrong_dtype["ln_f.gain"] = ("F16", [4], bytes(8))
    write_safetensors(os.path.join(work, "f16.safetensors"), wrong_dtype, metadata)
    case("an F16 tensor", "f16.safetensors", "tensor ln_f.gain has dtype 'F16'; valid: 'F32'")
    write_safetensors(os.path.join(work, "layers2.safetensors"), tensors, dict(metadata, layers="2"))
    case("metadata saying more layers than the tensors", "layers2.safetensors", "has no tensor 'blocks.1.ln1.gain'")
    wrong_shape = dict(tensors)
    wrong_shape["blocks.0.attn.qkv.weight"] = ("F32", [4, 12], bytes(4 * 48))
    write_safetensors(os.path.join(work, "transposed.safetensors"), wrong_shape, metadata)
    case("a transposed qkv weight", "transposed.safetensors",
         "tensor blocks.0.attn.qkv.weight has shape [4, 12]; GPT(layers=1, width=4, heads=2, seq=8, vocab=16) "
         "needs [12, 4]")
    truncated = os.path.join(work, "truncated.safetensors")
    write_safetensors(truncated, tensors, metadata)
    with open(truncated, "r+b") as file:
        file.truncate(os.path.getsize(truncated) - 4)
    case("a truncated file", "truncated.safetensors", "data_offsets")
    case("a directory", "", "is a directory (a --sharded checkpoint?)")
    case("a missing file", "absent.safetensors", "cannot read")

    for what, path, expected in cases:
        result = subprocess.run([sys.executable, CONVERTER, path, os.path.join(work, "out")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = result.stderr.strip().splitlines()
        if result.returncode != 1 or len(lines) != 1 or not lines[0].startswith("loom_to_hf_gpt2: ") \
                or expected not in lines[0]:
            raise Failure(f"converter on {what}: exit {result.returncode}, stderr {result.stderr.strip()!r}; "
                          f"expected exit 1 and one line containing {expected!r}")
        print(f"{what}: {lines[0]}")
    # The well-formed one converts.
    good = os.path.join(work, "good.safetensors")
    write_safetensors(good, tensors, metadata)
    run([sys.executable, CONVERTER, good, os.path.join(work, "out")], "loom_to_hf_gpt2.py on a good checkpoint")
    with open(os.path.join(work, "out", "config.json"), encoding="utf-8") as file:
        config = json.load(file)
    if config["tie_word_embeddings"] is not False or config["n_embd"] != 4 or config["layer_norm_epsilon"] != 1e-5:
        raise Failure(f"config.json of the good checkpoint: {config}")
    usage = subprocess.run([sys.executable, CONVERTER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if usage.returncode != 2 or "usage: loom_to_hf_gpt2.py CHECKPOINT OUTDIR" not in usage.stderr:
        raise Failure(f"converter without arguments: exit {usage.returncode}, stderr {usage.stderr!r}")
    print(f"converter errors passed: {len(cases)} bad inputs refused with their message, a good one converted")
    return 0


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "--compare":
            return compare(argv[2])
        if len(argv) == 3 and argv[1] == "--converter-errors":
            return converter_errors(argv[2])
        flags = ["--train-gpt", "--generate-gpt", "--greedy", "--work"]
        if len(argv) == 10 and argv[1] == "--run" and argv[2:10:2] == flags:
            return drive(*argv[3:10:2])
    except Failure as failure:
        print(f"hf parity FAILED: {failure}")
        return 1
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
