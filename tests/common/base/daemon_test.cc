// SPDX-License-Identifier: Apache-2.0
// X1 until TLS: plaintext gRPC only where no other host can reach it,
// unless the operator says --insecure.
#include "common/base/daemon.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(Plaintext, LoopbackAddresses_AreLoopback_EveryInterfaceIsNot) {
  for (const char* a : {"127.0.0.1:0", "127.1.2.3:7070", "localhost:7070", "[::1]:7070"}) {
    EXPECT_TRUE(IsLoopback(a)) << a;
  }
  for (const char* a : {"0.0.0.0:7070", "[::]:7070", ":7070", "10.0.0.5:7070", "128.0.0.1:1",
                        "example.com:7070", "[2001:db8::1]:7070"}) {
    EXPECT_FALSE(IsLoopback(a)) << a;
  }
}

TEST(Plaintext, NonLoopbackRefusedWithoutInsecure_AllowedWithIt_LoopbackAlways) {
  EXPECT_OK(CheckPlaintextAllowed("listen_address", "127.0.0.1:0", false));
  EXPECT_THAT(CheckPlaintextAllowed("listen_address", "0.0.0.0:7070", false),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--listen_address=0.0.0.0:7070"));
  EXPECT_OK(CheckPlaintextAllowed("listen_address", "0.0.0.0:7070", true));
}

}  // namespace
}  // namespace repvar
