// MpiCommunicator: packed wire formats over MPI byte transfers, fp32 reductions in rank order (see the
// header).
#include "executor/comm/mpi_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

#include "executor/comm/mpi_check.h"
#include "executor/comm/wire_format.h"

namespace moeplan::executor {
namespace {

int as_int(int64_t v) {
  MOEPLAN_ASSERT(v >= 0 && v <= INT_MAX);  // MPI counts are int: a larger message must be split by the caller
  return static_cast<int>(v);
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown";
  }
}

// Completes `req` without spinning a core. OpenMPI's blocking calls poll in a loop; on a host with a core per
// rank, a stream thread waiting for its peer that way takes the core from its own rank's compute thread (the
// runtime runs a thread per stream) and from every other rank's. So: MPI_Test (which also drives progress),
// a few yields, then sleeps growing to 100 us between tests - under 0.1 ms of added latency per wait,
// against waits of milliseconds or more.
void wait_gently(MPI_Request& req) {
  for (int i = 0;; ++i) {
    int done = 0;
    MOEPLAN_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (i < 8) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(100, 1 << std::min(i - 8, 7))));
    }
  }
}

}  // namespace

Result<int> init_mpi(int* argc, char*** argv) {
  int initialized = 0;
  MOEPLAN_MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MOEPLAN_MPI_CHECK(MPI_Query_thread(&provided));
  } else {
    MOEPLAN_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    return Error{
        fmt::format("MPI provides {} but moerun needs MPI_THREAD_MULTIPLE (stream threads call communicators "
                    "concurrently); use an MPI built with thread support (OpenMPI: "
                    "--enable-mpi-thread-multiple, the default "
                    "since 3.0)",
                    thread_level_name(provided))};
  }
  return provided;
}

std::string group_name(const std::string& kind, const std::vector<int>& world_ranks) {
  return fmt::format("{}[{}]", kind, fmt::join(world_ranks, ","));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : comm_(comm), owned_(comm != MPI_COMM_WORLD && comm != MPI_COMM_SELF), name_(std::move(name)) {
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MOEPLAN_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::exchange(std::span<const float> in, std::span<const int64_t> send_counts,
                               std::span<float> out, std::span<const int64_t> recv_counts, WireFormat wire) {
  const auto n = static_cast<size_t>(size_);
  MOEPLAN_ASSERT(send_counts.size() == n && recv_counts.size() == n);
  std::vector<int> scount(n), sdispl(n), rcount(n), rdispl(n);
  int64_t stotal = 0, rtotal = 0, svalues = 0, rvalues = 0;
  // Counts in values (fp32 wire: no packing, MPI_FLOAT) or in packed bytes (each peer segment packed alone).
  const bool raw = wire == WireFormat::kFp32;
  for (size_t p = 0; p < n; ++p) {
    MOEPLAN_ASSERT(send_counts[p] >= 0 && recv_counts[p] >= 0);
    const int64_t s = raw ? send_counts[p] : wire_bytes(wire, send_counts[p]);
    const int64_t r = raw ? recv_counts[p] : wire_bytes(wire, recv_counts[p]);
    scount[p] = as_int(s);
    sdispl[p] = as_int(stotal);
    rcount[p] = as_int(r);
    rdispl[p] = as_int(rtotal);
    stotal += s;
    rtotal += r;
    svalues += send_counts[p];
    rvalues += recv_counts[p];
  }
  MOEPLAN_ASSERT(static_cast<int64_t>(in.size()) == svalues && static_cast<int64_t>(out.size()) == rvalues);
  if (raw) {
    MPI_Request req = MPI_REQUEST_NULL;
    MOEPLAN_MPI_CHECK(MPI_Ialltoallv(in.data(), scount.data(), sdispl.data(), MPI_FLOAT, out.data(),
                                     rcount.data(), rdispl.data(), MPI_FLOAT, comm_, &req));
    wait_gently(req);
    return;
  }
  send_bytes_.resize(static_cast<size_t>(stotal));
  recv_bytes_.resize(static_cast<size_t>(rtotal));
  size_t value = 0;
  for (size_t p = 0; p < n; ++p) {
    const auto count = static_cast<size_t>(send_counts[p]);
    pack(wire, in.subspan(value, count),
         std::span(send_bytes_).subspan(static_cast<size_t>(sdispl[p]), static_cast<size_t>(scount[p])));
    value += count;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  MOEPLAN_MPI_CHECK(MPI_Ialltoallv(send_bytes_.data(), scount.data(), sdispl.data(), MPI_BYTE,
                                   recv_bytes_.data(), rcount.data(), rdispl.data(), MPI_BYTE, comm_, &req));
  wait_gently(req);
  value = 0;
  for (size_t p = 0; p < n; ++p) {
    const auto count = static_cast<size_t>(recv_counts[p]);
    unpack(wire,
           std::span<const std::byte>(recv_bytes_)
               .subspan(static_cast<size_t>(rdispl[p]), static_cast<size_t>(rcount[p])),
           out.subspan(value, count));
    value += count;
  }
}

void MpiCommunicator::all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                                   std::span<float> out, std::span<const int64_t> recv_counts,
                                   WireFormat wire) {
  exchange(in, send_counts, out, recv_counts, wire);
}

void MpiCommunicator::reduce_scatter(std::span<const float> in, std::span<float> out, WireFormat wire) {
  const size_t chunk = out.size();
  MOEPLAN_ASSERT(in.size() == chunk * static_cast<size_t>(size_));
  const std::vector<int64_t> counts(static_cast<size_t>(size_), static_cast<int64_t>(chunk));
  scratch_.resize(in.size());  // [size, chunk]: chunk r is what rank r sent us
  exchange(in, counts, scratch_, counts, wire);
  // out[i] = ((c0[i] + c1[i]) + c2[i]) + ...: rank order, fp32, the same on every rank.
  std::copy_n(scratch_.begin(), chunk, out.begin());
  for (size_t r = 1; r < static_cast<size_t>(size_); ++r) {
    const float* c = scratch_.data() + r * chunk;
    for (size_t i = 0; i < chunk; ++i) out[i] += c[i];
  }
}

void MpiCommunicator::all_gather(std::span<const float> in, std::span<float> out, WireFormat wire) {
  const size_t n = in.size();
  MOEPLAN_ASSERT(out.size() == n * static_cast<size_t>(size_));
  if (wire == WireFormat::kFp32) {
    MPI_Request req = MPI_REQUEST_NULL;
    MOEPLAN_MPI_CHECK(MPI_Iallgather(in.data(), as_int(static_cast<int64_t>(n)), MPI_FLOAT, out.data(),
                                     as_int(static_cast<int64_t>(n)), MPI_FLOAT, comm_, &req));
    wait_gently(req);
    return;
  }
  const auto bytes = static_cast<size_t>(wire_bytes(wire, static_cast<int64_t>(n)));
  send_bytes_.resize(bytes);
  recv_bytes_.resize(bytes * static_cast<size_t>(size_));
  pack(wire, in, send_bytes_);
  MPI_Request req = MPI_REQUEST_NULL;
  MOEPLAN_MPI_CHECK(MPI_Iallgather(send_bytes_.data(), as_int(static_cast<int64_t>(bytes)), MPI_BYTE,
                                   recv_bytes_.data(), as_int(static_cast<int64_t>(bytes)), MPI_BYTE, comm_,
                                   &req));
  wait_gently(req);
  for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
    unpack(wire, std::span<const std::byte>(recv_bytes_).subspan(r * bytes, bytes), out.subspan(r * n, n));
  }
}

void MpiCommunicator::all_reduce(std::span<float> data, WireFormat wire) {
  const size_t n = data.size();
  if (n == 0) return;
  const auto p = static_cast<size_t>(size_);
  const size_t chunk = (n + p - 1) / p;
  padded_.assign(chunk * p, 0.0f);  // [size, chunk], zero tail
  std::copy(data.begin(), data.end(), padded_.begin());
  chunk_.resize(chunk);
  reduce_scatter(padded_, chunk_, wire);
  all_gather(chunk_, padded_, wire);
  std::copy_n(padded_.begin(), n, data.begin());
}

void MpiCommunicator::send(std::span<const float> data, int peer, int tag, WireFormat wire) {
  if (wire == WireFormat::kFp32) {
    MPI_Request req = MPI_REQUEST_NULL;
    MOEPLAN_MPI_CHECK(
        MPI_Isend(data.data(), as_int(static_cast<int64_t>(data.size())), MPI_FLOAT, peer, tag, comm_, &req));
    wait_gently(req);
    return;
  }
  send_bytes_.resize(static_cast<size_t>(wire_bytes(wire, static_cast<int64_t>(data.size()))));
  pack(wire, data, send_bytes_);
  MPI_Request req = MPI_REQUEST_NULL;
  MOEPLAN_MPI_CHECK(MPI_Isend(send_bytes_.data(), as_int(static_cast<int64_t>(send_bytes_.size())), MPI_BYTE,
                              peer, tag, comm_, &req));
  wait_gently(req);
}

void MpiCommunicator::recv(std::span<float> data, int peer, int tag, WireFormat wire) {
  if (wire == WireFormat::kFp32) {
    MPI_Request req = MPI_REQUEST_NULL;
    MOEPLAN_MPI_CHECK(
        MPI_Irecv(data.data(), as_int(static_cast<int64_t>(data.size())), MPI_FLOAT, peer, tag, comm_, &req));
    wait_gently(req);
    return;
  }
  recv_bytes_.resize(static_cast<size_t>(wire_bytes(wire, static_cast<int64_t>(data.size()))));
  MPI_Request req = MPI_REQUEST_NULL;
  MOEPLAN_MPI_CHECK(MPI_Irecv(recv_bytes_.data(), as_int(static_cast<int64_t>(recv_bytes_.size())), MPI_BYTE,
                              peer, tag, comm_, &req));
  wait_gently(req);
  unpack(wire, recv_bytes_, data);
}

void MpiCommunicator::barrier() {
  MPI_Request req = MPI_REQUEST_NULL;
  MOEPLAN_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  wait_gently(req);
}

}  // namespace moeplan::executor
