#!/usr/bin/env bash
# Installs Hugging Face transformers from PyPI into a private virtual
# environment that sees Debian's python3-torch (1.13, made with
# --system-site-packages), for the parity test of scripts/loom_to_hf_gpt2.py
# (tests/parity/hf_gpt2.py, docs/inference.md). The test calls this script
# itself, so a fresh machine needs nothing beyond scripts/deps.sh and PyPI.
# Safe to run again: it installs only when transformers does not import.
#
#   scripts/transformers_venv.sh [--print-python] [--help]
#
#   --print-python  print the venv's interpreter if transformers and torch
#                   import there (exit 0), else nothing (exit 1); installs nothing
#
# Where: $LOOM_TRANSFORMERS_VENV, else ${XDG_CACHE_HOME:-~/.cache}/loom/transformers-venv.
# The version is pinned: transformers 4.45.2 is the newest that generates on
# Debian's torch 1.13 under Python 3.11. From 4.46.0 on, generate() imports
# torch.distributed.fsdp, which fails to import in that torch on Python 3.11
# (a dataclass with a mutable default); 5.x needs torch >= 2. numpy stays
# Debian's (< 2), which torch 1.13 was built against. About 40 s and 160 MB
# (transformers, tokenizers, safetensors, huggingface_hub, regex).
# Exit status: 0 installed (or already there); 1 with one line saying why not
# (no python3-torch, no venv module, PyPI unreachable).
set -euo pipefail

version="4.45.2"
venv="${LOOM_TRANSFORMERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/transformers-venv}"
print_python=0
for arg in "$@"; do
  case "$arg" in
    --print-python) print_python=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "transformers_venv.sh: unknown argument '$arg'; valid are --print-python, --help" >&2; exit 2 ;;
  esac
done

python="$venv/bin/python"
ready() {
  [ -x "$python" ] && "$python" -c "import torch, transformers, sys; sys.exit(transformers.__version__ != '$version')" \
    >/dev/null 2>&1
}

if [ "$print_python" = 1 ]; then
  ready && { echo "$python"; exit 0; }
  exit 1
fi
ready && { echo "transformers venv: transformers $version ready at $python"; exit 0; }

base="${LOOM_TRANSFORMERS_BASE_PYTHON:-/usr/bin/python3}"
if ! "$base" -c 'import torch' >/dev/null 2>&1; then
  echo "transformers venv: $base cannot import torch; install Debian's python3-torch (scripts/deps.sh)"
  exit 1
fi

# Two test runs at once (ctest -j) must not install into the same venv together.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
ready && { echo "transformers venv: transformers $version ready at $python"; exit 0; }

if [ ! -x "$python" ]; then
  if ! error="$("$base" -m venv --system-site-packages "$venv" 2>&1)"; then
    echo "transformers venv: '$base -m venv' failed (install python3-venv): $(tail -n 1 <<<"$error")"
    exit 1
  fi
fi
echo "transformers venv: installing transformers $version from PyPI into $venv (about 40 s)"
# Short timeouts: without a network, pip gives up in seconds rather than minutes.
if ! error="$("$python" -m pip install --quiet --disable-pip-version-check --timeout 15 --retries 1 \
                "transformers==$version" "numpy<2" 2>&1)"; then
  echo "transformers venv: pip could not install transformers $version (is PyPI reachable?): $(grep -v '^ *$' <<<"$error" | tail -n 1)"
  exit 1
fi
if ! ready; then
  echo "transformers venv: transformers $version installed but 'import torch, transformers' fails in $python"
  exit 1
fi
echo "transformers venv: transformers $version ready at $python"
