// SPDX-License-Identifier: Apache-2.0
// Reads served from the local worker's read table (docs/architecture.md,
// "Local reads"): the table is mapped read-only through /proc/<pid>/fd/<fd>;
// a read that it cannot serve goes to the coordinator.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/base/status_util.h"

namespace repvar {
namespace {

absl::StatusOr<std::string> AddressOf(Client& client, std::string worker) {
  if (worker.empty()) {
    const char* env = std::getenv("REPVAR_WORKER");
    if (env != nullptr) worker = env;
  }
  const auto colon = worker.rfind(':');
  int32_t task = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(worker.substr(colon + 1), &task)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UseLocalReads wants this host's worker as \"job:task\" (or $REPVAR_WORKER), not \"",
        worker, "\""));
  }
  REPVAR_ASSIGN_OR_RETURN(Topology topo, client.GetTopology());
  for (const TaskInfo& t : topo.tasks) {
    if (t.job == worker.substr(0, colon) && t.task == task) return t.address;
  }
  return absl::NotFoundError(absl::StrCat("worker ", worker, " is not live"));
}

}  // namespace

Client::Impl::LocalTable::~LocalTable() { munmap(map, size); }

bool Client::Impl::ReadLocal(const std::string& name, TensorValue& value) {
  LocalTable* table = local_table();
  if (table == nullptr) return false;
  LocalValue meta;
  if (table->view.Read(name, LocalReadClockNs, meta, value.bytes) !=
      LocalReadView::Outcome::kServed) {
    table->asked.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  table->served.fetch_add(1, std::memory_order_relaxed);
  value.dtype = meta.spec.dtype;
  value.shape = std::move(meta.spec.dims);
  value.version = meta.version;
  value.checksum = meta.checksum;
  return true;
}

std::optional<absl::StatusOr<ReadInfo>> Client::Impl::ReadLocalInto(const std::string& name,
                                                                    std::span<std::byte> out) {
  thread_local TensorValue value;
  if (!ReadLocal(name, value)) return std::nullopt;
  if (value.bytes.size() != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " holds ", value.bytes.size(),
                                                   " bytes; the buffer to read it into has ",
                                                   out.size()));
  }
  if (!out.empty()) std::memcpy(out.data(), value.bytes.data(), out.size());
  return ReadInfo{value.dtype, value.shape, value.version, value.checksum};
}

absl::Status Client::UseLocalReads(const std::string& worker) {
  REPVAR_ASSIGN_OR_RETURN(const std::string address, AddressOf(*this, worker));
  v1::MapLocalReadsResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + impl_->options().deadline));
    REPVAR_RETURN_IF_ERROR(FromGrpcStatus(
        impl_->Worker(address)->stub->MapLocalReads(&ctx, v1::MapLocalReadsRequest(), &resp)));
  }
  const std::string path = absl::StrCat("/proc/", resp.pid(), "/fd/", resp.fd());
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map the local read table of ", address, " (", path, ": ",
                     std::strerror(errno), "); is this trainer on the worker's host?"));
  }
  void* map = mmap(nullptr, resp.byte_size(), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (map == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map the local read table of ", address, ": ", std::strerror(err)));
  }
  auto view = LocalReadView::Open({static_cast<const std::byte*>(map), resp.byte_size()});
  if (!view.ok()) {
    munmap(map, resp.byte_size());
    return view.status();
  }
  impl_->set_local_table(
      std::make_unique<Impl::LocalTable>(map, resp.byte_size(), *std::move(view)));
  return absl::OkStatus();
}

Client::LocalReadStats Client::local_read_stats() const {
  Impl::LocalTable* table = impl_->local_table();
  if (table == nullptr) return {};
  return {table->served.load(std::memory_order_relaxed),
          table->asked.load(std::memory_order_relaxed)};
}

}  // namespace repvar
