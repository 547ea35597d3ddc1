#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# clang-tidy with the checks of .clang-tidy over every source file of
# server/, worker/, client/, common/ and sim/, in parallel; exits non-zero on any
# finding. Needs a configured build directory (compile_commands.json).
#   tools/tidy.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/compile_commands.json" ] || { echo "no $build/compile_commands.json: configure first" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
git ls-files -- 'server/*.cc' 'worker/*.cc' 'client/*.cc' 'common/*.cc' 'sim/*.cc' |
  xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet >"$out" 2>&1 || true
findings=$(grep -E '(warning|error): ' "$out" | sort -u || true)
if [ -n "$findings" ]; then
  echo "$findings"
  echo "clang-tidy: $(echo "$findings" | wc -l) finding(s)" >&2
  exit 1
fi
echo "clang-tidy: no findings in $(git ls-files -- 'server/*.cc' 'worker/*.cc' 'client/*.cc' 'common/*.cc' 'sim/*.cc' | wc -l) files"
