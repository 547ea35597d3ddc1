// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_RPC_ARENA_ALLOCATOR_H_
#define REPVAR_COMMON_RPC_ARENA_ALLOCATOR_H_

#include <grpcpp/support/message_allocator.h>

#include "common/base/arena_message.h"

namespace repvar {

// Hands a callback unary method its request and response on one arena per
// call (see common/base/arena_message.h):
// `service.SetMessageAllocatorFor_Method(&allocator)`. Outlives the server.
// Thread-safe (it holds nothing).
template <typename Req, typename Resp>
class ArenaMessageAllocator final : public grpc::MessageAllocator<Req, Resp> {
 public:
  grpc::MessageHolder<Req, Resp>* AllocateMessages() override { return new Holder(); }

 private:
  class Holder final : public grpc::MessageHolder<Req, Resp> {
   public:
    Holder() : arena_(BatchArenaOptions(first_)) {
      this->set_request(google::protobuf::Arena::CreateMessage<Req>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Resp>(&arena_));
    }
    void Release() override { delete this; }

   private:
    alignas(8) char first_[kArenaFirstBlockBytes];
    google::protobuf::Arena arena_;
  };
};

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_ARENA_ALLOCATOR_H_
