#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs repvar's benchmarks and their peers side by side in one run, on this
# machine, and prints each figure with its ratio. Not a test: nothing here
# asserts a time. Installs its own peers (apt): openmpi, redis, etcd.
#   bench/run.sh [--quick] [--baseline BUILD_DIR]
# --baseline: also run BUILD_DIR/bench/repvar_bench (another commit's build,
# with its daemons) in the same session, against the same peers, and print
# its ratios beside these (baseline=...).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
quick=0
baseline=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --baseline) baseline=$2; shift ;;
    *) echo "usage: bench/run.sh [--quick] [--baseline BUILD_DIR]" >&2; exit 2 ;;
  esac
  shift
done

deploy/bootstrap.sh
need=()
for p in openmpi-bin libopenmpi-dev redis-server redis-tools etcd-server python3-etcd3 iproute2; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
build=${REPVAR_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target repvar_bench gloo_bcast tcp_stream grpc_step_floor repvar-coordinator repvar-worker repvar-sim
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpicc -O2 -o "$out/mpi_bcast" bench/peers/mpi_bcast.c

workers="2 4 8"; mibs="1,64,256"; iters=5; small=2000
p2p_mib=256  # the point-to-point figure, its TCP peer and the disk's, the same bytes
torch_steps=14  # the first 4 of each mode warm up (bench/torch_step.py)
if [ $quick -eq 1 ]; then workers="2 8"; mibs="1,64,256"; iters=3; small=500; torch_steps=8; fi
results="$out/results.txt"

echo "== peers: MPI_Bcast over TCP (btl self,tcp)"
for n in $workers; do
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" --mca pml ob1 --mca btl self,tcp \
    "$out/mpi_bcast" "$mibs" "$iters" | tee -a "$results"
done

echo "== peers: bare gloo broadcast / ring allreduce (TCP, loopback)"
for n in $workers; do
  store=$(mktemp -d "$out/store.XXXX")
  pids=()
  for r in $(seq 1 $((n - 1))); do "$build/bench/gloo_bcast" "$r" "$n" "$store" "$mibs" "$iters" & pids+=($!); done
  "$build/bench/gloo_bcast" 0 "$n" "$store" "$mibs" "$iters" | tee -a "$results"
  for p in "${pids[@]}"; do wait "$p"; done
done

echo "== peers: the point-to-point bytes over one loopback TCP connection and back"
"$build/bench/tcp_stream" "$p2p_mib" "$iters" | tee -a "$results"
# What durability costs the same bytes on the disk the clusters' data dirs
# use: an acknowledged assign is on disk (fsync) before its answer.
ddfile=$(mktemp "${TMPDIR:-/tmp}/repvar-dd.XXXX")
t0=$(date +%s%N)
dd if=/dev/zero of="$ddfile" bs=1M count="$p2p_mib" conv=fsync status=none
echo "disk mib=$p2p_mib write_fsync_ms=$(( ($(date +%s%N) - t0) / 1000000 ))" | tee -a "$results"
rm -f "$ddfile"

echo "== peers: the step path's messages on bare gRPC (32 workers), no repvar logic"
"$build/bench/grpc_step_floor" 32 1000 | tee -a "$results"       # the report path
"$build/bench/grpc_step_floor" 32 200 1000 | tee -a "$results"   # 1,000 variables changing

echo "== peers: Redis 7 GET / INCR, 1 client"
port=$((20000 + RANDOM % 20000))
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >/dev/null &
rpid=$!
for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-benchmark -h 127.0.0.1 -p "$port" -t get,incr -n 100000 -d 16 -c 1 --precision 3 -q --csv |
  tee "$out/redis.csv"
kill "$rpid"; wait "$rpid" 2>/dev/null || true
python3 - "$out/redis.csv" >>"$results" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
for r in rows[1:]:
    d = dict(zip(head, r))
    print(f"redis test={d['test']} p50_us={float(d['p50_latency_ms'])*1000:.1f} p99_us={float(d['p99_latency_ms'])*1000:.1f}")
PY

echo "== peers: etcd put (fsync before the answer), data dir on the disk repvar's bench uses"
edir=$(mktemp -d "${TMPDIR:-/tmp}/repvar-etcd.XXXX")
eport=$((20000 + RANDOM % 20000))
etcd --data-dir "$edir" --listen-client-urls "http://127.0.0.1:$eport" \
  --advertise-client-urls "http://127.0.0.1:$eport" \
  --listen-peer-urls "http://127.0.0.1:$((eport + 1))" >"$out/etcd.log" 2>&1 &
epid=$!
for _ in $(seq 1 100); do
  python3 -c "import etcd3; etcd3.client(port=$eport).status()" >/dev/null 2>&1 && break
  sleep 0.1
done
/usr/bin/python3 bench/peers/etcd_put.py "$eport" "$small" | tee -a "$results"
kill "$epid"; wait "$epid" 2>/dev/null || true
rm -rf "$edir"

echo "== repvar"
# shellcheck disable=SC2086
"$build/bench/repvar_bench" --workers="$(echo $workers | tr ' ' ,)" --mib="$mibs" \
  --iters="$iters" --small_ops="$small" --p2p_mib="$p2p_mib" | tee -a "$results"
"$build/bench/repvar_bench" --only_memory | tee -a "$results"
echo "== repvar: the step cost curve (8 / 16 / 32 workers x 100 / 1,000 / 10,000 variables)"
curve_steps=10
if [ $quick -eq 1 ]; then curve_steps=4; fi
for w in 8 16 32; do
  for v in 100 1000 10000; do
    "$build/bench/repvar_bench" --only_steps --mean_mib=0 --step_workers=$w --step_vars=$v \
      --steps=$curve_steps | sed 's/^repvar_steps /curve repvar_steps /' | tee -a "$results"
  done
done
echo "== the workers' data plane over rate-limited links: a network namespace per member, tc"
# How the broadcast grows with hosts where links, not CPUs, are the limit
# (bcast_t8_t2_netns). Needs root and network namespaces; a machine without
# them prints why, and the line reads nan.
if netns=$(bench/netns_bcast.sh --sizes "2 8" --algos chain 2>&1); then
  echo "$netns" | grep -v "\] \[info\]" | tee -a "$results"
else
  echo "$netns" | tail -3
  echo "netns_bcast skipped=no_network_namespaces_here" | tee -a "$results"
fi
echo "== PyTorch: repvar.torch next to DistributedDataParallel (gloo), same model and processes"
/usr/bin/python3 bench/torch_step.py "$build" --steps="$torch_steps" | tee -a "$results"
echo "== Python: 64 MiB assigned and read back (fresh array, read(out=)), malloc tuned and not"
/usr/bin/python3 bench/python_bulk.py "$build" | tee -a "$results"
echo "== the coordinator at a thousand hosts: repvar-sim --scale (docs/simulator.md)"
"$build/sim/repvar-sim" --scale --hosts=1000 --accelerators=4 --variables=10000 | tee "$out/scale.txt"
if [ -n "$baseline" ]; then
  echo "== baseline repvar ($baseline)"
  # Flags an older build knows (no --p2p_mib: its default, 256, where it has the figure).
  # shellcheck disable=SC2086
  "$baseline/bench/repvar_bench" --workers="$(echo $workers | tr ' ' ,)" --mib="$mibs" \
    --iters="$iters" --small_ops="$small" | sed 's/^/baseline /' | tee -a "$results"
fi

echo
echo "== figures and goals (ratios in this run; bench/README.md, \"Output format\")"
python3 bench/summarize.py "$results"
grep ' ratio=' "$out/scale.txt"
