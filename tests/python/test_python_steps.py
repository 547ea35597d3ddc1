# SPDX-License-Identifier: Apache-2.0
"""Replicated steps from Python: the Step context manager over the stubs."""

import threading

import grpc
import numpy as np
import pytest

import repvar


def _run_step(client, step, body, timeout=20.0):
    """One trainer thread per host (tpu_worker:0..2); returns each commit's
    resolution or exception."""
    out = [None] * 3

    def trainer(h):
        try:
            with client.step(step, worker=f"tpu_worker:{h}", barrier_timeout=timeout) as s:
                body(h, s)
                out[h] = s.commit()
        except Exception as e:  # noqa: BLE001 - returned to the test
            out[h] = e

    threads = [threading.Thread(target=trainer, args=(h,)) for h in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_mean_step_from_python_exact_and_bit_identical(client):
    with repvar.replicated_scope(6, "pysteps"):
        client.create("w", "float32", (3,), aggregation="MEAN",
                      initializer=repvar.value(np.array([1, 2, 3], np.float32), "float32"))
    client.initialize(["pysteps/w"])
    first = client.last_committed_step() + 1

    def body(h, s):
        for r in s.local_replicas("pysteps/w"):
            s.write("pysteps/w", r, s.read("pysteps/w", r) + np.float32(6 * (r + 1)))

    results = _run_step(client, first, body)
    for r in results:
        assert not isinstance(r, Exception), r
        assert r.step == first and [c.name for c in r.changed] == ["pysteps/w"]
    value, version = client.read("pysteps/w")
    np.testing.assert_array_equal(value, np.array([22, 23, 24], np.float32))  # + mean(6..36)
    assert version == 2
    info = client.variable("pysteps/w")
    assert len({rep.checksum for rep in info.replicas}) == 1


def test_write_many_and_read_many_small_and_large_in_few_calls(client):
    """write_many sends the small writes in one call (the large one as write()
    does); read_many reads many values in one call, as writable arrays."""
    with repvar.replicated_scope(6, "pymany"):
        client.create("a", "float32", (4,), aggregation="MEAN", initializer=repvar.zeros())
        client.create("b", "int32", (2, 2), aggregation="SUM", initializer=repvar.zeros())
        client.create("big", "float32", (300 * 1024,), aggregation="MEAN",
                      initializer=repvar.zeros())  # 1.2 MiB: through a mapping
    client.initialize(["pymany/a", "pymany/b", "pymany/big"])
    step = client.last_committed_step() + 1

    def body(h, s):
        s.write_many((name, r, value) for name, value in
                      (("pymany/a", np.full(4, h + 1, np.float32)),
                       ("pymany/b", np.full((2, 2), 1, np.int32)),
                       ("pymany/big", np.full(300 * 1024, 2 * h, np.float32)))
                      for r in s.local_replicas(name))

    for r in _run_step(client, step, body):
        assert not isinstance(r, Exception), r
    (a, va), (b, vb) = client.read_many(["pymany/a", "pymany/b"])
    np.testing.assert_array_equal(a, np.full(4, 2, np.float32))  # mean of 1, 1, 2, 2, 3, 3
    np.testing.assert_array_equal(b, np.full((2, 2), 6, np.int32))  # the sum of 6 replicas' 1
    assert va == 2 and vb == 2
    a[0] = 7  # writable: torch.from_numpy takes it as is
    big, _ = client.read("pymany/big")
    np.testing.assert_array_equal(big[:3], np.full(3, 2, np.float32))  # mean of 0, 0, 2, 2, 4, 4
    with pytest.raises(repvar.NotFound):
        client.read_many(["pymany/a", "pymany/nope"])


def test_leaving_the_block_without_commit_aborts_and_changes_nothing(client):
    with repvar.replicated_scope(6, "pysteps"):
        client.create("n", "float32", (2,), initializer=repvar.zeros())
    client.initialize(["pysteps/n"])
    step = client.last_committed_step() + 1
    with client.step(step, worker="tpu_worker:1") as s:
        s.write("pysteps/n", 2, np.array([5, 5], np.float32))
        np.testing.assert_array_equal(s.read("pysteps/n", 2), [5, 5])
    value, version = client.read("pysteps/n")
    np.testing.assert_array_equal(value, [0, 0])
    assert version == 1
    # the id of an aborted step may be used again
    results = _run_step(client, step, lambda h, s: None)
    assert all(not isinstance(r, Exception) for r in results), results


def test_cross_replica_assign_during_a_step_is_refused(client):
    with repvar.replicated_scope(6, "pysteps"):
        client.create("g", "float32", (2,), initializer=repvar.zeros())
    client.initialize(["pysteps/g"])
    with client.step(client.last_committed_step() + 1, worker="tpu_worker:0"):
        with pytest.raises(repvar.FailedPrecondition):
            client.assign("pysteps/g", np.ones(2, np.float32))


def test_barrier_timeout_raises_step_failed_naming_the_missing_worker(client):
    step = client.last_committed_step() + 1
    # only two of the three hosts take part
    out = [None] * 2

    def trainer(h):
        try:
            with client.step(step, worker=f"tpu_worker:{h}", barrier_timeout=1.5) as s:
                out[h] = s.commit()
        except repvar.StepFailed as e:
            out[h] = e

    threads = [threading.Thread(target=trainer, args=(h,)) for h in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in out:
        assert isinstance(r, repvar.StepFailed), r
        assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "tpu_worker:2" in str(r)


def test_repvarctl_steps_and_watch_show_progress_and_resolution(client, cluster):
    import os
    import subprocess
    from conftest import BUILD
    ctl = os.path.join(BUILD, "client/repvarctl")
    env = dict(os.environ, REPVAR_COORDINATOR_ADDRESS=cluster)
    with repvar.replicated_scope(6, "ctl"):
        client.create("v", "float32", (2,), initializer=repvar.zeros())
    client.initialize(["ctl/v"])
    # --after=0: from the first event the coordinator holds (by default a
    # watch shows only what happens after it started).
    watch = subprocess.Popen([ctl, "watch", "--watch_for=20s", "--after=0"], env=env,
                             stdout=subprocess.PIPE, text=True)
    jwatch = subprocess.Popen([ctl, "watch", "--json", "--watch_for=20s", "--after=0"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        step = client.last_committed_step() + 1
        # one host reports; the others are still missing
        scope = client.step(step, worker="tpu_worker:0", barrier_timeout=20)
        done = threading.Thread(target=lambda: _ignore(scope.commit))
        done.start()
        lines = []
        for _ in range(200):
            out = subprocess.run([ctl, "steps"], env=env, capture_output=True, text=True,
                                 check=True).stdout
            lines = out.splitlines()
            if any("tpu_worker:0  reported" in l for l in lines):
                break
        assert any(f"open: step {step}" in l for l in lines), lines
        assert any("tpu_worker:0  reported" in l for l in lines), lines
        assert any("tpu_worker:2  WAITING" in l for l in lines), lines
        st = strict_json(subprocess.run([ctl, "--json", "steps"], env=env, capture_output=True,
                                        text=True, check=True).stdout)
        assert st["open"]["step"] == step, st
        by_task = {p["task"]: p["reported"] for p in st["open"]["participants"]}
        assert by_task["tpu_worker:0"] and not by_task["tpu_worker:2"], st
        results = _run_step(client, step, lambda h, s: None)
        done.join()
        assert all(not isinstance(r, Exception) for r in results), results
        out = subprocess.run([ctl, "steps"], env=env, capture_output=True, text=True,
                             check=True).stdout
        assert f"last committed step: {step}" in out
        assert f"step {step} (epoch" in out and "committed" in out
        st = strict_json(subprocess.run([ctl, "steps", "--json"], env=env, capture_output=True,
                                        text=True, check=True).stdout)
        assert st["open"] is None and st["last_committed_step"] == step, st
        assert st["recent"][-1]["step"] == step and st["recent"][-1]["committed"], st
    finally:
        watch.terminate()
        jwatch.terminate()
        events = watch.communicate(timeout=10)[0]
        jevents = [strict_json(line) for line in jwatch.communicate(timeout=10)[0].splitlines()]
    assert f"step {step} " in events and "BEGUN" in events and "RESOLVED" in events, events
    assert "REPORTED tpu_worker:0" in events, events
    mine = [e for e in jevents if e["step"] == step]
    assert {"BEGUN", "REPORTED", "RESOLVED"} <= {e["kind"] for e in mine}, jevents
    assert any(e["kind"] == "RESOLVED" and e["committed"] for e in mine), mine
    # A watch started now shows nothing of what came before.
    late = subprocess.run([ctl, "watch", "--watch_for=1s"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert late == "", late
    # --from=STEP: what the coordinator holds of that step on (not the one before).
    held = [strict_json(line) for line in subprocess.run(
        [ctl, "watch", "--json", "--watch_for=1s", f"--from={step}"], env=env,
        capture_output=True, text=True, check=True).stdout.splitlines()]
    assert held and all(e["step"] >= step for e in held), held
    assert any(e["kind"] == "RESOLVED" and e["step"] == step for e in held), held
    assert any(e["step"] == step - 1 for e in jevents) or step == 1


def strict_json(text):
    """JSON as the standard has it: no NaN or Infinity tokens."""
    import json

    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def _ignore(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - the commit's outcome is checked elsewhere
        pass


def test_map_in_place_from_python_update_and_publish(client):
    with repvar.replicated_scope(6, "pymap"):
        client.create("m", "float32", (4,), aggregation="MEAN",
                      initializer=repvar.value(np.full(4, 2, np.float32), "float32"))
    client.initialize(["pymap/m"])
    step = client.last_committed_step() + 1

    def body(h, s):
        for r in s.local_replicas("pymap/m"):
            with s.map("pymap/m", r, "read") as view:
                assert view.array.tolist() == [2, 2, 2, 2]
                assert not view.array.flags.writeable
            m = s.map("pymap/m", r, "update")
            m.array *= np.float32(r + 1)  # in the worker's own buffer
            s.publish(m)
            np.testing.assert_array_equal(s.read("pymap/m", r), np.full(4, 2 * (r + 1)))
            with s.map("pymap/m", r, "write") as w:  # never published: no effect
                w.array[:] = 100

    results = _run_step(client, step, body)
    for r in results:
        assert not isinstance(r, Exception), r
    value, _ = client.read("pymap/m")
    np.testing.assert_array_equal(value, np.full(4, 7, np.float32))  # 2 * mean(1..6)


def test_large_write_and_read_go_through_the_mapping(client):
    n = 1 << 19  # 2 MiB of float32
    with repvar.replicated_scope(6, "pybig"):
        client.create("v", "float32", (n,), aggregation="ONLY_FIRST_REPLICA",
                      initializer=repvar.zeros())
    client.initialize(["pybig/v"])
    value = (np.arange(n, dtype=np.float32) % 1000) * np.float32(0.5)

    def body(h, s):
        if h != 0:
            return
        s.write("pybig/v", 0, value)
        np.testing.assert_array_equal(s.read("pybig/v", 0), value)
        assert not getattr(s, "_map_failed", False)  # it really went through the mapping

    results = _run_step(client, client.last_committed_step() + 1, body)
    for r in results:
        assert not isinstance(r, Exception), r
    back, _ = client.read("pybig/v")
    np.testing.assert_array_equal(back, value)
    assert len({rep.checksum for rep in client.variable("pybig/v").replicas}) == 1


def test_read_out_writes_the_steps_view_in_place_mapped_and_through_the_socket(client):
    # 2 MiB goes through the mapping, 256 KiB and 16 bytes through the
    # worker's socket; another dtype or size is InvalidArgument, untouched.
    sizes = {"mapped": 1 << 19, "streamed": 1 << 16, "small": 4}
    with repvar.replicated_scope(6, "pyout"):
        for name, n in sizes.items():
            client.create(name, "float32", (n,), aggregation="ONLY_FIRST_REPLICA",
                          initializer=repvar.zeros())
    client.initialize([f"pyout/{name}" for name in sizes])

    def body(h, s):
        if h != 0:
            return
        for name, n in sizes.items():
            full = f"pyout/{name}"
            out = np.full(n, -1, np.float32)
            assert s.read(full, 0, out=out) is out
            np.testing.assert_array_equal(out, np.zeros(n, np.float32))
            value = (np.arange(n, dtype=np.float32) % 977) + np.float32(0.25)
            s.write(full, 0, value)
            raw = np.zeros(n * 4, np.uint8)  # the raw bytes, into uint8
            assert s.read(full, 0, out=raw) is raw
            np.testing.assert_array_equal(raw.view(np.float32), value)
            for wrong in (np.full(n + 1, -2, np.float32), np.full(n, -2, np.float64)):
                with pytest.raises(repvar.InvalidArgument):
                    s.read(full, 0, out=wrong)
                assert (wrong == -2).all()
        assert not getattr(s, "_map_failed", False)

    results = _run_step(client, client.last_committed_step() + 1, body)
    for r in results:
        assert not isinstance(r, Exception), r


def test_read_many_gives_each_view_as_read_does_the_small_ones_batched(client):
    # 2 MiB mapped, 256 KiB streamed, 64 KiB and 16 bytes from StepReadSmall
    # (5,000 small reads: more than one call); this step's writes and the
    # committed zeros alike, each as read() gives it. The worker's calls are
    # counted: the small reads take two StepReadSmall calls and no stream,
    # and so does read() of a small one.
    sizes = {"mapped": 1 << 19, "streamed": 1 << 16, "inline": 1 << 14, "small": 4, "other": 4}
    with repvar.replicated_scope(6, "pymany"):
        for name, n in sizes.items():
            client.create(name, "float32", (n,), aggregation="ONLY_FIRST_REPLICA",
                          initializer=repvar.zeros())
    client.initialize([f"pymany/{name}" for name in sizes])

    def body(h, s):
        if h != 0:
            return
        for name in ("streamed", "small"):
            s.write(f"pymany/{name}", 0, (np.arange(sizes[name], dtype=np.float32) % 31) + 0.5)
        calls = []
        for method in ("StepRead", "StepReadSmall"):
            stub = s._frames if method == "StepRead" else s.worker
            real = getattr(stub, method)
            setattr(stub, method, lambda *a, _real=real, _m=method, **k: (calls.append(_m),
                                                                         _real(*a, **k))[1])
        small = [("pymany/small" if i % 2 else "pymany/other", 0) for i in range(5000)]
        reads = [(f"pymany/{name}", 0) for name in sizes] + small
        got = s.read_many(reads)
        assert calls == ["StepRead", "StepReadSmall", "StepReadSmall"], calls
        assert len(got) == len(reads)
        for (name, replica), value in zip(reads, got):
            one = s.read(name, replica)
            assert value.dtype == one.dtype and value.shape == one.shape
            np.testing.assert_array_equal(value, one)
            assert value.flags.writeable
        assert got[3].any() and not got[4].any()  # this step's write; the committed zeros
        assert s.read_many([]) == []
        calls.clear()  # a small read alone: one unary call too, not a stream
        np.testing.assert_array_equal(s.read("pymany/small", 0), got[3])
        assert calls == ["StepReadSmall"], calls
        with pytest.raises(KeyError):
            s.read_many([("pymany/small", 0), ("pymany/absent", 0)])
        elsewhere = next(r for r in range(6) if r not in s.local_replicas("pymany/small"))
        with pytest.raises(repvar.NotFound):
            s.read_many([("pymany/small", 0), ("pymany/small", elsewhere)])

    results = _run_step(client, client.last_committed_step() + 1, body)
    for r in results:
        assert not isinstance(r, Exception), r


def test_mapped_writes_step_after_step_keep_their_mappings_and_bytes(client):
    # The client keeps its mappings of the worker's buffers between leases
    # (_MappingCache) and the worker lends the same buffers again: every step
    # must still read the last committed bytes and commit its own.
    n = 1 << 19  # 2 MiB of float32: shared buffers
    with repvar.replicated_scope(6, "pykept"):
        client.create("v", "float32", (n,), aggregation="ONLY_FIRST_REPLICA",
                      initializer=repvar.zeros())
    client.initialize(["pykept/v"])
    hits = client._mappings.hits
    for k in range(1, 6):
        def body(h, s, k=k):
            if h != 0:
                return
            with s.map("pykept/v", 0, "read") as before:
                assert before.array[0] == k - 1 and before.array[-1] == k - 1
            s.write("pykept/v", 0, np.full(n, k, np.float32))

        results = _run_step(client, client.last_committed_step() + 1, body)
        for r in results:
            assert not isinstance(r, Exception), r
        back, _ = client.read("pykept/v")
        np.testing.assert_array_equal(back, np.full(n, k, np.float32))
    assert client._mappings.hits > hits  # the later steps mapped kept buffers
