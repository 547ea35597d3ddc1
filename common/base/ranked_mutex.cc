// SPDX-License-Identifier: Apache-2.0
#include "common/base/ranked_mutex.h"

#include <array>
#include <cstdio>
#include <cstdlib>

namespace repvar {
namespace {

// The ranked locks this thread holds, in acquisition order.
constexpr int kMaxHeld = 16;
thread_local std::array<const RankedMutex*, kMaxHeld> held;
thread_local int depth = 0;

[[noreturn]] void OrderViolation(const RankedMutex& taking, const RankedMutex& holding) {
  std::fprintf(stderr,
               "lock order violation: taking %s (rank %d) while holding %s (rank %d); see the "
               "written lock order (server/core/lock_order.h)\n",
               taking.name(), taking.rank(), holding.name(), holding.rank());
  std::abort();
}

}  // namespace

void RankedMutex::Lock() {
  for (int i = 0; i < depth; ++i) {
    const RankedMutex& h = *held[i];
    if (h.rank() >= rank_) {
      OrderViolation(*this, h);
    }
  }
  mu_.Lock();
  if (depth == kMaxHeld) {
    std::fprintf(stderr, "more than %d ranked locks held by one thread\n", kMaxHeld);
    std::abort();
  }
  held[depth++] = this;
}

void RankedMutex::AssertNoneHeld(const char* taking) {
  if (depth > 0) {
    std::fprintf(stderr,
                 "lock order violation: taking %s while holding %s (rank %d); see the "
                 "written lock order (server/core/lock_order.h)\n",
                 taking, held[depth - 1]->name(), held[depth - 1]->rank());
    std::abort();
  }
}

void RankedMutex::Unlock() {
  for (int i = depth - 1; i >= 0; --i) {
    if (held[i] == this) {
      for (int j = i; j + 1 < depth; ++j) held[j] = held[j + 1];
      --depth;
      break;
    }
  }
  mu_.Unlock();
}

}  // namespace repvar
