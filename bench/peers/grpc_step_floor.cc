// SPDX-License-Identifier: Apache-2.0
// The report path's messages on bare gRPC, with no repvar logic behind them:
// the floor under `steps_per_s_32x1000` on this machine.
//
// The same processes and the same messages as repvar's report path, each
// answered at once: a coordinator process (BeginStep answered with the step;
// one StepStream per worker, a barrier that answers every worker's report
// once all have reported), `workers` worker processes (CommitStep sends a
// report on the worker's stream and answers the trainer when the stream's
// answer comes), and in this process one trainer thread per worker (the
// harness of repvar_bench, bench/harness.h): every trainer begins, then
// every trainer commits, as repvar_bench times a step. Both servers are on
// gRPC's callback API, as repvar's are.
//
//   grpc_step_floor [workers] [steps]
//   prints: grpc_step_floor workers=32 steps=... steps_per_s=... coordinator_cpu_ms_per_step=...
//
// The children are this binary run again (`coordinator PORTFILE WORKERS`,
// `worker COORDINATOR PORTFILE`); they stop when their stdin closes.
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

// ---- coordinator ----

class Barrier;

class CoordinatorStream final : public grpc::ServerBidiReactor<StreamReq, StreamResp> {
 public:
  explicit CoordinatorStream(Barrier* barrier) : barrier_(barrier) { StartRead(&in_); }
  void OnReadDone(bool ok) override;
  void Answer(uint64_t tag, int64_t step) {
    StreamResp r;
    r.set_tag(tag);
    r.mutable_plan()->mutable_resolution()->set_step(step);
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

// Answers every worker's report of a step once `workers` have reported it.
class Barrier {
 public:
  explicit Barrier(int workers) : workers_(workers) {}
  void Report(CoordinatorStream* from, uint64_t tag, int64_t step) {
    std::vector<std::pair<CoordinatorStream*, uint64_t>> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& waiting = steps_[step];
      waiting.emplace_back(from, tag);
      if (static_cast<int>(waiting.size()) < workers_) return;
      ready.swap(waiting);
      steps_.erase(step);
    }
    for (auto& [stream, t] : ready) stream->Answer(t, step);
  }

 private:
  const int workers_;
  std::mutex mu_;
  std::map<int64_t, std::vector<std::pair<CoordinatorStream*, uint64_t>>> steps_;
};

void CoordinatorStream::OnReadDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status::OK);
    return;
  }
  const uint64_t tag = in_.tag();
  const int64_t step = in_.report().step();
  StartRead(&in_);
  barrier_->Report(this, tag, step);
}

class FloorTrainers final : public repvar::v1::CoordinatorTrainers::CallbackService {
 public:
  grpc::ServerUnaryReactor* BeginStep(grpc::CallbackServerContext* ctx,
                                      const repvar::v1::BeginStepRequest* req,
                                      repvar::v1::StepInfo* resp) override {
    resp->set_step(req->step());
    resp->set_epoch(static_cast<uint64_t>(req->step()));
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

int RunCoordinator(const std::string& port_file, int workers) {
  Barrier barrier(workers);
  FloorTrainers trainers;
  FloorWorkers streams(&barrier);
  auto server = Serve({&trainers, &streams}, port_file);
  WaitForStdinEof();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

// ---- worker ----

// The worker's stream to the coordinator: reports out, answers back by tag.
class WorkerStream final : public grpc::ClientBidiReactor<StreamReq, StreamResp> {
 public:
  using Done = std::function<void(int64_t step)>;
  explicit WorkerStream(repvar::v1::CoordinatorWorkers::Stub* stub) {
    stub->async()->StepStream(&ctx_, this);
    StartRead(&in_);
    AddHold();
    StartCall();
  }
  void Report(int64_t step, Done done) {
    StreamReq r;
    r.mutable_report()->set_step(step);
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
    const int64_t step = in_.plan().resolution().step();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = waiting_.find(in_.tag());
      if (it != waiting_.end()) {
        done = std::move(it->second);
        waiting_.erase(it);
      }
    }
    StartRead(&in_);
    if (done) done(step);
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
  explicit FloorSteps(WorkerStream* stream) : stream_(stream) {}
  grpc::ServerUnaryReactor* CommitStep(grpc::CallbackServerContext* ctx,
                                       const repvar::v1::CommitStepRequest* req,
                                       repvar::v1::StepResolution* resp) override {
    auto* r = ctx->DefaultReactor();
    stream_->Report(req->step(), [r, resp](int64_t step) {
      resp->set_step(step);
      r->Finish(grpc::Status::OK);
    });
    return r;
  }

 private:
  WorkerStream* const stream_;
};

int RunWorker(const std::string& coordinator, const std::string& port_file) {
  auto stub = repvar::v1::CoordinatorWorkers::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  WorkerStream stream(stub.get());
  FloorSteps steps(&stream);
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

int RunDriver(int workers, int steps) {
  char dir_template[] = "/tmp/grpc_step_floor.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) Die("mkdtemp");
  const std::string base(dir);
  std::vector<Child> children;
  children.push_back(
      Spawn({"grpc_step_floor", "coordinator", base + "/coordinator", std::to_string(workers)}));
  const std::string coordinator = AwaitPort(base + "/coordinator");
  std::vector<std::string> addresses;
  for (int w = 0; w < workers; ++w) {
    const std::string pf = base + "/worker" + std::to_string(w);
    children.push_back(Spawn({"grpc_step_floor", "worker", coordinator, pf}));
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
    trainers.Run([&](int w) {
      grpc::ClientContext ctx;
      Patient(ctx);
      repvar::v1::BeginStepRequest req;
      req.set_step(step);
      repvar::v1::StepInfo info;
      if (grpc::Status s = coord->BeginStep(&ctx, req, &info); !s.ok()) {
        Die("begin: " + s.error_message());
      }
    });
    trainers.Run([&](int w) {
      grpc::ClientContext ctx;
      Patient(ctx);
      repvar::v1::CommitStepRequest req;
      req.set_step(step);
      req.set_epoch(static_cast<uint64_t>(step));
      repvar::v1::StepResolution res;
      grpc::Status s = stubs[w]->CommitStep(&ctx, req, &res);
      if (!s.ok()) Die("commit: " + s.error_message());
      if (res.step() != step) Die("commit answered step " + std::to_string(res.step()));
    });
  };
  constexpr int kWarmup = 20;
  for (int i = 1; i <= kWarmup; ++i) step_once(i);
  const double cpu0 = repvar::bench::CpuSeconds(children[0].pid);
  const auto t0 = Clock::now();
  for (int i = 1; i <= steps; ++i) step_once(kWarmup + i);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = (repvar::bench::CpuSeconds(children[0].pid) - cpu0) * 1000;
  std::printf(
      "grpc_step_floor workers=%d steps=%d steps_per_s=%.2f coordinator_cpu_ms_per_step=%.2f\n",
      workers, steps, steps / secs, cpu / steps);
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
  if (role == "coordinator" && argc == 4) return RunCoordinator(argv[2], std::atoi(argv[3]));
  if (role == "worker" && argc == 4) return RunWorker(argv[2], argv[3]);
  const int workers = argc > 1 ? std::atoi(argv[1]) : 32;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 1000;
  if (workers < 1 || steps < 1) Die("usage: grpc_step_floor [workers] [steps]");
  return RunDriver(workers, steps);
}
