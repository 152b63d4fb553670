#!/usr/bin/env bash
# Two nodes on one machine: two network namespaces joined by a veth pair (10.77.N.1 and 10.77.N.2, made
# here and removed on exit), `mpxrun --nnodes 2` in each, one rank per node, training a runtime-test
# scenario. Writes each node's output to <out>/node<k>.log and exits 0 when both runs ended (whatever their
# status: the caller judges the logs); exits 77 when network namespaces cannot be made here (not root).
#   two_nodes.sh <mpxrun> <rank-exe> <scenario> <out-dir> [unreachable]
# unreachable: each node tells its peer a loopback address (GLOO_SOCKET_IFNAME=lo), which the other cannot
# reach: the rendezvous store connects, the Gloo groups cannot (the failure of a host name resolving to
# loopback).
set -uo pipefail
mpxrun=$1; exe=$2; scenario=$3; out=$4; mode=${5:-}
id=$$; n0=mpx-n0-$id; n1=mpx-n1-$id; v0=mpxa$((id % 100000)); v1=mpxb$((id % 100000)); net=10.77.$((id % 200 + 20))
cleanup() { ip netns del "$n0" 2>/dev/null; ip netns del "$n1" 2>/dev/null; }
trap cleanup EXIT
trap 'exit 1' INT TERM
mkdir -p "$out"
if ! ip netns add "$n0" 2>/dev/null; then echo "two_nodes: cannot create network namespaces here (needs root)"; exit 77; fi
set -e
ip netns add "$n1"
ip link add "$v0" type veth peer name "$v1"
ip link set "$v0" netns "$n0"
ip link set "$v1" netns "$n1"
ip -n "$n0" addr add "$net.1/24" dev "$v0"
ip -n "$n1" addr add "$net.2/24" dev "$v1"
for ns in "$n0" "$n1"; do ip -n "$ns" link set lo up; done
ip -n "$n0" link set "$v0" up
ip -n "$n1" link set "$v1" up
set +e
common=(--nnodes 2 --nproc-per-node 1 --master-addr "$net.1" --master-port 29400)
extra=()
[ "$mode" = unreachable ] && extra=(GLOO_SOCKET_IFNAME=lo)
ip netns exec "$n0" env "${extra[@]}" timeout 150 "$mpxrun" "${common[@]}" --node-rank 0 "$exe" "$scenario" "$out" > "$out/node0.log" 2>&1 &
p0=$!
ip netns exec "$n1" env "${extra[@]}" timeout 150 "$mpxrun" "${common[@]}" --node-rank 1 "$exe" "$scenario" "$out" > "$out/node1.log" 2>&1 &
p1=$!
wait "$p0"; s0=$?
wait "$p1"; s1=$?
echo "exit $s0" >> "$out/node0.log"
echo "exit $s1" >> "$out/node1.log"
exit 0
