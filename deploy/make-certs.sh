#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes a cluster's TLS material with openssl: a CA, a certificate per
# daemon (the coordinator's CN is "coordinator", a worker's "/job:J/task:T";
# each valid for the hosts given, as DNS or IP names) and bearer tokens per
# role. For tests and local clusters; production clusters use their own CA.
#
#   deploy/make-certs.sh DIR [--hosts h1,h2] [--workers job:task,...]
#                            [--days N] [--expired NAME] [--other-ca]
#
# Writes into DIR (created; keys and tokens mode 600):
#   ca.pem ca.key                 the CA
#   coordinator.pem/.key          CN coordinator
#   <job>-<task>.pem/.key         CN /job:<job>/task:<task>, one per --workers entry
#   trainer.pem/.key              CN trainer (an optional client certificate)
#   worker.token trainer.token admin.token
#   expired-<NAME>.pem/.key       with --expired NAME: NAME's CN, valid in 2020 only
#   other-ca.pem other-ca-<NAME>.pem/.key   with --other-ca: a second CA and, for
#                                 each certificate above, one with the same CN it signed
set -euo pipefail

usage() { sed -n 2,20p "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
DIR=$1
shift
HOSTS="127.0.0.1,localhost"
WORKERS=""
DAYS=30
EXPIRED=""
OTHER_CA=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) HOSTS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --days) DAYS=$2; shift 2 ;;
    --expired) EXPIRED=$2; shift 2 ;;
    --other-ca) OTHER_CA=1; shift ;;
    *) usage ;;
  esac
done

mkdir -p "$DIR"
cd "$DIR"
umask 077

san=""
IFS=',' read -ra host_list <<<"$HOSTS"
for h in "${host_list[@]}"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}

# make_ca NAME: NAME.pem and NAME.key, a self-signed CA.
make_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -days "$DAYS" -subj "/CN=repvar test CA $1" -keyout "$1.key" -out "$1.pem" 2>/dev/null
}

# sign CA OUT CN [STARTDATE ENDDATE]: OUT.pem/OUT.key for CN, signed by CA,
# usable as server and client certificate.
sign() {
  local ca=$1 out=$2 cn=$3
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -subj "/CN=${cn//\//\\/}" -keyout "$out.key" -out "$out.csr" 2>/dev/null
  cat >"$out.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EOF
  if [ $# -ge 5 ]; then
    # openssl x509 cannot backdate; `openssl ca` can, from a scratch database.
    local db
    db=$(mktemp -d)
    touch "$db/index.txt"
    echo 01 >"$db/serial"
    cat >"$db/ca.cnf" <<EOF
[ca]
default_ca = scratch
[scratch]
database = $db/index.txt
serial = $db/serial
new_certs_dir = $db
default_md = sha256
policy = anything
copy_extensions = none
[anything]
commonName = supplied
EOF
    openssl ca -batch -config "$db/ca.cnf" -cert "$ca.pem" -keyfile "$ca.key" \
      -startdate "$4" -enddate "$5" -extfile "$out.ext" -in "$out.csr" -out "$out.pem" \
      -notext 2>/dev/null
    rm -rf "$db"
  else
    openssl x509 -req -in "$out.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial \
      -days "$DAYS" -sha256 -extfile "$out.ext" -out "$out.pem" 2>/dev/null
  fi
  rm -f "$out.csr" "$out.ext"
}

make_ca ca
names=(coordinator trainer)
cns=(coordinator trainer)
IFS=',' read -ra worker_list <<<"$WORKERS"
for w in "${worker_list[@]}"; do
  [ -n "$w" ] || continue
  names+=("${w%%:*}-${w##*:}")
  cns+=("/job:${w%%:*}/task:${w##*:}")
done
for i in "${!names[@]}"; do
  sign ca "${names[$i]}" "${cns[$i]}"
  if [ "${names[$i]}" = "$EXPIRED" ]; then
    sign ca "expired-${names[$i]}" "${cns[$i]}" 20200101000000Z 20200201000000Z
  fi
done
if [ "$OTHER_CA" = 1 ]; then
  make_ca other-ca
  for i in "${!names[@]}"; do sign other-ca "other-ca-${names[$i]}" "${cns[$i]}"; done
fi
for role in worker trainer admin; do
  openssl rand -hex 32 >"$role.token"
done
chmod 644 ./*.pem
