// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_TASK_H_
#define REPVAR_COMMON_MODEL_TASK_H_

#include <compare>
#include <cstdint>
#include <string>

namespace repvar {

// A worker process's place in the cluster: a task of a job (one per host).
struct TaskKey {
  std::string job;
  int32_t task = 0;
  std::string ToString() const;  // "job:task"
  friend auto operator<=>(const TaskKey&, const TaskKey&) = default;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_TASK_H_
