#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds repvar (Release, shared with deploy/local-cluster.sh) and runs every
# test: C++ via ctest, Python via pytest on /usr/bin/python3. Exits non-zero on
# any failure. Does its own set-up on a fresh Debian 12 machine.
#   REPVAR_BUILD_DIR   build directory (default: build)
#   REPVAR_TEST_TIMEOUT_SCALE   multiplies test timeouts (slow machines)
#   REPVAR_SKIP_LARGE=1   skip the tests labelled `large`
#   REPVAR_SKIP_SANITIZERS=1   skip the ASan+UBSan pass over the core tests
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

deploy/bootstrap.sh
build=${REPVAR_BUILD_DIR:-build}
jobs=$(nproc)

echo "== configure and build ($build, Release, -Werror)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DREPVAR_WERROR=ON >/dev/null
cmake --build "$build" -j "$jobs"

echo "== format check (.clang-format)"
git ls-files -z -- '*.cc' '*.h' | xargs -0 clang-format --dry-run --Werror

echo "== clang-tidy (.clang-tidy: no function over 80 lines, a few bug checks)"
tools/tidy.sh "$build"

echo "== C++ tests"
ctest_args=(--test-dir "$build" --output-on-failure -j "$jobs")
if [ "${REPVAR_SKIP_LARGE:-0}" = 1 ]; then ctest_args+=(-LE large); fi
ctest "${ctest_args[@]}"

echo "== cluster simulator: 10,000 seeds (tests/sim.sh; docs/simulator.md)"
REPVAR_BUILD_DIR="$build" tests/sim.sh

echo "== core tests with clang: -Wthread-safety -Werror, AddressSanitizer + UndefinedBehaviorSanitizer"
# (Not ThreadSanitizer: Debian's Abseil is built without TSan annotations, so
# absl::Mutex hand-offs are invisible to it and every guarded field reports a
# false race.)
if [ "${REPVAR_SKIP_SANITIZERS:-0}" != 1 ]; then
  asan=${build}-asan
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DREPVAR_WERROR=ON -DREPVAR_SANITIZE="address;undefined" -DREPVAR_BUILD_BENCH=OFF >/dev/null
  cmake --build "$asan" -j "$jobs" --target repvar_common_test repvar_rpc_test repvar_server_test repvar_store_test repvar_worker_test repvar_history_test repvar_sim_test
  for t in repvar_common_test repvar_rpc_test repvar_server_test repvar_store_test repvar_worker_test repvar_history_test repvar_sim_test; do
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" "$asan/tests/$t" --gtest_brief=1
  done
fi

echo "== container image: deploy/container/image.sh's steps in a fresh Debian 12 root"
if [ "$(id -u)" -eq 0 ]; then
  tests/deploy/container_image_test.sh "$build"
else
  echo "SKIPPED: tests/deploy/container_image_test.sh needs root (debootstrap, chroot); CI runs as root"
fi

echo "== Python tests"
PYTHONPATH="$root/$build/python" REPVAR_BUILD_DIR="$root/$build" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python
