# SPDX-License-Identifier: Apache-2.0
"""The Python half of the local-cluster demo: numpy in, numpy out."""

import sys
import threading

import numpy as np

import repvar


def main():
    c = repvar.Client()
    topo = c.wait_for_topology(30)
    print(f"python: topology version {topo.version}, {len(topo.accelerators)} accelerators, "
          f"infeed on {topo.infeed_host.cpu_device}")
    with repvar.replicated_scope(len(topo.accelerators), "pymodel"):
        c.create("embedding", "bfloat16", (8, 4))
        c.create("scale", "float32", (), initializer=repvar.constant(1.0))
    c.initialize(["pymodel/scale"])
    bits = (np.arange(32, dtype=np.float32).reshape(8, 4).view(np.uint32) >> 16).astype(np.uint16)
    c.assign("pymodel/embedding", bits)  # bfloat16 as uint16 bit patterns
    c.assign("pymodel/scale", np.float32(0.5), op="add")
    emb, v1 = c.read("pymodel/embedding")
    scale, v2 = c.read("pymodel/scale")
    ok = emb.tobytes() == bits.tobytes() and float(scale) == 1.5
    print(f"python: embedding v{v1} bit-exact={emb.tobytes() == bits.tobytes()}, "
          f"scale v{v2} = {float(scale)}")
    info = c.variable("pymodel/embedding")
    for r in info.replicas:
        print(f"python:   {r.name} on {r.device}")
    ok = replicated_step(c, topo) and ok
    return 0 if ok else 1


def replicated_step(c, topo):
    """One replicated step from Python: a trainer thread per host scales its
    own replicas of pymodel/bias by (replica + 1); MEAN aggregation."""
    hosts = sorted({(a.job, a.task) for a in topo.accelerators})
    with repvar.replicated_scope(len(topo.accelerators), "pymodel"):
        c.create("bias", "float32", (4,), aggregation="MEAN", initializer=repvar.ones())
    c.initialize(["pymodel/bias"])
    step = c.last_committed_step() + 1
    results = {}

    def trainer(job, task):
        try:
            with c.step(step, worker=f"{job}:{task}") as s:
                for r in s.local_replicas("pymodel/bias"):
                    s.write("pymodel/bias", r, s.read("pymodel/bias", r) * np.float32(r + 1))
                results[task] = s.commit()
        except repvar.StepFailed as e:
            results[task] = e

    threads = [threading.Thread(target=trainer, args=h) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bias, version = c.read("pymodel/bias")
    n = len(topo.accelerators)
    expected = np.float32(1 + sum(range(n)) / n)  # 1 + mean(r) over the replicas
    ok = all(not isinstance(r, Exception) for r in results.values()) and bool(
        np.all(bias == expected))
    print(f"python: step {step} from {len(hosts)} trainer threads: pymodel/bias v{version} = "
          f"{bias.tolist()} (expected {float(expected)}), ok={ok}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
