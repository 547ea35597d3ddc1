// SPDX-License-Identifier: Apache-2.0
// The step path's messages on bare gRPC, with no repvar logic behind them:
// the floor under `steps_per_s_32x1000` and `steps_vs_grpc_floor` on this
// machine.
//
// The same processes and the same messages as repvar's step (docs/
// architecture.md, "A step"), each answered at once: a coordinator process
// (BeginStep answered with the step; one StepStream per worker, a barrier
// that answers every worker once all have sent the same step's message),
// `workers` worker processes (CommitStep reports on the worker's stream and
// answers the trainer when the step is resolved), and in this process one
// trainer thread per worker (the harness of repvar_bench, bench/harness.h):
// every trainer begins, then every trainer commits, as repvar_bench times a
// step. Both servers are on gRPC's callback API, as repvar's are.
//
// With `changed` = 0 (the report path): a report (the step, the worker, a
// digest) answered by a plan that carries the short resolution. With
// `changed` = N, every one of N variables changing on every worker: each
// trainer first writes its N replicas (one StepWriteSmall, 64 bytes each);
// the report carries the changed range, a digest and the worker's share of
// the checksums (N / workers); the plan one ALLREDUCE collective over the
// range; the worker finishes (the held range, a digest, its share); the
// barrier answers the short resolution; the trainer gets the changed
// variables one by one (name, version, checksum), as repvar's do. What the
// floor leaves out is the data plane: the reduction itself.
//
//   grpc_step_floor [workers] [steps] [changed]
//   prints: grpc_step_floor workers=32 changed=0 steps=... steps_per_s=...
//   coordinator_cpu_ms_per_step=...
//
// The children are this binary run again (`coordinator PORTFILE WORKERS
// CHANGED`, `worker COORDINATOR PORTFILE TASK WORKERS CHANGED`); they stop
// when their stdin closes.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using StreamReq = repvar::v1::StepStreamRequest;
using StreamResp = repvar::v1::StepStreamResponse;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "grpc_step_floor: %s\n", what.c_str());
  std::exit(1);
}

std::unique_ptr<grpc::Server> Serve(const std::vector<grpc::Service*>& services,
                                    const std::string& port_file) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* s : services) b.RegisterService(s);
  auto server = b.BuildAndStart();
  if (server == nullptr || port == 0) Die("cannot serve");
  std::ofstream(port_file + ".tmp") << port << "\n";
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  return server;
}

// Until this process's stdin closes (the driver exits or closes it).
void WaitForStdinEof() {
  char c;
  ssize_t n;
  do {
    n = read(0, &c, 1);
  } while (n > 0 || (n < 0 && errno == EINTR));
}

// A stream's writes, one in flight at a time. gRPC's operations are started
// by the caller with the queue's lock released: a reaction may run inline.
template <typename Msg>
class WriteQueue {
 public:
  // Queues `m`; returns it to start now, or null while another is in flight.
  const Msg* Push(Msg m) {
    std::lock_guard<std::mutex> lock(mu_);
    out_.push_back(std::move(m));
    return out_.size() == 1 ? &out_.front() : nullptr;  // a deque keeps it in place
  }
  // After the write in flight: the next one to start, or null.
  const Msg* Pop(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    return ok && !out_.empty() ? &out_.front() : nullptr;
  }

 private:
  std::mutex mu_;
  std::deque<Msg> out_;  // front: the write in flight
};

// ---- the messages ----

using repvar::v1::StepCollective;

// What every step's messages share: `changed` variables among `workers`.
struct Shape {
  int workers = 1;
  int changed = 0;
};

// The checksums worker `task` reports: its share of the changed variables.
void AddShare(const Shape& shape, int task,
              google::protobuf::RepeatedPtrField<repvar::v1::VariableChecksum>* shard) {
  for (int i = task; i < shape.changed; i += shape.workers) {
    auto* c = shard->Add();
    c->set_variable_id(static_cast<uint64_t>(i) + 1);
    c->set_checksum(0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(i + 1));
  }
}

// What a report and a finish both carry: the step, the worker, a digest
// and the worker's share of the checksums.
template <typename Msg>
void FillWorkerMessage(const Shape& shape, int task, int64_t step, Msg* m) {
  m->set_step(step);
  m->set_epoch(static_cast<uint64_t>(step));
  m->set_job("tpu_worker");
  m->set_task(task);
  m->set_incarnation(0x1234567890abcdefULL + static_cast<uint64_t>(task));
  m->set_digest(0x5bd1e995ULL * static_cast<uint64_t>(step));
  AddShare(shape, task, m->mutable_shard());
}

StreamReq Report(const Shape& shape, int task, int64_t step) {
  StreamReq r;
  auto* report = r.mutable_report();
  FillWorkerMessage(shape, task, step, report);
  if (shape.changed > 0) {
    report->add_changed_ranges(0);
    report->add_changed_ranges(static_cast<uint32_t>(shape.changed));
  }
  return r;
}

StreamReq Finish(const Shape& shape, int task, int64_t step) {
  StreamReq r;
  auto* finish = r.mutable_finish();
  FillWorkerMessage(shape, task, step, finish);
  finish->add_held_ranges(0);
  finish->add_held_ranges(static_cast<uint32_t>(shape.changed));
  return r;
}

void ShortResolution(const Shape& shape, int64_t step, repvar::v1::StepResolution* res) {
  res->set_step(step);
  res->set_epoch(static_cast<uint64_t>(step));
  res->set_state(repvar::v1::STEP_STATE_COMMITTED);
  res->set_layout_id(7);
  res->set_short_form(true);
  if (shape.changed > 0) {
    res->add_changed_ranges(0);
    res->add_changed_ranges(static_cast<uint32_t>(shape.changed));
    res->set_changed_digest(0x5bd1e995ULL * static_cast<uint64_t>(step));
  }
}

// The answer to a report: the plan, or (nothing changed) the resolution.
StreamResp Plan(const Shape& shape, uint64_t tag, int64_t step) {
  StreamResp r;
  r.set_tag(tag);
  auto* plan = r.mutable_plan();
  plan->set_step(step);
  plan->set_epoch(static_cast<uint64_t>(step));
  if (shape.changed == 0) {
    ShortResolution(shape, step, plan->mutable_resolution());
    return r;
  }
  plan->set_group("g1700000000-3");
  plan->set_timeout_ms(60000);
  StepCollective* c = plan->add_collectives();
  c->set_kind(StepCollective::ALLREDUCE);
  c->set_tag(1);
  c->add_variable_ranges(0);
  c->add_variable_ranges(static_cast<uint32_t>(shape.changed));
  plan->add_changed_ranges(0);
  plan->add_changed_ranges(static_cast<uint32_t>(shape.changed));
  return r;
}

StreamResp Resolution(const Shape& shape, uint64_t tag, int64_t step) {
  StreamResp r;
  r.set_tag(tag);
  ShortResolution(shape, step, r.mutable_resolution());
  return r;
}

// ---- coordinator ----

class Barrier;

class CoordinatorStream final : public grpc::ServerBidiReactor<StreamReq, StreamResp> {
 public:
  explicit CoordinatorStream(Barrier* barrier) : barrier_(barrier) { StartRead(&in_); }
  void OnReadDone(bool ok) override;
  void Answer(StreamResp r) {
    if (const StreamResp* first = out_.Push(std::move(r))) StartWrite(first);
  }
  void OnWriteDone(bool ok) override {
    if (const StreamResp* next = out_.Pop(ok)) StartWrite(next);
  }
  void OnDone() override { delete this; }

 private:
  Barrier* const barrier_;
  StreamReq in_;
  WriteQueue<StreamResp> out_;
};

// Answers every worker's report (or finish) of a step once all have sent it.
class Barrier {
 public:
  explicit Barrier(Shape shape) : shape_(shape) {}
  void Arrived(CoordinatorStream* from, uint64_t tag, int64_t step, bool finish) {
    std::vector<std::pair<CoordinatorStream*, uint64_t>> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& waiting = steps_[{step, finish}];
      waiting.emplace_back(from, tag);
      if (static_cast<int>(waiting.size()) < shape_.workers) return;
      ready.swap(waiting);
      steps_.erase({step, finish});
    }
    for (auto& [stream, t] : ready) {
      stream->Answer(finish ? Resolution(shape_, t, step) : Plan(shape_, t, step));
    }
  }

 private:
  const Shape shape_;
  std::mutex mu_;
  std::map<std::pair<int64_t, bool>, std::vector<std::pair<CoordinatorStream*, uint64_t>>> steps_;
};

void CoordinatorStream::OnReadDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status::OK);
    return;
  }
  const uint64_t tag = in_.tag();
  const bool finish = in_.has_finish();
  const int64_t step = finish ? in_.finish().step() : in_.report().step();
  StartRead(&in_);
  barrier_->Arrived(this, tag, step, finish);
}

class FloorTrainers final : public repvar::v1::CoordinatorTrainers::CallbackService {
 public:
  grpc::ServerUnaryReactor* BeginStep(grpc::CallbackServerContext* ctx,
                                      const repvar::v1::BeginStepRequest* req,
                                      repvar::v1::StepInfo* resp) override {
    resp->set_step(req->step());
    resp->set_epoch(static_cast<uint64_t>(req->step()));
    resp->set_layout_id(7);
    resp->set_layout_omitted(true);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

class FloorWorkers final : public repvar::v1::CoordinatorWorkers::CallbackService {
 public:
  explicit FloorWorkers(Barrier* barrier) : barrier_(barrier) {}
  grpc::ServerBidiReactor<StreamReq, StreamResp>* StepStream(
      grpc::CallbackServerContext*) override {
    return new CoordinatorStream(barrier_);
  }

 private:
  Barrier* const barrier_;
};

int RunCoordinator(const std::string& port_file, Shape shape) {
  Barrier barrier(shape);
  FloorTrainers trainers;
  FloorWorkers streams(&barrier);
  auto server = Serve({&trainers, &streams}, port_file);
  WaitForStdinEof();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

// ---- worker ----

// The worker's stream to the coordinator: calls out, answers back by tag.
class WorkerStream final : public grpc::ClientBidiReactor<StreamReq, StreamResp> {
 public:
  using Done = std::function<void(const StreamResp&)>;
  explicit WorkerStream(repvar::v1::CoordinatorWorkers::Stub* stub) {
    stub->async()->StepStream(&ctx_, this);
    StartRead(&in_);
    AddHold();
    StartCall();
  }
  void Send(StreamReq r, Done done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      r.set_tag(++next_tag_);
      waiting_[next_tag_] = std::move(done);
    }
    if (const StreamReq* first = out_.Push(std::move(r))) StartWrite(first);
  }
  void OnWriteDone(bool ok) override {
    if (const StreamReq* next = out_.Pop(ok)) StartWrite(next);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    Done done;
    StreamResp got = std::move(in_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = waiting_.find(got.tag());
      if (it != waiting_.end()) {
        done = std::move(it->second);
        waiting_.erase(it);
      }
    }
    StartRead(&in_);
    if (done) done(got);
  }
  void OnDone(const grpc::Status&) override {}

 private:
  grpc::ClientContext ctx_;
  StreamResp in_;
  WriteQueue<StreamReq> out_;
  std::mutex mu_;  // guards waiting_ and next_tag_
  std::map<uint64_t, Done> waiting_;
  uint64_t next_tag_ = 0;
};

class FloorSteps final : public repvar::v1::WorkerSteps::CallbackService {
 public:
  FloorSteps(WorkerStream* stream, Shape shape, int task)
      : stream_(stream), shape_(shape), task_(task) {}
  grpc::ServerUnaryReactor* StepWriteSmall(grpc::CallbackServerContext* ctx,
                                           const repvar::v1::StepWriteSmallRequest*,
                                           repvar::v1::StepWriteResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* CommitStep(grpc::CallbackServerContext* ctx,
                                       const repvar::v1::CommitStepRequest* req,
                                       repvar::v1::StepResolution* resp) override {
    auto* r = ctx->DefaultReactor();
    const int64_t step = req->step();
    auto answer = [this, r, resp, step] {
      ShortResolution(shape_, step, resp);
      for (int i = 0; i < shape_.changed; ++i) {
        auto* c = resp->add_changed();
        c->set_variable_id(static_cast<uint64_t>(i) + 1);
        c->set_name("v" + std::to_string(i));
        c->set_version(step + 1);
        c->set_checksum(0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(i + 1));
      }
      r->Finish(grpc::Status::OK);
    };
    stream_->Send(Report(shape_, task_, step), [this, step, answer](const StreamResp& plan) {
      if (plan.plan().has_resolution()) return answer();
      stream_->Send(Finish(shape_, task_, step), [answer](const StreamResp&) { answer(); });
    });
    return r;
  }

 private:
  WorkerStream* const stream_;
  const Shape shape_;
  const int task_;
};

int RunWorker(const std::string& coordinator, const std::string& port_file, int task, Shape shape) {
  auto stub = repvar::v1::CoordinatorWorkers::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  WorkerStream stream(stub.get());
  FloorSteps steps(&stream, shape, task);
  auto server = Serve({&steps}, port_file);
  WaitForStdinEof();
  std::_Exit(0);  // the stream's hold is never released: leave at once
}

// ---- driver ----

struct Child {
  pid_t pid = 0;
  int stdin_fd = -1;
};

Child Spawn(const std::vector<std::string>& args) {
  int fds[2];  // close-on-exec: only this child's stdin (dup2 clears it) outlives the spawn
  if (pipe2(fds, O_CLOEXEC) != 0) Die("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], 0);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c;
  if (posix_spawn(&c.pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ) != 0) {
    Die("spawn");
  }
  posix_spawn_file_actions_destroy(&actions);
  close(fds[0]);
  c.stdin_fd = fds[1];
  return c;
}

std::string AwaitPort(const std::string& port_file) {
  for (int i = 0; i < 3000; ++i) {  // 30 s
    std::ifstream f(port_file);
    int port = 0;
    if (f >> port && port > 0) return "127.0.0.1:" + std::to_string(port);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Die("no port in " + port_file);
}

// A trainer's call waits for its server's connection (a first connection
// on this VM has been seen to fail at once), up to a minute.
void Patient(grpc::ClientContext& ctx) {
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
}

void Begin(repvar::v1::CoordinatorTrainers::Stub& coord, int64_t step) {
  grpc::ClientContext ctx;
  Patient(ctx);
  repvar::v1::BeginStepRequest req;
  req.set_step(step);
  repvar::v1::StepInfo info;
  if (grpc::Status s = coord.BeginStep(&ctx, req, &info); !s.ok()) {
    Die("begin: " + s.error_message());
  }
}

// A trainer's writes of its replicas of the changed variables (16 floats
// each, inline), then its commit.
void Commit(repvar::v1::WorkerSteps::Stub& worker, const Shape& shape, int task, int64_t step) {
  if (shape.changed > 0) {
    repvar::v1::StepWriteSmallRequest writes;
    const std::string value(64, static_cast<char>(step));
    for (int i = 0; i < shape.changed; ++i) {
      auto* h = writes.add_writes();
      h->set_step(step);
      h->set_epoch(static_cast<uint64_t>(step));
      h->set_variable_id(static_cast<uint64_t>(i) + 1);
      h->set_replica(task);
      h->mutable_tensor()->mutable_spec()->set_dtype(repvar::v1::DTYPE_FLOAT32);
      h->mutable_tensor()->mutable_spec()->add_dims(16);
      h->mutable_tensor()->set_byte_size(value.size());
      h->mutable_tensor()->set_checksum(0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(i + 1));
      h->set_inline_data(value);
      h->set_layout_id(7);
    }
    grpc::ClientContext ctx;
    Patient(ctx);
    repvar::v1::StepWriteResponse wrote;
    if (grpc::Status s = worker.StepWriteSmall(&ctx, writes, &wrote); !s.ok()) {
      Die("write: " + s.error_message());
    }
  }
  grpc::ClientContext ctx;
  Patient(ctx);
  repvar::v1::CommitStepRequest req;
  req.set_step(step);
  req.set_epoch(static_cast<uint64_t>(step));
  req.set_layout_id(7);
  repvar::v1::StepResolution res;
  grpc::Status s = worker.CommitStep(&ctx, req, &res);
  if (!s.ok()) Die("commit: " + s.error_message());
  if (res.step() != step) Die("commit answered step " + std::to_string(res.step()));
}

int RunDriver(Shape shape, int steps) {
  const int workers = shape.workers;
  char dir_template[] = "/tmp/grpc_step_floor.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) Die("mkdtemp");
  const std::string base(dir);
  std::vector<Child> children;
  children.push_back(Spawn({"grpc_step_floor", "coordinator", base + "/coordinator",
                            std::to_string(workers), std::to_string(shape.changed)}));
  const std::string coordinator = AwaitPort(base + "/coordinator");
  std::vector<std::string> addresses;
  for (int w = 0; w < workers; ++w) {
    const std::string pf = base + "/worker" + std::to_string(w);
    children.push_back(Spawn({"grpc_step_floor", "worker", coordinator, pf, std::to_string(w),
                              std::to_string(workers), std::to_string(shape.changed)}));
  }
  for (int w = 0; w < workers; ++w)
    addresses.push_back(AwaitPort(base + "/worker" + std::to_string(w)));

  // As repvar_bench: one channel to the coordinator for every trainer, one
  // to each worker.
  auto coord = repvar::v1::CoordinatorTrainers::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  std::vector<std::unique_ptr<repvar::v1::WorkerSteps::Stub>> stubs;
  for (const std::string& a : addresses) {
    stubs.push_back(repvar::v1::WorkerSteps::NewStub(
        grpc::CreateChannel(a, grpc::InsecureChannelCredentials())));
  }
  repvar::bench::Trainers trainers(workers);
  auto step_once = [&](int64_t step) {
    trainers.Run([&](int) { Begin(*coord, step); });
    trainers.Run([&](int w) { Commit(*stubs[w], shape, w, step); });
  };
  constexpr int kWarmup = 20;
  for (int i = 1; i <= kWarmup; ++i) step_once(i);
  const double cpu0 = repvar::bench::CpuSeconds(children[0].pid);
  const auto t0 = Clock::now();
  for (int i = 1; i <= steps; ++i) step_once(kWarmup + i);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = (repvar::bench::CpuSeconds(children[0].pid) - cpu0) * 1000;
  std::printf(
      "grpc_step_floor workers=%d changed=%d steps=%d steps_per_s=%.2f "
      "coordinator_cpu_ms_per_step=%.2f\n",
      workers, shape.changed, steps, steps / secs, cpu / steps);
  std::fflush(stdout);
  for (Child& c : children) close(c.stdin_fd);
  for (Child& c : children) waitpid(c.pid, nullptr, 0);
  for (int w = 0; w < workers; ++w) std::remove((base + "/worker" + std::to_string(w)).c_str());
  std::remove((base + "/coordinator").c_str());
  rmdir(base.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "coordinator" && argc == 5) {
    return RunCoordinator(argv[2], Shape{std::atoi(argv[3]), std::atoi(argv[4])});
  }
  if (role == "worker" && argc == 7) {
    return RunWorker(argv[2], argv[3], std::atoi(argv[4]),
                     Shape{std::atoi(argv[5]), std::atoi(argv[6])});
  }
  const int workers = argc > 1 ? std::atoi(argv[1]) : 32;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int changed = argc > 3 ? std::atoi(argv[3]) : 0;
  if (workers < 1 || steps < 1 || changed < 0) {
    Die("usage: grpc_step_floor [workers] [steps] [changed]");
  }
  return RunDriver(Shape{workers, changed}, steps);
}
