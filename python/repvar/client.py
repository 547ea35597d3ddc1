# SPDX-License-Identifier: Apache-2.0
"""A small client over the generated stubs: numpy in, numpy out."""

import collections
import contextlib
import ctypes
import mmap
import os
import threading
import types
import uuid
from typing import Iterable, List, Optional, Sequence, Tuple

import grpc
import numpy as np
from google.protobuf import message

from repvar import errors, tensors
from repvar.errors import StepFailed
from repvar.v1 import coordinator_pb2 as cpb
from repvar.v1 import coordinator_pb2_grpc as cgrpc
from repvar.v1 import step_pb2 as spb
from repvar.v1 import types_pb2 as tpb

_scopes = threading.local()


class WriteAck(collections.namedtuple("WriteAck", "version checksum value")):
    """A committed cross-replica write: its version and checksum, and the new
    value (a numpy array) when read_value was in effect, else None."""

AGGREGATIONS = {
    "NONE": tpb.AGGREGATION_NONE,
    "SUM": tpb.AGGREGATION_SUM,
    "MEAN": tpb.AGGREGATION_MEAN,
    "ONLY_FIRST_REPLICA": tpb.AGGREGATION_ONLY_FIRST_REPLICA,
}
OPS = {"assign": cpb.ASSIGN_OP_ASSIGN, "add": cpb.ASSIGN_OP_ADD, "sub": cpb.ASSIGN_OP_SUB}


@contextlib.contextmanager
def replicated_scope(replica_count: int, prefix: str = ""):
    """Sets the replica count and name prefix of variables created inside it
    (this thread), like the seed's replicated_scope. Scopes nest."""
    stack = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
    stack.append((replica_count, prefix))
    try:
        yield
    finally:
        stack.pop()


def _apply_scope(name, replica_count):
    stack = getattr(_scopes, "stack", [])
    prefixes = [p for _, p in stack if p]
    if prefixes:
        name = "/".join(prefixes + [name])
    if not replica_count:
        replica_count = stack[-1][0] if stack else 1
    return name, replica_count


def zeros():
    return tpb.Initializer(zeros=True)


def ones():
    return tpb.Initializer(ones=True)


def constant(v: float):
    return tpb.Initializer(constant=v)


def random_normal(mean: float, stddev: float, seed: int):
    return tpb.Initializer(random_normal=tpb.RandomNormal(
        mean=mean, stddev=stddev, seed=seed, generator=tpb.RANDOM_GENERATOR_SPLITMIX64_V1))


def random_uniform(lo: float, hi: float, seed: int):
    return tpb.Initializer(random_uniform=tpb.RandomUniform(
        minval=lo, maxval=hi, seed=seed, generator=tpb.RANDOM_GENERATOR_SPLITMIX64_V1))


def value(array, dtype_name: str):
    return tpb.Initializer(value=tensors.to_tensor(array, dtype_name))


def _read(path, what):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror}") from None
    if not data.strip():
        raise ValueError(f"{what} {path} is empty")
    return data


def _credentials(tls_ca, tls_cert, tls_key, token_file):
    """Channel credentials as the C++ client makes them (common/rpc/security.h):
    TLS when a CA is given; the token on every call; with a token and no TLS,
    local credentials (plaintext that reaches loopback only). None: plaintext."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("a client certificate needs both its file and its key's")
    token = None
    if token_file:
        lines = [l.strip() for l in _read(token_file, "token file").decode().splitlines()]
        token = next((l for l in lines if l and not l.startswith("#")), None)
        if token is None:
            raise ValueError(f"token file {token_file} holds no token")
    if tls_ca:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca, "CA file"),
            private_key=_read(tls_key, "key file") if tls_key else None,
            certificate_chain=_read(tls_cert, "certificate file") if tls_cert else None)
    elif token:
        creds = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        return None
    if token:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds


def _frame_reader(channel, service, method):
    """An errors.Stub whose server-streaming `method` of `service` (a
    ServiceDescriptor) answers with the bytes on the wire, unparsed:
    _take_value finds each chunk's data in them (tensors.parse_chunk_frame)
    and copies it once, into the array. Protobuf's parse copied it out of the
    message, and each read of the parsed `data` field copied it again."""
    call = channel.unary_stream(f"/{service.full_name}/{method}",
                                request_serializer=_serialize, response_deserializer=None)
    return errors.Stub(types.SimpleNamespace(**{method: call}))


def _frame_writer(channel, service, method, response):
    """An errors.Stub whose client-streaming `method` of `service` sends
    the bytes it is given as they are (a serialized header, then
    tensors.chunk_frame's frames: each chunk's bytes copied once) and
    parses its one answer as a `response`."""
    call = channel.stream_unary(f"/{service.full_name}/{method}", request_serializer=None,
                                response_deserializer=response.FromString)
    return errors.Stub(types.SimpleNamespace(**{method: call}))


def _serialize(message) -> bytes:
    return message.SerializeToString()


# TensorChunk's field in ReadVariableResponse, ReadVariableChunk,
# AssignVariableRequest and StepWriteRequest.
_CHUNK_FIELD = 2


def _take_value(frames, name, message_type, header_of, out=None):
    """(array, version) of the value a stream of a header and chunks carries
    (read, Step.read), its messages as the bytes on the wire (_frame_reader):
    the first is parsed as a `message_type`, and `header_of` it is its
    (TensorHeader, version). DataLoss for a stream without its header or
    damaged; InvalidArgument for an `out` not of the value's dtype and size."""

    def parse(frame):
        try:
            return message_type.FromString(frame)
        except message.DecodeError:
            raise ValueError(f"a stream message that does not parse as "
                             f"{message_type.DESCRIPTOR.full_name}") from None

    def chunks():
        for frame in frames:
            piece = tensors.parse_chunk_frame(frame, _CHUNK_FIELD)
            if piece is None:  # laid out otherwise: protobuf's meaning
                m = parse(frame)
                if m.WhichOneof("part") != "chunk":
                    raise ValueError("a message that is not the next chunk")
                piece = (m.chunk.offset, m.chunk.data, m.chunk.checksum)
            yield piece

    try:
        first = next(frames, None)
        head = parse(first) if first is not None else None
        if head is None or head.WhichOneof("part") != "header":
            raise ValueError("the stream did not begin with its header")
        header, version = header_of(head)
        return tensors.assemble(header, chunks(), out=out), version
    except tensors.OutMismatch as e:  # before any chunk
        frames.cancel()
        raise errors.InvalidArgument(f"{name}: {e}") from None
    except ValueError as e:
        frames.cancel()
        raise errors.DataLoss(f"reading {name}: {e}") from e


def _check_out_array(out):
    """InvalidArgument unless `out` is None or a writable C-contiguous array."""
    if out is not None and not (isinstance(out, np.ndarray) and out.flags.c_contiguous
                                and out.flags.writeable):
        raise errors.InvalidArgument("out must be a writable C-contiguous numpy array")


_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def tune_malloc_for_bulk_transfers() -> bool:
    """Large blocks from the heap rather than fresh mappings, and freed
    memory kept there (glibc only: False elsewhere, nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # the largest glibc accepts
                and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def connect(address: Optional[str] = None, *, tls_ca: Optional[str] = None,
            tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
            token_file: Optional[str] = None, timeout: float = 30.0) -> "Client":
    """A Client for the coordinator at `address`, once it answers. Arguments
    left out come from the environment, as jax.distributed.initialize does:
    REPVAR_COORDINATOR_ADDRESS, REPVAR_TLS_CA, REPVAR_TLS_CERT,
    REPVAR_TLS_KEY, REPVAR_TOKEN_FILE. `timeout` bounds the wait for the
    connection and is each call's deadline. Raises Unavailable when nothing
    answers in time (or the TLS handshake fails), ValueError without an
    address."""
    c = Client(address, timeout, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
               token_file=token_file)
    try:
        grpc.channel_ready_future(c.channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        c.close()
        raise errors.Unavailable(
            f"no coordinator answered at {c.address} within {timeout} s (is it up? "
            "under TLS: the CA and the address in its certificate?)") from None
    return c


class Client:
    """numpy-level access to a repvar coordinator. Every call has a deadline;
    a failed call raises a repvar.Error subclass (repvar.errors)."""

    def __init__(self, address: str = None, timeout: float = 30.0, *, tls_ca: str = None,
                 tls_cert: str = None, tls_key: str = None, token_file: str = None,
                 mapping_cache_bytes: int = 1 << 30, tune_malloc: bool = True):
        """Arguments left out come from the environment: REPVAR_COORDINATOR_ADDRESS,
        REPVAR_TLS_CA (a PEM CA file: every call is TLS), REPVAR_TLS_CERT and
        REPVAR_TLS_KEY (an optional client certificate), REPVAR_TOKEN_FILE (its
        first line is the bearer token sent on every call).

        mapping_cache_bytes: Step.map keeps its mappings of a worker's buffers
        after a lease, up to this many bytes, and maps the same buffer again
        for free (the worker lends the same few buffers step after step; a
        fresh mapping's first touch of each page costs more than the copy). 0:
        map and unmap every lease.

        tune_malloc: keep the large blocks a tensor's chunks pass through in
        the heap, and freed memory there (glibc's mallopt, as the C++ client's
        ClientOptions::tune_malloc): each 1 MiB chunk of a read or a write was
        a fresh mapping whose pages faulted in one by one, which cost more than
        copying the bytes. It changes the process's malloc settings; pass
        False if that matters."""
        address = address or os.environ.get("REPVAR_COORDINATOR_ADDRESS")
        if not address:
            raise ValueError("no coordinator address: pass one or set REPVAR_COORDINATOR_ADDRESS")
        if tune_malloc:
            tune_malloc_for_bulk_transfers()
        self._credentials = _credentials(
            tls_ca or os.environ.get("REPVAR_TLS_CA"),
            tls_cert or os.environ.get("REPVAR_TLS_CERT"),
            tls_key or os.environ.get("REPVAR_TLS_KEY"),
            token_file or os.environ.get("REPVAR_TOKEN_FILE"))
        self.address = address
        self.channel = self._open(address)
        # Their calls raise repvar.Error (errors.py), not grpc.RpcError.
        self.stub = errors.Stub(cgrpc.CoordinatorTrainersStub(self.channel))
        self.admin = errors.Stub(cgrpc.CoordinatorAdminStub(self.channel))
        trainers = cpb.DESCRIPTOR.services_by_name["CoordinatorTrainers"]
        self._frames = _frame_reader(self.channel, trainers, "ReadVariable")
        self._writes = _frame_writer(self.channel, trainers, "AssignVariable",
                                     cpb.AssignVariableResponse)
        self.timeout = timeout
        self._dtypes = {}
        # The byte size of each variable as this client last saw it: one
        # known to be small is read in one unary call (_SMALL_READ_BYTES).
        self._sizes = {}
        self._mappings = _MappingCache(mapping_cache_bytes)

    def close(self) -> None:
        self._mappings.clear()
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False

    def topology(self) -> tpb.Topology:
        """The workers, their devices and the accelerators in ordinal order."""
        return self.stub.GetTopology(cpb.GetTopologyRequest(), timeout=self.timeout)

    def wait_for_topology(self, seconds: float) -> tpb.Topology:
        """Waits until every task the coordinator expects is live
        (raises DeadlineExceeded after `seconds`)."""
        return self.stub.WaitForTopology(
            cpb.WaitForTopologyRequest(timeout_ms=int(seconds * 1000)),
            timeout=seconds + 5, wait_for_ready=True)

    def create(self, name: str, dtype: str, shape: Sequence[int], replica_count: int = 0,
               trainable: bool = True, aggregation: str = "NONE",
               initializer: Optional[tpb.Initializer] = None, collections: Sequence[str] = (),
               allow_nonfinite: bool = False) -> tpb.VariableInfo:
        """Creates a variable (named and counted by the enclosing
        replicated_scope); raises AlreadyExists, InvalidArgument, ..."""
        name, replica_count = _apply_scope(name, replica_count)
        spec = tpb.VariableSpec(
            name=name, tensor=tpb.TensorSpec(dtype=tensors.DTYPES[dtype][0], dims=list(shape)),
            trainable=trainable, collections=list(collections), replica_count=replica_count,
            aggregation=AGGREGATIONS[aggregation], allow_nonfinite=allow_nonfinite)
        item = cpb.CreateVariableItem(spec=spec)
        if initializer is not None:
            item.initializer.CopyFrom(initializer)
        resp = self.stub.CreateVariables(
            cpb.CreateVariablesRequest(request_id=uuid.uuid4().hex, items=[item]),
            timeout=self.timeout)
        self._dtypes[name] = dtype
        self._remember(resp.variables[0])
        return resp.variables[0]

    def variable(self, name: str) -> tpb.VariableInfo:
        info = self.stub.GetVariable(cpb.GetVariableRequest(name=name), timeout=self.timeout)
        self._remember(info)
        return info

    def _remember(self, info: tpb.VariableInfo) -> None:
        if info.spec.tensor.dtype in tensors._BY_ENUM:
            self._sizes[info.spec.name] = tensors.byte_size(info.spec.tensor)

    def list(self, collection: str = "", replicas: bool = True) -> List[tpb.VariableInfo]:
        """The variables in `collection` (all when empty), by name;
        `replicas=False` leaves each one's replicas out (VARIABLE_DETAIL_BASIC:
        a far smaller answer for thousands of variables)."""
        detail = tpb.VARIABLE_DETAIL_FULL if replicas else tpb.VARIABLE_DETAIL_BASIC
        return self.stub.ListVariables(
            cpb.ListVariablesRequest(collection=collection, detail=detail),
            timeout=self.timeout).variables

    def delete(self, name: str) -> None:
        """Deletes a variable (an admin's call)."""
        self.admin.DeleteVariable(cpb.DeleteVariableRequest(request_id=uuid.uuid4().hex, name=name),
                                 timeout=self.timeout)
        self._dtypes.pop(name, None)
        self._sizes.pop(name, None)

    def publish_scalar(self, name: str, step: int, value: float) -> None:
        """Publishes `value` at `step` of the curve `name` (a loss, an
        accuracy) for the coordinator's web view; each trainer may publish
        its own and the view shows their mean per step. Kept in the
        coordinator's memory only; sent once, never retried. Raises
        InvalidArgument (a name not of 1-128 [A-Za-z0-9_./:-], a negative
        step), ResourceExhausted (a 65th name)."""
        self.stub.PublishScalars(cpb.PublishScalarsRequest(
            points=[cpb.ScalarPoint(name=name, step=int(step), value=float(value))]),
            timeout=self.timeout)

    def initialize(self, names: Iterable[str]):
        """Initializes each variable once (the first caller wins); returns a
        result per name."""
        req = cpb.InitializeVariablesRequest(request_id=uuid.uuid4().hex,
                                             items=[cpb.InitializeItem(name=n) for n in names])
        return self.stub.InitializeVariables(req, timeout=self.timeout).results

    def is_initialized(self, names: Iterable[str]):
        return self.stub.IsInitialized(cpb.IsInitializedRequest(names=list(names)),
                                       timeout=self.timeout).results

    def _dtype_of(self, name):
        if name not in self._dtypes:
            info = self.variable(name)
            enum = info.spec.tensor.dtype
            self._dtypes[name] = tensors._BY_ENUM[enum][0]
        return self._dtypes[name]

    def assign(self, name: str, array, op: str = "assign", read_value: Optional[bool] = None,
               chunk_bytes: int = 1 << 20, request_id: Optional[str] = None) -> "WriteAck":
        """Cross-replica write (`op`: "assign", "add" or "sub"); returns its
        WriteAck. `read_value`: answer with the new value; None leaves it to
        the coordinator, which follows the seed (assign does not, add and sub
        do)."""
        dtype = self._dtype_of(name)
        h, frames = tensors.header_and_frames(array, dtype, _CHUNK_FIELD, chunk_bytes)
        rid = request_id or uuid.uuid4().hex
        header = cpb.AssignHeader(request_id=rid, name=name, op=OPS[op], tensor=h)
        if read_value is not None:
            header.read_value = read_value

        def stream():
            yield cpb.AssignVariableRequest(header=header).SerializeToString()
            yield from frames

        resp = self._writes.AssignVariable(stream(), timeout=self.timeout + h.byte_size / 50e6)
        value = None
        if resp.HasField("value"):
            value = tensors.from_tensor(resp.value, writable=True)
        elif read_value if read_value is not None else op != "assign":
            value = self.read(name)[0]  # too large to ride along, or a retry's answer
        return WriteAck(resp.version, resp.checksum, value)

    def assign_add(self, name: str, delta, read_value: Optional[bool] = None,
                   **kwargs) -> "WriteAck":
        """assign(name, delta, op="add"): returns the new value by default."""
        return self.assign(name, delta, op="add", read_value=read_value, **kwargs)

    def assign_sub(self, name: str, delta, read_value: Optional[bool] = None,
                   **kwargs) -> "WriteAck":
        """assign(name, delta, op="sub"): returns the new value by default."""
        return self.assign(name, delta, op="sub", read_value=read_value, **kwargs)

    def read(self, name: str, chunk_bytes: int = 1 << 20,
             out: Optional[np.ndarray] = None) -> Tuple[np.ndarray, int]:
        """Returns (numpy array, version) of the last committed value, every
        chunk and the whole value checked against their checksums (DataLoss).
        With `out`, a writable C-contiguous array of the value's dtype (or
        uint8, for its raw bytes) and size, any shape (a framework's parameter
        storage, say), the value is written into it and `out` is returned:
        nothing of the value's size is allocated. InvalidArgument, with `out`
        untouched, for another dtype or size. A value this client knows to be
        small (1 MiB at most: created, looked up or read here before) comes in
        one unary call, which costs a fraction of a stream's set-up."""
        _check_out_array(out)
        if self._sizes.get(name, self._SMALL_READ_BYTES + 1) <= self._SMALL_READ_BYTES:
            try:
                [(value, version)] = self.read_many([name])
            except errors.ResourceExhausted:
                pass  # created again, larger, since this client saw it: stream it
            else:
                if out is None:
                    return value, version
                try:
                    tensors.copy_into(out, value)
                except tensors.OutMismatch as e:
                    raise errors.InvalidArgument(f"{name}: {e}") from None
                return out, version
        frames = self._frames.ReadVariable(
            cpb.ReadVariableRequest(name=name, chunk_bytes=chunk_bytes), timeout=self.timeout + 60)
        value, version = _take_value(frames, name, cpb.ReadVariableResponse,
                                     lambda m: (m.header.tensor, m.header.version), out)
        self._sizes[name] = value.nbytes
        return value, version

    _SMALL_READ_BYTES = 1 << 20  # as the C++ client's kSmallReadBytes

    def read_many(self, names: Sequence[str]) -> List[Tuple[np.ndarray, int]]:
        """(numpy array, version) of each variable's last committed value, in
        one call (at most 32 MiB in all: ResourceExhausted beyond; read()
        streams any size). The arrays are writable."""
        names = list(names)
        resp = self.stub.ReadVariables(cpb.ReadVariablesRequest(names=names, columns=True),
                                       timeout=self.timeout)
        if resp.results:  # a coordinator from before the columns
            return [(tensors.from_tensor(r.value, writable=True), r.version)
                    for r in resp.results]
        try:
            out = tensors.from_columns(resp.columns, len(names))
        except ValueError as e:
            raise errors.DataLoss(str(e)) from e
        for n, (value, _) in zip(names, out):
            self._sizes[n] = value.nbytes
        return out

    def step(self, step: int, worker: str, barrier_timeout: float = 60.0,
             devices: Sequence[str] = ()) -> "Step":
        """Begins replicated step `step` for the trainer on host `worker`
        ("job:task"); use it as a context manager (see Step)."""
        return Step(self, step, worker, barrier_timeout, devices)

    def last_committed_step(self) -> int:
        return self.stub.GetSteps(spb.GetStepsRequest(), timeout=self.timeout).last_committed_step

    def _open(self, address):
        opts = [("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20)]
        if self._credentials is None:
            return grpc.insecure_channel(address, options=opts)
        return grpc.secure_channel(address, self._credentials, options=opts)

    def _worker_channel(self, address):
        cache = self.__dict__.setdefault("_workers", {})
        if address not in cache:
            cache[address] = self._open(address)
        return cache[address]


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class Step:
    """A replicated step as a trainer sees it (DESIGN.md S1-S5); use
    `client.step(k, worker="tpu_worker:0")` as a context manager. Inside it the
    trainer reads and writes its own host's replicas through the local worker;
    `commit()` returns the step's resolution (the same for every trainer) or
    raises StepFailed. Leaving the block without a commit aborts the step."""

    def __init__(self, client, step, worker, barrier_timeout=60.0, devices=()):
        from repvar.v1 import worker_pb2 as wpb
        from repvar.v1 import worker_pb2_grpc as wgrpc
        self._wpb = wpb
        self.client = client
        self.barrier_timeout = barrier_timeout
        self.devices = list(devices)
        job, _, task = worker.rpartition(":")
        self.info = client.stub.BeginStep(
            spb.BeginStepRequest(step=step, barrier_timeout_ms=int(barrier_timeout * 1000)),
            timeout=client.timeout + barrier_timeout)
        self._vars = {v.name: v for v in self.info.variables}
        self._me = -1
        address = None
        for i, p in enumerate(self.info.participants):
            if p.job == job and p.task == int(task):
                self._me, address = i, p.address
        if address is None:
            for t in client.topology().tasks:
                if t.job == job and t.task == int(task):
                    address = t.address
        if address is None:
            raise ValueError(f"worker {worker} is not live")
        channel = client._worker_channel(address)
        self.worker = errors.Stub(wgrpc.WorkerStepsStub(channel))
        steps = wpb.DESCRIPTOR.services_by_name["WorkerSteps"]
        self._frames = _frame_reader(channel, steps, "StepRead")
        self._writes = _frame_writer(channel, steps, "StepWrite", wpb.StepWriteResponse)
        self.closed = False

    @property
    def epoch(self):
        return self.info.epoch

    def _var(self, name):
        if name not in self._vars:
            raise KeyError(f"{name} is not in step {self.info.step} (created or initialized "
                           "after it began, or unknown)")
        return self._vars[name]

    def local_replicas(self, name):
        v = self._var(name)
        return [i for i, p in enumerate(v.replica_participant) if self._me >= 0 and p == self._me]

    def read(self, name, replica, out=None):
        """This step's view of a local replica: its own write, else the committed value.
        Large tensors come through a mapping of the worker's buffer (one copy),
        others through its socket (checked against their checksums: DataLoss),
        small ones (64 KiB at most) in one unary call, larger ones streamed.
        With `out`, as Client.read takes it (a writable C-contiguous array of
        the value's dtype or uint8, and its size), the view is written into it
        and `out` is returned; InvalidArgument, `out` untouched, otherwise."""
        v = self._var(name)
        if out is not None:
            _check_out_array(out)
            try:
                tensors.check_out(out, v.spec.dtype, tensors.byte_size(v.spec))
            except tensors.OutMismatch as e:
                raise errors.InvalidArgument(f"{name}: {e}") from None
        if self._mappable(v):
            try:
                with self.map(name, replica, "read") as m:
                    if out is None:
                        return m.array.copy()
                    tensors._bytes(out)[:] = tensors._bytes(m.array)
                    return out
            except OSError:
                self._map_failed = True  # not on the worker's host: use its socket
        if tensors.byte_size(v.spec) <= self._INLINE_BYTES:
            # One unary call costs less than a stream's set-up.
            [value] = self.read_many([(name, replica)])
            if out is None:
                return value
            tensors._bytes(out)[:] = tensors._bytes(value)
            return out
        frames = self._frames.StepRead(self._wpb.StepReadRequest(
            step=self.info.step, epoch=self.info.epoch, variable_id=v.id, replica=replica),
            timeout=self.client.timeout)
        return _take_value(frames, name, self._wpb.ReadVariableChunk,
                           lambda m: (m.header, m.version), out)[0]

    def read_many(self, reads):
        """The step's view of many local replicas: `reads` is (name, replica)
        items; returns their arrays (writable) in that order, each as read()
        gives it. The small ones (64 KiB at most each) come from the worker in
        one call for up to 2 MiB of them, where read() opens a stream each;
        the others as read() reads them."""
        reads = list(reads)
        out = [None] * len(reads)
        batch, size = [], 0
        for i, (name, replica) in enumerate(reads):
            v = self._var(name)
            nbytes = tensors.byte_size(v.spec)
            if nbytes > self._INLINE_BYTES:
                out[i] = self.read(name, replica)
                continue
            counted = nbytes + self._SMALL_READ_OVERHEAD
            if batch and (size + counted > self._SMALL_READ_BATCH_BYTES
                          or len(batch) == self._SMALL_READ_BATCH_COUNT):
                self._read_small(batch, out)
                batch, size = [], 0
            batch.append((i, v, replica))
            size += counted
        if batch:
            self._read_small(batch, out)
        return out

    # A batch of small reads, as the C++ client's StepScope::ReadBatch makes
    # them: well inside what the worker answers in one call (3 MiB, 16,384).
    _SMALL_READ_BATCH_BYTES = 2 << 20
    _SMALL_READ_OVERHEAD = 128  # a value's header and framing, counted
    _SMALL_READ_BATCH_COUNT = 4096

    def _read_small(self, batch, out):
        resp = self.worker.StepReadSmall(self._wpb.StepReadSmallRequest(reads=[
            self._wpb.StepReadRequest(step=self.info.step, epoch=self.info.epoch,
                                      variable_id=v.id, replica=replica)
            for _, v, replica in batch]), timeout=self.client.timeout)
        if len(resp.values) != len(batch):
            raise errors.DataLoss(f"the worker answered {len(resp.values)} values for "
                                  f"{len(batch)} reads")
        for (i, v, replica), got in zip(batch, resp.values):
            try:
                if got.value.header.spec != v.spec:
                    raise ValueError("a value of another spec than the step's")
                out[i] = tensors.from_tensor(got.value, writable=True)
            except ValueError as e:
                raise errors.DataLoss(f"reading {v.name}/{replica} from the worker: {e}") from None

    def write(self, name, replica, array):
        """Writes the replica's step-local copy: large tensors through a mapping of
        the worker's buffer (one copy), others as a chunk stream."""
        v = self._var(name)
        dtype = tensors._BY_ENUM[v.spec.dtype][0]
        if self._mappable(v):
            wire = tensors._as_wire(array, dtype)
            try:
                m = self.map(name, replica, "write")
            except OSError:
                self._map_failed = True
            else:
                if m.array.shape != wire.shape:
                    m.release()
                    raise ValueError(f"{name} is {tuple(m.array.shape)}; the value is "
                                     f"{tuple(wire.shape)}")
                # Copy and hash block by block, each block hashed while in
                # cache (as the C++ client does): the worker takes the sum.
                dst, src = tensors._bytes(m.array), tensors._bytes(wire)
                state = tensors.checksum_state()
                for off in range(0, len(src), self._COPY_BLOCK):
                    dst[off:off + self._COPY_BLOCK] = src[off:off + self._COPY_BLOCK]
                    state.update(dst[off:off + self._COPY_BLOCK])
                m.release(publish=True, checksum=state.intdigest())
                return
        h, frames = tensors.header_and_frames(array, dtype, _CHUNK_FIELD)
        hdr = dict(step=self.info.step, epoch=self.info.epoch, variable_id=v.id, replica=replica,
                   tensor=h, stream_writes=1)

        def stream():
            yield self._wpb.StepWriteRequest(
                header=self._wpb.StepWriteHeader(**hdr)).SerializeToString()
            yield from frames

        self._writes.StepWrite(stream(), timeout=self.client.timeout + h.byte_size / 50e6)

    _INLINE_BYTES = 64 << 10  # up to this size a write may travel inline, batched
    _COPY_BLOCK = 256 << 10  # a mapped write copies and hashes this much at a time

    def write_many(self, writes):
        """Writes many replicas' step-local copies: `writes` is (name, replica,
        array) items. The small ones (64 KiB at most each) go to the worker
        together in one call; the others as write() sends them."""
        batch, size = [], 0
        for name, replica, array in writes:
            v = self._var(name)
            dtype = tensors._BY_ENUM[v.spec.dtype][0]
            wire = tensors._as_wire(array, dtype)
            if wire.nbytes > self._INLINE_BYTES:
                self.write(name, replica, wire)
                continue
            batch.append(self._wpb.StepWriteHeader(
                step=self.info.step, epoch=self.info.epoch, variable_id=v.id, replica=replica,
                tensor=tensors.header(wire, dtype), inline_data=wire.tobytes()))
            size += wire.nbytes
            if size >= 16 << 20:  # messages stay well below the 64 MiB limit
                self._write_small(batch)
                batch, size = [], 0
        if batch:
            self._write_small(batch)

    def _write_small(self, batch):
        self.worker.StepWriteSmall(self._wpb.StepWriteSmallRequest(writes=batch),
                                   timeout=self.client.timeout)

    _MAP_BYTES = 1 << 20  # from this size on, read and write through a mapping

    def _mappable(self, v):
        if getattr(self, "_map_failed", False):
            return False
        return tensors.byte_size(v.spec) >= self._MAP_BYTES

    def map(self, name, replica, mode="read"):
        """Maps the worker's own buffer of a local replica into this process
        (same host): `mode` "read" (read-only), "write" (fill it) or "update"
        (the step's view, writable). Returns a Mapping whose `.array` is a
        numpy view of those bytes; `publish(mapping)` makes a write or update
        the replica's step-local copy. Raises OSError when the worker's memory
        cannot be mapped from here (another container)."""
        v = self._var(name)
        if mode not in ("read", "write", "update"):
            raise ValueError(f"unknown mode {mode!r}")
        resp = self.worker.StepMap(self._wpb.StepMapRequest(
            step=self.info.step, epoch=self.info.epoch, variable_id=v.id, replica=replica,
            write=mode != "read", initialize=mode == "update"), timeout=self.client.timeout)
        return Mapping(self, v, resp, writable=mode != "read")

    def publish(self, mapping):
        """Makes a "write"/"update" mapping the replica's step-local copy."""
        if not mapping.writable:
            raise ValueError("only a write or update mapping can be published")
        mapping.release(publish=True)

    def commit(self):
        self.closed = True
        wait = self.barrier_timeout * 2 + 120
        res = self.worker.CommitStep(self._wpb.CommitStepRequest(
            step=self.info.step, epoch=self.info.epoch, devices=self.devices,
            timeout_ms=int(wait * 1000)), timeout=wait + 10)
        if res.state != spb.STEP_STATE_COMMITTED:
            raise StepFailed(_CODES.get(res.code, grpc.StatusCode.UNKNOWN), res.message, res)
        return res

    def abort(self, reason=""):
        self.closed = True
        self.client.stub.AbortStep(spb.AbortStepRequest(epoch=self.info.epoch, reason=reason),
                                   timeout=self.client.timeout)
        self.worker.DiscardStep(self._wpb.DiscardStepRequest(epoch=self.info.epoch),
                                timeout=self.client.timeout)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.closed:
            self.abort("the trainer left the step without a commit")
        return False



class _MappingCache:
    """A worker's buffers as this client mapped them, kept between leases (the
    C++ client's MappingCache, client/mapping_cache.h): a whole file mapped
    shared, keyed by its identity (st_dev, st_ino) and the access. A kept
    mapping keeps its file, so no other file can take its inode number while
    it is here. Past `capacity` bytes the least recently used entries no lease
    holds are dropped. Thread-safe."""

    class _Entry:
        __slots__ = ("mm", "length", "holders")

        def __init__(self, mm, length):
            self.mm, self.length, self.holders = mm, length, 1

    def __init__(self, capacity):
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._entries = collections.OrderedDict()  # key -> _Entry, newest last
        self._bytes = 0

    def acquire(self, path, size, writable):
        """An entry (`.mm`: a mapping of at least `size` bytes of the file at
        `path`), held until release(entry)."""
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if st.st_size < size:
                raise OSError(f"the worker's buffer holds {st.st_size} bytes; the lease names {size}")
            key = (st.st_dev, st.st_ino, writable)
            with self._lock:
                e = self._hold(key, st.st_size)
                if e is not None:
                    return e
            mm = mmap.mmap(fd, st.st_size,
                           access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        with self._lock:
            e = self._hold(key, st.st_size)
            if e is not None:  # another thread mapped it meanwhile
                mm.close()
                return e
            self.misses += 1
            if key in self._entries:  # the file changed size (workers never do that)
                self._bytes -= self._entries.pop(key).length  # its holders keep it alive
            e = self._Entry(mm, st.st_size)
            self._entries[key] = e
            self._bytes += e.length
            self._trim()
        return e

    def release(self, entry):
        with self._lock:
            entry.holders -= 1
            self._trim()

    def clear(self):
        with self._lock:
            for key in list(self._entries):
                self._drop(key)

    def _hold(self, key, length):
        e = self._entries.get(key)
        if e is None or e.length != length:
            return None
        self._entries.move_to_end(key)
        e.holders += 1
        self.hits += 1
        return e

    def _trim(self):
        for key in [k for k, e in self._entries.items() if e.holders <= 0]:  # oldest first
            if self._bytes <= self.capacity:
                break
            self._drop(key)

    def _drop(self, key):
        e = self._entries.pop(key)
        self._bytes -= e.length
        try:
            e.mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with it


class Mapping:
    """A local replica's buffer mapped from its worker (see Step.map). `.array`
    is valid until release (publish or the end of a `with` block), not after:
    the client keeps the mapping for the buffer's next lease, when the same
    memory may hold another step's value."""

    def __init__(self, step, var, resp, writable):
        self._step = step
        self.lease = resp.lease
        self.writable = writable
        self.checksum = resp.checksum
        self.version = resp.version
        cache = step.client._mappings
        self._entry = cache.acquire(f"/proc/{resp.pid}/fd/{resp.fd}", resp.byte_size, writable)
        name, npd = tensors._BY_ENUM[var.spec.dtype]
        try:
            self.array = np.frombuffer(self._entry.mm, dtype=npd,
                                       count=resp.byte_size // np.dtype(npd).itemsize)
            self.array = self.array.reshape(tuple(var.spec.dims))
        except Exception:
            cache.release(self._entry)
            raise
        if not writable:
            self.array.flags.writeable = False

    def release(self, publish=False, checksum=None):
        """Ends the lease; `publish` makes a write the replica's step-local copy,
        with `checksum` its XXH3-64 when the caller took it as it wrote (else
        the worker hashes the bytes, after answering)."""
        if self.lease == 0:
            return
        lease, self.lease = self.lease, 0
        self.array = None  # drop the view before the mapping may go
        self._step.client._mappings.release(self._entry)
        # Without a checksum the worker hashes the bytes after it answers;
        # reads of the replica in this step and the commit wait for that.
        self._step.worker.StepUnmap(self._step._wpb.StepUnmapRequest(
            lease=lease, publish=publish, checksum=checksum,
            hash_later=publish and checksum is None), timeout=self._step.client.timeout)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.release(publish=False)
        return False
