// NCCL communicator for a group whose ranks each have their own GPU (backend/device_comm.hpp).
// The unique id comes from the group's root over MPI; collectives run on the backend's stream.
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
  }
  ~NcclComm() override { ncclCommDestroy(comm_); }
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
  std::string kind() const override { return "nccl"; }

 private:
  Backend* be_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_built() { return true; }
std::unique_ptr<DeviceComm> make_nccl_comm(Backend& be, const Comm& group) {
  return std::make_unique<NcclComm>(be, group);
}

}  // namespace dz
#endif
