#!/usr/bin/env bash
# Quick start 2: build poolscope and run every test (GPU tests skip when no GPU is present).
#   scripts/test.sh [ctest options...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${POOLSCOPE_BUILD_DIR:-$root/build}"
"$root/scripts/bootstrap.sh" "$build"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900 "$@"
