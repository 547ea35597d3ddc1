// SPDX-License-Identifier: Apache-2.0
#include "server/core/collective_groups.h"

#include "absl/strings/str_cat.h"
#include "common/base/seeded_bug.h"
#include "common/tensor/tensor.h"

namespace repvar::server {

std::string CollectiveGroups::GroupLocked(const std::vector<GroupMember>& members) {
  std::string set;
  for (const GroupMember& m : members) {
    absl::StrAppend(&set, m.task.ToString(), "@", m.incarnation, ";");
  }
  std::string group = absl::StrCat(
      "g", BugSeeded(SeededBug::kGroupsReusedAcrossRestarts) ? 0 : life_, ".", generation_, "-",
      absl::Hex(Checksum(std::as_bytes(std::span(set.data(), set.size())))));
  if (group != group_) {
    if (!group_.empty()) store_.DeletePrefix(group_ + "/");
    group_ = group;
  }
  return group;
}

absl::Status CollectiveGroups::RunBroadcast(
    const std::vector<GroupMember>& members,
    absl::FunctionRef<absl::Status(const std::string& group, uint32_t tag)> run) {
  RankedLock lock(&mu_);
  const std::string group = GroupLocked(members);
  absl::Status s = run(group, next_tag_++);
  // A failed collective leaves gloo contexts unusable: the next one builds a
  // fresh group.
  if (!s.ok()) ++generation_;
  return s;
}

std::pair<std::string, uint32_t> CollectiveGroups::ForStep(const std::vector<GroupMember>& members,
                                                           size_t count, bool fresh) {
  RankedLock lock(&mu_);
  if (fresh) ++generation_;
  std::string group = GroupLocked(members);
  const uint32_t first = next_tag_;
  next_tag_ += static_cast<uint32_t>(count);
  return {group, first};
}

}  // namespace repvar::server
