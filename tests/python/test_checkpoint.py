# SPDX-License-Identifier: Apache-2.0
"""`repvarctl save` writes a file any safetensors reader opens: read here with
a 20-line reader that uses only json and numpy, compared value by value with
what the cluster holds, and checked against the layout the format fixes.
And `repvarctl restore` takes a file another writer made: one written here
from the format's specification with json and numpy alone."""

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
        if value.size:  # client.read of a zero-size value is not tested here
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


def write_safetensors(path, tensors, metadata):
    """The format from its specification, with no code of repvar's: an
    8-byte little-endian header length N, then N bytes of a UTF-8 JSON object
    (each tensor's dtype, shape and [begin, end) data_offsets into the byte
    buffer; "__metadata__", a map of strings), then the byte buffer. The data
    is laid out here in the reverse of the header's order, and the header
    padded with spaces to a multiple of 8, as the specification allows."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(np.float64): "F64", np.dtype(np.int32): "I32",
             np.dtype(np.int64): "I64"}
    header, data = {"__metadata__": metadata}, b""
    for name, (dtype, array) in reversed(list(tensors.items())):
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype or names[array.dtype], "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def test_restore_takes_a_file_written_by_another_writer(client, cluster, tmp_path):
    rng = np.random.default_rng(3)
    foreign = {
        "foreign/kernel": (None, rng.standard_normal((3, 5)).astype(np.float32)),
        "foreign/half": (None, np.array([0.5, -65504, 1e-3], np.float16)),
        "foreign/bf16": ("BF16", np.array([0x3f80, 0x7f7f, 0x8001], np.uint16)),
        "foreign/wide": (None, np.array([np.pi, -1e300], np.float64)),
        "foreign/ids": (None, np.array([[1, -2], [2**31 - 1, -(2**31)]], np.int32)),
        "foreign/count": (None, np.array(2**62 + 1, np.int64)),  # a scalar
        "foreign/none": (None, np.zeros((0, 4), np.float32)),
    }
    path = str(tmp_path / "foreign.safetensors")
    write_safetensors(path, foreign, {"framework": "numpy", "note": "no repvar metadata"})
    out = subprocess.run([os.path.join(BUILD, "client/repvarctl"), f"--coordinator={cluster}",
                          "--json", "restore", "--replicas=2", path],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["variables"] == len(foreign)
    for name, (dtype, array) in foreign.items():
        info = client.variable(name)
        assert list(info.spec.tensor.dims) == list(array.shape), name
        assert len(info.replicas) == 2, name
        if array.size:
            held, version = client.read(name)
            assert held.tobytes() == array.tobytes(), name
            assert version == 1, name
