# SPDX-License-Identifier: Apache-2.0
"""A replicated variable from Python, then one replicated step with one
trainer per accelerator host (threads here; in a job, one process on each
host, each naming its own host's worker). Run with /usr/bin/python3 and
$REPVAR_COORDINATOR_ADDRESS (on a TLS cluster also $REPVAR_TLS_CA and
$REPVAR_TOKEN_FILE) set, the package installed or PYTHONPATH=build/python."""

import threading

import numpy as np, repvar
c = repvar.connect()                              # $REPVAR_COORDINATOR_ADDRESS
topology = c.wait_for_topology(60)                # every expected worker is live
n = len(topology.accelerators)                    # one replica per accelerator
with repvar.replicated_scope(n, "model"):          # again with the same spec: no change
    c.create("b", "float32", (1024,), initializer=repvar.zeros(), aggregation="MEAN")
c.initialize(["model/b"])
c.assign("model/b", np.ones(1024, np.float32), op="add")
value, version = c.read("model/b")


def train_step(c, step, host, grad):              # in one trainer on each accelerator host
    with c.step(step, worker=host) as s:          # a replicated step
        for r in s.local_replicas("model/b"):
            s.write("model/b", r, s.read("model/b", r) - 0.1 * grad[r])
        return s.commit()                         # raises repvar.StepFailed on failure


hosts = sorted({f"{a.job}:{a.task}" for a in topology.accelerators})
grad = {r: np.full(1024, r, np.float32) for r in range(n)}   # a made-up gradient per replica
step = c.last_committed_step() + 1
errors = []


def trainer(host):
    try:
        with repvar.connect() as own:             # each trainer has its own client
            train_step(own, step, host, grad)
    except repvar.Error as e:
        errors.append(e)


threads = [threading.Thread(target=trainer, args=(h,)) for h in hosts]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    raise errors[0]
after, version_after = c.read("model/b")
# MEAN: every replica ends at begin - 0.1 * mean(grad).
expected = value[0] - 0.1 * np.mean([grad[r][0] for r in range(n)], dtype=np.float32)
print(f"step {step} committed by {len(hosts)} trainers: model/b version {version_after}, "
      f"b[0] = {after[0]:.4f} (expected {expected:.4f})")
assert np.allclose(after, expected, atol=1e-5)
c.close()
