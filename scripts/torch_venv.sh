#!/usr/bin/env bash
# Installs current PyTorch from PyPI into a private virtual environment, the
# peer that bench/train_gpt measures loom against. Debian's python3-torch
# (1.13, OpenBLAS, no scaled_dot_product_attention, no torch.compile) stays
# only for the parity test; a speed claim against it would be a claim against
# a 2022 PyTorch. Safe to run again: it installs only what is absent (or what
# --upgrade asks for) and then prints what the venv holds.
#
#   scripts/torch_venv.sh [--upgrade] [--dry-run] [--print-python] [--help]
#
#   --upgrade       reinstall torch at PyPI's newest version if a newer one exists
#   --dry-run       say what would be done, change nothing, exit 0
#   --print-python  print the venv's interpreter path if torch imports there
#                   (exit 0), else nothing (exit 1); installs nothing
#
# Where: $LOOM_TORCH_VENV, else ${XDG_CACHE_HOME:-~/.cache}/loom/torch-venv.
# PyPI's Linux x86-64 torch wheel is the CUDA build: pip brings its nvidia-*
# wheels (several GiB) with it, and the wheel's libraries are linked against
# them, so `--no-deps` would give a torch that does not import. PyPI has no
# CPU-only Linux torch; the CPU wheels live on another index, which this
# machine does not reach. So the size is accepted; the GPU libraries are
# loaded but not used on a CPU-only machine, and the CPU kernels (MKL, oneDNN)
# are the same as in the CPU wheel.
set -euo pipefail

venv="${LOOM_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/torch-venv}"
upgrade=0 dry_run=0 print_python=0
for arg in "$@"; do
  case "$arg" in
    --upgrade) upgrade=1 ;;
    --dry-run) dry_run=1 ;;
    --print-python) print_python=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "torch_venv.sh: unknown argument '$arg'; valid are --upgrade, --dry-run, --print-python, --help" >&2; exit 2 ;;
  esac
done

python="$venv/bin/python"
torch_imports() { [ -x "$python" ] && "$python" -c 'import torch' >/dev/null 2>&1; }

if [ "$print_python" = 1 ]; then
  torch_imports && { echo "$python"; exit 0; }
  exit 1
fi

# The interpreter the venv is made from: Debian's, which every loom machine
# has (scripts/deps.sh installs python3-venv); torch.compile also needs its
# headers (python3-dev) and g++ to build its generated C++ kernels.
base="${LOOM_TORCH_BASE_PYTHON:-/usr/bin/python3}"
[ -x "$base" ] || base="$(command -v python3)"

if [ "$dry_run" = 1 ]; then
  if torch_imports; then
    echo "torch venv: $venv holds torch $("$python" -c 'import torch; print(torch.__version__)'); would $([ $upgrade = 1 ] && echo 'upgrade it if PyPI has newer' || echo 'change nothing')"
  else
    echo "torch venv: would create $venv from $base and pip install torch from PyPI (several GiB with its nvidia-* wheels)"
  fi
  exit 0
fi

if [ ! -x "$python" ]; then
  echo "torch venv: creating $venv from $base"
  mkdir -p "$(dirname "$venv")"
  "$base" -m venv "$venv"
fi
pip=("$python" -m pip --disable-pip-version-check)
if ! torch_imports; then
  echo "torch venv: installing torch from PyPI into $venv (several GiB with its nvidia-* wheels; minutes)"
  "${pip[@]}" install --quiet --upgrade pip
  "${pip[@]}" install --quiet torch numpy
elif [ "$upgrade" = 1 ]; then
  echo "torch venv: upgrading torch from PyPI"
  "${pip[@]}" install --quiet --upgrade torch numpy
fi

# What is installed: the same line bench/train_gpt prints (version, MKL,
# oneDNN, the CPU capability PyTorch dispatches to), then torch's own build
# summary of its CPU libraries.
here="$(cd "$(dirname "$0")/.." && pwd)"
echo "torch venv: $python"
"$python" "$here/bench/train_gpt_torch.py" --info
config="$("$python" -c 'import torch; print(torch.__config__.show())')"
grep -E "Math Kernel|MKL-DNN|OpenMP|CPU capability" <<<"$config" | sed 's/^ *- */  /'
echo "  $(grep -oE "BLAS_INFO=[A-Za-z0-9_]+" <<<"$config" | head -1), $(grep -oE "LAPACK_INFO=[A-Za-z0-9_]+" <<<"$config" | head -1)"
