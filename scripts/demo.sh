#!/usr/bin/env bash
# Quick start 1: build what the demo needs (the poolscope command and the libraries it links,
# not the tests), then run `poolscope demo` (on the GPUs present, host devices otherwise).
#   scripts/demo.sh [poolscope demo options...]
# The build shows its progress condensed (one line that updates on a terminal; otherwise a line
# every tenth of the way); its whole log is build/demo-build.log. The first build from an empty
# compiler cache takes about 5 minutes on 2 idle cores (README, "Quick start").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${POOLSCOPE_BUILD_DIR:-$root/build}"
mkdir -p "$build"
log="$build/demo-build.log"
tty=0
[ -t 2 ] && tty=1
start=$SECONDS
echo "poolscope: building the demo (log: $log)" >&2
# ninja's "[n/N] Building CXX object .../x.cpp.o" lines, condensed to the count, the file and the
# time so far (read line by line: an awk reading a pipe may hold its lines back until the end).
condense() {
  local line n total file last=0
  while IFS= read -r line; do
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\  ]]; then
      n=${BASH_REMATCH[1]}
      total=${BASH_REMATCH[2]}
      file=${line##*/}
      file=${file%.o}
      if [ "$tty" = 1 ]; then
        printf '\r\033[K  [%d/%d] %d s  %s' "$n" "$total" $((SECONDS - start)) "$file" >&2
      elif [ "$n" = "$total" ] || [ $((n - last)) -ge $((total / 10 > 0 ? total / 10 : 1)) ]; then
        printf '  [%d/%d] %d s  %s\n' "$n" "$total" $((SECONDS - start)) "$file" >&2
        last=$n
      fi
    elif [[ $line == "poolscope: "* ]]; then
      printf '%s\n' "$line" >&2 # packages being installed
    fi
  done
  if [ "$tty" = 1 ]; then
    printf '\r\033[K' >&2
  fi
}
if ! POOLSCOPE_TARGETS=poolscope_cli "$root/scripts/bootstrap.sh" "$build" 2>&1 | tee "$log" |
  condense; then
  echo "poolscope: the build failed; its last lines (whole log: $log):" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
echo "poolscope: built in $((SECONDS - start)) s; running poolscope demo $*" >&2
exec "$build/bin/poolscope" demo "$@"
