// SPDX-License-Identifier: Apache-2.0
// The coordinator's records and checkpoint rows <-> their form on disk
// (proto/repvar/disk/state.proto). Tensors inside them go through a
// TensorFiles (the blob store): inline when small, else a file written and
// synced before the record that names it.
//
// Decoding checks what it reads (enum ranges, tensor specs, sizes) and
// answers DATA_LOSS naming the field, never a half-filled value.
#ifndef REPVAR_SERVER_STORE_STATE_CODEC_H_
#define REPVAR_SERVER_STORE_STATE_CODEC_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"
#include "repvar/disk/state.pb.h"
#include "server/core/cluster_state.h"
#include "server/core/record.h"

namespace repvar::server {

// Where the tensors of records live.
class TensorFiles {
 public:
  virtual ~TensorFiles() = default;
  // Fills `ref` for `t`: its bytes inline, or the name of a blob file that
  // is on disk and synced when this returns. Errors: RESOURCE_EXHAUSTED (no
  // space), INTERNAL (I/O).
  virtual absl::Status Keep(const Tensor& t, disk::TensorRef* ref) = 0;
  // The tensor `ref` names, its bytes checked against the checksums.
  // Errors: DATA_LOSS naming the file and offset of what does not match.
  virtual absl::StatusOr<std::shared_ptr<const Tensor>> Load(const disk::TensorRef& ref) = 0;
};

// Hands out one shared copy of each distinct placement list it is given, so
// that the variables recovered from disk share their placements as the ones
// created together do. Not thread-safe.
class PlacementInterner {
 public:
  Placements Intern(std::vector<Placement> list);

 private:
  std::vector<Placements> distinct_;
};

absl::Status EncodeRecord(const Record& record, TensorFiles& files, disk::Record* out);
absl::StatusOr<Record> DecodeRecord(const disk::Record& in, TensorFiles& files);

// Checkpoint rows: one per variable, worker and recorded answer, plus the
// counters.
absl::Status EncodeVariable(const VariableRecord& v, TensorFiles& files, disk::VariableRecord* out);
// `interner` (may be null) shares the placements of the variables it decodes.
absl::StatusOr<VariableRecord> DecodeVariable(const disk::VariableRecord& in, TensorFiles& files,
                                              PlacementInterner* interner = nullptr);
void EncodeStepCommitted(const StepCommitted& c, disk::StepCommitted* out);
StepCommitted DecodeStepCommitted(const disk::StepCommitted& in);
void EncodeWorker(const WorkerRecord& w, disk::WorkerRecord* out);
absl::StatusOr<WorkerRecord> DecodeWorker(const disk::WorkerRecord& in);
void EncodeOutcome(const std::string& id, const StoredOutcome& o, disk::RequestRecorded* out);
absl::StatusOr<std::pair<std::string, StoredOutcome>> DecodeOutcome(
    const disk::RequestRecorded& in);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_STORE_STATE_CODEC_H_
