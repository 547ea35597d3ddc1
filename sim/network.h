// SPDX-License-Identifier: Apache-2.0
// The simulated network between the cluster's nodes (hosts): each message
// takes its own delay (so messages reorder), may be lost or, for requests,
// delivered twice, and a partition holds every message between its two
// sides. A call is a request and an answer over a connection, as gRPC's:
// the handler runs on a new thread of the process that listens at the
// callee's node, and the caller hears exactly once: the answer;
// UNAVAILABLE when nobody listens there, or when the connection is seen
// broken (a message of the call lost or cut off, the callee's process dead
// or paused) by the keepalive's probe (rpc/credentials.h's times); or
// DEADLINE_EXCEEDED at its deadline.
#ifndef REPVAR_SIM_NETWORK_H_
#define REPVAR_SIM_NETWORK_H_

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/sync.h"
#include "common/rpc/credentials.h"
#include "sim/random.h"
#include "sim/scheduler.h"

namespace repvar::sim {

using NodeId = int;

// An answer that carries nothing but its status.
struct Nothing {};

struct NetworkFaults {
  absl::Duration min_delay = absl::Microseconds(50);
  absl::Duration max_delay = absl::Milliseconds(2);
  double loss = 0;       // of each message
  double duplicate = 0;  // of each request
};

class Network {
 public:
  Network(Scheduler* scheduler, Random* random)
      : s_(scheduler), random_(random), wire_(scheduler->NewProcess("network")) {
    nodes_of_processes_.resize(wire_ + 1, -1);
  }

  void SetFaults(NetworkFaults f) { faults_ = f; }
  const NetworkFaults& faults() const { return faults_; }
  // Cuts `side` from every other node until Heal.
  void Partition(std::set<NodeId> side) { cut_ = std::move(side); }
  void Heal() { cut_.clear(); }
  bool Reachable(NodeId a, NodeId b) const { return cut_.contains(a) == cut_.contains(b); }

  // A new process on `node`, which then listens there (a restarted
  // daemon replaces the one before it).
  ProcessId Start(NodeId node, std::string name);
  // The process listening at `node` (-1: none alive).
  ProcessId ListenerAt(NodeId node) const;
  NodeId NodeOf(ProcessId p) const { return nodes_of_processes_.at(p); }

  // A message from `from`'s process to the process listening at `to` when
  // it is sent (its connection's other end): `deliver(listener)` runs on
  // the driving thread when it arrives (and must only spawn threads),
  // unless it is lost, held by a partition (lost), or that process is no
  // longer the one listening there (lost with its connection: a restarted
  // daemon never gets its predecessor's messages). When nobody listens,
  // `refused()` runs at the sender instead, when given. `dropped()`, when
  // given, runs if the message is lost or cut off.
  void Send(ProcessId from, NodeId to, std::function<void(ProcessId)> deliver,
            std::function<void()> refused = nullptr, std::function<void()> dropped = nullptr);

  // A call from a thread of `from` (or a timer of it): `handler(listener,
  // answer)` runs on a new thread of the callee's process and calls
  // `answer` once, now or later, from any thread; `done` runs on a new
  // thread of `from` with the answer. `name` names the threads.
  template <typename T>
  using Answer = std::function<void(absl::StatusOr<T>)>;
  template <typename T>
  void Call(ProcessId from, NodeId to, absl::Time deadline, std::string name,
            std::function<void(ProcessId, Answer<T>)> handler,
            absl::AnyInvocable<void(absl::StatusOr<T>) &&> done);
  // Call from a simulated thread, waiting for the answer.
  template <typename T>
  absl::StatusOr<T> CallAndWait(NodeId to, absl::Time deadline, std::string name,
                                std::function<void(ProcessId, Answer<T>)> handler);

  Scheduler* scheduler() { return s_; }

 private:
  absl::Duration Delay() { return random_->Between(faults_.min_delay, faults_.max_delay); }

  Scheduler* const s_;
  Random* const random_;
  const ProcessId wire_;  // owns messages in flight: they outlive their sender
  NetworkFaults faults_;
  std::set<NodeId> cut_;
  std::vector<ProcessId> listeners_;        // by node
  std::vector<NodeId> nodes_of_processes_;  // by process
};

template <typename T>
void Network::Call(ProcessId from, NodeId to, absl::Time deadline, std::string name,
                   std::function<void(ProcessId, Answer<T>)> handler,
                   absl::AnyInvocable<void(absl::StatusOr<T>) &&> done) {
  // Exactly once: the first of the answer, the refusal and the deadline.
  struct Pending {
    bool settled = false;
    absl::AnyInvocable<void(absl::StatusOr<T>) &&> done;
  };
  struct Connection {
    ProcessId callee = -1;
    bool broken = false;
  };
  auto pending = std::make_shared<Pending>();
  pending->done = std::move(done);
  auto conn = std::make_shared<Connection>();
  auto settle = [this, from, pending, name](absl::StatusOr<T> result) {
    if (pending->settled) return;
    pending->settled = true;
    s_->Spawn(from, name + " answered", [pending, result = std::move(result)]() mutable {
      std::move(pending->done)(std::move(result));
    });
  };
  s_->At(from, deadline, [settle, name] {
    settle(absl::DeadlineExceededError(absl::StrCat(name, ": no answer by the deadline")));
  });
  auto broken = [conn] { conn->broken = true; };
  auto probe = std::make_shared<std::function<void()>>();
  *probe = [this, from, to, pending, conn, settle, name, probe_ref = std::weak_ptr(probe)] {
    if (pending->settled) return;
    const bool dead = conn->callee >= 0 && (!s_->Alive(conn->callee) || s_->Paused(conn->callee));
    if (conn->broken || dead || !Reachable(NodeOf(from), to)) {
      s_->At(from, s_->Now() + kKeepaliveTimeout, [settle, name] {
        settle(absl::UnavailableError(absl::StrCat(name, ": the connection broke (keepalive)")));
      });
    } else if (auto again = probe_ref.lock()) {
      s_->At(from, s_->Now() + kKeepaliveTime, [again] { (*again)(); });
    }
  };
  s_->At(from, s_->Now() + kKeepaliveTime, [probe] { (*probe)(); });
  auto deliver = [this, from, name, handler, settle, conn, broken](ProcessId callee) {
    conn->callee = callee;
    // The answer travels back from wherever the handler calls it, to the
    // caller's process (not to a later one on its node).
    Answer<T> answer = [this, callee, from, settle, broken](absl::StatusOr<T> result) {
      Send(
          callee, NodeOf(from),
          [settle, from, this, result = std::move(result)](ProcessId) {
            if (s_->Alive(from)) settle(result);
          },
          nullptr, broken);
    };
    s_->Spawn(callee, name, [handler, callee, answer] { handler(callee, answer); });
  };
  auto refused = [settle, name, to] {
    settle(absl::UnavailableError(absl::StrCat(name, ": nothing listens at node ", to)));
  };
  Send(from, to, deliver, refused, broken);
  if (random_->Chance(faults_.duplicate)) Send(from, to, deliver, nullptr);
}

template <typename T>
absl::StatusOr<T> Network::CallAndWait(NodeId to, absl::Time deadline, std::string name,
                                       std::function<void(ProcessId, Answer<T>)> handler) {
  struct Reply {
    Mutex mu;
    std::optional<absl::StatusOr<T>> result ABSL_GUARDED_BY(mu);
  };
  auto reply = std::make_shared<Reply>();
  Call<T>(s_->CurrentProcess(), to, deadline, std::move(name), std::move(handler),
          [reply](absl::StatusOr<T> r) {
            MutexLock lock(&reply->mu);
            reply->result = std::move(r);
          });
  MutexLock lock(&reply->mu);
  auto arrived = [&reply]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return reply->result.has_value(); };
  reply->mu.Await(absl::Condition(&arrived));
  return *std::move(reply->result);
}

}  // namespace repvar::sim

#endif  // REPVAR_SIM_NETWORK_H_
