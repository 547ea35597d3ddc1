// SPDX-License-Identifier: Apache-2.0
#include "common/base/ranked_mutex.h"

#include <array>
#include <cstdio>
#include <cstdlib>

namespace repvar {
namespace {

// The ranked locks the calling thread holds, in acquisition order.
sync_internal::HeldLocks& Held() {
  if (sync_internal::Cooperative* c = sync_internal::Current()) return c->Held();
  thread_local sync_internal::HeldLocks held;
  return held;
}

[[noreturn]] void OrderViolation(const RankedMutex& taking, const RankedMutex& holding) {
  std::fprintf(stderr,
               "lock order violation: taking %s (rank %d) while holding %s (rank %d); see the "
               "written lock order (server/core/lock_order.h)\n",
               taking.name(), taking.rank(), holding.name(), holding.rank());
  std::abort();
}

}  // namespace

void RankedMutex::Lock() {
  sync_internal::HeldLocks& held = Held();
  for (int i = 0; i < held.depth; ++i) {
    const RankedMutex& h = *held.locks[i];
    if (h.rank() >= rank_) {
      OrderViolation(*this, h);
    }
  }
  mu_.Lock();
  if (held.depth == sync_internal::HeldLocks::kMax) {
    std::fprintf(stderr, "more than %d ranked locks held by one thread\n",
                 sync_internal::HeldLocks::kMax);
    std::abort();
  }
  held.locks[held.depth++] = this;
}

void RankedMutex::AssertNoneHeld(const char* taking) {
  const sync_internal::HeldLocks& held = Held();
  if (held.depth > 0) {
    std::fprintf(stderr,
                 "lock order violation: taking %s while holding %s (rank %d); see the "
                 "written lock order (server/core/lock_order.h)\n",
                 taking, held.locks[held.depth - 1]->name(), held.locks[held.depth - 1]->rank());
    std::abort();
  }
}

void RankedMutex::Unlock() {
  sync_internal::HeldLocks& held = Held();
  for (int i = held.depth - 1; i >= 0; --i) {
    if (held.locks[i] == this) {
      for (int j = i; j + 1 < held.depth; ++j) held.locks[j] = held.locks[j + 1];
      --held.depth;
      break;
    }
  }
  mu_.Unlock();
}

}  // namespace repvar
