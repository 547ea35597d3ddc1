// SPDX-License-Identifier: Apache-2.0
#include "common/io/checkpoint_format.h"

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace repvar::io {
namespace {

using Json = nlohmann::json;

constexpr char kFormatKey[] = "repvar.format";
constexpr char kStepKey[] = "repvar.last_committed_step";
constexpr char kVariablesKey[] = "repvar.variables";
constexpr char kUninitializedKey[] = "repvar.uninitialized";

std::optional<Aggregation> AggregationNamed(const std::string& name) {
  for (Aggregation a : {Aggregation::kNone, Aggregation::kSum, Aggregation::kMean,
                        Aggregation::kOnlyFirstReplica}) {
    if (name == AggregationName(a)) return a;
  }
  return std::nullopt;
}

}  // namespace

std::map<std::string, std::string> CheckpointMetadata(
    int64_t last_committed_step, const std::vector<CheckpointVariable>& variables,
    const std::vector<std::string>& uninitialized) {
  Json described = Json::object();
  for (const CheckpointVariable& v : variables) {
    Json& d = described[v.name];
    d["version"] = v.version;
    if (v.checksum) d["checksum"] = absl::StrCat(absl::Hex(*v.checksum));
    d["aggregation"] = AggregationName(v.aggregation);
    d["replica_count"] = v.replica_count;
    d["trainable"] = v.trainable;
    d["allow_nonfinite"] = v.allow_nonfinite;
    d["collections"] = v.collections;
  }
  return {{kFormatKey, "1"},
          {kStepKey, absl::StrCat(last_committed_step)},
          {kVariablesKey, described.dump()},
          {kUninitializedKey, Json(uninitialized).dump()}};
}

absl::StatusOr<std::map<std::string, CheckpointVariable>> CheckpointVariables(
    const std::map<std::string, std::string>& metadata) {
  std::map<std::string, CheckpointVariable> out;
  auto it = metadata.find(kVariablesKey);
  if (it == metadata.end()) return out;  // a file repvar did not write
  auto bad = [](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checkpoint metadata ", kVariablesKey, ": ", what));
  };
  Json vars = Json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (vars.is_discarded() || !vars.is_object()) return bad("not a JSON object");
  for (auto v = vars.begin(); v != vars.end(); ++v) {
    const Json& j = v.value();
    CheckpointVariable s;
    s.name = v.key();
    if (!j.is_object()) return bad(absl::StrCat(v.key(), " is not an object"));
    if (j.contains("version") && j["version"].is_number_integer()) {
      s.version = j["version"].get<int64_t>();
    }
    if (j.contains("checksum")) {
      uint64_t c = 0;
      if (!j["checksum"].is_string() ||
          !absl::SimpleHexAtoi(j["checksum"].get<std::string>(), &c)) {
        return bad(absl::StrCat(v.key(), ": checksum is not a hex string"));
      }
      s.checksum = c;
    }
    if (j.contains("replica_count") && j["replica_count"].is_number_integer()) {
      s.replica_count = j["replica_count"].get<int32_t>();
    }
    if (j.contains("aggregation")) {
      auto a = j["aggregation"].is_string() ? AggregationNamed(j["aggregation"].get<std::string>())
                                            : std::nullopt;
      if (!a) return bad(absl::StrCat(v.key(), ": unknown aggregation"));
      s.aggregation = *a;
    }
    if (j.contains("trainable") && j["trainable"].is_boolean()) s.trainable = j["trainable"];
    if (j.contains("allow_nonfinite") && j["allow_nonfinite"].is_boolean()) {
      s.allow_nonfinite = j["allow_nonfinite"];
    }
    if (j.contains("collections") && j["collections"].is_array()) {
      for (const Json& c : j["collections"]) {
        if (c.is_string()) s.collections.push_back(c.get<std::string>());
      }
    }
    out.emplace(v.key(), std::move(s));
  }
  return out;
}

}  // namespace repvar::io
