// SPDX-License-Identifier: Apache-2.0
#include "worker/core/write_sessions.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"
#include "common/base/sync.h"

namespace repvar::worker {
namespace {

// Starts assembling the tensor `header` announces; a small tensor may come
// whole in `inline_data` (then it is added as the one chunk at 0).
absl::StatusOr<ChunkAssembler> Start(const TensorHeader& header,
                                     std::span<const std::byte> inline_data, MemoryBudget* budget) {
  REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, ChunkAssembler::Start(header, UINT64_MAX, budget));
  if (!inline_data.empty()) REPVAR_RETURN_IF_ERROR(a.Add(0, inline_data, Checksum(inline_data)));
  return a;
}

// Every field a coordinator's write carries, checked before any byte is
// taken: an id, a version and a fence of at least 1, and distinct replica
// indexes of at least 0.
absl::Status Validate(const ReplicaWrite& w) {
  if (w.variable_id == 0) return absl::InvalidArgumentError("write of variable id 0");
  if (w.version < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("write of ", w.name, " with version ", w.version, " (at least 1)"));
  }
  if (w.fence == 0) {
    return absl::InvalidArgumentError(absl::StrCat("write of ", w.name, " without a fence"));
  }
  if (w.replicas.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("write of ", w.name, " names no replica"));
  }
  // A write usually names a host's few replicas: those are compared
  // pairwise, without a sorted copy per write (a batch is thousands).
  const std::vector<int32_t>& r = w.replicas;
  bool bad = false;
  if (r.size() <= 16) {
    for (size_t i = 0; i < r.size() && !bad; ++i) {
      bad = r[i] < 0;
      for (size_t j = 0; j < i && !bad; ++j) bad = r[j] == r[i];
    }
  } else {
    std::vector<int32_t> sorted = r;
    std::sort(sorted.begin(), sorted.end());
    bad = sorted.front() < 0 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
  }
  if (bad) {
    return absl::InvalidArgumentError(
        absl::StrCat("write of ", w.name, " names a negative or repeated replica index"));
  }
  return absl::OkStatus();
}

// A coordinator's write names the worker process it is meant for.
absl::Status CheckIncarnation(uint64_t meant_for, uint64_t ours) {
  if (meant_for == ours) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("write meant for incarnation ", meant_for, "; this worker is ", ours));
}

}  // namespace

// The root's broadcast, run on a thread of `pool` from the header on: it
// sends each part of the tensor once the stream's chunks have put it in
// place (Arrived), so the workers after the root take the bytes while the
// coordinator is still sending them.
class ReplicaWriteSession::RootBroadcast final : public ArrivingBytes {
 public:
  // The collective's timeout runs from now, not from when a pool thread
  // takes it: a broadcast queued behind a stuck one gets what is left of
  // it (nothing: it fails at once), so stuck broadcasts cannot convoy.
  RootBroadcast(ThreadPool* pool, Collectives* plane, CollectiveSpec c, std::span<std::byte> bytes,
                uint64_t arrived)
      : c_(std::move(c)), deadline_(WaitClockNow() + c_.timeout), arrived_(arrived) {
    pool->Schedule([this, plane, bytes] {
      absl::Status s = Broadcast(plane, bytes);
      MutexLock lock(&mu_);
      status_ = std::move(s);
      done_ = true;
    });
  }
  ~RootBroadcast() override { (void)Join(/*abandon=*/true); }

  void Arrived(uint64_t bytes) {
    MutexLock lock(&mu_);
    arrived_ = bytes;
  }
  // Waits for the broadcast to end. `abandon`: the bytes not yet in place
  // will not come (the broadcast fails if it still needs them).
  absl::Status Join(bool abandon) {
    MutexLock lock(&mu_);
    if (abandon) abandoned_ = true;
    mu_.Await(absl::Condition(&done_));
    return status_;
  }

  absl::Status Await(size_t end) override {
    MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return abandoned_ || arrived_ >= end; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline_)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "bytes up to ", end, " did not arrive within ", absl::FormatDuration(c_.timeout)));
    }
    if (arrived_ < end) return absl::AbortedError("the write stream ended before its bytes came");
    return absl::OkStatus();
  }

 private:
  absl::Status Broadcast(Collectives* plane, std::span<std::byte> bytes) {
    CollectiveSpec c = c_;
    c.timeout = deadline_ - WaitClockNow();
    if (BugSeeded(SeededBug::kQueuedBroadcastWaitsAnotherTimeout)) c.timeout = c_.timeout;
    if (c.timeout <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("the broadcast of ", c.group, "/", c.tag,
                                                      " waited ", absl::FormatDuration(c_.timeout),
                                                      " for a data-plane thread"));
    }
    return plane->Broadcast(c, bytes, /*received=*/nullptr, /*arriving=*/this);
  }

  const CollectiveSpec c_;
  const absl::Time deadline_;
  Mutex mu_;
  uint64_t arrived_ ABSL_GUARDED_BY(mu_);
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

ReplicaWriteSession::ReplicaWriteSession(uint64_t incarnation, ReplicaStore* store,
                                         Collectives* data_plane, MemoryBudget* budget,
                                         ThreadPool* root_broadcasts)
    : incarnation_(incarnation),
      store_(store),
      data_plane_(data_plane),
      budget_(budget),
      root_broadcasts_(root_broadcasts) {
  REPVAR_CHECK_MSG(data_plane == nullptr || root_broadcasts != nullptr,
                   "a write session with a data plane needs threads for the root's broadcasts");
}

ReplicaWriteSession::~ReplicaWriteSession() = default;

absl::Status ReplicaWriteSession::OnHeader(ReplicaWriteHeader h,
                                           std::span<const std::byte> inline_data) {
  REPVAR_RETURN_IF_ERROR(FinishCurrent());
  REPVAR_RETURN_IF_ERROR(CheckIncarnation(h.incarnation, incarnation_));
  REPVAR_RETURN_IF_ERROR(Validate(h.write));
  const std::optional<CollectiveSpec>& c = h.write.collective;
  if (!c || c->rank == c->root) {
    REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, Start(h.tensor, inline_data, budget_));
    assembler_.emplace(std::move(a));
    if (c && data_plane_ != nullptr) {
      broadcast_ = std::make_unique<RootBroadcast>(root_broadcasts_, data_plane_, *c,
                                                   assembler_->bytes(), assembler_->received());
    }
  } else {
    // The bytes come from the root over the data plane; no buffer yet.
    REPVAR_ASSIGN_OR_RETURN(int64_t size, h.tensor.spec.ByteSize());
    if (static_cast<uint64_t>(size) != h.tensor.byte_size) {
      return absl::InvalidArgumentError("tensor header size does not match its spec");
    }
  }
  header_ = std::move(h);
  return absl::OkStatus();
}

absl::Status ReplicaWriteSession::OnChunk(uint64_t offset, size_t size, uint64_t checksum,
                                          absl::FunctionRef<void(std::span<std::byte>)> fill) {
  if (!assembler_) return absl::InvalidArgumentError("chunk without a header that expects one");
  REPVAR_RETURN_IF_ERROR(assembler_->Add(offset, size, checksum, fill));
  if (broadcast_ != nullptr) broadcast_->Arrived(assembler_->received());
  return absl::OkStatus();
}

absl::Status ReplicaWriteSession::FinishCurrent() {
  if (!header_) return absl::OkStatus();
  absl::StatusOr<Tensor> t;
  if (const std::optional<CollectiveSpec>& c = header_->write.collective) {
    if (data_plane_ == nullptr)
      return absl::FailedPreconditionError("this worker has no data plane");
    if (c->rank == c->root) {
      // The broadcast began at the header; it has every byte now, or never
      // will. The bytes were summed as they came (ChunkAssembler).
      t = assembler_->Finish();
      const absl::Status sent = broadcast_->Join(/*abandon=*/!t.ok());
      broadcast_.reset();
      if (!t.ok()) return t.status();
      charges_.push_back(assembler_->TakeCharge());
      REPVAR_RETURN_IF_ERROR(sent);
    } else {
      // The broadcast fills it: the whole buffer is needed before it starts.
      MemoryCharge charge(budget_);
      REPVAR_RETURN_IF_ERROR(charge.Add(header_->tensor.byte_size, "a broadcast being received"));
      t = Tensor::ForOverwrite(header_->tensor.spec);
      if (!t.ok()) return t.status();
      charges_.push_back(std::move(charge));
      ChecksumStream received;  // summed as the broadcast brings the bytes
      REPVAR_RETURN_IF_ERROR(data_plane_->Broadcast(*c, t->bytes.span(), &received, nullptr));
      t->checksum = received.Digest();
    }
    if (t->checksum != header_->tensor.checksum) {
      return absl::DataLossError(
          absl::StrCat("data plane delivered ", header_->write.name, " with a bad checksum"));
    }
  } else {
    t = assembler_->Finish();
    if (!t.ok()) return t.status();
    charges_.push_back(assembler_->TakeCharge());
  }
  ReplicaWrite item = std::move(header_->write);
  item.collective.reset();
  item.value = std::make_shared<const Tensor>(*std::move(t));
  items_.push_back(std::move(item));
  assembler_.reset();
  header_.reset();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ReplicaWriteSession::Finish() {
  REPVAR_RETURN_IF_ERROR(FinishCurrent());
  const uint64_t checksum = items_.empty() ? 0 : items_.back().value->checksum;
  absl::Status applied = store_->Apply(std::move(items_));
  items_.clear();
  charges_.clear();  // the store holds the bytes now
  REPVAR_RETURN_IF_ERROR(applied);
  return checksum;
}

absl::StatusOr<uint64_t> ApplySmallWrites(uint64_t incarnation, SmallReplicaWrites writes,
                                          ReplicaStore* store, MemoryBudget* budget) {
  REPVAR_RETURN_IF_ERROR(CheckIncarnation(writes.incarnation, incarnation));
  uint64_t bytes = 0;  // of the distinct values
  size_t distinct = 0;
  for (const SmallReplicaWrites::Item& item : writes.items) {
    REPVAR_RETURN_IF_ERROR(Validate(item.write));
    if (item.value == distinct) {
      bytes += item.bytes.size();
      ++distinct;
    }
  }
  MemoryCharge charge(budget);  // the copies, until the store holds them
  REPVAR_RETURN_IF_ERROR(charge.Add(bytes, "small replica writes being received"));
  // Each replica kept takes a few small blocks (its value, its Tensor, the
  // store's entries): one populate for all of them, not a page fault per
  // fresh page.
  constexpr size_t kHeldBytesPerReplica = 512;
  PrefaultHeap(bytes + writes.items.size() * kHeldBytesPerReplica);
  std::vector<ReplicaWrite> items;
  items.reserve(writes.items.size());
  // Writes that share a value in the message share one Tensor here too.
  std::vector<std::shared_ptr<const Tensor>> values;
  for (SmallReplicaWrites::Item& item : writes.items) {
    if (item.value == values.size()) {
      REPVAR_ASSIGN_OR_RETURN(Tensor t, Tensor::FromBytes(writes.specs[item.spec], item.bytes));
      values.push_back(std::make_shared<const Tensor>(std::move(t)));
    } else if (item.value > values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("write of ", item.write.name, ": value ",
                                                     item.value, " after ", values.size()));
    }
    const std::shared_ptr<const Tensor>& value = values[item.value];
    if (item.checksum != 0 && item.checksum != value->checksum) {
      return absl::InvalidArgumentError(
          absl::StrCat("write of ", item.write.name, ": checksum mismatch: the header says ",
                       item.checksum, ", the bytes give ", value->checksum));
    }
    item.write.value = value;
    items.push_back(std::move(item.write));
  }
  const uint64_t checksum = items.empty() ? 0 : items.back().value->checksum;
  REPVAR_RETURN_IF_ERROR(store->Apply(std::move(items)));
  return checksum;
}

absl::Status StepWriteSession::OnHeader(const StepWriteHeader& h,
                                        std::span<const std::byte> inline_data) {
  REPVAR_RETURN_IF_ERROR(FinishCurrent());
  if (first_ && (h.step != first_->step || h.epoch != first_->epoch)) {
    return absl::InvalidArgumentError("one step write stream writes one step");
  }
  if (!first_) {
    first_ = h;
    steps_->Hint(h.step, h.epoch, h.layout_id, h.barrier_timeout);
  }
  REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, Start(h.tensor, inline_data, budget_));
  assembler_.emplace(std::move(a));
  header_ = h;
  return absl::OkStatus();
}

absl::Status StepWriteSession::OnChunk(uint64_t offset, size_t size, uint64_t checksum,
                                       absl::FunctionRef<void(std::span<std::byte>)> fill) {
  if (!assembler_) return absl::InvalidArgumentError("chunk before a header");
  return assembler_->Add(offset, size, checksum, fill);
}

absl::Status StepWriteSession::FinishCurrent() {
  if (!header_) return absl::OkStatus();
  REPVAR_ASSIGN_OR_RETURN(Tensor t, assembler_->Finish());
  charges_.push_back(assembler_->TakeCharge());
  items_.push_back(StepTable::WriteItem{header_->variable_id, header_->replica,
                                        std::make_shared<const Tensor>(std::move(t))});
  header_.reset();
  assembler_.reset();
  return absl::OkStatus();
}

absl::Status StepWriteSession::Finish() {
  REPVAR_RETURN_IF_ERROR(FinishCurrent());
  if (!first_) return absl::OkStatus();
  return steps_->Write(first_->step, first_->epoch, std::move(items_));
}

}  // namespace repvar::worker
