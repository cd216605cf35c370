// The CUDA backend: BF16 activations and weights on one GPU, fp32 residual stream, states, logits
// and reductions (DESIGN §5). Every op is issued on the backend's stream; memory comes from the
// stream-ordered pool (cudaMallocAsync), so per-forward temporaries cost no synchronisation. The
// host is waited for only where it reads results (download, the staged collectives).
#include <cuda_profiler_api.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_set>

#include "backend/backend.hpp"
#include "backend_ops.cuh"
#include "flash_attention.cuh"
#include "hyper.cuh"
#include "moe_gemm.cuh"
#include "common.cuh"
#include "core/bf16.hpp"
#include "core/fp8.hpp"
#include "core/parallel.hpp"
#include "indexer.cuh"
#include "indexer_wgmma.cuh"
#include "dsv4_attention.cuh"
#include "indexer_kpool.cuh"
#include "linear_attn.cuh"
#include "paged_cache.cuh"
#include "quant.cuh"
#include "ops/hyper.hpp"
#include "ops/moe.hpp"
#include "ops/rope.hpp"
#include "short_conv.cuh"
#include "sparse_mla.cuh"

#define CUBLAS_CHECK(call)                                                                   \
  do {                                                                                       \
    cublasStatus_t _s = (call);                                                              \
    if (_s != CUBLAS_STATUS_SUCCESS) ::dz::fail(::dz::str(#call, " failed: cuBLAS status ", int(_s))); \
  } while (0)

namespace dz {

namespace {

using cuda::Dt;
using bf16 = __nv_bfloat16;

Dt dt_of(const DTensor& t) {
  DZ_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "cuda backend: float tensor expected, got ",
           to_string(t.dtype));
  return t.dtype == DType::F32 ? Dt::F32 : Dt::BF16;
}
const float* optf(const DTensor& t) {
  if (!t.defined() || t.numel() == 0) return nullptr;
  DZ_CHECK(t.dtype == DType::F32, "cuda backend: F32 parameter expected, got ", to_string(t.dtype));
  return t.ptr<float>();
}
const bf16* b16(const DTensor& t) {
  DZ_CHECK(t.dtype == DType::BF16, "cuda backend: BF16 tensor expected, got ", to_string(t.dtype), " ",
           shape_str(t.shape));
  return static_cast<const bf16*>(t.data);
}
bf16* b16w(const DTensor& t) { return const_cast<bf16*>(b16(t)); }

// The stream outlives every allocation made on it: deleters hold it. During a graph capture a
// release of memory allocated before the capture is held back until the capture ends: recorded
// as a free node, it would run again at every replay, on whatever then lives at that address.
struct StreamHolder {
  cudaStream_t s = nullptr;
  bool capturing = false;
  std::unordered_set<void*> captured;  // allocated during the open capture (graph memory)
  std::vector<void*> held;             // released during the capture, allocated before it
  void release(void* p) {
    if (capturing && !captured.count(p)) {
      held.push_back(p);
      return;
    }
    cudaFreeAsync(p, s);
  }
  ~StreamHolder() {
    if (s) cudaStreamDestroy(s);
  }
};

// A captured decode run (cudaGraphExec); destroyed only once its last launch has finished.
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t x, std::shared_ptr<StreamHolder> s) : x_(x), s_(std::move(s)) {}
  ~CudaGraph() override {
    cudaStreamSynchronize(s_->s);
    cudaGraphExecDestroy(x_);
  }
  void launch() override {
    DZ_CHECK(!s_->capturing, "graph launch during a capture");
    CUDA_CHECK(cudaGraphLaunch(x_, s_->s));
  }

 private:
  cudaGraphExec_t x_;
  std::shared_ptr<StreamHolder> s_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    DZ_CHECK(device >= 0 && device < n, "--backend cuda: GPU ", device, " requested, ", n, " visible");
    CUDA_CHECK(cudaSetDevice(device));
    stream_ = std::make_shared<StreamHolder>();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_->s, cudaStreamNonBlocking));
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;  // keep freed blocks for reuse instead of returning them at each sync
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_->s));
    CUDA_CHECK(cudaMalloc(&blas_ws_, kBlasWs));  // a fixed workspace: what graph capture needs
    CUBLAS_CHECK(cublasSetWorkspace(blas_, blas_ws_, kBlasWs));
    CUBLAS_CHECK(cublasLtCreate(&lt_));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaMalloc(&route_bad_, sizeof(int32_t)));
    CUDA_CHECK(cudaMemset(route_bad_, 0, sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost(&route_bad_host_, sizeof(int32_t)));
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_->s);
    if (route_bad_) cudaFree(route_bad_);
    if (route_bad_host_) cudaFreeHost(route_bad_host_);
    if (ring_) cudaFreeHost(ring_);
    for (auto& e : ring_done_)
      if (e) cudaEventDestroy(e);
    if (pinned_) cudaFreeHost(pinned_);
    for (auto& kv : fp8_plans_) kv.second.destroy();
    if (lt_) cublasLtDestroy(lt_);
    if (blas_) cublasDestroy(blas_);
    if (blas_ws_) cudaFree(blas_ws_);
  }

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::Cuda; }
  DType act_dtype() const override { return DType::BF16; }
  DType weight_dtype() const override { return DType::BF16; }
  cudaStream_t st() const { return stream_->s; }

  DTensor alloc(const Shape& s, DType dt) override {
    DTensor t;
    t.dtype = dt;
    t.device = Device::Cuda;
    t.shape = s;
    const size_t n = std::max<size_t>(t.bytes(), 16);
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, n, st());
    DZ_CHECK(e == cudaSuccess, "cuda backend: cannot allocate ", n, " bytes on GPU ", device_, " (",
             cudaGetErrorString(e), ")");
    if (stream_->capturing) stream_->captured.insert(p);
    auto hold = stream_;
    t.mem = std::shared_ptr<void>(p, [hold](void* q) { hold->release(q); });
    t.data = p;
    return t;
  }
  DTensor upload(const float* src, const Shape& s, DType dt) override {
    DTensor t = alloc(s, dt);
    const int64_t n = t.numel();
    if (n == 0) return t;
    if (dt == DType::F32) {
      h2d(t.data, src, t.bytes());
    } else {
      DZ_CHECK(dt == DType::BF16, "cuda backend: upload as ", to_string(dt));
      no_capture("an upload");
      std::vector<uint16_t> h(static_cast<size_t>(n));
      parallel_for(n, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) h[size_t(i)] = f32_to_bf16(src[i]);
      });
      // From pageable memory the copy returns once the source is staged, so h may go.
      CUDA_CHECK(cudaMemcpyAsync(t.data, h.data(), t.bytes(), cudaMemcpyHostToDevice, st()));
    }
    return t;
  }
  DTensor upload_i32(const int32_t* src, const Shape& s) override {
    DTensor t = alloc(s, DType::I32);
    if (t.numel()) h2d(t.data, src, t.bytes());
    return t;
  }
  void download(const DTensor& t, float* dst) override {
    const int64_t n = t.numel();
    if (n == 0) return;
    if (t.dtype == DType::F32) {
      CUDA_CHECK(cudaMemcpyAsync(dst, t.data, t.bytes(), cudaMemcpyDeviceToHost, st()));
    } else {
      DTensor f = alloc(t.shape, DType::F32);
      cuda::convert(t.data, dt_of(t), f.data, Dt::F32, n, st());
      CUDA_CHECK(cudaMemcpyAsync(dst, f.data, f.bytes(), cudaMemcpyDeviceToHost, st()));
    }
    host_wait();
  }
  void download_i32(const DTensor& t, int32_t* dst) override {
    DZ_CHECK(t.dtype == DType::I32, "download_i32 of a ", to_string(t.dtype), " tensor");
    if (!t.numel()) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, t.data, t.bytes(), cudaMemcpyDeviceToHost, st()));
    host_wait();
  }
  void fill_zero(const DTensor& t) override {
    if (t.numel()) CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), st()));
  }
  void copy_rows(const DTensor& src, int64_t s0, const DTensor& dst, int64_t d0, int64_t n) override {
    DZ_CHECK(src.dtype == dst.dtype && src.cols() == dst.cols() && s0 >= 0 && d0 >= 0 && s0 + n <= src.rows() &&
                 d0 + n <= dst.rows(),
             "copy_rows: ", n, " rows from ", s0, " of ", shape_str(src.shape), " to ", d0, " of ", shape_str(dst.shape));
    const size_t w = size_t(src.cols()) * dtype_size(src.dtype);
    if (n > 0 && w > 0)
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data) + size_t(d0) * w,
                                 static_cast<const char*>(src.data) + size_t(s0) * w, size_t(n) * w,
                                 cudaMemcpyDeviceToDevice, st()));
  }
  // The descriptors through the upload ring, then one kernel for every copy.
  void copy_rows_many(const std::vector<RowCopy>& copies) override {
    std::vector<cuda::CopyDesc> d;
    d.reserve(copies.size());
    uint64_t max_bytes = 0;
    for (const RowCopy& c : copies) {
      DZ_CHECK(c.src.dtype == c.dst.dtype && c.src.cols() == c.dst.cols() && c.s0 >= 0 && c.d0 >= 0 && c.n >= 0 &&
                   c.s0 + c.n <= c.src.rows() && c.d0 + c.n <= c.dst.rows(),
               "copy_rows_many: ", c.n, " rows from ", c.s0, " of ", shape_str(c.src.shape), " to ", c.d0, " of ",
               shape_str(c.dst.shape));
      const size_t w = size_t(c.src.cols()) * dtype_size(c.src.dtype);
      if (c.n == 0 || w == 0) continue;
      d.push_back({static_cast<const char*>(c.src.data) + size_t(c.s0) * w,
                   static_cast<char*>(c.dst.data) + size_t(c.d0) * w, uint64_t(c.n) * w});
      max_bytes = std::max<uint64_t>(max_bytes, d.back().bytes);
    }
    if (d.empty()) return;
    if (d.size() == 1) {  // one copy: the copy engine's own path
      CUDA_CHECK(cudaMemcpyAsync(d[0].dst, d[0].src, d[0].bytes, cudaMemcpyDeviceToDevice, st()));
      return;
    }
    DTensor t = alloc({int64_t(d.size() * sizeof(cuda::CopyDesc))}, DType::U8);
    h2d(t.data, d.data(), t.bytes());
    cuda::copy_many(static_cast<const cuda::CopyDesc*>(t.data), int(d.size()), max_bytes, st());
  }
  void copy_cols(const DTensor& src, int64_t s0, const DTensor& dst, int64_t d0, int64_t w) override {
    DZ_CHECK(src.dtype == dst.dtype && src.rows() == dst.rows() && s0 >= 0 && d0 >= 0 && s0 + w <= src.cols() &&
                 d0 + w <= dst.cols(),
             "copy_cols: ", w, " columns from ", s0, " of ", shape_str(src.shape), " to ", d0, " of ",
             shape_str(dst.shape));
    const size_t es = dtype_size(src.dtype);
    if (w > 0 && src.rows() > 0)
      CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data) + size_t(d0) * es, size_t(dst.cols()) * es,
                                   static_cast<const char*>(src.data) + size_t(s0) * es, size_t(src.cols()) * es,
                                   size_t(w) * es, size_t(src.rows()), cudaMemcpyDeviceToDevice, st()));
  }
  void convert(const DTensor& src, const DTensor& dst) override {
    DZ_CHECK(src.numel() == dst.numel(), "convert: ", shape_str(src.shape), " to ", shape_str(dst.shape));
    cuda::convert(src.data, dt_of(src), dst.data, dt_of(dst), src.numel(), st());
  }
  void fill_dummy(const DTensor& t, uint64_t key, const DummyDist& d, int64_t ld, int64_t r0, int64_t c0) override {
    cuda::fill_dummy(t.data, dt_of(t), t.rows(), t.cols(), key, d, ld, r0, c0, st());
  }
  DTensor dummy_mx4_experts(const std::vector<uint64_t>& keys, int64_t R, int64_t C, const DummyDist& d, int64_t ld,
                            int64_t r0, int64_t c0) override {
    DZ_CHECK(C % 32 == 0 && c0 % 32 == 0 && ld % 32 == 0, "dummy_mx4_experts: columns ", c0, " + ", C, " of ", ld,
             " are not whole groups of 32");
    const int64_t E = int64_t(keys.size());
    DTensor k = alloc({E}, DType::I64);
    CUDA_CHECK(cudaMemcpyAsync(k.data, keys.data(), size_t(E) * 8, cudaMemcpyHostToDevice, st()));
    DTensor w = alloc({E, R, C / 2}, DType::U8);
    auto s = std::make_shared<DTensor>(alloc({E, R, C / 32}, DType::U8));
    cuda::dummy_mx4(w.ptr<uint8_t>(), s->ptr<uint8_t>(), static_cast<const uint64_t*>(k.data), E, R, C, d, ld, r0, c0,
                    st());
    host_wait();  // the keys' host vector is the caller's
    w.mx_scales = std::move(s);
    ++mx_kept_;
    return w;
  }
  void sync() override { host_wait(); }
  void profile(bool on) override {
    sync();
    CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
  }

  // MpiComm staging (DESIGN §10): device buffer -> pinned host fp32 -> MPI -> back. NCCL comes with
  // the multi-GPU issue; ranks sharing one GPU always take this path.
  void allreduce_sum(const Collectives* comm, const DTensor& t) override {
    if (!comm || comm->size() <= 1 || t.numel() == 0) return;
    const int64_t n = t.numel();
    float* h = pinned(size_t(n) * sizeof(float));
    DTensor f = t.dtype == DType::F32 ? t : alloc(t.shape, DType::F32);
    if (t.dtype != DType::F32) cuda::convert(t.data, dt_of(t), f.data, Dt::F32, n, st());
    CUDA_CHECK(cudaMemcpyAsync(h, f.data, size_t(n) * 4, cudaMemcpyDeviceToHost, st()));
    host_wait();
    comm->allreduce_sum(h, n);
    CUDA_CHECK(cudaMemcpyAsync(f.data, h, size_t(n) * 4, cudaMemcpyHostToDevice, st()));
    if (t.dtype != DType::F32) cuda::convert(f.data, Dt::F32, t.data, dt_of(t), n, st());
    host_wait();  // the pinned buffer is reused by the next call
  }
  // Staged and started: the rows go to the host now (after the kernels that make them), MPI runs
  // while the caller queues more kernels, the rows go up at wait() (which then waits for the device:
  // the host buffers go with the pending). The GPU computes while the host exchanges: the EP
  // dispatch's MPI_Ialltoallv beside this rank's own experts, the CP gathers beside the mixers.
  std::unique_ptr<PendingRows> start_allgather_rows(const Collectives& comm, const DTensor& mine,
                                                    const std::vector<int64_t>& rows_of, int64_t total) override {
    const int64_t W = mine.cols();
    auto p = staged(mine, {total, W});
    p->req = comm.iallgatherv_into(p->send.data(), p->recv.data(), row_bytes_of(rows_of, size_t(W) * dtype_size(mine.dtype)));
    return p;
  }
  std::unique_ptr<PendingRows> start_alltoall_rows(const Collectives& comm, const DTensor& send,
                                                   const std::vector<int64_t>& send_rows,
                                                   const std::vector<int64_t>& recv_rows, int64_t total) override {
    auto p = staged(send, {total, send.cols()});
    const size_t row = size_t(send.cols()) * dtype_size(send.dtype);
    p->req = comm.ialltoallv_into(p->send.data(), row_bytes_of(send_rows, row), p->recv.data(), row_bytes_of(recv_rows, row));
    return p;
  }

  void embed(const DTensor& table, const DTensor& ids, const DTensor& out) override {
    DZ_CHECK(out.dtype == DType::F32 && ids.dtype == DType::I32, "embed: out F32, ids I32");
    cuda::embed(table.data, dt_of(table), ids.ptr<int32_t>(), ids.numel(), table.cols(), out.ptr<float>(), st());
  }
  void rmsnorm(const DTensor& x, const DTensor& w, const DTensor& y, float eps, bool zc) override {
    DZ_CHECK(x.numel() == y.numel(), "rmsnorm: ", shape_str(x.shape), " vs ", shape_str(y.shape));
    const int64_t D = w.defined() ? w.numel() : x.cols();
    cuda::rmsnorm(x.data, dt_of(x), optf(w), y.data, dt_of(y), x.numel() / D, D, eps, zc, st());
  }
  void gated_rmsnorm(const DTensor& x, const DTensor& gate, const DTensor& w, const DTensor& y, float eps,
                     GateAct act) override {
    const int64_t D = w.numel();
    cuda::gated_rmsnorm(x.data, dt_of(x), gate.data, dt_of(gate), optf(w), y.data, dt_of(y), x.numel() / D, D, eps,
                        act == GateAct::SiLU ? 0 : 1, st());
  }
  void add(const DTensor& h, const DTensor& y) override {
    DZ_CHECK(h.numel() == y.numel(), "add: ", shape_str(h.shape), " vs ", shape_str(y.shape));
    cuda::add(h.data, dt_of(h), y.data, dt_of(y), h.numel(), st());
  }
  void mul_sigmoid(const DTensor& x, const DTensor& g) override {
    DZ_CHECK(x.numel() == g.numel(), "mul_sigmoid: ", shape_str(x.shape), " vs ", shape_str(g.shape));
    cuda::mul_sigmoid(x.data, dt_of(x), g.data, dt_of(g), x.numel(), st());
  }
  // y [T, out] = x [T, in] · W [out, in]^T + beta y (fp32 accumulation): in cuBLAS's column-major
  // terms Y^T = W^T' · X^T.
  void gemm(const void* x, const void* W, void* y, DType in_dt, DType out_dt, int64_t T, int64_t in, int64_t out,
            float beta = 0.f) {
    if (T == 0 || out == 0) return;
    const float one = 1.f, b = beta;  // cuBLAS's alpha and beta, by pointer
    if (in == 0) {
      if (beta == 0.f) CUDA_CHECK(cudaMemsetAsync(y, 0, size_t(T * out) * dtype_size(out_dt), st()));
      return;
    }
    const cudaDataType ti = in_dt == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType to = out_dt == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
    CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(T), int(in), &one, W, ti, int(in), x, ti,
                              int(in), &b, y, to, int(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  void linear(const DTensor& x, const DTensor& W, const DTensor& bias, const DTensor& y) override {
    const int64_t in = W.dim(1), out = W.dim(0), T = x.numel() / std::max<int64_t>(in, 1);
    const bool fp8 = W.dtype == DType::F8_E4M3;
    DZ_CHECK(x.numel() == T * in && y.numel() == T * out && (x.dtype == W.dtype || (fp8 && x.dtype == DType::BF16)),
             "linear: x ", shape_str(x.shape), " ", to_string(x.dtype), " W ", shape_str(W.shape), " ",
             to_string(W.dtype), " y ", shape_str(y.shape));
    if (fp8)
      fp8_gemm(x, W, y, T, in, out);
    else
      gemm(x.data, W.data, y.data, x.dtype, y.dtype, T, in, out);
    if (bias.defined() && bias.numel()) cuda::add_bias(y.data, dt_of(y), optf(bias), T, out, st());
  }

  // FP8 block-scaled weights (DeepSeek checkpoints) stay FP8: codes [N, K] E4M3 and the block
  // scales [ceil(N / 128), ceil(K / 128) rounded up to 4] F32 (rows of 16 bytes: what cuBLASLt's
  // BLK128x128 mode reads, measured in kernels/dev/fp8_gemm/probe_blockscale.cu). cuBLASLt needs
  // K to be a multiple of 128; other weights go up in BF16 like any plain weight.
  DTensor weight(const Tensor& t) override {
    if (t.mxfp4 && t.ndim() == 3 && !t.empty() && t.dim(2) % 32 == 0) return mxfp4_weight(t);
    // cuBLASLt has no block-scaled kernel for some small shapes (the heuristic says so; e.g.
    // 64 x 128 weights): those go up in BF16 too, counted out of fp8_weights_kept().
    if (!t.fp8_block_scales || t.ndim() != 2 || t.empty() || t.dim(1) % kFp8WeightBlock != 0 ||
        !fp8_plan(4, t.dim(0), t.dim(1), DType::BF16) || !fp8_plan(256, t.dim(0), t.dim(1), DType::BF16))
      return Backend::upload(t, weight_dtype());
    const int64_t N = t.dim(0), K = t.dim(1), nb = (N + kFp8WeightBlock - 1) / kFp8WeightBlock,
                  kb = K / kFp8WeightBlock, ld = (kb + 3) / 4 * 4;
    const Tensor& sc = *t.fp8_block_scales;
    DZ_CHECK(sc.shape == Shape({nb, kb}), "fp8 weight ", shape_str(t.shape), ": block scales ", shape_str(sc.shape));
    std::vector<uint8_t> codes(size_t(N * K));
    parallel_for(nb, [&](int64_t b0, int64_t b1) {  // whole block rows per thread
      const int64_t r0 = b0 * kFp8WeightBlock, r1 = std::min(N, b1 * kFp8WeightBlock);
      fp8_block_codes(t.row(r0), r1 - r0, K, sc.row(b0), codes.data() + r0 * K);
    }, 8);
    std::vector<float> spad(size_t(nb * ld), 1.f);
    for (int64_t b = 0; b < nb; ++b) std::copy(sc.row(b), sc.row(b) + kb, spad.begin() + b * ld);
    DTensor w = alloc({N, K}, DType::F8_E4M3);
    CUDA_CHECK(cudaMemcpyAsync(w.data, codes.data(), codes.size(), cudaMemcpyHostToDevice, st()));
    auto s = std::make_shared<DTensor>(alloc({nb, ld}, DType::F32));
    CUDA_CHECK(cudaMemcpyAsync(s->data, spad.data(), spad.size() * 4, cudaMemcpyHostToDevice, st()));
    host_wait();  // the host buffers go out of scope
    w.block_scales = std::move(s);
    ++fp8_kept_;
    return w;
  }
  int64_t fp8_weights_kept() const override { return fp8_kept_; }
  int64_t mxfp4_weights_kept() const override { return mx_kept_; }
  // A stack of routed experts [E, N, K] loaded from MXFP4, kept 4-bit: packed [E, N, K/2] U8 with
  // mx_scales [E, N, K/32] U8, re-encoded exactly from the decoded values (core/fp8.hpp; the
  // Tensor's mxfp4 flag promises they are MXFP4, so a value that is not is an internal error).
  DTensor mxfp4_weight(const Tensor& t) {
    const int64_t E = t.dim(0), N = t.dim(1), K = t.dim(2), rows = E * N;
    std::vector<uint8_t> packed(size_t(rows * K / 2)), scales(size_t(rows * K / 32));
    std::atomic<bool> ok{true};
    parallel_for(rows, [&](int64_t r0, int64_t r1) {
      if (!mxfp4_encode_exact(t.ptr() + r0 * K, r1 - r0, K, packed.data() + r0 * K / 2, scales.data() + r0 * K / 32))
        ok = false;
    }, 64);
    DZ_CHECK(ok, "internal: an expert stack ", shape_str(t.shape), " marked MXFP4 holds values that are not");
    DTensor w = alloc({E, N, K / 2}, DType::U8);
    CUDA_CHECK(cudaMemcpyAsync(w.data, packed.data(), packed.size(), cudaMemcpyHostToDevice, st()));
    auto s = std::make_shared<DTensor>(alloc({E, N, K / 32}, DType::U8));
    CUDA_CHECK(cudaMemcpyAsync(s->data, scales.data(), scales.size(), cudaMemcpyHostToDevice, st()));
    host_wait();  // the host buffers go out of scope
    w.mx_scales = std::move(s);
    ++mx_kept_;
    return w;
  }

  // y [T, N] = x [T, K] · W^T with W FP8 block-scaled: x quantised per 128 of a row (E4M3, fp32
  // scale amax / 448, as DeepSeek's act_quant), one cuBLASLt FP8 GEMM with the block scales
  // applied in its fp32 accumulation. cuBLASLt needs the row count to be a multiple of 4 (the
  // activation scales are read as columns of 16 bytes): the quantised rows are zero-padded and the
  // product of a padded row count goes through a temporary.
  void fp8_gemm(const DTensor& x, const DTensor& W, const DTensor& y, int64_t T, int64_t K, int64_t N) {
    if (T == 0 || N == 0) return;
    DZ_CHECK(W.block_scales && K % kFp8WeightBlock == 0, "fp8 linear: W ", shape_str(W.shape), " without block scales");
    const int64_t T4 = (T + 3) / 4 * 4, kb = K / kFp8WeightBlock;
    DTensor xq = alloc({T4, K}, DType::F8_E4M3), xs = alloc({kb, T4}, DType::F32);
    cuda::act_fp8_quantize(b16(x), T, K, T4, xq.ptr<uint8_t>(), xs.ptr<float>(), st());
    DTensor d = T4 == T ? y : alloc({T4, N}, y.dtype);
    Fp8Plan* pp = fp8_plan(T4, N, K, y.dtype);
    DZ_CHECK(pp, "fp8 linear: cuBLASLt has no FP8 block-scaled GEMM for ", T4, " x ", N, " x ", K, " -> ",
             to_string(y.dtype), " (the weight was kept in FP8 for 4 and 256 rows)");
    Fp8Plan& p = *pp;
    const void* ws = W.block_scales->data;
    const void* as = xs.data;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof(ws)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &as, sizeof(as)));
    const float one = 1.f, zero = 0.f;
    CUBLAS_CHECK(cublasLtMatmul(lt_, p.op, &one, W.data, p.a, xq.data, p.b, &zero, d.data, p.d, d.data, p.d, &p.algo,
                                blas_ws_, kBlasWs, st()));
    if (T4 != T) copy_rows(d, 0, y.reshaped({T, N}), 0, T);
  }

  // One cuBLASLt description per GEMM shape (D = W · Xq^T in column-major terms: W^T is K x N, Xq^T
  // K x T4, D N x T4 = y [T4, N] row-major), with the algorithm the heuristic picks; the scale
  // pointers are set per call.
  struct Fp8Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    void destroy() {
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (d) cublasLtMatrixLayoutDestroy(d);
      if (op) cublasLtMatmulDescDestroy(op);
    }
  };
  // nullptr: no kernel for this shape.
  Fp8Plan* fp8_plan(int64_t T4, int64_t N, int64_t K, DType out) {
    const auto key = std::make_tuple(T4, N, K, int(out));
    auto it = fp8_plans_.find(key);
    if (it != fp8_plans_.end()) return &it->second;
    DZ_CHECK(out == DType::BF16 || out == DType::F32, "fp8 linear: output ", to_string(out));
    Fp8Plan p;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    const cublasLtMatmulMatrixScale_t wm = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                      xm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof(tA)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof(tB)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &wm, sizeof(wm)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &xm, sizeof(xm)));
    // With the scale pointers unset the heuristic offered no kernel for any shape (H200, cuBLASLt
    // 13.1; the probe in kernels/dev/fp8_gemm sets them first): an aligned device address stands in
    // here, fp8_gemm sets the real ones per call.
    const void* stand_in = blas_ws_;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof(stand_in)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof(stand_in)));
    const cudaDataType to = out == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(T4), K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, to, uint64_t(N), uint64_t(T4), N));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = kBlasWs;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t h{};
    int n = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.d, p.d, pref, 1, &h, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || n == 0) {
      p.destroy();
      return nullptr;
    }
    p.algo = h.algo;
    return &fp8_plans_.emplace(key, p).first->second;
  }
  void swiglu_mlp(const DTensor& x, const SwigluWeights& w, const DTensor& y) override {
    const int64_t D = w.gate.dim(1), I = w.gate.dim(0), T = x.numel() / D;
    DTensor g = alloc({T, I}, DType::BF16), u = alloc({T, I}, DType::BF16);
    linear(x, w.gate, DTensor{}, g);
    linear(x, w.up, DTensor{}, u);
    cuda::silu_mul(b16(g), b16(u), b16w(g), T * I, w.act, st());
    linear(g, w.down, DTensor{}, y);
  }
  void moe_route(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& idx,
                 const DTensor& wt) override {
    const DTensor& rx = w.route_x.defined() ? w.route_x : x;
    const int64_t D = w.router.dim(1), T = rx.numel() / D, k = rc.top_k;
    check_moe_route(w, T, k, idx, wt);
    if (T > 0) route(rc, w, rx, idx, wt);
  }
  // The router on rx [T, D]: idx, wt [T, top_k] (checked by the caller: check_moe_route).
  void route(const RouterConfig& rc, const MoeWeights& w, const DTensor& rx, const DTensor& idx, const DTensor& wt) {
    const int64_t D = w.router.dim(1), T = rx.numel() / D, k = rc.top_k, E = rc.n_experts;
    // Routing in fp32 (decisions must not depend on bf16 rounding of the logits).
    DTensor logits = alloc({T, E}, DType::F32);
    if (rx.dtype == DType::BF16) {
      // On tensor cores, still exact products: the fp32 router is split into three bf16 terms
      // that sum to it exactly, so every bf16 x bf16 product is exact and only the fp32
      // accumulation rounds, as in an fp32 GEMM (which ran on the SIMT units: 1.5 ms of a Qwen3.5
      // forward at T = 8192). Smallest term first.
      DTensor w3 = alloc({3, E, D}, DType::BF16);
      cuda::split_bf16x3(w.router.ptr<float>(), E * D, b16w(w3), st());
      for (int i = 2; i >= 0; --i)
        gemm(rx.data, b16(w3) + i * E * D, logits.data, DType::BF16, DType::F32, T, D, E, i < 2 ? 1.f : 0.f);
    } else {
      DTensor xf = alloc({T, D}, DType::F32);
      cuda::convert(rx.data, dt_of(rx), xf.data, Dt::F32, T * D, st());
      gemm(xf.data, w.router.data, logits.data, DType::F32, DType::F32, T, D, E);
    }
    cuda::RouteParams rp;
    rp.E = int(E);
    rp.top_k = int(k);
    rp.n_group = int(rc.n_group);
    rp.topk_group = int(rc.topk_group);
    rp.score = rc.score_func == ScoreFunc::Softmax ? 0 : rc.score_func == ScoreFunc::Sigmoid ? 1 : 2;
    rp.norm_topk_prob = rc.norm_topk_prob;
    rp.top2sum = rc.group_score == GroupScore::Top2Sum;
    rp.scaling = rc.routed_scaling_factor;
    cuda::moe_select(logits.ptr<float>(), optf(w.bias), T, rp, idx.ptr<int32_t>(), wt.ptr<float>(), route_bad_, st(),
                     w.fixed.defined() ? w.fixed.ptr<int32_t>() : nullptr);
  }
  void moe(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& y) override {
    const int64_t k = rc.top_k, E = rc.n_experts, El = w.experts.gate.dim(0);
    const int64_t I = w.experts.gate.dim(1), DX = w.experts.down.dim(1);  // DX: the experts' input width
    const int64_t T = x.numel() / DX, D = w.has_shared ? DX : w.router.dim(1);
    if (T == 0) return;
    DZ_CHECK(x.numel() == T * DX && y.numel() == T * DX && !(w.route_x.defined() && w.has_shared), "moe: x ",
             shape_str(x.shape), " y ", shape_str(y.shape), " for rows of ", DX);
    check_moe_local(w, T, k, E);
    DTensor idx, wt;
    if (w.fixed_wt.defined()) {  // routed elsewhere: the experts and weights as given
      idx = w.fixed, wt = w.fixed_wt;
    } else {
      const DTensor& rx = w.route_x.defined() ? w.route_x : x;  // the router's input (latent MoE: not x)
      DZ_CHECK(rx.numel() == T * D, "moe: router input ", shape_str(rx.shape), " for ", T, " rows of ", D);
      idx = alloc({T, k}, DType::I32), wt = alloc({T, k}, DType::F32);
      check_moe_route(w, T, k, idx, wt);
      route(rc, w, rx, idx, wt);
    }
    // Expert parallelism: assignments to other ranks' experts go to one sink bucket El (weight 0)
    // that no GEMM computes; its rows of ys are zeroed so the combine adds exact zeros.
    const bool ep = El != E;
    if (ep) {
      DTensor li = alloc({T, k}, DType::I32), lw = alloc({T, k}, DType::F32);
      cuda::moe_local_experts(idx.ptr<int32_t>(), wt.ptr<float>(), T * k, int(w.e0), int(El), li.ptr<int32_t>(),
                              lw.ptr<float>(), st());
      idx = li, wt = lw;
    }
    const int64_t EB = ep ? El + 1 : El;  // dispatch buckets
    // Dispatch: assignments grouped by expert, 64-row tiles per expert for the grouped GEMMs.
    const int64_t n = T * k, max_tiles = n / 64 + EB + 1;
    DTensor counts = alloc({EB}, DType::I32), offsets = alloc({EB + 1}, DType::I32),
            tile_off = alloc({EB + 1}, DType::I32), perm = alloc({n}, DType::I32), pos_of = alloc({n}, DType::I32);
    cuda::moe_dispatch(idx.ptr<int32_t>(), T, int(k), int(EB), counts.ptr<int32_t>(), offsets.ptr<int32_t>(),
                       tile_off.ptr<int32_t>(), perm.ptr<int32_t>(), pos_of.ptr<int32_t>(), st());
    DTensor hg = alloc({n, I}, DType::BF16), ys = alloc({n, DX}, DType::BF16);
    if (ep) fill_zero(ys);
    // The token rows by expert: read through perm by the BF16 gate / up GEMMs' loaders where that
    // costs them nothing (no gathered copy written and read back), else one gathered copy.
    const bool mx4 = w.experts.gate.mx_scales != nullptr;
    const bool in_loader = !mx4 && cuda::grouped_gemm_gathers_rows(I, DX);
    const DTensor xs = in_loader ? x : alloc({n, DX}, DType::BF16);
    if (!in_loader) cuda::gather_rows(b16(x), perm.ptr<int32_t>(), n, int(k), DX, b16w(xs), st());
    const int32_t* arow = in_loader ? perm.ptr<int32_t>() : nullptr;
    // Tensor-core grouped GEMMs over each expert's rows. (At a decode step's few rows a GEMV
    // version ran slower than these: docs/cuda_backend.md.)
    if (mx4) {  // MXFP4 experts, decoded tile by tile in the GEMMs
      DZ_CHECK(w.experts.up.mx_scales && w.experts.down.mx_scales, "moe: MXFP4 gate without MXFP4 up / down");
      auto mx = [](const DTensor& t) { return cuda::Mx4Weight{t.ptr<uint8_t>(), t.mx_scales->ptr<uint8_t>()}; };
      cuda::grouped_gemm_glu_mx4_tc(b16(xs), mx(w.experts.gate), mx(w.experts.up), offsets.ptr<int32_t>(), int(El),
                                    max_tiles, I, DX, b16w(hg), st(), w.experts.act);
      cuda::grouped_gemm_mx4_tc(b16(hg), mx(w.experts.down), offsets.ptr<int32_t>(), int(El), max_tiles, DX, I,
                                b16w(ys), st());
    } else {
      // BF16: gate and up as two grouped GEMMs, then the activation pass. The kernel that fuses
      // them with the activation (MXFP4 above) ran 1.2-1.4x slower than these three on the H200
      // on every shape measured (docs/perf/experiments_c6788c6.txt; GLM-5.3-Flash at T = 8192:
      // 6.12 ms fused vs 2 x 2.13 ms + the pass).
      DTensor hu = alloc({n, I}, DType::BF16);
      cuda::grouped_gemm_tc(b16(xs), b16(w.experts.gate), offsets.ptr<int32_t>(), tile_off.ptr<int32_t>(), int(El),
                            max_tiles, I, DX, b16w(hg), st(), arow, int(k));
      cuda::grouped_gemm_tc(b16(xs), b16(w.experts.up), offsets.ptr<int32_t>(), tile_off.ptr<int32_t>(), int(El),
                            max_tiles, I, DX, b16w(hu), st(), arow, int(k));
      cuda::silu_mul(b16(hg), b16(hu), b16w(hg), n * I, w.experts.act, st());
      cuda::grouped_gemm_tc(b16(hg), b16(w.experts.down), offsets.ptr<int32_t>(), tile_off.ptr<int32_t>(), int(El),
                            max_tiles, DX, I, b16w(ys), st());
    }
    cuda::moe_combine(b16(ys), pos_of.ptr<int32_t>(), wt.ptr<float>(), T, int(k), DX, b16w(y), st());
    if (w.has_shared) {
      DTensor sh = alloc({T, D}, DType::BF16);
      swiglu_mlp(x, w.shared, sh);
      cuda::shared_expert_add(b16(x), optf(w.shared_gate), b16(sh), T, D, b16w(y), st());
    }
  }
  void short_conv(const DTensor& x, const DTensor& w, const DTensor& state, const DTensor& y) override {
    const int64_t C = w.dim(0), W = w.dim(1), T = x.numel() / C;
    const DTensor dcu = device_offsets({0, T});  // a kernel, not an upload: decode graphs capture this
    cuda::short_conv_prefill(b16(x), b16(w), nullptr, dcu.ptr<int32_t>(), 1, T, int(C), int(W), b16w(state), b16w(y),
                             st());
  }
  void short_conv_split(const DTensor& x, const DTensor& w, const DTensor& state,
                        const std::vector<DTensor>& ys) override {
    check_conv_split(x, w, ys);
    const int64_t C = w.dim(0), W = w.dim(1), T = x.numel() / C;
    cuda::ConvOut out;
    out.n = int(ys.size());
    for (int s = 0; s < out.n; ++s) {
      out.y[s] = b16w(ys[size_t(s)]);
      out.c0[s + 1] = out.c0[s] + int(ys[size_t(s)].cols());
    }
    const DTensor dcu = device_offsets({0, T});
    cuda::short_conv_prefill(b16(x), b16(w), nullptr, dcu.ptr<int32_t>(), 1, T, int(C), int(W), b16w(state), out, st());
  }
  // The kernels' view of one sequence's scan (q/k/v/beta/gate and sizes; the caller adds the rest).
  static cuda::LaPrefill prefill_args(const LaScanArgs& a) {
    cuda::LaPrefill p;
    p.kda = a.kda;
    p.q = b16(a.q);
    p.k = b16(a.k);
    p.v = b16(a.v);
    p.b = b16(a.beta);
    p.gate.f = b16(a.gate.f);
    p.gate.A_log = optf(a.gate.A_log);
    p.gate.dt_bias = optf(a.gate.dt_bias);
    p.gate.lower_bound = a.gate.lower_bound;
    p.HK = int(a.HK), p.HV = int(a.HV), p.K = int(a.K), p.V = int(a.V);
    p.scale = a.scale;
    p.o = b16w(a.o);
    return p;
  }
  void la_scan(const LaScanArgs& a) override {
    const int64_t T = a.v.numel() / (a.HV * a.V);
    if (T == 0) return;
    if (!a.cu.empty() && !(cuda::la_chunked_supports(int(a.K), int(a.V)) && a.sequences() > 1)) {
      for (int64_t b = 0; b < a.sequences(); ++b) la_scan(a.sequence(b));  // small heads: per sequence
      return;
    }
    if (!a.cu.empty()) {  // varlen: one chunked launch over every (sequence, head), states [N, ...]
      const int64_t N = a.sequences();
      DZ_CHECK(a.cu.front() == 0 && a.cu.back() == T && a.state.numel() == N * a.HV * a.K * a.V,
               "la_scan: varlen offsets end at ", a.cu.back(), " for ", T, " rows, state ", shape_str(a.state.shape));
      if (T == N) {  // one token per sequence (a batched decode step): the recurrent decode kernel
        decode_step(a, N, a.state);
        return;
      }
      std::vector<int32_t> cu32(a.cu.begin(), a.cu.end());
      const DTensor dcu = upload_i32(cu32.data(), {N + 1});
      cuda::LaPrefill p = prefill_args(a);
      p.cu_seqlens = dcu.ptr<int32_t>();
      p.N = int(N);
      DTensor ht = alloc(a.state.shape, DType::F32);
      p.h0 = a.state.ptr<float>();
      p.ht = ht.ptr<float>();
      p.T_total = T;
      DTensor ws = alloc({int64_t(cuda::la_prefill_workspace_bytes(T, int(N), p.HV, p.K, p.V))}, DType::U8);
      p.workspace = ws.data;
      cuda::la_chunk_prefill(p, st());
      copy_rows(ht.reshaped({1, ht.numel()}), 0, a.state.reshaped({1, ht.numel()}), 0, 1);
      return;
    }
    cuda::LaPrefill p = prefill_args(a);
    if (!cuda::la_chunked_supports(p.K, p.V)) {  // small heads: the token-by-token kernel
      cuda::la_recurrent(p, T, a.state.ptr<float>(), st());
      return;
    }
    if (T == 1) {  // one token: the recurrent decode kernel on the state in place
      decode_step(a, 1, a.state);
      return;
    }
    const int32_t cu[2] = {0, int32_t(T)};
    DTensor dcu = upload_i32(cu, {2});
    p.cu_seqlens = dcu.ptr<int32_t>();
    p.N = 1;
    DTensor ht = alloc(a.state.shape, DType::F32);
    p.h0 = a.state.ptr<float>();
    p.ht = ht.ptr<float>();
    p.T_total = T;
    // a long sequence: the intra-GPU scan where la_scan_segments takes it, else the next segment's
    // prep beside this one's recurrence (la_pipeline_segments, 1 where the scan runs). The side
    // stream is made only for the latter: short calls, graph-captured ones included, and the scan
    // never make it.
    p.side = &la_side_;
    if (cuda::la_pipeline_segments(p) > 1) la_side_.create();
    DTensor ws = alloc({int64_t(cuda::la_prefill_workspace_bytes(T, 1, p.HV, p.K, p.V))}, DType::U8);
    p.workspace = ws.data;
    cuda::la_chunk_prefill(p, st());
    copy_rows(ht.reshaped({1, ht.numel()}), 0, a.state.reshaped({1, ht.numel()}), 0, 1);
  }
  // A decode step over pool slots: the recurrent decode kernel reads and writes each sequence's
  // slot in place (slots from a kernel argument, so a graph can capture it). Small heads (no
  // decode kernel): la_scan per sequence, the token-by-token kernel, as la_scan itself does.
  void la_decode_slots(const LaScanArgs& a, const DTensor& states, const std::vector<int32_t>& slots) override {
    if (!cuda::la_chunked_supports(int(a.K), int(a.V))) {
      Backend::la_decode_slots(a, states, slots);
      return;
    }
    check_la_slots(a, states, slots);
    const int64_t N = int64_t(slots.size());
    if (N == 0) return;
    const DTensor ds = device_i32(slots);
    decode_kernel(a, N, ds, states);
  }
  // A packed verify forward keeping per-row states: the decode kernel over every document's rows in
  // order (one launch; each CTA keeps its state block in registers across the rows), the state
  // after each row to `states`. Small heads (no decode kernel): the default, row by row.
  void la_scan_states_slots(const LaScanArgs& a, const DTensor& pool, const std::vector<int32_t>& slots,
                            const DTensor& states) override {
    if (!cuda::la_chunked_supports(int(a.K), int(a.V))) {
      Backend::la_scan_states_slots(a, pool, slots, states);
      return;
    }
    const int64_t N = int64_t(slots.size()), T = a.v.rows();
    DZ_CHECK(N >= 1 && a.sequences() == N && a.cu.front() == 0 && a.cu.back() == T &&
                 states.numel() == T * a.HV * a.K * a.V,
             "la_scan_states_slots: ", N, " slots, ", a.sequences(), " sequences, ", T, " rows, states ",
             shape_str(states.shape));
    for (int32_t s : slots)
      DZ_CHECK(s >= 0 && s < pool.dim(0), "la_scan_states_slots: slot ", s, " outside the pool of ", pool.dim(0));
    std::vector<int32_t> cu32(a.cu.begin(), a.cu.end());
    const DTensor ds = device_i32(slots), dcu = device_i32(cu32);
    decode_kernel(a, N, ds, pool, &dcu, &states);
  }
  void short_conv_slots(const DTensor& x, const DTensor& w, const DTensor& states, const std::vector<int32_t>& slots,
                        const DTensor& y) override {
    check_conv_slots(x, w, states, slots, y);
    const int64_t C = w.dim(0), W = w.dim(1), N = int64_t(slots.size());
    if (N == 0) return;
    const DTensor ds = device_i32(slots);
    cuda::short_conv_update(b16(x), b16(w), nullptr, ds.ptr<int32_t>(), int(N), int(C), int(W), b16w(states), b16w(y),
                            st());
  }
  // Host values -> I32 on the device from kernel arguments (kSmallI32 per launch): no upload, so
  // a graph capture may record it.
  DTensor device_i32(const std::vector<int32_t>& v) {
    const int64_t n = int64_t(v.size());
    DTensor t = alloc({n}, DType::I32);
    for (int64_t i0 = 0; i0 < n; i0 += cuda::kSmallI32) {
      const int m = int(std::min<int64_t>(cuda::kSmallI32, n - i0));
      cuda::SmallI32 c{};
      std::copy(v.begin() + i0, v.begin() + i0 + m, c.v);
      cuda::set_i32(t.ptr<int32_t>() + i0, m, c, st());
    }
    return t;
  }
  // One token of each of n sequences (rows 0..n of a's q / k / v / beta / gate) with the recurrent
  // decode kernel, sequence b's state at slot b of states [n, HV, K, V] (in place).
  void decode_step(const LaScanArgs& a, int64_t n, const DTensor& states) {
    const DTensor slots = positions(0, n);  // slot b = b, made on the stream
    decode_kernel(a, n, slots, states);
  }
  // The decode kernel for n sequences, sequence b at slot slots[b] (device I32) of states; with cu
  // (device I32 [n + 1]), rows cu[b] .. cu[b+1] of sequence b, the state after each row to
  // states_out when given.
  void decode_kernel(const LaScanArgs& a, int64_t n, const DTensor& slots, const DTensor& states,
                     const DTensor* cu = nullptr, const DTensor* states_out = nullptr) {
    const cuda::LaPrefill p = prefill_args(a);
    cuda::LaDecode d;
    d.kda = p.kda;
    d.q = p.q, d.k = p.k, d.v = p.v, d.b = p.b;
    d.gate = p.gate;
    d.HK = p.HK, d.HV = p.HV, d.K = p.K, d.V = p.V;
    d.scale = p.scale;
    d.B = int(n);
    d.slot = slots.ptr<int32_t>();
    d.states = states.ptr<float>();
    d.o = p.o;
    if (cu) d.cu = cu->ptr<int32_t>();
    if (states_out) d.states_out = states_out->ptr<float>();
    cuda::la_decode(d, st());
  }
  // Through the scan itself: B is the state after the segment from S = 0; A is the state after it
  // from S = I with v = 0 (the update is linear in S, so that final state is A).
  void la_transition(const LaScanArgs& a, const DTensor& A, const DTensor& B) override {
    const int64_t T = a.v.numel() / (a.HV * a.V), HV = a.HV, K = a.K;
    LaScanArgs s = a;
    s.q = a.k;  // outputs are discarded: any valid query
    fill_zero(B);
    s.state = B;
    s.o = alloc({T, HV * a.V}, DType::BF16);
    la_scan(s);
    std::vector<float> eye(size_t(HV * K * K), 0.f);
    for (int64_t h = 0; h < HV; ++h)
      for (int64_t i = 0; i < K; ++i) eye[size_t((h * K + i) * K + i)] = 1.f;
    CUDA_CHECK(cudaMemcpyAsync(A.data, eye.data(), eye.size() * sizeof(float), cudaMemcpyHostToDevice, st()));
    host_wait();
    LaScanArgs t = s;
    t.V = K;
    t.v = zeros({T, HV * K}, DType::BF16);
    t.state = A;
    t.o = alloc({T, HV * K}, DType::BF16);
    la_scan(t);
  }
  // S_{j+1} = A_j S_j + B_j, one batched fp32 GEMM over the heads per transition.
  void la_merge(const DTensor& A, const DTensor& B, int64_t n, const DTensor& S_init, const DTensor& S_final) override {
    const int64_t HV = A.dim(1), K = A.dim(2), V = B.dim(3), nA = HV * K * K, nB = HV * K * V;
    DTensor S = zeros({HV, K, V}, DType::F32);
    const float one = 1.f;
    for (int64_t j = 0; j < n; ++j) {
      float* init = S_init.ptr<float>() + j * nB;
      CUDA_CHECK(cudaMemcpyAsync(init, S.data, size_t(nB) * 4, cudaMemcpyDeviceToDevice, st()));
      CUDA_CHECK(cudaMemcpyAsync(S.data, B.ptr<float>() + j * nB, size_t(nB) * 4, cudaMemcpyDeviceToDevice, st()));
      // row-major S_next [K, V] += A [K, K] · S_init [K, V]: column-major S_next^T += S_init^T · A^T
      CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(V), int(K), int(K), &one, init,
                                             int(V), K * V, A.ptr<float>() + j * nA, int(K), K * K, &one,
                                             S.ptr<float>(), int(V), K * V, int(HV)));
    }
    CUDA_CHECK(cudaMemcpyAsync(S_final.data, S.data, size_t(nB) * 4, cudaMemcpyDeviceToDevice, st()));
  }
  static cuda::RopeParams rope_params(const Rope& r) {
    cuda::RopeParams p;
    const auto& f = r.inv_freq();
    DZ_CHECK(f.size() <= 256, "rope: ", f.size(), " frequencies (at most 256 on the GPU)");
    p.half = int(f.size());
    p.interleaved = r.interleaved();
    p.cos_sin_mult = r.cos_sin_mult();
    std::copy(f.begin(), f.end(), p.inv_freq);
    return p;
  }
  void rope(const Rope& r, const DTensor& x, int64_t H, int64_t hs, int64_t offset, int64_t pos0) override {
    cuda::rope(x.data, dt_of(x), x.numel() / (H * hs), H, hs, offset, pos0, rope_params(r), st());
  }
  // One launch for every row (positions from the device offsets), not one per sequence.
  void rope_varlen(const Rope& r, const DTensor& x, int64_t H, int64_t hs, int64_t offset,
                   const std::vector<int64_t>& cu) override {
    const int64_t T = x.numel() / (H * hs);
    check_offsets(cu, T, "rope_varlen");
    if (T == 0) return;
    const DTensor dcu = device_offsets(cu);
    cuda::rope_varlen(x.data, dt_of(x), T, H, hs, offset, dcu.ptr<int32_t>(), int(cu.size()) - 1, rope_params(r), st());
  }
  // One launch for every row, positions written by a kernel from its arguments (capturable).
  void rope_rows(const Rope& r, const DTensor& x, int64_t H, int64_t hs, int64_t offset,
                 const std::vector<int64_t>& pos) override {
    const int64_t T = x.numel() / (H * hs);
    DZ_CHECK(int64_t(pos.size()) == T, "rope_rows: ", pos.size(), " positions for ", T, " rows");
    if (T == 0) return;
    std::vector<int32_t> p32(pos.size());
    for (size_t i = 0; i < pos.size(); ++i) {
      DZ_CHECK(pos[i] >= 0 && pos[i] < (int64_t(1) << 31), "rope_rows: position ", pos[i]);
      p32[i] = int32_t(pos[i]);
    }
    const DTensor dp = device_i32(p32);
    cuda::rope_rows(x.data, dt_of(x), T, H, hs, offset, dp.ptr<int32_t>(), rope_params(r), st());
  }
  static void check_offsets(const std::vector<int64_t>& cu, int64_t T, const char* op) {
    DZ_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == T && T < (int64_t(1) << 31) &&
                 cu.size() < (size_t(1) << 31),
             op, ": ", cu.size(), " varlen offsets ending at ", cu.empty() ? -1 : cu.back(), " for ", T, " rows");
    for (size_t b = 0; b + 1 < cu.size(); ++b) DZ_CHECK(cu[b] <= cu[b + 1], op, ": offsets decrease at sequence ", b);
  }
  // Host row offsets -> I32 [N + 1] on the device without a host wait: one tiny kernel for up to
  // kSmallI32 values (capturable), else an upload.
  DTensor device_offsets(const std::vector<int64_t>& cu) {
    const int64_t n = int64_t(cu.size());
    if (n <= cuda::kSmallI32) {
      DTensor t = alloc({n}, DType::I32);
      cuda::SmallI32 v{};
      for (int64_t i = 0; i < n; ++i) v.v[i] = int32_t(cu[size_t(i)]);
      cuda::set_i32(t.ptr<int32_t>(), int(n), v, st());
      return t;
    }
    const std::vector<int32_t> h(cu.begin(), cu.end());
    return upload_i32(h.data(), {n});
  }
  void attention(const AttnArgs& a) override {
    const int64_t T = a.q.numel() / (a.Hq * a.Dk), S = a.k.numel() / (a.Hkv * a.Dk);
    const bool sparse = a.sel.defined() && a.sel.numel() > 0;
    if (!a.cu.empty()) {
      a.check_varlen(T, S);
      check_offsets(a.cu, T, "attention");
      if (!sparse && cuda::flash_attention_supports(int(a.Dk), int(a.Dv))) {
        // Dense causal: the flash kernel takes the varlen batch as it is (cu_q = cu_k; each query
        // tile reads only its own sequence's keys, so this equals the per-sequence launches
        // bitwise); grid.z <= 65535 sequences per launch, the offsets pointer advanced per group.
        const int64_t N = a.sequences();
        int64_t max_q = 0;
        for (int64_t b = 0; b < N; ++b) max_q = std::max(max_q, a.cu[size_t(b) + 1] - a.cu[size_t(b)]);
        if (max_q == 0) return;
        const DTensor dcu = device_offsets(a.cu);
        cuda::FlashAttnArgs f = flash_args(a, T, S);
        f.max_q = max_q;
        constexpr int64_t kMaxB = 65535;
        for (int64_t b0 = 0; b0 < N; b0 += kMaxB) {
          f.cu_q = f.cu_k = dcu.ptr<int32_t>() + b0;
          f.B = int(std::min(kMaxB, N - b0));
          cuda::flash_attention(f, st());
        }
        return;
      }
      // Shape dispatch, not a fallback: the warp-per-query kernel (a DSA selection, head dims over
      // 256) takes one sequence per launch.
      for (int64_t b = 0; b < a.sequences(); ++b) attention(a.sequence(b));
      return;
    }
    if (T == 0) return;
    if (!sparse && cuda::flash_attention_supports(int(a.Dk), int(a.Dv))) {
      // Dense causal: the tensor-core flash kernel, one sequence (queries at pos0.., keys 0..pos0+T-1).
      DTensor cu = alloc({4}, DType::I32);
      cuda::set_i32(cu.ptr<int32_t>(), 4, cuda::SmallI32{{0, int32_t(T), 0, int32_t(a.pos0 + T)}}, st());
      cuda::FlashAttnArgs f = flash_args(a, T, S);
      f.cu_q = cu.ptr<int32_t>();
      f.cu_k = cu.ptr<int32_t>() + 2;
      f.B = 1;
      f.max_q = T;
      cuda::flash_attention(f, st());
      return;
    }
    // The DSA selection (and head dims over 256): one warp per (query, head).
    DTensor sel = a.sel;
    if (sparse && sel.device == Device::Host) sel = upload_i32(static_cast<const int32_t*>(a.sel.data), a.sel.shape);
    cuda::attention(b16(a.q), b16(a.k), b16(a.v), b16w(a.out), T, a.pos0, S, int(a.Hq), int(a.Hkv), int(a.Dk),
                    int(a.Dv), a.scale, sparse ? sel.ptr<int32_t>() : nullptr, sparse ? sel.cols() : 0, st());
  }
  // The flash kernel's view of a's tensors (T query rows, S key rows) and dims (offsets and batch
  // set by the caller).
  static cuda::FlashAttnArgs flash_args(const AttnArgs& a, int64_t T, int64_t S) {
    cuda::FlashAttnArgs f;
    f.rows_q = T;
    f.rows_k = S;
    f.q = b16(a.q);
    f.k = b16(a.k);
    f.v = b16(a.v);
    f.out = b16w(a.out);
    f.Hq = int(a.Hq);
    f.Hkv = int(a.Hkv);
    f.Dk = int(a.Dk);
    f.Dv = int(a.Dv);
    f.scale = a.scale;
    return f;
  }
  // Row-major Y_h [T, n] = X_h [T, k] · M_h, in cuBLAS's column-major terms Y_h^T = M_h^T · X_h^T,
  // one strided batch over the heads (M_h^T is M_h's row-major block read as is, or W_h's
  // transposed).
  void head_matmul(const DTensor& x, int64_t x_hs, int64_t k, const DTensor& W, int64_t w0, int64_t w_hs, bool trans_w,
                   const DTensor& y, int64_t y_hs, int64_t n, int64_t H) override {
    check_head_matmul(x, x_hs, k, W, w0, w_hs, y, y_hs, n, H);
    DZ_CHECK(x.dtype == DType::BF16 && W.dtype == DType::BF16 && y.dtype == DType::BF16, "head_matmul: x ",
             to_string(x.dtype), ", W ", to_string(W.dtype), ", y ", to_string(y.dtype), " (BF16 expected)");
    const int64_t T = x.rows(), xc = x.cols(), yc = y.cols();
    if (T == 0 || n == 0) return;
    const float one = 1.f, zero = 0.f;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(T), int(k), &one, b16(W) + w0, CUDA_R_16BF,
        int(trans_w ? k : n), w_hs, b16(x), CUDA_R_16BF, int(xc), x_hs, &zero, b16w(y), CUDA_R_16BF, int(yc), y_hs,
        int(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // Two production kernels, chosen by shape (not a fallback: each is the kernel for its sizes):
  //  - (R, DR) in {(512, 64), (128, 64), (512, 0)} (sparse_mla_supports): kernels/sparse_mla.cu straight on
  //    the cache rows, dense causal (entries = positions 0 .. S-1, each query cut at its own
  //    position) or the DSA selection; the rows [S, R + DR] are one sequence's BF16 LatentCache
  //    through the identity block table of row_pages (the kernel reads only rows <= a query's
  //    position < S, so any contiguous rows work, a RowStore's included); split-KV for small
  //    decode batches with per-call scratch;
  //  - other sizes: the generic attention op (Hkv = 1, Dk = R + DR, Dv = R) over a copy of the
  //    value columns (the flash kernel when dense with head dims <= 256, else the warp-per-query
  //    kernel).
  // The cache is BF16 here (--kv-cache fp8 stores FP8-rounded values in BF16 rows).
  bool mla_latent_fused(int64_t R, int64_t DR) const override {
    return cuda::sparse_mla_supports(int32_t(R), int32_t(DR));
  }
  void mla_latent_attention(const DTensor& q, const DTensor& kv, const DTensor& sel, int64_t pos0, int64_t H, int64_t R,
                            int64_t DR, float scale, const DTensor& out) override {
    if (!cuda::sparse_mla_supports(int32_t(R), int32_t(DR))) {
      mla_latent_attention_generic(q, kv, sel, pos0, H, R, DR, scale, out);
      return;
    }
    const int64_t Dk = R + DR, T = check_mla_latent(q, kv, out, H, R, DR), S = kv.rows();
    if (T == 0) return;
    const bool sparse = sel.defined() && sel.numel() > 0;
    DZ_CHECK(pos0 >= 0 && S >= pos0 + T && S < (int64_t(1) << 31), "mla_latent_attention: ", T,
             " queries from position ", pos0, " over ", S, " cache rows");
    DZ_CHECK(!sparse || (sel.dtype == DType::I32 && sel.rows() == T), "mla_latent_attention: selection ",
             shape_str(sel.shape), " ", to_string(sel.dtype), " for ", T, " queries");
    DZ_CHECK(cuda::aligned16(q.data) && cuda::aligned16(kv.data),
             "mla_latent_attention: q and the cache rows must be 16-byte aligned");
    DTensor dsel = sel;
    if (sparse && sel.device == Device::Host) dsel = upload_i32(static_cast<const int32_t*>(sel.data), sel.shape);
    const int64_t K = sparse ? sel.cols() : S;  // entries per query
    const RowPages pg = row_pages(S, T);
    const DTensor pos = positions(pos0, T);
    cuda::LatentCache cache;
    cache.R = int32_t(R);
    cache.DR = int32_t(DR);
    cache.fp8 = false;
    cache.bf16 = b16w(kv);
    constexpr int64_t kMaxQ = 32768;  // queries per launch (the kernel's grid.y < 65536)
    for (int64_t t0 = 0; t0 < T; t0 += kMaxQ) {
      const int64_t n = std::min(kMaxQ, T - t0);
      const int64_t ns = cuda::sparse_mla_scratch_elems(n, int32_t(H), int32_t(R), int32_t(K));
      const DTensor scratch = ns > 0 ? alloc({ns}, DType::F32) : DTensor{};
      cuda::sparse_mla(b16(q) + t0 * H * Dk, sparse ? dsel.ptr<int32_t>() + t0 * K : nullptr, int32_t(K),
                       pg.seq.ptr<int32_t>() + t0, pos.ptr<int32_t>() + t0, n, int32_t(H), pg.bt, cache, scale,
                       b16w(out) + t0 * H * R, st(), ns > 0 ? scratch.ptr<float>() : nullptr, ns);
    }
  }
  void layer_norm(const DTensor& x, const DTensor& w, const DTensor& b, const DTensor& y, float eps) override {
    const int64_t D = w.numel();
    cuda::layer_norm(x.data, dt_of(x), optf(w), optf(b), y.data, dt_of(y), x.numel() / D, D, eps, st());
  }
  void indexer_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& keys, int64_t pos0, int64_t H,
                    int64_t K, const DTensor& sel) override {
    const int64_t T = w.rows(), D = keys.cols(), S = pos0 + T;
    if (T == 0) return;
    DTensor ws = alloc({T, H}, DType::F32);
    CUDA_CHECK(cudaMemcpyAsync(ws.data, w.data, size_t(T * H) * 4, cudaMemcpyDeviceToDevice, st()));
    cuda::scale(ws.ptr<float>(), wscale, T * H, st());
    const DTensor dpos = positions(pos0, T);
    // H 16 / 32 / 64 with D 64 / 128 (DeepSeek-V3.2, GLM-5): the wgmma scores over the contiguous
    // key rows (kernels/indexer_wgmma.cuh) into scratch score rows, then each query block's Top-K
    // (from the scores' histograms for H 32 / 64 with rows under 65536 keys: two reads of a row
    // instead of topk_from_scores' five). A prompt longer than one block of <= 2^27 scratch floats
    // runs each block's Top-K on a second stream beside the next block's scores (two blocks of
    // scratch in turn; the selections are the serial loop's: kernels/dev/indexer's test).
    if (cuda::indexer_scores_wgmma_takes(int(H), int(D), q.data, keys.data)) {
      const int64_t half = std::max<int64_t>(1, (int64_t(1) << 27) / S);
      const bool overlap = T > half;
      const int64_t block = overlap ? half : T, nbuf = overlap ? 2 : 1;
      const DTensor scratch = alloc({nbuf * block, S}, DType::F32);
      const bool hist = cuda::indexer_hist_takes(int(H), S);
      const DTensor hists = hist ? alloc({nbuf * block, 512}, DType::I32) : DTensor{};
      cuda::indexer_topk_wgmma(b16(q), ws.ptr<float>(), b16(keys), keys.rows(), T, pos0, int(H), int(D),
                               dpos.ptr<int32_t>(), int32_t(K), sel.ptr<int32_t>(), block, scratch.ptr<float>(),
                               hist ? reinterpret_cast<uint32_t*>(hists.ptr<int32_t>()) : nullptr, st(),
                               overlap ? &topk_side() : nullptr);
      return;
    }
    // other H <= 64 with D 64 / 128: the fused paged indexer; other head dims: the generic scores,
    // then topk_from_scores, in query blocks of <= 2^28 scratch floats
    const int64_t block = std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(1) << 28) / S));
    DTensor scratch = alloc({block, S}, DType::F32);
    const bool fused = (D == 64 || D == 128) && H <= 64;
    RowPages pg;
    cuda::IndexKeyCache kc;
    if (fused) {
      DZ_CHECK(keys.mem && int64_t(static_cast<char*>(keys.data) - static_cast<char*>(keys.mem.get())) == 0,
               "indexer_topk: the key rows must start their allocation (a RowStore)");
      pg = row_pages(keys.rows(), T);
      kc.D = int32_t(D);
      kc.bf16 = b16w(keys);
    }
    for (int64_t t0 = 0; t0 < T; t0 += block) {
      const int64_t n = std::min(block, T - t0);
      const bf16* qb = b16(q) + t0 * H * D;
      int32_t* out = sel.ptr<int32_t>() + t0 * K;
      if (fused) {
        cuda::indexer_topk(qb, ws.ptr<float>() + t0 * H, pg.seq.ptr<int32_t>(), dpos.ptr<int32_t>() + t0, n,
                           int32_t(H), pos0 + t0 + n, pg.bt, kc, int32_t(K), out, scratch.ptr<float>(), st());
      } else {
        cuda::indexer_scores_any(qb, ws.ptr<float>() + t0 * H, b16(keys), n, pos0 + t0, int(H), int(D),
                                 scratch.ptr<float>(), S, st());
        cuda::topk_from_scores(scratch.ptr<float>(), S, dpos.ptr<int32_t>() + t0, n, int32_t(K), out, st());
      }
    }
  }
  void indexer_kpool_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& cache, const DTensor& ape,
                          int64_t P, int64_t pos0, int64_t H, int64_t Kp, bool tail, const DTensor& sel) override {
    const int64_t T = w.rows(), D = cache.cols() / 2, S = cache.rows(), NP = S / P;
    if (T == 0) return;
    DZ_CHECK(cache.dtype == DType::BF16 && q.dtype == DType::BF16, "indexer_kpool_topk: bf16 cache and queries");
    DTensor kp = alloc({std::max<int64_t>(NP, 1), D}, DType::F32), k3 = alloc({std::max<int64_t>(NP, 1), 3 * D}, DType::BF16);
    cuda::kpool_pooled_keys(b16(cache), ape.ptr<float>(), S, D, P, kp.ptr<float>(), st());
    cuda::split_bf16x3_rows(kp.ptr<float>(), std::max<int64_t>(NP, 1), D, b16w(k3), st());  // [NP, lo | mid | hi]
    group_pick(q, w, wscale, b16(k3), 3, D, NP, P, pos0, H, Kp, tail, sel);
  }
  void pool_softmax(const DTensor& src, const DTensor& ape, int64_t P, const DTensor& out) override {
    const int64_t D = src.cols() / 2, S = src.rows();
    DZ_CHECK(src.cols() == 2 * D && ape.numel() == P * D && out.numel() == (S / P) * D && S % P == 0 &&
                 src.dtype == DType::BF16,
             "pool_softmax: src ", shape_str(src.shape), " ", to_string(src.dtype), ", ape ", shape_str(ape.shape),
             ", groups of ", P, " -> ", shape_str(out.shape));
    if (S == 0) return;
    DTensor f = alloc({S / P, D}, DType::F32);
    cuda::kpool_pooled_keys(b16(src), ape.ptr<float>(), S, D, P, f.ptr<float>(), st());
    convert(f, out);
  }
  void group_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& keys, int64_t P, int64_t pos0,
                  int64_t H, int64_t K, const DTensor& sel) override {
    const int64_t T = w.rows(), D = keys.cols(), NG = keys.rows();
    DZ_CHECK(q.numel() == T * H * D && sel.numel() == T * K && sel.dtype == DType::I32 && q.dtype == DType::BF16,
             "group_topk: q ", shape_str(q.shape), ", keys ", shape_str(keys.shape), ", sel ", shape_str(sel.shape));
    DZ_CHECK((pos0 + T) / P <= NG, "group_topk: rows reach group ", (pos0 + T) / P - 1, " beyond ", NG, " groups");
    if (T == 0) return;
    DZ_CHECK(keys.dtype == DType::BF16, "group_topk: bf16 keys");
    group_pick(q, w, wscale, b16(keys), 1, D, NG, P, pos0, H, K, false, sel, true);
  }
  void dsv4_attention(const DTensor& q, const DTensor& raw, const DTensor& comp, const DTensor& sel,
                      const DTensor& sinks, int64_t pos0, int64_t H, int64_t W, int64_t m, float scale,
                      const DTensor& out) override {
    const int64_t D = raw.cols(), T = q.rows();
    const bool has_sel = sel.defined() && sel.numel() > 0;
    const int64_t nc = comp.defined() ? comp.rows() : 0;
    DZ_CHECK(q.numel() == T * H * D && out.numel() == T * H * D && raw.rows() >= pos0 + T &&
                 (nc == 0 || comp.cols() == D) && sinks.numel() == H && (!has_sel || sel.rows() == T) &&
                 q.dtype == DType::BF16 && raw.dtype == DType::BF16,
             "dsv4_attention: q ", shape_str(q.shape), ", raw ", shape_str(raw.shape), ", comp ", shape_str(comp.shape),
             ", sel ", shape_str(sel.shape), ", ", H, " heads");
    DTensor dsel = sel;
    if (has_sel && sel.device == Device::Host) dsel = upload_i32(static_cast<const int32_t*>(sel.data), sel.shape);
    cuda::dsv4_attention(b16(q), b16(raw), nc ? b16(comp) : nullptr, nc, has_sel ? dsel.ptr<int32_t>() : nullptr,
                         has_sel ? sel.cols() : 0, sinks.ptr<float>(), b16w(out), T, pos0, H, D, W, m, scale, st());
  }
  // The group selection of indexer_kpool_topk / group_topk: the products q_h · kp_p per block of
  // queries over the groups the block's last query sees, then the head-weighted ReLU sum and the
  // block Top-K; blocks keep the [rows * H, groups] product scratch near 512 MiB. groups_only:
  // sel [T, Kp] holds the groups, else their tokens. The products run on tensor cores, as the
  // router's: the keys kp [>= NP, parts * D] come as the one bf16 part they are (parts 1), or as
  // three bf16 parts per row, smallest first, whose sum is the fp32 keys exactly
  // (split_bf16x3_rows); q is bf16, so every product is exact and the fp32 accumulation is the only
  // rounding (the CPU's fp32 scores within summation order), as in the fp32 SIMT GEMM this replaced
  // (0.84 ms of a GLM-5.3-Flash 4-layer forward at T = 8192, ncu_glm5_3_flash_4l_T8192_2e3de59.json).
  // Three parts are one GEMM over K = 3D against q repeated three times in a row, not three GEMMs
  // accumulating into the product: the [T * H, NP] fp32 product (537 MB at GLM-5.3-Flash's T = 8192)
  // is then written once instead of written three times and read twice (0.7 ms of its 1.0).
  void group_pick(const DTensor& q, const DTensor& w, float wscale, const bf16* kp, int parts, int64_t D, int64_t NP,
                  int64_t P, int64_t pos0, int64_t H, int64_t Kp, bool tail, const DTensor& sel,
                  bool groups_only = false) {
    const int64_t T = w.rows(), KD = parts * D;
    DTensor ws = alloc({T, H}, DType::F32);
    CUDA_CHECK(cudaMemcpyAsync(ws.data, w.data, size_t(T * H) * 4, cudaMemcpyDeviceToDevice, st()));
    cuda::scale(ws.ptr<float>(), wscale, T * H, st());
    // rows * H * max(NP, KD) <= 2^27: the fp32 products and the repeated q under 512 / 256 MiB
    const int64_t wide = std::max<int64_t>(std::max<int64_t>(NP, 1), parts > 1 ? KD : 1);
    const int64_t block = std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(1) << 27) / std::max<int64_t>(H * wide, 1)));
    const int64_t cols = std::max<int64_t>(NP, 1);
    DTensor prod = alloc({block * H, cols}, DType::F32), scores = alloc({block, cols}, DType::F32),
            groups = alloc({block, Kp}, DType::I32);
    DTensor q3;
    if (parts > 1) q3 = alloc({block * H, KD}, DType::BF16);
    const int64_t width = sel.cols();
    const float one = 1.f, zero = 0.f;
    for (int64_t t0 = 0; t0 < T; t0 += block) {
      const int64_t n = std::min(block, T - t0), nv = (pos0 + t0 + n) / P;  // groups visible to the block
      const int64_t ld = std::max<int64_t>(nv, 1);
      const bf16* qb = b16(q) + t0 * H * D;
      if (nv > 0 && parts > 1) {  // q3 [n * H, parts * D]: each q row once per key part
        cuda::repeat_cols(qb, n * H, D, parts, b16w(q3), st());  // (three 2D copies: 0.18 ms, 256-byte rows)
        qb = b16(q3);
      }
      if (nv > 0)  // prod^T [nv, n*H] (column-major) = kp [nv, KD] (rows of KD) x q rows
        CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(nv), int(n * H), int(KD), &one, kp, CUDA_R_16BF,
                                  int(KD), qb, CUDA_R_16BF, int(KD), &zero, prod.data, CUDA_R_32F, int(ld),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      int32_t* out = sel.ptr<int32_t>() + t0 * width;
      cuda::kpool_pick(prod.ptr<float>(), ld, ws.ptr<float>() + t0 * H, n, pos0 + t0, H, P, Kp, tail,
                       scores.ptr<float>(), groups_only ? out : groups.ptr<int32_t>(), groups_only ? nullptr : out,
                       st());
    }
  }
  void quant_round(const DTensor& x, Round kind) override {
    const int64_t n = x.cols(), rows = x.rows();
    if (rows * n == 0 || kind == Round::Bf16) {
      if (x.dtype == DType::F32 && kind == Round::Bf16) {
        DTensor b = alloc(x.shape, DType::BF16);
        convert(x, b);
        convert(b, x);
      }
      return;
    }
    DZ_CHECK(x.dtype == DType::BF16, "quant_round: bf16 rows expected on the cuda backend");
    DTensor codes = alloc({rows, n}, DType::U8);
    if (kind == Round::Mxfp8) {
      DTensor scales = alloc({rows, (n + 31) / 32}, DType::U8);
      cuda::mxfp8_quantize(b16(x), rows, n, codes.ptr<uint8_t>(), scales.ptr<uint8_t>(), st());
      cuda::mxfp8_dequantize_bf16(codes.ptr<uint8_t>(), scales.ptr<uint8_t>(), rows, n, b16w(x), st());
    } else {
      DTensor scales = alloc({rows, (n + 127) / 128}, DType::F32);
      cuda::kv_fp8_quantize(b16(x), rows, n, codes.ptr<uint8_t>(), scales.ptr<float>(), st());
      cuda::kv_fp8_dequantize_bf16(codes.ptr<uint8_t>(), scales.ptr<float>(), rows, n, b16w(x), st());
    }
  }
  void hc_pre(const DTensor& x, const DTensor& fn, const DTensor& base, const DTensor& scale, const HcParams& p,
              const DTensor& coeff, const DTensor& in) override {
    const int64_t T = x.rows(), W = x.cols(), C = fn.rows();
    DTensor m = alloc({T, C}, DType::F32);  // x · fnᵀ in fp32 (as transformers computes the mixing)
    gemm(x.data, fn.data, m.data, DType::F32, DType::F32, T, W, C);
    cuda::hc_pre(x.ptr<float>(), m.ptr<float>(), base.ptr<float>(), scale.ptr<float>(), hc_kernel_params(p), T, in.cols(),
                 coeff.ptr<float>(), in.ptr<float>(), st());
  }
  static cuda::HcKernelParams hc_kernel_params(const HcParams& p) {
    cuda::HcKernelParams kp;
    kp.N = int(p.N), kp.iters = p.iters, kp.eps_norm = p.eps_norm, kp.eps_hc = p.eps_hc;
    return kp;
  }
  // The post fused with the next projection and coefficients, then the collapse fused with the
  // norm, where the kernels take the shape (N = 4, D % 128 == 0: GLM-5.3-Flash, DeepSeek-V4);
  // hc_post + hc_pre + rmsnorm otherwise.
  void hc_post_pre(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N, const DTensor& fn,
                   const DTensor& base, const DTensor& scale, const HcParams& p, const DTensor& coeff_next,
                   const DTensor& in_next, const HcNorm& norm) override {
    DZ_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "hc_post_pre: y is ", to_string(y.dtype));
    const int64_t T = y.rows(), D = y.cols(), C = fn.rows();
    const bool yb = y.dtype == DType::BF16;
    const DType od = norm.out.dtype;
    if (!cuda::hc_post_coeff_fits(int(N), D, x.ptr<float>(), y.data, yb, fn.ptr<float>()) ||
        (od != DType::BF16 && od != DType::F32)) {
      Backend::hc_post_pre(x, coeff, y, N, fn, base, scale, p, coeff_next, in_next, norm);  // the three calls
      return;
    }
    DZ_CHECK(x.cols() == N * D && fn.cols() == N * D && C == (2 + N) * N && norm.out.numel() == T * D &&
                 (!norm.w.defined() || norm.w.numel() == D),
             "hc_post_pre: streams ", shape_str(x.shape), ", fn ", shape_str(fn.shape), ", y ", shape_str(y.shape),
             ", norm out ", shape_str(norm.out.shape));
    cuda::hc_post_coeff(x.ptr<float>(), coeff.ptr<float>(), y.data, yb, int(N), T, D, fn.ptr<float>(),
                        base.ptr<float>(), scale.ptr<float>(), hc_kernel_params(p), coeff_next.ptr<float>(), st());
    cuda::hc_collapse_norm(x.ptr<float>(), coeff_next.ptr<float>(), int(N), T, D, optf(norm.w), norm.eps, norm.zc,
                           norm.out.data, od == DType::BF16, st());
  }
  void hc_post(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N) override {
    DZ_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "hc_post: y is ", to_string(y.dtype));
    cuda::hc_post(x.ptr<float>(), coeff.ptr<float>(), y.data, y.dtype == DType::BF16, int(N), y.rows(), y.cols(), st());
  }
  void hc_expand(const DTensor& h, int64_t N, const DTensor& x) override {
    cuda::hc_expand(h.ptr<float>(), int(N), h.rows(), h.cols(), x.ptr<float>(), st());
  }
  // The streams h, ..., h never materialised for the first sub-layer: its projection is h · fsᵀ with
  // fs the fn blocks summed (a quarter of the GEMM at N = 4) and its collapse reads h once; its post
  // reads h for every old stream. (GLM-5.3-Flash at T = 8192: the expand wrote 537 MB and the
  // projection read it back, 0.18 + 0.31 ms.)
  void hc_pre_expand(const DTensor& h, int64_t N, const DTensor& x, const DTensor& fn, const DTensor& base,
                     const DTensor& scale, const HcParams& p, const DTensor& coeff, const DTensor& in) override {
    const int64_t T = h.rows(), D = h.cols(), C = fn.rows();
    DZ_CHECK(fn.cols() == N * D && x.numel() == T * N * D && in.numel() == T * D, "hc_pre_expand: h ",
             shape_str(h.shape), ", fn ", shape_str(fn.shape), ", streams ", shape_str(x.shape));
    DTensor fs = alloc({C, D}, DType::F32), m = alloc({T, C}, DType::F32);
    cuda::hc_fn_sum(fn.ptr<float>(), C, int(N), D, fs.ptr<float>(), st());
    gemm(h.data, fs.data, m.data, DType::F32, DType::F32, T, D, C);
    cuda::hc_pre(h.ptr<float>(), m.ptr<float>(), base.ptr<float>(), scale.ptr<float>(), hc_kernel_params(p), T, D,
                 coeff.ptr<float>(), in.ptr<float>(), st(), true);
  }
  void hc_post_pre_expand(const DTensor& h, const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N,
                          const DTensor& fn, const DTensor& base, const DTensor& scale, const HcParams& p,
                          const DTensor& coeff_next, const DTensor& in_next, const HcNorm& norm) override {
    const int64_t T = y.rows(), D = y.cols();
    const bool yb = y.dtype == DType::BF16;
    const DType od = norm.out.dtype;
    if (!(yb || y.dtype == DType::F32) || (od != DType::BF16 && od != DType::F32) || h.numel() != T * D ||
        !cuda::hc_post_coeff_fits(int(N), D, x.ptr<float>(), y.data, yb, fn.ptr<float>(), h.ptr<float>())) {
      Backend::hc_post_pre_expand(h, x, coeff, y, N, fn, base, scale, p, coeff_next, in_next, norm);
      return;
    }
    DZ_CHECK(x.cols() == N * D && fn.cols() == N * D && fn.rows() == (2 + N) * N && norm.out.numel() == T * D &&
                 (!norm.w.defined() || norm.w.numel() == D),
             "hc_post_pre_expand: streams ", shape_str(x.shape), ", fn ", shape_str(fn.shape), ", y ", shape_str(y.shape),
             ", norm out ", shape_str(norm.out.shape));
    cuda::hc_post_coeff(x.ptr<float>(), coeff.ptr<float>(), y.data, yb, int(N), T, D, fn.ptr<float>(),
                        base.ptr<float>(), scale.ptr<float>(), hc_kernel_params(p), coeff_next.ptr<float>(), st(),
                        h.ptr<float>());
    cuda::hc_collapse_norm(x.ptr<float>(), coeff_next.ptr<float>(), int(N), T, D, optf(norm.w), norm.eps, norm.zc,
                           norm.out.data, od == DType::BF16, st());
  }
  void hc_post_mean(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N, const DTensor& out) override {
    DZ_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "hc_post_mean: y is ", to_string(y.dtype));
    DZ_CHECK(out.numel() == y.numel() && x.numel() == N * y.numel(), "hc_post_mean: streams ", shape_str(x.shape),
             ", y ", shape_str(y.shape), ", out ", shape_str(out.shape));
    cuda::hc_post(x.ptr<float>(), coeff.ptr<float>(), y.data, y.dtype == DType::BF16, int(N), y.rows(), y.cols(), st(),
                  out.ptr<float>());
  }
  void hc_mean(const DTensor& x, int64_t N, const DTensor& out) override {
    cuda::hc_mean(x.ptr<float>(), int(N), out.rows(), out.cols(), out.ptr<float>(), st());
  }
  void attn_res_mix(const DTensor& blocks, int64_t n, const DTensor& partial, const DTensor& query, float eps,
                    const DTensor& out) override {
    cuda::attn_res_mix(n ? blocks.ptr<float>() : nullptr, n, partial.ptr<float>(), query.ptr<float>(), partial.rows(),
                       partial.cols(), eps, out.ptr<float>(), st());
  }

  void lse_parts(const DTensor& lg, const std::vector<int32_t>& target, int64_t v0,
                 std::vector<double>& parts) override {
    const int64_t m = lg.rows();
    parts.assign(size_t(3 * m), 0.0);
    if (m == 0) return;
    DTensor dt = upload_i32(target.data(), {m});
    DTensor dp = alloc({m, 3}, DType::I64);  // 8-byte elements: the fp64 triples
    cuda::lse_parts(lg.ptr<float>(), m, lg.cols(), dt.ptr<int32_t>(), v0, static_cast<double*>(dp.data), st());
    CUDA_CHECK(cudaMemcpyAsync(parts.data(), dp.data, size_t(3 * m) * sizeof(double), cudaMemcpyDeviceToHost, st()));
    host_wait();
  }
  void row_topk(const DTensor& lg, int64_t k, std::vector<int32_t>& ids, std::vector<float>& vals) override {
    const int64_t m = lg.rows();
    k = std::min(k, lg.cols());
    DZ_CHECK(k <= 64, "--topk ", k, ": at most 64 on the cuda backend");
    DTensor di = alloc({m, k}, DType::I32), dv = alloc({m, k}, DType::F32);
    cuda::row_topk(lg.ptr<float>(), m, lg.cols(), int(k), di.ptr<int32_t>(), dv.ptr<float>(), st());
    ids.resize(size_t(m * k));
    vals.resize(size_t(m * k));
    download_i32(di, ids.data());
    download(dv, vals.data());
  }
  int device_index() const override { return device_; }
  void* native_stream() const override { return stream_->s; }
  bool supports_graphs() const override { return true; }
  void capture_begin() override {
    DZ_CHECK(!stream_->capturing, "capture_begin: a capture is already open");
    CUDA_CHECK(cudaStreamBeginCapture(st(), cudaStreamCaptureModeThreadLocal));
    stream_->capturing = true;
  }
  std::unique_ptr<DeviceGraph> capture_end() override {
    DZ_CHECK(stream_->capturing, "capture_end without capture_begin");
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(st(), &g);
    end_capture_bookkeeping();
    CUDA_CHECK(e);
    cudaGraphExec_t x = nullptr;
    const cudaError_t ie = cudaGraphInstantiateWithFlags(&x, g, 0);
    cudaGraphDestroy(g);
    CUDA_CHECK(ie);
    return std::make_unique<CudaGraph>(x, stream_);
  }
  void capture_abort() override {
    if (!stream_->capturing) return;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(st(), &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // the capture's error, if any, was reported by whatever failed in it
    end_capture_bookkeeping();
  }
  void end_capture_bookkeeping() {
    stream_->capturing = false;
    stream_->captured.clear();
    for (void* p : stream_->held) cudaFreeAsync(p, st());
    stream_->held.clear();
  }
  std::string describe() const override {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    return str("cuda:", device_, " ", prop.name);
  }
  // The stream-ordered pool plus the decode graphs' own memory (graph allocations come from the
  // device's graph memory, not the pool; both high-water marks are added: an upper bound).
  int64_t peak_memory_bytes() const override {
    return int64_t(pool_attr(cudaMemPoolAttrUsedMemHigh)) + graph_mem_attr(cudaGraphMemAttrUsedMemHigh) +
           int64_t(kBlasWs);
  }
  int64_t memory_in_use_bytes() const override {
    return int64_t(pool_attr(cudaMemPoolAttrUsedMemCurrent)) + graph_mem_attr(cudaGraphMemAttrUsedMemCurrent) +
           int64_t(kBlasWs);
  }
  void reset_peak_memory() override {
    uint64_t zero = 0;  // resets the high-water marks to the current use
    CUDA_CHECK(cudaMemPoolSetAttribute(pool(), cudaMemPoolAttrUsedMemHigh, &zero));
    CUDA_CHECK(cudaDeviceSetGraphMemAttribute(device_, cudaGraphMemAttrUsedMemHigh, &zero));
  }
  int64_t graph_mem_attr(cudaGraphMemAttributeType a) const {
    uint64_t v = 0;
    CUDA_CHECK(cudaDeviceGetGraphMemAttribute(device_, a, &v));
    return int64_t(v);
  }
  // ~1 GiB of fp32 logits per chunk (the T × V logits tensor is never materialised).
  int64_t lm_rows_per_chunk(int64_t n) const override {
    return std::max<int64_t>(1, std::min<int64_t>(8192, (int64_t(1) << 28) / std::max<int64_t>(n, 1)));
  }

 private:
  // The device's default pool: every alloc() comes from it (stream-ordered).
  cudaMemPool_t pool() const {
    cudaMemPool_t p;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&p, device_));
    return p;
  }
  // Rows [n, w] of one contiguous buffer (a RowStore's: lib/model/attn_cache.hpp) as the paged cache
  // of one sequence for the kernels that read a BlockTable: pages of kRowPage consecutive rows
  // with the identity table (page i = rows kRowPage*i ..), so slot = position = row; seq [nq]
  // zeros (every query in sequence 0). The indexer and sparse MLA kernels read only rows of
  // positions a query may see (< n), so the last page may be partial. Built on the stream.
  static constexpr int32_t kRowPage = 64;
  struct RowPages {
    DTensor table, seq;  // [pages], [nq] I32
    cuda::BlockTable bt;
  };
  RowPages row_pages(int64_t n, int64_t nq) {
    RowPages r;
    const int64_t pages = (n + kRowPage - 1) / kRowPage;
    DZ_CHECK(pages < (int64_t(1) << 31), "row_pages: ", n, " rows");
    r.table = alloc({std::max<int64_t>(pages, 1)}, DType::I32);
    cuda::iota_i32(r.table.ptr<int32_t>(), pages, 0, st());
    r.seq = zeros({nq}, DType::I32);
    r.bt.table = r.table.ptr<int32_t>();
    r.bt.max_pages = int32_t(pages);
    r.bt.page_size = kRowPage;
    return r;
  }
  // [T] I32 positions pos0 .. pos0+T-1 on the device (no host sync).
  DTensor positions(int64_t pos0, int64_t T) {
    DTensor p = alloc({T}, DType::I32);
    cuda::iota_i32(p.ptr<int32_t>(), T, int32_t(pos0), st());
    return p;
  }
  // Every wait of the host for the stream (downloads, sync, the staged collectives) goes through
  // here, and so does the MoE router's finiteness flag: the routing kernels raise it on the
  // device and it is read at the next host wait (not with a wait of its own per MoE layer), so a
  // non-finite score still stops the job with its name, at the first result the host reads.
  void host_wait() {
    no_capture("a host wait (download, sync or staged collective)");
    CUDA_CHECK(cudaMemcpyAsync(route_bad_host_, route_bad_, sizeof(int32_t), cudaMemcpyDeviceToHost, st()));
    CUDA_CHECK(cudaStreamSynchronize(st()));
    if (*route_bad_host_) {
      *route_bad_host_ = 0;
      CUDA_CHECK(cudaMemsetAsync(route_bad_, 0, sizeof(int32_t), st()));
      dz::fail("moe router: a selection score is not finite (raised by the routing kernel of a forward before this "
               "host read)");
    }
  }
  // Host -> device without a wait: small copies go through a pinned staging ring (two halves;
  // a half is reused only after the event recorded when it filled up, so a copy never reads
  // bytes that a later upload overwrote), larger ones from the caller's pageable memory (CUDA
  // returns once that is staged; the driver may synchronise with the stream to stage it).
  void h2d(void* dst, const void* src, size_t n) {
    no_capture("an upload");  // a recorded copy would replay whatever the source holds then
    constexpr size_t kHalf = kRing / 2;
    if (n > kHalf / 4) {
      CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st()));
      return;
    }
    if (!ring_) {
      CUDA_CHECK(cudaMallocHost(&ring_, kRing));
      for (auto& e : ring_done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    const size_t at = (ring_head_ + 15) / 16 * 16;  // 16-byte aligned sources
    if (at + n > (ring_half_ + 1) * kHalf) {  // this half is full: fence it, move to the other
      CUDA_CHECK(cudaEventRecord(ring_done_[ring_half_], st()));
      ring_half_ ^= 1;
      CUDA_CHECK(cudaEventSynchronize(ring_done_[ring_half_]));  // its last copies are done (long ago, usually)
      ring_head_ = ring_half_ * kHalf;
      return h2d(dst, src, n);
    }
    std::memcpy(static_cast<char*>(ring_) + at, src, n);
    CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<char*>(ring_) + at, n, cudaMemcpyHostToDevice, st()));
    ring_head_ = at + n;
  }
  void no_capture(const char* what) const {
    DZ_CHECK(!stream_->capturing, "cuda backend: ", what, " inside a graph capture (a graph replays kernels on "
             "fixed buffers; host data must be on the device before the capture)");
  }
  uint64_t pool_attr(cudaMemPoolAttr a) const {
    uint64_t v = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(pool(), a, &v));
    return v;
  }
  float* pinned(size_t bytes) {
    if (bytes > pinned_bytes_) {
      if (pinned_) CUDA_CHECK(cudaFreeHost(pinned_));
      pinned_bytes_ = std::max(bytes, 2 * pinned_bytes_);
      CUDA_CHECK(cudaMallocHost(&pinned_, pinned_bytes_));
    }
    return static_cast<float*>(pinned_);
  }

  static constexpr size_t kBlasWs = size_t(32) << 20;
  int device_ = 0;
  int sms_ = 0;
  std::shared_ptr<StreamHolder> stream_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* blas_ws_ = nullptr;  // shared by cuBLAS and cuBLASLt: both run in order on the one stream
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Fp8Plan> fp8_plans_;
  int64_t fp8_kept_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  static constexpr size_t kRing = size_t(4) << 20;
  void* ring_ = nullptr;               // pinned staging for small uploads, two halves of kRing / 2
  size_t ring_head_ = 0;
  int ring_half_ = 0;
  cudaEvent_t ring_done_[2] = {nullptr, nullptr};  // recorded when a half filled up
  int64_t mx_kept_ = 0;  // MXFP4 expert stacks kept 4-bit
  int32_t* route_bad_ = nullptr;       // [1] device: set by moe_select on a non-finite score
  int32_t* route_bad_host_ = nullptr;  // [1] pinned: its copy at each host_wait
  cuda::TopkSide side_;  // indexer_topk's second stream (made at its first use; joined into stream_ by each call)
  cuda::LaSide la_side_;  // the pipelined linear-attention prefill's (the same)

  // An exchange staged through host memory (allgather_rows_start, alltoall_rows_start): wait()
  // completes the MPI request, uploads what arrived and waits for the device (recv goes with
  // this object).
  struct StagedRows final : PendingRows {
    CudaBackend* be = nullptr;
    DTensor out;
    std::vector<char> send, recv;
    std::unique_ptr<CommRequest> req;  // last: completed first when destroyed unwaited
    bool up = false;
    DTensor wait() override {
      if (!up) {
        req->wait();
        if (!recv.empty())
          CUDA_CHECK(cudaMemcpyAsync(out.data, recv.data(), recv.size(), cudaMemcpyHostToDevice, be->st()));
        be->host_wait();
        up = true;
      }
      return out;
    }
  };
  // src's bytes on the host (after the kernels that make it), an output of `shape` allocated.
  std::unique_ptr<StagedRows> staged(const DTensor& src, const Shape& shape) {
    auto p = std::make_unique<StagedRows>();
    p->be = this;
    p->out = alloc(shape, src.dtype);
    p->send.resize(src.bytes());
    p->recv.resize(p->out.bytes());
    if (!p->send.empty())
      CUDA_CHECK(cudaMemcpyAsync(p->send.data(), src.data, p->send.size(), cudaMemcpyDeviceToHost, st()));
    host_wait();
    return p;
  }

  const cuda::TopkSide& topk_side() {
    side_.create();
    return side_;
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace dz
