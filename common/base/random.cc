// SPDX-License-Identifier: Apache-2.0
#include "common/base/random.h"

#include <unistd.h>

#include <random>

namespace repvar {

uint64_t RandomNonZero64() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          (static_cast<uint64_t>(getpid()) << 32));
  uint64_t v = 0;
  while (v == 0) v = rng();
  return v;
}

}  // namespace repvar
