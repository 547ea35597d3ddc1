// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_BASE_RANDOM_H_
#define REPVAR_COMMON_BASE_RANDOM_H_

#include <cstdint>

namespace repvar {

// A random non-zero 64-bit number (worker incarnations, request ids).
// Thread-safe.
uint64_t RandomNonZero64();

// A worker process's incarnation: the start time in microseconds, shifted
// left 12 bits, with 12 random bits below. A later process gets a larger
// one (unless the clock steps back), so the coordinator can tell a
// restarted worker, which supersedes the old registration, from a paused
// old process coming back, which is refused (contract T1). Thread-safe.
uint64_t NewIncarnation();

// What a step description shows of an incarnation (X1: others must not learn
// it): the first 8 bytes of its SHA-256, one-way.
uint64_t IncarnationDigest(uint64_t incarnation);

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_RANDOM_H_
