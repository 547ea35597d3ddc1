// SPDX-License-Identifier: Apache-2.0
// In-place access to a local replica (docs/architecture.md): the worker lends a
// buffer of its own (a memfd), the trainer maps it through /proc/<pid>/fd
// (and keeps the mapping for the next lease of the same buffer: MappingCache).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/step_scope_impl.h"
#include "common/base/status_util.h"

namespace repvar {

LocalMapping::Impl::~Impl() {
  if (data != nullptr) mappings->Release(data);
  if (lease != 0 && worker != nullptr) {  // not published: give the buffer back
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StepUnmapRequest req;
    req.set_lease(lease);
    v1::StepUnmapResponse resp;
    (void)worker->StepUnmap(&ctx, req, &resp);
  }
}

LocalMapping::LocalMapping(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalMapping::~LocalMapping() = default;
const std::string& LocalMapping::variable() const { return impl_->variable; }
int32_t LocalMapping::replica() const { return impl_->replica; }
bool LocalMapping::writable() const { return impl_->writable; }
uint64_t LocalMapping::checksum() const { return impl_->checksum; }
int64_t LocalMapping::version() const { return impl_->version; }
std::span<std::byte> LocalMapping::bytes() { return {impl_->data, impl_->size}; }
std::span<const std::byte> LocalMapping::bytes() const { return {impl_->data, impl_->size}; }

absl::StatusOr<std::unique_ptr<LocalMapping>> StepScope::Map(const std::string& name,
                                                             int32_t replica, MapMode mode) {
  REPVAR_ASSIGN_OR_RETURN(const StepVariable* var, impl_->Var(name));
  v1::StepMapRequest req;
  req.set_step(impl_->header.step);
  req.set_epoch(impl_->header.epoch);
  req.set_variable_id(var->id);
  req.set_replica(replica);
  req.set_layout_id(impl_->header.layout_id);
  req.set_barrier_timeout_ms(absl::ToInt64Milliseconds(impl_->header.barrier_timeout));
  req.set_write(mode != MapMode::kRead);
  req.set_initialize(mode == MapMode::kUpdate);
  v1::StepMapResponse resp;
  {
    grpc::ClientContext ctx;
    impl_->SetDeadline(&ctx);
    REPVAR_RETURN_IF_ERROR(FromGrpcStatus(impl_->worker->StepMap(&ctx, req, &resp)));
  }
  auto m = std::make_unique<LocalMapping::Impl>();
  m->worker = impl_->worker;
  m->mappings = &impl_->client->mappings();
  m->lease = resp.lease();
  m->variable = name;
  m->replica = replica;
  m->writable = mode != MapMode::kRead;
  m->size = resp.byte_size();
  m->checksum = resp.checksum();
  m->version = resp.version();
  // The worker's memfd, opened through /proc: works on the worker's host for
  // the same user.
  std::string path = absl::StrCat("/proc/", resp.pid(), "/fd/", resp.fd());
  int fd = open(path.c_str(), m->writable ? O_RDWR : O_RDONLY);
  if (fd < 0) {
    impl_->map_failed = true;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map ", name, "/", replica, " from the worker's memory (", path, ": ",
                     std::strerror(errno), "); is this trainer on the worker's host?"));
  }
  if (m->size > 0) {
    absl::StatusOr<std::byte*> data = m->mappings->Acquire(fd, m->size, m->writable);
    close(fd);
    if (!data.ok()) {
      return absl::Status(data.status().code(), absl::StrCat("cannot map ", name, "/", replica,
                                                             ": ", data.status().message()));
    }
    m->data = *data;
  } else {
    close(fd);
  }
  return std::unique_ptr<LocalMapping>(new LocalMapping(std::move(m)));
}

absl::Status StepScope::Publish(std::unique_ptr<LocalMapping> mapping) {
  return PublishMapping(std::move(mapping), std::nullopt);
}

absl::Status StepScope::PublishMapping(std::unique_ptr<LocalMapping> mapping,
                                       std::optional<uint64_t> checksum) {
  if (mapping == nullptr || !mapping->writable()) {
    return absl::InvalidArgumentError("only a kWrite or kUpdate mapping can be published");
  }
  LocalMapping::Impl& m = *mapping->impl_;
  v1::StepUnmapRequest req;
  req.set_lease(m.lease);
  req.set_publish(true);
  if (checksum) {
    req.set_checksum(*checksum);
  } else {
    req.set_hash_later(true);  // the worker hashes while this trainer goes on
  }
  v1::StepUnmapResponse resp;
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, m.size);
  absl::Status s = FromGrpcStatus(m.worker->StepUnmap(&ctx, req, &resp));
  m.lease = 0;  // published or refused: the worker has ended the lease either way
  return s;
}

}  // namespace repvar
