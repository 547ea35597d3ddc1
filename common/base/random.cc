// SPDX-License-Identifier: Apache-2.0
#include "common/base/random.h"

#include <openssl/sha.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace repvar {

uint64_t RandomNonZero64() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          (static_cast<uint64_t>(getpid()) << 32));
  uint64_t v = 0;
  while (v == 0) v = rng();
  return v;
}

uint64_t NewIncarnation() {
  const uint64_t micros = static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  return (micros << 12) | (RandomNonZero64() & 0xfff) | 1;
}

uint64_t IncarnationDigest(uint64_t incarnation) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(incarnation >> (8 * i));
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(bytes, sizeof(bytes), digest);
  uint64_t out = 0;
  for (int i = 7; i >= 0; --i) out = (out << 8) | digest[i];
  return out;
}

}  // namespace repvar
