// NCCL communicator for a group whose ranks each have their own GPU (backend/device_comm.hpp).
// The unique id comes from the group's root over MPI; collectives run on the backend's stream, the
// started exchanges (allgather_rows_start, alltoall_rows_start) on the communicator's own stream.
#include "backend/device_comm.hpp"

#ifdef DAYZERO_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "backend_ops.cuh"
#include "common.cuh"

#define NCCL_CHECK(call)                                                                              \
  do {                                                                                                \
    ncclResult_t _r = (call);                                                                         \
    if (_r != ncclSuccess) ::dz::fail(::dz::str(#call, " failed: ", ncclGetErrorString(_r)));       \
  } while (0)

namespace dz {

namespace {

class NcclComm final : public DeviceComm {
 public:
  NcclComm(Backend& be, const Comm& group) : be_(&be) {
    DZ_CHECK(be.device() == Device::Cuda, "NCCL: needs the cuda backend, got ", be.name());
    ncclUniqueId id;
    if (group.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    group.bcast_bytes(&id, sizeof id, 0);
    NCCL_CHECK(ncclCommInitRank(&comm_, group.size(), id, group.rank()));
    size_ = group.size(), rank_ = group.rank();
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  }
  ~NcclComm() override {
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
    ncclCommDestroy(comm_);
  }
  // Sums in fp32 whatever the tensor's dtype (bf16 partial sums are widened first, as the staged
  // MPI path does), so the result does not depend on the transport's reduction order in bf16.
  void allreduce_sum(const DTensor& t) const override {
    const int64_t n = t.numel();
    if (n == 0) return;
    auto s = static_cast<cudaStream_t>(be_->native_stream());
    if (t.dtype == DType::F32) {
      NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(n), ncclFloat32, ncclSum, comm_, s));
      return;
    }
    DZ_CHECK(t.dtype == DType::BF16, "NCCL all-reduce of a ", to_string(t.dtype), " tensor");
    DTensor f = be_->alloc(t.shape, DType::F32);
    be_->convert(t, f);
    NCCL_CHECK(ncclAllReduce(f.data, f.data, size_t(n), ncclFloat32, ncclSum, comm_, s));
    be_->convert(f, t);
  }
  // Variable counts: one broadcast per rank (root r sends its rows into their place in the
  // result), grouped into one NCCL operation.
  DTensor allgather_rows(const DTensor& mine, const std::vector<int64_t>& rows_of) const override {
    const int64_t total = Backend::check_gather_rows(size_, rank_, mine, rows_of);
    DTensor out = be_->alloc({total, mine.cols()}, mine.dtype);
    broadcast_rows(mine, rows_of, out, static_cast<cudaStream_t>(be_->native_stream()));
    return out;
  }
  // Started on the communicator's own stream after what the backend's stream has queued (the
  // kernels that make mine); wait() makes the backend's stream wait for it, so the kernels queued
  // in between run beside the exchange.
  std::unique_ptr<PendingRows> allgather_rows_start(const DTensor& mine,
                                                    const std::vector<int64_t>& rows_of) const override {
    const int64_t total = Backend::check_gather_rows(size_, rank_, mine, rows_of);
    auto p = started(mine, {total, mine.cols()});
    broadcast_rows(mine, rows_of, p->out, side_);
    CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(p->done, side_));
    return p;
  }
  // One grouped send / receive per peer (itself included).
  DTensor alltoall_rows(const DTensor& send, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) const override {
    const int64_t total = Backend::check_alltoall_rows(size_, send, send_rows, recv_rows);
    DTensor out = be_->alloc({total, send.cols()}, send.dtype);
    send_recv(send, send_rows, recv_rows, out, static_cast<cudaStream_t>(be_->native_stream()));
    return out;
  }
  // Started on the communicator's own stream as allgather_rows_start: this rank's own experts run
  // on the backend's stream beside the dispatch.
  std::unique_ptr<PendingRows> alltoall_rows_start(const DTensor& send, const std::vector<int64_t>& send_rows,
                                                   const std::vector<int64_t>& recv_rows) const override {
    const int64_t total = Backend::check_alltoall_rows(size_, send, send_rows, recv_rows);
    auto p = started(send, {total, send.cols()});
    send_recv(send, send_rows, recv_rows, p->out, side_);
    CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(p->done, side_));
    return p;
  }
  std::string kind() const override { return "nccl"; }

 private:
  void send_recv(const DTensor& send, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                 const DTensor& out, cudaStream_t s) const {
    const size_t row_bytes = size_t(send.cols()) * dtype_size(send.dtype);
    NCCL_CHECK(ncclGroupStart());
    size_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      const size_t ns = size_t(send_rows[size_t(r)]) * row_bytes, nr = size_t(recv_rows[size_t(r)]) * row_bytes;
      if (ns > 0) NCCL_CHECK(ncclSend(static_cast<const char*>(send.data) + so, ns, ncclUint8, r, comm_, s));
      if (nr > 0) NCCL_CHECK(ncclRecv(static_cast<char*>(out.data) + ro, nr, ncclUint8, r, comm_, s));
      so += ns, ro += nr;
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  struct Pending final : PendingRows {
    cudaStream_t s = nullptr;
    cudaEvent_t done = nullptr;
    DTensor in, out;
    bool joined = false;
    DTensor wait() override {
      if (!joined) CUDA_CHECK(cudaStreamWaitEvent(s, done, 0));
      joined = true;
      return out;
    }
    ~Pending() override {  // unwaited: the backend's stream still must not reuse in / out before it
      if (!joined && done) cudaStreamWaitEvent(s, done, 0);
      if (done) cudaEventDestroy(done);
    }
  };
  // A started exchange from `in` into a new tensor of `shape`: the communicator's stream waits for
  // what the backend's stream has queued (the kernels that make `in`).
  std::unique_ptr<Pending> started(const DTensor& in, const Shape& shape) const {
    auto p = std::make_unique<Pending>();
    p->s = static_cast<cudaStream_t>(be_->native_stream());
    p->in = in;  // held until the backend's stream is behind the exchange: no reuse before it reads
    p->out = be_->alloc(shape, in.dtype);
    cudaEvent_t ready;
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ready, p->s));
    CUDA_CHECK(cudaStreamWaitEvent(side_, ready, 0));
    CUDA_CHECK(cudaEventDestroy(ready));  // released once it has completed
    return p;
  }
  void broadcast_rows(const DTensor& mine, const std::vector<int64_t>& rows_of, const DTensor& out,
                      cudaStream_t s) const {
    const size_t row_bytes = size_t(mine.cols()) * dtype_size(mine.dtype);
    NCCL_CHECK(ncclGroupStart());
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      const size_t n = size_t(rows_of[size_t(r)]) * row_bytes;
      char* dst = static_cast<char*>(out.data) + at;
      if (n > 0) NCCL_CHECK(ncclBroadcast(r == rank_ ? mine.data : dst, dst, n, ncclUint8, r, comm_, s));
      at += n;
    }
    NCCL_CHECK(ncclGroupEnd());
  }

  Backend* be_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t side_ = nullptr;  // the started exchanges' stream
  int size_ = 1, rank_ = 0;
};

}  // namespace

bool nccl_built() { return true; }
std::unique_ptr<DeviceComm> make_nccl_comm(Backend& be, const Comm& group) {
  return std::make_unique<NcclComm>(be, group);
}

}  // namespace dz
#endif
