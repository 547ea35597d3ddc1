// SPDX-License-Identifier: Apache-2.0
#include "common/tensor.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace repvar {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kMmapThreshold = 2 << 20;

template <typename T>
T Load(const std::byte* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void Store(std::byte* p, int64_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

}  // namespace

absl::StatusOr<DType> DTypeFromInt(int value) {
  if (value >= 1 && value <= 6) return static_cast<DType>(value);
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype ", value,
                   "; supported: float32, float16, bfloat16, float64, int32, int64"));
}

size_t ItemSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

bool IsFloating(DType dtype) { return dtype != DType::kInt32 && dtype != DType::kInt64; }

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

uint64_t Checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

namespace {

// Large mappings released by Buffers, kept resident for reuse: a variable
// rewritten again and again then costs no page faults (BENCHMARKS.md: the
// first touch of a page costs more than the copy into it). Bounded in bytes;
// the oldest mapping goes first. Thread-safe.
class MappingPool {
 public:
  static MappingPool& Get() {
    static MappingPool* pool = new MappingPool();
    return *pool;
  }
  struct Mapping {
    void* p = nullptr;
    size_t mapped = 0;
    int fd = -1;  // a memfd for shared mappings, else -1
  };
  // A released mapping of `mapped` bytes of the same kind, or p == nullptr.
  Mapping Take(size_t mapped, bool shared) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->mapped == mapped && (it->fd >= 0) == shared) {
        Mapping m = *it;
        free_.erase(it);
        held_ -= mapped;
        return m;
      }
    }
    return Mapping{};
  }
  void Give(Mapping m) {
    std::vector<Mapping> evict;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(m);
      held_ += m.mapped;
      while (held_ > cap_ && !free_.empty()) {
        evict.push_back(free_.front());
        held_ -= free_.front().mapped;
        free_.erase(free_.begin());
      }
    }
    for (const Mapping& e : evict) {
      munmap(e.p, e.mapped);
      if (e.fd >= 0) close(e.fd);
    }
  }
  void SetCap(size_t cap) {
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = cap;
  }

 private:
  std::mutex mu_;
  std::vector<Mapping> free_;
  size_t held_ = 0;
  size_t cap_ = size_t{1} << 30;
};

size_t RoundToHugePage(size_t n) {
  return (n + kMmapThreshold - 1) / kMmapThreshold * kMmapThreshold;
}

}  // namespace

void SetBufferPoolCapacity(size_t bytes) { MappingPool::Get().SetCap(bytes); }

absl::StatusOr<Buffer> Buffer::Allocate(size_t size) {
  Buffer b;
  if (size == 0) return b;
  if (size >= kMmapThreshold) {
    size_t mapped = RoundToHugePage(size);
    void* p = MappingPool::Get().Take(mapped, /*shared=*/false).p;
    if (p == nullptr) {
      p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes"));
      }
      madvise(p, mapped, MADV_HUGEPAGE);
      // Pre-fault now, with huge pages where the kernel gives them, so that
      // the hot path later copies into resident memory.
      volatile char* c = static_cast<char*>(p);
      for (size_t off = 0; off < mapped; off += 4096) c[off] = 0;
    }
    b.data_ = static_cast<std::byte*>(p);
    b.mapped_ = mapped;
  } else {
    b.data_ = static_cast<std::byte*>(::operator new(size, std::align_val_t(kAlign), std::nothrow));
    if (b.data_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes"));
    }
  }
  b.size_ = size;
  return b;
}

absl::StatusOr<Buffer> Buffer::AllocateShared(size_t size) {
  Buffer b;
  const size_t mapped = RoundToHugePage(std::max<size_t>(size, 1));
  MappingPool::Mapping m = MappingPool::Get().Take(mapped, /*shared=*/true);
  if (m.p == nullptr) {
    m.fd = memfd_create("repvar-tensor", MFD_CLOEXEC);
    if (m.fd < 0) return absl::ResourceExhaustedError("memfd_create failed");
    if (ftruncate(m.fd, static_cast<off_t>(mapped)) != 0) {
      close(m.fd);
      return absl::ResourceExhaustedError(absl::StrCat("cannot size a ", mapped, "-byte memfd"));
    }
    // MAP_POPULATE: the pages exist (and are resident) before anyone writes.
    m.p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, m.fd, 0);
    if (m.p == MAP_FAILED) {
      close(m.fd);
      return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " shared bytes"));
    }
    m.mapped = mapped;
  }
  b.data_ = static_cast<std::byte*>(m.p);
  b.mapped_ = m.mapped;
  b.fd_ = m.fd;
  b.size_ = size;
  return b;
}

void Buffer::Release() {
  if (data_ == nullptr) return;
  if (mapped_ > 0) {
    MappingPool::Get().Give({data_, mapped_, fd_});
  } else {
    ::operator delete(data_, std::align_val_t(kAlign));
  }
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
  fd_ = -1;
}

Buffer::~Buffer() { Release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

absl::StatusOr<Tensor> Tensor::ForOverwrite(const TensorSpec& spec) {
  auto size = spec.ByteSize();
  if (!size.ok()) return size.status();
  auto buf = Buffer::Allocate(static_cast<size_t>(*size));
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

absl::StatusOr<ChunkAssembler> ChunkAssembler::Start(const TensorSpec& spec, uint64_t byte_size,
                                                     uint64_t checksum, uint64_t max_bytes) {
  auto size = spec.ByteSize();
  if (!size.ok()) return size.status();
  if (static_cast<uint64_t>(*size) != byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor header says ", byte_size, " bytes but ",
                                                   spec.ToString(), " needs ", *size));
  }
  if (byte_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor of ", byte_size, " bytes exceeds the limit of ", max_bytes));
  }
  auto buf = Buffer::Allocate(byte_size);
  if (!buf.ok()) return buf.status();
  ChunkAssembler a;
  a.tensor_.spec = spec;
  a.tensor_.bytes = *std::move(buf);
  a.expected_checksum_ = checksum;
  a.state_.reset(XXH3_createState());
  XXH3_64bits_reset(a.state_.get());
  return a;
}

ChunkAssembler::~ChunkAssembler() = default;

absl::Status ChunkAssembler::Add(uint64_t offset, std::span<const std::byte> data,
                                 uint64_t checksum) {
  if (offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk out of order: offset ", offset, ", expected ", received_));
  }
  if (data.size() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", data.size(), " bytes exceeds ", kMaxChunkBytes));
  }
  if (data.empty()) return absl::InvalidArgumentError("empty chunk");
  if (data.size() > tensor_.bytes.size() - received_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk at ", offset, " of ", data.size(),
                                                   " bytes overruns the tensor of ",
                                                   tensor_.bytes.size(), " bytes"));
  }
  if (Checksum(data) != checksum) {
    return absl::InvalidArgumentError(absl::StrCat("checksum mismatch in chunk at ", offset));
  }
  std::memcpy(tensor_.bytes.data() + received_, data.data(), data.size());
  XXH3_64bits_update(state_.get(), data.data(), data.size());
  received_ += data.size();
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ChunkAssembler::Finish() {
  if (received_ != tensor_.bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor truncated: got ", received_, " of ", tensor_.bytes.size(), " bytes"));
  }
  uint64_t sum = XXH3_64bits_digest(state_.get());
  if (sum != expected_checksum_) {
    return absl::InvalidArgumentError(absl::StrCat("tensor checksum mismatch: header says ",
                                                   expected_checksum_, ", bytes give ", sum));
  }
  tensor_.checksum = sum;
  return std::move(tensor_);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00;  // overflow to inf
  if (absx < 0x38800000u) {                       // subnormal or zero
    float a = std::bit_cast<float>(absx);
    // Scale so that the half subnormal unit is 1, then round to nearest even.
    float scaled = a * 16777216.0f;  // 2^24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return sign | static_cast<uint16_t>(m);
  }
  uint32_t exp = ((absx >> 23) - 127 + 15) << 10;
  uint32_t man = absx & 0x7fffff;
  uint32_t h = exp | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float BFloat16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBFloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

double LoadElement(const Tensor& t, int64_t i) {
  const std::byte* p = t.bytes.data();
  switch (t.spec.dtype) {
    case DType::kFloat32:
      return Load<float>(p, i);
    case DType::kFloat64:
      return Load<double>(p, i);
    case DType::kFloat16:
      return HalfToFloat(Load<uint16_t>(p, i));
    case DType::kBFloat16:
      return BFloat16ToFloat(Load<uint16_t>(p, i));
    case DType::kInt32:
      return Load<int32_t>(p, i);
    case DType::kInt64:
      return static_cast<double>(Load<int64_t>(p, i));
  }
  return 0;
}

void StoreElement(Tensor& t, int64_t i, double v) {
  std::byte* p = t.bytes.data();
  switch (t.spec.dtype) {
    case DType::kFloat32:
      Store<float>(p, i, static_cast<float>(v));
      return;
    case DType::kFloat64:
      Store<double>(p, i, v);
      return;
    case DType::kFloat16:
      Store<uint16_t>(p, i, FloatToHalf(static_cast<float>(v)));
      return;
    case DType::kBFloat16:
      Store<uint16_t>(p, i, FloatToBFloat16(static_cast<float>(v)));
      return;
    case DType::kInt32:
      Store<int32_t>(p, i, static_cast<int32_t>(std::floor(v)));
      return;
    case DType::kInt64:
      Store<int64_t>(p, i, static_cast<int64_t>(std::floor(v)));
      return;
  }
}

int64_t FirstNonFinite(const Tensor& t) {
  if (!IsFloating(t.spec.dtype)) return -1;
  int64_t n = static_cast<int64_t>(t.bytes.size() / ItemSize(t.spec.dtype));
  const std::byte* p = t.bytes.data();
  switch (t.spec.dtype) {
    case DType::kFloat32:
      for (int64_t i = 0; i < n; ++i) {
        if ((Load<uint32_t>(p, i) & 0x7f800000u) == 0x7f800000u) return i;
      }
      return -1;
    case DType::kFloat64:
      for (int64_t i = 0; i < n; ++i) {
        if ((Load<uint64_t>(p, i) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) return i;
      }
      return -1;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) {
        if ((Load<uint16_t>(p, i) & 0x7c00) == 0x7c00) return i;
      }
      return -1;
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) {
        if ((Load<uint16_t>(p, i) & 0x7f80) == 0x7f80) return i;
      }
      return -1;
    default:
      return -1;
  }
}

namespace {
template <typename T>
void AddLoop(const std::byte* a, const std::byte* b, std::byte* out, int64_t n, int sign) {
  for (int64_t i = 0; i < n; ++i) {
    T x = Load<T>(a, i), y = Load<T>(b, i);
    T r;
    if constexpr (std::is_integral_v<T>) {
      // Wrap around like TensorFlow's integer arithmetic (no UB).
      using U = std::make_unsigned_t<T>;
      r = static_cast<T>(sign > 0 ? static_cast<U>(x) + static_cast<U>(y)
                                  : static_cast<U>(x) - static_cast<U>(y));
    } else {
      r = sign > 0 ? x + y : x - y;
    }
    Store<T>(out, i, r);
  }
}
}  // namespace

absl::StatusOr<Tensor> AddScaled(const Tensor& a, const Tensor& b, int sign) {
  if (!(a.spec == b.spec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("operand ", b.spec.ToString(), " does not match ", a.spec.ToString()));
  }
  auto buf = Buffer::Allocate(a.bytes.size());
  if (!buf.ok()) return buf.status();
  Tensor out;
  out.spec = a.spec;
  out.bytes = *std::move(buf);
  int64_t n = static_cast<int64_t>(a.bytes.size() / ItemSize(a.spec.dtype));
  const std::byte* pa = a.bytes.data();
  const std::byte* pb = b.bytes.data();
  std::byte* po = out.bytes.data();
  switch (a.spec.dtype) {
    case DType::kFloat32:
      AddLoop<float>(pa, pb, po, n, sign);
      break;
    case DType::kFloat64:
      AddLoop<double>(pa, pb, po, n, sign);
      break;
    case DType::kInt32:
      AddLoop<int32_t>(pa, pb, po, n, sign);
      break;
    case DType::kInt64:
      AddLoop<int64_t>(pa, pb, po, n, sign);
      break;
    case DType::kFloat16:
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) {
        double x = LoadElement(a, i), y = LoadElement(b, i);
        float r = static_cast<float>(x) + (sign > 0 ? 1.0f : -1.0f) * static_cast<float>(y);
        StoreElement(out, i, r);
      }
      break;
  }
  out.UpdateChecksum();
  return out;
}

}  // namespace repvar

namespace repvar {

void TuneMallocForBulkTransfers() {
  // Keep large blocks (gRPC's message buffers) in the heap instead of fresh
  // mappings, and do not hand freed memory straight back to the kernel.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest value glibc accepts
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace repvar
