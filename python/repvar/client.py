# SPDX-License-Identifier: Apache-2.0
"""A small client over the generated stubs: numpy in, numpy out."""

import contextlib
import os
import threading
import uuid

import grpc

from repvar import tensors
from repvar.v1 import coordinator_pb2 as cpb
from repvar.v1 import coordinator_pb2_grpc as cgrpc
from repvar.v1 import types_pb2 as tpb

_scopes = threading.local()

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


class Client:
    """numpy-level access to a repvar coordinator. Every call has a deadline."""

    def __init__(self, address: str = None, timeout: float = 30.0):
        address = address or os.environ.get("REPVAR_COORDINATOR_ADDRESS")
        if not address:
            raise ValueError("no coordinator address: pass one or set REPVAR_COORDINATOR_ADDRESS")
        opts = [("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(address, options=opts)
        self.stub = cgrpc.CoordinatorStub(self.channel)
        self.timeout = timeout
        self._dtypes = {}

    def close(self):
        self.channel.close()

    def topology(self):
        return self.stub.GetTopology(cpb.GetTopologyRequest(), timeout=self.timeout)

    def wait_for_topology(self, seconds: float):
        return self.stub.WaitForTopology(
            cpb.WaitForTopologyRequest(timeout_ms=int(seconds * 1000)),
            timeout=seconds + 5, wait_for_ready=True)

    def create(self, name, dtype, shape, replica_count=0, trainable=True,
               aggregation="NONE", initializer=None, collections=(), allow_nonfinite=False):
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
        return resp.variables[0]

    def variable(self, name):
        return self.stub.GetVariable(cpb.GetVariableRequest(name=name), timeout=self.timeout)

    def list(self, collection=""):
        return self.stub.ListVariables(cpb.ListVariablesRequest(collection=collection),
                                       timeout=self.timeout).variables

    def delete(self, name):
        self.stub.DeleteVariable(cpb.DeleteVariableRequest(request_id=uuid.uuid4().hex, name=name),
                                 timeout=self.timeout)

    def initialize(self, names):
        req = cpb.InitializeVariablesRequest(request_id=uuid.uuid4().hex,
                                             items=[cpb.InitializeItem(name=n) for n in names])
        return self.stub.InitializeVariables(req, timeout=self.timeout).results

    def is_initialized(self, names):
        return self.stub.IsInitialized(cpb.IsInitializedRequest(names=list(names)),
                                       timeout=self.timeout).results

    def _dtype_of(self, name):
        if name not in self._dtypes:
            info = self.variable(name)
            enum = info.spec.tensor.dtype
            self._dtypes[name] = next(k for k, (e, _) in tensors.DTYPES.items() if e == enum)
        return self._dtypes[name]

    def assign(self, name, array, op="assign", read_value=False, chunk_bytes=1 << 20,
               request_id=None):
        """Cross-replica write; returns the AssignVariableResponse (version, checksum)."""
        dtype = self._dtype_of(name)
        pieces = tensors.to_chunks(array, dtype, chunk_bytes)
        h = next(pieces)
        rid = request_id or uuid.uuid4().hex

        def stream():
            yield cpb.AssignVariableRequest(header=cpb.AssignHeader(
                request_id=rid, name=name, op=OPS[op], tensor=h, read_value=read_value))
            for c in pieces:
                yield cpb.AssignVariableRequest(chunk=c)

        return self.stub.AssignVariable(stream(), timeout=self.timeout + h.byte_size / 50e6)

    def read(self, name, chunk_bytes=1 << 20):
        """Returns (numpy array, version) of the last committed value."""
        responses = self.stub.ReadVariable(cpb.ReadVariableRequest(name=name, chunk_bytes=chunk_bytes),
                                           timeout=self.timeout + 60)
        first = next(responses)
        arr = tensors.from_chunks(first.header.tensor, (r.chunk for r in responses))
        return arr, first.header.version
