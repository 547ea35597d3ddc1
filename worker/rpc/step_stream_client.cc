// SPDX-License-Identifier: Apache-2.0
#include "worker/rpc/step_stream_client.h"

#include <grpcpp/grpcpp.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace repvar::worker {

struct StepStreamClient::Stream {
  grpc::ClientContext ctx;  // declared first: outlives `rw`
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepStreamRequest, v1::StepStreamResponse>> rw;
  absl::Mutex write_mu;  // one Write at a time, and Finish after the last
  std::thread reader;
  bool broken = false;       // under the client's mu_
  bool reader_done = false;  // under the client's mu_: `reader` may be joined
};

struct StepStreamClient::Waiter {
  const Stream* stream;
  bool done = false;
  absl::StatusOr<v1::StepStreamResponse> answer;
};

StepStreamClient::~StepStreamClient() {
  std::vector<std::shared_ptr<Stream>> all;
  {
    absl::MutexLock open(&open_mu_);  // no stream is being opened
    absl::MutexLock lock(&mu_);
    closing_ = true;
    all = std::move(retired_);
    if (stream_ != nullptr) all.push_back(std::move(stream_));
    for (auto& s : all) BreakLocked(*s);
  }
  for (auto& s : all) s->reader.join();  // each fails the calls left on its stream
}

int64_t StepStreamClient::streams_opened() {
  absl::MutexLock lock(&mu_);
  return opened_;
}

void StepStreamClient::BreakLocked(Stream& s) {
  if (s.broken) return;
  s.broken = true;
  s.ctx.TryCancel();  // its reader wakes and fails the calls left on it
}

absl::StatusOr<std::shared_ptr<StepStreamClient::Stream>> StepStreamClient::Live() {
  absl::MutexLock open(&open_mu_);
  std::vector<std::shared_ptr<Stream>> ended;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return absl::UnavailableError("the worker is stopping");
    if (stream_ != nullptr && !stream_->broken) return stream_;
    if (stream_ != nullptr) retired_.push_back(std::move(stream_));
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->reader_done) {
        ended.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : ended) s->reader.join();  // returning already
  // Outside mu_: opening waits for the channel to connect (or to fail).
  auto s = std::make_shared<Stream>();
  s->rw = stub_->StepStream(&s->ctx);
  absl::MutexLock lock(&mu_);
  ++opened_;
  stream_ = s;
  s->reader = std::thread([this, raw = s.get()] { ReadAnswers(raw); });
  return s;
}

void StepStreamClient::ReadAnswers(Stream* s) {
  v1::StepStreamResponse answer;
  while (s->rw->Read(&answer)) {
    absl::MutexLock lock(&mu_);
    auto it = waiting_.find(answer.tag());
    if (it == waiting_.end()) continue;  // its call gave up
    it->second->answer = std::move(answer);
    it->second->done = true;
    waiting_.erase(it);
    answer = v1::StepStreamResponse();
  }
  grpc::Status ended;
  {
    absl::MutexLock write(&s->write_mu);
    ended = s->rw->Finish();
  }
  absl::MutexLock lock(&mu_);
  s->broken = true;
  s->reader_done = true;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Waiter* w = it->second;
    if (w->stream != s) {
      ++it;
      continue;
    }
    w->answer = absl::UnavailableError(
        absl::StrCat("the step stream to the coordinator ended before the answer (",
                     ended.error_message().empty() ? "closed" : ended.error_message(), ")"));
    w->done = true;
    waiting_.erase(it++);
  }
}

absl::StatusOr<v1::StepStreamResponse> StepStreamClient::Call(v1::StepStreamRequest req,
                                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto live = Live();
  if (!live.ok()) return live.status();
  std::shared_ptr<Stream> s = *std::move(live);
  Waiter w{.stream = s.get(), .answer = absl::UnknownError("not answered")};
  uint64_t tag = 0;
  {
    absl::MutexLock lock(&mu_);
    tag = ++next_tag_;
    waiting_.emplace(tag, &w);
  }
  req.set_tag(tag);
  bool sent = false;
  {
    absl::MutexLock write(&s->write_mu);
    sent = s->rw->Write(req);
  }
  absl::MutexLock lock(&mu_);
  if (sent) mu_.AwaitWithDeadline(absl::Condition(&w.done), deadline);
  if (!w.done) {
    waiting_.erase(tag);
    BreakLocked(*s);
    if (!sent) return absl::UnavailableError("the step stream to the coordinator is down");
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
