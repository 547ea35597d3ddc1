// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_TASK_H_
#define REPVAR_COMMON_MODEL_TASK_H_

#include <compare>
#include <cstdint>
#include <string>
#include <utility>

namespace repvar {

// A worker process's place in the cluster: a task of a job (one per host).
struct TaskKey {
  std::string job;
  int32_t task = 0;
  std::string ToString() const;  // "job:task"
  friend auto operator<=>(const TaskKey&, const TaskKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const TaskKey& k) {
    return H::combine(std::move(h), k.job, k.task);
  }
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_TASK_H_
