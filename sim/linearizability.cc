// SPDX-License-Identifier: Apache-2.0
#include "sim/linearizability.h"

#include <xxhash.h>

#include <algorithm>
#include <string>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace repvar::sim {
namespace {

const char* KindName(RegisterOp::Kind k) {
  switch (k) {
    case RegisterOp::Kind::kAssign:
      return "assign";
    case RegisterOp::Kind::kAdd:
      return "add";
    case RegisterOp::Kind::kRead:
      return "read";
  }
  return "?";
}

// The register after `op` from `s`, and whether `op`'s answer (if known)
// is what it would have said.
bool Step(const RegisterState& s, const RegisterOp& op, RegisterState* next) {
  *next = s;
  switch (op.kind) {
    case RegisterOp::Kind::kAssign:
      next->value = op.arg;
      ++next->version;
      break;
    case RegisterOp::Kind::kAdd:
      if (op.arg.size() != s.value.size()) return false;
      for (size_t i = 0; i < s.value.size(); ++i) next->value[i] = s.value[i] + op.arg[i];
      ++next->version;
      break;
    case RegisterOp::Kind::kRead:
      break;
  }
  if (op.ret == RegisterOp::kNever) return true;
  return op.version == next->version && op.checksum == ChecksumOf(next->value);
}

class Search {
 public:
  Search(const std::vector<RegisterOp>& ops) : ops_(ops), done_(ops.size(), false) {}

  bool Run(const RegisterState& s) {
    if (left_ == 0) return true;
    // Only an operation called before every remaining one returned may come next.
    int64_t first_return = RegisterOp::kNever;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!done_[i]) first_return = std::min(first_return, ops_[i].ret);
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (done_[i] || ops_[i].call > first_return) continue;
      RegisterState next;
      if (!Step(s, ops_[i], &next)) continue;
      done_[i] = true;
      --left_;
      if (seen_.insert(Key(next)).second && Run(next)) return true;
      done_[i] = false;
      ++left_;
      deepest_ = std::max(deepest_, ops_.size() - left_ + 1);
    }
    return false;
  }
  size_t deepest() const { return deepest_; }
  void Start() { left_ = ops_.size(); }

 private:
  // The set of operations placed and the register: what the rest depends on.
  std::string Key(const RegisterState& s) const {
    std::string k(done_.size(), '0');
    for (size_t i = 0; i < done_.size(); ++i) k[i] = done_[i] ? '1' : '0';
    absl::StrAppend(&k, ":", s.version, ":", ChecksumOf(s.value));
    return k;
  }

  const std::vector<RegisterOp>& ops_;
  std::vector<bool> done_;
  size_t left_ = 0;
  size_t deepest_ = 0;
  std::unordered_set<std::string> seen_;
};

}  // namespace

uint64_t ChecksumOf(const std::vector<float>& value) {
  return XXH3_64bits(value.data(), value.size() * sizeof(float));
}

absl::Status CheckLinearizable(const std::vector<RegisterOp>& history,
                               const RegisterState& initial) {
  std::vector<RegisterOp> ops = history;
  std::sort(ops.begin(), ops.end(),
            [](const RegisterOp& a, const RegisterOp& b) { return a.call < b.call; });
  Search search(ops);
  search.Start();
  if (search.Run(initial)) return absl::OkStatus();
  // Name the operations around where every order got stuck.
  std::vector<std::string> around;
  const size_t from = search.deepest() > 3 ? search.deepest() - 3 : 0;
  for (size_t i = from; i < std::min(ops.size(), search.deepest() + 3); ++i) {
    const RegisterOp& o = ops[i];
    around.push_back(
        absl::StrCat(KindName(o.kind), " [", o.call, ", ",
                     o.ret == RegisterOp::kNever ? std::string("?") : absl::StrCat(o.ret), "] -> ",
                     o.ret == RegisterOp::kNever ? std::string("unknown")
                                                 : absl::StrCat("v", o.version, " #", o.checksum)));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("not linearizable: ", ops.size(), " operations, no order gets past about ",
                   search.deepest(), "; near there: ", absl::StrJoin(around, "; ")));
}

}  // namespace repvar::sim
