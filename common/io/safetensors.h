// SPDX-License-Identifier: Apache-2.0
// The safetensors file format (huggingface/safetensors), in which repvar
// saves and restores checkpoints (repvarctl save / restore):
//
//   [N: u64, little-endian][N bytes of JSON, padded with spaces to 8][data]
//
//   {"__metadata__": {"key": "value", ...},          string -> string only
//    "<tensor>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
//    ...}
//
// Offsets count from the start of the data; the tensors lie back to back,
// in order, from 0 to the end of the file. Dtype names: F32, F16, BF16,
// F64, I32, I64 (the ones repvar has).
//
// The writer streams: it writes the header at once (every tensor's size is
// known from its dtype and shape), then takes the data in pieces of any
// size, and publishes the file only when it is complete (tmp -> fsync ->
// rename -> fsync the directory). The reader maps the file and checks
// everything the format promises before it hands out a byte.
#ifndef REPVAR_COMMON_IO_SAFETENSORS_H_
#define REPVAR_COMMON_IO_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "repvar/types.h"

namespace repvar::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data offsets: [begin, end)
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
};

// "F32", "BF16", ...; and back. Errors: INVALID_ARGUMENT naming the dtype.
absl::StatusOr<std::string> SafetensorsDType(DType dtype);
absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name);

// Refuses a header larger than this (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

class SafetensorsWriter {
 public:
  // Starts `path` (as a temporary file beside it) with a header listing
  // `entries` in that order; their offsets are filled in here. Errors:
  // INVALID_ARGUMENT (empty or duplicate names, "__metadata__", a negative
  // dimension), and the file system's.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      std::string path, std::vector<SafetensorsEntry> entries,
      const std::map<std::string, std::string>& metadata);
  // Removes the temporary file unless Commit succeeded.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next bytes of the data (the tensors in order, any piece size).
  // Errors: OUT_OF_RANGE (more than the tensors hold), the file system's.
  absl::Status Write(std::span<const std::byte> bytes);
  // Every byte written: syncs the file, renames it to `path`, syncs the
  // directory. Errors: FAILED_PRECONDITION (bytes missing), the file
  // system's.
  absl::Status Commit();

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t written() const { return written_; }

 private:
  SafetensorsWriter(std::string path, std::string tmp, int fd, std::vector<SafetensorsEntry> e,
                    uint64_t data_bytes);
  const std::string path_;
  const std::string tmp_;
  int fd_;
  const std::vector<SafetensorsEntry> entries_;
  const uint64_t data_bytes_;
  uint64_t written_ = 0;
  bool committed_ = false;
};

class SafetensorsReader {
 public:
  // Maps `path` and checks it: header length and JSON, dtype names, every
  // tensor's offsets against its dtype and shape, the tensors back to back
  // from 0 to the end of the file, metadata values strings. Errors:
  // DATA_LOSS naming what is wrong (and where), NOT_FOUND, the file
  // system's.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // In data order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's bytes, mapped (valid while the reader lives).
  std::span<const std::byte> Data(const SafetensorsEntry& entry) const;

 private:
  SafetensorsReader() = default;
  // Maps the whole file. Errors: DATA_LOSS (shorter than a header length),
  // NOT_FOUND, the file system's.
  absl::Status Map(const std::string& path);

  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  const std::byte* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint64_t data_start_ = 0;
};

}  // namespace repvar::io

#endif  // REPVAR_COMMON_IO_SAFETENSORS_H_
