#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The container image's steps, proven without a container engine: the
# Dockerfile's two stages are deploy/container/image.sh, so this runs
#   1. `image.sh stage` on the build tests/run.sh made (the build stage's
#      `cmake --install` and its list of runtime packages),
#   2. a fresh Debian 12 root (debootstrap minbase: what debian:12-slim is),
#      the staged tree copied in, `image.sh runtime` run inside it as root,
#   3. a TLS + token cluster in that root as the image's user (uid 10001): a
#      coordinator, two workers, and repvarctl restoring, writing and reading a
#      variable through them. Every program finds its libraries, every flag the
#      manifests pass parses, the user can write /var/lib/repvar.
# Needs root (debootstrap, chroot, mount) and the Debian mirror apt uses.
#   tests/deploy/container_image_test.sh BUILD_DIR
# REPVAR_IMAGE_BASE_CACHE=FILE keeps the debootstrapped base as a tarball there.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: $0 BUILD_DIR}
[ "$(id -u)" -eq 0 ] || { echo "container image test: needs root (debootstrap, chroot)" >&2; exit 1; }

work=$(mktemp -d /var/tmp/repvar-image.XXXXXX)
root=$work/root
cleanup() {
  for m in dev/pts dev proc; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

echo "-- image.sh stage (build stage: install + runtime package list)"
deploy/container/image.sh stage "$build" "$work/stage"

echo "-- a fresh Debian 12 root (debootstrap --variant=minbase bookworm)"
cache=${REPVAR_IMAGE_BASE_CACHE:-}
if [ -n "$cache" ] && [ -s "$cache" ]; then
  mkdir -p "$root" && tar -C "$root" -xzf "$cache"
else
  # The mirror apt uses here (deb822 .sources or a classic sources.list;
  # either may be absent, as in a debootstrapped root).
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2; exit}' || true)
  if [ -z "$mirror" ]; then
    mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  fi
  debootstrap --variant=minbase bookworm "$root" "${mirror:-http://deb.debian.org/debian}" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }
  if [ -n "$cache" ]; then mkdir -p "$(dirname "$cache")" && tar -C "$root" -czf "$cache" .; fi
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"

echo "-- image.sh runtime (run stage) inside it"
cp -a "$work/stage/." "$root/"
cp deploy/container/image.sh "$root/tmp/image.sh"
chroot "$root" /tmp/image.sh runtime
rm "$root/tmp/image.sh"
chroot "$root" id repvar | grep -q 'uid=10001(repvar) gid=10001(repvar)'

echo "-- a TLS + token cluster in the image as uid 10001"
deploy/make-certs.sh "$root/tmp/certs" --workers tpu_worker:0,tpu_worker:1 >/dev/null
chown -R 10001:10001 "$root/tmp/certs"
/usr/bin/python3 - "$root/tmp/w.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<4f", 1, 2, 3, 4))
PY
chroot --userspec=10001:10001 "$root" /bin/bash -euo pipefail -c '
cd /var/lib/repvar
c=/tmp/certs
tls() { echo "--tls_cert=$c/$1.pem --tls_key=$c/$1.key --tls_ca=$c/ca.pem --trainer_token_file=$c/trainer.token --admin_token_file=$c/admin.token"; }
pids=()
trap "kill \${pids[*]} 2>/dev/null; wait" EXIT
wait_file() { for _ in $(seq 1 500); do [ -s "$1" ] && return 0; sleep 0.02; done; echo "timed out: $1" >&2; return 1; }
repvar-coordinator --exit_with_parent --listen_address=127.0.0.1:0 --port_file=/tmp/c.port \
  --expected_tasks=tpu_worker:2 --data_dir=/var/lib/repvar/coordinator --log_format=json \
  --worker_token_file=$c/worker.token $(tls coordinator) 2>/tmp/coordinator.log &
pids+=($!)
wait_file /tmp/c.port
export REPVAR_COORDINATOR_ADDRESS=127.0.0.1:$(cat /tmp/c.port)
for t in 0 1; do
  repvar-worker --exit_with_parent --job=tpu_worker --task=$t --tpu_devices=1 \
    --token_file=$c/worker.token $(tls tpu_worker-$t) 2>/tmp/worker-$t.log &
  pids+=($!)
done
export REPVAR_TLS_CA=$c/ca.pem REPVAR_TOKEN_FILE=$c/admin.token
ok=0
for _ in $(seq 1 100); do
  # Both workers, not just the second to start: a restore with --replicas=2
  # before the first one registers is refused (one accelerator).
  if repvarctl status 2>/dev/null | grep -q " 2 accelerator(s)"; then ok=1; break; fi
  sleep 0.1
done
[ $ok = 1 ] || { echo "workers never registered"; tail -5 /tmp/*.log; exit 1; }
repvarctl restore /tmp/w.safetensors --replicas=2
repvarctl assign_add w --value=10,10,10,10
out=$(repvarctl read w)
echo "$out"
echo "$out" | grep -q "11, 12, 13, 14" || { echo "unexpected value"; exit 1; }
ls /var/lib/repvar/coordinator >/dev/null
'
echo "container image test: OK"
