# SPDX-License-Identifier: Apache-2.0
"""repvar.torch: examples/torch/train_mlp.py trains an MLP data-parallel
with one trainer process per accelerator host on a live cluster. After the
steps every replica of every parameter is bit-identical (same version and
checksum everywhere), every trainer's module holds the same values, the
loss went down, and it matches single-process SGD on the concatenated
batches within float tolerance."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import torch  # noqa: F401  Debian's python3-torch (deploy/bootstrap.sh): never skipped

import repvar

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
EXAMPLE = os.path.join(SOURCE, "examples/torch/train_mlp.py")
STEPS = 12


def example():
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The example's small MLP, whose values come back in batched reads; and one
# whose first weight (1 MiB) comes back mapped from the trainer's own host's
# replica.
@pytest.mark.parametrize("in_features,hidden,lr,steps,prefix",
                         [(16, 64, 0.1, STEPS, "torchtest"), (64, 4096, 0.01, 4, "torchbig")])
def test_data_parallel_mlp_replicas_identical_and_matching_single_process(
        client, cluster, tmp_path, in_features, hidden, lr, steps, prefix):
    out = str(tmp_path / "result.json")
    env = dict(os.environ, REPVAR_COORDINATOR_ADDRESS=cluster)
    run = subprocess.run([sys.executable, EXAMPLE, f"--steps={steps}", f"--prefix={prefix}",
                          f"--in_features={in_features}", f"--hidden={hidden}", f"--lr={lr}",
                          f"--out={out}"], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out) as f:
        results = json.load(f)
    assert len(results) == 3  # one trainer per accelerator host

    # Every replica of every parameter: same version and checksum, up to date.
    names = [v.spec.name for v in client.list() if v.spec.name.startswith(prefix + "/")]
    assert sorted(names) == [f"{prefix}/0/bias", f"{prefix}/0/weight", f"{prefix}/2/bias",
                             f"{prefix}/2/weight"]
    # Where the committed values came from: mapped from the host's own
    # replica (the 1 MiB weight only), else read.
    loads = {p["local_loads"] for r in results for p in r["sync_phases"]}
    assert loads == ({1} if hidden * in_features * 4 >= 1 << 20 else {0}), loads
    for name in names:
        info = client.variable(name)
        assert info.initialized and len(info.replicas) == 6
        assert len({(r.version, r.checksum) for r in info.replicas}) == 1, info
        assert {r.version for r in info.replicas} == {info.version}

    # Every trainer ended with the cluster's values.
    for r in results:
        for pname, value in r["params"].items():
            committed, _ = client.read(f"{prefix}/" + pname.replace(".", "/"))
            assert np.array_equal(np.asarray(value, np.float32), committed), (r["rank"], pname)

    # The loss went down, as single-process SGD on the whole batches does.
    mlp = example()
    mlp.IN, mlp.HIDDEN = in_features, hidden
    model, reference = mlp.single_process(steps, 192, lr)
    losses = results[0]["losses"]
    assert losses[-1] < (0.8 if steps == STEPS else 1.0) * losses[0], losses
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
    for pname, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(results[0]["params"][pname], np.float32),
                                   p.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_load_streams_a_large_tensor_into_the_parameters_own_memory(client):
    """ReplicatedModule.load: a tensor past the batched reads' 8 MiB is
    streamed into the parameter's own memory (read(out=...)), so the same
    Parameter keeps the same storage and holds the chief's value; the small
    bias comes in a batched read."""
    import repvar.torch as rt
    torch.manual_seed(0)
    chief = torch.nn.Linear(2304, 1024)  # a 9 MiB weight
    rt.ReplicatedModule(client, chief, "loadbig", worker="tpu_worker:0", is_chief=True)
    torch.manual_seed(1)
    other = torch.nn.Linear(2304, 1024)
    weight, storage = other.weight, other.weight.data_ptr()
    assert not torch.equal(other.weight, chief.weight)
    rt.ReplicatedModule(client, other, "loadbig", worker="tpu_worker:1", is_chief=False)
    assert other.weight is weight and other.weight.data_ptr() == storage
    assert torch.equal(other.weight, chief.weight)
    assert torch.equal(other.bias, chief.bias)
