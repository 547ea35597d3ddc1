# SPDX-License-Identifier: Apache-2.0
"""Thin numpy helper over the generated repvar v1 gRPC stubs.

    import repvar
    c = repvar.connect()                      # $REPVAR_COORDINATOR_ADDRESS
    c.wait_for_topology(30)
    with repvar.replicated_scope(6, "model"):
        c.create("w", "float32", (4, 3), initializer=repvar.zeros())
    c.initialize(["model/w"])
    c.assign("model/w", np.ones((4, 3), np.float32))
    new = c.assign_add("model/w", np.ones((4, 3), np.float32)).value  # as the seed
    value, version = c.read("model/w")
    with c.step(1, worker="tpu_worker:0") as s:   # a replicated step
        for r in s.local_replicas("model/w"):
            s.write("model/w", r, s.read("model/w", r) * 0.5)
        resolution = s.commit()

A failed call raises a repvar.Error subclass (NotFound, AlreadyExists,
Unavailable, ..., StepFailed) with .code (a grpc.StatusCode) and .message.
bfloat16 travels as uint16 bit patterns (numpy 1.24 has no bfloat16).
"""

from repvar.tensors import (DTYPES, checksum, from_chunks, to_chunks, to_tensor,
                            from_tensor, numpy_dtype)
from repvar.errors import (Error, Cancelled, Unknown, InvalidArgument, DeadlineExceeded,
                           NotFound, AlreadyExists, PermissionDenied, ResourceExhausted,
                           FailedPrecondition, Aborted, OutOfRange, Unimplemented, Internal,
                           Unavailable, DataLoss, Unauthenticated, StepFailed)
from repvar.client import (Client, WriteAck, connect, replicated_scope, zeros, ones, constant,
                           random_normal, random_uniform, value)
from repvar.step import Step

__all__ = [
    "DTYPES", "checksum", "from_chunks", "to_chunks", "to_tensor", "from_tensor",
    "numpy_dtype", "Client", "replicated_scope", "zeros", "ones", "constant",
    "random_normal", "random_uniform", "value", "Step", "WriteAck", "StepFailed", "connect", "Error",
    "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
    "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
    "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
]
