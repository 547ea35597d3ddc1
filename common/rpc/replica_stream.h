// SPDX-License-Identifier: Apache-2.0
// Receiving a replica as Worker.ReadReplica streams it (a header with the
// version, then ordered chunks), shared by the coordinator and the client.
// Header-only: it needs gRPC, which repvar_common does not link.
#ifndef REPVAR_COMMON_REPLICA_STREAM_H_
#define REPVAR_COMMON_REPLICA_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "common/base/status_util.h"
#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/grpc_status.h"
#include "repvar/v1/worker.pb.h"

namespace repvar {

struct ReceivedReplica {
  int64_t version = 0;
  Tensor value;  // checksums verified
};

// Drains `reader`; cancels the call on the first bad message.
inline absl::StatusOr<ReceivedReplica> ReceiveReplica(
    grpc::ClientContext& ctx, grpc::ClientReaderInterface<v1::ReadVariableChunk>& reader) {
  v1::ReadVariableChunk msg;
  std::optional<ChunkAssembler> assembler;
  ReceivedReplica out;
  absl::Status s;
  while (s.ok() && reader.Read(&msg)) {
    if (msg.has_header()) {
      auto spec = SpecFromProto(msg.header().spec());
      if (!spec.ok()) {
        s = spec.status();
        break;
      }
      auto a = ChunkAssembler::Start(*spec, msg.header().byte_size(), msg.header().checksum(),
                                     UINT64_MAX);
      if (!a.ok()) {
        s = a.status();
        break;
      }
      assembler.emplace(*std::move(a));
      out.version = msg.version();
    } else if (msg.has_chunk() && assembler) {
      s = AddChunk(*assembler, msg.chunk());
    } else {
      s = absl::DataLossError("replica stream: a chunk before the header");
    }
  }
  if (!s.ok()) {
    ctx.TryCancel();
    (void)reader.Finish();
    return s;
  }
  REPVAR_RETURN_IF_ERROR(FromGrpcStatus(reader.Finish()));
  if (!assembler) return absl::DataLossError("replica stream ended without a header");
  REPVAR_ASSIGN_OR_RETURN(out.value, assembler->Finish());
  return out;
}

}  // namespace repvar

#endif  // REPVAR_COMMON_REPLICA_STREAM_H_
