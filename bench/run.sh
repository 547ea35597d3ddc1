#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs repvar's benchmarks and their peers side by side in one run, on this
# machine, and prints each figure with its ratio. Not a test: nothing here
# asserts a time. Installs its own peers (apt): openmpi, redis.
#   bench/run.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
quick=0
[ "${1:-}" = "--quick" ] && quick=1

deploy/bootstrap.sh
need=()
for p in openmpi-bin libopenmpi-dev redis-server redis-tools; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
build=${REPVAR_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target repvar_bench gloo_bcast repvar-coordinator repvar-worker
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpicc -O2 -o "$out/mpi_bcast" bench/peers/mpi_bcast.c

workers="2 4 8"; mibs="1,64,256"; iters=5; small=2000
if [ $quick -eq 1 ]; then workers="2 8"; mibs="1,64"; iters=3; small=500; fi
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

echo "== repvar"
# shellcheck disable=SC2086
"$build/bench/repvar_bench" --workers="$(echo $workers | tr ' ' ,)" --mib="$mibs" \
  --iters="$iters" --small_ops="$small" | tee -a "$results"

echo
echo "== ratios (repvar / peer, same run; lower is better)"
python3 - "$results" <<'PY'
import re, sys
kv = lambda line: dict(re.findall(r"(\w+)=([\w.]+)", line))
mpi, gloo, rv, redis, small, batch = {}, {}, {}, {}, {}, {}
mean, steps, local = None, {}, {}
for line in open(sys.argv[1]):
    d = kv(line)
    if line.startswith("mpi "): mpi[(int(d["size"]), int(d["mib"]))] = float(d["bcast_ms"])
    elif line.startswith("gloo "): gloo[(int(d["size"]), int(d["mib"]))] = (float(d["bcast_ms"]), float(d["allreduce_ms"]))
    elif line.startswith("repvar_bcast"): rv[(int(d["workers"]), int(d["mib"]))] = float(d["assign_ms"])
    elif line.startswith("redis "): redis[d["test"]] = (float(d["p50_us"]), float(d["p99_us"]))
    elif line.startswith("repvar_small"): small = {k: float(v) for k, v in d.items()}
    elif line.startswith("repvar_batch"): batch = {k: float(v) for k, v in d.items()}
    elif line.startswith("repvar_mean_step"): mean = (int(d["workers"]), int(d["mib"]), float(d["commit_ms"]))
    elif line.startswith("repvar_local"): local = {k: float(v) for k, v in d.items()}
    elif line.startswith("repvar_steps"): steps[int(d["writes"])] = {k: float(v) for k, v in d.items()}
print(f"{'broadcast':<22}{'repvar ms':>11}{'MPI tcp ms':>12}{'gloo ms':>10}{'/MPI':>8}{'/gloo':>8}")
for (w, m), t in sorted(rv.items()):
    p, g = mpi.get((w, m)), gloo.get((w, m), (None,))[0]
    print(f"{f'{m} MiB -> {w} workers':<22}{t:>11.1f}{p or float('nan'):>12.1f}{g or float('nan'):>10.1f}"
          f"{(t / p) if p else float('nan'):>8.2f}{(t / g) if g else float('nan'):>8.2f}")
if small and redis:
    g, i = redis.get("GET"), redis.get("INCR")
    print(f"read 16 floats p50 {small['read_p50_us']:.0f} us (p99 {small['read_p99_us']:.0f}) vs Redis GET p50 {g[0]:.0f} us: {small['read_p50_us']/g[0]:.2f}x")
    print(f"assign_add 16 floats x8 replicas p50 {small['assign_add_p50_us']:.0f} us (p99 {small['assign_add_p99_us']:.0f}) vs Redis INCR p50 {i[0]:.0f} us: {small['assign_add_p50_us']/i[0]:.2f}x")
if mean:
    w, m, t = mean
    g = gloo.get((w, m), (None, None))[1]
    print(f"MEAN step over {m} MiB x {w} replicas: commit-to-resolution {t:.1f} ms vs bare gloo ring allreduce {g or float('nan'):.1f} ms: {(t / g) if g else float('nan'):.2f}x")
if local:
    m = local["memcpy_ms"]
    print(f"in-step local write / read in place of {int(local['mib'])} MiB: {local['write_ms']:.1f} / {local['mapped_read_ms']:.1f} ms vs warm memcpy {m:.1f} ms: {m / local['write_ms']:.2f}x / {m / local['mapped_read_ms']:.2f}x memcpy speed (owned-copy read {local['read_ms']:.1f} ms)")
for w, st in sorted(steps.items(), reverse=True):
    what = "every replica written" if w else "nothing written (report path only)"
    print(f"steps/s with {int(st['workers'])} workers x {int(st['vars'])} variables, {what}: {st['steps_per_s']:.2f}; coordinator CPU {st['coordinator_cpu_ms_per_step']:.1f} ms/step ({st['coordinator_cpu_share']*100:.0f}% of a core)")
if batch:
    s = batch["single_create_ms"]
    for k in ("create1000_ms", "initialize1000_ms", "read1000_ms"):
        print(f"batched {k[:-7]} of 1000: {batch[k]:.1f} ms = {batch[k]/s:.1f}x one single create ({s:.2f} ms)")
PY
