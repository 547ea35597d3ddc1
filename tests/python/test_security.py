# SPDX-License-Identifier: Apache-2.0
"""Contract X1 from Python: the numpy helper reaches a cluster serving TLS
with tokens through REPVAR_TLS_CA and REPVAR_TOKEN_FILE; a call without the
token, or with a role's token that may not make it, is refused and changes
nothing. Certificates come from deploy/make-certs.sh (openssl) at test time."""

import os
import subprocess
import tempfile

import grpc
import numpy as np
import pytest

import repvar
from conftest import BUILD, Daemon

SOURCE = os.path.join(os.path.dirname(__file__), "../..")


@pytest.fixture(scope="module")
def secure_cluster():
    with tempfile.TemporaryDirectory(prefix="repvar-py-tls-") as d:
        certs = os.path.join(d, "certs")
        subprocess.run([os.path.join(SOURCE, "deploy/make-certs.sh"), certs,
                        "--workers", "tpu_worker:0"], check=True)

        def tls(name, token_flag):
            return [f"--tls_cert={certs}/{name}.pem", f"--tls_key={certs}/{name}.key",
                    f"--tls_ca={certs}/ca.pem", f"--{token_flag}={certs}/worker.token",
                    f"--trainer_token_file={certs}/trainer.token",
                    f"--admin_token_file={certs}/admin.token"]

        daemons = []
        try:
            coord = Daemon([os.path.join(BUILD, "server/repvar-coordinator"),
                            "--expected_tasks=tpu_worker:1", "--ephemeral"]
                           + tls("coordinator", "worker_token_file"), d, "coordinator")
            daemons.append(coord)
            address = f"127.0.0.1:{coord.port}"
            daemons.append(Daemon([os.path.join(BUILD, "worker/repvar-worker"),
                                   "--job=tpu_worker", "--task=0", "--tpu_devices=2",
                                   f"--coordinator_address={address}"]
                                  + tls("tpu_worker-0", "token_file"), d, "tpu_worker-0"))
            yield address, certs
        finally:
            for daemon in reversed(daemons):
                daemon.stop()


def test_tls_and_token_from_the_environment(secure_cluster, monkeypatch):
    address, certs = secure_cluster
    monkeypatch.setenv("REPVAR_COORDINATOR_ADDRESS", address)
    monkeypatch.setenv("REPVAR_TLS_CA", os.path.join(certs, "ca.pem"))
    monkeypatch.setenv("REPVAR_TOKEN_FILE", os.path.join(certs, "trainer.token"))
    c = repvar.Client()
    try:
        c.wait_for_topology(20)
        c.create("w", "float32", (3,), replica_count=2)
        value = np.array([1.5, -2.0, 3.25], dtype=np.float32)
        c.assign("w", value)
        back, version = c.read("w")
        assert version == 1 and back.tobytes() == value.tobytes()
        # Deleting is the admin's: refused, and the variable is kept.
        with pytest.raises(repvar.PermissionDenied):
            c.delete("w")
        assert [v.spec.name for v in c.list()] == ["w"]
    finally:
        c.close()
    admin = repvar.Client(address, tls_ca=os.path.join(certs, "ca.pem"),
                          token_file=os.path.join(certs, "admin.token"))
    try:
        admin.delete("w")
        assert list(admin.list()) == []
    finally:
        admin.close()


def test_no_token_unauthenticated_nothing_created(secure_cluster):
    address, certs = secure_cluster
    c = repvar.Client(address, tls_ca=os.path.join(certs, "ca.pem"))
    try:
        with pytest.raises(repvar.Unauthenticated):
            c.create("x", "float32", (3,), replica_count=2)
    finally:
        c.close()
    c = repvar.Client(address, tls_ca=os.path.join(certs, "ca.pem"),
                      token_file=os.path.join(certs, "trainer.token"))
    try:
        assert [v.spec.name for v in c.list()] == []
    finally:
        c.close()
