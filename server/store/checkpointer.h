// SPDX-License-Identifier: Apache-2.0
// Periodic checkpoints (--checkpoint_every_steps=N --checkpoint_keep=K):
// after at least N more steps committed, the coordinator writes the same
// consistent cut `repvarctl save` takes (Coordinator::HoldWrites: the next
// step and cross-replica writes wait while it is written) to
//
//   <dir>/step-<last committed step, 12 digits>.safetensors
//
// published complete (tmp -> fsync -> rename -> fsync dir), and removes all
// but the newest K. `repvarctl restore` reads them. A failed checkpoint is
// logged and tried again after the next step; it never fails a step.
#ifndef REPVAR_SERVER_STORE_CHECKPOINTER_H_
#define REPVAR_SERVER_STORE_CHECKPOINTER_H_

#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/coordinator.h"

namespace repvar::server {

struct CheckpointerOptions {
  std::string dir;
  int64_t every_steps = 0;  // 0: only WriteNow
  int keep = 3;             // newest kept (>= 1)
};

class Checkpointer {
 public:
  // Starts the watching thread when every_steps > 0.
  Checkpointer(Coordinator* core, CheckpointerOptions options);
  ~Checkpointer();  // stops it (a checkpoint being written finishes first)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Writes a checkpoint of the current cut and prunes old ones; returns its
  // path. Errors: DEADLINE_EXCEEDED (a step stayed open), the reads' and
  // the file system's.
  absl::StatusOr<std::string> WriteNow();

 private:
  void Run();

  Coordinator* const core_;
  const CheckpointerOptions options_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_STORE_CHECKPOINTER_H_
