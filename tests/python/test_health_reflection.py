# SPDX-License-Identifier: Apache-2.0
"""Operators and tools can ask the daemons what they serve and whether they
are ready: grpc.health.v1 per service (SERVING once ready; an unknown
service is NOT_FOUND) and server reflection (grpcurl-style listing), both
through stubs generated at test time from Debian's grpc-proto files (its
python3-grpcio has no grpc_health/grpc_reflection modules)."""

import importlib
import os
import shutil
import subprocess
import sys

import grpc
import pytest

import repvar

PROTOS = "/usr/share/grpc-proto"


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    # Compiled under names of their own: the grpc package cannot take
    # modules from another directory.
    out = str(tmp_path_factory.mktemp("grpc-stubs"))
    for proto, name in (("grpc/health/v1/health.proto", "health"),
                        ("grpc/reflection/v1alpha/reflection.proto", "reflection")):
        shutil.copy(os.path.join(PROTOS, proto), os.path.join(out, name + ".proto"))
        subprocess.run(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                        "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                        os.path.join(out, name + ".proto")], check=True)
    sys.path.insert(0, out)
    try:
        yield {name: importlib.import_module(name) for name in (
            "health_pb2", "health_pb2_grpc", "reflection_pb2", "reflection_pb2_grpc")}
    finally:
        sys.path.remove(out)


def check(stubs, address, service):
    pb = stubs["health_pb2"]
    with grpc.insecure_channel(address) as channel:
        stub = stubs["health_pb2_grpc"].HealthStub(channel)
        try:
            status = stub.Check(pb.HealthCheckRequest(service=service), timeout=10).status
        except grpc.RpcError as e:
            return e.code()
    return pb.HealthCheckResponse.ServingStatus.Name(status)


def test_health_per_service_serving_once_ready_unknown_not_found(stubs, client, cluster):
    for service in ("", "repvar.v1.CoordinatorWorkers", "repvar.v1.CoordinatorTrainers",
                    "repvar.v1.CoordinatorAdmin"):
        assert check(stubs, cluster, service) == "SERVING", service
    assert check(stubs, cluster, "repvar.v1.NoSuchService") == grpc.StatusCode.NOT_FOUND
    workers = [t.address for t in client.topology().tasks]
    assert len(workers) == 4
    for address in workers:
        for service in ("", "repvar.v1.WorkerReplicas", "repvar.v1.WorkerSteps"):
            assert check(stubs, address, service) == "SERVING", (address, service)


def list_services(stubs, address):
    pb = stubs["reflection_pb2"]
    with grpc.insecure_channel(address) as channel:
        stub = stubs["reflection_pb2_grpc"].ServerReflectionStub(channel)
        requests = [pb.ServerReflectionRequest(list_services=""),
                    pb.ServerReflectionRequest(
                        file_containing_symbol="repvar.v1.CoordinatorTrainers")]
        answers = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    names = {s.name for s in answers[0].list_services_response.service}
    return names, answers[1]


def test_reflection_lists_the_services_and_describes_them(stubs, client, cluster):
    names, described = list_services(stubs, cluster)
    assert {"repvar.v1.CoordinatorWorkers", "repvar.v1.CoordinatorTrainers",
            "repvar.v1.CoordinatorAdmin", "grpc.health.v1.Health"} <= names
    files = described.file_descriptor_response.file_descriptor_proto
    assert files, described
    from google.protobuf import descriptor_pb2
    parsed = [descriptor_pb2.FileDescriptorProto.FromString(f) for f in files]
    methods = {m.name for f in parsed for s in f.service if s.name == "CoordinatorTrainers"
               for m in s.method}
    assert {"AssignVariable", "ReadVariable", "BeginStep"} <= methods
    worker = client.topology().tasks[0].address
    worker_names, _ = list_services(stubs, worker)
    assert {"repvar.v1.WorkerReplicas", "repvar.v1.WorkerSteps"} <= worker_names


def test_worker_not_serving_until_registered(stubs, tmp_path):
    """A worker whose coordinator is unreachable serves its port but is not
    ready: health says NOT_SERVING (it would say SERVING once registered,
    as the cluster test above shows)."""
    from conftest import BUILD, Daemon
    import socket
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]
    worker = Daemon([os.path.join(BUILD, "worker/repvar-worker"), "--job=tpu_worker", "--task=0",
                     "--tpu_devices=1", f"--coordinator_address=127.0.0.1:{nobody}"],
                    str(tmp_path), "lonely-worker")
    try:
        address = f"127.0.0.1:{worker.port}"
        for service in ("", "repvar.v1.WorkerReplicas", "repvar.v1.WorkerSteps"):
            assert check(stubs, address, service) == "NOT_SERVING", service
    finally:
        worker.stop()


def test_drain_not_serving_changes_refused_reads_go_on_resume(stubs, client, cluster):
    import numpy as np
    from repvar.v1 import coordinator_pb2 as cpb
    client.create("drained/w", "float32", (2,), replica_count=2)
    client.assign("drained/w", np.array([1, 2], dtype=np.float32))
    drained = client.admin.Drain(cpb.DrainRequest(), timeout=10)
    try:
        assert drained.draining
        assert check(stubs, cluster, "") == "NOT_SERVING"
        assert check(stubs, cluster, "repvar.v1.CoordinatorTrainers") == "NOT_SERVING"
        # Workers and the operator are still served.
        assert check(stubs, cluster, "repvar.v1.CoordinatorWorkers") == "SERVING"
        assert check(stubs, cluster, "repvar.v1.CoordinatorAdmin") == "SERVING"
        with pytest.raises(repvar.Unavailable) as refused:
            client.assign("drained/w", np.array([3, 4], dtype=np.float32))
        assert "draining" in refused.value.message
        back, version = client.read("drained/w")
        assert version == 1 and back.tolist() == [1, 2]
    finally:
        resumed = client.admin.Drain(cpb.DrainRequest(resume=True), timeout=10)
    assert not resumed.draining
    assert check(stubs, cluster, "") == "SERVING"
    assert check(stubs, cluster, "repvar.v1.CoordinatorTrainers") == "SERVING"
    assert client.assign("drained/w", np.array([3, 4], dtype=np.float32)).version == 2


def test_health_alone_in_plaintext_beside_tls(stubs, tmp_path):
    """--health_address: a plaintext listener for probes that cannot speak
    TLS (Kubernetes' grpc probe) answers grpc.health.v1 as the TLS listener
    does, "liveness" SERVING through a drain, and serves nothing else: no
    repvar method, no reflection."""
    from conftest import BUILD, Daemon
    import repvar
    from repvar.v1 import coordinator_pb2 as cpb
    source = os.path.join(os.path.dirname(__file__), "../..")
    certs = str(tmp_path / "certs")
    subprocess.run([os.path.join(source, "deploy/make-certs.sh"), certs], check=True,
                   capture_output=True)
    health_port_file = str(tmp_path / "health.port")
    coord = Daemon([os.path.join(BUILD, "server/repvar-coordinator"), "--ephemeral",
                    "--expected_tasks=tpu_worker:1", f"--tls_cert={certs}/coordinator.pem",
                    f"--tls_key={certs}/coordinator.key", f"--tls_ca={certs}/ca.pem",
                    f"--worker_token_file={certs}/worker.token",
                    f"--trainer_token_file={certs}/trainer.token",
                    f"--admin_token_file={certs}/admin.token",
                    "--health_address=127.0.0.1:0", f"--health_port_file={health_port_file}"],
                   str(tmp_path), "coordinator")
    admin = repvar.Client(f"127.0.0.1:{coord.port}", tls_ca=f"{certs}/ca.pem",
                          token_file=f"{certs}/admin.token")
    try:
        with open(health_port_file) as f:
            health = f"127.0.0.1:{int(f.read())}"
        assert check(stubs, health, "") == "SERVING"
        assert check(stubs, health, "liveness") == "SERVING"
        assert check(stubs, health, "repvar.v1.CoordinatorTrainers") == "SERVING"
        assert check(stubs, health, "repvar.v1.NoSuchService") == grpc.StatusCode.NOT_FOUND
        # The TLS listener takes no plaintext; the health listener nothing but health.
        assert check(stubs, f"127.0.0.1:{coord.port}", "") == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(health) as channel:
            for method in ("/repvar.v1.CoordinatorTrainers/ListVariables",
                           "/repvar.v1.CoordinatorAdmin/Drain"):
                with pytest.raises(grpc.RpcError) as refused:
                    channel.unary_unary(method)(b"", timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
        with pytest.raises(grpc.RpcError) as no_reflection:
            list_services(stubs, health)
        assert no_reflection.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # Draining: not ready, still alive; both listeners agree.
        assert admin.admin.Drain(cpb.DrainRequest(), timeout=10).draining
        assert check(stubs, health, "") == "NOT_SERVING"
        assert check(stubs, health, "repvar.v1.CoordinatorTrainers") == "NOT_SERVING"
        assert check(stubs, health, "liveness") == "SERVING"
        assert not admin.admin.Drain(cpb.DrainRequest(resume=True), timeout=10).draining
        assert check(stubs, health, "") == "SERVING"
    finally:
        admin.close()
        coord.stop()
