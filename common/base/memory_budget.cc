// SPDX-License-Identifier: Apache-2.0
#include "common/base/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace repvar {

absl::Status MemoryBudget::Charge(uint64_t bytes, absl::string_view what) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  while (true) {
    if (bytes > capacity_ || used > capacity_ - bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " more bytes of memory; ", used, " of the ",
                       capacity_, " ", name_, " lends to requests are in use (retry later)"));
    }
    if (used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed)) break;
  }
  if (parent_ != nullptr) {
    if (absl::Status s = parent_->Charge(bytes, what); !s.ok()) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      return s;
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<MemoryBudget> ConnectionBudgets::For(const std::string& peer) {
  MutexLock lock(&mu_);
  if (auto b = budgets_[peer].lock()) return b;
  // Forget connections that hold nothing now.
  for (auto it = budgets_.begin(); it != budgets_.end();) {
    it = it->second.expired() ? budgets_.erase(it) : std::next(it);
  }
  auto b = std::make_shared<MemoryBudget>(
      per_connection_, daemon_, absl::StrCat("this daemon's share for connection ", peer));
  budgets_[peer] = b;
  return b;
}

std::optional<uint64_t> MemoryBudget::ParseCgroupMemoryLimit(absl::string_view text) {
  uint64_t limit = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &limit)) return std::nullopt;  // "max"
  if (limit == 0 || limit >= (uint64_t{1} << 62)) return std::nullopt;  // v1: no limit
  return limit;
}

uint64_t MemoryBudget::MemoryLimit() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t memory = pages > 0 && page > 0
                        ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                        : uint64_t{8} << 30;
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!std::getline(in, text)) continue;
    if (std::optional<uint64_t> limit = ParseCgroupMemoryLimit(text)) {
      memory = std::min(memory, *limit);
    }
  }
  return memory;
}

}  // namespace repvar
