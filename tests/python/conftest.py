# SPDX-License-Identifier: Apache-2.0
"""Starts a real local cluster (coordinator + 3 TPU hosts + 1 CPU host) for the
Python tests: daemons bind port 0, report it through a port file, run in their
own session with a parent-death signal, and are stopped by PID."""

import ctypes
import os
import signal
import subprocess
import tempfile
import time

import pytest

BUILD = os.environ.get("REPVAR_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
SCALE = float(os.environ.get("REPVAR_TEST_TIMEOUT_SCALE", "1"))
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Daemon:
    def __init__(self, args, workdir, name):
        self.port_file = os.path.join(workdir, name + ".port")
        self.log_path = os.path.join(workdir, name + ".log")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args + ["--port_file=" + self.port_file], stdout=log,
                                     stderr=log, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 20 * SCALE
        while time.monotonic() < deadline:
            try:
                with open(self.port_file) as f:
                    self.port = int(f.read().strip())
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited early; see {self.log_path}")
            time.sleep(0.01)
        raise RuntimeError(f"{name} did not report its port; see {self.log_path}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_cluster(workdir, daemons, coordinator_args=()):
    """The local cluster's shape: a coordinator (with `coordinator_args`),
    tpu_worker:0-2 with two TPUs each and worker:0 without any. Appends each
    daemon to `daemons` as it starts (the caller stops them); returns the
    coordinator's address."""
    coord = Daemon([os.path.join(BUILD, "server/repvar-coordinator"),
                    "--expected_tasks=tpu_worker:3,worker:1", *coordinator_args],
                   workdir, "coordinator")
    daemons.append(coord)
    address = f"127.0.0.1:{coord.port}"
    for job, task, tpus in [("tpu_worker", 0, 2), ("tpu_worker", 1, 2), ("tpu_worker", 2, 2),
                            ("worker", 0, 0)]:
        daemons.append(Daemon([os.path.join(BUILD, "worker/repvar-worker"), f"--job={job}",
                               f"--task={task}", f"--tpu_devices={tpus}",
                               f"--coordinator_address={address}"], workdir, f"{job}-{task}"))
    return address


@pytest.fixture(scope="module")
def cluster():
    with tempfile.TemporaryDirectory(prefix="repvar-py-") as d:
        daemons = []
        try:
            yield start_cluster(d, daemons, [f"--data_dir={os.path.join(d, 'coordinator-data')}"])
        finally:
            for daemon in reversed(daemons):
                daemon.stop()


@pytest.fixture(scope="module")
def client(cluster):
    """A repvar.Client that has seen the module's cluster form."""
    import repvar
    c = repvar.Client(cluster)
    c.wait_for_topology(20)
    yield c
    c.close()
