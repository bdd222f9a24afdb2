#!/usr/bin/env bash
# Installs what loom's build, tests and examples need and is missing: Debian
# packages through apt (as root, or with sudo), and the Conan client from PyPI
# into a private virtual environment. Safe to run again: it only installs
# what is absent. Set LOOM_DEPS_SKIP_CONAN=1 to skip the Conan client.
set -euo pipefail

packages=(
  build-essential cmake git          # compiler and build tools
  libboost1.81-dev                   # Boost.PFR (1.74 has no PFR)
  catch2                             # tests (Catch2 v2)
  libcli11-dev                       # train_gpt's and loom-plan's flags (CLI11)
  libopenblas-dev                    # CBLAS for host GEMM
  libopenmpi-dev openmpi-bin         # the MPI backend and mpirun
  python3 python3-venv               # the Conan client's virtual environment
  python3-torch                      # PyTorch parity test and speed comparison (/usr/bin/python3)
  curl                               # serve_gpt's test talks to it with curl
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A toolchain outside dpkg (a pyenv python, a pip cmake) counts as present.
filtered=()
for p in "${missing[@]}"; do
  case "$p" in
    cmake) command -v cmake >/dev/null 2>&1 && continue ;;
    python3) command -v python3 >/dev/null 2>&1 && continue ;;
    python3-venv) command -v python3 >/dev/null 2>&1 && python3 -c 'import venv, ensurepip' 2>/dev/null && continue ;;
    build-essential) command -v g++ >/dev/null 2>&1 && command -v make >/dev/null 2>&1 && continue ;;
    git) command -v git >/dev/null 2>&1 && continue ;;
  esac
  filtered+=("$p")
done

if [ ${#filtered[@]} -gt 0 ]; then
  echo "loom deps: installing ${filtered[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${filtered[@]}" >/dev/null
else
  echo "loom deps: all Debian packages present"
fi

# The Conan client (for the packaging test), in its own venv so that no
# system Python is modified. The tests look for it there or on PATH.
if [ "${LOOM_DEPS_SKIP_CONAN:-0}" != "1" ] && ! command -v conan >/dev/null 2>&1; then
  venv="${XDG_CACHE_HOME:-$HOME/.cache}/loom/conan-venv"
  if [ ! -x "$venv/bin/conan" ]; then
    echo "loom deps: installing the Conan client into $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check conan
  fi
  echo "loom deps: conan $("$venv/bin/conan" --version | awk '{print $3}') at $venv/bin/conan"
fi

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "loom deps: CUDA toolkit present; CUDA code will be compiled"
else
  echo "loom deps: no CUDA toolkit; loom::cuda and loom::nccl will be skipped"
fi
