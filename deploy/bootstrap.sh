#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs exactly the Debian 12 packages repvar needs to build, test and run.
# Idempotent: a no-op when everything is present; runs `apt-get update` only when
# something is missing. Needs root (or sudo) only in that case.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang-format clang-tidy clang-14 libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libxxhash-dev librocksdb-dev nlohmann-json3-dev libssl-dev openssl
  libcpp-httplib-dev libsystemd-dev libcli11-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-pytest python3-xxhash python3-yaml
  python3-pip python3-setuptools python3-wheel python3-venv python3-torch
  procps iproute2 debootstrap
  chromium fonts-dejavu-core
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
