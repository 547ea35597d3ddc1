// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/step_info_cache.h"

#include "common/rpc/to_proto.h"

namespace repvar::server {

void StepInfoCache::Answer(const SharedStep& step, uint64_t known_layout, v1::StepInfo* resp) {
  const StepInfo& info = *step.info;
  if (known_layout != 0 && known_layout == info.layout_id) {
    // The caller holds the layout: the step's header only.
    StepInfo header;
    header.step = info.step;
    header.epoch = info.epoch;
    header.barrier_timeout = info.barrier_timeout;
    header.begun = info.begun;
    header.layout_id = info.layout_id;
    header.layout_omitted = true;
    StepInfoToProto(header, resp);
  } else {
    absl::MutexLock lock(&mu_);
    if (source_ != step.info) {
      proto_.Clear();
      StepInfoToProto(info, &proto_);
      source_ = step.info;
    }
    *resp = proto_;
  }
  resp->set_state(static_cast<v1::StepState>(step.state));
}

}  // namespace repvar::server
