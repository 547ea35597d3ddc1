// SPDX-License-Identifier: Apache-2.0
// Checkpoints as safetensors files: Client::SaveCheckpoint streams the
// coordinator's consistent cut (CoordinatorAdmin.SaveCheckpoint) into a
// SafetensorsWriter, checking every value against its committed checksum;
// Client::RestoreCheckpoint maps a file, checks it all against the cluster,
// then creates what is missing and assigns every value.
#include <grpcpp/grpcpp.h>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client_impl.h"
#include "client/convert.h"
#include "common/base/status_util.h"
#include "common/io/checkpoint_format.h"
#include "common/io/safetensors.h"
#include "common/rpc/chunks.h"
#include "common/rpc/grpc_status.h"
#include "common/tensor/element_math.h"
#include "common/tensor/tensor.h"
#include "repvar/client.h"

namespace repvar {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// The variables a checkpoint's manifest lists, as the file's entries and as
// its metadata describes them.
struct ManifestVariables {
  std::vector<VariableInfo> vars;
  std::vector<io::SafetensorsEntry> entries;
  std::vector<io::CheckpointVariable> described;
};

ManifestVariables VariablesOf(const v1::CheckpointManifest& manifest) {
  ManifestVariables m;
  for (const v1::VariableInfo& p : manifest.variables()) {
    VariableInfo v = client_internal::VariableFromProto(p);
    m.entries.push_back({v.spec.name, v.spec.dtype, v.spec.shape});
    m.described.push_back({v.spec.name, v.version, v.checksum, v.spec.aggregation,
                           v.spec.replica_count, v.spec.trainable, v.spec.allow_nonfinite,
                           v.spec.collections});
    m.vars.push_back(std::move(v));
  }
  return m;
}

// The variables' bytes as the stream brings them, into the file: each
// chunk checked for its place and checksum, each variable for its
// committed checksum once all of its bytes are in.
class CheckpointReceiver {
 public:
  CheckpointReceiver(const std::vector<VariableInfo>& vars, io::SafetensorsWriter* writer,
                     const CheckpointProgressFn& progress)
      : vars_(vars),
        placed_(writer->entries()),
        writer_(writer),
        progress_(progress),
        shown_{"", 0, static_cast<int>(vars.size()), 0, writer->data_bytes()} {}

  // Before the first chunk: moves past the variables of no bytes.
  absl::Status Start() { return Settle(); }

  // Errors: DATA_LOSS (out of order, corrupt, or a variable failing its
  // checksum), the file system's.
  absl::Status Take(const v1::SaveCheckpointResponse& msg) {
    const v1::TensorChunk& c = msg.chunk();
    auto piece = BytesOf(c.data());
    if (!msg.has_chunk() || current_ >= vars_.size() || c.offset() != received_ ||
        piece.size() > placed_[current_].bytes() - received_ || Checksum(piece) != c.checksum()) {
      return absl::DataLossError(absl::StrCat("checkpoint: a chunk out of order or corrupt at ",
                                              c.offset(), " of variable #", current_));
    }
    shown_.variable = vars_[current_].spec.name;
    REPVAR_RETURN_IF_ERROR(writer_->Write(piece));
    hash_.Update(piece);
    received_ += piece.size();
    shown_.bytes_done += piece.size();
    if (progress_ && received_ != placed_[current_].bytes()) progress_(shown_);
    return Settle();
  }
  // Errors: DATA_LOSS when a variable's bytes did not all come.
  absl::Status Done() const {
    if (current_ == vars_.size()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("checkpoint stream ended after ", current_, " of ",
                                            vars_.size(), " variables"));
  }

 private:
  // Moves past every variable whose bytes are all here, checking them.
  absl::Status Settle() {
    while (current_ < vars_.size() && received_ == placed_[current_].bytes()) {
      if (hash_.Digest() != vars_[current_].checksum) {
        return absl::DataLossError(absl::StrCat("checkpoint: variable ", vars_[current_].spec.name,
                                                " arrived with bytes that fail its checksum"));
      }
      ++current_;
      received_ = 0;
      hash_.Reset();
      shown_.variables_done = static_cast<int>(current_);
      if (progress_) progress_(shown_);
    }
    return absl::OkStatus();
  }

  const std::vector<VariableInfo>& vars_;
  const std::vector<io::SafetensorsEntry>& placed_;  // with offsets
  io::SafetensorsWriter* const writer_;
  const CheckpointProgressFn& progress_;
  CheckpointProgress shown_;
  size_t current_ = 0;  // the variable whose bytes come next
  uint64_t received_ = 0;
  ChecksumStream hash_;
};

}  // namespace

absl::StatusOr<SaveResult> Client::SaveCheckpoint(const std::string& path,
                                                  CheckpointProgressFn progress) {
  grpc::ClientContext ctx;
  // The stream lasts as long as the model takes to move; the coordinator
  // bounds its wait for an open step itself.
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Hours(24)));
  v1::SaveCheckpointRequest req;
  req.set_chunk_bytes(static_cast<int64_t>(impl_->options().chunk_bytes));
  auto stream = impl_->admin()->SaveCheckpoint(&ctx, req);
  v1::SaveCheckpointResponse msg;
  if (!stream->Read(&msg) || !msg.has_manifest()) {
    absl::Status s = FromGrpcStatus(stream->Finish());
    return s.ok() ? absl::DataLossError("checkpoint stream ended before its manifest") : s;
  }
  const v1::CheckpointManifest manifest = msg.manifest();
  SaveResult result;
  result.last_committed_step = manifest.last_committed_step();
  result.uninitialized.assign(manifest.uninitialized().begin(), manifest.uninitialized().end());
  ManifestVariables m = VariablesOf(manifest);
  auto writer = io::SafetensorsWriter::Create(
      path, std::move(m.entries),
      io::CheckpointMetadata(manifest.last_committed_step(), m.described, result.uninitialized));
  if (!writer.ok()) {
    ctx.TryCancel();
    (void)stream->Finish();
    return writer.status();
  }
  CheckpointReceiver receiver(m.vars, writer->get(), progress);
  absl::Status taken = receiver.Start();
  while (taken.ok() && stream->Read(&msg)) taken = receiver.Take(msg);
  if (!taken.ok()) ctx.TryCancel();
  absl::Status finished = FromGrpcStatus(stream->Finish());
  REPVAR_RETURN_IF_ERROR(taken);
  REPVAR_RETURN_IF_ERROR(finished);
  REPVAR_RETURN_IF_ERROR(receiver.Done());
  REPVAR_RETURN_IF_ERROR((*writer)->Commit());
  result.variables = static_cast<int>(m.vars.size());
  result.bytes = (*writer)->data_bytes();
  return result;
}

namespace {

// A restore's first phase: every entry checked against its saved checksum
// and against the cluster, nothing written. Refusals are collected, not
// returned at the first, so one attempt names them all.
struct RestorePlan {
  std::vector<VariableSpec> to_create;
  std::vector<std::string> refused;
  uint64_t total_bytes = 0;
};

absl::StatusOr<RestorePlan> CheckAgainstCluster(Client& client, const std::string& path,
                                                const io::SafetensorsReader& file,
                                                const RestoreOptions& options) {
  auto saved = io::CheckpointVariables(file.metadata());
  if (!saved.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", saved.status().message()));
  }
  RestorePlan plan;
  for (const io::SafetensorsEntry& e : file.entries()) {
    plan.total_bytes += e.bytes();
    auto it = saved->find(e.name);
    const io::CheckpointVariable s = it == saved->end() ? io::CheckpointVariable{} : it->second;
    if (s.checksum && Checksum(file.Data(e)) != *s.checksum) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", e.name,
                                              " does not match the checksum saved with it (the "
                                              "file is damaged at bytes ",
                                              e.begin, "..", e.end, " of its data)"));
    }
    auto existing = client.GetVariable(e.name);
    if (!existing.ok() && !absl::IsNotFound(existing.status())) return existing.status();
    const bool allow_nonfinite = existing.ok() ? existing->spec.allow_nonfinite : s.allow_nonfinite;
    if (int64_t bad = FirstNonFinite(e.dtype, file.Data(e)); bad >= 0 && !allow_nonfinite) {
      plan.refused.push_back(absl::StrCat(e.name, " holds a non-finite value at element ", bad,
                                          " and does not allow them"));
    }
    if (existing.ok()) {
      if (existing->spec.dtype != e.dtype || existing->spec.shape != e.shape) {
        plan.refused.push_back(absl::StrCat(
            e.name, " is ", DTypeName(existing->spec.dtype), ShapeText(existing->spec.shape),
            " in the cluster, ", DTypeName(e.dtype), ShapeText(e.shape), " in the file"));
      }
      continue;
    }
    plan.to_create.push_back(VariableSpec{
        .name = e.name,
        .dtype = e.dtype,
        .shape = e.shape,
        .trainable = s.trainable,
        .collections = s.collections,
        .replica_count = options.replicas > 0 ? options.replicas : std::max(1, s.replica_count),
        .aggregation = s.aggregation,
        .allow_nonfinite = s.allow_nonfinite});
  }
  return plan;
}

// The second phase: the variables the cluster lacks, created in one call.
// Returns how many were created (a retried restore finds them made).
absl::StatusOr<int> CreateMissing(Client& client, const std::string& path,
                                  std::vector<VariableSpec> to_create) {
  if (to_create.empty()) return 0;
  int32_t most = 0;
  for (const VariableSpec& s : to_create) most = std::max(most, s.replica_count);
  REPVAR_ASSIGN_OR_RETURN(Topology topo, client.GetTopology());
  if (static_cast<size_t>(most) > topo.accelerators.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "restore of ", path, " needs variables with ", most, " replicas; the cluster has ",
        topo.accelerators.size(), " accelerators (pass fewer replicas), nothing was written"));
  }
  REPVAR_ASSIGN_OR_RETURN(auto created, client.CreateVariables(std::move(to_create)));
  int count = 0;
  for (const VariableInfo& v : created) count += v.created;
  return count;
}

// The last phase: every value assigned from the mapped file, progress
// reported before and after each.
absl::Status AssignAll(Client& client, const io::SafetensorsReader& file, uint64_t total_bytes,
                       const CheckpointProgressFn& progress) {
  CheckpointProgress shown{"", 0, static_cast<int>(file.entries().size()), 0, total_bytes};
  for (const io::SafetensorsEntry& e : file.entries()) {
    shown.variable = e.name;
    if (progress) progress(shown);
    auto ack = client.Assign(e.name, file.Data(e));
    if (!ack.ok()) {
      return absl::Status(
          ack.status().code(),
          absl::StrCat("restore: variable ", e.name, " (", shown.variables_done, " of ",
                       shown.variables_total, " restored before it): ", ack.status().message()));
    }
    ++shown.variables_done;
    shown.bytes_done += e.bytes();
    if (progress) progress(shown);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestoreResult> Client::RestoreCheckpoint(const std::string& path,
                                                        RestoreOptions options) {
  REPVAR_ASSIGN_OR_RETURN(auto file, io::SafetensorsReader::Open(path));
  REPVAR_ASSIGN_OR_RETURN(RestorePlan plan, CheckAgainstCluster(*this, path, *file, options));
  if (!plan.refused.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "restore of ", path, " refused, nothing was written: ", absl::StrJoin(plan.refused, "; ")));
  }
  RestoreResult result;
  REPVAR_ASSIGN_OR_RETURN(result.created, CreateMissing(*this, path, std::move(plan.to_create)));
  REPVAR_RETURN_IF_ERROR(AssignAll(*this, *file, plan.total_bytes, options.progress));
  result.variables = static_cast<int>(file->entries().size());
  result.bytes = plan.total_bytes;
  return result;
}

}  // namespace repvar
