// SPDX-License-Identifier: Apache-2.0
#include "server/store/checkpointer.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/base/status_util.h"
#include "common/io/checkpoint_format.h"
#include "common/io/safetensors.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

constexpr char kPrefix[] = "step-";
constexpr char kSuffix[] = ".safetensors";
// An open step is waited for at most this long before a checkpoint gives up.
constexpr absl::Duration kWaitForStep = absl::Minutes(10);

// The step a checkpoint file was taken after; nullopt for other files.
std::optional<int64_t> StepOf(const std::string& file) {
  if (!absl::StartsWith(file, kPrefix) || !absl::EndsWith(file, kSuffix)) return std::nullopt;
  int64_t step = 0;
  const size_t digits = file.size() - sizeof(kPrefix) + 1 - sizeof(kSuffix) + 1;
  if (!absl::SimpleAtoi(file.substr(sizeof(kPrefix) - 1, digits), &step)) return std::nullopt;
  return step;
}

}  // namespace

Checkpointer::Checkpointer(Coordinator* core, CheckpointerOptions options)
    : core_(core), options_(std::move(options)) {
  if (options_.every_steps > 0) thread_ = std::thread([this] { Run(); });
}

Checkpointer::~Checkpointer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Checkpointer::Run() {
  int64_t saved_after = core_->LastCommittedStep();
  int64_t seq = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    // Step events wake us when a step resolves; at most every half second
    // we look at the stop flag.
    for (const StepEvent& e : core_->WaitStepEvents(seq, absl::Now() + absl::Milliseconds(500))) {
      seq = std::max(seq, e.seq);
    }
    if (core_->LastCommittedStep() < saved_after + options_.every_steps) continue;
    auto path = WriteNow();
    if (!path.ok()) {
      spdlog::error("periodic checkpoint failed (tried again after the next step): {}",
                    path.status().ToString());
      saved_after = core_->LastCommittedStep() - options_.every_steps + 1;
      continue;
    }
    saved_after = core_->LastCommittedStep();
  }
}

absl::StatusOr<std::string> Checkpointer::WriteNow() {
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", options_.dir, ": ", ec.message()));
  REPVAR_ASSIGN_OR_RETURN(Coordinator::Cut cut, core_->TakeCut(absl::Now() + kWaitForStep));
  // Until the end of the function nothing writes: one cut.
  const int64_t step = cut.last_committed_step;
  std::vector<io::SafetensorsEntry> entries;
  std::vector<io::CheckpointVariable> described;
  for (const VariableView& v : cut.variables) {
    entries.push_back({v.def.name, v.def.tensor.dtype, v.def.tensor.dims});
    described.push_back({v.def.name, v.version, v.checksum, v.def.aggregation, v.def.replica_count,
                         v.def.trainable, v.def.allow_nonfinite, v.def.collections});
  }
  const std::string path = absl::StrFormat("%s/%s%012d%s", options_.dir, kPrefix, step, kSuffix);
  REPVAR_ASSIGN_OR_RETURN(
      auto writer,
      io::SafetensorsWriter::Create(path, std::move(entries),
                                    io::CheckpointMetadata(step, described, cut.uninitialized)));
  for (const VariableView& v : cut.variables) {
    REPVAR_ASSIGN_OR_RETURN(ReadResult read, core_->ReadInCut(v));
    REPVAR_RETURN_IF_ERROR(writer->Write(read.value->bytes.span()));
  }
  REPVAR_RETURN_IF_ERROR(writer->Commit());
  spdlog::info("checkpoint after step {}: {} variable(s), {} bytes in {}", step,
               cut.variables.size(), writer->data_bytes(), path);

  // Keep the newest `keep`.
  std::vector<std::pair<int64_t, std::filesystem::path>> files;
  for (const auto& f : std::filesystem::directory_iterator(options_.dir, ec)) {
    if (auto s = StepOf(f.path().filename().string())) files.emplace_back(*s, f.path());
  }
  std::sort(files.begin(), files.end());
  const size_t keep = static_cast<size_t>(std::max(1, options_.keep));
  for (size_t i = 0; i + keep < files.size(); ++i) {
    std::filesystem::remove(files[i].second, ec);
    if (ec)
      spdlog::warn("cannot remove old checkpoint {}: {}", files[i].second.string(), ec.message());
  }
  return path;
}

}  // namespace repvar::server
