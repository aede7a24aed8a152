#!/usr/bin/env bash
# ctest's launcher for the tests under srun (darray.srun.*, tools.srun.*): `srun_launch.sh -np N
# PROGRAM ARGS...` runs srun --mpi=pmix --overcommit -n N PROGRAM ARGS... on the cluster of
# scripts/slurm-local.sh (SLURM_CONF, else its configuration under $POOLSCOPE_SLURM_DIR or
# /tmp/poolscope-slurm). With no cluster answering it prints why after "SKIP: " and exits 77, which
# ctest counts as a skip.
set -uo pipefail
conf=${SLURM_CONF:-${POOLSCOPE_SLURM_DIR:-/tmp/poolscope-slurm}/slurm.conf}
if [ ! -f "$conf" ]; then
  echo "SKIP: no SLURM cluster here ($conf does not exist: scripts/slurm-local.sh start makes one)"
  exit 77
fi
export SLURM_CONF=$conf
if ! state=$(timeout 10 sinfo -h -o %T 2>&1) || ! [[ $state =~ ^(idle|mixed|allocated) ]]; then
  echo "SKIP: the SLURM cluster of $conf does not answer or has no node up (sinfo: $state)"
  exit 77
fi
if [ "${1:-}" != -np ] || [ $# -lt 3 ]; then
  echo "usage: $0 -np N PROGRAM [ARGS...]" >&2
  exit 2
fi
n=$2
shift 2
exec srun --mpi=pmix --overcommit --kill-on-bad-exit=1 -n "$n" "$@"
