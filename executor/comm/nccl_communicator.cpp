// NcclCommunicator (see nccl_communicator.h).
#include "executor/comm/nccl_communicator.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace moeplan::executor {
namespace {

std::string nccl_error(const char* call, ncclResult_t r) {
  std::string s = fmt::format("{}: {}", call, ncclGetErrorString(r));
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0')
    s += fmt::format(" ({})", last);
  return s;
}

// A collective that cannot be enqueued is a broken communicator or a bug: abort with the call and NCCL's
// words, as MOERUN_CUDA_CHECK does for CUDA.
void check(ncclResult_t r, const char* call, const std::string& comm) {
  if (r == ncclSuccess) return;
  std::fprintf(stderr, "moerun: NCCL error on %s: %s\n", comm.c_str(), nccl_error(call, r).c_str());
  std::abort();
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFp32:
      return ncclFloat32;
    case DType::kBf16:
      return ncclBfloat16;
    case DType::kFp16:
      return ncclFloat16;
    case DType::kFp8:
      return ncclUint8;  // e4m3 payloads move as bytes; nothing reduces them
  }
  return ncclUint8;
}

}  // namespace

Result<ncclUniqueId> nccl_unique_id() {
  ncclUniqueId id{};
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    return Error{nccl_error("ncclGetUniqueId", r)};
  return id;
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, std::string name) : comm_(comm), name_(std::move(name)) {
  check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank", name_);
  check(ncclCommCount(comm_, &size_), "ncclCommCount", name_);
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::init(const ncclUniqueId& id, int nranks, int rank,
                                                                 std::string name) {
  ncclComm_t comm = nullptr;
  if (const ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank); r != ncclSuccess)
    return Error{fmt::format("{}: {}", name, nccl_error("ncclCommInitRank", r))};
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, std::move(name)));
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::split(int color, int key, std::string name) {
  ncclComm_t comm = nullptr;
  if (const ncclResult_t r = ncclCommSplit(comm_, color, key, &comm, nullptr); r != ncclSuccess)
    return Error{fmt::format("{}: {}", name, nccl_error("ncclCommSplit", r))};
  if (comm == nullptr) return std::unique_ptr<NcclCommunicator>();  // NCCL_SPLIT_NOCOLOR
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, std::move(name)));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr || aborted_) return;
  // Finalize flushes outstanding work; a communicator in error is aborted instead of waited for.
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async == ncclSuccess &&
      ncclCommFinalize(comm_) == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

std::string NcclCommunicator::async_error() const {
  if (aborted_) return "aborted";
  ncclResult_t async = ncclSuccess;
  if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &async); r != ncclSuccess)
    return nccl_error("ncclCommGetAsyncError", r);
  return async == ncclSuccess ? std::string() : nccl_error("asynchronous error", async);
}

void NcclCommunicator::abort() {
  if (aborted_) return;
  aborted_ = true;
  ncclCommAbort(comm_);
}

void NcclCommunicator::all_reduce(void* data, size_t count, DType type, cudaStream_t stream) {
  MOEPLAN_ASSERT(type != DType::kFp8);
  check(ncclAllReduce(data, data, count, nccl_type(type), ncclSum, comm_, stream), "ncclAllReduce", name_);
}

void NcclCommunicator::all_gather(const void* in, void* out, size_t count, DType type, cudaStream_t stream) {
  check(ncclAllGather(in, out, count, nccl_type(type), comm_, stream), "ncclAllGather", name_);
}

void NcclCommunicator::reduce_scatter(const void* in, void* out, size_t count, DType type,
                                      cudaStream_t stream) {
  MOEPLAN_ASSERT(type != DType::kFp8);
  check(ncclReduceScatter(in, out, count, nccl_type(type), ncclSum, comm_, stream), "ncclReduceScatter",
        name_);
}

void NcclCommunicator::all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                                    std::span<const int64_t> recv_counts, DType type, cudaStream_t stream) {
  MOEPLAN_ASSERT(send_counts.size() == static_cast<size_t>(size_) &&
                 recv_counts.size() == send_counts.size());
  const size_t eb = static_cast<size_t>(bytes_of(type));
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  // One group of sends and receives: NCCL matches them pairwise and runs them concurrently.
  check(ncclGroupStart(), "ncclGroupStart", name_);
  for (int p = 0; p < size_; ++p) {
    const auto sc = static_cast<size_t>(send_counts[static_cast<size_t>(p)]);
    const auto rc = static_cast<size_t>(recv_counts[static_cast<size_t>(p)]);
    if (sc > 0) check(ncclSend(src, sc, nccl_type(type), p, comm_, stream), "ncclSend", name_);
    if (rc > 0) check(ncclRecv(dst, rc, nccl_type(type), p, comm_, stream), "ncclRecv", name_);
    src += sc * eb;
    dst += rc * eb;
  }
  check(ncclGroupEnd(), "ncclGroupEnd", name_);
}

void NcclCommunicator::send(const void* data, size_t count, DType type, int peer, cudaStream_t stream) {
  check(ncclSend(data, count, nccl_type(type), peer, comm_, stream), "ncclSend", name_);
}

void NcclCommunicator::recv(void* data, size_t count, DType type, int peer, cudaStream_t stream) {
  check(ncclRecv(data, count, nccl_type(type), peer, comm_, stream), "ncclRecv", name_);
}

}  // namespace moeplan::executor
