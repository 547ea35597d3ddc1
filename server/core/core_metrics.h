// SPDX-License-Identifier: Apache-2.0
// Counters the core keeps that more than one place reads or adds to.
#ifndef REPVAR_SERVER_CORE_CORE_METRICS_H_
#define REPVAR_SERVER_CORE_CORE_METRICS_H_

#include <string>

#include "common/base/metrics.h"

namespace repvar::server {

// repvar_divergences_repaired_total{in}: replicas found holding other than
// they should and rewritten, `in` "step" (a step's vote) or "verification"
// (a worker's holdings checked when it registers).
inline Counter& DivergencesRepaired(const std::string& in) {
  return Metrics::Global().GetCounter(
      "repvar_divergences_repaired_total",
      "replicas found holding other than the value they should, rewritten (in: a step's vote, "
      "or verification of a worker)",
      {{"in", in}});
}

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_CORE_METRICS_H_
