// SymmetricMemory (see symmetric_memory.h).
// NCCL's device headers leave parameters unnamed-but-unused, which our warning flags reject.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl_device.h>
#pragma GCC diagnostic pop

#include <cstring>
#include <string>
#include <utility>

#include "executor/comm/symmetric_memory.h"
#include "executor/kernels/cuda/check.h"

namespace moeplan::executor {
namespace {

std::string nccl_error(const std::string& comm, const char* call, ncclResult_t r) {
  std::string s = comm + ": " + call + ": " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0')
    s += std::string(" (") + last + ")";
  return s;
}

// The window's address on every peer, as this process maps it.
__global__ void peer_pointers(ncclWindow_t window, int ranks, void** out) {
  const int p = static_cast<int>(threadIdx.x);
  if (p < ranks) out[p] = ncclGetPeerPointer(window, 0, p);
}

int nccl_runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) v = NCCL_VERSION_CODE;
  return v;
}

}  // namespace

// NCCL decides once, at communicator creation, whether a communicator supports symmetric memory
// (comm->symmetricSupport, set in initTransportsRank, src/init.cc); ncclDevCommCreate (src/dev_runtime.cc)
// refuses one without it ("Communicator does not support symmetric memory!", ncclInvalidUsage), while
// ncclCommWindowRegister still succeeds but only registers the buffer locally (the "window" it returns is a
// local registration handle; src/dev_runtime.cc). The condition, from NVIDIA/nccl's tags:
//   2.28.3: isAllDirectP2p && nNodes == 1 && NCCL_WIN_ENABLE && ncclCuMemEnable(), where
//           ncclTransportCheckP2pType (src/transport.cc) sets isAllDirectP2p to false when localRanks == 1,
//           else to whether every pair of local ranks has direct P2P within NCCL_P2P_LEVEL. So a
//           communicator with one rank on its node never qualifies, and no setting changes that.
//   2.28.7, 2.28.9: isAllCudaP2p && NCCL_WIN_ENABLE && ncclCuMemEnable(), where isAllCudaP2p is whether
//           every pair of local ranks has CUDA P2P (true for one local rank); 2.28.7's release notes:
//           "Removes distance (NCCL_P2P_LEVEL) considerations from determining the availability of
//           symmetric memory". Later releases add: GIN across nodes, or one NVLink domain.
// NCCL_WIN_ENABLE defaults to 1; ncclCuMemEnable() is NCCL_CUMEM_ENABLE, or when that is unset
// (src/misc/cudawrap.cc) whether the driver is CUDA >= 12.0 and the device supports virtual memory
// management.
std::string SymmetricMemory::nccl_requirement() {
  const int v = nccl_runtime_version();
  std::string s = "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
                  std::to_string(v % 100) + " gives a communicator symmetric memory only if ";
  if (!nccl_supports_one_rank_per_node())
    s += "it spans one node with at least two ranks on it (one rank on its node never qualifies before NCCL "
         "2.28.7), every pair of them with direct P2P within NCCL_P2P_LEVEL, ";
  else
    s += "every pair of ranks on a node has CUDA P2P, ";
  return s +
         "NCCL_WIN_ENABLE is not 0 and cuMem is enabled (NCCL_CUMEM_ENABLE, else the device's VMM support)";
}

bool SymmetricMemory::nccl_supports_one_rank_per_node() {
  return nccl_runtime_version() >= NCCL_VERSION(2, 28, 7);
}

Result<std::unique_ptr<SymmetricMemory>> SymmetricMemory::create(NcclCommunicator& comm, size_t bytes) {
  std::unique_ptr<SymmetricMemory> m(new SymmetricMemory());
  m->comm_ = comm.comm();
  m->rank_ = comm.rank();
  m->ranks_ = comm.size();
  if (m->ranks_ > kMaxPeers)
    return Error{comm.name() + ": symmetric memory for fused kernels spans at most " +
                 std::to_string(kMaxPeers) + " ranks, this group has " + std::to_string(m->ranks_)};
  m->bytes_ =
      (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
  if (const ncclResult_t r = ncclMemAlloc(&m->buffer_, m->bytes_); r != ncclSuccess)
    return Error{nccl_error(comm.name(), "ncclMemAlloc", r)};
  MOERUN_CUDA_CHECK(cudaMemset(m->buffer_, 0, m->bytes_));
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
  if (const ncclResult_t r =
          ncclCommWindowRegister(m->comm_, m->buffer_, m->bytes_, &m->window_, NCCL_WIN_COLL_SYMMETRIC);
      r != ncclSuccess)
    return Error{nccl_error(comm.name(), "ncclCommWindowRegister", r)};

  ncclDevComm dev{};
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof(reqs));  // 2.28 has no NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  if (const ncclResult_t r = ncclDevCommCreate(m->comm_, &reqs, &dev); r != ncclSuccess)
    return Error{nccl_error(comm.name(), "ncclDevCommCreate", r) + "; " + nccl_requirement()};
  const bool one_domain = dev.lsaSize == dev.nRanks;
  const int lsa = dev.lsaSize;
  ncclDevCommDestroy(m->comm_, &dev);
  if (!one_domain)
    return Error{comm.name() + ": only " + std::to_string(lsa) + " of its " + std::to_string(m->ranks_) +
                 " ranks share an NVLink domain; fused kernels need every rank load/store reachable"};

  cuda::DeviceBuffer<void*> ptrs(static_cast<size_t>(m->ranks_));
  peer_pointers<<<1, kMaxPeers>>>(m->window_, m->ranks_, ptrs.data());
  MOERUN_CUDA_CHECK(cudaGetLastError());
  ptrs.download(m->peers_.data(), static_cast<size_t>(m->ranks_));

  // Every rank's buffer is zeroed before any rank returns: a one-element all-reduce as a barrier.
  cuda::DeviceBuffer<float> token(1);
  MOERUN_CUDA_CHECK(cudaMemset(token.data(), 0, sizeof(float)));
  comm.all_reduce(token.data(), 1, DType::kFp32, nullptr);
  MOERUN_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return Result<std::unique_ptr<SymmetricMemory>>(std::move(m));
}

SymmetricMemory::~SymmetricMemory() {
  if (window_) ncclCommWindowDeregister(comm_, window_);
  if (buffer_) ncclMemFree(buffer_);
}

}  // namespace moeplan::executor
