// SPDX-License-Identifier: Apache-2.0
#include "common/base/memory_budget.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace repvar {

absl::Status MemoryBudget::Charge(uint64_t bytes, absl::string_view what) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  while (true) {
    if (bytes > capacity_ || used > capacity_ - bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " more bytes of memory; ", used, " of the ",
                       capacity_, " this daemon lends to requests are in use (retry later)"));
    }
    if (used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed)) {
      return absl::OkStatus();
    }
  }
}

uint64_t MemoryBudget::HalfOfPhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return uint64_t{4} << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
}

}  // namespace repvar
