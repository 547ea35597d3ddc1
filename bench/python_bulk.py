#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Bulk bytes from Python: a MIB MiB value assigned to one replica (durable)
and read back, into a fresh array and into a kept one (read(out=...)), with
the client's malloc tuning on and off (each in a process of its own: the
setting is the process's). No goal line: the figures show what a Python
caller (repvar.torch included) gets next to the C++ client's
(repvar_bench's repvar_p2p). Starts its own coordinator and worker.

    /usr/bin/python3 bench/python_bulk.py BUILD [--mib=64] [--rounds=8]
prints per setting:
    repvar_python mib=64 tune_malloc=1 assign_ms=... read_ms=... read_out_ms=...
and, with the tuning on, a small read through the coordinator and from the
worker's local read table:
    repvar_python_small read_p50_us=... local_read_p50_us=...
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from torch_step import wait_port  # bench/: no torch imported


def child(address, mib, rounds, tune):
    import numpy as np
    import repvar
    c = repvar.Client(address, tune_malloc=tune)
    name = f"python_bulk_{int(tune)}"
    n = mib << 18
    c.create(name, "float32", (n,), replica_count=1)
    value = np.random.default_rng(0).random(n, dtype=np.float32)
    kept = np.empty_like(value)
    times = {"assign": [], "read": [], "read_out": []}
    for i in range(rounds + 2):  # two to warm up
        value[0] = i
        t0 = time.perf_counter()
        c.assign(name, value)
        t1 = time.perf_counter()
        fresh, _ = c.read(name)
        t2 = time.perf_counter()
        c.read(name, out=kept)
        t3 = time.perf_counter()
        if fresh.tobytes() != value.tobytes() or kept.tobytes() != value.tobytes():
            raise SystemExit("the value read back differs from the value assigned")
        del fresh
        if i >= 2:
            for k, s in (("assign", t1 - t0), ("read", t2 - t1), ("read_out", t3 - t2)):
                times[k].append(1000 * s)
    print(f"repvar_python mib={mib} tune_malloc={int(tune)} " +
          " ".join(f"{k}_ms={statistics.median(v):.1f}" for k, v in times.items()), flush=True)
    if tune:
        small_reads(c)
    c.close()


def small_reads(c, ops=2000):
    """A 16-float read through the coordinator, then from the worker's local
    read table (C8), every one of the latter served there."""
    import numpy as np
    c.create("python_small", "float32", (16,), replica_count=1)
    c.assign("python_small", np.ones(16, np.float32))

    def p50_us():
        times = []
        for _ in range(ops):
            t0 = time.perf_counter()
            c.read("python_small")
            times.append(1e6 * (time.perf_counter() - t0))
        return statistics.median(times)

    remote = p50_us()
    c.use_local_reads("tpu_worker:0")
    deadline = time.monotonic() + 10
    while c.local_read_stats()[0] == 0 and time.monotonic() < deadline:
        c.read("python_small")
        time.sleep(0.02)
    served = c.local_read_stats()[0]
    local = p50_us()
    if c.local_read_stats()[0] - served != ops:
        raise SystemExit("some local reads were not served locally")
    print(f"repvar_python_small read_p50_us={remote:.1f} local_read_p50_us={local:.1f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--child", nargs=2, metavar=("ADDRESS", "TUNE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.mib, args.rounds, args.child[1] == "1")
        return
    build = os.path.abspath(args.build)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    with tempfile.TemporaryDirectory(prefix="repvar-python-bench-") as d:
        procs = []
        try:
            coord = subprocess.Popen(
                [os.path.join(build, "server/repvar-coordinator"), f"--data_dir={d}/data",
                 "--expected_tasks=tpu_worker:1", f"--port_file={d}/c.port", "--exit_with_parent"],
                stdout=subprocess.DEVNULL, stderr=open(f"{d}/c.port.log", "w"))
            procs.append(coord)
            address = f"127.0.0.1:{wait_port(f'{d}/c.port', coord)}"
            procs.append(subprocess.Popen(
                [os.path.join(build, "worker/repvar-worker"), "--job=tpu_worker", "--task=0",
                 "--tpu_devices=1", f"--coordinator_address={address}", "--exit_with_parent"],
                stdout=subprocess.DEVNULL, stderr=open(f"{d}/w0.log", "w")))
            for tune in ("0", "1", "0", "1"):
                subprocess.run(["/usr/bin/python3", __file__, build, f"--mib={args.mib}",
                                f"--rounds={args.rounds}", "--child", address, tune],
                               env=env, check=True, timeout=600)
        finally:
            for p in reversed(procs):
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
