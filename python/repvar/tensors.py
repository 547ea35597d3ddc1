# SPDX-License-Identifier: Apache-2.0
"""numpy arrays <-> repvar chunk streams, with XXH3-64 checksums."""

import numpy as np
import xxhash

from repvar.v1 import types_pb2

# repvar dtype name -> (proto enum, numpy dtype as stored on the wire)
DTYPES = {
    "float32": (types_pb2.DTYPE_FLOAT32, np.dtype("<f4")),
    "float16": (types_pb2.DTYPE_FLOAT16, np.dtype("<f2")),
    "bfloat16": (types_pb2.DTYPE_BFLOAT16, np.dtype("<u2")),  # bit patterns
    "float64": (types_pb2.DTYPE_FLOAT64, np.dtype("<f8")),
    "int32": (types_pb2.DTYPE_INT32, np.dtype("<i4")),
    "int64": (types_pb2.DTYPE_INT64, np.dtype("<i8")),
}
_BY_ENUM = {enum: (name, npd) for name, (enum, npd) in DTYPES.items()}

MAX_CHUNK_BYTES = 4 << 20
_LEN, _VARINT = 2, 0  # protobuf wire types
_U64 = (1 << 64) - 1


def checksum(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


def checksum_state():
    """The same checksum over bytes given piece by piece (update, intdigest)."""
    return xxhash.xxh3_64()


def _bytes(wire: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, any shape (zero-size and 0-d too)."""
    return memoryview(wire.reshape(-1).view(np.uint8))


class OutMismatch(ValueError):
    """The array given to take a value is not of its dtype (or uint8) and size."""


def numpy_dtype(dtype_name: str) -> np.dtype:
    if dtype_name not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype_name!r}; supported: {sorted(DTYPES)}")
    return DTYPES[dtype_name][1]


def _as_wire(array, dtype_name: str) -> np.ndarray:
    """Checks the array's dtype and returns a contiguous little-endian copy or view."""
    want = numpy_dtype(dtype_name)
    array = np.asarray(array)
    if array.dtype.newbyteorder("<") != want.newbyteorder("<") and not (
            array.dtype.kind == want.kind and array.dtype.itemsize == want.itemsize):
        raise ValueError(f"array of dtype {array.dtype} cannot hold a {dtype_name} value "
                         f"(want {want}{'; bfloat16 is given as uint16 bits' if dtype_name == 'bfloat16' else ''})")
    return np.asarray(array, dtype=want, order="C")  # keeps 0-d arrays 0-d


def header(array, dtype_name: str) -> types_pb2.TensorHeader:
    wire = _as_wire(array, dtype_name)
    h = types_pb2.TensorHeader()
    h.spec.dtype = DTYPES[dtype_name][0]
    h.spec.dims.extend(int(d) for d in wire.shape)
    h.byte_size = wire.nbytes
    h.checksum = checksum(_bytes(wire))
    return h


def _pieces(wire: np.ndarray, chunk_bytes: int):
    """An iterator of (offset, view) over `wire`'s bytes, `chunk_bytes` at a
    time; ValueError at once for a `chunk_bytes` outside (0, 4 MiB]."""
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError("chunk_bytes must be in (0, 4 MiB]")
    view = _bytes(wire)
    return ((off, view[off:off + chunk_bytes]) for off in range(0, wire.nbytes, chunk_bytes))


def to_chunks(array, dtype_name: str, chunk_bytes: int = 1 << 20):
    """Yields (header, [TensorChunk...]) pieces: first the header, then chunks."""
    wire = _as_wire(array, dtype_name)
    pieces = _pieces(wire, chunk_bytes)
    yield header(wire, dtype_name)
    for off, piece in pieces:
        yield types_pb2.TensorChunk(offset=off, data=bytes(piece), checksum=checksum(piece))


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def chunk_frame(field: int, offset: int, piece) -> bytes:
    """The bytes protobuf writes for a stream message whose field `field` is
    the TensorChunk {offset, data: piece, checksum of piece}, laid out as
    the daemons take a chunk without a copy of their own (parse_chunk_frame's
    layout). `piece` (any buffer) is copied once, into the frame; building
    the message with protobuf copied it into the message, then again into
    its serialization."""
    sum_ = checksum(piece)
    size = len(piece)
    head = (b"\x08" + _varint_bytes(offset) if offset else b"") + b"\x12" + _varint_bytes(size)
    tail = b"\x18" + _varint_bytes(sum_) if sum_ else b""
    length = len(head) + size + len(tail)
    return b"".join((bytes((field << 3 | _LEN,)), _varint_bytes(length), head, piece, tail))


def chunk_frames(wire: np.ndarray, field: int, chunk_bytes: int = 1 << 20):
    """An iterator of `wire`'s bytes (a C-contiguous array) as chunk frames
    of field `field`, `chunk_bytes` at a time, each made as it is taken.
    ValueError at once for a `chunk_bytes` outside (0, 4 MiB]."""
    return (chunk_frame(field, off, piece) for off, piece in _pieces(wire, chunk_bytes))


def header_and_frames(array, dtype_name: str, field: int, chunk_bytes: int = 1 << 20):
    """(TensorHeader, chunk_frames' iterator) of `array` as a `dtype_name`
    value: what an assign or a step's stream write sends after its own
    header. ValueError at once for a wrong dtype or `chunk_bytes`."""
    wire = _as_wire(array, dtype_name)
    return header(wire, dtype_name), chunk_frames(wire, field, chunk_bytes)


def byte_size(spec: types_pb2.TensorSpec) -> int:
    """The bytes a value of `spec` takes (a dtype this client reads)."""
    return int(np.prod(spec.dims, dtype=np.int64)) * np.dtype(_BY_ENUM[spec.dtype][1]).itemsize


def _check_fits(out: np.ndarray, npd, label: str, size: int) -> None:
    if out.dtype != np.uint8 and out.dtype != npd:
        raise OutMismatch(f"{label} values do not go into an array of {out.dtype}")
    if out.nbytes != size:
        raise OutMismatch(f"{size} bytes do not fit an array of {out.nbytes}")


def check_out(out: np.ndarray, dtype_enum: int, byte_size: int) -> None:
    """OutMismatch unless `out` can take a value of that dtype and size: an
    array of its dtype (or uint8) of exactly byte_size bytes."""
    name, npd = _BY_ENUM[dtype_enum]
    _check_fits(out, npd, name, byte_size)


def copy_into(out: np.ndarray, value: np.ndarray) -> None:
    """Copies `value`'s bytes into `out`, an array of its dtype (or uint8)
    and size; OutMismatch, `out` untouched, otherwise."""
    _check_fits(out, value.dtype, str(value.dtype), value.nbytes)
    _bytes(out)[:] = _bytes(np.ascontiguousarray(value))


def from_chunks(h: types_pb2.TensorHeader, chunks, out=None) -> np.ndarray:
    """Rebuilds an array from a header and in-order chunks (TensorChunk
    messages); verifies checksums (ValueError). With `out`, a writable
    C-contiguous array of the value's dtype (or uint8) and exactly
    h.byte_size bytes, the bytes go into it and it is returned as it is;
    OutMismatch, before any chunk is read, when it is not."""
    return assemble(h, ((c.offset, c.data, c.checksum) for c in chunks), out)


def assemble(h: types_pb2.TensorHeader, pieces, out=None) -> np.ndarray:
    """from_chunks for (offset, data, checksum) pieces, `data` any buffer
    (parse_chunk_frame's view into a message's bytes): each byte is copied
    once, into the array."""
    if h.spec.dtype not in _BY_ENUM:
        raise ValueError(f"a dtype this client does not read ({h.spec.dtype})")
    name, npd = _BY_ENUM[h.spec.dtype]
    if out is None:
        # Written once, as the chunks arrive (not zeroed first).
        out = np.empty(h.byte_size, np.uint8).view(npd).reshape(tuple(h.spec.dims))
    else:
        check_out(out, h.spec.dtype, h.byte_size)
    dest = memoryview(out.reshape(-1).view(np.uint8))
    received = 0
    state = checksum_state()
    for offset, data, sum_ in pieces:
        size = len(data)
        if offset != received or size > h.byte_size - received:
            raise ValueError(f"chunk out of order at {offset}, expected {received}")
        if checksum(data) != sum_:
            raise ValueError(f"chunk checksum mismatch at {offset}")
        dest[received:received + size] = data
        state.update(data)
        received += size
    if received != h.byte_size or state.intdigest() != h.checksum:
        raise ValueError("tensor truncated or whole-tensor checksum mismatch")
    return out


def _varint(frame, at: int):
    """(value, next position) of the varint at frame[at]; (None, at) when it
    runs past the end or over 10 bytes."""
    value = 0
    for shift in range(0, 64, 7):
        if at >= len(frame):
            return None, at
        b = frame[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _U64, at
    return None, at


def parse_chunk_frame(frame: bytes, field: int):
    """(offset, data, checksum) of a stream message (the bytes gRPC hands
    over) whose field `field` (below 16) is a TensorChunk laid out as
    protobuf writes one, as repvar's daemons send it: the field's tag and
    length, then offset (left out when 0), data, checksum (left out when 0),
    and nothing else. `data` is a memoryview into `frame`: no parse copies
    the bytes. None for anything else, well-formed or not: the caller parses
    it with protobuf, whose meaning is the reference (the C++ client's
    ReceivedChunk::Parse, common/rpc/chunk_frame.h)."""
    if not 0 < field < 16 or not frame or frame[0] != (field << 3 | _LEN):
        return None
    length, at = _varint(frame, 1)
    if length is None or length != len(frame) - at:
        return None
    offset = checksum_ = 0
    if at < len(frame) and frame[at] == (1 << 3 | _VARINT):
        offset, at = _varint(frame, at + 1)
        if offset is None:
            return None
    if at >= len(frame) or frame[at] != (2 << 3 | _LEN):
        return None
    size, at = _varint(frame, at + 1)
    if size is None or size > len(frame) - at:
        return None
    data = memoryview(frame)[at:at + size]
    at += size
    if at < len(frame):
        if frame[at] != (3 << 3 | _VARINT):
            return None
        checksum_, at = _varint(frame, at + 1)
        if checksum_ is None or at != len(frame):
            return None
    return offset, data, checksum_


def to_tensor(array, dtype_name: str) -> types_pb2.Tensor:
    wire = _as_wire(array, dtype_name)
    return types_pb2.Tensor(header=header(wire, dtype_name), data=wire.tobytes())


def from_columns(c, count: int) -> list:
    """The (writable array, version) of each of the `count` values of a
    batched read's answer by column (repvar.v1.ReadColumns), in order, each
    checked against its checksum. ValueError when the columns do not match
    `count` or each other, or a value fails its checksum."""
    for column in ("versions", "spec_index", "checksums"):
        if len(getattr(c, column)) != count:
            raise ValueError(f"read answer: {len(getattr(c, column))} {column} for {count} values")
    specs = []
    for s in c.specs:
        if s.dtype not in _BY_ENUM or any(d < 0 for d in s.dims):
            raise ValueError(f"read answer: a spec this client does not read ({s})")
        npd = _BY_ENUM[s.dtype][1]
        dims = tuple(s.dims)
        specs.append((npd, dims, npd.itemsize * int(np.prod(dims, dtype=np.int64))))
    data = memoryview(c.data)
    out, offset = [], 0
    for i in range(count):
        k = c.spec_index[i]
        if not 0 <= k < len(specs):
            raise ValueError(f"read answer: spec_index[{i}] is {k} of {len(specs)} specs")
        npd, dims, n = specs[k]
        out.append((_checked_array(data[offset:offset + n], n, c.checksums[i], npd, dims, True,
                                   f"read answer: value {i} fails its checksum"),
                    c.versions[i]))
        offset += n
    if offset != len(data):
        raise ValueError(f"read answer: {len(data) - offset} bytes of data left over")
    return out


def from_tensor(t: types_pb2.Tensor, writable: bool = False) -> np.ndarray:
    """The array a Tensor message holds, checked against its checksum: a
    read-only view of the message's bytes, or (`writable`) a copy."""
    name, npd = _BY_ENUM[t.header.spec.dtype]
    return _checked_array(t.data, t.header.byte_size, t.header.checksum, npd,
                          tuple(t.header.spec.dims), writable, "tensor fails its checksum")


def _checked_array(data, nbytes: int, want: int, npd, dims, writable: bool,
                   failure: str) -> np.ndarray:
    """The array of `npd` and `dims` that `data` holds, once it is `nbytes`
    long and sums to `want` (the sender's checksum): a read-only view of
    `data`, or (`writable`) a copy. ValueError(`failure`) otherwise."""
    if len(data) != nbytes or checksum(data) != want:
        raise ValueError(failure)
    return np.frombuffer(bytearray(data) if writable else data, dtype=npd).reshape(dims)
