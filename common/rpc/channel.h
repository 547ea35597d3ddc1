// SPDX-License-Identifier: Apache-2.0
// Opening a client channel the same way everywhere (coordinator, workers,
// client library). Header-only so that repvar_common never links gRPC.
#ifndef REPVAR_COMMON_GRPC_CHANNEL_H_
#define REPVAR_COMMON_GRPC_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace repvar {

// Messages stay below 32 MiB by design (chunks are at most 4 MiB); the limit
// leaves headroom for batched calls.
inline constexpr int kMaxMessageBytes = 64 << 20;

inline std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace repvar

#endif  // REPVAR_COMMON_GRPC_CHANNEL_H_
