// SPDX-License-Identifier: Apache-2.0
// The safetensors format as the reference implementation lays it out and
// checks it: written files read back byte for byte, with the layout the
// format fixes; damaged files are refused naming what is wrong.
#include "common/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar::io {
namespace {

using ::repvar::testing::StatusIs;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Two tensors: "a" F32[2,3] and "b/c" I64[2], plus metadata.
std::string WriteSample(const std::string& path) {
  std::vector<SafetensorsEntry> entries = {{"a", DType::kFloat32, {2, 3}},
                                           {"b/c", DType::kInt64, {2}}};
  auto w = SafetensorsWriter::Create(path, entries, {{"repvar.step", "7"}});
  EXPECT_OK(w);
  std::string data(24 + 16, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 1);
  // In uneven pieces: the writer does not care where a piece ends.
  EXPECT_OK((*w)->Write(Bytes(data.substr(0, 5))));
  EXPECT_OK((*w)->Write(Bytes(data.substr(5, 30))));
  EXPECT_OK((*w)->Write(Bytes(data.substr(35))));
  EXPECT_OK((*w)->Commit());
  return data;
}

TEST(SafetensorsTest, Layout_LittleEndianHeaderLength_PaddedJson_OffsetsBackToBack) {
  repvar::testing::TempDir dir;
  const std::string path = dir.path() + "/m.safetensors";
  const std::string data = WriteSample(path);
  const std::string file = Slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(file.size(), 8 + n + data.size());
  const std::string header = file.substr(8, n);
  EXPECT_NE(header.find(R"("__metadata__":{"repvar.step":"7"})"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("b/c":{"dtype":"I64","shape":[2],"data_offsets":[24,40]})"),
            std::string::npos)
      << header;
  EXPECT_EQ(file.substr(8 + n), data);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(::getpid())));
}

TEST(SafetensorsTest, RoundTrip_EveryTensorAndTheMetadata) {
  repvar::testing::TempDir dir;
  const std::string path = dir.path() + "/m.safetensors";
  const std::string data = WriteSample(path);
  auto r = SafetensorsReader::Open(path);
  ASSERT_OK(r);
  ASSERT_EQ((*r)->entries().size(), 2u);
  const SafetensorsEntry& a = (*r)->entries()[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.dtype, DType::kFloat32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  auto bytes = (*r)->Data((*r)->entries()[1]);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
            data.substr(24));
  EXPECT_EQ((*r)->metadata().at("repvar.step"), "7");
}

TEST(SafetensorsTest, EveryDTypeName_RoundTrips_UnknownRefused) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                  DType::kInt32, DType::kInt64}) {
    auto name = SafetensorsDType(d);
    ASSERT_OK(name);
    auto back = DTypeFromSafetensors(*name);
    ASSERT_OK(back);
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(*SafetensorsDType(DType::kBFloat16), "BF16");
  EXPECT_THAT(DTypeFromSafetensors("U8"), StatusIs(absl::StatusCode::kInvalidArgument, "U8"));
}

TEST(SafetensorsTest, Writer_TooManyOrTooFewBytes_Refused_NoFilePublished) {
  repvar::testing::TempDir dir;
  const std::string path = dir.path() + "/m.safetensors";
  {
    auto w = SafetensorsWriter::Create(path, {{"a", DType::kFloat32, {2}}}, {});
    ASSERT_OK(w);
    EXPECT_THAT((*w)->Write(Bytes(std::string(9, 'x'))),
                StatusIs(absl::StatusCode::kOutOfRange, "more bytes"));
    ASSERT_OK((*w)->Write(Bytes(std::string(4, 'x'))));
    EXPECT_THAT((*w)->Commit(), StatusIs(absl::StatusCode::kFailedPrecondition, "4 of 8"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the temporary file is removed";
  EXPECT_THAT(SafetensorsWriter::Create(
                  path, {{"a", DType::kFloat32, {1}}, {"a", DType::kFloat32, {1}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "used twice"));
  EXPECT_THAT(SafetensorsWriter::Create(path, {{"a", DType::kFloat32, {-1}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
}

// Each damage is refused with DATA_LOSS naming it; a valid file next to
// them opens (the checks do not refuse everything).
TEST(SafetensorsTest, DamagedFiles_DataLossNamingTheDamage) {
  repvar::testing::TempDir dir;
  const std::string good = dir.path() + "/good.safetensors";
  WriteSample(good);
  ASSERT_OK(SafetensorsReader::Open(good));
  const std::string file = Slurp(good);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  const std::string header = file.substr(8, n);
  auto with_header = [&](std::string h) {
    h.append((8 - h.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(h.size() >> (8 * i));
    return out + h + file.substr(8 + n);
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string h = header;
    const size_t at = h.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return with_header(h.replace(at, from.size(), to));
  };
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"truncated data", file.substr(0, file.size() - 1), "truncated"},
      {"extra data", file + "x", "truncated or extended"},
      {"header longer than the file", std::string("\xff\xff\xff\x00\x00\x00\x00\x00", 8) + "{}",
       "header length"},
      {"no header length", std::string("abc"), "no header length"},
      {"not JSON", with_header("{\"a\":"), "not a JSON object"},
      {"unknown dtype", replaced("\"F32\"", "\"U8\" "), "U8"},
      {"offsets not matching the shape", replaced("[2,3]", "[2,4]"), "do not hold"},
      {"a gap between tensors", replaced("[24,40]", "[32,48]"), "starts at 32"},
      {"metadata not a string", replaced("\"7\"", "7"), "not a string"},
      {"offsets overflowing", replaced("[24,40]", "[18446744073709551608,16]"), "do not hold"},
      {"a shape overflowing", replaced("[2,3]", "[4611686018427387904,8]"), "do not hold"},
      {"entries overlapping", replaced("[24,40]", "[16,32]"), "starts at 16"},
      {"an entry named twice", replaced("\"b/c\"", "\"a\""), "named twice"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.path() + "/bad.safetensors";
    Spit(path, c.bytes);
    EXPECT_THAT(SafetensorsReader::Open(path), StatusIs(absl::StatusCode::kDataLoss, c.message))
        << c.what;
  }
  EXPECT_THAT(SafetensorsReader::Open(dir.path() + "/missing"),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace repvar::io
