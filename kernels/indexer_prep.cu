// Decode preprocessing of the DSA indexer: three GEMMs (cuBLAS) and two small fused kernels, in
// serial or three-stream order (see indexer_prep.cuh).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.cuh"
#include "indexer_prep.cuh"
#include "quant_device.cuh"

#define CUBLAS_CHECK(call)                                                                              \
  do {                                                                                                  \
    cublasStatus_t _s = (call);                                                                         \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                                    \
      ::dz::fail(::dz::str(#call, " failed: ", cublasGetStatusString(_s), " (", __FILE__, ":", __LINE__, ")")); \
  } while (0)

namespace dz::cuda {

namespace {

constexpr int kWarps = 8;         // warps per block in both kernels
constexpr int kMaxD = 256;        // per-warp row staging in shared memory
constexpr int kMaxJ = kMaxD / 32; // elements per lane
// cuBLAS's recommended workspace for Hopper; one per chain so concurrent GEMMs never share one.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// NeoX rotation of element i (< rope) of a staged row: pairs i with i +- half. Written with
// explicit roundings (no FMA contraction) so it is the CPU's arithmetic op for op.
__device__ __forceinline__ float neox(const float* row, int i, int half, const float* cosv, const float* sinv) {
  const int f = i < half ? i : i - half;
  const float c = cosv[f], s = sinv[f];
  if (i < half) return __fsub_rn(__fmul_rn(row[i], c), __fmul_rn(row[i + half], s));  // x1 c - x2 s
  return __fadd_rn(__fmul_rn(row[i], c), __fmul_rn(row[i - half], s));                // x2 c + x1 s
}

// cos/sin of pos * inv_freq[f] as lib/ops/rope.cpp: fp32 angle, double cos/sin rounded to fp32.
__device__ __forceinline__ void rope_cs(int32_t pos, float inv_freq, float* c, float* s) {
  const float ang = __fmul_rn(float(pos), inv_freq);
  double sd, cd;
  sincos(double(ang), &sd, &cd);
  *c = float(cd);
  *s = float(sd);
}

// q: grid (ceil(H / kWarps), B), one warp per (token, head).
//   qf [B, H, D] fp32 (GEMM output) -> q [B, H, D] bf16 after RoPE (and MXFP8 round when mx).
__global__ void q_rope_kernel(const float* __restrict__ qf, const int32_t* __restrict__ pos,
                              const float* __restrict__ inv_freq, int H, int D, int rope, bool mx,
                              __nv_bfloat16* __restrict__ q) {
  __shared__ float cs[2][kMaxD / 2];     // cos, sin for this token
  __shared__ float row[kWarps][kMaxD];   // one head row per warp
  const int b = blockIdx.y, half = rope / 2;
  for (int f = threadIdx.x; f < half; f += blockDim.x) rope_cs(pos[b], inv_freq[f], &cs[0][f], &cs[1][f]);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int h = blockIdx.x * kWarps + warp;
  if (h >= H) return;  // whole warp; no block barrier below
  const int64_t base = (int64_t(b) * H + h) * D;
  float* r = row[warp];
  const int nj = D / 32;
  for (int j = 0; j < nj; ++j) r[lane + 32 * j] = qf[base + lane + 32 * j];
  __syncwarp();
  for (int j = 0; j < nj; ++j) {  // j uniform over the warp: warp_mx_quant needs all 32 lanes
    const int i = lane + 32 * j;
    const float v = i < rope ? neox(r, i, half, cs[0], cs[1]) : r[i];
    __nv_bfloat16 o = __float2bfloat16_rn(v);
    if (mx) {
      // MXFP8 of the bf16 value (group j = elements [32j, 32j+32)), dequantized exactly back.
      uint8_t s;
      const uint8_t code = dev::warp_mx_quant(__bfloat162float(o), true, &s);
      o = __float2bfloat16_rn(dev::e4m3x2_to_f2(code).x * dev::e8m0_value(s));
    }
    q[base + i] = o;
  }
}

// k: one warp per token, grid ceil(B / kWarps).
//   kf [B, D] fp32 (GEMM output) -> LayerNorm (weight + bias, biased variance) -> RoPE -> kb bf16.
__global__ void k_norm_rope_kernel(const float* __restrict__ kf, const int32_t* __restrict__ pos,
                                   const float* __restrict__ inv_freq, const float* __restrict__ lnw,
                                   const float* __restrict__ lnb, int64_t B, int D, int rope, float eps,
                                   __nv_bfloat16* __restrict__ kb) {
  __shared__ float cs[kWarps][2][kMaxD / 2];
  __shared__ float row[kWarps][kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t b = int64_t(blockIdx.x) * kWarps + warp;
  if (b >= B) return;  // whole warp; no block barrier in this kernel
  const int half = rope / 2, nj = D / 32;
  for (int f = lane; f < half; f += 32) rope_cs(pos[b], inv_freq[f], &cs[warp][0][f], &cs[warp][1][f]);
  float x[kMaxJ];
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    x[j] = j < nj ? kf[b * D + lane + 32 * j] : 0.f;
    sum += x[j];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float mean = __fdiv_rn(sum, float(D));
  float var = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j)
    if (j < nj) {
      const float d = x[j] - mean;
      var = __fadd_rn(var, __fmul_rn(d, d));
    }
  for (int o = 16; o > 0; o >>= 1) var += __shfl_xor_sync(0xffffffffu, var, o);
  var = __fdiv_rn(var, float(D));
  const float inv = __fdiv_rn(1.f, __fsqrt_rn(var + eps));
  float* r = row[warp];
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j)
    if (j < nj) {
      const int i = lane + 32 * j;
      r[i] = __fadd_rn(__fmul_rn(__fmul_rn(x[j] - mean, inv), lnw[i]), lnb[i]);
    }
  __syncwarp();  // row and cos/sin written by other lanes
  for (int j = 0; j < nj; ++j) {
    const int i = lane + 32 * j;
    const float v = i < rope ? neox(r, i, half, cs[warp][0], cs[warp][1]) : r[i];
    kb[b * D + i] = __float2bfloat16_rn(v);
  }
}

// Row-major y [rows, N] = alpha * x [rows, K] · W [N, K]^T, bf16 in, fp32 compute and out.
// In cuBLAS's column-major view: y^T (N x rows) = W^T-as-stored (op T on a K x N matrix) · x^T.
void gemm_xwt(cublasHandle_t h, const __nv_bfloat16* x, const __nv_bfloat16* W, float* y, int64_t rows, int64_t K,
              int64_t N, float alpha) {
  const float beta = 0.f;
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(rows), int(K), &alpha, W, CUDA_R_16BF, int(K), x,
                            CUDA_R_16BF, int(K), &beta, y, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

struct IndexerPrep {
  IndexerPrepDims d;
  cudaStream_t side[2] = {nullptr, nullptr};  // chains B (keys) and C (head weights)
  cudaEvent_t fork = nullptr, join[2] = {nullptr, nullptr};
  cublasHandle_t blas[3] = {nullptr, nullptr, nullptr};  // chains A, B, C
  void* ws[3] = {nullptr, nullptr, nullptr};
  float* inv_freq = nullptr;     // [rope / 2]
  float* qf = nullptr;           // [max_tokens, H * D]
  float* kf = nullptr;           // [max_tokens, D]
  __nv_bfloat16* kb = nullptr;   // [max_tokens, D]
};

IndexerPrep* indexer_prep_create(const IndexerPrepDims& d) {
  DZ_CHECK(d.hidden > 0 && d.q_lora > 0 && d.H > 0 && d.max_tokens > 0, "indexer_prep_create: bad dims (hidden ",
           d.hidden, ", q_lora ", d.q_lora, ", H ", d.H, ", max_tokens ", d.max_tokens, ")");
  DZ_CHECK(d.D > 0 && d.D % 32 == 0 && d.D <= kMaxD, "indexer_prep_create: index head dim ", d.D,
           " must be a multiple of 32 and <= ", kMaxD);
  DZ_CHECK(d.rope >= 0 && d.rope % 2 == 0 && d.rope <= d.D, "indexer_prep_create: rope dims ", d.rope,
           " must be even and <= ", d.D);
  DZ_CHECK(d.rope == 0 || d.rope_theta > 1.f, "indexer_prep_create: rope theta must be > 1, got ", d.rope_theta);
  auto* p = new IndexerPrep;
  p->d = d;
  for (auto& s : p->side) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));  // no legacy-stream syncs
  CUDA_CHECK(cudaEventCreateWithFlags(&p->fork, cudaEventDisableTiming));
  for (auto& e : p->join) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (int i = 0; i < 3; ++i) {
    CUBLAS_CHECK(cublasCreate(&p->blas[i]));
    CUDA_CHECK(cudaMalloc(&p->ws[i], kWorkspaceBytes));
  }
  // inv_freq as lib/ops/rope.cpp: theta^(2i/d) in fp32, then its fp32 reciprocal.
  const int half = d.rope / 2;
  std::vector<float> f(size_t(std::max(half, 1)), 0.f);
  for (int i = 0; i < half; ++i) f[size_t(i)] = 1.f / std::pow(d.rope_theta, float(2 * i) / float(d.rope));
  CUDA_CHECK(cudaMalloc(&p->inv_freq, f.size() * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(p->inv_freq, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&p->qf, size_t(d.max_tokens) * d.H * d.D * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&p->kf, size_t(d.max_tokens) * d.D * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&p->kb, size_t(d.max_tokens) * d.D * sizeof(__nv_bfloat16)));
  return p;
}

void indexer_prep_destroy(IndexerPrep* p) {
  if (!p) return;
  for (auto s : p->side) cudaStreamSynchronize(s);  // nothing may still use the buffers
  for (int i = 0; i < 3; ++i) {
    cublasDestroy(p->blas[i]);
    cudaFree(p->ws[i]);
  }
  for (auto s : p->side) cudaStreamDestroy(s);
  cudaEventDestroy(p->fork);
  for (auto e : p->join) cudaEventDestroy(e);
  for (void* b : {static_cast<void*>(p->inv_freq), static_cast<void*>(p->qf), static_cast<void*>(p->kf),
                  static_cast<void*>(p->kb)})
    cudaFree(b);
  delete p;
}

void indexer_prep(IndexerPrep* p, const IndexerPrepWeights& wt, const __nv_bfloat16* x, const __nv_bfloat16* q_resid,
                  const int32_t* seq, const int32_t* pos, int64_t B, const BlockTable& bt, const IndexKeyCache& kc,
                  __nv_bfloat16* q, float* w, IndexerPrepMode mode, cudaStream_t stream) {
  DZ_CHECK(p, "indexer_prep: null context (indexer_prep_create first)");
  const IndexerPrepDims& d = p->d;
  DZ_CHECK(B >= 0 && B <= d.max_tokens, "indexer_prep: ", B, " tokens exceed max_tokens ", d.max_tokens);
  DZ_CHECK(kc.D == d.D, "indexer_prep: key cache head dim ", kc.D, " != index head dim ", d.D);
  DZ_CHECK(B <= 65535, "indexer_prep: ", B, " tokens exceed the grid's y limit");
  if (B == 0) return;
  const bool streams = mode == IndexerPrepMode::Streams;
  // Chain c runs on st[c]; Serial: all on the caller's stream.
  const cudaStream_t st[3] = {stream, streams ? p->side[0] : stream, streams ? p->side[1] : stream};
  // setStream resets the workspace to cuBLAS's pool (which would allocate inside a graph
  // capture), so the chain's own workspace is set again after it.
  for (int c = 0; c < 3; ++c) {
    CUBLAS_CHECK(cublasSetStream(p->blas[c], st[c]));
    CUBLAS_CHECK(cublasSetWorkspace(p->blas[c], p->ws[c], kWorkspaceBytes));
  }
  if (streams) {
    CUDA_CHECK(cudaEventRecord(p->fork, stream));
    for (auto s : p->side) CUDA_CHECK(cudaStreamWaitEvent(s, p->fork, 0));
  }
  const int64_t HD = int64_t(d.H) * d.D;
  // Biggest first: the Q GEMM (reads H*D*q_lora weights) starts before the side chains are issued.
  gemm_xwt(p->blas[0], q_resid, wt.wq_b, p->qf, B, d.q_lora, HD, 1.f);  // qf [B, H*D]
  gemm_xwt(p->blas[1], x, wt.wk, p->kf, B, d.hidden, d.D, 1.f);         // kf [B, D]
  // w: the head-weight scale H^-0.5 D^-0.5 rides on alpha (one fp32 multiply, as the CPU's).
  const float wscale = float(1.0 / std::sqrt(double(d.H)) / std::sqrt(double(d.D)));
  gemm_xwt(p->blas[2], x, wt.weights_proj, w, B, d.hidden, d.H, wscale);  // w [B, H]
  q_rope_kernel<<<dim3(unsigned((d.H + kWarps - 1) / kWarps), unsigned(B)), kWarps * 32, 0, st[0]>>>(
      p->qf, pos, p->inv_freq, d.H, d.D, d.rope, kc.mxfp8, q);
  CUDA_CHECK_LAUNCH();
  k_norm_rope_kernel<<<unsigned((B + kWarps - 1) / kWarps), kWarps * 32, 0, st[1]>>>(
      p->kf, pos, p->inv_freq, wt.k_norm_w, wt.k_norm_b, B, d.D, d.rope, 1e-6f, p->kb);
  CUDA_CHECK_LAUNCH();
  store_index_k(p->kb, seq, pos, B, bt, kc, st[1]);  // quantize (MXFP8 cache) + store
  if (streams) {
    for (int c = 0; c < 2; ++c) {
      CUDA_CHECK(cudaEventRecord(p->join[c], p->side[c]));
      CUDA_CHECK(cudaStreamWaitEvent(stream, p->join[c], 0));
    }
  }
}

}  // namespace dz::cuda
