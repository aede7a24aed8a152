#!/usr/bin/env bash
# Quick start 1: build poolscope and run the demo (on the GPUs present, host devices otherwise).
#   scripts/demo.sh [poolscope demo options...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh" "$root/build" >/dev/null
exec "$root/build/bin/poolscope" demo "$@"
