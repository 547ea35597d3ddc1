// SPDX-License-Identifier: Apache-2.0
// Where records go before they are applied (Registry::Commit): the seam
// that issue 5's durable log (RocksDB, fsync before the answer) plugs into
// without touching any caller.
#ifndef REPVAR_SERVER_CORE_STATE_LOG_H_
#define REPVAR_SERVER_CORE_STATE_LOG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/core/record.h"

namespace repvar::server {

// Called with the registry's mutex held, in commit order. Append returning
// an error means the record was not kept: it is not applied and the caller's
// request fails with that error.
class StateLog {
 public:
  virtual ~StateLog() = default;
  virtual absl::Status Append(const Record& record) = 0;
};

// Keeps nothing: the coordinator's state lives in memory only and a restart
// forgets it (the behaviour before issue 5). Counts what it was given.
class VolatileStateLog final : public StateLog {
 public:
  absl::Status Append(const Record&) override {
    ++records_;
    return absl::OkStatus();
  }
  uint64_t records() const { return records_; }

 private:
  uint64_t records_ = 0;
};

// Keeps every record in memory, in order: for tests that replay them.
class MemoryStateLog final : public StateLog {
 public:
  absl::Status Append(const Record& record) override {
    records_.push_back(record);
    return absl::OkStatus();
  }
  const std::vector<Record>& records() const { return records_; }

 private:
  std::vector<Record> records_;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_STATE_LOG_H_
