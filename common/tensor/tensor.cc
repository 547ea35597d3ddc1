// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/tensor.h"

#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace repvar {
namespace {

// XXH3 at the CPU's vector width where libxxhash dispatches (x86-64), the
// portable build elsewhere: the same values.
#if defined(__x86_64__)
uint64_t Xxh3(const void* p, size_t n) { return XXH3_64bits_dispatch(p, n); }
void Xxh3Update(XXH3_state_t* s, const void* p, size_t n) { XXH3_64bits_update_dispatch(s, p, n); }
#else
uint64_t Xxh3(const void* p, size_t n) { return XXH3_64bits(p, n); }
void Xxh3Update(XXH3_state_t* s, const void* p, size_t n) { XXH3_64bits_update(s, p, n); }
#endif

}  // namespace

absl::StatusOr<int64_t> TensorSpec::NumElements() const {
  if (dims.size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", dims.size(), " exceeds the maximum of ", kMaxRank));
  }
  int64_t n = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("dims[", i, "] is negative (", dims[i], ")"));
    }
    if (__builtin_mul_overflow(n, dims[i], &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape [", absl::StrJoin(dims, ","), "] has more than 2^63-1 elements"));
    }
  }
  return n;
}

absl::StatusOr<int64_t> TensorSpec::ByteSize() const {
  auto n = NumElements();
  if (!n.ok()) return n.status();
  int64_t bytes;
  if (__builtin_mul_overflow(*n, static_cast<int64_t>(ItemSize(dtype)), &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape [", absl::StrJoin(dims, ","), "] overflows int64 bytes"));
  }
  return bytes;
}

std::string TensorSpec::ToString() const {
  return absl::StrCat(DTypeName(dtype), "[", absl::StrJoin(dims, ","), "]");
}

absl::Status CheckByteSize(const TensorSpec& spec, uint64_t byte_size) {
  auto size = spec.ByteSize();
  if (!size.ok()) return size.status();
  if (static_cast<uint64_t>(*size) != byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor header says ", byte_size, " bytes but ",
                                                   spec.ToString(), " needs ", *size));
  }
  return absl::OkStatus();
}

uint64_t Checksum(std::span<const std::byte> bytes) { return Xxh3(bytes.data(), bytes.size()); }

ChecksumStream::ChecksumStream() : state_(XXH3_createState(), &XXH3_freeState) {
  if (state_ == nullptr) throw std::bad_alloc();
  Reset();
}

void ChecksumStream::Update(std::span<const std::byte> bytes) {
  Xxh3Update(state_.get(), bytes.data(), bytes.size());
}

uint64_t ChecksumStream::Digest() const { return XXH3_64bits_digest(state_.get()); }

void ChecksumStream::Reset() { XXH3_64bits_reset(state_.get()); }

uint64_t Tensor::ChunkChecksum(uint64_t offset, size_t size) const {
  const ChunkChecksums& kept = chunk_checksums;
  if (kept.chunk_bytes != 0 && offset % kept.chunk_bytes == 0 && offset < bytes.size()) {
    const uint64_t i = offset / kept.chunk_bytes;
    if (i < kept.sums.size() &&
        size == std::min<uint64_t>(kept.chunk_bytes, bytes.size() - offset)) {
      return kept.sums[i];
    }
  }
  return Checksum(bytes.span().subspan(offset, size));
}

absl::StatusOr<Tensor> Tensor::ForOverwrite(const TensorSpec& spec, bool shared) {
  auto size = spec.ByteSize();
  if (!size.ok()) return size.status();
  auto buf = shared ? Buffer::AllocateShared(static_cast<size_t>(*size))
                    : Buffer::Allocate(static_cast<size_t>(*size));
  if (!buf.ok()) return buf.status();
  Tensor t;
  t.spec = spec;
  t.bytes = *std::move(buf);
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(const TensorSpec& spec) {
  auto t = ForOverwrite(spec);
  if (!t.ok()) return t.status();
  if (t->bytes.size() > 0) std::memset(t->bytes.data(), 0, t->bytes.size());
  t->UpdateChecksum();
  return t;
}

absl::StatusOr<Tensor> Tensor::FromBytes(const TensorSpec& spec, std::span<const std::byte> data) {
  auto size = spec.ByteSize();
  if (!size.ok()) return size.status();
  if (static_cast<uint64_t>(*size) != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", spec.ToString(), " needs ", *size, " bytes, got ", data.size()));
  }
  auto buf = Buffer::Allocate(data.size());
  if (!buf.ok()) return buf.status();
  Tensor t;
  t.spec = spec;
  t.bytes = *std::move(buf);
  if (!data.empty()) std::memcpy(t.bytes.data(), data.data(), data.size());
  t.UpdateChecksum();
  return t;
}

}  // namespace repvar
