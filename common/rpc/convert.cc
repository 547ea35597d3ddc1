// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace repvar {

absl::StatusOr<TensorSpec> SpecFromProto(const v1::TensorSpec& proto) {
  TensorSpec spec;
  if (proto.dtype() == v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError("dtype is unset (DTYPE_UNSPECIFIED)");
  }
  REPVAR_ASSIGN_OR_RETURN(spec.dtype, DTypeFromInt(proto.dtype()));
  spec.dims.assign(proto.dims().begin(), proto.dims().end());
  REPVAR_RETURN_IF_ERROR(spec.ByteSize().status());
  return spec;
}

void SpecToProto(const TensorSpec& spec, v1::TensorSpec* proto) {
  proto->set_dtype(static_cast<v1::DType>(spec.dtype));
  proto->mutable_dims()->Assign(spec.dims.begin(), spec.dims.end());
}

void HeaderToProto(const Tensor& t, v1::TensorHeader* proto) {
  SpecToProto(t.spec, proto->mutable_spec());
  proto->set_byte_size(t.bytes.size());
  proto->set_checksum(t.checksum);
}

absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto) {
  REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(proto.header().spec()));
  const std::string& data = proto.data();
  if (proto.header().byte_size() != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor header says ",
                                                   proto.header().byte_size(),
                                                   " bytes, the message carries ", data.size()));
  }
  REPVAR_ASSIGN_OR_RETURN(Tensor t, Tensor::FromBytes(spec, BytesOf(data)));
  if (t.checksum != proto.header().checksum()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor checksum mismatch: header says ",
                                                   proto.header().checksum(), ", bytes give ",
                                                   t.checksum));
  }
  return t;
}

void TensorToProto(const Tensor& t, v1::Tensor* proto) {
  HeaderToProto(t, proto->mutable_header());
  proto->set_data(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

absl::StatusOr<Initializer> InitializerFromProto(const v1::Initializer& proto) {
  Initializer init;
  using K = InitializerKind;
  auto check_gen = [](v1::RandomGenerator g) -> absl::Status {
    if (g == v1::RANDOM_GENERATOR_UNSPECIFIED || g == v1::RANDOM_GENERATOR_SPLITMIX64_V1) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown random generator ", g));
  };
  switch (proto.kind_case()) {
    case v1::Initializer::KIND_NOT_SET:
      init.kind = K::kNone;
      break;
    case v1::Initializer::kConstant:
      init.kind = K::kConstant;
      init.constant = proto.constant();
      break;
    case v1::Initializer::kZeros:
      init.kind = K::kZeros;
      break;
    case v1::Initializer::kOnes:
      init.kind = K::kOnes;
      break;
    case v1::Initializer::kValue: {
      init.kind = K::kValue;
      REPVAR_ASSIGN_OR_RETURN(Tensor t, TensorFromProto(proto.value()));
      init.value = std::make_shared<const Tensor>(std::move(t));
      break;
    }
    case v1::Initializer::kRandomNormal:
      REPVAR_RETURN_IF_ERROR(check_gen(proto.random_normal().generator()));
      init.kind = K::kRandomNormal;
      init.a = proto.random_normal().mean();
      init.b = proto.random_normal().stddev();
      init.seed = proto.random_normal().seed();
      break;
    case v1::Initializer::kRandomUniform:
      REPVAR_RETURN_IF_ERROR(check_gen(proto.random_uniform().generator()));
      init.kind = K::kRandomUniform;
      init.a = proto.random_uniform().minval();
      init.b = proto.random_uniform().maxval();
      init.seed = proto.random_uniform().seed();
      break;
  }
  return init;
}

void InitializerToProto(const Initializer& init, v1::Initializer* proto) {
  using K = InitializerKind;
  switch (init.kind) {
    case K::kNone:
      break;
    case K::kConstant:
      proto->set_constant(init.constant);
      break;
    case K::kZeros:
      proto->set_zeros(true);
      break;
    case K::kOnes:
      proto->set_ones(true);
      break;
    case K::kValue:
      if (init.value) TensorToProto(*init.value, proto->mutable_value());
      break;
    case K::kRandomNormal: {
      auto* r = proto->mutable_random_normal();
      r->set_mean(init.a);
      r->set_stddev(init.b);
      r->set_seed(init.seed);
      r->set_generator(v1::RANDOM_GENERATOR_SPLITMIX64_V1);
      break;
    }
    case K::kRandomUniform: {
      auto* r = proto->mutable_random_uniform();
      r->set_minval(init.a);
      r->set_maxval(init.b);
      r->set_seed(init.seed);
      r->set_generator(v1::RANDOM_GENERATOR_SPLITMIX64_V1);
      break;
    }
  }
}

void ChunkToProto(uint64_t offset, std::span<const std::byte> piece, v1::TensorChunk* proto) {
  proto->set_offset(offset);
  proto->set_data(reinterpret_cast<const char*>(piece.data()), piece.size());
  proto->set_checksum(Checksum(piece));
}

absl::StatusOr<ChunkAssembler> StartAssembly(const v1::TensorHeader& header,
                                             const std::string& inline_data) {
  REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(header.spec()));
  REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, ChunkAssembler::Start(spec, header.byte_size(),
                                                                  header.checksum(), UINT64_MAX));
  if (!inline_data.empty()) {
    auto bytes = BytesOf(inline_data);
    REPVAR_RETURN_IF_ERROR(a.Add(0, bytes, Checksum(bytes)));
  }
  return a;
}

absl::Status AddChunk(ChunkAssembler& assembler, const v1::TensorChunk& chunk) {
  return assembler.Add(chunk.offset(), BytesOf(chunk.data()), chunk.checksum());
}

uint64_t Digest(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return Checksum(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
}

}  // namespace repvar
