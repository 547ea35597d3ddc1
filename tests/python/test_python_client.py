# SPDX-License-Identifier: Apache-2.0
"""Drives a real cluster through the generated stubs and the numpy helper."""

import json
import os
import re
import subprocess
import sys

import grpc
import numpy as np
import pytest

import repvar
from repvar.v1 import coordinator_pb2 as cpb
from repvar.v1 import types_pb2 as tpb


def test_topology_reports_infeed_host_of_the_tpu_job(client):
    topo = client.topology()
    assert len(topo.accelerators) == 6
    assert topo.infeed_host.job == "tpu_worker"
    assert topo.infeed_host.task == 0
    assert topo.infeed_host.cpu_device == "/job:tpu_worker/replica:0/task:0/device:CPU:0"


def test_replicated_scope_assign_and_read_back_bit_exact(client):
    with repvar.replicated_scope(6, "model"):
        with repvar.replicated_scope(6, "dense"):
            info = client.create("kernel", "float32", (4, 3))
    assert info.spec.name == "model/dense/kernel"
    assert [r.name for r in info.replicas] == [f"model/dense/kernel/{i}" for i in range(6)]
    topo = client.topology()
    assert [r.device for r in info.replicas] == [a.device for a in topo.accelerators]
    value = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    ack = client.assign("model/dense/kernel", value)
    assert ack.version == 1
    back, version = client.read("model/dense/kernel")
    assert version == 1
    assert back.dtype == np.float32 and back.shape == (4, 3)
    assert back.tobytes() == value.tobytes()
    states = client.is_initialized(["model/dense/kernel"])[0]
    assert states.initialized
    assert all(r.state == tpb.REPLICA_STATE_UP_TO_DATE for r in states.replicas)


@pytest.mark.parametrize("dtype,array", [
    ("float32", np.array([1.5, -0.0, np.finfo(np.float32).max], np.float32)),
    ("float16", np.array([1.5, -0.0, 65504], np.float16)),
    ("bfloat16", np.array([0x3f80, 0xc000, 0x0001], np.uint16)),  # bit patterns
    ("float64", np.array([np.pi, -1e300, 5e-324])),
    ("int32", np.array([-(2**31), 0, 2**31 - 1], np.int32)),
    ("int64", np.array([-(2**63), 1, 2**63 - 1], np.int64)),
])
def test_every_dtype_round_trips(client, dtype, array):
    name = f"dtypes/{dtype}"
    client.create(name, dtype, array.shape, replica_count=2)
    client.assign(name, array)
    back, _ = client.read(name)
    assert back.tobytes() == array.astype(back.dtype).tobytes()


@pytest.mark.parametrize("dtype", sorted(repvar.DTYPES))
@pytest.mark.parametrize("shape", [(0, 3), (0,), ()])
def test_every_dtype_round_trips_at_zero_size_and_as_a_scalar(client, dtype, shape):
    name = f"shapes/{dtype}/{'x'.join(map(str, shape)) or 'scalar'}"
    array = np.arange(int(np.prod(shape)), dtype=repvar.numpy_dtype(dtype)).reshape(shape)
    client.create(name, dtype, shape, replica_count=2)
    client.assign(name, array)
    back, version = client.read(name)
    assert version == 1
    assert back.shape == shape and back.tobytes() == array.tobytes()


_MALLOC_PROBE = """
import ctypes, sys
import repvar.client
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if sys.argv[1] == "tuned":
    repvar.Client("127.0.0.1:1").close()  # tune_malloc by default; connects lazily
before = libc.mallinfo2().hblks
block = bytearray(16 << 20)  # a value's chunk passes through blocks like it
print(libc.mallinfo2().hblks - before)
"""


def test_tune_malloc_keeps_large_blocks_in_the_heap():
    """A Client tunes glibc's malloc as the C++ client does (tune_malloc):
    a large block then comes from the heap, where it stays resident for the
    next chunk, not from a fresh mapping; without a Client it is mapped."""
    def mapped_blocks(mode):
        run = subprocess.run([sys.executable, "-c", _MALLOC_PROBE, mode], capture_output=True,
                             text=True, timeout=60, env=dict(os.environ))
        assert run.returncode == 0, run.stderr
        return int(run.stdout)
    assert mapped_blocks("tuned") == 0
    assert mapped_blocks("default") == 1


def test_connect_reads_the_environment_and_fails_fast_with_unavailable(cluster, monkeypatch):
    monkeypatch.setenv("REPVAR_COORDINATOR_ADDRESS", cluster)
    with repvar.connect(timeout=20) as c:
        assert len(c.topology().accelerators) == 6
    import socket
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(repvar.Unavailable) as e:
        repvar.connect(nobody, timeout=0.5)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and nobody in e.value.message
    monkeypatch.delenv("REPVAR_COORDINATOR_ADDRESS")
    with pytest.raises(ValueError):
        repvar.connect()


def test_scalar_and_non_contiguous_and_big_endian_inputs(client):
    client.create("scalar", "float32", (), replica_count=3)
    client.assign("scalar", np.float32(2.5))
    assert client.read("scalar")[0] == np.float32(2.5)
    client.create("grid", "float32", (3, 2), replica_count=3)
    transposed = np.arange(6, dtype=np.float32).reshape(2, 3).T  # not C-contiguous
    client.assign("grid", transposed)
    assert np.array_equal(client.read("grid")[0], transposed)
    big_endian = np.arange(6, dtype=">f4").reshape(3, 2)
    client.assign("grid", big_endian)
    assert np.array_equal(client.read("grid")[0], big_endian.astype("<f4"))
    with pytest.raises(ValueError):
        client.assign("grid", np.zeros((3, 2), np.float64))


def test_assign_add_and_initializers(client):
    client.create("counter", "int64", (2,), replica_count=6, initializer=repvar.zeros(),
                  trainable=False)
    first = client.initialize(["counter"])[0]
    again = client.initialize(["counter"])[0]
    assert first.initialized_now and not again.initialized_now
    for _ in range(3):
        client.assign("counter", np.array([1, 2], np.int64), op="add")
    value, version = client.read("counter")
    assert value.tolist() == [3, 6] and version == 4
    names = {v.spec.name for v in client.list("TRAINABLE_VARIABLES")}
    assert "counter" not in names
    assert "counter" in {v.spec.name for v in client.list("GLOBAL_VARIABLES")}
    full = {v.spec.name: v for v in client.list()}
    basic = {v.spec.name: v for v in client.list(replicas=False)}
    assert len(full["counter"].replicas) == 6 and len(basic["counter"].replicas) == 0
    assert basic["counter"].version == full["counter"].version == 4


def test_seeded_initializer_is_reproducible(client):
    for name in ("rand/a", "rand/b"):
        client.create(name, "float32", (100,), replica_count=2,
                      initializer=repvar.random_normal(0.0, 1.0, seed=7))
    client.initialize(["rand/a", "rand/b"])
    a, _ = client.read("rand/a")
    b, _ = client.read("rand/b")
    assert a.tobytes() == b.tobytes()
    assert 0.5 < a.std() < 1.5


def test_large_chunked_value(client):
    client.create("big", "float32", (3, 1 << 20), replica_count=6)
    value = np.random.default_rng(1).random((3, 1 << 20), dtype=np.float32)
    client.assign("big", value, chunk_bytes=1 << 20)
    back, _ = client.read("big", chunk_bytes=4 << 20)
    assert back.tobytes() == value.tobytes()


def test_read_into_out_writes_the_value_in_place_and_refuses_another_size(client):
    """read(out=...) (C1): the value lands in the caller's array, which comes
    back as it is; an array of another size or dtype is refused untouched,
    one that is not writable and contiguous before the call."""
    client.create("into", "float32", (3, 1 << 18), replica_count=2)
    value = np.random.default_rng(2).random((3, 1 << 18), dtype=np.float32)
    client.assign("into", value)
    out = np.zeros((3, 1 << 18), np.float32)
    back, version = client.read("into", chunk_bytes=1 << 18, out=out)
    assert back is out and version == 1
    assert out.tobytes() == value.tobytes()
    flat = np.zeros(4 * 3 << 18, np.uint8)  # any dtype and shape of the same size
    client.read("into", out=flat)
    assert flat.tobytes() == value.tobytes()
    small = np.zeros(5, np.float32)
    with pytest.raises(repvar.InvalidArgument, match="bytes do not fit"):
        client.read("into", out=small)
    assert not small.any()
    ints = np.zeros((3, 1 << 18), np.int32)  # the size, not the dtype
    with pytest.raises(repvar.InvalidArgument, match="float32"):
        client.read("into", out=ints)
    assert not ints.any()
    with pytest.raises(repvar.InvalidArgument, match="contiguous"):
        client.read("into", out=np.zeros((3, 1 << 19), np.float32)[:, ::2])
    frozen = np.zeros((3, 1 << 18), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(repvar.InvalidArgument, match="writable"):
        client.read("into", out=frozen)


def test_a_value_known_to_be_small_is_read_in_one_unary_call(cluster):
    """A value the client knows to be small (created or read here before) is
    read with one ReadVariables call, not a stream; out= takes it the same
    way. One created again larger than a unary answer holds is streamed."""
    c = repvar.Client(cluster)
    calls = []
    for stub, method in ((c._frames, "ReadVariable"), (c.stub, "ReadVariables")):
        real = getattr(stub, method)
        setattr(stub, method, lambda *a, _real=real, _m=method, **k: (calls.append(_m),
                                                                     _real(*a, **k))[1])
    c.create("unary/s", "float32", (16,), replica_count=2)
    c.assign("unary/s", np.arange(16, dtype=np.float32))
    value, version = c.read("unary/s")
    np.testing.assert_array_equal(value, np.arange(16, dtype=np.float32))
    assert version == 1 and calls == ["ReadVariables"]
    out = np.zeros(16, np.float32)
    assert c.read("unary/s", out=out)[0] is out
    np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32))
    for wrong in (np.full(15, -1, np.float32), np.full(16, -1, np.int32)):
        with pytest.raises(repvar.InvalidArgument):
            c.read("unary/s", out=wrong)
        assert (wrong == -1).all()
    # Another client's variable: unknown here, streamed once, then known.
    calls.clear()
    other = repvar.Client(cluster)
    other.create("unary/t", "int32", (3,), replica_count=2, initializer=repvar.zeros())
    other.initialize(["unary/t"])
    c.read("unary/t")
    c.read("unary/t")
    assert calls == ["ReadVariable", "ReadVariables"]
    # Deleted and created again (by another client) past what one unary
    # answer holds (32 MiB): the unary call is refused and the value streamed.
    calls.clear()
    other.delete("unary/t")
    other.create("unary/t", "float32", (9 << 20,), replica_count=2, initializer=repvar.zeros())
    other.initialize(["unary/t"])
    big, _ = c.read("unary/t")
    assert big.shape == (9 << 20,) and not big.any()
    assert calls == ["ReadVariables", "ReadVariable"]
    other.close()
    c.close()


def test_from_chunks_refuses_a_damaged_stream():
    """What read() turns into DataLoss: a chunk that fails its checksum or
    is out of place, a value cut short, and a whole value that fails its
    checksum are ValueErrors; the undamaged chunks beside them rebuild it."""
    value = np.arange(8, dtype=np.float32)
    h, *chunks = repvar.tensors.to_chunks(value, "float32", chunk_bytes=16)
    np.testing.assert_array_equal(repvar.tensors.from_chunks(h, chunks), value)
    out = np.zeros(8, np.float32)
    assert repvar.tensors.from_chunks(h, chunks, out=out) is out
    np.testing.assert_array_equal(out, value)
    flipped = tpb.TensorChunk(offset=16, data=chunks[1].data, checksum=chunks[1].checksum ^ 1)
    with pytest.raises(ValueError, match="checksum mismatch at 16"):
        repvar.tensors.from_chunks(h, [chunks[0], flipped])
    with pytest.raises(ValueError, match="out of order at 16"):
        repvar.tensors.from_chunks(h, [chunks[1]])
    with pytest.raises(ValueError, match="truncated"):
        repvar.tensors.from_chunks(h, chunks[:1])
    bad = tpb.TensorHeader()
    bad.CopyFrom(h)
    bad.checksum ^= 1
    with pytest.raises(ValueError, match="whole-tensor checksum"):
        repvar.tensors.from_chunks(bad, chunks)
    with pytest.raises(repvar.tensors.OutMismatch, match="do not fit"):
        repvar.tensors.from_chunks(h, chunks, out=np.zeros(7, np.float32))
    with pytest.raises(repvar.tensors.OutMismatch, match="float32 values"):
        repvar.tensors.from_chunks(h, chunks, out=np.zeros(8, np.int32))


def _serve_read_variable_frames(script):
    """A coordinator whose ReadVariable answers a name with the byte strings
    `script[name]`, as they are, each one message. Returns (server, port)."""
    from concurrent import futures
    handler = grpc.method_handlers_generic_handler("repvar.v1.CoordinatorTrainers", {
        "ReadVariable": grpc.unary_stream_rpc_method_handler(
            lambda request, context: iter(script[request.name]),
            request_deserializer=cpb.ReadVariableRequest.FromString,
            response_serializer=None)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _varint(v):
    out = bytearray()
    while True:
        out.append(v & 0x7F | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def test_read_of_a_damaged_stream_is_data_loss():
    """read() against a scripted coordinator: a stream that does not begin
    with its header (or is empty), a chunk that fails its checksum, a value
    cut short, a second header, a message that does not parse and a chunk
    frame cut inside its data raise DataLoss, into a fresh array or `out`;
    the undamaged stream beside them reads, and so does one whose chunks
    another writer laid out (checksum before data: protobuf parses those)."""
    value = np.arange(8, dtype=np.float32)
    h, *chunks = repvar.tensors.to_chunks(value, "float32", chunk_bytes=16)
    head = cpb.ReadVariableResponse(header=cpb.ReadHeader(version=3, tensor=h)).SerializeToString()
    parts = [cpb.ReadVariableResponse(chunk=c).SerializeToString() for c in chunks]
    flipped = cpb.ReadVariableResponse(chunk=tpb.TensorChunk(
        offset=16, data=chunks[1].data, checksum=chunks[1].checksum ^ 1)).SerializeToString()
    # Chunk 1 with its fields in another order: checksum, data, offset.
    body = (b"\x18" + _varint(chunks[1].checksum) + b"\x12" + _varint(16) + chunks[1].data +
            b"\x08" + _varint(16))
    reordered = b"\x12" + _varint(len(body)) + body
    assert cpb.ReadVariableResponse.FromString(reordered).chunk == chunks[1]
    assert repvar.tensors.parse_chunk_frame(reordered, 2) is None
    script = {"good": [head] + parts, "reordered": [head, parts[0], reordered],
              "headless": parts, "empty": [], "flipped": [head, parts[0], flipped],
              "short": [head, parts[0]], "two_headers": [head, parts[0], head, parts[1]],
              "garbage": [head, parts[0], b"\xff\xff\xff"],
              "cut": [head, parts[0], parts[1][:10]]}
    server, port = _serve_read_variable_frames(script)
    try:
        c = repvar.Client(f"127.0.0.1:{port}")
        for name in ("good", "reordered"):
            back, version = c.read(name)
            np.testing.assert_array_equal(back, value)
            assert version == 3
        for name in ("headless", "empty", "flipped", "short", "two_headers", "garbage", "cut"):
            with pytest.raises(repvar.DataLoss):
                c.read(name)
            with pytest.raises(repvar.DataLoss):
                c.read(name, out=np.zeros(8, np.float32))
        c.close()
    finally:
        server.stop(None)


def test_a_chunk_frame_made_by_hand_is_the_bytes_protobuf_writes():
    """chunk_frame (what assign and Step.write send) against protobuf's own
    serialization of the same message, field 2 of AssignVariableRequest and
    StepWriteRequest: offsets 0 and past a varint byte, data of 1 byte to
    1 MiB (lengths of one to three varint bytes); parse_chunk_frame reads each
    back. chunk_frames cuts a value in order and refuses a bad chunk_bytes
    before any frame."""
    from repvar.v1 import worker_pb2 as wpb
    rng = np.random.default_rng(3)
    for size in (1, 127, 128, 16383, 16384, 1 << 20):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        for offset in (0, 1, 300, 1 << 40):
            chunk = tpb.TensorChunk(offset=offset, data=data,
                                    checksum=repvar.tensors.checksum(data))
            frame = repvar.tensors.chunk_frame(2, offset, memoryview(data))
            for wire_type in (cpb.AssignVariableRequest, wpb.StepWriteRequest):
                assert frame == wire_type(chunk=chunk).SerializeToString(), (size, offset)
            assert repvar.tensors.parse_chunk_frame(frame, 2)[::2] == (offset, chunk.checksum)
    value = np.arange(10, dtype=np.float32)
    frames = list(repvar.tensors.chunk_frames(value, 2, chunk_bytes=16))
    chunks = [cpb.AssignVariableRequest.FromString(f).chunk for f in frames]
    assert [c.offset for c in chunks] == [0, 16, 32]
    assert b"".join(c.data for c in chunks) == value.tobytes()
    for bad in (0, (4 << 20) + 1):
        with pytest.raises(ValueError):
            repvar.tensors.chunk_frames(value, 2, chunk_bytes=bad)


def test_a_chunk_frame_parses_as_protobuf_reads_it_without_copying_its_data():
    """parse_chunk_frame against protobuf's own parse, field 2 of a stream
    message: every chunk protobuf writes with data (offset and checksum 0
    or not, ten-byte varints) gives protobuf's (offset, data, checksum), the
    data a view into the frame; anything else (a header, another field,
    trailing or missing bytes, a varint past ten bytes, a chunk without
    data, whose field protobuf leaves out) is None, for protobuf to parse."""
    from repvar.v1 import worker_pb2 as wpb
    cases = [tpb.TensorChunk(offset=o, data=d, checksum=k)
             for o in (0, 1, 300, (1 << 64) - 1) for d in (b"x", bytes(range(200)))
             for k in (0, 5, (1 << 64) - 1)]
    for chunk in cases:
        for wire_type in (cpb.ReadVariableResponse, wpb.ReadVariableChunk):
            frame = wire_type(chunk=chunk).SerializeToString()
            offset, data, checksum = repvar.tensors.parse_chunk_frame(frame, 2)
            assert (offset, bytes(data), checksum) == (chunk.offset, chunk.data, chunk.checksum)
            assert isinstance(data, memoryview) and data.obj is frame
            assert repvar.tensors.parse_chunk_frame(frame, 1) is None
            assert repvar.tensors.parse_chunk_frame(frame + b"\x00", 2) is None
            assert repvar.tensors.parse_chunk_frame(frame[:-1], 2) is None
    h, *_ = repvar.tensors.to_chunks(np.zeros(4, np.float32), "float32")
    header = cpb.ReadVariableResponse(header=cpb.ReadHeader(version=1, tensor=h))
    with_version = wpb.ReadVariableChunk(chunk=cases[4], version=7)
    empty = cpb.ReadVariableResponse(chunk=tpb.TensorChunk(offset=4, checksum=9))
    for other in (header.SerializeToString(), with_version.SerializeToString(), b"",
                  empty.SerializeToString(),
                  b"\x12\x07\x08\x01\x12\x01x\x20\x01",  # another field after the data
                  b"\x12\x02\x08\x01",                            # offset, no data
                  b"\x12\x0d\x08" + b"\xff" * 11 + b"\x01"):        # an 11-byte varint
        assert repvar.tensors.parse_chunk_frame(other, 2) is None


def test_bad_inputs_get_clear_statuses(client):
    client.create("guarded", "float32", (2,), replica_count=2)
    client.assign("guarded", np.array([1, 2], np.float32))
    # Each failure is the repvar.Error subclass of its code, with the message.
    with pytest.raises(repvar.InvalidArgument) as e:
        client.assign("guarded", np.array([1, np.nan], np.float32))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.message
    with pytest.raises(repvar.NotFound) as e:
        client.read("missing")
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "missing" in e.value.message
    with pytest.raises(repvar.AlreadyExists) as e:
        client.create("guarded", "float32", (3,), replica_count=2)
    assert isinstance(e.value, repvar.Error)
    # A chunk whose checksum lies.
    header = next(repvar.to_chunks(np.array([5, 5], np.float32), "float32"))
    chunk = cpb.AssignVariableRequest(chunk=tpb.TensorChunk(offset=0, data=b"\0" * 8, checksum=1))
    msgs = [cpb.AssignVariableRequest(header=cpb.AssignHeader(name="guarded", tensor=header)), chunk]
    with pytest.raises(repvar.InvalidArgument):
        client.stub.AssignVariable(iter(msgs), timeout=10)
    value, version = client.read("guarded")
    assert value.tolist() == [1, 2] and version == 1


def test_a_client_without_checksums_sends_zero_and_the_coordinator_computes_them(client):
    """docs/wire.md: a checksum of 0 is "not given" (a third-party stack that
    has no XXH3); the stored value gets the real checksum, and any other
    wrong value is still refused."""
    client.create("wire/nosum", "float32", (3,), replica_count=2)
    value = np.array([1.5, 2.5, -3], np.float32)
    header = tpb.TensorHeader(spec=tpb.TensorSpec(dtype=tpb.DTYPE_FLOAT32, dims=[3]),
                              byte_size=12, checksum=0)
    msgs = [cpb.AssignVariableRequest(header=cpb.AssignHeader(
                request_id="nosum-1", name="wire/nosum", tensor=header)),
            cpb.AssignVariableRequest(chunk=tpb.TensorChunk(offset=0, data=value.tobytes()))]
    ack = client.stub.AssignVariable(iter(msgs), timeout=10)
    assert ack.version == 1 and ack.checksum == repvar.checksum(value.tobytes())
    back, _ = client.read("wire/nosum")
    assert back.tobytes() == value.tobytes()
    msgs[0].header.tensor.checksum = 12345
    msgs[0].header.request_id = "nosum-2"
    with pytest.raises(repvar.InvalidArgument, match="checksum"):
        client.stub.AssignVariable(iter(msgs), timeout=10)


def test_request_id_retry_returns_original_answer(client):
    client.create("idem", "float32", (1,), replica_count=6)
    client.assign("idem", np.array([0], np.float32))
    delta = np.array([1], np.float32)
    a = client.assign("idem", delta, op="add", request_id="py-retry-1")
    b = client.assign("idem", delta, op="add", request_id="py-retry-1")
    assert a.version == b.version == 2
    assert client.read("idem")[0].tolist() == [1.0]


def test_assign_defaults_follow_the_seed(client):
    """assign answers without the value, assign_add and assign_sub with the
    new one (read_value unset on the wire: the coordinator's default); an
    explicit read_value is obeyed; a value too large to ride along is read."""
    client.create("seeddef", "float32", (2,), replica_count=6)
    one = np.array([1.5, -2], np.float32)
    assert client.assign("seeddef", one).value is None
    added = client.assign_add("seeddef", one)
    assert added.version == 2 and added.value.tolist() == [3.0, -4.0]
    assert client.assign_sub("seeddef", one).value.tolist() == [1.5, -2.0]
    assert client.assign_add("seeddef", one, read_value=False).value is None
    assert client.assign("seeddef", one, read_value=True).value.tolist() == [1.5, -2.0]
    client.create("seeddef/big", "float32", (1 << 21,), replica_count=6)  # 8 MiB
    big = np.ones(1 << 21, np.float32)
    client.assign("seeddef/big", big)
    assert client.assign_add("seeddef/big", big).value[-1] == 2.0


def test_repvarctl_json_is_json_and_int64_exact(client, cluster):
    """repvarctl --json: int64 values exactly (2**53 + 1 survives), NaN and
    infinities as strings (JSON has no such numbers), every command valid
    JSON; --version and --help answer without a cluster."""
    import json
    import os
    import subprocess
    from conftest import BUILD
    ctl = os.path.join(BUILD, "client/repvarctl")
    env = dict(os.environ, REPVAR_COORDINATOR_ADDRESS=cluster)

    def run(*args):
        out = subprocess.run([ctl, *args], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout, parse_constant=lambda t: (_ for _ in ()).throw(
            ValueError(f"not JSON: {t}")))

    client.create("ctljson/i", "int64", (2,), replica_count=2)
    run("--json", "assign", "ctljson/i", "--value=9007199254740993,-9223372036854775808")
    assert run("read", "ctljson/i", "--json")["values"] == [2**53 + 1, -2**63]
    client.create("ctljson/f", "float32", (3,), replica_count=2, allow_nonfinite=True)
    client.assign("ctljson/f", np.array([np.nan, np.inf, -1.5], np.float32))
    assert run("--json", "read", "ctljson/f")["values"] == ["NaN", "Infinity", -1.5]
    names = [v["name"] for v in run("--json", "vars") if v["name"].startswith("ctljson/")]
    assert names == ["ctljson/f", "ctljson/i"], names
    assert run("--json", "topology")["infeed_host"]["job"] == "tpu_worker"
    assert run("--json", "status")["replicas_by_state"]["UP_TO_DATE"] >= 4
    version = subprocess.run([ctl, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("repvarctl 0.1.0 (commit "), version.stdout
    usage = subprocess.run([ctl, "--help"], capture_output=True, text=True, check=True).stdout
    assert "watch" in usage and "--token_file" in usage, usage
    bad = subprocess.run([ctl, "no-such-command"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0


def test_repvarctl_status_and_delete_use_the_admin_service(client, cluster):
    import os
    import subprocess
    from conftest import BUILD
    ctl = os.path.join(BUILD, "client/repvarctl")
    env = dict(os.environ, REPVAR_COORDINATOR_ADDRESS=cluster)
    client.create("ops/doomed", "float32", (2,), replica_count=3, initializer=repvar.zeros())
    client.initialize(["ops/doomed"])
    out = subprocess.run([ctl, "status"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert "live task(s)" in out and "tpu_worker:0 at" in out, out
    assert "UP_TO_DATE" in out and "last committed step:" in out, out
    assert re.search(r"tpu_worker:0 at \S+, 3 device\(s\)  <- infeed host", out), out
    assert out.count("<- infeed host") == 1, out
    st = json.loads(subprocess.run([ctl, "status", "--json"], env=env, capture_output=True,
                                   text=True, check=True).stdout)
    assert st["infeed_host"]["job"] == "tpu_worker" and st["infeed_host"]["task"] == 0, st
    assert st["steps"]["last_committed_step"] >= 0 and "recent" in st["steps"], st
    assert st["draining"] is False and "step" in st["divergences_repaired"], st
    subprocess.run([ctl, "delete", "ops/doomed"], env=env, check=True)
    gone = subprocess.run([ctl, "delete", "ops/doomed"], env=env, capture_output=True, text=True)
    assert gone.returncode != 0 and "NOT_FOUND" in gone.stderr, gone.stderr
    with pytest.raises(repvar.NotFound):
        client.variable("ops/doomed")


def _columns(values):
    """A ReadColumns as the coordinator builds it, from (array, version)."""
    c = cpb.ReadColumns()
    dtypes = {np.dtype("<f4"): tpb.DTYPE_FLOAT32, np.dtype("<i4"): tpb.DTYPE_INT32}
    for a, version in values:
        spec = tpb.TensorSpec(dtype=dtypes[a.dtype], dims=a.shape)
        if spec not in c.specs:
            c.specs.append(spec)
        c.spec_index.append(list(c.specs).index(spec))
        c.versions.append(version)
        c.checksums.append(repvar.tensors.checksum(a.tobytes()))
        c.data += a.tobytes()
    return c


def test_read_columns_each_value_in_order_and_a_damaged_answer_refused():
    """A batched read's answer by column (V6, C1), as read_many takes it:
    each value in the order of the names, writable; columns that do not
    match, or a value that fails its checksum, are refused."""
    values = [(np.arange(4, dtype=np.float32), 3), (np.full((2, 2), 7, np.int32), 5),
              (np.ones(4, np.float32), 9)]
    good = _columns(values)
    assert len(good.specs) == 2
    out = repvar.tensors.from_columns(good, 3)
    for (a, version), (b, got) in zip(values, out):
        np.testing.assert_array_equal(a, b)
        assert b.dtype == a.dtype and got == version
    out[0][0][0] = 1  # writable
    with pytest.raises(ValueError, match="2 versions for 3 values"):
        repvar.tensors.from_columns(_columns(values[:2]), 3)
    bad = cpb.ReadColumns()
    bad.CopyFrom(good)
    bad.spec_index[2] = 2
    with pytest.raises(ValueError, match="spec_index.2. is 2 of 2 specs"):
        repvar.tensors.from_columns(bad, 3)
    bad.CopyFrom(good)
    bad.data = good.data[:1] + bytes([good.data[1] ^ 1]) + good.data[2:]
    with pytest.raises(ValueError, match="value 0 fails its checksum"):
        repvar.tensors.from_columns(bad, 3)
    bad.CopyFrom(good)
    bad.data = good.data + b"x"
    with pytest.raises(ValueError, match="1 bytes of data left over"):
        repvar.tensors.from_columns(bad, 3)


def test_read_variables_without_columns_answers_a_result_per_variable(client):
    """A client from before the columns (no `columns` in its request) still
    gets a ReadResult per variable; one that asks gets the columns only."""
    with repvar.replicated_scope(6, "cols"):
        client.create("x", "float32", (3,))
    value = np.array([1, 2, 3], np.float32)
    client.assign("cols/x", value)
    old = client.stub.ReadVariables(cpb.ReadVariablesRequest(names=["cols/x"]))
    assert [r.name for r in old.results] == ["cols/x"] and not old.columns.versions
    assert repvar.tensors.from_tensor(old.results[0].value).tobytes() == value.tobytes()
    new = client.stub.ReadVariables(cpb.ReadVariablesRequest(names=["cols/x"], columns=True))
    assert not new.results and list(new.columns.versions) == [old.results[0].version]
    (back, version), = repvar.tensors.from_columns(new.columns, 1)
    assert back.tobytes() == value.tobytes() and version == old.results[0].version
