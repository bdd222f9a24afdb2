#!/usr/bin/env bash
# `conan create` of loom's recipe, offline, in a private Conan home, against
# the system's Boost and OpenBLAS (conan/profiles/loom-debian12); once plain
# and once with the MPI backend when MPI is present. Exit 77 (ctest: skipped)
# when the conan client is not installed.
set -euo pipefail
source_dir=$1
work_dir=$2
with_mpi=${3:-OFF}
conan=${4:-conan}
if [ -z "$conan" ] || [[ "$conan" == *NOTFOUND ]] || ! "$conan" --version >/dev/null 2>&1; then
  echo "SKIPPED: the conan client is not installed (scripts/deps.sh installs it)"
  exit 77
fi
rm -rf "$work_dir"
mkdir -p "$work_dir"
export CONAN_HOME="$work_dir/conan-home"
"$conan" profile detect --exist-ok >/dev/null
profile="$source_dir/conan/profiles/loom-debian12"
# test_package builds in the source tree's test_package/build; keep the
# checkout clean by packaging a copy.
cp -r "$source_dir/conanfile.py" "$source_dir/test_package" "$source_dir/include" "$source_dir/cmake" \
      "$source_dir/CMakeLists.txt" "$source_dir/LICENSE" "$source_dir/conan" "$work_dir/"
rm -rf "$work_dir/test_package/build"
cd "$work_dir"
"$conan" create . -pr:h "conan/profiles/loom-debian12" --no-remote
if [ "$with_mpi" = "ON" ] || [ "$with_mpi" = "TRUE" ]; then
  "$conan" create . -pr:h "conan/profiles/loom-debian12" --no-remote -o "loom/*:with_mpi=True"
fi
echo "conan create passed offline"
