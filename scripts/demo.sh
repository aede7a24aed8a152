#!/usr/bin/env bash
# Quick start 1: build what the demo needs (the poolscope command and the libraries it links,
# not the tests), then run `poolscope demo` (on the GPUs present, host devices otherwise).
#   scripts/demo.sh [poolscope demo options...]
# The build shows its progress condensed (one line that updates on a terminal; otherwise a line
# every tenth of the way); its whole log is build/demo-build.log. The first build from an empty
# compiler cache takes about 9 minutes on 2 cores (README, "Quick start").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${POOLSCOPE_BUILD_DIR:-$root/build}"
mkdir -p "$build"
log="$build/demo-build.log"
tty=0
[ -t 2 ] && tty=1
start=$SECONDS
echo "poolscope: building the demo (log: $log)" >&2
# ninja's "[n/N] Building CXX object .../x.cpp.o" lines, condensed to the count and the file.
condense() {
  awk -v tty="$tty" '
    match($0, /^\[[0-9]+\/[0-9]+\]/) {
      split(substr($0, 2, RLENGTH - 2), nn, "/")
      file = $NF; sub(/.*\//, "", file); sub(/\.o$/, "", file)
      if (tty) {
        printf "\r\033[K  [%d/%d] %s", nn[1], nn[2], file > "/dev/stderr"
      } else if (nn[1] == nn[2] || nn[1] - last >= nn[2] / 10) {
        printf "  [%d/%d] %s\n", nn[1], nn[2], file > "/dev/stderr"
        last = nn[1]
      }
      next
    }
    /^poolscope: / { print > "/dev/stderr" }   # packages being installed
    END { if (tty) printf "\r\033[K" > "/dev/stderr" }'
}
if ! POOLSCOPE_TARGETS=poolscope_cli "$root/scripts/bootstrap.sh" "$build" 2>&1 | tee "$log" |
  condense; then
  echo "poolscope: the build failed; its last lines (whole log: $log):" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
echo "poolscope: built in $((SECONDS - start)) s; running poolscope demo $*" >&2
exec "$build/bin/poolscope" demo "$@"
