#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The simulator finds past bugs: each re-injected bug (common/base/
# seeded_bug.h) is found within 2,000 seeds of its workload, breaking the
# invariant named here, and the seed that finds it passes without the bug.
#   seeded_bugs_test.sh PATH/TO/repvar-sim
set -euo pipefail
sim=$1
status=0
while IFS='|' read -r bug invariant flags; do
  read -ra extra <<<"$flags"
  out=$("$sim" --seeded_bug="$bug" --seeds=2000 --first_seed=1 --stop_at_failure "${extra[@]}" || true)
  line=$(grep -m1 '^seed [0-9]* FAILED: ' <<<"$out" || true)
  if [ -z "$line" ]; then
    echo "FAIL $bug: not found in 2,000 seeds"; status=1; continue
  fi
  seed=$(awk '{print $2}' <<<"$line")
  if [[ "$line" != *"FAILED: $invariant"* ]]; then
    echo "FAIL $bug: seed $seed broke another invariant: $line"; status=1; continue
  fi
  if ! "$sim" --first_seed="$seed" --seeds=1 "${extra[@]}" >/dev/null; then
    echo "FAIL $bug: seed $seed fails without the bug too"; status=1; continue
  fi
  echo "ok   $bug: found by seed $seed ($invariant) ${flags}; the seed passes without it"
done <<'BUGS'
attempts_overlap|C4 linearizability|
retries_reapplied|C4 linearizability|
no_roll_forward|C4 linearizability|
answered_before_sync|C4 linearizability|
fences_ignored|F7 replica truth|
local_reads_ignore_lease|C8 local step reads|
stale_workers_leased|C4 linearizability|
steps_not_suspended|C8 local step reads|
BUGS
exit $status
