// SPDX-License-Identifier: Apache-2.0
#include "worker/rpc/step_stream_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace repvar::worker {

namespace {

// A refusal in the answer (code != 0) is the call's status.
StepStreamClient::Answer Outcome(StepStreamClient::Answer answer) {
  if (answer.ok() && answer->code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer->code()), answer->message());
  }
  return answer;
}

}  // namespace

// The longest the deadline thread sleeps without looking at the calls.
constexpr absl::Duration kExpirerIdle = absl::Seconds(1);

struct StepStreamClient::Waiter {
  std::shared_ptr<Stream> stream;
  absl::Time deadline;
  absl::Duration timeout;
  Callback done;
};

// One stream. gRPC calls its reactions on its own threads; everything here
// is under the client's mu_ (fields marked so), and gRPC's operations
// (StartCall, StartRead, StartWrite, RemoveHold, TryCancel) are started
// with mu_ released: a reaction may run inline in the thread that starts
// an operation, and it takes mu_. The hold keeps the call open between
// writes (they start outside reactions); it is released once, when the
// stream breaks, after which gRPC finishes the call and calls OnDone, the
// last thing it does with this object.
class StepStreamClient::Stream final
    : public grpc::ClientBidiReactor<v1::StepStreamRequest, v1::StepStreamResponse> {
 public:
  explicit Stream(StepStreamClient* owner) : owner_(owner) {}

  // Binds the call and takes the hold (under mu_: nothing here runs a
  // reaction); Start() then starts it, with mu_ released. Writes queued in
  // between go out when it starts.
  void BindLocked(v1::CoordinatorWorkers::Stub* stub) {
    // A coordinator that cannot be reached yet (restarting: the channel
    // is between reconnection attempts) is waited for, up to each call's
    // deadline, rather than failing the call at once: a report that fails
    // there never reaches the restarted coordinator, whose barrier then
    // times out waiting for it.
    ctx_.set_wait_for_ready(true);
    stub->async()->StepStream(&ctx_, this);
    AddHold();
  }
  // Starts the call (returns at once; it connects in the background), and
  // stops it if it broke before it started.
  void Start() {
    StartRead(&incoming_);
    StartCall();
    bool stop = false;
    {
      absl::MutexLock lock(&owner_->mu_);
      started_ = true;
      if (broken && !stopped_) stop = stopped_ = true;
    }
    if (stop) Stop();
  }

  // Under mu_: queues `req`; returns the message to hand to StartWrite
  // (mu_ released) when no write is in flight, else null (OnWriteDone
  // sends it in turn). Null too when the stream broke.
  const v1::StepStreamRequest* QueueLocked(v1::StepStreamRequest req) {
    if (broken) return nullptr;
    outgoing_.push_back(std::move(req));
    if (writing_) return nullptr;
    writing_ = true;
    return &outgoing_.front();  // a deque keeps it where it is
  }

  // Under mu_: marks the stream broken; returns whether the caller must
  // then (mu_ released) call Stop(): once per stream, and only once it has
  // started (else Start() stops it).
  bool BreakLocked() {
    broken = true;
    if (stopped_ || !started_) return false;
    stopped_ = true;
    return true;
  }
  // Cancels the call and lets gRPC finish it (mu_ not held).
  void Stop() {
    ctx_.TryCancel();
    RemoveHold();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the call is ending
      bool stop = false;
      {
        absl::MutexLock lock(&owner_->mu_);
        stop = BreakLocked();
      }
      if (stop) Stop();
      return;
    }
    v1::StepStreamResponse answer = std::move(incoming_);
    std::unique_ptr<Waiter> w;
    {
      absl::MutexLock lock(&owner_->mu_);
      w = owner_->TakeLocked(answer.tag());  // null: its call gave up
    }
    incoming_ = v1::StepStreamResponse();
    StartRead(&incoming_);
    // The next read is posted first: the answer's callback may take a
    // while (it installs a step and answers a trainer).
    if (w != nullptr) std::move(w->done)(Outcome(std::move(answer)));
  }

  void OnWriteDone(bool ok) override {
    const v1::StepStreamRequest* next = nullptr;
    bool stop = false;
    {
      absl::MutexLock lock(&owner_->mu_);
      outgoing_.pop_front();
      if (!ok) {
        outgoing_.clear();  // the call is ending: what is queued never goes
        stop = BreakLocked();
      }
      if (outgoing_.empty()) {
        writing_ = false;
      } else {
        next = &outgoing_.front();
      }
    }
    if (next != nullptr) StartWrite(next);
    if (stop) Stop();
  }

  // Fails the calls still waiting on this stream; `done` is set last,
  // once their callbacks ran (the client's destructor waits for it).
  void OnDone(const grpc::Status& status) override {
    std::vector<std::unique_ptr<Waiter>> failed;
    {
      absl::MutexLock lock(&owner_->mu_);
      broken = true;
      std::vector<uint64_t> tags;
      for (const auto& [tag, w] : owner_->waiting_) {
        if (w->stream.get() == this) tags.push_back(tag);
      }
      for (uint64_t tag : tags) failed.push_back(owner_->TakeLocked(tag));
    }
    const absl::Status why = absl::UnavailableError(
        absl::StrCat("the step stream to the coordinator ended before the answer (",
                     status.error_message().empty() ? "closed" : status.error_message(), ")"));
    for (auto& w : failed) std::move(w->done)(why);
    absl::MutexLock lock(&owner_->mu_);
    done = true;
  }

  // Under the client's mu_:
  bool broken = false;  // no more writes; the next call opens another stream
  bool done = false;    // gRPC is done with this object (OnDone ran)

 private:
  StepStreamClient* const owner_;
  grpc::ClientContext ctx_;
  v1::StepStreamResponse incoming_;  // the read in flight
  // Under the client's mu_:
  std::deque<v1::StepStreamRequest> outgoing_;  // front: the write in flight
  bool writing_ = false;
  bool started_ = false;
  bool stopped_ = false;
};

StepStreamClient::StepStreamClient(v1::CoordinatorWorkers::Stub* stub)
    : stub_(stub), expirer_([this] { ExpireCalls(); }) {}

StepStreamClient::~StepStreamClient() {
  std::vector<std::shared_ptr<Stream>> stop;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    earlier_deadline_.Signal();
    if (stream_ != nullptr) retired_.push_back(std::move(stream_));
    for (auto& s : retired_) {
      if (s->BreakLocked()) stop.push_back(s);
    }
  }
  for (auto& s : stop) s->Stop();
  // gRPC may still call a stream's reactions until its OnDone.
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::vector<std::shared_ptr<Stream>>* all) {
          for (const auto& s : *all) {
            if (!s->done) return false;
          }
          return true;
        },
        &retired_));
  }
  expirer_.join();
}

int64_t StepStreamClient::streams_opened() {
  absl::MutexLock lock(&mu_);
  return opened_;
}

std::shared_ptr<StepStreamClient::Stream> StepStreamClient::LiveLocked(bool* fresh) {
  *fresh = false;
  if (closing_) return nullptr;
  if (stream_ != nullptr && !stream_->broken) return stream_;
  if (stream_ != nullptr) retired_.push_back(std::move(stream_));
  std::erase_if(retired_, [](const std::shared_ptr<Stream>& s) { return s->done; });
  stream_ = std::make_shared<Stream>(this);
  stream_->BindLocked(stub_);
  ++opened_;
  *fresh = true;
  return stream_;
}

std::unique_ptr<StepStreamClient::Waiter> StepStreamClient::TakeLocked(uint64_t tag) {
  auto it = waiting_.find(tag);
  if (it == waiting_.end()) return nullptr;
  std::unique_ptr<Waiter> w = std::move(it->second);
  waiting_.erase(it);
  deadlines_.erase({w->deadline, tag});
  return w;
}

StepStreamClient::Answer StepStreamClient::Call(v1::StepStreamRequest req, absl::Duration timeout) {
  absl::Notification answered;
  Answer answer = absl::UnknownError("not answered");
  CallAsync(std::move(req), timeout, [&](Answer a) {
    answer = std::move(a);
    answered.Notify();
  });
  // The deadline thread answers it in time, if the coordinator does not.
  answered.WaitForNotification();
  return answer;
}

void StepStreamClient::CallAsync(v1::StepStreamRequest req, absl::Duration timeout, Callback done) {
  auto w = std::make_unique<Waiter>();
  w->deadline = absl::Now() + timeout;
  w->timeout = timeout;
  w->done = std::move(done);
  Callback refused;  // called outside the lock
  std::shared_ptr<Stream> s;
  const v1::StepStreamRequest* first = nullptr;
  bool fresh = false;
  {
    absl::MutexLock lock(&mu_);
    s = LiveLocked(&fresh);
    if (s == nullptr) {
      refused = std::move(w->done);
    } else {
      w->stream = s;
      const uint64_t tag = ++next_tag_;
      req.set_tag(tag);
      // The deadline thread is woken only when it would sleep past this
      // deadline (rarely: a call's deadline is seconds away).
      if (w->deadline < expirer_wakes_) earlier_deadline_.Signal();
      deadlines_.emplace(w->deadline, tag);
      waiting_.emplace(tag, std::move(w));
      first = s->QueueLocked(std::move(req));
    }
  }
  if (refused) {
    std::move(refused)(absl::UnavailableError("the worker is stopping"));
    return;
  }
  if (first != nullptr) s->StartWrite(first);
  if (fresh) s->Start();
}

void StepStreamClient::ExpireCalls() {
  mu_.Lock();
  while (!closing_) {
    const absl::Time now = absl::Now();
    if (deadlines_.empty() || now < deadlines_.begin()->first) {
      // Idle, it looks again within a second rather than never, so that
      // a call made meanwhile need not wake it.
      expirer_wakes_ = std::min(now + kExpirerIdle, deadlines_.empty() ? absl::InfiniteFuture()
                                                                       : deadlines_.begin()->first);
      earlier_deadline_.WaitWithDeadline(&mu_, expirer_wakes_);
      continue;
    }
    std::unique_ptr<Waiter> w = TakeLocked(deadlines_.begin()->second);
    const bool stop = w->stream->BreakLocked();
    mu_.Unlock();
    if (stop) w->stream->Stop();
    std::move(w->done)(absl::DeadlineExceededError(
        absl::StrCat("no answer from the coordinator on the step stream within ",
                     absl::FormatDuration(w->timeout))));
    w.reset();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace repvar::worker
