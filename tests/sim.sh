#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the cluster simulator (docs/simulator.md) over a range of seeds and
# fails if any seed breaks an invariant:
#   tests/sim.sh [--seeds=N] [--first_seed=S] [any other repvar-sim flag]
# Defaults: 10,000 seeds from seed 1 (what tests/run.sh runs). A failing seed
# replays with `build/sim/repvar-sim --first_seed=S --seeds=1 --verbose`.
#   REPVAR_BUILD_DIR   build directory (default: build; must be built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${REPVAR_BUILD_DIR:-build}
sim="$build/sim/repvar-sim"
if [ ! -x "$sim" ]; then
  echo "tests/sim.sh: $sim is not built (cmake --build $build --target repvar-sim)" >&2
  exit 2
fi
args=(--seeds=10000 --first_seed=1 --jobs="$(nproc)")
out=$("$sim" "${args[@]}" "$@" | tee /dev/stderr | tail -n 1)
case "$out" in
  "sim: "*", 0 failures, digest "*) exit 0 ;;
  *) exit 1 ;;
esac
