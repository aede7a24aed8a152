#!/usr/bin/env bash
# Quick start 2: build poolscope and run every test (GPU tests skip when no GPU is present), then
# print a summary: passed / failed / skipped counts, the skips grouped by reason, failed tests by
# name (scripts/test_summary.py, from ctest's JUnit file).
#   scripts/test.sh [ctest options...]
# Exit code: ctest's (0 when every test that ran passed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${POOLSCOPE_BUILD_DIR:-$root/build}"
"$root/scripts/bootstrap.sh" "$build"
junit="$build/Testing/junit.xml"
mkdir -p "$build/Testing"
rm -f "$junit"
rc=0
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900 --output-junit "$junit" \
  "$@" || rc=$?
echo
if [ -s "$junit" ] && command -v python3 >/dev/null; then
  python3 "$root/scripts/test_summary.py" "$junit"
else
  echo "summary: see ctest's counts above (no JUnit file, or no python3 to read it)"
fi
exit "$rc"
