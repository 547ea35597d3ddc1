// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_BASE_RANDOM_H_
#define REPVAR_COMMON_BASE_RANDOM_H_

#include <cstdint>

namespace repvar {

// A random non-zero 64-bit number (worker incarnations, request ids).
// Thread-safe.
uint64_t RandomNonZero64();

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_RANDOM_H_
