# SPDX-License-Identifier: Apache-2.0
"""The coordinator's web view in a real browser: a cluster trains (repvar-train,
with a divergence injected so a repair shows), publishes its loss, and Debian's
headless Chromium loads the page; the DOM must show the hosts with the infeed
host marked, committed steps, the repaired divergence and the loss curve. The
screenshot is kept in $REPVAR_BUILD_DIR/test-artifacts/. Then contract X1 on
the HTTP listener of a TLS cluster: HTTPS with the coordinator's certificate
(rotated by SIGHUP like its gRPC one), the state for the admin token only."""

import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

import repvar
from conftest import BUILD, SCALE, Daemon, start_cluster

SOURCE = os.path.join(os.path.dirname(__file__), "../..")
ARTIFACTS = os.path.join(BUILD, "test-artifacts")


def chromium(url, *flags):
    """Loads `url` in headless Chromium and returns the DOM after the page's
    scripts have run for a few seconds of virtual time (or, given
    --screenshot=PATH, writes the picture there)."""
    if not any(f.startswith("--screenshot") for f in flags):
        flags += ("--dump-dom",)
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed (deploy/bootstrap.sh installs it)"
    with tempfile.TemporaryDirectory(prefix="repvar-chromium-") as profile:
        out = subprocess.run(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", *flags, url],
            capture_output=True, timeout=90 * SCALE)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    return out.stdout.decode()


def wait_file(path):
    deadline = time.monotonic() + 20 * SCALE
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return f.read().strip()
        time.sleep(0.02)
    raise RuntimeError(f"{path} was not written")


def table(dom, table_id):
    """The markup of the table with this id."""
    m = re.search(r'<table id="%s">(.*?)</table>' % re.escape(table_id), dom, re.S)
    assert m, f"no table #{table_id} in the page"
    return m.group(1)


@pytest.fixture(scope="module")
def trained_cluster():
    """A plaintext development cluster (no token files) after 12 training steps."""
    with tempfile.TemporaryDirectory(prefix="repvar-py-web-") as d:
        daemons = []
        try:
            address = start_cluster(d, daemons, ["--ephemeral", "--metrics_address=127.0.0.1:0",
                                                 f"--metrics_port_file={d}/metrics.port"])
            subprocess.run([os.path.join(BUILD, "client/repvar-train"), f"--coordinator={address}",
                            "--steps=12", "--runs=1", "--inject_divergence=6"],
                           check=True, capture_output=True, timeout=120 * SCALE)
            yield address, int(wait_file(f"{d}/metrics.port"))
        finally:
            for daemon in reversed(daemons):
                daemon.stop()


def test_page_in_chromium_shows_hosts_infeed_steps_repairs_and_the_loss(trained_cluster):
    address, http_port = trained_cluster
    with repvar.connect(address) as c:
        last = c.last_committed_step()
    assert last >= 12
    url = f"http://127.0.0.1:{http_port}/"
    dom = chromium(url)
    assert 'data-loaded="true"' in dom, dom[-3000:]
    hosts = table(dom, "hosts")
    # Every host, the infeed host (ordinal 0's) marked, the host without accelerators too.
    assert re.search(r'<tr class="host infeed-host" data-task="/job:tpu_worker/task:0">.*?'
                     r'<span class="badge infeed">infeed</span>', hosts, re.S), hosts
    for t in (1, 2):
        assert f'<tr class="host" data-task="/job:tpu_worker/task:{t}">' in hosts
    assert '<tr class="host" data-task="/job:worker/task:0">' in hosts
    assert '<b id="infeed-host">/job:tpu_worker/task:0</b>' in dom
    assert f'<b id="last-committed-step">{last}</b>' in dom
    # The last committed step, committed, in the recent steps.
    assert f'<tr class="step COMMITTED" data-step="{last}">' in table(dom, "recent-steps")
    # The repair by vote at step 6: repvar-train made replica 5 of train/seen disagree.
    assert ('<td class="num">6</td><td><code>train/seen</code></td><td>5</td>'
            in table(dom, "divergences"))
    assert re.search(r'id="divergences-total">[1-9]\d* replicas rewritten', dom), dom
    # The loss curve repvar-train published, drawn as a line.
    assert re.search(r'<div class="chart" data-series="train/loss">.*?<polyline', dom, re.S)
    assert "<code>train/w</code>" in table(dom, "variables")

    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "web_view.png")
    if os.path.exists(shot):
        os.remove(shot)
    chromium(url, "--window-size=1400,1800", f"--screenshot={shot}")
    with open(shot, "rb") as f:
        png = f.read()
    assert png.startswith(b"\x89PNG") and len(png) > 20000, len(png)


def test_publish_scalar_from_python_is_the_mean_per_step(trained_cluster):
    address, http_port = trained_cluster
    with repvar.connect(address) as c:
        c.publish_scalar("eval/accuracy", 7, 0.5)
        c.publish_scalar("eval/accuracy", 7, 0.75)
        with pytest.raises(repvar.InvalidArgument):
            c.publish_scalar("no spaces", 1, 1.0)
        with pytest.raises(repvar.InvalidArgument):
            c.publish_scalar("eval/accuracy", -1, 1.0)
    import json
    state = json.load(urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/state", timeout=10))
    series = {s["name"]: s for s in state["scalars"]}
    assert series["eval/accuracy"]["steps"] == ["7"]  # int64: a string in protobuf's JSON
    assert series["eval/accuracy"]["values"] == [0.625]
    assert series["eval/accuracy"]["counts"] == ["2"]
    assert "no spaces" not in series


@pytest.fixture(scope="module")
def secure_cluster():
    """TLS and tokens; the coordinator reads its certificate from files the
    test can replace (rotation)."""
    with tempfile.TemporaryDirectory(prefix="repvar-py-web-tls-") as d:
        certs = os.path.join(d, "certs")
        subprocess.run([os.path.join(SOURCE, "deploy/make-certs.sh"), certs,
                        "--workers", "tpu_worker:0", "--other-ca"], check=True,
                       capture_output=True)
        live = os.path.join(d, "live")
        os.makedirs(live)
        for src, dst in (("coordinator.pem", "cert.pem"), ("coordinator.key", "key.pem"),
                         ("ca.pem", "ca.pem")):
            shutil.copy(os.path.join(certs, src), os.path.join(live, dst))

        def tokens(flag):
            return [f"--{flag}={certs}/worker.token", f"--trainer_token_file={certs}/trainer.token",
                    f"--admin_token_file={certs}/admin.token"]

        daemons = []
        try:
            coord = Daemon([os.path.join(BUILD, "server/repvar-coordinator"),
                            "--expected_tasks=tpu_worker:1", "--ephemeral",
                            f"--tls_cert={live}/cert.pem", f"--tls_key={live}/key.pem",
                            f"--tls_ca={live}/ca.pem", "--metrics_address=127.0.0.1:0",
                            f"--metrics_port_file={d}/metrics.port"]
                           + tokens("worker_token_file"), d, "coordinator")
            daemons.append(coord)
            address = f"127.0.0.1:{coord.port}"
            daemons.append(Daemon([os.path.join(BUILD, "worker/repvar-worker"),
                                   "--job=tpu_worker", "--task=0", "--tpu_devices=2",
                                   f"--coordinator_address={address}",
                                   f"--tls_cert={certs}/tpu_worker-0.pem",
                                   f"--tls_key={certs}/tpu_worker-0.key", f"--tls_ca={certs}/ca.pem"]
                                  + tokens("token_file"), d, "tpu_worker-0"))
            with repvar.connect(address, tls_ca=f"{certs}/ca.pem",
                                token_file=f"{certs}/trainer.token") as c:
                c.wait_for_topology(20 * SCALE)
            yield {"address": address, "certs": certs, "live": live, "coordinator": coord,
                   "url": f"https://127.0.0.1:{wait_file(f'{d}/metrics.port')}"}
        finally:
            for daemon in reversed(daemons):
                daemon.stop()


def token(certs, role):
    with open(os.path.join(certs, f"{role}.token")) as f:
        return f.readline().strip()


def get(url, ca, bearer=None):
    """(status, body) of a GET over HTTPS that verifies the server against `ca`."""
    req = urllib.request.Request(url)
    if bearer:
        req.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=ca)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_x1_state_over_https_for_the_admin_token_only(secure_cluster):
    url, certs = secure_cluster["url"], secure_cluster["certs"]
    ca = os.path.join(certs, "ca.pem")
    assert get(f"{url}/metrics", ca)[0] == 200
    status, body = get(f"{url}/api/state", ca)
    assert status == 401 and "tpu_worker" not in body, body
    status, body = get(f"{url}/api/state", ca, token(certs, "trainer"))
    assert status == 403 and "tpu_worker" not in body, body
    status, body = get(f"{url}/api/state", ca, "a-token-nobody-has-0123456789")
    assert status == 401, body
    status, body = get(f"{url}/api/state", ca, token(certs, "admin"))
    assert status == 200 and '"job":"tpu_worker"' in body, body
    # Plain HTTP gets no answer from the TLS listener.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(url.replace("https:", "http:") + "/api/state", timeout=10).read()


def test_publish_scalar_is_a_trainer_call(secure_cluster):
    certs = secure_cluster["certs"]
    with repvar.connect(secure_cluster["address"], tls_ca=f"{certs}/ca.pem",
                        token_file=f"{certs}/trainer.token") as c:
        c.publish_scalar("loss", 1, 2.5)
    with pytest.raises(repvar.Unauthenticated):
        with repvar.connect(secure_cluster["address"], tls_ca=f"{certs}/ca.pem") as c:
            c.publish_scalar("loss", 2, 2.5)


def test_page_with_the_token_in_the_fragment_and_without(secure_cluster):
    url, certs = secure_cluster["url"], secure_cluster["certs"]
    # Chromium does not know this run's CA; the certificate itself is checked above.
    dom = chromium(f"{url}/#token={token(certs, 'admin')}", "--ignore-certificate-errors")
    assert 'data-loaded="true"' in dom, dom[-3000:]
    assert '<tr class="host infeed-host" data-task="/job:tpu_worker/task:0">' in dom
    # Without it the page asks for the token and shows no state.
    dom = chromium(f"{url}/", "--ignore-certificate-errors")
    assert re.search(r'<form id="login" style="display: block;">', dom), dom[-3000:]
    assert 'data-loaded="true"' not in dom
    assert 'data-task="/job:tpu_worker/task:0"' not in dom


def test_sighup_rotates_the_https_certificate_with_the_grpc_one(secure_cluster):
    url, certs, live = secure_cluster["url"], secure_cluster["certs"], secure_cluster["live"]
    other_ca = os.path.join(certs, "other-ca.pem")
    with pytest.raises(urllib.error.URLError):
        get(f"{url}/metrics", other_ca)
    for src, dst in (("other-ca-coordinator.pem", "cert.pem"),
                     ("other-ca-coordinator.key", "key.pem"), ("other-ca.pem", "ca.pem")):
        shutil.copy(os.path.join(certs, src), os.path.join(live, dst))
    secure_cluster["coordinator"].proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10 * SCALE
    while True:
        try:
            assert get(f"{url}/metrics", other_ca)[0] == 200
            break
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with pytest.raises(urllib.error.URLError):
        get(f"{url}/metrics", os.path.join(certs, "ca.pem"))
