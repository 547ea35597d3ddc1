#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every step of the container image (deploy/container/Dockerfile), as a script
# so that it runs, and is tested, without a container engine:
# tests/deploy/container_image_test.sh runs `stage` on the test build and
# `runtime` in a fresh Debian 12 root, then a cluster as the image's user.
#
#   image.sh build SRC BUILD STAGE   build stage: set-up (deploy/bootstrap.sh),
#                                    a Release build of the daemons and repvarctl
#                                    (the configuration tests/run.sh builds), then `stage`
#   image.sh stage BUILD STAGE       `cmake --install` into STAGE/usr/local, plus
#                                    STAGE/usr/local/share/repvar/runtime-packages:
#                                    the Debian packages the binaries' shared
#                                    libraries come from (ldd + dpkg -S)
#   image.sh runtime                 run stage, as root inside the image's root:
#                                    installs those packages and the user
#                                    repvar (uid/gid 10001, the manifests' runAsUser)
#                                    owning /var/lib/repvar
set -euo pipefail

PREFIX=/usr/local
UID_GID=10001

stage() {
  local build=$1 stage=$2
  DESTDIR="$stage" cmake --install "$build" --prefix "$PREFIX" >/dev/null
  local list="$stage$PREFIX/share/repvar/runtime-packages"
  mkdir -p "$(dirname "$list")"
  # Each binary's shared libraries -> the packages that ship them.
  local libs
  libs=$(for b in "$stage$PREFIX"/bin/*; do
           ldd "$b" 2>/dev/null | awk '/=> \// {print $3}'
         done | sort -u)
  [ -n "$libs" ] || { echo "image.sh: no shared libraries found under $stage$PREFIX/bin" >&2; exit 1; }
  local pkgs
  pkgs=$(for l in $libs; do dpkg -S "$(readlink -f "$l")" 2>/dev/null || dpkg -S "$l"; done \
           | cut -d: -f1 | sort -u)
  printf '%s\n' $pkgs >"$list"
  echo "image.sh: staged $(ls "$stage$PREFIX/bin" | wc -l) programs into $stage$PREFIX;" \
       "runtime packages: $(echo $pkgs)"
}

case "${1:-}" in
  build)
    [ $# -eq 4 ] || { sed -n 2,20p "$0" >&2; exit 2; }
    src=$2 build=$3 stage_dir=$4
    "$src/deploy/bootstrap.sh"
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DREPVAR_WERROR=ON >/dev/null
    cmake --build "$build" -j "$(nproc)" --target repvar-coordinator repvar-worker repvarctl
    stage "$build" "$stage_dir"
    ;;
  stage)
    [ $# -eq 3 ] || { sed -n 2,20p "$0" >&2; exit 2; }
    stage "$2" "$3"
    ;;
  runtime)
    list=$PREFIX/share/repvar/runtime-packages
    [ -s "$list" ] || { echo "image.sh: $list is missing: copy the build stage in first" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes
    apt-get update -qq
    # shellcheck disable=SC2046
    apt-get install -y -qq --no-install-recommends $(cat "$list") >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*
    getent group repvar >/dev/null || groupadd --system --gid "$UID_GID" repvar
    getent passwd repvar >/dev/null ||
      useradd --no-log-init --no-create-home --uid "$UID_GID" --gid "$UID_GID" --home-dir /var/lib/repvar \
        --shell /usr/sbin/nologin repvar
    install -d -o "$UID_GID" -g "$UID_GID" -m 0750 /var/lib/repvar
    install -d -m 0755 /etc/repvar
    # Every program starts: no library is missing.
    for b in "$PREFIX"/bin/repvar*; do "$b" --version >/dev/null; done
    echo "image.sh: runtime ready: $("$PREFIX/bin/repvar-coordinator" --version | head -1)"
    ;;
  *)
    sed -n 2,20p "$0" >&2
    exit 2
    ;;
esac
