// SPDX-License-Identifier: Apache-2.0
#include "worker/core/worker_agent.h"

#include <algorithm>

#include "spdlog/spdlog.h"

namespace repvar::worker {

absl::Time WorkerAgent::Tick(absl::Time now) {
  if (state_ == State::kFenced) return absl::InfiniteFuture();
  if (state_ == State::kUnregistered) {
    auto interval = link_->Register(reg_);
    if (absl::IsAborted(interval.status())) {
      spdlog::error("{}:{} incarnation {} is fenced: {}", reg_.job, reg_.task, reg_.incarnation,
                    interval.status().ToString());
      state_ = State::kFenced;
      return absl::InfiniteFuture();
    }
    if (!interval.ok()) {
      spdlog::warn("register {}:{} failed: {}; retrying in {}", reg_.job, reg_.task,
                   interval.status().ToString(), absl::FormatDuration(backoff_));
      absl::Time next = now + backoff_;
      backoff_ = std::min(backoff_ * 2, absl::Seconds(2));
      return next;
    }
    spdlog::info("registered {}:{} (incarnation {})", reg_.job, reg_.task, reg_.incarnation);
    state_ = State::kRegistered;
    interval_ = std::max(*interval, absl::Milliseconds(10));
    backoff_ = absl::Milliseconds(50);
    return now + interval_;
  }
  LocalReads::Round round;
  if (local_reads_ != nullptr) round = local_reads_->StartRound();
  auto answer = link_->Heartbeat(TaskKey{reg_.job, reg_.task}, reg_.incarnation,
                                 local_reads_ != nullptr, round.held);
  if (answer.ok() && local_reads_ != nullptr) {
    local_reads_->Granted(round, answer->read_lease, answer->confirmed);
  }
  if ((absl::IsAborted(answer.status()) || absl::IsNotFound(answer.status())) &&
      local_reads_ != nullptr) {
    local_reads_->Lost();
  }
  const absl::Status& s = answer.status();
  if (absl::IsAborted(s)) {
    spdlog::error("{}:{} incarnation {} is fenced: {}", reg_.job, reg_.task, reg_.incarnation,
                  s.ToString());
    state_ = State::kFenced;
    return absl::InfiniteFuture();
  }
  if (absl::IsNotFound(s)) {
    spdlog::warn("coordinator dropped {}:{}: {}; registering again", reg_.job, reg_.task,
                 s.ToString());
    state_ = State::kUnregistered;
    return now;
  }
  if (!s.ok()) spdlog::warn("heartbeat failed: {}", s.ToString());
  return now + interval_;
}

}  // namespace repvar::worker
