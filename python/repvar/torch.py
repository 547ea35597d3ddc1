# SPDX-License-Identifier: Apache-2.0
"""A torch.nn.Module's parameters as replicated variables: data-parallel
training with one trainer per host, each step a replicated step.

    import repvar, repvar.torch
    model = MyModel()
    c = repvar.connect()
    rm = repvar.torch.ReplicatedModule(c, model, "mlp", worker="tpu_worker:0",
                                       is_chief=(rank == 0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 101):
        opt.zero_grad()
        loss_fn(model(x_local), y_local).backward()
        opt.step()                 # a local update of this trainer's copy
        rm.sync(step)              # every replica: the MEAN of the trainers' updates

Each parameter (and, with include_buffers, each floating-point buffer)
becomes the variable "<prefix>/<name with dots as slashes>", one replica
per accelerator, aggregation MEAN: in step k every trainer writes its own
new values into its host's replicas and the step resolves every replica to
begin + mean(local - begin) -- for plain SGD exactly one SGD step on the
concatenated batch when the shards are the same size. sync() then copies the
committed values back into the module's tensors (torch.from_numpy views of
what was read: no further copy). The chief (rank 0) creates and initializes
the variables from its module; the others wait for them and load the
chief's values, so every trainer starts from the same weights.
"""

import time
from typing import Dict, List, Optional

import numpy as np
import torch

import repvar
from repvar import errors

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
           torch.int32: "int32", torch.int64: "int64"}


def variable_name(prefix: str, name: str) -> str:
    """The variable of a module's parameter or buffer "layer.0.weight"."""
    return f"{prefix}/{name.replace('.', '/')}" if prefix else name.replace(".", "/")


class ReplicatedModule:
    """Keeps `module`'s parameters (and optionally buffers) as replicated
    variables, kept identical across trainers by replicated steps."""

    def __init__(self, client: "repvar.Client", module: torch.nn.Module, prefix: str, *,
                 worker: str, is_chief: bool, replica_count: Optional[int] = None,
                 include_buffers: bool = False, wait_seconds: float = 120.0):
        self.client = client
        self.module = module
        self.worker = worker
        self.tensors: Dict[str, torch.Tensor] = {}
        for name, p in module.named_parameters():
            self.tensors[variable_name(prefix, name)] = p
        if include_buffers:
            for name, b in module.named_buffers():
                if b.dtype.is_floating_point:
                    self.tensors[variable_name(prefix, name)] = b
        for name, t in self.tensors.items():
            if t.dtype not in _DTYPES:
                raise ValueError(f"{name}: dtype {t.dtype} has no repvar dtype")
        if replica_count is None:
            replica_count = len(client.topology().accelerators)
        self.replica_count = replica_count
        if is_chief:
            self._create_from_module()
        self._wait_until_initialized(wait_seconds)
        self.load()

    @property
    def names(self) -> List[str]:
        return list(self.tensors)

    def _create_from_module(self) -> None:
        for name, t in self.tensors.items():
            value = t.detach().cpu().numpy()
            try:
                self.client.create(name, _DTYPES[t.dtype], tuple(value.shape),
                                   replica_count=self.replica_count, aggregation="MEAN",
                                   initializer=repvar.value(value, _DTYPES[t.dtype]))
            except errors.AlreadyExists:
                pass  # a restarted chief: the cluster's values win
        self.client.initialize(self.names)

    def _wait_until_initialized(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                if all(r.initialized for r in self.client.is_initialized(self.names)):
                    return
            except errors.NotFound:
                pass  # the chief has not created them yet
            if time.monotonic() > deadline:
                raise errors.DeadlineExceeded(
                    f"the variables of {self.names[0]}... were not initialized within "
                    f"{seconds} s (is the chief trainer running?)")
            time.sleep(0.05)

    def load(self, names: Optional[List[str]] = None) -> int:
        """Makes the committed values the module's (of `names`, default all);
        returns their version. Each tensor stays the same Parameter object, so
        optimizers keep working: a large one on the CPU takes the bytes into
        its own memory as they arrive (read(out=...)), the others the arrays
        read (torch.from_numpy: no copy). A load that raises may leave a
        large tensor partly written: load again."""
        version = 0
        wanted = self.tensors if names is None else {n: self.tensors[n] for n in names}
        # Small tensors in batched calls (one round trip for many), large
        # ones streamed.
        small, batch, size = [], [], 0
        for name, t in wanted.items():
            nbytes = t.numel() * t.element_size()
            if nbytes > self._BATCH_READ_BYTES:
                continue
            if size + nbytes > self._BATCH_READ_BYTES and batch:
                small.append(batch)
                batch, size = [], 0
            batch.append(name)
            size += nbytes
        if batch:
            small.append(batch)
        values = {}
        for names in small:
            for name, (value, v) in zip(names, self.client.read_many(names)):
                values[name] = (value, v)
        with torch.no_grad():
            for name, t in wanted.items():
                if name not in values and t.device.type == "cpu" and t.is_contiguous():
                    # Streamed into the tensor's own (warm) memory: a fresh
                    # array's first touch costs more than the copy.
                    _, version = self.client.read(name, out=t.detach().numpy())
                    continue
                value, version = values[name] if name in values else self.client.read(name)
                t.data = torch.from_numpy(value.reshape(tuple(t.shape)))
        return version

    _BATCH_READ_BYTES = 8 << 20

    def _load_local(self, s, resolution) -> List[str]:
        """After a commit, the large tensors from this host's own replicas:
        mapped from the worker (one copy, no socket), taken only when the
        replica holds what the step committed (its checksum is the
        resolution's). Returns the names left for load()."""
        committed = {c.name: c.checksum for c in resolution.changed}
        rest = []
        with torch.no_grad():
            for name, t in self.tensors.items():
                local = s.local_replicas(name)
                if name not in committed or not local or not s._mappable(s._var(name)):
                    rest.append(name)
                    continue
                try:
                    with s.map(name, local[0], "read") as m:
                        loaded = m.checksum == committed[name]
                        value = m.array.reshape(tuple(t.shape))
                        if loaded and t.device.type == "cpu" and t.is_contiguous():
                            # Into the tensor's own (warm) memory: a fresh
                            # array's first touch costs more than the copy.
                            np.copyto(t.detach().numpy(), value)
                        elif loaded:
                            t.data = torch.from_numpy(value.copy())
                except (OSError, errors.Error):
                    loaded = False
                if not loaded:
                    rest.append(name)
        # Which tensors the last sync took from this host's replicas.
        self.last_local_loads = [n for n in self.tensors if n not in rest]
        return rest

    def sync(self, step: int, barrier_timeout: float = 60.0):
        """Replicated step `step`: writes this trainer's values of every
        tensor into its host's replicas, commits (MEAN across trainers), and
        copies the committed values back: large tensors mapped from this
        host's own replicas when they hold what the step committed, the others
        in batched reads. Returns the step's resolution;
        raises repvar.StepFailed when the step fails (the module then holds
        the last committed values again)."""
        t0 = time.perf_counter()
        with self.client.step(step, worker=self.worker, barrier_timeout=barrier_timeout) as s:
            t1 = time.perf_counter()
            s.write_many((name, r, t.detach().cpu().numpy())
                         for name, t in self.tensors.items() for r in s.local_replicas(name))
            t2 = time.perf_counter()
            try:
                resolution = s.commit()
            except errors.StepFailed:
                self.load()
                raise
            t3 = time.perf_counter()
            self.load(self._load_local(s, resolution))
        # Where the last sync's time went, in seconds (bench/torch_step.py).
        self.last_phases = {"begin": t1 - t0, "write": t2 - t1, "commit": t3 - t2,
                            "load": time.perf_counter() - t3}
        return resolution
