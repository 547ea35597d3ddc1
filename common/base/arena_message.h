// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_BASE_ARENA_MESSAGE_H_
#define REPVAR_COMMON_BASE_ARENA_MESSAGE_H_

#include <google/protobuf/arena.h>

#include <cstddef>
#include <memory>

namespace repvar {

// Batched messages (a thousand variables' headers, specs, names and
// placements) are thousands of small objects: built on, or parsed into, a
// protobuf arena they cost a bump each and are freed at once, instead of a
// malloc and a free per string and sub-message (glibc's share was about a
// third of a batched call's CPU).
//
// The first block is part of the object that owns the arena (a small
// message allocates nothing more); the blocks after it double up to 1 MiB.
inline constexpr size_t kArenaFirstBlockBytes = 2048;

inline google::protobuf::ArenaOptions BatchArenaOptions(char* first_block) {
  google::protobuf::ArenaOptions options;
  options.initial_block = first_block;
  options.initial_block_size = kArenaFirstBlockBytes;
  options.max_block_size = 1 << 20;
  return options;
}

// A message of type M on its own arena. Movable, not copyable.
template <typename M>
class ArenaMessage {
 public:
  ArenaMessage()
      : owned_(std::make_unique<Owned>()),
        message_(google::protobuf::Arena::CreateMessage<M>(&owned_->arena)) {}
  M* get() { return message_; }
  const M* get() const { return message_; }
  M* operator->() { return message_; }
  const M* operator->() const { return message_; }
  M& operator*() { return *message_; }
  const M& operator*() const { return *message_; }

 private:
  struct Owned {
    alignas(8) char first[kArenaFirstBlockBytes];
    google::protobuf::Arena arena{BatchArenaOptions(first)};
  };
  std::unique_ptr<Owned> owned_;
  M* message_;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_ARENA_MESSAGE_H_
