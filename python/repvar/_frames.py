# SPDX-License-Identifier: Apache-2.0
"""The wire under Client and Step: streams whose messages stay the bytes on
the wire (a tensor's chunks are copied once, into the array), and the value
such a stream carries."""

import types

from google.protobuf import message
import numpy as np

from repvar import errors, tensors


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
