// SPDX-License-Identifier: Apache-2.0
// repvar-coordinator's settings: the defaults pass; each bad setting is
// refused naming its flag; each part gets the options the settings say.
#include "server/coordinator_options.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace repvar::server {
namespace {

using ::repvar::testing::StatusIs;

CoordinatorDaemonOptions OnDisk() {
  CoordinatorDaemonOptions o;
  o.data_dir = "/var/lib/repvar";
  return o;
}

TEST(CoordinatorOptionsTest, Defaults_WithADataDirOrEphemeral_AreValid) {
  EXPECT_OK(ValidateOptions(OnDisk()));
  CoordinatorDaemonOptions ephemeral;
  ephemeral.ephemeral = true;
  EXPECT_OK(ValidateOptions(ephemeral));
}

TEST(CoordinatorOptionsTest, EachBadSetting_RefusedNamingItsFlag) {
  const struct {
    std::function<void(CoordinatorDaemonOptions&)> spoil;
    const char* names;
  } cases[] = {
      {[](auto& o) { o.data_dir.clear(); }, "--data_dir"},
      {[](auto& o) { o.ephemeral = true; }, "--ephemeral"},
      {[](auto& o) { o.heartbeat_timeout = absl::ZeroDuration(); }, "--heartbeat_timeout"},
      {[](auto& o) { o.expected_tasks = "tpu_worker=3"; }, "--expected_tasks"},
      {[](auto& o) { o.expected_tasks = "TPU:3"; }, "--expected_tasks"},
      {[](auto& o) { o.idempotency_capacity = 0; }, "--idempotency_capacity"},
      {[](auto& o) { o.idempotency_window = absl::ZeroDuration(); }, "--idempotency_window"},
      {[](auto& o) { o.max_inflight_bytes = -1; }, "--max_inflight_bytes"},
      {[](auto& o) { o.max_variable_bytes = 0; }, "--max_variable_bytes"},
      {[](auto& o) { o.max_rpc_threads = 0; }, "--max_rpc_threads"},
      {[](auto& o) {
         o.checkpoint_every_steps = 5;
         o.checkpoint_keep = 0;
       },
       "--checkpoint_keep"},
      {[](auto& o) {
         o.data_dir.clear();
         o.ephemeral = true;
         o.checkpoint_every_steps = 5;
       },
       "--checkpoint_dir"},
  };
  for (const auto& c : cases) {
    CoordinatorDaemonOptions o = OnDisk();
    c.spoil(o);
    EXPECT_THAT(ValidateOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, c.names))
        << c.names;
  }
}

TEST(CoordinatorOptionsTest, ExpectedTasks_ParsedPerJob) {
  auto parsed = ParseExpectedTasks("tpu_worker:3,worker:1");
  ASSERT_OK(parsed);
  EXPECT_EQ(*parsed, (std::map<std::string, int32_t>{{"tpu_worker", 3}, {"worker", 1}}));
  EXPECT_TRUE(ParseExpectedTasks("")->empty());
  EXPECT_THAT(ParseExpectedTasks("tpu_worker:-1"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CoordinatorOptionsTest, PartsGetWhatTheSettingsSay) {
  CoordinatorDaemonOptions o = OnDisk();
  o.heartbeat_timeout = absl::Seconds(2);
  o.expected_tasks = "tpu_worker:2";
  o.max_inflight_bytes = 1 << 20;
  o.data_plane = false;
  o.unsafe_no_fsync = true;
  o.checkpoint_every = 0;  // at least 1
  const CoordinatorOptions core = CoreOptionsOf(o);
  EXPECT_EQ(core.membership.heartbeat_timeout, absl::Seconds(2));
  EXPECT_EQ(core.membership.expected_tasks.at("tpu_worker"), 2);
  EXPECT_EQ(core.max_inflight_bytes, uint64_t{1} << 20);
  EXPECT_FALSE(core.replication.data_plane);
  const RocksStateLogOptions store = StoreOptionsOf(o);
  EXPECT_EQ(store.dir, "/var/lib/repvar");
  EXPECT_FALSE(store.sync);
  EXPECT_EQ(store.checkpoint_every, 1u);
  EXPECT_FALSE(CheckpointerOptionsOf(o).has_value());
  o.checkpoint_every_steps = 10;
  ASSERT_TRUE(CheckpointerOptionsOf(o).has_value());
  EXPECT_EQ(CheckpointerOptionsOf(o)->dir, "/var/lib/repvar/checkpoints");
  o.checkpoint_dir = "/ckpt";
  EXPECT_EQ(CheckpointerOptionsOf(o)->dir, "/ckpt");
}

}  // namespace
}  // namespace repvar::server
