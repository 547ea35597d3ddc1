# SPDX-License-Identifier: Apache-2.0
"""C8 from Python: Client.use_local_reads maps the host's worker's local read
table; read() is then served there (no call) once the worker confirmed the
value, and never returns an older value than an acknowledged write."""

import time

import numpy as np
import pytest

import repvar
from conftest import SCALE


def _read_served_locally(c, name):
    served = c.local_read_stats()[0]
    deadline = time.monotonic() + 10 * SCALE
    while time.monotonic() < deadline:
        got = c.read(name)
        if c.local_read_stats()[0] > served:
            return got
        time.sleep(0.05)
    raise AssertionError(f"no read of {name} was served locally")


def test_local_read_is_the_committed_value_and_follows_writes(cluster):
    c = repvar.Client(cluster)
    c.create("local/w", "float32", (2, 8), replica_count=6, initializer=repvar.zeros())
    c.initialize(["local/w"])
    c.assign("local/w", np.full((2, 8), 3, np.float32))
    c.use_local_reads("tpu_worker:1")
    value, version = _read_served_locally(c, "local/w")
    info = c.variable("local/w")
    assert version == info.version and value.shape == (2, 8) and value[1, 7] == 3
    out = np.zeros((2, 8), np.float32)
    c.read("local/w", out=out)
    assert out[0, 0] == 3
    for i in range(5):
        ack = c.assign("local/w", np.full((2, 8), i, np.float32))
        value, version = c.read("local/w")  # at once: never the older value
        assert version == ack.version and value[0, 0] == i
    value, version = _read_served_locally(c, "local/w")
    assert version == ack.version and value[0, 0] == 4


def test_use_local_reads_refuses_what_is_not_a_live_worker(cluster):
    c = repvar.Client(cluster)
    with pytest.raises(repvar.InvalidArgument):
        c.use_local_reads("tpu_worker")
    with pytest.raises(repvar.NotFound):
        c.use_local_reads("tpu_worker:99")
    assert c.local_read_stats() == (0, 0)
