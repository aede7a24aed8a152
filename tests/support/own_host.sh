#!/bin/sh
# A wrapper for each rank of an mpirun on one GPU machine (scripts/gpu-check.sh):
#   mpirun -np 2 tests/support/own_host.sh PROGRAM ARGS...
# runs PROGRAM as if on a host of its own, named node<rank> (a UTS namespace), seeing only the
# GPU of its local rank. The ranks then meet as ranks of different hosts do: poolscope moves GPU
# data between them by NCCL (CUDA IPC joins only ranks of one host), NCCL by its network transport
# (NCCL_SOCKET_IFNAME=lo: sockets over loopback), and `trace merge` aligns their clocks as hosts'.
# MPI still sees one node. Needs root and unshare (util-linux).
set -eu
rank=${OMPI_COMM_WORLD_RANK:?own_host.sh runs under mpirun}
export CUDA_VISIBLE_DEVICES="${OMPI_COMM_WORLD_LOCAL_RANK:-0}"
exec unshare --uts sh -c 'hostname "node$0" && exec "$@"' "$rank" "$@"
