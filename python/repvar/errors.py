# SPDX-License-Identifier: Apache-2.0
"""What a failed repvar call raises: a repvar.Error subclass per gRPC status
code, with `.code` (a grpc.StatusCode) and `.message` (the server's text).
The table is docs/python.md's. `StepFailed` is a step that resolved as
FAILED (its `.resolution` says why), whatever its code."""

from typing import Dict, Optional, Type

import grpc


class Error(Exception):
    """A repvar call failed. `code`: the grpc.StatusCode; `message`: why."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(f"{(code or self.code).name}: {message}")
        if code is not None:
            self.code = code
        self.message = message


class Cancelled(Error):
    code = grpc.StatusCode.CANCELLED


class Unknown(Error):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(Error):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(Error):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(Error):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(Error):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(Error):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(Error):
    code = grpc.StatusCode.ABORTED


class OutOfRange(Error):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(Error):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(Error):
    code = grpc.StatusCode.INTERNAL


class Unavailable(Error):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(Error):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(Error):
    code = grpc.StatusCode.UNAUTHENTICATED


class StepFailed(Error):
    """A replicated step resolved as FAILED (for every trainer alike):
    `.code` and `.message` are the resolution's, `.resolution` all of it."""

    def __init__(self, code: grpc.StatusCode, message: str, resolution=None):
        super().__init__(message, code)
        self.resolution = resolution


_BY_CODE: Dict[grpc.StatusCode, Type[Error]] = {
    cls.code: cls for cls in (
        Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)}


def error_for(code: grpc.StatusCode, message: str) -> Error:
    """The Error subclass for `code`, carrying `message`."""
    return _BY_CODE.get(code, Unknown)(message, code)


def from_rpc_error(e: grpc.RpcError) -> Error:
    """The repvar.Error for a failed gRPC call."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return error_for(code or grpc.StatusCode.UNKNOWN, details or "")


class _Responses:
    """A response stream whose failure raises repvar.Error."""

    def __init__(self, call):
        self._call = call

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._call)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def cancel(self):
        return self._call.cancel()


class Stub:
    """A generated stub whose calls raise repvar.Error instead of
    grpc.RpcError (response streams too)."""

    def __init__(self, stub):
        self._stub = stub

    def __getattr__(self, name):
        method = getattr(self._stub, name)

        def call(*args, **kwargs):
            try:
                result = method(*args, **kwargs)
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None
            if isinstance(result, grpc.Call) and hasattr(result, "__next__"):
                return _Responses(result)
            return result

        call.__name__ = name
        call.__doc__ = getattr(method, "__doc__", None)
        return call
