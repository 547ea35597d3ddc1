// SPDX-License-Identifier: Apache-2.0
// The repvar C++ client. No gRPC or protobuf type appears here.
//
//   auto client = repvar::Client::Connect({});          // $REPVAR_COORDINATOR_ADDRESS
//   auto topo = (*client)->WaitForTopology(absl::Seconds(30));
//   {
//     repvar::ReplicatedScope scope(6, "model");          // like the seed's replicated_scope
//     repvar::VariableSpec w{.name = "w", .dtype = repvar::DType::kFloat32, .shape = {4}};
//     w.initializer = repvar::InitializerSpec::Zeros();
//     (*client)->CreateVariable(w);                       // "model/w", 6 replicas
//   }
//   (*client)->Initialize({"model/w"});
//   std::vector<float> v = {1, 2, 3, 4};
//   (*client)->Assign("model/w", std::span<const float>(v));
//   auto back = (*client)->Read("model/w");               // version 2, bit-exact
//
// Every call has a deadline. Mutating calls carry a request id generated once
// per call, so the client retries them on UNAVAILABLE without applying them
// twice; reads retry the same way. Thread-safe: one Client per process is
// enough, and any number of threads may use it.
#ifndef REPVAR_CLIENT_H_
#define REPVAR_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "repvar/types.h"

namespace repvar {

template <typename T>
constexpr std::optional<DType> DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kInt32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::kInt64;
  return std::nullopt;  // uint16_t is ambiguous (float16 or bfloat16)
}

struct ClientOptions {
  // host:port; empty: $REPVAR_COORDINATOR_ADDRESS.
  std::string coordinator_address;
  // Security (docs/operations.md, "Security"). Each empty field takes its
  // environment variable; all empty: plaintext without a token (a cluster on
  // loopback without token files).
  //   tls_ca_file    $REPVAR_TLS_CA: the PEM CA that signed the cluster's
  //                  certificates; set, every call is TLS
  //   tls_cert_file  $REPVAR_TLS_CERT, tls_key_file $REPVAR_TLS_KEY: an
  //                  optional client certificate and its key
  //   token_file     $REPVAR_TOKEN_FILE: the first line is the bearer token
  //                  (trainer or admin) sent on every call
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string token_file;
  // Per attempt, for calls that move little data; bulk calls add time per byte.
  absl::Duration deadline = absl::Seconds(30);
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  size_t chunk_bytes = size_t{1} << 20;
  // Keep gRPC's large message buffers resident (mallopt: no fresh mappings
  // below 32 MiB, no trimming). The first touch of a fresh page costs more
  // than copying into it, so bulk transfers run several times faster. This
  // changes the process's malloc settings; turn it off if that matters.
  bool tune_malloc = true;
  // StepScope::Map keeps its mappings of a worker's buffers after a lease
  // ends, up to this many bytes, and maps the same buffer again for free
  // (the worker lends the same few buffers step after step; a fresh
  // mapping's first touch of each page costs more than copying into it).
  // A kept mapping holds its buffer's memory until it is dropped, least
  // recently used first, or the Client goes. 0: map and unmap every lease.
  size_t mapping_cache_bytes = size_t{1} << 30;
};

// How a variable gets its first value; generated once by the coordinator.
struct InitializerSpec {
  using Kind = InitializerKind;
  Kind kind = Kind::kNone;
  double constant = 0;
  double a = 0;  // mean or minval
  double b = 0;  // stddev or maxval
  uint64_t seed = 0;
  std::vector<std::byte> value;  // kValue: raw bytes of the variable's dtype

  static InitializerSpec Zeros() { return Make(Kind::kZeros, 0, 0, 0, 0); }
  static InitializerSpec Ones() { return Make(Kind::kOnes, 0, 0, 0, 0); }
  static InitializerSpec Constant(double v) { return Make(Kind::kConstant, v, 0, 0, 0); }
  static InitializerSpec RandomNormal(double mean, double stddev, uint64_t seed) {
    return Make(Kind::kRandomNormal, 0, mean, stddev, seed);
  }
  static InitializerSpec RandomUniform(double lo, double hi, uint64_t seed) {
    return Make(Kind::kRandomUniform, 0, lo, hi, seed);
  }
  static InitializerSpec Make(Kind kind, double constant, double a, double b, uint64_t seed) {
    InitializerSpec s;
    s.kind = kind;
    s.constant = constant;
    s.a = a;
    s.b = b;
    s.seed = seed;
    return s;
  }
  template <typename T>
  static InitializerSpec Value(std::span<const T> v) {
    InitializerSpec s;
    s.kind = Kind::kValue;
    s.value.resize(v.size_bytes());
    if (!v.empty()) std::memcpy(s.value.data(), v.data(), v.size_bytes());
    return s;
  }
};

struct VariableSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // empty: scalar
  bool trainable = true;
  std::vector<std::string> collections;
  int32_t replica_count = 0;  // 0: from the enclosing ReplicatedScope, else 1
  Aggregation aggregation = Aggregation::kNone;
  bool allow_nonfinite = false;
  InitializerSpec initializer;  // not part of the variable's identity
};

struct ReplicaInfo {
  int32_t index = 0;
  std::string name;  // "<variable>/<index>"
  std::string device;
  std::string job;
  int32_t task = 0;
  int64_t version = 0;
  uint64_t checksum = 0;
  ReplicaState state = ReplicaState::kUninitialized;
};

struct VariableInfo {
  uint64_t id = 0;
  VariableSpec spec;  // initializer left empty
  int64_t version = 0;
  uint64_t checksum = 0;
  bool initialized = false;
  bool needs_resync = false;
  bool created = false;  // set by CreateVariable(s): false if it already existed
  std::vector<std::string> collections;
  std::vector<ReplicaInfo> replicas;
  std::vector<std::string> warnings;
};

struct TaskInfo {
  std::string job;
  int32_t task = 0;
  std::string address;
  std::vector<std::string> devices;
};
struct AcceleratorInfo {
  int32_t ordinal = 0;
  std::string device;
  std::string job;
  int32_t task = 0;
};
struct InfeedHost {
  std::string job;
  int32_t task = 0;
  std::string address;
  std::string cpu_device;  // where input is enqueued and output dequeued
};
struct Topology {
  int64_t version = 0;
  std::vector<TaskInfo> tasks;
  std::vector<AcceleratorInfo> accelerators;  // ordinal order
  std::optional<InfeedHost> infeed_host;
  std::vector<std::string> missing_tasks;
};

struct StepWorkerLatency {
  std::string job;
  int32_t task = 0;
  absl::Duration report;  // from BeginStep to its report
};

// The open step's progress per participant and the last resolutions
// (repvarctl steps and status).
struct StepsSummary {
  struct Participant {
    std::string task;  // "job:task"
    bool reported = false;
    bool finished = false;
    std::string last_activity;
  };
  struct Open {
    int64_t step = 0;
    uint64_t epoch = 0;
    absl::Duration barrier_timeout;
    int variables = 0;
    std::vector<Participant> participants;
  };
  struct Resolution {
    int64_t step = 0;
    uint64_t epoch = 0;
    bool committed = false;
    std::string error;  // when it failed
    int variables_changed = 0;
    int divergences_repaired = 0;
    std::vector<StepWorkerLatency> latencies;
  };
  int64_t last_committed_step = 0;
  std::optional<Open> open;
  std::vector<Resolution> recent;  // newest last
};
// A curve trainers publish (Client::PublishScalar): per step, the mean of
// what was published.
struct ScalarCurve {
  std::string name;
  std::vector<int64_t> steps;  // ascending
  std::vector<double> values;
};

// The whole cluster as an operator sees it (repvarctl status).
struct ClusterStatus {
  Topology topology;
  std::vector<VariableInfo> variables;  // by name, with their replicas' states
  // The last committed step, the open step's progress and the last
  // resolutions, one line each; and the same as data.
  std::vector<std::string> steps;
  StepsSummary steps_summary;
  bool draining = false;
  // Replicas found diverged and rewritten since the coordinator started, by
  // where: "step" (a step's vote), "verification" (a rejoining worker).
  std::map<std::string, int64_t> divergences_repaired;
  std::vector<ScalarCurve> scalars;  // by name
};

// A tensor value as the client sees it: dtype, shape and the raw bytes.
struct TensorValue {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  int64_t version = 0;
  uint64_t checksum = 0;

  template <typename T>
  std::span<const T> as() const {
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
};

// What ReadInto wrote into the caller's buffer: the value's metadata.
struct ReadInfo {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t version = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes written, checked end to end
};

struct WriteAck {
  int64_t version = 0;
  uint64_t checksum = 0;
  std::optional<TensorValue> value;  // the new value, when read_value was in effect
};

struct InitializedState {
  std::string name;
  bool initialized = false;
  std::vector<ReplicaInfo> replicas;
};

struct AssignItem {
  std::string name;
  AssignOp op = AssignOp::kAssign;
  std::span<const std::byte> bytes;  // of the variable's dtype and shape
  // Answer with the new value; unset: ReadValueByDefault(op).
  std::optional<bool> read_value;
};

// Sets the replica count and name prefix of every variable created inside it
// on this thread, like the seed's replicated_scope. Scopes nest: prefixes
// join with '/', the innermost replica count wins. RAII; not movable.
class ReplicatedScope {
 public:
  ReplicatedScope(int32_t replica_count, std::string prefix = "");
  ~ReplicatedScope();
  ReplicatedScope(const ReplicatedScope&) = delete;
  ReplicatedScope& operator=(const ReplicatedScope&) = delete;

  // The effective name and replica count for `spec` under the current scopes.
  static VariableSpec Apply(VariableSpec spec);
};

// Checkpoints: safetensors files (Client::SaveCheckpoint, RestoreCheckpoint;
// repvarctl save / restore). Every tensor is named after its variable; the
// file's "__metadata__" holds, as strings, "repvar.format" ("1"),
// "repvar.last_committed_step", "repvar.variables" (JSON: per variable its
// version, checksum, aggregation, replica_count, trainable, collections,
// allow_nonfinite) and "repvar.uninitialized" (JSON list of names not saved).
struct CheckpointProgress {
  std::string variable;  // the one being moved
  int variables_done = 0;
  int variables_total = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};
using CheckpointProgressFn = std::function<void(const CheckpointProgress&)>;
struct SaveResult {
  int variables = 0;
  uint64_t bytes = 0;
  int64_t last_committed_step = 0;
  std::vector<std::string> uninitialized;  // not in the file: they hold no value
};
struct RestoreOptions {
  // Replicas of the variables the restore creates; 0: each variable's count
  // in the file (1 for a file repvar did not write).
  int32_t replicas = 0;
  CheckpointProgressFn progress;
};
struct RestoreResult {
  int variables = 0;
  int created = 0;
  uint64_t bytes = 0;
};

class Client {
 public:
  // Connects lazily; fails only on bad options. Errors: INVALID_ARGUMENT
  // (no address given and $REPVAR_COORDINATOR_ADDRESS unset; a security
  // file that cannot be read or holds nothing usable).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  ~Client();

  const std::string& coordinator_address() const;

  absl::StatusOr<Topology> GetTopology();
  // Waits for every task the coordinator expects. Errors: DEADLINE_EXCEEDED
  // naming the missing tasks.
  absl::StatusOr<Topology> WaitForTopology(absl::Duration timeout);
  // Blocks until the topology version exceeds `after_version` or `timeout`
  // passes (then returns the current topology).
  absl::StatusOr<Topology> WatchTopology(int64_t after_version, absl::Duration timeout);

  // Applies the enclosing ReplicatedScope. Errors: INVALID_ARGUMENT,
  // FAILED_PRECONDITION (more replicas than accelerators), ALREADY_EXISTS.
  absl::StatusOr<VariableInfo> CreateVariable(VariableSpec spec);
  // One registry transaction for the whole batch (V6). `detail`
  // kBasic answers without the replicas (`VariableInfo::replicas` empty),
  // which is most of a large batch's answer; GetVariable has them.
  absl::StatusOr<std::vector<VariableInfo>> CreateVariables(
      std::vector<VariableSpec> specs, VariableDetail detail = VariableDetail::kFull);
  absl::StatusOr<VariableInfo> GetVariable(const std::string& name);
  absl::StatusOr<std::vector<VariableInfo>> ListVariables(
      const std::string& collection = "", VariableDetail detail = VariableDetail::kFull);
  // An operator's call (the coordinator's admin service). Errors: NOT_FOUND,
  // FAILED_PRECONDITION (the variable takes part in the open step).
  absl::Status DeleteVariable(const std::string& name);
  // An operator's call (the coordinator's admin service).
  absl::StatusOr<ClusterStatus> GetClusterStatus();
  // An operator's call: before maintenance, the coordinator refuses new
  // changes (create, delete, initialize, writes, new steps) with
  // UNAVAILABLE, which clients retry, and reports NOT_SERVING; reads and
  // the open step go on. `resume` undoes it.
  struct DrainState {
    bool draining = false;
    int64_t open_step = 0;  // the step still open, 0 when none
  };
  absl::StatusOr<DrainState> Drain(bool resume = false);

  // Initialize-if-uninitialized, with the initializer given at create.
  absl::StatusOr<std::vector<InitializeResult>> Initialize(const std::vector<std::string>& names);
  absl::StatusOr<std::vector<InitializedState>> IsInitialized(
      const std::vector<std::string>& names);

  // Cross-replica writes of any size (chunk streams). `bytes` must match the
  // variable's dtype and shape. `read_value`: answer with the new value
  // (WriteAck::value); by default, as in the seed, Assign does not and
  // AssignAdd / AssignSub do. Errors: see coordinator.proto AssignVariable.
  absl::StatusOr<WriteAck> Assign(const std::string& name, std::span<const std::byte> bytes,
                                  bool read_value = ReadValueByDefault(AssignOp::kAssign));
  absl::StatusOr<WriteAck> AssignAdd(const std::string& name, std::span<const std::byte> bytes,
                                     bool read_value = ReadValueByDefault(AssignOp::kAdd));
  absl::StatusOr<WriteAck> AssignSub(const std::string& name, std::span<const std::byte> bytes,
                                     bool read_value = ReadValueByDefault(AssignOp::kSub));
  template <typename T>
  absl::StatusOr<WriteAck> Assign(const std::string& name, std::span<const T> values,
                                  bool read_value = ReadValueByDefault(AssignOp::kAssign)) {
    return Write(name, AssignOp::kAssign, std::as_bytes(values), DTypeOf<T>(), read_value);
  }
  template <typename T>
  absl::StatusOr<WriteAck> AssignAdd(const std::string& name, std::span<const T> values,
                                     bool read_value = ReadValueByDefault(AssignOp::kAdd)) {
    return Write(name, AssignOp::kAdd, std::as_bytes(values), DTypeOf<T>(), read_value);
  }
  template <typename T>
  absl::StatusOr<WriteAck> AssignSub(const std::string& name, std::span<const T> values,
                                     bool read_value = ReadValueByDefault(AssignOp::kSub)) {
    return Write(name, AssignOp::kSub, std::as_bytes(values), DTypeOf<T>(), read_value);
  }
  // Many small writes in one call (<= 32 MiB in all); validated together.
  absl::StatusOr<std::vector<WriteAck>> AssignBatch(const std::vector<AssignItem>& items);

  // The last committed value. One this client knows to be small (1 MiB at
  // most: created, looked up or read through it before) comes in one unary
  // call, any other as a stream. Errors: NOT_FOUND, FAILED_PRECONDITION.
  absl::StatusOr<TensorValue> Read(const std::string& name);
  // The same value written straight into `out`, which must be exactly its
  // size: each byte is copied once, from the network into `out` (checked
  // there against its chunk's checksum and the value's), as Read copies it
  // into a fresh vector, but nothing of the value's size is allocated, so a
  // loop that reads into the same buffer (a framework's parameter storage)
  // touches no fresh memory. Errors: as
  // Read, and INVALID_ARGUMENT (`out` is not the value's size; `out` is
  // untouched). After any other error `out`'s contents are unspecified.
  absl::StatusOr<ReadInfo> ReadInto(const std::string& name, std::span<std::byte> out);
  absl::StatusOr<std::vector<TensorValue>> ReadBatch(const std::vector<std::string>& names);

  // Reads on this host (docs/architecture.md, "Local reads"): maps the
  // local read table of the worker of `worker` ("job:task"; empty:
  // $REPVAR_WORKER), after which Read and ReadInto take a committed value
  // from it whenever the worker can prove it current (no call at all), and
  // ask the coordinator otherwise. Reads stay linearizable either way.
  // Errors: INVALID_ARGUMENT (not "job:task"), NOT_FOUND (no such live
  // worker), FAILED_PRECONDITION (the worker keeps no table, or its memory
  // cannot be mapped from here: another host, container or user).
  absl::Status UseLocalReads(const std::string& worker = "");
  struct LocalReadStats {
    uint64_t served = 0;  // from the local table
    uint64_t asked = 0;   // of the coordinator instead
  };
  LocalReadStats local_read_stats() const;

  // ---- Curves people watch ----
  // Publishes `value` at `step` of the curve `name` (a loss, an accuracy)
  // for the coordinator's web view. Each trainer may publish its own: the
  // view shows their mean per step. Kept in the coordinator's memory only
  // (a restart starts every curve empty) and sent once, never retried.
  // Errors: INVALID_ARGUMENT (a name not of 1-128 [A-Za-z0-9_./:-], a
  // negative step), RESOURCE_EXHAUSTED (a 65th name), UNAVAILABLE.
  absl::Status PublishScalar(const std::string& name, int64_t step, double value);

  // ---- Checkpoints ----
  // Writes every initialized variable to the safetensors file `path`, as
  // one consistent cut: the coordinator holds cross-replica writes and new
  // steps while the bytes stream (an open step is waited for). Each value
  // is checked against its committed checksum; the file appears only when
  // complete (tmp -> fsync -> rename). Errors: DEADLINE_EXCEEDED (a step
  // stayed open), DATA_LOSS (a value failed its checksum), UNAVAILABLE (no
  // up-to-date replica of a variable), the file system's.
  absl::StatusOr<SaveResult> SaveCheckpoint(const std::string& path,
                                            CheckpointProgressFn progress = nullptr);
  // Writes every tensor of the safetensors file `path` to every replica of
  // the variable of that name: missing variables are created first (with
  // the file's specs and RestoreOptions::replicas), each value is assigned
  // as the variable's next version (versions only move forward). Checked
  // before anything is written: dtypes and shapes of existing variables,
  // the values against the checksums in the file. Errors: DATA_LOSS (a
  // damaged file), FAILED_PRECONDITION (an existing variable's dtype or
  // shape differs; more replicas than accelerators), and the writes'.
  absl::StatusOr<RestoreResult> RestoreCheckpoint(const std::string& path,
                                                  RestoreOptions options = {});

 private:
  friend struct ClientAccess;  // the library's own step code (client_impl.h)
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  absl::StatusOr<WriteAck> Write(const std::string& name, AssignOp op,
                                 std::span<const std::byte> bytes, std::optional<DType> dtype,
                                 bool read_value);
  std::unique_ptr<Impl> impl_;
};

}  // namespace repvar

#endif  // REPVAR_CLIENT_H_
