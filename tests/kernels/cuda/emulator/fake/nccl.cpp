// fake/nccl.h's NCCL over POSIX shared memory between the ranks' processes (see nccl.h for what it
// checks and what it cannot). The segment: a Segment header (all zero when created; atomics only)
// and kMaxRanks slots of kSlotBytes, sparse (tmpfs gives pages only to the slots that are written).
// A collective runs in chunks that fit a slot, each: copy in, barrier, compute, barrier.
#include "nccl.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

namespace {

constexpr int kMaxRanks = 16;
constexpr size_t kSlotBytes = size_t(1) << 20;  // a chunk of one rank's input (reduce-scatter: all its parts)
constexpr char kIdPrefix[] = "/ktune-fake-nccl-";
constexpr unsigned kConfigMagic = 0xcafebeef;

enum class Kind : uint32_t { kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast };

// What a rank is calling, written with a collective's first chunk, so that the ranks can check
// they all call the same one.
struct CallShape {
  uint32_t seq, kind, dtype, pad;
  uint64_t count;
  int64_t root;
  bool operator==(const CallShape&) const = default;
};

struct Segment {
  std::atomic<int32_t> nranks;      // the first rank's world size (0: none has joined yet)
  std::atomic<int32_t> joined;      // ranks that have joined
  std::atomic<int32_t> aborted_by;  // 1 + the rank that called ncclCommAbort (0: none)
  std::atomic<int32_t> present[kMaxRanks];
  std::atomic<uint64_t> arrivals;  // barrier arrivals of every rank, ever
  CallShape shapes[kMaxRanks];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "the segment's atomics must work across processes");
constexpr size_t kSlotsOffset = (sizeof(Segment) + 4095) / 4096 * 4096;
constexpr size_t kSegmentBytes = kSlotsOffset + kMaxRanks * kSlotBytes;

size_t dtype_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

}  // namespace

struct ncclComm {
  std::string name;  // the segment's
  int rank = 0, nranks = 0;
  bool blocking = true;
  Segment* segment = nullptr;
  unsigned char* slots = nullptr;  // (kMaxRanks, kSlotBytes)
  bool ready = false;              // every rank has joined
  bool abandoned = false;          // destroyed or aborted here: what it left on streams completes at once
  ncclResult_t async_error = ncclSuccess;
  uint64_t barriers = 0;           // barriers this rank has passed
  uint32_t calls = 0;              // collectives issued (CallShape::seq)
  std::function<void()> deferred;  // a non-blocking call's enqueue, made by the next ncclCommGetAsyncError

  unsigned char* slot(int r) const { return slots + size_t(r) * kSlotBytes; }
  ~ncclComm() {
    if (segment) munmap(segment, kSegmentBytes);
  }
};

namespace {

// The communicators this process holds; a collective on a stream keeps its own alive past destroy.
std::map<ncclComm*, std::shared_ptr<ncclComm>>& comms() {
  static std::map<ncclComm*, std::shared_ptr<ncclComm>> all;
  return all;
}
std::shared_ptr<ncclComm> find_comm(ncclComm_t c) {
  auto it = comms().find(c);
  return it == comms().end() ? nullptr : it->second;
}

ncclResult_t refuse(ncclResult_t r, const ncclComm* c, const std::string& why) {
  std::fprintf(stderr, "fake nccl: rank %d: %s\n", c ? c->rank : -1, why.c_str());
  return r;
}

void arrive(ncclComm& c) { c.segment->arrivals.fetch_add(1, std::memory_order_acq_rel); }
// Whether every rank has arrived at this rank's next barrier (then it is passed).
bool passed(ncclComm& c) {
  if (c.segment->arrivals.load(std::memory_order_acquire) < (c.barriers + 1) * uint64_t(c.nranks)) return false;
  ++c.barriers;
  return true;
}

// out (n) = Σ_r parts[r] (n), in rank order, in T.
template <typename T>
void sum_parts(unsigned char* out, const unsigned char* const* parts, int nranks, size_t n) {
  T* y = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) {
    T acc = reinterpret_cast<const T*>(parts[0])[i];
    for (int r = 1; r < nranks; ++r) acc = T(acc + reinterpret_cast<const T*>(parts[r])[i]);
    y[i] = acc;
  }
}
bool sums(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclUint8 || t == ncclInt32 || t == ncclUint32 || t == ncclInt64 || t == ncclUint64 ||
         t == ncclFloat32 || t == ncclFloat64;
}
void sum_dispatch(ncclDataType_t t, unsigned char* out, const unsigned char* const* parts, int nranks, size_t n) {
  switch (t) {
    case ncclInt8:
      return sum_parts<int8_t>(out, parts, nranks, n);
    case ncclUint8:
      return sum_parts<uint8_t>(out, parts, nranks, n);
    case ncclInt32:
      return sum_parts<int32_t>(out, parts, nranks, n);
    case ncclUint32:
      return sum_parts<uint32_t>(out, parts, nranks, n);
    case ncclInt64:
      return sum_parts<int64_t>(out, parts, nranks, n);
    case ncclUint64:
      return sum_parts<uint64_t>(out, parts, nranks, n);
    case ncclFloat32:
      return sum_parts<float>(out, parts, nranks, n);
    case ncclFloat64:
      return sum_parts<double>(out, parts, nranks, n);
    default:
      std::abort();  // refused at the call
  }
}

// One collective on its stream: step() does what it can without waiting and says whether it is done.
struct Collective {
  Kind kind;
  const unsigned char* send;
  unsigned char* recv;
  size_t count;  // elements: allreduce / broadcast's count, reduce-scatter's recvcount, all-gather's sendcount
  ncclDataType_t dtype;
  int root;
  size_t bytes = 0;  // an element's
  size_t chunk = 0;  // elements a chunk (of each part, for reduce-scatter)
  size_t first = 0;  // the current chunk's first element
  int phase = 0;     // 0 copy in, 1 wait then compute, 2 wait then next chunk, 3 stuck (a mismatch)
  CallShape shape{};

  bool step(ncclComm& c) {
    if (c.abandoned) return true;  // ncclCommAbort / Destroy here: the "kernel" is gone
    for (;;) {
      const size_t n = std::min(chunk, count - first);
      if (phase == 0) {
        copy_in(c, n);
        if (first == 0) c.segment->shapes[c.rank] = shape;
        arrive(c);
        phase = 1;
      } else if (phase == 1) {
        if (!passed(c)) return waiting(c);
        if (first == 0 && !shapes_agree(c)) {
          phase = 3;
          continue;
        }
        compute(c, n);
        arrive(c);
        phase = 2;
      } else if (phase == 2) {
        if (!passed(c)) return waiting(c);
        first += n;
        if (first >= count) return true;
        phase = 0;
      } else {
        return waiting(c);
      }
    }
  }

  // Not done: waiting for peers. One that aborted will never come (ncclRemoteError); as on a GPU,
  // the kernel waits on until this rank aborts too.
  bool waiting(ncclComm& c) {
    if (c.segment->aborted_by.load() != 0 && c.async_error == ncclSuccess) c.async_error = ncclRemoteError;
    return false;
  }

  bool shapes_agree(ncclComm& c) {
    for (int r = 0; r < c.nranks; ++r)
      if (!(c.segment->shapes[r] == shape)) {
        const CallShape& o = c.segment->shapes[r];
        refuse(ncclInvalidUsage, &c,
               "collective #" + std::to_string(shape.seq) + " differs between the ranks: this rank's kind " +
                   std::to_string(shape.kind) + " count " + std::to_string(shape.count) + " dtype " +
                   std::to_string(shape.dtype) + " root " + std::to_string(shape.root) + ", rank " + std::to_string(r) +
                   "'s #" + std::to_string(o.seq) + " kind " + std::to_string(o.kind) + " count " +
                   std::to_string(o.count) + " dtype " + std::to_string(o.dtype) + " root " + std::to_string(o.root));
        c.async_error = ncclInvalidUsage;
        return false;
      }
    return true;
  }

  // This rank's input for elements [first, first + n) into its slot.
  void copy_in(ncclComm& c, size_t n) {
    unsigned char* mine = c.slot(c.rank);
    if (kind == Kind::kReduceScatter) {  // part d of the slot: the elements rank d will hold
      for (int d = 0; d < c.nranks; ++d)
        std::memcpy(mine + size_t(d) * chunk * bytes, send + (size_t(d) * count + first) * bytes, n * bytes);
    } else if (kind != Kind::kBroadcast || c.rank == root) {
      std::memcpy(mine, send + first * bytes, n * bytes);
    }
  }

  // This rank's output for elements [first, first + n) from every slot.
  void compute(ncclComm& c, size_t n) {
    const unsigned char* parts[kMaxRanks];
    switch (kind) {
      case Kind::kAllReduce:
        for (int r = 0; r < c.nranks; ++r) parts[r] = c.slot(r);
        sum_dispatch(dtype, recv + first * bytes, parts, c.nranks, n);
        break;
      case Kind::kReduceScatter:
        for (int r = 0; r < c.nranks; ++r) parts[r] = c.slot(r) + size_t(c.rank) * chunk * bytes;
        sum_dispatch(dtype, recv + first * bytes, parts, c.nranks, n);
        break;
      case Kind::kAllGather:
        for (int r = 0; r < c.nranks; ++r)
          std::memcpy(recv + (size_t(r) * count + first) * bytes, c.slot(r), n * bytes);
        break;
      case Kind::kBroadcast:
        std::memcpy(recv + first * bytes, c.slot(root), n * bytes);
        break;
    }
  }
};

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// Checks a call, then enqueues it (blocking communicator) or leaves it to the next
// ncclCommGetAsyncError (non-blocking: ncclInProgress).
ncclResult_t collective(ncclComm_t handle, Kind kind, const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t dtype, ncclRedOp_t op, int root, cudaStream_t stream) {
  std::shared_ptr<ncclComm> c = find_comm(handle);
  if (!c) return refuse(ncclInvalidArgument, nullptr, "a collective on a communicator that is not (or no longer) one");
  if (c->abandoned || !c->ready)
    return refuse(ncclInvalidUsage, c.get(), "a collective before the communicator is initialised (ncclInProgress)");
  const size_t bytes = dtype_bytes(dtype);
  if (bytes == 0) return refuse(ncclInvalidArgument, c.get(), "unknown dtype " + std::to_string(int(dtype)));
  const bool reduces = kind == Kind::kAllReduce || kind == Kind::kReduceScatter;
  if (reduces && op != ncclSum) return refuse(ncclInvalidArgument, c.get(), "only ncclSum is emulated");
  if (reduces && !sums(dtype))
    return refuse(ncclInvalidArgument, c.get(), "no sum emulated for dtype " + std::to_string(int(dtype)));
  if (kind == Kind::kBroadcast && (root < 0 || root >= c->nranks))
    return refuse(ncclInvalidArgument, c.get(), "root " + std::to_string(root) + " out of range");
  const size_t n = size_t(c->nranks);
  size_t send_bytes = count * bytes, recv_bytes = count * bytes;
  if (kind == Kind::kReduceScatter) send_bytes *= n;
  if (kind == Kind::kAllGather) recv_bytes *= n;
  if (kind == Kind::kBroadcast && c->rank != root) send_bytes = 0;  // only the root's sendbuff is read
  if (count > 0 && (!recvbuff || (send_bytes > 0 && !sendbuff)))
    return refuse(ncclInvalidArgument, c.get(), "a null buffer");
  const auto* s = static_cast<const unsigned char*>(sendbuff);
  auto* r = static_cast<unsigned char*>(recvbuff);
  bool in_place = s == r;  // allreduce, broadcast
  if (kind == Kind::kReduceScatter) in_place = r == s + size_t(c->rank) * count * bytes;
  if (kind == Kind::kAllGather) in_place = s == r + size_t(c->rank) * count * bytes;
  if (!in_place && overlap(s, send_bytes, r, recv_bytes))
    return refuse(ncclInvalidArgument, c.get(),
                  "input and output overlap but are not NCCL's in-place layout (reduce-scatter: recvbuff = "
                  "sendbuff + rank*recvcount; all-gather: sendbuff = recvbuff + rank*sendcount; else equal)");

  auto call = std::make_shared<Collective>(Collective{kind, s, r, count, dtype, root});
  call->bytes = bytes;
  call->chunk = kind == Kind::kReduceScatter ? kSlotBytes / (n * bytes) : kSlotBytes / bytes;
  call->shape =
      CallShape{c->calls++, uint32_t(kind), uint32_t(dtype), 0, uint64_t(count), kind == Kind::kBroadcast ? root : -1};
  std::function<void()> enqueue = [stream, c, call] {
    if (call->count == 0) return;  // nothing to move, no barrier (every rank skips it alike)
    emu::enqueue_waiting(stream, [c, call] {
      emu::DeviceAccess open;  // a collective reads and writes device buffers
      return call->step(*c);
    });
  };
  if (c->blocking) {
    enqueue();
    return ncclSuccess;
  }
  if (c->deferred) c->deferred();  // an earlier call nobody polled for goes first
  c->deferred = std::move(enqueue);
  return ncclInProgress;
}

// Init's progress: ready once every rank has joined (the name is then unlinked: all have it mapped).
void progress_init(ncclComm& c) {
  if (c.ready || c.segment->joined.load() < c.nranks) return;
  c.ready = true;
  shm_unlink(c.name.c_str());
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (fake NCCL)";
    case ncclSystemError:
      return "unhandled system error (fake NCCL: see its line on stderr)";
    case ncclInternalError:
      return "internal error (fake NCCL)";
    case ncclInvalidArgument:
      return "invalid argument (fake NCCL: see its line on stderr)";
    case ncclInvalidUsage:
      return "invalid usage (fake NCCL: see its line on stderr)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<uint64_t> counter{0};
  std::random_device entropy;
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "%s%d-%llu-%08x", kIdPrefix, int(getpid()),
                static_cast<unsigned long long>(counter++), unsigned(entropy()));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  *out = nullptr;
  if (nranks < 1 || nranks > kMaxRanks)
    return refuse(ncclInvalidArgument, nullptr, "nranks " + std::to_string(nranks) + " (the fake holds 1 to 16)");
  if (rank < 0 || rank >= nranks)
    return refuse(ncclInvalidArgument, nullptr, "rank " + std::to_string(rank) + " out of range");
  if (config && (config->size != sizeof(ncclConfig_t) || config->magic != kConfigMagic))
    return refuse(ncclInvalidArgument, nullptr, "a config not set from NCCL_CONFIG_INITIALIZER");
  id.internal[NCCL_UNIQUE_ID_BYTES - 1] = 0;
  if (std::strncmp(id.internal, kIdPrefix, sizeof kIdPrefix - 1) != 0)
    return refuse(ncclInvalidArgument, nullptr, "a unique id not made by ncclGetUniqueId");

  auto c = std::make_shared<ncclComm>();
  c->name = id.internal;
  c->rank = rank, c->nranks = nranks;
  c->blocking = !config || config->blocking != 0;  // NCCL's default (NCCL_CONFIG_UNDEF_INT) blocks
  const int fd = shm_open(c->name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return refuse(ncclSystemError, c.get(), "shm_open " + c->name + ": " + std::strerror(errno));
  struct stat st {};
  const bool sized = fstat(fd, &st) == 0 && (st.st_size == off_t(kSegmentBytes) || ftruncate(fd, kSegmentBytes) == 0);
  void* map = sized ? mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (map == MAP_FAILED) return refuse(ncclSystemError, c.get(), "mapping " + c->name + ": " + std::strerror(errno));
  c->segment = static_cast<Segment*>(map);
  c->slots = static_cast<unsigned char*>(map) + kSlotsOffset;

  int32_t claimed = 0;
  if (!c->segment->nranks.compare_exchange_strong(claimed, nranks) && claimed != nranks)
    return refuse(ncclInvalidArgument, c.get(),
                  "nranks " + std::to_string(nranks) + " where another rank said " + std::to_string(claimed));
  if (c->segment->present[rank].exchange(1) != 0)
    return refuse(ncclInvalidArgument, c.get(), "rank " + std::to_string(rank) + " joined twice");
  c->segment->joined.fetch_add(1);
  comms()[c.get()] = c;
  *out = c.get();
  if (!c->blocking) return ncclInProgress;
  while (progress_init(*c), !c->ready) usleep(100);  // real NCCL's blocking init waits as long
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t* state) {
  std::shared_ptr<ncclComm> c = find_comm(handle);
  if (!c) return refuse(ncclInvalidArgument, nullptr, "ncclCommGetAsyncError on no communicator");
  if (c->async_error == ncclSuccess && c->segment->aborted_by.load() != 0) c->async_error = ncclRemoteError;
  if (c->async_error != ncclSuccess) {
    *state = c->async_error;
    return ncclSuccess;
  }
  progress_init(*c);
  if (!c->ready) {
    *state = ncclInProgress;
    return ncclSuccess;
  }
  if (c->deferred) std::exchange(c->deferred, nullptr)();
  *state = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t handle, int* count) {
  std::shared_ptr<ncclComm> c = find_comm(handle);
  if (!c) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t handle, int* rank) {
  std::shared_ptr<ncclComm> c = find_comm(handle);
  if (!c) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

// Destroy leaves quietly (peers still waiting for this rank wait on, as they would on a GPU);
// Abort also tells them (ncclRemoteError). Either drops the segment's name if init never finished.
static ncclResult_t release(ncclComm_t handle, bool tell_peers) {
  std::shared_ptr<ncclComm> c = find_comm(handle);
  if (!c) return refuse(ncclInvalidArgument, nullptr, "destroying a communicator that is not (or no longer) one");
  if (tell_peers) c->segment->aborted_by.store(c->rank + 1);
  if (!c->ready) shm_unlink(c->name.c_str());
  c->abandoned = true;
  c->deferred = nullptr;
  comms().erase(c.get());
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, false); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, true); }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, stream);
}
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, Kind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, stream);
}
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, stream);
}
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, Kind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, stream);
}
