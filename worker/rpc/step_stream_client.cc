// SPDX-License-Identifier: Apache-2.0
#include "worker/rpc/step_stream_client.h"

#include <grpcpp/grpcpp.h>

#include <deque>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace repvar::worker {

struct StepStreamClient::Waiter {
  const Stream* stream;
  bool done = false;
  absl::StatusOr<v1::StepStreamResponse> answer;
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
    {
      absl::MutexLock lock(&owner_->mu_);
      auto it = owner_->waiting_.find(incoming_.tag());
      if (it != owner_->waiting_.end()) {  // else its call gave up
        it->second->answer = std::move(incoming_);
        it->second->done = true;
        owner_->waiting_.erase(it);
      }
    }
    incoming_ = v1::StepStreamResponse();
    StartRead(&incoming_);
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

  // Fails the calls still waiting on this stream.
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&owner_->mu_);
    broken = true;
    for (auto it = owner_->waiting_.begin(); it != owner_->waiting_.end();) {
      Waiter* w = it->second;
      if (w->stream != this) {
        ++it;
        continue;
      }
      w->answer = absl::UnavailableError(
          absl::StrCat("the step stream to the coordinator ended before the answer (",
                       status.error_message().empty() ? "closed" : status.error_message(), ")"));
      w->done = true;
      owner_->waiting_.erase(it++);
    }
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

StepStreamClient::~StepStreamClient() {
  std::vector<std::shared_ptr<Stream>> stop;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (stream_ != nullptr) retired_.push_back(std::move(stream_));
    for (auto& s : retired_) {
      if (s->BreakLocked()) stop.push_back(s);
    }
  }
  for (auto& s : stop) s->Stop();
  // gRPC may still call a stream's reactions until its OnDone.
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

absl::StatusOr<v1::StepStreamResponse> StepStreamClient::Call(v1::StepStreamRequest req,
                                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Waiter w{.stream = nullptr, .answer = absl::UnknownError("not answered")};
  std::shared_ptr<Stream> s;
  const v1::StepStreamRequest* first = nullptr;
  uint64_t tag = 0;
  bool fresh = false;
  {
    absl::MutexLock lock(&mu_);
    s = LiveLocked(&fresh);
    if (s == nullptr) return absl::UnavailableError("the worker is stopping");
    w.stream = s.get();
    tag = ++next_tag_;
    req.set_tag(tag);
    waiting_.emplace(tag, &w);
    first = s->QueueLocked(std::move(req));
  }
  if (first != nullptr) s->StartWrite(first);
  if (fresh) s->Start();
  bool stop = false;
  bool answered = false;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&w.done), deadline);
    answered = w.done;
    if (!answered) {
      waiting_.erase(tag);  // nothing touches `w` any more
      stop = s->BreakLocked();
    }
  }
  if (stop) s->Stop();
  if (!answered) {
    return absl::DeadlineExceededError(
        absl::StrCat("no answer from the coordinator on the step stream within ",
                     absl::FormatDuration(timeout)));
  }
  if (!w.answer.ok()) return w.answer.status();
  if (w.answer->code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(w.answer->code()), w.answer->message());
  }
  return std::move(w.answer);
}

}  // namespace repvar::worker
