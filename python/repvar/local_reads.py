# SPDX-License-Identifier: Apache-2.0
"""Reads served from this host's worker's local read table (C8;
docs/architecture.md, "Local reads"): the layout and the rules of
common/tensor/local_read_table.h, read through a read-only mapping of the
worker's memfd. A read is served only from a consistent snapshot of its slot
(seqlock), whose bytes match the slot's checksum, taken while the table's
epoch stayed and before the lease the table carries ended (CLOCK_MONOTONIC,
read after the snapshot); anything else returns None (ask the coordinator)."""

import mmap
import os
import struct
import time

import numpy as np

from repvar import tensors

_MAGIC = 0x31646165726C7672  # "rvlread1"
_HEADER = struct.Struct("<QQQQQq")  # magic, slots, arena offset, arena bytes, epoch, lease
_HEADER_BYTES = 64
_SLOT = struct.Struct("<QQQqQQQQQQQ")
_SLOT_BYTES = 128
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_MAX_VALUE_BYTES = 64 << 10
_MAX_NAME_BYTES = 1024
_MAX_RANK = 32
_TORN = object()


def _name_hash(name: bytes) -> int:
    return tensors.checksum(name) or 1


class LocalTable:
    """A worker's local read table, mapped read-only. Thread-safe."""

    def __init__(self, pid: int, fd: int, size: int):
        f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._mm = mmap.mmap(f, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(f)
        magic, slots, arena_offset, arena_bytes, _, _ = _HEADER.unpack_from(self._mm, 0)
        if (magic != _MAGIC or slots == 0 or slots & (slots - 1) or
                arena_offset != _HEADER_BYTES + slots * _SLOT_BYTES or
                arena_bytes != size - arena_offset):
            self._mm.close()
            raise ValueError("not a local read table, or not of this size")
        self._mask = slots - 1
        self._arena = arena_offset
        self._arena_bytes = arena_bytes
        self.served = 0
        self.asked = 0

    def read(self, name: str):
        """(array, version) when served here; None otherwise."""
        key = name.encode()
        h = _name_hash(key)
        mm = self._mm
        for _ in range(8):
            epoch = _U64.unpack_from(mm, 32)[0]
            lease = _I64.unpack_from(mm, 40)[0]
            if epoch & 1:  # cleared, or suspended for a step (offset 48)
                if _U64.unpack_from(mm, 48)[0]:
                    break
                continue
            got = self._snapshot(key, h)
            now = time.monotonic_ns()
            if _U64.unpack_from(mm, 32)[0] != epoch:
                continue
            if got is _TORN:
                continue
            if got is None or now >= lease:
                break
            version, checksum, dtype, dims, data = got
            if tensors.checksum(data) != checksum or dtype not in tensors._BY_ENUM:
                continue
            npd = tensors._BY_ENUM[dtype][1]
            self.served += 1
            return np.frombuffer(data, dtype=npd).reshape(dims), version
        self.asked += 1
        return None

    def _snapshot(self, key, h):
        mm, arena = self._mm, self._arena
        for probe in range(self._mask + 1):
            at = _HEADER_BYTES + ((h + probe) & self._mask) * _SLOT_BYTES
            (seq, slot_hash, _, version, checksum, meta, name_bytes, dtype, rank, value_at,
             size) = _SLOT.unpack_from(mm, at)
            if seq & 1:
                return _TORN
            if slot_hash == 0:
                return None
            if slot_hash != h:
                continue
            dims_at = (name_bytes + 7) & ~7
            if (name_bytes > _MAX_NAME_BYTES or rank > _MAX_RANK or size > _MAX_VALUE_BYTES or
                    meta + dims_at + rank * 8 > self._arena_bytes or
                    value_at + size > self._arena_bytes):
                return _TORN
            named = mm[arena + meta:arena + meta + name_bytes] == key
            dims = struct.unpack_from(f"<{rank}q", mm, arena + meta + dims_at)
            data = mm[arena + value_at:arena + value_at + size]
            if _U64.unpack_from(mm, at)[0] != seq:
                return _TORN
            if not named:
                continue
            return (version, checksum, dtype, dims, data) if version > 0 else None
        return None
