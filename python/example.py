# SPDX-License-Identifier: Apache-2.0
"""The Python half of the local-cluster demo: numpy in, numpy out."""

import sys

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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
