#!/usr/bin/env bash
# Installs what poolscope needs (Debian/Ubuntu, as root), then configures and builds it.
#   scripts/bootstrap.sh [BUILD_DIR] [extra cmake args...]
# Used by scripts/demo.sh, scripts/test.sh and .ci/run; safe to run again (nothing is
# reinstalled). Environment: POOLSCOPE_BUILD_TYPE (RelWithDebInfo), POOLSCOPE_JOBS (nproc),
# POOLSCOPE_TARGETS (space-separated targets to build; default: all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
shift || true

# Debian package -> a file that proves it is installed.
declare -A need=(
  [cmake]=/usr/bin/cmake
  [ninja-build]=/usr/bin/ninja
  [g++]=/usr/bin/g++
  [pkg-config]=/usr/bin/pkg-config
  [libgtest-dev]=/usr/include/gtest/gtest.h
  [libbenchmark-dev]=/usr/include/benchmark/benchmark.h
  [nlohmann-json3-dev]=/usr/include/nlohmann/json.hpp
  [libcli11-dev]=/usr/include/CLI/CLI.hpp
  [libdw-dev]=/usr/include/elfutils/libdwfl.h
  [libunwind-dev]=/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)/pkgconfig/libunwind.pc
  [ccache]=/usr/bin/ccache
  # MPI: DistributedArrays across the processes of a launch, and the tests that run under mpirun.
  [libopenmpi-dev]=/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)/openmpi/include/mpi.h
  [openmpi-bin]=/usr/bin/mpirun
)
missing=()
for pkg in "${!need[@]}"; do
  [ -e "${need[$pkg]}" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "poolscope: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || true
    # libdw/libunwind are optional (stack symbolization degrades without them), ccache too (it
    # lets .ci/run's sanitizer builds reuse step 1's CUDA objects): never fatal.
    required=(); optional=()
    for pkg in "${missing[@]}"; do
      case "$pkg" in libdw-dev|libunwind-dev|ccache) optional+=("$pkg") ;; *) required+=("$pkg") ;; esac
    done
    [ ${#required[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${required[@]}"
    [ ${#optional[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${optional[@]}" ||
      echo "poolscope: optional ${optional[*]} not installed (stacks as module+offset without libdw/libunwind, no compiler cache without ccache)"
  else
    echo "poolscope: missing packages: ${missing[*]} (run as root to install them, or install them yourself)" >&2
  fi
fi

if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
jobs="${POOLSCOPE_JOBS:-$(nproc)}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${POOLSCOPE_BUILD_TYPE:-RelWithDebInfo}" \
  "${launcher[@]}" "$@"
targets=()
for t in ${POOLSCOPE_TARGETS:-}; do
  targets+=(--target "$t")
done
cmake --build "$build" -j "$jobs" "${targets[@]}"
