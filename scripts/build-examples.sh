#!/usr/bin/env bash
# Installs a built poolscope into a prefix, builds examples/ against it with find_package, runs
# them (ctest's install.find_package_consumer does the same).
# Usage: scripts/build-examples.sh [BUILD_DIR] [PREFIX]   (defaults: build, /tmp/poolscope-prefix)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
prefix=${2:-/tmp/poolscope-prefix}
cd "$root"
cmake --install "$build" --prefix "$prefix"
ex_build=$(mktemp -d /tmp/poolscope-examples-XXXXXX)
cmake -S examples -B "$ex_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$prefix"
cmake --build "$ex_build" -j2
out=$(mktemp -d /tmp/poolscope-examples-out-XXXXXX)
# No LD_LIBRARY_PATH: the installed libraries and programs find each other through their RUNPATHs.
"$ex_build/profile_workload" "$out"
"$ex_build/host_only"
"$ex_build/distributed_add"
echo "examples OK (outputs in $out)"
