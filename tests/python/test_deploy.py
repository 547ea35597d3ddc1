# SPDX-License-Identifier: Apache-2.0
"""The shipped deployment files say what the daemons accept: every flag the
Kubernetes manifests and the systemd units pass (or show in their comments)
is one the daemon's --helpfull lists; the manifests parse, each probe and mount
names a port or volume that exists, and both daemons run with TLS."""

import os
import re
import subprocess

import pytest
import yaml

from conftest import BUILD

SOURCE = os.path.join(os.path.dirname(__file__), "../..")
BINARIES = {"repvar-coordinator": "server/repvar-coordinator",
            "repvar-worker": "worker/repvar-worker"}


def known_flags(daemon):
    out = subprocess.run([os.path.join(BUILD, BINARIES[daemon]), "--helpfull"],
                         capture_output=True, text=True).stdout
    return set(re.findall(r"^\s+--([a-z_]+) \(", out, re.M))


def flags_in(text):
    return set(re.findall(r"(?<![\w-])--([a-z_]+)", text))


def test_the_flag_checker_catches_an_unknown_flag():
    assert "tls_cert" in known_flags("repvar-coordinator")
    assert "no_such_flag" not in known_flags("repvar-coordinator")
    assert flags_in('exec repvar-worker --job=x --tls_ca="$A"') == {"job", "tls_ca"}


def manifests():
    with open(os.path.join(SOURCE, "deploy/kubernetes/repvar.yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def test_kubernetes_manifests_name_real_flags_ports_and_volumes():
    docs = manifests()
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert ("NetworkPolicy", "repvar-coordinator") in kinds
    assert ("NetworkPolicy", "repvar-worker") in kinds
    sets = [d for d in docs if d["kind"] == "StatefulSet"]
    assert len(sets) == 2
    for s in sets:
        pod = s["spec"]["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])}
        volumes |= {v["metadata"]["name"] for v in s["spec"].get("volumeClaimTemplates", [])}
        for c in pod["containers"]:
            text = " ".join(c.get("command", []) + c.get("args", []))
            daemon = next(d for d in BINARIES if d in text)
            unknown = flags_in(text) - known_flags(daemon)
            assert not unknown, f"{s['metadata']['name']}: {daemon} has no flag {unknown}"
            # TLS and tokens on every daemon.
            assert {"tls_cert", "tls_key", "tls_ca", "trainer_token_file"} <= flags_in(text)
            ports = {p["containerPort"] for p in c["ports"]}
            # grpc probes on the plaintext health listener, readiness and liveness.
            health = re.search(r"--health_address=\S+:(\d+)", text)
            assert health, f"{s['metadata']['name']}: no --health_address"
            assert int(health.group(1)) in ports
            assert "readinessProbe" in c and "livenessProbe" in c
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in c:
                    assert c[probe]["grpc"]["port"] == int(health.group(1)), probe
            assert c["livenessProbe"]["grpc"]["service"] == "liveness"
            assert c["readinessProbe"]["grpc"].get("service", "") == ""
            assert {"cpu", "memory"} <= set(c["resources"]["requests"])
            assert "memory" in c["resources"]["limits"]
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes


@pytest.mark.parametrize("unit,daemon", [("repvar-coordinator.service", "repvar-coordinator"),
                                         ("repvar-worker.service", "repvar-worker")])
def test_systemd_units_are_notify_services_with_real_flags(unit, daemon):
    with open(os.path.join(SOURCE, "deploy/systemd", unit)) as f:
        text = f.read()
    assert re.search(r"^Type=notify$", text, re.M)
    assert re.search(r"^WatchdogSec=", text, re.M)
    assert re.search(rf"^ExecStart=\S+/{daemon} --flagfile=", text, re.M)
    # The flags of ExecStart and of the example flag file in the comments.
    lines = re.findall(r"^(?:ExecStart=.*|#\s+--.*)$", text, re.M)
    assert len(lines) > 5
    unknown = flags_in("\n".join(lines)) - known_flags(daemon)
    assert not unknown, f"{unit}: {daemon} has no flag {unknown}"


def test_the_manifests_run_the_image_the_dockerfile_builds():
    with open(os.path.join(SOURCE, "deploy/container/Dockerfile")) as f:
        dockerfile = f.read()
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        version = re.search(r"project\(repvar VERSION (\S+)", f.read()).group(1)
    tag = re.search(r"docker build .* -t (\S+) \.", dockerfile).group(1)
    assert tag == f"repvar:{version}"
    uid = int(re.search(r"^USER (\d+):", dockerfile, re.M).group(1))
    with open(os.path.join(SOURCE, "deploy/container/image.sh")) as f:
        assert f"UID_GID={uid}" in f.read()
    for s in (d for d in manifests() if d["kind"] == "StatefulSet"):
        pod = s["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == uid
        for c in pod["containers"]:
            assert c["image"] == tag
            # A daemon on the image's PATH (/usr/local/bin), run directly or by exec.
            text = " ".join(c["command"] + c.get("args", []))
            assert re.match(r"(\S*sh -c [^;]*; exec )?repvar-(coordinator|worker) ", text), text
