// A second stream and its events, for a call that splits its work between the caller's stream and
// this one (indexer_topk_wgmma: each block's Top-K beside the next block's scores; la_chunk_prefill's
// pipelined form: a segment's recurrence beside the next segment's prep). Owned by the caller, who
// makes it at first use (create: a no-op once made); released by the destructor. No global state.
#pragma once
#include "common.cuh"

namespace dz::cuda {

template <int NE>
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[NE] = {};
  SideStream() = default;
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() {
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }
  // high_priority: the stream at the device's greatest priority, so its kernels' CTAs are dispatched
  // before the other stream's as SMs free up; else the default priority.
  void create(bool high_priority = false) {
    if (stream) return;
    int least = 0, greatest = 0;
    if (high_priority) CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, high_priority ? greatest : least));
    for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  // the stream and every event made (a create that failed part way leaves some null)
  bool made() const {
    if (!stream) return false;
    for (cudaEvent_t e : ev)
      if (!e) return false;
    return true;
  }
};

}  // namespace dz::cuda
