// SPDX-License-Identifier: Apache-2.0
#include "sim/client_node.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/tensor/local_read_table.h"
#include "sim/coordinator_node.h"
#include "sim/worker_node.h"
#include "sim/world.h"

namespace repvar::sim {
namespace {

constexpr int kElements = 2;

std::shared_ptr<const Tensor> FloatTensor(const std::vector<float>& v) {
  TensorSpec spec{DType::kFloat32, {static_cast<int64_t>(v.size())}};
  auto t = Tensor::FromBytes(
      spec, {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)});
  return std::make_shared<const Tensor>(*std::move(t));
}

std::vector<float> Floats(const Tensor& t) {
  std::vector<float> out(t.bytes.size() / sizeof(float));
  std::memcpy(out.data(), t.bytes.span().data(), out.size() * sizeof(float));
  return out;
}

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s);
}

// A status that says the operation changed nothing (C2, C6, X2): a retry
// of an applied request gets its first answer, so a refusal is final.
bool Refusal(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsNotFound(s) || absl::IsFailedPrecondition(s) ||
         absl::IsAlreadyExists(s) || absl::IsResourceExhausted(s);
}

}  // namespace

int64_t ClientNode::Micros() const { return absl::ToUnixMicros(world_->scheduler().Now()); }

std::string ClientNode::NewRequestId() {
  return absl::StrFormat("c%d-%d-%016x", index_, requests_++, world_->random().Next());
}

template <typename T>
absl::StatusOr<T> ClientNode::Call(
    const char* name, std::function<void(server::Coordinator*, Network::Answer<T>)> serve) {
  World* w = world_;
  return world_->network().CallAndWait<T>(World::kCoordinatorNode,
                                          world_->scheduler().Now() + absl::Seconds(10), name,
                                          [w, serve](ProcessId callee, Network::Answer<T> answer) {
                                            auto core = w->coordinator().Serving(callee);
                                            if (!core.ok()) return answer(core.status());
                                            serve(*core, answer);
                                          });
}

template <typename T>
absl::StatusOr<T> ClientNode::Retried(
    const char* name, std::function<void(server::Coordinator*, Network::Answer<T>)> serve,
    int attempts) {
  absl::Duration backoff = absl::Milliseconds(50);
  absl::StatusOr<T> r = absl::UnavailableError("not tried");
  for (int i = 0; i < attempts; ++i) {
    r = Call<T>(name, serve);
    if (!Retryable(r.status())) return r;
    world_->scheduler().clock()->SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  return r;
}

void ClientNode::StartSetup(int variables, int step_variables, int accelerators) {
  process_ = world_->network().Start(node_, absl::StrCat("client", index_));
  world_->scheduler().Spawn(process_, "setup", [this, variables, step_variables, accelerators] {
    Setup(variables, step_variables, accelerators);
    done_ = true;
  });
}

void ClientNode::Setup(int variables, int step_variables, int accelerators) {
  Scheduler& s = world_->scheduler();
  // The cluster first: every accelerator listed.
  while (true) {
    auto topo = Call<TopologySnapshot>(
        "GetTopology", [](server::Coordinator* core, Network::Answer<TopologySnapshot> answer) {
          answer(core->registry().Snapshot());
        });
    if (topo.ok() && static_cast<int>(topo->accelerators.size()) >= accelerators) break;
    s.clock()->SleepFor(absl::Milliseconds(100));
  }
  std::vector<CreateItem> items;
  std::vector<InitializeItem> inits;
  for (int i = 0; i < variables; ++i) {
    CreateItem item;
    item.def.name = absl::StrCat("v", i);
    item.def.tensor = TensorSpec{DType::kFloat32, {kElements}};
    item.def.replica_count = static_cast<int32_t>(world_->random().Between(1, accelerators));
    item.initializer.kind = InitializerKind::kConstant;
    item.initializer.constant = i + 1;
    items.push_back(item);
    inits.push_back({item.def.name, std::nullopt});
    variables_.push_back(item.def.name);
  }
  constexpr Aggregation kAggregations[] = {Aggregation::kNone, Aggregation::kSum,
                                           Aggregation::kMean, Aggregation::kOnlyFirstReplica};
  for (int i = 0; i < step_variables; ++i) {
    CreateItem item;
    item.def.name = absl::StrCat("s", i);
    item.def.tensor = TensorSpec{DType::kFloat32, {kElements}};
    // On two hosts at least (replicas fill a host's devices first), so that
    // a step's value, which lives on the replicas alone, outlives a host.
    const int two_hosts = std::min(accelerators, world_->options().devices_per_worker + 1);
    item.def.replica_count =
        static_cast<int32_t>(world_->random().Between(two_hosts, accelerators));
    item.def.aggregation = kAggregations[i % 4];
    item.initializer.kind = InitializerKind::kConstant;
    item.initializer.constant = i + 1;
    items.push_back(item);
    inits.push_back({item.def.name, std::nullopt});
    step_variables_.push_back(item.def.name);
  }
  const server::RequestKey create{NewRequestId(), 1};
  while (!Retried<CreateResult>(
              "CreateVariables",
              [create, items](server::Coordinator* core, Network::Answer<CreateResult> answer) {
                answer(core->CreateVariables(create, items));
              },
              1000)
              .ok()) {
  }
  const server::RequestKey init{NewRequestId(), 2};
  while (!Retried<std::vector<InitializeResult>>(
              "InitializeVariables",
              [init, inits](server::Coordinator* core,
                            Network::Answer<std::vector<InitializeResult>> answer) {
                answer(core->Initialize(init, inits));
              },
              1000)
              .ok()) {
  }
  for (const std::string& name : step_variables_) {
    const ReadResult r = ReadUntilAnswered(name);
    world_->step_reads().Committed(name, r.version, ChecksumOf(Floats(*r.value)), 0);
  }
  for (const std::string& name : variables_) {
    const ReadResult r = ReadUntilAnswered(name);
    world_->history().SetInitial(name, RegisterState{r.version, Floats(*r.value)});
  }
  world_->Log(absl::StrCat("setup done: ", variables, " variables"));
}

ReadResult ClientNode::ReadUntilAnswered(const std::string& name) {
  absl::StatusOr<ReadResult> r;
  do {
    r = Retried<ReadResult>(
        "ReadVariable",
        [name](server::Coordinator* core, Network::Answer<ReadResult> answer) {
          answer(core->Read(name));
        },
        1000);
  } while (!r.ok());
  return *std::move(r);
}

void ClientNode::StartWorkload(int ops) {
  done_ = false;
  if (process_ < 0) process_ = world_->network().Start(node_, absl::StrCat("client", index_));
  world_->scheduler().Spawn(process_, "workload", [this, ops] {
    Workload(ops);
    done_ = true;
  });
}

void ClientNode::Workload(int ops) {
  Random& random = world_->random();
  for (int i = 0; i < ops; ++i) {
    // The setup's variables, and those this client created since.
    const uint64_t setup = static_cast<uint64_t>(world_->options().variables);
    const uint64_t pick = random.Uniform(setup + created_.size());
    const std::string name =
        pick < setup ? absl::StrCat("v", pick) : created_[static_cast<size_t>(pick - setup)];
    std::vector<float> value(kElements);
    for (float& f : value) f = static_cast<float>(random.Between(-8, 8));
    switch (random.Uniform(16)) {
      case 0:
        Create(value[0]);
        break;
      case 1:
      case 2:
      case 3:
      case 4:
      case 5:
        Write(name, AssignOp::kAssign, std::move(value));
        break;
      case 6:
      case 7:
      case 8:
      case 9:
      case 10:
        Write(name, AssignOp::kAdd, std::move(value));
        break;
      default:
        // A step variable now and then: the trainers' steps write them.
        if (world_->options().steps > 0 && world_->options().step_variables > 0 &&
            random.Uniform(2) == 0) {
          Read(absl::StrCat("s", random.Uniform(world_->options().step_variables)));
        } else {
          Read(name);
        }
        break;
    }
    world_->scheduler().clock()->SleepFor(
        random.Between(absl::ZeroDuration(), absl::Milliseconds(200)));
  }
}

void ClientNode::Write(const std::string& name, AssignOp op, std::vector<float> value) {
  RegisterOp rop;
  rop.kind = op == AssignOp::kAssign ? RegisterOp::Kind::kAssign : RegisterOp::Kind::kAdd;
  rop.arg = value;
  rop.call = Micros();
  const size_t h = world_->history().Begin(name, rop);
  const std::shared_ptr<const Tensor> t = FloatTensor(value);
  const server::RequestKey key{NewRequestId(), t->checksum ^ static_cast<uint64_t>(op)};
  const Assignment item{name, op, t};
  auto r = Retried<WriteResult>(
      "AssignVariable",
      [key, item](server::Coordinator* core, Network::Answer<WriteResult> answer) {
        answer(core->Assign(key, item));
      },
      8);
  if (r.ok()) {
    world_->history().Answered(name, h, Micros(), r->version, r->checksum);
  } else if (Refusal(r.status())) {
    world_->history().Refused(name, h);
  }
  world_->Log(absl::StrCat("client ", index_, " ", op == AssignOp::kAssign ? "assign " : "add ",
                           name, " [", absl::StrJoin(value, ","), "] -> ",
                           r.ok() ? absl::StrCat("v", r->version) : r.status().ToString()));
}

void ClientNode::Create(float constant) {
  const std::string name = absl::StrCat("c", index_, "-", creates_++);
  CreateItem item;
  item.def.name = name;
  item.def.tensor = TensorSpec{DType::kFloat32, {kElements}};
  const int accelerators = world_->options().workers * world_->options().devices_per_worker;
  item.def.replica_count = static_cast<int32_t>(world_->random().Between(1, accelerators));
  item.initializer.kind = InitializerKind::kConstant;
  item.initializer.constant = constant;
  const server::RequestKey create{NewRequestId(), 3};
  auto created = Retried<CreateResult>(
      "CreateVariables",
      [create, item](server::Coordinator* core, Network::Answer<CreateResult> answer) {
        answer(core->CreateVariables(create, {item}));
      },
      8);
  world_->Log(absl::StrCat("client ", index_, " create ", name, " (", item.def.replica_count,
                           " replicas) -> ", created.ok() ? "ok" : created.status().ToString()));
  if (!created.ok()) return;  // maybe created: never used
  // Initializing is the variable's first write: version 1, the constant.
  world_->history().SetInitial(name, RegisterState{0, {}});
  RegisterOp rop;
  rop.kind = RegisterOp::Kind::kAssign;
  rop.arg = std::vector<float>(kElements, constant);
  rop.call = Micros();
  const size_t h = world_->history().Begin(name, rop);
  const server::RequestKey init{NewRequestId(), 4};
  auto r = Retried<std::vector<InitializeResult>>(
      "InitializeVariables",
      [init, name](server::Coordinator* core,
                   Network::Answer<std::vector<InitializeResult>> answer) {
        answer(core->Initialize(init, {{name, std::nullopt}}));
      },
      8);
  world_->Log(absl::StrCat(
      "client ", index_, " initialize ", name, " -> ",
      r.ok() && r->size() == 1 ? absl::StrCat("v", (*r)[0].version) : r.status().ToString()));
  if (r.ok() && r->size() == 1) {
    world_->history().Answered(name, h, Micros(), (*r)[0].version, (*r)[0].checksum);
    created_.push_back(name);
  } else if (!r.ok() && Refusal(r.status())) {
    world_->history().Refused(name, h);
  }
}

bool ClientNode::ReadLocally(const std::string& name) {
  // The host's worker is the client's index modulo the workers, its table
  // mapped as a trainer maps it (kept after the worker process died).
  WorkerNode* w = world_->WorkerAt(static_cast<NodeId>(index_ % world_->worker_count()) + 1);
  const std::span<const std::byte> table = w->local_table();
  if (table.empty()) return false;
  absl::StatusOr<LocalReadView> view = LocalReadView::Open(table);
  if (!view.ok()) return false;
  LocalValue got;
  std::vector<std::byte> bytes;
  Scheduler& s = world_->scheduler();
  const int64_t call = Micros();
  auto now = [&s] { return absl::ToUnixNanos(s.Now()); };
  if (view->Read(name, now, got, bytes) != LocalReadView::Outcome::kServed) return false;
  std::vector<float> floats(bytes.size() / sizeof(float));
  std::memcpy(floats.data(), bytes.data(), floats.size() * sizeof(float));
  world_->Log(absl::StrCat("client ", index_, " read ", name, " locally -> v", got.version, " [",
                           absl::StrJoin(floats, ","), "]"));
  Record(name, call, got.version, ChecksumOf(floats), /*local=*/true);
  return true;
}

void ClientNode::Record(const std::string& name, int64_t call, int64_t version, uint64_t checksum,
                        bool local) {
  if (name.starts_with("s")) {
    world_->step_reads().Read(name, call, version, checksum, local);
    return;
  }
  RegisterOp rop;
  rop.kind = RegisterOp::Kind::kRead;
  rop.call = call;
  const size_t h = world_->history().Begin(name, rop);
  world_->history().Answered(name, h, Micros(), version, checksum);
}

void ClientNode::Read(const std::string& name) {
  if (world_->local_reads() && world_->random().Uniform(2) == 0 && ReadLocally(name)) return;
  const int64_t call = Micros();
  auto r = Retried<ReadResult>(
      "ReadVariable",
      [name](server::Coordinator* core, Network::Answer<ReadResult> answer) {
        answer(core->Read(name));
      },
      8);
  world_->Log(absl::StrCat(
      "client ", index_, " read ", name, " -> ",
      r.ok() ? absl::StrCat("v", r->version, " [", absl::StrJoin(Floats(*r->value), ","), "]")
             : r.status().ToString()));
  if (!r.ok()) return;  // a read that failed changed nothing
  Record(name, call, r->version, ChecksumOf(Floats(*r->value)), /*local=*/false);
}

}  // namespace repvar::sim
