#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The data plane's broadcast where the links, not the CPUs, are the limit:
# one network namespace per member, each with one veth into a bridge in a
# hub namespace, every link shaped to RATE in both directions (tc tbf).
# Prints, per member count, the time until the last member holds MIB MiB
# from rank 0, down the pipelined chain and down gloo's binomial tree
# (data_plane_bcast: GlooDataPlane as repvar-worker runs it), then
# T(n)/T(2) for each. Needs root (ip netns); removes what it made. Not a
# test: nothing here asserts a time.
#   bench/netns_bcast.sh [--rate 1gbit] [--mib 64] [--iters 3] [--sizes "2 4 8"]
#                        [--algos "tree chain"]
set -euo pipefail
cd "$(dirname "$0")/.."
rate=1gbit; mib=64; iters=3; sizes="2 4 8"; algos="tree chain"
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=$2; shift ;;
    --mib) mib=$2; shift ;;
    --iters) iters=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --algos) algos=$2; shift ;;
    *) echo "usage: bench/netns_bcast.sh [--rate R] [--mib M] [--iters K] [--sizes \"2 4 8\"]" \
         "[--algos \"tree chain\"]" >&2
       exit 2 ;;
  esac
  shift
done
build=${REPVAR_BUILD_DIR:-build}
cmake --build "$build" --target data_plane_bcast >/dev/null
bin=$PWD/$build/bench/data_plane_bcast
max=0
for n in $sizes; do [ "$n" -gt "$max" ] && max=$n; done

prefix=rvb$$
hub=${prefix}h
results=$(mktemp)
cleanup() {
  for i in $(seq 0 $((max - 1))); do ip netns del "${prefix}$i" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
  rm -f "$results"
}
trap cleanup EXIT

ip netns add "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
for i in $(seq 0 $((max - 1))); do
  ns=${prefix}$i
  ip netns add "$ns"
  ip link add v0 netns "$ns" type veth peer name "h$i" netns "$hub"
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev v0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set v0 up
  ip -n "$hub" link set "h$i" master br0
  ip -n "$hub" link set "h$i" up
  # Both directions of the member's link: its sends (v0) and what the
  # bridge forwards to it (h$i).
  tc -n "$ns" qdisc add dev v0 root tbf rate "$rate" burst 1mb latency 100ms
  tc -n "$hub" qdisc add dev "h$i" root tbf rate "$rate" burst 1mb latency 100ms
done

echo "== data plane broadcast of $mib MiB over $rate links (netns), time to the last receiver"
for n in $sizes; do
  for algo in $algos; do
    store=$(mktemp -d)
    pids=()
    for r in $(seq 1 $((n - 1))); do
      timeout 300 ip netns exec "${prefix}$r" "$bin" "$r" "$n" "10.77.0.$((r + 1))" "$store" \
        "$mib" "$iters" "$algo" >/dev/null 2>&1 &
      pids+=($!)
    done
    timeout 300 ip netns exec "${prefix}0" "$bin" 0 "$n" 10.77.0.1 "$store" "$mib" "$iters" \
      "$algo" 2>/dev/null | tee -a "$results"
    for p in "${pids[@]}"; do wait "$p"; done
    rm -rf "$store"
  done
done
awk '{ for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
       t[v["algo"], v["size"]] = v["last_receiver_ms"]; if (v["size"] > top) top = v["size"] }
     END { for (a in algos) ; split("tree chain", names, " ")
           for (k = 1; k <= 2; ++k) if ((names[k], 2) in t)
             printf "%s T(%d)/T(2)=%.2f\n", names[k], top, t[names[k], top] / t[names[k], 2] }' \
  "$results"
