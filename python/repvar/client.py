# SPDX-License-Identifier: Apache-2.0
"""A small client over the generated stubs: numpy in, numpy out."""

import collections
import contextlib
import ctypes
import os
import threading
import uuid
from typing import Iterable, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from repvar import errors, tensors
from repvar._frames import _CHUNK_FIELD, _check_out_array, _frame_reader, _frame_writer, _take_value
from repvar.mapping import _MappingCache
from repvar.step import Step
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
        local = self.__dict__.get("_local")
        if local is not None:
            got = local.read(name)
            if got is not None:
                value, version = got
                if out is None:
                    return value.copy(), version
                try:
                    tensors.copy_into(out, value)
                except tensors.OutMismatch as e:
                    raise errors.InvalidArgument(f"{name}: {e}") from None
                return out, version
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

    def use_local_reads(self, worker: str = None) -> None:
        """Reads on this host (C8; docs/architecture.md, "Local reads"): maps
        the local read table of the worker of `worker` ("job:task"; None:
        $REPVAR_WORKER), after which read() takes a committed value from it
        whenever the worker can prove it current (no call at all) and asks
        the coordinator otherwise; reads stay linearizable either way.
        NotFound: no such live worker; FailedPrecondition: the worker keeps
        no table, or its memory cannot be mapped from here."""
        from repvar import local_reads
        from repvar.v1 import worker_pb2 as wpb
        from repvar.v1 import worker_pb2_grpc as wgrpc
        worker = worker or os.environ.get("REPVAR_WORKER", "")
        job, _, task = worker.rpartition(":")
        if not job or not task.isdigit():
            raise errors.InvalidArgument(
                f'use_local_reads wants this host\'s worker as "job:task", not "{worker}"')
        address = None
        for t in self.topology().tasks:
            if t.job == job and t.task == int(task):
                address = t.address
        if address is None:
            raise errors.NotFound(f"worker {worker} is not live")
        stub = errors.Stub(wgrpc.WorkerStepsStub(self._worker_channel(address)))
        where = stub.MapLocalReads(wpb.MapLocalReadsRequest(), timeout=self.timeout)
        try:
            self._local = local_reads.LocalTable(where.pid, where.fd, where.byte_size)
        except (OSError, ValueError) as e:
            raise errors.FailedPrecondition(
                f"cannot map the local read table of {worker} ({e}); is this trainer on the "
                "worker's host?") from None

    def local_read_stats(self):
        """(served here, asked of the coordinator instead) since use_local_reads."""
        local = self.__dict__.get("_local")
        return (local.served, local.asked) if local is not None else (0, 0)

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
