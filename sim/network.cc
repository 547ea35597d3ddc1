// SPDX-License-Identifier: Apache-2.0
#include "sim/network.h"

namespace repvar::sim {

ProcessId Network::Start(NodeId node, std::string name) {
  const ProcessId p = s_->NewProcess(std::move(name));
  if (nodes_of_processes_.size() <= static_cast<size_t>(p)) nodes_of_processes_.resize(p + 1, -1);
  nodes_of_processes_[p] = node;
  if (listeners_.size() <= static_cast<size_t>(node)) listeners_.resize(node + 1, -1);
  listeners_[node] = p;
  return p;
}

ProcessId Network::ListenerAt(NodeId node) const {
  if (node < 0 || static_cast<size_t>(node) >= listeners_.size()) return -1;
  const ProcessId p = listeners_[node];
  return p >= 0 && s_->Alive(p) ? p : -1;
}

void Network::Send(ProcessId from, NodeId to, std::function<void(ProcessId)> deliver,
                   std::function<void()> refused, std::function<void()> dropped) {
  const NodeId source = NodeOf(from);
  if (!Reachable(source, to) || random_->Chance(faults_.loss)) {
    if (dropped) dropped();
    return;
  }
  const ProcessId listener = ListenerAt(to);
  s_->At(wire_, s_->Now() + Delay(), [this, source, to, listener, deliver, refused, dropped] {
    const ProcessId now = ListenerAt(to);
    if (!Reachable(source, to) || (listener >= 0 && now != listener)) {
      if (dropped) dropped();  // cut while in flight, or its connection died
      return;
    }
    if (listener >= 0) {
      deliver(listener);
    } else if (refused) {
      s_->At(wire_, s_->Now() + Delay(), refused);
    }
  });
}

}  // namespace repvar::sim
