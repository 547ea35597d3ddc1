// SPDX-License-Identifier: Apache-2.0
// Process metrics in the Prometheus text exposition format (version 0.0.4):
// counters and histograms updated where things happen, gauges read when
// scraped. One registry per process (Metrics::Global()); the daemons serve
// it at /metrics (common/rpc/metrics_server.h).
//
//   static Counter& refused = Metrics::Global().GetCounter(
//       "repvar_auth_refused_total", "calls refused by the access policy", {{"code", "..."}});
//   refused.Add();
#ifndef REPVAR_COMMON_BASE_METRICS_H_
#define REPVAR_COMMON_BASE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace repvar {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A value that only goes up. Thread-safe, lock-free.
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Observations counted into fixed buckets (upper bounds, seconds or bytes),
// with their sum. Thread-safe, lock-free.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  void Observe(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound, then the total count; and the sum.
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const;

  // 100 us .. 10 s, for latencies.
  static std::vector<double> LatencyBounds();

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // one per bound, then +Inf
  std::atomic<uint64_t> sum_micro_{0};               // sum in millionths, to stay lock-free
};

// The registry. A metric is named once, with HELP text, and each label set
// is its own series; getters return the same object for the same name and
// labels (keep the reference: lookups take a lock).
class Metrics {
 public:
  static Metrics& Global();

  Counter& GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {}) ABSL_LOCKS_EXCLUDED(mu_);
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const MetricLabels& labels = {},
                          std::vector<double> bounds = Histogram::LatencyBounds())
      ABSL_LOCKS_EXCLUDED(mu_);
  // A gauge family read at each scrape: `read` returns (labels, value) for
  // each series. Registering a name again replaces its reader (a daemon
  // restarted inside one process, as tests do).
  using GaugeReader = std::function<std::vector<std::pair<MetricLabels, double>>()>;
  void SetGauge(const std::string& name, const std::string& help, GaugeReader read)
      ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveGauge(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Every metric in the exposition format, families sorted by name.
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Family {
    std::string help;
    std::string type;                                              // counter, histogram, gauge
    std::map<std::string, std::unique_ptr<Counter>> counters;      // by rendered labels
    std::map<std::string, std::unique_ptr<Histogram>> histograms;  // by rendered labels
    GaugeReader gauge;
  };
  Family& FamilyLocked(const std::string& name, const std::string& help, const char* type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// `{a="x",b="y"}` with values escaped as the format says; "" for none.
std::string RenderLabels(const MetricLabels& labels);

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_METRICS_H_
