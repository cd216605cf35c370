// Token-by-token delta-rule scan for small head dims (linear_attn.cuh la_recurrent). CPU
// reference: kda_recurrent / gdn_recurrent (lib/ops/linear_attn.cpp). One CTA per value head,
// thread j owns column j of S [K, V] in registers; per token the block stages the normalised q, k,
// the decays and beta in shared memory.
#include <algorithm>

#include "common.cuh"
#include "linear_attn.cuh"
#include "linear_attn_common.cuh"

namespace dz::cuda {

namespace {

constexpr int kMaxK = 64, kMaxV = 256;

template <bool KDA>
__global__ void __launch_bounds__(kMaxV) recurrent_kernel(const LaPrefill p, int64_t T, float* __restrict__ state) {
  const int h = blockIdx.x, j = threadIdx.x, K = p.K, V = p.V;
  const int hk = h / (p.HV / p.HK);
  __shared__ float qs[kMaxK], ks[kMaxK], ds[kMaxK];
  __shared__ float beta_s;
  float s[kMaxK];
  float* S = state + size_t(h) * K * V;
#pragma unroll
  for (int i = 0; i < kMaxK; ++i) s[i] = (i < K && j < V) ? S[size_t(i) * V + j] : 0.f;
  const float aexp = p.gate.A_log ? expf(p.gate.A_log[h]) : 1.f;
  for (int64_t t = 0; t < T; ++t) {
    // warp 0: k, warp 1: q; L2 norm as fla's l2norm (x / sqrt(sum x^2 + 1e-6))
    const int w = j >> 5, lane = j & 31;
    if (w < 2) {
      const bf16* src = (w == 0 ? p.k : p.q) + (size_t(t) * p.HK + hk) * K;
      float ss = 0.f;
      for (int i = lane; i < K; i += 32) {
        const float x = __bfloat162float(src[i]);
        ss += x * x;
      }
      for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = 1.f / sqrtf(ss + 1e-6f);
      for (int i = lane; i < K; i += 32) {
        const float x = __bfloat162float(src[i]) * inv;
        if (w == 0)
          ks[i] = x;
        else
          qs[i] = p.scale * x;
      }
    }
    for (int i = j; i < (KDA ? K : 1); i += blockDim.x) {
      float z;
      if (KDA) {
        const int c = h * K + i;
        z = __bfloat162float(p.gate.f[size_t(t) * p.HV * K + c]) + (p.gate.dt_bias ? p.gate.dt_bias[c] : 0.f);
      } else {
        z = __bfloat162float(p.gate.f[size_t(t) * p.HV + h]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f);
      }
      ds[i] = expf(la::gate(z, aexp, p.gate.lower_bound));
    }
    if (j == 0) beta_s = la::sigmoid(__bfloat162float(p.b[size_t(t) * p.HV + h]));
    __syncthreads();
    if (j < V) {
      const float v = __bfloat162float(p.v[(size_t(t) * p.HV + h) * V + j]);
      float kS = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxK; ++i)
        if (i < K) {
          s[i] *= KDA ? ds[i] : ds[0];
          kS += ks[i] * s[i];
        }
      const float u = beta_s * (v - kS);
      float o = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxK; ++i)
        if (i < K) {
          s[i] += ks[i] * u;
          o += qs[i] * s[i];
        }
      p.o[(size_t(t) * p.HV + h) * V + j] = __float2bfloat16_rn(o);
    }
    __syncthreads();  // qs/ks/ds are rewritten for the next token
  }
  if (j < V)
    for (int i = 0; i < K; ++i) S[size_t(i) * V + j] = s[i];
}

}  // namespace

bool la_chunked_supports(int K, int V) { return K == V && (K == 64 || K == 128); }

void la_recurrent(const LaPrefill& p, int64_t T, float* state, cudaStream_t stream) {
  DZ_CHECK(p.K >= 1 && p.K <= kMaxK && p.V >= 1 && p.V <= kMaxV, "la_recurrent: K=", p.K, " V=", p.V,
           " (K <= ", kMaxK, ", V <= ", kMaxV, ")");
  DZ_CHECK(p.HK > 0 && p.HV % p.HK == 0, "la_recurrent: HV=", p.HV, " not a multiple of HK=", p.HK);
  if (T <= 0 || p.HV == 0) return;
  const int threads = std::max(64, (p.V + 31) / 32 * 32);  // at least the two staging warps
  if (p.kda)
    recurrent_kernel<true><<<unsigned(p.HV), unsigned(threads), 0, stream>>>(p, T, state);
  else
    recurrent_kernel<false><<<unsigned(p.HV), unsigned(threads), 0, stream>>>(p, T, state);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
