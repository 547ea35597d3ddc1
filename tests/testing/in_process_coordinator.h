// SPDX-License-Identifier: Apache-2.0
// A coordinator core with its three gRPC services in this process: reached
// over an in-process channel (adapter tests) or over 127.0.0.1:0 (client
// tests). The workers are fakes; time is a fake clock.
#ifndef REPVAR_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_
#define REPVAR_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/coordinator.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/trainers_service.h"
#include "server/rpc/workers_service.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_worker_client.h"

namespace repvar::testing {

class InProcessCoordinator {
 public:
  // `listen`: also serve on 127.0.0.1 (port()); else in-process only.
  explicit InProcessCoordinator(bool listen = false, server::CoordinatorOptions options = {})
      : core_(options, &clock_, &workers_),
        workers_service_(&core_, &step_infos_),
        trainers_service_(&core_, &step_infos_, &scalars_),
        admin_service_(&core_, &scalars_, nullptr) {
    grpc::ServerBuilder builder;
    if (listen) builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&workers_service_);
    builder.RegisterService(&trainers_service_);
    builder.RegisterService(&admin_service_);
    server_ = builder.BuildAndStart();
    channel_ = server_->InProcessChannel(grpc::ChannelArguments());
  }
  // Teardown order: long polls answered, then the server, then the core.
  ~InProcessCoordinator() {
    workers_service_.Shutdown();
    trainers_service_.Shutdown();
    server_->Shutdown();
    server_->Wait();
  }

  // Registers tpu_worker:0..n-1 with `tpus` accelerators each.
  void RegisterWorkers(int n, int tpus) {
    for (int t = 0; t < n; ++t) {
      WorkerRegistration r{"tpu_worker", t, absl::StrCat("h", t, ":1"), 100u + t, {}};
      for (int i = 0; i < tpus; ++i) {
        r.devices.push_back(absl::StrCat("/job:tpu_worker/replica:0/task:", t, "/device:TPU:", i));
      }
      (void)core_.RegisterWorker(r);
    }
  }

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  server::Coordinator& core() { return core_; }
  server::ScalarBoard& scalars() { return scalars_; }
  FakeClock& clock() { return clock_; }
  FakeWorkerClient& workers() { return workers_; }

 private:
  FakeClock clock_;
  FakeWorkerClient workers_;
  server::Coordinator core_;
  server::StepInfoCache step_infos_;
  server::ScalarBoard scalars_;
  server::WorkersService workers_service_;
  server::TrainersService trainers_service_;
  server::AdminService admin_service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_
