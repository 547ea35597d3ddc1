# SPDX-License-Identifier: Apache-2.0
"""A replicated step as a trainer sees it (Client.step)."""


import grpc

from repvar import errors, tensors
from repvar._frames import _CHUNK_FIELD, _check_out_array, _frame_reader, _frame_writer, _take_value
from repvar.errors import StepFailed
from repvar.mapping import Mapping
from repvar.v1 import step_pb2 as spb


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class Step:
    """A replicated step as a trainer sees it (docs/contract.md S1-S5); use
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
            spb.BeginStepRequest(step=step, barrier_timeout_ms=int(barrier_timeout * 1000),
                                 shared_lists=True),
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
        lists = self.info.participant_lists
        held = lists[v.participant_list - 1].replica_participant if v.participant_list else \
            v.replica_participant
        return [i for i, p in enumerate(held) if self._me >= 0 and p == self._me]

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
