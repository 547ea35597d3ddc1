// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/step_info_cache.h"

#include "common/rpc/to_proto.h"

namespace repvar::server {

void StepInfoCache::Answer(const SharedStep& step, uint64_t known_layout, bool shared_lists,
                           v1::StepInfo* resp) {
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
    const int form = shared_lists ? 1 : 0;
    if (source_[form] != step.info) {
      proto_[form].Clear();
      StepInfoToProto(info, &proto_[form], shared_lists);
      source_[form] = step.info;
    }
    *resp = proto_[form];
  }
  resp->set_state(static_cast<v1::StepState>(step.state));
}

}  // namespace repvar::server
