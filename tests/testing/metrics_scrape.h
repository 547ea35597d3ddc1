// SPDX-License-Identifier: Apache-2.0
// A daemon's /metrics as a test reads it: fetched over HTTP(S) from a test
// cluster and parsed line by line against the text exposition format.
#ifndef REPVAR_TESTS_TESTING_METRICS_SCRAPE_H_
#define REPVAR_TESTS_TESTING_METRICS_SCRAPE_H_

#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/cluster.h"

namespace repvar::testing {

// One scrape: every sample by its series ("name{labels}"), after checking
// each line against the text format (version 0.0.4): "# HELP name text",
// "# TYPE name counter|gauge|histogram", samples of a family after its TYPE,
// histogram buckets cumulative with "+Inf" equal to _count.
struct Scrape {
  std::map<std::string, double> samples;
  std::vector<std::string> errors;

  static Scrape Parse(const std::string& text) {
    static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
    static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
    static const std::regex kSample(
        R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+))");
    Scrape s;
    std::string family, type;
    double last_bucket = -1;
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      const std::string l(line);
      std::smatch m;
      if (std::regex_match(l, m, kHelp)) continue;
      if (std::regex_match(l, m, kType)) {
        family = m[1];
        type = m[2];
        continue;
      }
      if (!std::regex_match(l, m, kSample)) {
        s.errors.push_back("not a sample: " + l);
        continue;
      }
      const std::string name = m[1];
      double value = 0;
      const std::string v = m[m.size() - 1];
      if (!absl::SimpleAtod(v, &value) && v != "+Inf" && v != "NaN") {
        s.errors.push_back("bad value: " + l);
      }
      const bool of_family =
          name == family ||
          (type == "histogram" &&
           (name == family + "_bucket" || name == family + "_sum" || name == family + "_count"));
      if (!of_family) s.errors.push_back("sample outside its family's TYPE: " + l);
      if (name == family + "_bucket") {
        if (value < last_bucket) s.errors.push_back("buckets not cumulative: " + l);
        last_bucket = absl::StrContains(l, "le=\"+Inf\"") ? -1 : value;
      }
      s.samples[l.substr(0, l.rfind(' '))] = value;
    }
    return s;
  }
  double Get(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
};

// GET `path` from `daemon`'s metrics server ("coordinator", "tpu_worker-2"):
// (status, body); HTTPS verified against the cluster's CA when it serves TLS.
inline std::pair<int, std::string> MetricsGet(const TestCluster& cluster, const std::string& daemon,
                                              const std::string& path) {
  int port = 0;
  for (absl::Time until = absl::Now() + Scaled(absl::Seconds(10));
       (port = cluster.metrics_port(daemon)) == 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  auto answer = [](httplib::Result res) -> std::pair<int, std::string> {
    if (!res) return {0, ""};
    return {res->status, res->body};
  };
  if (cluster.tls()) {
    httplib::SSLClient https("127.0.0.1", port);
    https.set_ca_cert_path(cluster.cert("ca.pem").c_str());
    https.enable_server_certificate_verification(true);
    return answer(https.Get(path.c_str()));
  }
  httplib::Client http("127.0.0.1", port);
  return answer(http.Get(path.c_str()));
}

// `daemon`'s /metrics, checked against the format.
inline Scrape ScrapeMetrics(const TestCluster& cluster, const std::string& daemon) {
  auto [status, body] = MetricsGet(cluster, daemon, "/metrics");
  EXPECT_EQ(status, 200);
  Scrape s = Scrape::Parse(body);
  EXPECT_TRUE(s.errors.empty()) << ::testing::PrintToString(s.errors);
  return s;
}

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_METRICS_SCRAPE_H_
