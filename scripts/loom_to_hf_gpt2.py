#!/usr/bin/env python3
"""Converts a loom GPT checkpoint into a Hugging Face transformers GPT-2 model directory.

    scripts/loom_to_hf_gpt2.py CHECKPOINT OUTDIR

CHECKPOINT is a train_gpt --save file (safetensors, metadata format "loom-gpt-checkpoint-1").
OUTDIR gets config.json and model.safetensors, which
`transformers.GPT2LMHeadModel.from_pretrained(OUTDIR)` loads (docs/inference.md, "Parity with
transformers"). Only the standard library is used: safetensors is read and written directly
(an 8-byte little-endian header length, a JSON header, the raw data).

loom's GPT is GPT-2's architecture with an untied head: token + learned position embeddings,
pre-LayerNorm blocks (eps 1e-5), tanh GELU ("gelu_new"), a final LayerNorm and a head with no
bias. What differs is only the layout: loom's Linear weights are [out, in] (PyTorch's), GPT-2's
Conv1D weights are [in, out], so every block matrix is transposed; the packed qkv is q, k, v
one after the other, each head-major, which is c_attn's order. The AdamW moments
("optimizer.*") and any other extra tensors are left behind.

Exit status: 0; 1 with one line "loom_to_hf_gpt2: ..." on stderr for a file that is not a
loom GPT checkpoint (naming what is wrong) or an OUTDIR that cannot be written; 2 for bad usage.
"""

import array
import json
import os
import struct
import sys

FORMAT = "loom-gpt-checkpoint-1"
LAYER_NORM_EPS = 1e-5  # nn::LayerNorm::make's default, which gpt::make_model uses
CONFIG_KEYS = ("layers", "width", "heads", "seq", "vocab")
MAX_HEADER_BYTES = 100 * 1024 * 1024


class ConversionError(Exception):
    """One line saying what is wrong with the input or the output directory."""


def read_checkpoint(path):
    """Returns (config dict, {name: (shape, array('f'))}) for the parameters of a loom GPT checkpoint."""
    if os.path.isdir(path):
        raise ConversionError(f"{path} is a directory (a --sharded checkpoint?); give a single-file "
                              "train_gpt --save checkpoint")
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise ConversionError(f"cannot read {path}: {error.strerror}") from None
    if len(data) < 8:
        raise ConversionError(f"{path} has {len(data)} bytes, fewer than safetensors' 8-byte header length; "
                              "it is not a loom GPT checkpoint")
    (header_length,) = struct.unpack_from("<Q", data, 0)
    if header_length > MAX_HEADER_BYTES or 8 + header_length > len(data):
        raise ConversionError(f"{path}: header length {header_length} does not fit the file's {len(data)} bytes; "
                              "it is not a safetensors file")
    try:
        header = json.loads(data[8:8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ConversionError(f"{path}: the safetensors header is not JSON; it is not a loom GPT checkpoint") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{path}: the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if metadata.get("format") != FORMAT:
        raise ConversionError(f"{path} has metadata format {metadata.get('format')!r}, not {FORMAT!r}; "
                              "give a train_gpt --save checkpoint")
    config = {}
    for key in CONFIG_KEYS:
        text = metadata.get(key)
        if not isinstance(text, str) or not text.isdigit() or int(text) < 1:
            raise ConversionError(f"{path}: metadata {key!r} is {text!r}; expected a whole number >= 1")
        config[key] = int(text)
    if config["width"] % config["heads"] != 0:
        raise ConversionError(f"{path}: metadata heads {config['heads']} does not divide width {config['width']}")

    body = memoryview(data)[8 + header_length:]
    tensors = {}
    for name, shape in expected_shapes(config).items():
        entry = header.get(name)
        if not isinstance(entry, dict):
            raise ConversionError(f"{path} has no tensor {name!r}; it is not a complete loom GPT checkpoint of "
                                  f"{describe(config)}")
        if entry.get("dtype") != "F32":
            raise ConversionError(f"{path}: tensor {name} has dtype {entry.get('dtype')!r}; valid: 'F32'")
        if list(entry.get("shape", [])) != shape:
            raise ConversionError(f"{path}: tensor {name} has shape {entry.get('shape')}; {describe(config)} "
                                  f"needs {shape}")
        begin, end = entry.get("data_offsets", [-1, -1])
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(body)
                and end - begin == 4 * product(shape)):
            raise ConversionError(f"{path}: tensor {name} data_offsets [{begin}, {end}] do not hold {shape} F32 "
                                  f"inside the {len(body)}-byte data section")
        values = array.array("f")
        values.frombytes(body[begin:end])
        if sys.byteorder != "little":
            values.byteswap()
        tensors[name] = (shape, values)
    return config, tensors


def expected_shapes(config):
    """loom's parameter names (gpt::parameter_names) and shapes; Linear weights [out, in]."""
    C, V, T = config["width"], config["vocab"], config["seq"]
    shapes = {"embed.token": [V, C], "embed.position": [T, C]}
    for i in range(config["layers"]):
        b = f"blocks.{i}."
        shapes.update({b + "ln1.gain": [C], b + "ln1.shift": [C],
                       b + "attn.qkv.weight": [3 * C, C], b + "attn.qkv.bias": [3 * C],
                       b + "attn.proj.weight": [C, C], b + "attn.proj.bias": [C],
                       b + "ln2.gain": [C], b + "ln2.shift": [C],
                       b + "mlp.fc.weight": [4 * C, C], b + "mlp.fc.bias": [4 * C],
                       b + "mlp.proj.weight": [C, 4 * C], b + "mlp.proj.bias": [C]})
    shapes.update({"ln_f.gain": [C], "ln_f.shift": [C], "head.weight": [V, C]})
    return shapes


def describe(config):
    return "GPT(" + ", ".join(f"{key}={config[key]}" for key in CONFIG_KEYS) + ")"


def product(shape):
    result = 1
    for extent in shape:
        result *= extent
    return result


def transposed(shape, values):
    """[rows, cols] -> ([cols, rows], the transpose): column j of the input is values[j::cols]."""
    rows, cols = shape
    out = array.array("f")
    for j in range(cols):
        out.extend(values[j::cols])
    return [cols, rows], out


def to_hf(config, tensors):
    """{HF GPT2LMHeadModel name: (shape, array)}."""
    hf = {"transformer.wte.weight": tensors["embed.token"], "transformer.wpe.weight": tensors["embed.position"]}
    for i in range(config["layers"]):
        b, h = f"blocks.{i}.", f"transformer.h.{i}."
        hf.update({h + "ln_1.weight": tensors[b + "ln1.gain"], h + "ln_1.bias": tensors[b + "ln1.shift"],
                   h + "attn.c_attn.weight": transposed(*tensors[b + "attn.qkv.weight"]),
                   h + "attn.c_attn.bias": tensors[b + "attn.qkv.bias"],
                   h + "attn.c_proj.weight": transposed(*tensors[b + "attn.proj.weight"]),
                   h + "attn.c_proj.bias": tensors[b + "attn.proj.bias"],
                   h + "ln_2.weight": tensors[b + "ln2.gain"], h + "ln_2.bias": tensors[b + "ln2.shift"],
                   h + "mlp.c_fc.weight": transposed(*tensors[b + "mlp.fc.weight"]),
                   h + "mlp.c_fc.bias": tensors[b + "mlp.fc.bias"],
                   h + "mlp.c_proj.weight": transposed(*tensors[b + "mlp.proj.weight"]),
                   h + "mlp.c_proj.bias": tensors[b + "mlp.proj.bias"]})
    hf.update({"transformer.ln_f.weight": tensors["ln_f.gain"], "transformer.ln_f.bias": tensors["ln_f.shift"],
               "lm_head.weight": tensors["head.weight"]})
    return hf


def hf_config(config):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config["vocab"],
        "n_positions": config["seq"],
        "n_embd": config["width"],
        "n_layer": config["layers"],
        "n_head": config["heads"],
        "n_inner": None,  # 4 * n_embd, as loom's MLP
        "activation_function": "gelu_new",  # tanh GELU, nn::Gelu
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "tie_word_embeddings": False,  # loom's head is its own matrix
        "scale_attn_weights": True,  # scores / sqrt(head dim), as loom
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,  # loom trains without dropout
        "initializer_range": 0.02,
        "bos_token_id": None, "eos_token_id": None,  # byte tokens: no special ones
        "use_cache": True,
        "torch_dtype": "float32",
    }


def write_safetensors(path, tensors):
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, values) in tensors.items():
        size = 4 * len(values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    temporary = path + ".partial"
    with open(temporary, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for _, values in tensors.values():
            if sys.byteorder != "little":
                values = array.array("f", values)
                values.byteswap()
            values.tofile(file)
    os.replace(temporary, path)


def convert(checkpoint, outdir):
    config, tensors = read_checkpoint(checkpoint)
    hf = to_hf(config, tensors)
    try:
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, "config.json"), "w", encoding="utf-8") as file:
            json.dump(hf_config(config), file, indent=2)
            file.write("\n")
        write_safetensors(os.path.join(outdir, "model.safetensors"), hf)
    except OSError as error:
        raise ConversionError(f"cannot write {outdir}: {error.strerror} ({error.filename})") from None
    return config


def main(argv):
    if argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 3:
        print("usage: loom_to_hf_gpt2.py CHECKPOINT OUTDIR (--help says more)", file=sys.stderr)
        return 2
    try:
        config = convert(argv[1], argv[2])
    except ConversionError as error:
        print(f"loom_to_hf_gpt2: {error}", file=sys.stderr)
        return 1
    print(f"loom_to_hf_gpt2: {describe(config)} from {argv[1]} written to {argv[2]} "
          "(config.json, model.safetensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
