#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Brings up a local repvar cluster on 127.0.0.1 and runs a real workload on it:
# a coordinator, 3 TPU hosts (/job:tpu_worker, 2 virtual TPUs each) and one
# host without accelerators (/job:worker), so the infeed-host discovery shows.
# Does its own set-up (packages, Release build shared with tests/run.sh).
# Every daemon serves TLS with per-role tokens, from a CA and certificates
# made for this run (deploy/make-certs.sh, into $REPVAR_DATA_DIR/certs); the
# workload connects as a trainer (REPVAR_TLS_CA, REPVAR_TOKEN_FILE): the C++
# and Python examples, and a PyTorch model trained data-parallel. It prints
# the coordinator's web view's URL (hosts, replicas, steps, the loss curves).
#   deploy/local-cluster.sh             run the workload, then stay up until Ctrl-C
#   deploy/local-cluster.sh --once      run the workload and exit with its status
#   deploy/local-cluster.sh --plaintext the same without TLS or tokens
# Data and logs go to $REPVAR_DATA_DIR (default ./local-cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
once=0
tls=1
for arg in "$@"; do
  case "$arg" in
    --once) once=1 ;;
    --plaintext) tls=0 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

deploy/bootstrap.sh
build=${REPVAR_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target repvar_runtime

data=${REPVAR_DATA_DIR:-$root/local-cluster}
mkdir -p "$data"
rm -f "$data"/*.port "$data"/*.metrics_port
# Each run is a new cluster: its workers start empty, and the values steps
# changed lived only on the previous run's workers (docs/architecture.md; a
# periodic checkpoint is what survives losing every worker). A coordinator
# kept from that run would rightly report those variables with no
# up-to-date replica.
rm -rf "$data/coordinator-data"
# secure NAME TOKEN_FLAG: the TLS and token flags of the daemon whose
# certificate is certs/NAME.pem.
secure() { :; }
if [ $tls -eq 1 ]; then
  rm -rf "$data/certs"
  deploy/make-certs.sh "$data/certs" --workers tpu_worker:0,tpu_worker:1,tpu_worker:2,worker:0
  c=$data/certs
  secure() {
    echo "--tls_cert=$c/$1.pem --tls_key=$c/$1.key --tls_ca=$c/ca.pem --$2=$c/worker.token" \
      "--trainer_token_file=$c/trainer.token --admin_token_file=$c/admin.token"
  }
  export REPVAR_TLS_CA=$c/ca.pem REPVAR_TOKEN_FILE=$c/trainer.token
fi
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -f "$data"/*.port  # no stale ports for the next reader
}
trap stop_all EXIT
trap 'exit 130' INT TERM

wait_port() {  # file -> prints the port once the daemon has written it
  for _ in $(seq 1 500); do
    if [ -s "$1" ]; then cat "$1"; return 0; fi
    sleep 0.02
  done
  echo "timed out waiting for $1" >&2
  return 1
}

# --exit_with_parent: the daemons stop with this script even if it is killed
# with SIGKILL (no trap runs then).
"$build/server/repvar-coordinator" --exit_with_parent --listen_address=127.0.0.1:0 \
  --port_file="$data/coordinator.port" \
  --expected_tasks=tpu_worker:3,worker:1 --heartbeat_timeout=5s --data_dir="$data/coordinator-data" \
  --metrics_address=127.0.0.1:0 --metrics_port_file="$data/coordinator.metrics_port" \
  $(secure coordinator worker_token_file) 2>"$data/coordinator.log" &
pids+=($!)
port=$(wait_port "$data/coordinator.port")
export REPVAR_COORDINATOR_ADDRESS=127.0.0.1:$port
echo "coordinator on $REPVAR_COORDINATOR_ADDRESS (logs in $data)$([ $tls -eq 1 ] && echo ", TLS and tokens (certs in $data/certs)")"
# The coordinator's HTTP listener (metrics, web view) speaks TLS when its gRPC does.
scheme=http
[ $tls -eq 1 ] && scheme=https
metrics_url=$scheme://127.0.0.1:$(wait_port "$data/coordinator.metrics_port")
web_view_line() {
  if [ $tls -eq 1 ]; then
    # The fragment carries the admin token to the page; browsers never send it.
    echo "web view: $metrics_url/#token=$(head -n1 "$data/certs/admin.token")"
    echo "  (served with this run's certificates: trust $data/certs/ca.pem, or accept the warning)"
  else
    echo "web view: $metrics_url/"
  fi
}
web_view_line
for t in 0 1 2; do
  "$build/worker/repvar-worker" --exit_with_parent --job=tpu_worker --task=$t --tpu_devices=2 \
    --port_file="$data/tpu_worker-$t.port" $(secure tpu_worker-$t token_file) \
    2>"$data/tpu_worker-$t.log" &
  pids+=($!)
done
"$build/worker/repvar-worker" --exit_with_parent --job=worker --task=0 --tpu_devices=0 \
  --port_file="$data/worker-0.port" $(secure worker-0 token_file) 2>"$data/worker-0.log" &
pids+=($!)

rc=0
"$build/client/repvar-example" || rc=$?
if [ $rc -eq 0 ]; then
  echo
  echo "== data-parallel training in replicated steps (repvar-train; --inject_divergence shows repair)"
  "$build/client/repvar-train" --steps="${REPVAR_TRAIN_STEPS:-200}" --inject_divergence=50 || rc=$?
fi
if [ $rc -eq 0 ]; then
  echo
  echo "== the same cluster from Python (generated stubs + numpy helper)"
  PYTHONPATH="$root/$build/python" /usr/bin/python3 "$root/$build/python/repvar_example.py" || rc=$?
fi
if [ $rc -eq 0 ]; then
  echo
  echo "== PyTorch: an MLP trained data-parallel, one trainer per TPU host (repvar.torch)"
  PYTHONPATH="$root/$build/python" /usr/bin/python3 "$root/examples/torch/train_mlp.py" \
    --steps="${REPVAR_TORCH_STEPS:-60}" || rc=$?
fi
echo
echo "== the coordinator's metrics: divergences repaired, replicas by state"
/usr/bin/python3 - "$metrics_url" "${REPVAR_TLS_CA:-}" <<'PY' || rc=$?
import ssl, sys, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2]) if sys.argv[2] else None
text = urllib.request.urlopen(f"{sys.argv[1]}/metrics", timeout=10, context=context).read().decode()
for line in text.splitlines():
    if line.startswith(("repvar_divergences_repaired_total", "repvar_replicas{", "repvar_last_committed_step")):
        print(line)
PY
echo
echo "== repvarctl read model/dense/bias"
"$build/client/repvarctl" read model/dense/bias || rc=$?

if [ $once -eq 1 ]; then
  echo
  [ $rc -eq 0 ] && echo "workload OK; stopping the cluster" || echo "workload FAILED (rc=$rc); logs in $data"
  exit $rc
fi
echo
echo "cluster is up: export REPVAR_COORDINATOR_ADDRESS=$REPVAR_COORDINATOR_ADDRESS"
web_view_line
if [ $tls -eq 1 ]; then
  echo "  export REPVAR_TLS_CA=$REPVAR_TLS_CA REPVAR_TOKEN_FILE=$data/certs/admin.token"
fi
echo "try: $build/client/repvarctl topology | vars | read NAME | assign NAME --value=..."
echo "Ctrl-C stops every process this script started."
wait
