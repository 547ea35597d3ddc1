// SPDX-License-Identifier: Apache-2.0
#include "common/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/tensor/dtype.h"

namespace repvar::io {
namespace {

using Json = nlohmann::ordered_json;

constexpr struct {
  DType dtype;
  const char* name;
} kDTypes[] = {
    {DType::kFloat32, "F32"}, {DType::kFloat16, "F16"}, {DType::kBFloat16, "BF16"},
    {DType::kFloat64, "F64"}, {DType::kInt32, "I32"},   {DType::kInt64, "I64"},
};

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Bytes of a tensor of `shape` and `dtype`; INVALID_ARGUMENT on a negative
// dimension or an overflow.
absl::StatusOr<uint64_t> ByteSize(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t n = ItemSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError("tensor size overflows");
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("safetensors file ", path, ": ", what));
}

}  // namespace

absl::StatusOr<std::string> SafetensorsDType(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return std::string(d.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", static_cast<int>(dtype), " has no safetensors name"));
}

absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return d.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "safetensors dtype \"", name, "\" is not one repvar holds (F32, F16, BF16, F64, I32, I64)"));
}

// ---- Writer ----

SafetensorsWriter::SafetensorsWriter(std::string path, std::string tmp, int fd,
                                     std::vector<SafetensorsEntry> e, uint64_t data_bytes)
    : path_(std::move(path)),
      tmp_(std::move(tmp)),
      fd_(fd),
      entries_(std::move(e)),
      data_bytes_(data_bytes) {}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    std::string path, std::vector<SafetensorsEntry> entries,
    const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (SafetensorsEntry& e : entries) {
    if (e.name.empty() || e.name == "__metadata__" || !names.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name \"", e.name, "\" is empty, reserved or used twice"));
    }
    auto name = SafetensorsDType(e.dtype);
    if (!name.ok()) return name.status();
    auto bytes = ByteSize(e.dtype, e.shape);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(e.name, ": ", bytes.status().message()));
    }
    e.begin = offset;
    e.end = offset + *bytes;
    offset = e.end;
    header[e.name] = Json{{"dtype", *name}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-aligned

  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp);
  std::unique_ptr<SafetensorsWriter> w(
      new SafetensorsWriter(std::move(path), tmp, fd, std::move(entries), offset));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  if (absl::Status s = WriteAll(fd, len, sizeof(len), tmp); !s.ok()) return s;
  if (absl::Status s = WriteAll(fd, text.data(), text.size(), tmp); !s.ok()) return s;
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

absl::Status SafetensorsWriter::Write(std::span<const std::byte> bytes) {
  if (bytes.size() > data_bytes_ - written_) {
    return absl::OutOfRangeError(absl::StrCat("safetensors ", path_, ": ", bytes.size(),
                                              " more bytes after ", written_, " of ", data_bytes_));
  }
  if (absl::Status s = WriteAll(fd_, bytes.data(), bytes.size(), tmp_); !s.ok()) return s;
  written_ += bytes.size();
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Commit() {
  if (written_ != data_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors ", path_, ": ", written_, " of ", data_bytes_, " bytes written"));
  }
  if (::fsync(fd_) != 0) return Errno("fsync", tmp_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return Errno("close", tmp_);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) return Errno("rename to", path_);
  committed_ = true;
  const size_t slash = path_.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path_.substr(0, std::max<size_t>(slash, 1));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("open directory", dir);
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return Errno("fsync directory", dir);
  return absl::OkStatus();
}

// ---- Reader ----

SafetensorsReader::~SafetensorsReader() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_bytes_);
}

std::span<const std::byte> SafetensorsReader::Data(const SafetensorsEntry& entry) const {
  return {map_ + data_start_ + entry.begin, entry.bytes()};
}

namespace {

// The header's JSON object. A name twice would be read as its last entry,
// the bytes of the first unnamed: refused.
absl::StatusOr<Json> ParseHeader(const std::string& path, const char* text, uint64_t n) {
  std::set<std::string> keys;
  std::string twice;
  const Json::parser_callback_t check_keys = [&](int depth, Json::parse_event_t event,
                                                 Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && !keys.insert(parsed).second &&
        twice.empty()) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  Json header = Json::parse(text, text + n, check_keys, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Bad(path, "the header is not a JSON object");
  }
  if (!twice.empty()) return Bad(path, absl::StrCat("tensor \"", twice, "\" is named twice"));
  return header;
}

absl::Status ReadMetadata(const std::string& path, const Json& value,
                          std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) return Bad(path, "__metadata__ is not an object");
  for (auto kv = value.begin(); kv != value.end(); ++kv) {
    if (!kv.value().is_string()) {
      return Bad(path, absl::StrCat("__metadata__[\"", kv.key(), "\"] is not a string"));
    }
    (*metadata)[kv.key()] = kv.value().get<std::string>();
  }
  return absl::OkStatus();
}

// One tensor's entry: its dtype, shape and offsets, which must hold them.
absl::StatusOr<SafetensorsEntry> ReadEntry(const std::string& path, const std::string& key,
                                           const Json& value) {
  SafetensorsEntry e;
  e.name = key;
  if (!value.is_object() || !value.contains("dtype") || !value["dtype"].is_string() ||
      !value.contains("shape") || !value["shape"].is_array() || !value.contains("data_offsets") ||
      !value["data_offsets"].is_array() || value["data_offsets"].size() != 2) {
    return Bad(path, absl::StrCat("tensor \"", key, "\" lacks dtype, shape or data_offsets"));
  }
  auto dtype = DTypeFromSafetensors(value["dtype"].get<std::string>());
  if (!dtype.ok())
    return Bad(path, absl::StrCat("tensor \"", key, "\": ", dtype.status().message()));
  e.dtype = *dtype;
  for (const Json& d : value["shape"]) {
    if (!d.is_number_unsigned()) {
      return Bad(path, absl::StrCat("tensor \"", key, "\": a dimension is not a natural number"));
    }
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  for (const Json& o : value["data_offsets"]) {
    if (!o.is_number_unsigned()) {
      return Bad(path, absl::StrCat("tensor \"", key, "\": an offset is not a natural number"));
    }
  }
  e.begin = value["data_offsets"][0].get<uint64_t>();
  e.end = value["data_offsets"][1].get<uint64_t>();
  auto bytes = ByteSize(e.dtype, e.shape);
  if (!bytes.ok() || e.end < e.begin || e.end - e.begin != *bytes) {
    return Bad(path, absl::StrCat("tensor \"", key, "\": offsets [", e.begin, ", ", e.end,
                                  ") do not hold its dtype and shape"));
  }
  return e;
}

// The tensors, sorted by offset, lie back to back from 0 to `data_bytes`.
absl::Status CheckLayout(const std::string& path, std::vector<SafetensorsEntry>& entries,
                         uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  uint64_t at = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin != at) {
      return Bad(path, absl::StrCat("tensor \"", e.name, "\" starts at ", e.begin,
                                    " where the data before it ends at ", at));
    }
    at = e.end;
  }
  if (at != data_bytes) {
    return Bad(path, absl::StrCat("the tensors hold ", at, " bytes of data, the file ", data_bytes,
                                  " (truncated or extended)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  REPVAR_RETURN_IF_ERROR(r->Map(path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(r->map_[i]);
  if (n > kMaxSafetensorsHeaderBytes || n > r->map_bytes_ - 8) {
    return Bad(path, absl::StrCat("header length ", n, " does not fit the file (", r->map_bytes_,
                                  " bytes) or the limit"));
  }
  r->data_start_ = 8 + n;
  REPVAR_ASSIGN_OR_RETURN(const Json header,
                          ParseHeader(path, reinterpret_cast<const char*>(r->map_) + 8, n));
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      REPVAR_RETURN_IF_ERROR(ReadMetadata(path, it.value(), &r->metadata_));
      continue;
    }
    REPVAR_ASSIGN_OR_RETURN(SafetensorsEntry e, ReadEntry(path, it.key(), it.value()));
    r->entries_.push_back(std::move(e));
  }
  REPVAR_RETURN_IF_ERROR(CheckLayout(path, r->entries_, r->map_bytes_ - r->data_start_));
  return r;
}

absl::Status SafetensorsReader::Map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = Errno("stat", path);
    ::close(fd);
    return s;
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  if (map_bytes_ < 8) {
    ::close(fd);
    return Bad(path, absl::StrCat("only ", map_bytes_, " bytes: no header length"));
  }
  void* m = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Errno("map", path);
  map_ = static_cast<const std::byte*>(m);
  return absl::OkStatus();
}

}  // namespace repvar::io
