#!/usr/bin/env bash
# A SLURM cluster of one node on this machine, for the tests that start ranks with srun
# (darray.srun.*, tools.srun.*: tests/CMakeLists.txt) and for trying srun by hand. Its daemons
# (munged, slurmctld, slurmd from Debian's slurm-wlm) run as root with everything under DIR: their
# configuration, key, sockets, state and logs. It uses ports of its own (16817, 16818), so a
# SLURM the machine already runs is left alone; point srun at this one with SLURM_CONF.
#   scripts/slurm-local.sh start [DIR]   installs slurm-wlm where missing (as root, apt-get), starts
#                                        the daemons, waits until the node is idle
#   scripts/slurm-local.sh stop [DIR]    stops them
#   SLURM_CONF=DIR/slurm.conf srun --mpi=pmix -n 3 build/bin/poolscope demo --devices host:1
# DIR defaults to $POOLSCOPE_SLURM_DIR, else /tmp/poolscope-slurm. Exit code 0 when the node is
# up (start) or the daemons are gone (stop); otherwise 1, with the reason and the daemons' logs.
set -uo pipefail
action=${1:-}
dir=${2:-${POOLSCOPE_SLURM_DIR:-/tmp/poolscope-slurm}}

stop() {
  local pid
  for name in slurmd slurmctld munged; do
    if [ -s "$dir/$name.pid" ]; then
      pid=$(cat "$dir/$name.pid")
      kill "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null
      rm -f "$dir/$name.pid"
    fi
  done
  rm -f "$dir/slurm.conf"  # srun_launch.sh then skips at once instead of asking a cluster gone
}

fail() {
  echo "slurm-local: $*" >&2
  for log in "$dir"/*.log; do
    [ -f "$log" ] && { echo "---- $log" >&2; tail -n 20 "$log" >&2; }
  done
  stop
  exit 1
}

case "$action" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "slurm-local: slurm-wlm is not installed and this is not root: no cluster" >&2
    exit 1
  fi
  echo "slurm-local: installing slurm-wlm (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q slurm-wlm >/dev/null 2>&1; then
    apt-get update -q >/dev/null 2>&1
    if ! apt-get install -y -q slurm-wlm >/dev/null 2>&1; then
      echo "slurm-local: apt-get failed" >&2
      exit 1
    fi
  fi
fi
if [ "$(id -u)" != 0 ]; then
  echo "slurm-local: the daemons run as root here: no cluster" >&2
  exit 1
fi

stop
rm -rf "$dir"
mkdir -p "$dir/state" "$dir/spool"
chmod 700 "$dir"
head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 400 "$dir/munge.key"
node=$(hostname -s)
cpus=$(nproc)
cat >"$dir/slurm.conf" <<EOF
ClusterName=poolscope-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$dir/slurm.conf"

munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" ||
  fail "munged did not start"
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 100); do
  case "$(sinfo -h -o %T 2>/dev/null)" in
    idle* | mixed* | allocated*)
      echo "slurm-local: node $node up ($cpus CPUs); SLURM_CONF=$SLURM_CONF"
      exit 0
      ;;
  esac
  sleep 0.2
done
fail "the node did not come up within 20 s (sinfo: $(sinfo -h 2>&1))"
