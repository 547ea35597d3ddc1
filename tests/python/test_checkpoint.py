# SPDX-License-Identifier: Apache-2.0
"""`repvarctl save` writes a file any safetensors reader opens: read here with
a 20-line reader that uses only json and numpy, compared value by value with
what the cluster holds, and checked against the layout the format fixes."""

import json
import os
import struct
import subprocess

import numpy as np

import repvar

from conftest import BUILD

NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
      "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    """The whole format: a u64 LE header length, a JSON header, the data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype=NP[t["dtype"]]).reshape(t["shape"])
    return tensors, metadata


def save(cluster, path):
    out = subprocess.run([os.path.join(BUILD, "client/repvarctl"), f"--coordinator={cluster}",
                          "--json", "save", path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


VALUES = {
    "ckpt/kernel": ("float32", np.arange(12, dtype=np.float32).reshape(4, 3) / 7),
    "ckpt/steps": ("int64", np.array([-(2**63), 3, 2**63 - 1], np.int64)),
    "ckpt/half": ("float16", np.array([1.5, -2.0, 65504], np.float16)),
    "ckpt/bf16": ("bfloat16", np.array([0x3f80, 0xc000, 0x0001], np.uint16)),
    "ckpt/empty": ("float32", np.zeros((0, 3), np.float32)),
}


def test_saved_file_opens_with_a_json_and_numpy_reader_and_holds_every_value(client, cluster,
                                                                             tmp_path):
    for name, (dtype, value) in VALUES.items():
        client.create(name, dtype, value.shape, replica_count=2, aggregation="SUM",
                      initializer=repvar.zeros())
        if value.size:
            client.assign(name, value)
        else:
            client.initialize([name])
    client.create("ckpt/never_set", "float32", (2,), replica_count=1)
    path = str(tmp_path / "model.safetensors")
    summary = save(cluster, path)

    tensors, metadata = read_safetensors(path)
    assert "ckpt/never_set" not in tensors
    assert "ckpt/never_set" in json.loads(metadata["repvar.uninitialized"])
    described = json.loads(metadata["repvar.variables"])
    assert summary["variables"] == len(tensors) == len(described)
    for name, (dtype, value) in VALUES.items():
        assert tensors[name].shape == value.shape
        assert tensors[name].tobytes() == value.tobytes(), name
        if value.size:  # (the helper cannot read a zero-size array yet: issue 11)
            held, version = client.read(name)
            assert held.tobytes() == value.tobytes(), name
            assert described[name]["version"] == version
        assert described[name]["aggregation"] == "SUM"
        assert described[name]["replica_count"] == 2
    assert metadata["repvar.format"] == "1"
    assert all(isinstance(v, str) for v in metadata.values())

    # And back: every value (the zero-size one too) as its next version.
    client.assign("ckpt/kernel", np.zeros((4, 3), np.float32))
    out = subprocess.run([os.path.join(BUILD, "client/repvarctl"), f"--coordinator={cluster}",
                          "restore", path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kernel, version = client.read("ckpt/kernel")
    assert kernel.tobytes() == VALUES["ckpt/kernel"][1].tobytes()
    assert version == described["ckpt/kernel"]["version"] + 2


def test_saved_file_has_the_safetensors_layout(client, cluster, tmp_path):
    client.create("layout/a", "float32", (2, 2), replica_count=1)
    client.assign("layout/a", np.ones((2, 2), np.float32))
    path = str(tmp_path / "layout.safetensors")
    save(cluster, path)
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0 and 8 + n <= len(blob)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    assert isinstance(header["__metadata__"], dict)
    entries = sorted((t["data_offsets"], name, t) for name, t in header.items()
                     if name != "__metadata__")
    at = 0
    for (begin, end), name, t in entries:
        assert t["dtype"] in NP, t["dtype"]
        assert begin == at, f"{name} starts at {begin}, the data before ends at {at}"
        itemsize = np.dtype(NP[t["dtype"]]).itemsize
        assert end - begin == itemsize * int(np.prod(t["shape"], dtype=np.int64)), name
        at = end
    assert 8 + n + at == len(blob), "the tensors end where the file ends"
