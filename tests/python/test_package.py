# SPDX-License-Identifier: Apache-2.0
"""The Python package installs with Debian's pip, no network: into a
directory (--target) and into a venv that sees the system's grpcio and
numpy; either way `import repvar` works from any directory, stubs
included, and talks to a live cluster."""

import os
import subprocess
import sys

import pytest

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
PIP = ["-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index",
       "--disable-pip-version-check", os.path.join(SOURCE, "python")]
PROGRAM = """
import numpy as np, repvar, repvar.v1.coordinator_pb2_grpc
assert repvar.__file__.startswith({where!r}), repvar.__file__
with repvar.connect(timeout=20) as c:
    c.create({name!r}, "float32", (0, 3), replica_count=2)
    c.assign({name!r}, np.zeros((0, 3), np.float32))
    value, version = c.read({name!r})
    assert value.shape == (0, 3) and version == 1
    try:
        c.read("no/such/variable")
    except repvar.NotFound as e:
        print("ok", e.code.name)
"""


def run_program(python, cluster, where, name, tmp_path, env=None):
    env = dict(env or os.environ, REPVAR_COORDINATOR_ADDRESS=cluster)
    out = subprocess.run([python, "-c", PROGRAM.format(where=where, name=name)],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok NOT_FOUND" in out.stdout, out.stdout + out.stderr


def test_pip_install_target(cluster, tmp_path):
    target = str(tmp_path / "site")
    subprocess.run([sys.executable, *PIP, "--target", target], check=True,
                   capture_output=True, cwd=str(tmp_path))
    env = dict(os.environ, PYTHONPATH=target)
    run_program(sys.executable, cluster, target, "pkg/target", tmp_path, env)


def test_pip_install_into_a_venv_with_system_site_packages(cluster, tmp_path):
    venv = str(tmp_path / "venv")
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                   check=True, capture_output=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, *PIP], check=True, capture_output=True, cwd=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_program(python, cluster, venv, "pkg/venv", tmp_path, env)
