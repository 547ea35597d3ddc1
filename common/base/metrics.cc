// SPDX-License-Identifier: Apache-2.0
#include "common/base/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace repvar {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.9g", v);
}

}  // namespace

std::string RenderLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", labels[i].first, "=\"", Escape(labels[i].second), "\"");
  }
  return out + "}";
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i] = 0;
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_micro_.fetch_add(static_cast<uint64_t>(std::max(0.0, v) * 1e6), std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    out.push_back(total);
  }
  return out;
}

double Histogram::sum() const {
  return static_cast<double>(sum_micro_.load(std::memory_order_relaxed)) / 1e6;
}

std::vector<double> Histogram::LatencyBounds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

Metrics& Metrics::Global() {
  static auto* metrics = new Metrics();
  return *metrics;
}

Metrics::Family& Metrics::FamilyLocked(const std::string& name, const std::string& help,
                                       const char* type) {
  Family& f = families_[name];
  if (f.type.empty()) {
    f.help = help;
    f.type = type;
  }
  return f;
}

Counter& Metrics::GetCounter(const std::string& name, const std::string& help,
                             const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, "counter").counters[RenderLabels(labels)];
  if (slot == nullptr) slot = std::make_unique<Counter>();
  return *slot;
}

Histogram& Metrics::GetHistogram(const std::string& name, const std::string& help,
                                 const MetricLabels& labels, std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, "histogram").histograms[RenderLabels(labels)];
  if (slot == nullptr) slot = std::make_unique<Histogram>(std::move(bounds));
  return *slot;
}

void Metrics::SetGauge(const std::string& name, const std::string& help, GaugeReader read) {
  absl::MutexLock lock(&mu_);
  FamilyLocked(name, help, "gauge").gauge = std::move(read);
}

void Metrics::RemoveGauge(const std::string& name) {
  absl::MutexLock lock(&mu_);
  families_.erase(name);
}

std::string Metrics::Render() const {
  // Gauge readers may take other locks: they run without this one.
  std::vector<std::pair<std::string, std::pair<std::string, GaugeReader>>> gauges;
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, f] : families_) {
      if (f.gauge) {
        gauges.push_back({name, {f.help, f.gauge}});
        continue;
      }
      absl::StrAppend(&out, "# HELP ", name, " ", f.help, "\n# TYPE ", name, " ", f.type, "\n");
      for (const auto& [labels, c] : f.counters) {
        absl::StrAppend(&out, name, labels, " ", c->value(), "\n");
      }
      for (const auto& [labels, h] : f.histograms) {
        // Rebuild the label list with "le" last: labels are rendered text,
        // so splice before the closing brace.
        const std::vector<uint64_t> counts = h->CumulativeCounts();
        for (size_t i = 0; i < counts.size(); ++i) {
          const std::string le = i < h->bounds().size() ? Number(h->bounds()[i]) : "+Inf";
          const std::string le_label =
              labels.empty()
                  ? absl::StrCat("{le=\"", le, "\"}")
                  : absl::StrCat(labels.substr(0, labels.size() - 1), ",le=\"", le, "\"}");
          absl::StrAppend(&out, name, "_bucket", le_label, " ", counts[i], "\n");
        }
        absl::StrAppend(&out, name, "_sum", labels, " ", Number(h->sum()), "\n");
        absl::StrAppend(&out, name, "_count", labels, " ", counts.back(), "\n");
      }
    }
  }
  for (const auto& [name, g] : gauges) {
    absl::StrAppend(&out, "# HELP ", name, " ", g.first, "\n# TYPE ", name, " gauge\n");
    for (const auto& [labels, value] : g.second()) {
      absl::StrAppend(&out, name, RenderLabels(labels), " ", Number(value), "\n");
    }
  }
  return out;
}

}  // namespace repvar
