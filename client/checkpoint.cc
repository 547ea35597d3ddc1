// SPDX-License-Identifier: Apache-2.0
// Checkpoints as safetensors files: Client::SaveCheckpoint streams the
// coordinator's consistent cut (CoordinatorAdmin.SaveCheckpoint) into a
// SafetensorsWriter, checking every value against its committed checksum;
// Client::RestoreCheckpoint maps a file, checks it all against the cluster,
// then creates what is missing and assigns every value.
#include <grpcpp/grpcpp.h>
#include <xxhash.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client_impl.h"
#include "client/convert.h"
#include "common/base/status_util.h"
#include "common/io/safetensors.h"
#include "common/rpc/chunks.h"
#include "common/rpc/grpc_status.h"
#include "common/tensor/tensor.h"
#include "repvar/client.h"

namespace repvar {
namespace {

using Json = nlohmann::json;

constexpr char kFormatKey[] = "repvar.format";
constexpr char kStepKey[] = "repvar.last_committed_step";
constexpr char kVariablesKey[] = "repvar.variables";
constexpr char kUninitializedKey[] = "repvar.uninitialized";

std::optional<Aggregation> AggregationNamed(const std::string& name) {
  for (Aggregation a : {Aggregation::kNone, Aggregation::kSum, Aggregation::kMean,
                        Aggregation::kOnlyFirstReplica}) {
    if (name == AggregationName(a)) return a;
  }
  return std::nullopt;
}

// The file's description of one variable (from "repvar.variables").
struct SavedVariable {
  int64_t version = 0;
  std::optional<uint64_t> checksum;
  int32_t replica_count = 1;
  Aggregation aggregation = Aggregation::kNone;
  bool trainable = true;
  bool allow_nonfinite = false;
  std::vector<std::string> collections;
};

absl::StatusOr<std::map<std::string, SavedVariable>> SavedVariables(
    const std::map<std::string, std::string>& metadata, const std::string& path) {
  std::map<std::string, SavedVariable> out;
  auto it = metadata.find(kVariablesKey);
  if (it == metadata.end()) return out;  // a file repvar did not write
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": metadata ", kVariablesKey, ": ", what));
  };
  Json vars = Json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (vars.is_discarded() || !vars.is_object()) return bad("not a JSON object");
  for (auto v = vars.begin(); v != vars.end(); ++v) {
    const Json& j = v.value();
    SavedVariable s;
    if (!j.is_object()) return bad(absl::StrCat(v.key(), " is not an object"));
    if (j.contains("version") && j["version"].is_number_integer()) {
      s.version = j["version"].get<int64_t>();
    }
    if (j.contains("checksum") && j["checksum"].is_string()) {
      uint64_t c = 0;
      if (!absl::SimpleHexAtoi(j["checksum"].get<std::string>(), &c)) {
        return bad(absl::StrCat(v.key(), ": checksum is not hex"));
      }
      s.checksum = c;
    }
    if (j.contains("replica_count") && j["replica_count"].is_number_integer()) {
      s.replica_count = j["replica_count"].get<int32_t>();
    }
    if (j.contains("aggregation") && j["aggregation"].is_string()) {
      auto a = AggregationNamed(j["aggregation"].get<std::string>());
      if (!a) return bad(absl::StrCat(v.key(), ": unknown aggregation"));
      s.aggregation = *a;
    }
    if (j.contains("trainable") && j["trainable"].is_boolean()) s.trainable = j["trainable"];
    if (j.contains("allow_nonfinite") && j["allow_nonfinite"].is_boolean()) {
      s.allow_nonfinite = j["allow_nonfinite"];
    }
    if (j.contains("collections") && j["collections"].is_array()) {
      for (const Json& c : j["collections"]) {
        if (c.is_string()) s.collections.push_back(c.get<std::string>());
      }
    }
    out.emplace(v.key(), std::move(s));
  }
  return out;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

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

  std::vector<io::SafetensorsEntry> entries;
  std::vector<VariableInfo> vars;
  Json described = Json::object();
  for (const v1::VariableInfo& p : manifest.variables()) {
    VariableInfo v = client_internal::VariableFromProto(p);
    entries.push_back({v.spec.name, v.spec.dtype, v.spec.shape});
    described[v.spec.name] = {{"version", v.version},
                              {"checksum", absl::StrCat(absl::Hex(v.checksum))},
                              {"aggregation", AggregationName(v.spec.aggregation)},
                              {"replica_count", v.spec.replica_count},
                              {"trainable", v.spec.trainable},
                              {"allow_nonfinite", v.spec.allow_nonfinite},
                              {"collections", v.spec.collections}};
    vars.push_back(std::move(v));
  }
  const std::map<std::string, std::string> metadata = {
      {kFormatKey, "1"},
      {kStepKey, absl::StrCat(manifest.last_committed_step())},
      {kVariablesKey, described.dump()},
      {kUninitializedKey, Json(result.uninitialized).dump()}};
  auto writer = io::SafetensorsWriter::Create(path, std::move(entries), metadata);
  if (!writer.ok()) {
    ctx.TryCancel();
    (void)stream->Finish();
    return writer.status();
  }
  const std::vector<io::SafetensorsEntry>& placed = (*writer)->entries();  // with offsets

  CheckpointProgress shown{"", 0, static_cast<int>(vars.size()), 0, (*writer)->data_bytes()};
  size_t current = 0;  // the variable whose bytes come next
  uint64_t received = 0;
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  absl::Status bad;
  // Moves past every variable whose bytes are all here (checking them).
  auto settle = [&]() {
    while (bad.ok() && current < vars.size() && received == placed[current].bytes()) {
      if (XXH3_64bits_digest(hash) != vars[current].checksum) {
        bad = absl::DataLossError(absl::StrCat("checkpoint: variable ", vars[current].spec.name,
                                               " arrived with bytes that fail its checksum"));
        return;
      }
      ++current;
      received = 0;
      XXH3_64bits_reset(hash);
      shown.variables_done = static_cast<int>(current);
      if (progress) progress(shown);
    }
  };
  settle();
  while (bad.ok() && stream->Read(&msg)) {
    const v1::TensorChunk& c = msg.chunk();
    auto piece = BytesOf(c.data());
    if (!msg.has_chunk() || current >= vars.size() || c.offset() != received ||
        piece.size() > placed[current].bytes() - received || Checksum(piece) != c.checksum()) {
      bad = absl::DataLossError(absl::StrCat("checkpoint: a chunk out of order or corrupt at ",
                                             c.offset(), " of variable #", current));
      break;
    }
    shown.variable = vars[current].spec.name;
    if (absl::Status s = (*writer)->Write(piece); !s.ok()) {
      bad = s;
      break;
    }
    XXH3_64bits_update(hash, piece.data(), piece.size());
    received += piece.size();
    shown.bytes_done += piece.size();
    if (progress && received != placed[current].bytes()) progress(shown);
    settle();
  }
  XXH3_freeState(hash);
  if (!bad.ok()) ctx.TryCancel();
  absl::Status finished = FromGrpcStatus(stream->Finish());
  if (!bad.ok()) return bad;
  if (!finished.ok()) return finished;
  if (current != vars.size()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint stream ended after ", current, " of ", vars.size(), " variables"));
  }
  REPVAR_RETURN_IF_ERROR((*writer)->Commit());
  result.variables = static_cast<int>(vars.size());
  result.bytes = (*writer)->data_bytes();
  return result;
}

absl::StatusOr<RestoreResult> Client::RestoreCheckpoint(const std::string& path,
                                                        RestoreOptions options) {
  REPVAR_ASSIGN_OR_RETURN(auto file, io::SafetensorsReader::Open(path));
  REPVAR_ASSIGN_OR_RETURN(auto saved, SavedVariables(file->metadata(), path));
  // Everything is checked before anything is written.
  std::vector<VariableSpec> to_create;
  std::vector<std::string> refused;
  uint64_t total = 0;
  for (const io::SafetensorsEntry& e : file->entries()) {
    total += e.bytes();
    auto it = saved.find(e.name);
    const SavedVariable s = it == saved.end() ? SavedVariable{} : it->second;
    if (s.checksum && Checksum(file->Data(e)) != *s.checksum) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", e.name,
                                              " does not match the checksum saved with it (the "
                                              "file is damaged at bytes ",
                                              e.begin, "..", e.end, " of its data)"));
    }
    auto existing = GetVariable(e.name);
    if (existing.ok()) {
      if (existing->spec.dtype != e.dtype || existing->spec.shape != e.shape) {
        refused.push_back(absl::StrCat(e.name, " is ", DTypeName(existing->spec.dtype),
                                       ShapeText(existing->spec.shape), " in the cluster, ",
                                       DTypeName(e.dtype), ShapeText(e.shape), " in the file"));
      }
      continue;
    }
    if (!absl::IsNotFound(existing.status())) return existing.status();
    VariableSpec spec;
    spec.name = e.name;
    spec.dtype = e.dtype;
    spec.shape = e.shape;
    spec.trainable = s.trainable;
    spec.collections = s.collections;
    spec.replica_count = options.replicas > 0 ? options.replicas : std::max(1, s.replica_count);
    spec.aggregation = s.aggregation;
    spec.allow_nonfinite = s.allow_nonfinite;
    to_create.push_back(std::move(spec));
  }
  if (!refused.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "restore of ", path, " refused, nothing was written: ", absl::StrJoin(refused, "; ")));
  }
  RestoreResult result;
  if (!to_create.empty()) {
    int32_t most = 0;
    for (const VariableSpec& s : to_create) most = std::max(most, s.replica_count);
    REPVAR_ASSIGN_OR_RETURN(Topology topo, GetTopology());
    if (static_cast<size_t>(most) > topo.accelerators.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "restore of ", path, " needs variables with ", most, " replicas; the cluster has ",
          topo.accelerators.size(), " accelerators (pass fewer replicas), nothing was written"));
    }
    REPVAR_ASSIGN_OR_RETURN(auto created, CreateVariables(std::move(to_create)));
    for (const VariableInfo& v : created) result.created += v.created;
  }
  CheckpointProgress shown{"", 0, static_cast<int>(file->entries().size()), 0, total};
  for (const io::SafetensorsEntry& e : file->entries()) {
    shown.variable = e.name;
    if (options.progress) options.progress(shown);
    auto ack = Assign(e.name, file->Data(e));
    if (!ack.ok()) {
      return absl::Status(
          ack.status().code(),
          absl::StrCat("restore: variable ", e.name, " (", shown.variables_done, " of ",
                       shown.variables_total, " restored before it): ", ack.status().message()));
    }
    ++shown.variables_done;
    shown.bytes_done += e.bytes();
    if (options.progress) options.progress(shown);
  }
  result.variables = static_cast<int>(file->entries().size());
  result.bytes = total;
  return result;
}

}  // namespace repvar
