#!/usr/bin/env bash
# ctest's launcher for the tests across two hosts (label hosts): `two_hosts.sh -np N PROGRAM
# ARGS...` runs `mpirun -np N PROGRAM ARGS...` over two hosts made on this machine, the first
# half of the ranks on nodeA, the rest on nodeB. Each host is a network namespace of its own (a
# veth pair between them, 10.77.0.1 and 10.77.0.2; Open MPI's TCP transport, no shared memory
# between them) with a host name of its own (a UTS namespace); nodeB sees the working directory
# on a tmpfs of its own, as a node with its own disk would, so what its ranks write there stays
# there. The namespaces are removed on exit. It needs root, ip (iproute2) and unshare; without
# them, or where namespaces cannot be made, it prints why after "SKIP: " and exits 77 (ctest: a
# skip).
set -uo pipefail
if [ "${1:-}" != -np ] || [ $# -lt 3 ]; then
  echo "usage: $0 -np N PROGRAM [ARGS...]" >&2
  exit 2
fi
n=$2
shift 2
a=psA$$
b=psB$$
work=$(pwd)
tmp=$(mktemp -d /tmp/poolscope-two-hosts-XXXXXX)

cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "/etc/netns/$a" "/etc/netns/$b" "$tmp"
}
skip() {
  echo "SKIP: $*"
  cleanup
  exit 77
}

[ "$(id -u)" = 0 ] || skip "two hosts need root (network and UTS namespaces)"
for tool in ip unshare mpirun timeout; do
  command -v "$tool" >/dev/null || skip "two hosts need $tool"
done
trap cleanup EXIT
ip netns add "$a" 2>/dev/null && ip netns add "$b" 2>/dev/null ||
  skip "no network namespace could be made here"
ip link add "va$$" netns "$a" type veth peer name "vb$$" netns "$b" &&
  ip -n "$a" addr add 10.77.0.1/24 dev "va$$" && ip -n "$b" addr add 10.77.0.2/24 dev "vb$$" &&
  ip -n "$a" link set "va$$" up && ip -n "$b" link set "vb$$" up &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up ||
  skip "the link between the two hosts could not be made"
# ip netns exec lays /etc/netns/NAME/hosts over /etc/hosts: each host finds the other by name.
for ns in "$a" "$b"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n10.77.0.1 nodeA\n10.77.0.2 nodeB\n' >"/etc/netns/$ns/hosts"
done

# Open MPI starts its daemon on nodeB through this "remote shell": into nodeB's namespaces, its
# own host name, a tmpfs over the working directory.
cat >"$tmp/rsh" <<EOF
#!/bin/sh
host=\$1
shift
[ "\$host" = nodeB ] || { echo "two_hosts.sh: no host \$host" >&2; exit 1; }
exec ip netns exec "$b" unshare --uts --mount \\
  sh -c "hostname nodeB && mount -t tmpfs none '$work' && cd '$work' && \$*"
EOF
chmod +x "$tmp/rsh"

on_a=$(((n + 1) / 2))
on_b=$((n - on_a))
hosts="nodeA:$on_a"
[ "$on_b" -gt 0 ] && hosts="$hosts,nodeB:$on_b"
timeout 300 ip netns exec "$a" unshare --uts sh -c 'hostname nodeA && exec "$@"' sh \
  mpirun -np "$n" --host "$hosts" --mca plm_rsh_agent "$tmp/rsh" --mca btl tcp,self \
  --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "$@"
