// SPDX-License-Identifier: Apache-2.0
// `repvar-sim --scale`: the coordinator's cost at a thousand hosts, measured
// on one machine. The real coordinator core and the real message
// conversions of its worker- and trainer-facing adapters run on one thread;
// the hosts are what a worker and its trainers would send, summarized by
// the workers' own code (SummarizeReport, SummarizeFinish) outside the
// measured sections, and their replicas acknowledge at once. What is
// measured is the coordinator's share: its CPU per phase, its resident
// memory, and the bytes of the messages it parses and builds per host.
#ifndef REPVAR_SIM_SCALE_H_
#define REPVAR_SIM_SCALE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace repvar::sim {

struct ScaleOptions {
  int hosts = 1000;
  int accelerators = 4;  // per host: a variable has one replica on each
  int variables = 10000;
  int elements = 16;  // float32 elements per variable
  int steps = 5;      // measured, after one that warms up
};

struct ScaleResult {
  double register_cpu_s = 0;         // every host registers
  double create_init_cpu_s = 0;      // every variable created and initialized
  double heartbeat_round_cpu_s = 0;  // one heartbeat from every host, and a tick
  double step_cpu_ms = 0;            // median over the measured steps
  double bytes_per_host_step = 0;    // messages in + out per host, a step's mean
  double rss_mib = 0;                // resident growth since before the coordinator
  double heap_mib = 0;               // of which allocated and not freed (mallinfo2)
};

// Registers the hosts, creates and initializes the variables (all MEAN, a
// replica on every accelerator), times a heartbeat round, then runs
// `steps` replicated steps in which every variable changes and every
// replica agrees. Errors: the first refused call, with what refused it.
absl::StatusOr<ScaleResult> RunScale(const ScaleOptions& options);

}  // namespace repvar::sim

#endif  // REPVAR_SIM_SCALE_H_
