#!/usr/bin/env bash
# Installs current Hugging Face transformers from PyPI over current PyTorch
# (scripts/torch_venv.sh's venv, reused through a .pth file rather than a
# second several-GiB torch), the peer bench/generate_transformers.py measures
# loom's generation against. scripts/transformers_venv.sh stays for the
# parity test: it pins transformers 4.45.2 on Debian's torch 1.13, a 2022
# PyTorch, which a speed claim must not be measured against. Safe to run
# again: it installs only what is absent, then prints the versions.
#
#   scripts/transformers_current_venv.sh [--print-python] [--help]
#
#   --print-python  print the venv's interpreter if transformers and torch
#                   import there (exit 0), else nothing (exit 1); installs nothing
#
# Where: $LOOM_HF_CURRENT_VENV, else ${XDG_CACHE_HOME:-~/.cache}/loom/hf-current-venv.
set -euo pipefail

venv="${LOOM_HF_CURRENT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/hf-current-venv}"
print_python=0
for arg in "$@"; do
  case "$arg" in
    --print-python) print_python=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "transformers_current_venv.sh: unknown argument '$arg'; valid are --print-python, --help" >&2; exit 2 ;;
  esac
done

python="$venv/bin/python"
both_import() { [ -x "$python" ] && "$python" -c 'import torch, transformers' >/dev/null 2>&1; }
if [ "$print_python" = 1 ]; then
  both_import && { echo "$python"; exit 0; }
  exit 1
fi

here="$(cd "$(dirname "$0")" && pwd)"
"$here/torch_venv.sh" >/dev/null   # current PyTorch first (installs it if absent)
torch_python="$("$here/torch_venv.sh" --print-python)"
torch_site="$("$torch_python" -c 'import site; print(site.getsitepackages()[0])')"

if [ ! -x "$python" ]; then
  echo "transformers venv (current): creating $venv"
  mkdir -p "$(dirname "$venv")"
  "${LOOM_TORCH_BASE_PYTHON:-/usr/bin/python3}" -m venv "$venv"
fi
# The torch venv's packages, seen from this venv (torch, numpy and their libraries).
site="$("$python" -c 'import site; print(site.getsitepackages()[0])')"
echo "$torch_site" > "$site/torch_venv.pth"
if ! both_import; then
  echo "transformers venv (current): installing transformers from PyPI into $venv"
  "$python" -m pip --disable-pip-version-check install --quiet transformers
fi
"$python" -c 'import torch, transformers; print("transformers venv (current):", "transformers", transformers.__version__, "on torch", torch.__version__)'
echo "transformers venv (current): $python"
