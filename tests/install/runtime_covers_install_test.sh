#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's steps after its run command work on what that command built:
# deploy/local-cluster.sh builds the target repvar_runtime, and every file
# `cmake --install` copies from the build tree that the build makes is one
# of repvar_runtime's inputs (so `cmake --install build --prefix P` right
# after the local cluster finds everything it installs).
#   runtime_covers_install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$(cd "$2" && pwd)

grep -qE -- '--target repvar_runtime( |$)' "$src/deploy/local-cluster.sh" ||
  { echo "deploy/local-cluster.sh does not build repvar_runtime" >&2; exit 1; }

# Every file the build makes on the way to repvar_runtime (its graph's nodes).
nodes=$(ninja -C "$build" -t graph repvar_runtime | grep -oE 'label="[^"]+"' | sed 's/^label="//; s/"$//')
installed=$(grep -rhoE "\"$build/[^\"\$]+\"" --include=cmake_install.cmake "$build" | tr -d '"' | sort -u)
checked=0 missing=()
for file in $installed; do
  rel=${file#"$build"/}
  # Only what the build makes: files written at configure time are there.
  ninja -C "$build" -t query "$rel" >/dev/null 2>&1 || continue
  checked=$((checked + 1))
  grep -qxF -- "$rel" <<<"$nodes" && continue
  # A library's version symlink is made with the library it names.
  if [ -L "$file" ]; then
    target="$(dirname "$rel")/$(readlink "$file")"
    grep -qxF -- "$target" <<<"$nodes" && continue
  fi
  missing+=("$rel")
done
if [ "$checked" -lt 4 ]; then
  echo "found only $checked installed build outputs; the install rules were not read" >&2
  exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "cmake --install needs files deploy/local-cluster.sh does not build: ${missing[*]}" >&2
  exit 1
fi
echo "repvar_runtime builds all $checked installed build outputs"
