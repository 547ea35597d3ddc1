# SPDX-License-Identifier: Apache-2.0
"""In-place access to a worker's buffers inside a step (Step.map): the
leases' mappings, and the cache that keeps them between leases."""

import collections
import mmap
import os
import threading

import numpy as np

from repvar import tensors



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
