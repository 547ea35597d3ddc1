// SPDX-License-Identifier: Apache-2.0
// StepScope's and LocalMapping's internals, shared by step_scope.cc and
// local_mapping.cc. Not part of the public API.
#ifndef REPVAR_CLIENT_STEP_SCOPE_IMPL_H_
#define REPVAR_CLIENT_STEP_SCOPE_IMPL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "client/client_impl.h"
#include "common/model/step.h"
#include "common/rpc/replica_stream.h"
#include "repvar/step.h"
#include "repvar/v1/worker.grpc.pb.h"

namespace repvar {

class StepScope::Impl {
 public:
  ClientAccess::Impl* client = nullptr;
  StepOptions options;
  std::string job;
  int32_t task = 0;
  int32_t me = -1;  // participant index
  StepInfo header;  // this step as BeginStep answered (its layout is in `layout`)
  std::shared_ptr<const ClientAccess::Impl::StepLayout> layout;
  ClientAccess::Impl::WorkerLink* link = nullptr;  // this host's worker
  v1::WorkerSteps::Stub* worker = nullptr;         // link's stub
  bool closed = false;
  bool map_failed = false;  // the worker's memory cannot be mapped from here

  // StepScope::Begin's phases. This trainer's host ("job:task", from
  // `given` or $REPVAR_WORKER). Errors: INVALID_ARGUMENT.
  absl::Status SetWorker(StepOptions given);
  // BeginStep on the coordinator: the step's header; its layout goes to
  // `layout` (and the client's cache). Errors: the call's.
  absl::StatusOr<StepInfo> BeginOnCoordinator(int64_t step);
  // This host's worker; sets `me`. Errors: FAILED_PRECONDITION (it sits
  // the step out), NOT_FOUND (not live).
  absl::StatusOr<std::string> WorkerAddress(Client& c);

  // Errors: FAILED_PRECONDITION (not in the step).
  absl::StatusOr<const StepVariable*> Var(const std::string& name) const;
  // The header of an in-step write of `bytes` to `var`/`replica`.
  void FillHeader(const StepVariable& var, int32_t replica, std::span<const std::byte> bytes,
                  v1::StepWriteHeader* h) const;
  void SetDeadline(grpc::ClientContext* ctx, uint64_t bytes = 0) const {
    client->SetDeadline(ctx, bytes);
  }
  // The step's view of `var`/`replica` through the worker's socket, into
  // `receiver`: one copy of each byte, from gRPC's slices into its place.
  // Errors: the call's; DATA_LOSS (a damaged stream, or a value of another
  // spec than the step's).
  absl::StatusOr<ReceivedInPlace> ReadThroughSocket(const StepVariable& var, int32_t replica,
                                                    ReplicaReceiver& receiver);
  // The step's views of `batch` (local replicas of the step's variables,
  // 64 KiB at most each) in one StepReadSmall call: `take(k, view)` gets
  // the k-th, checked against its checksum and the step's spec, its bytes
  // valid during the call. Errors: the call's; DATA_LOSS (a value that fails
  // those checks, or an answer of another count).
  struct SmallRead {
    const StepVariable* var;
    int32_t replica;
    size_t slot = 0;  // the caller's: where the value goes
  };
  struct ViewRead {
    int64_t version;
    uint64_t checksum;
    std::span<const std::byte> bytes;
  };
  absl::Status ReadSmall(const std::vector<SmallRead>& batch,
                         absl::FunctionRef<void(size_t, const ViewRead&)> take);
};

class LocalMapping::Impl {
 public:
  // Unmaps; a lease never published goes back to the worker.
  ~Impl();
  v1::WorkerSteps::Stub* worker = nullptr;
  MappingCache* mappings = nullptr;  // where `data` came from
  uint64_t lease = 0;
  std::string variable;
  int32_t replica = 0;
  bool writable = false;
  uint64_t checksum = 0;
  int64_t version = 0;
  std::byte* data = nullptr;
  size_t size = 0;
};

}  // namespace repvar

#endif  // REPVAR_CLIENT_STEP_SCOPE_IMPL_H_
