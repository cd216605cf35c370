// Recurrent KDA / Gated DeltaNet decode: one token per sequence against fp32 state slots.
// Memory-bound: each (sequence, value head) reads and writes its [K, V] state once. One CTA per
// (value head, sequence); every thread keeps its rows x float4 columns of S in registers, all
// loads issued before the first use. Math: kda_recurrent / gdn_recurrent (lib/ops/linear_attn.cpp).
#include <algorithm>

#include "common.cuh"
#include "linear_attn.cuh"
#include "linear_attn_common.cuh"

namespace dz::cuda {

namespace {

using namespace la;

constexpr int NT = 256;


// One CTA per (value head, block of BV state columns, sequence).
template <int K, int V, int BV, bool KDA>
__global__ void __launch_bounds__(NT) decode_kernel(const LaDecode p) {
  constexpr int LPR = BV / 4;      // threads per state row (float4 each)
  constexpr int RPP = NT / LPR;    // rows per pass
  constexpr int RPT = K / RPP;     // rows per thread
  const int h = blockIdx.x / (V / BV), y0 = (blockIdx.x % (V / BV)) * BV;
  const int b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int slot = p.slot[b];
  if (slot < 0) return;
  const int hk = h / (p.HV / p.HK);
  const int cg = tid % LPR, rg = tid / LPR;
  float4* S = reinterpret_cast<float4*>(p.states + (size_t(slot) * p.HV + h) * K * V + y0);
  float4 st[RPT];
#pragma unroll
  for (int m = 0; m < RPT; ++m) st[m] = S[(rg + m * RPP) * (V / 4) + cg];

  __shared__ __align__(16) float qs[K], ks[K], ds[K], vs[BV], red[RPP][BV];
  __shared__ float beta_s;
  const float aexp = p.gate.A_log ? expf(p.gate.A_log[h]) : 1.f;
  if (warp < 2) {  // warp 0: k, warp 1: q, L2-normalised
    const bf16* src = (warp == 0 ? p.k : p.q) + (size_t(b) * p.HK + hk) * K;
    float xv[K / 32], ss = 0.f;
#pragma unroll
    for (int m = 0; m < K / 32; ++m) {
      xv[m] = bf(src[lane + 32 * m]);
      ss += xv[m] * xv[m];
    }
    const float inv = 1.f / sqrtf(warp_sum(ss) + 1e-6f);
#pragma unroll
    for (int m = 0; m < K / 32; ++m) {
      if (warp == 0)
        ks[lane + 32 * m] = xv[m] * inv;
      else
        qs[lane + 32 * m] = p.scale * (xv[m] * inv);
    }
  }
  for (int x = tid; x < K; x += NT) {
    float z;
    if (KDA) {
      const int c = h * K + x;
      z = bf(p.gate.f[size_t(b) * p.HV * K + c]) + (p.gate.dt_bias ? p.gate.dt_bias[c] : 0.f);
    } else {
      z = bf(p.gate.f[size_t(b) * p.HV + h]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f);
    }
    ds[x] = expf(gate(z, aexp, p.gate.lower_bound));
  }
  for (int y = tid; y < BV; y += NT) vs[y] = bf(p.v[(size_t(b) * p.HV + h) * V + y0 + y]);
  if (tid == 0) beta_s = sigmoid(bf(p.b[size_t(b) * p.HV + h]));
  __syncthreads();

  // decay, then partial k^T S over this thread's rows
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < RPT; ++m) {
    const int x = rg + m * RPP;
    const float d = ds[x], kx = ks[x];
    st[m].x *= d, st[m].y *= d, st[m].z *= d, st[m].w *= d;
    acc.x += kx * st[m].x, acc.y += kx * st[m].y, acc.z += kx * st[m].z, acc.w += kx * st[m].w;
  }
  reinterpret_cast<float4*>(red[rg])[cg] = acc;
  __syncthreads();
  float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int r = 0; r < RPP; ++r) {
    const float4 pr = reinterpret_cast<const float4*>(red[r])[cg];
    u.x += pr.x, u.y += pr.y, u.z += pr.z, u.w += pr.w;
  }
  const float bt = beta_s;
  const float4 vv = reinterpret_cast<const float4*>(vs)[cg];
  u = make_float4(bt * (vv.x - u.x), bt * (vv.y - u.y), bt * (vv.z - u.z), bt * (vv.w - u.w));
  __syncthreads();  // red is reused below
  acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < RPT; ++m) {
    const int x = rg + m * RPP;
    const float kx = ks[x], qx = qs[x];
    st[m].x += kx * u.x, st[m].y += kx * u.y, st[m].z += kx * u.z, st[m].w += kx * u.w;
    acc.x += qx * st[m].x, acc.y += qx * st[m].y, acc.z += qx * st[m].z, acc.w += qx * st[m].w;
    S[x * (V / 4) + cg] = st[m];
  }
  reinterpret_cast<float4*>(red[rg])[cg] = acc;
  __syncthreads();
  for (int y = tid; y < BV; y += NT) {
    float o = 0.f;
    for (int r = 0; r < RPP; ++r) o += red[r][y];
    p.o[(size_t(b) * p.HV + h) * V + y0 + y] = __float2bfloat16(o);
  }
}

template <int K, int V, int BV, bool KDA>
void launch_kv(const LaDecode& p, cudaStream_t stream) {
  decode_kernel<K, V, BV, KDA><<<dim3(unsigned(p.HV * (V / BV)), unsigned(p.B)), NT, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

// Column block from the H200 measurements (docs/perf): with many CTAs (B=256, H=32) 64 columns
// (3.83 TB/s vs 3.75 for whole rows, 2.74 for 32); with few (B=1) 32 columns (4.8 vs 5.2 us).
template <bool KDA>
void launch(const LaDecode& p, cudaStream_t stream) {
  int bv = p.value_block;
  if (!bv) bv = p.B * p.HV >= 2 * sm_count() ? 64 : 32;
  bv = std::min(bv, p.V);
  if (p.K == 64 && p.V == 64)
    bv == 32 ? launch_kv<64, 64, 32, KDA>(p, stream) : launch_kv<64, 64, 64, KDA>(p, stream);
  else if (p.K == 64 && p.V == 128)
    bv == 32 ? launch_kv<64, 128, 32, KDA>(p, stream) : launch_kv<64, 128, 128, KDA>(p, stream);
  else if (p.K == 128 && p.V == 64)
    bv == 32 ? launch_kv<128, 64, 32, KDA>(p, stream) : launch_kv<128, 64, 64, KDA>(p, stream);
  else if (p.K == 128 && p.V == 128)
    bv == 32 ? launch_kv<128, 128, 32, KDA>(p, stream)
             : (bv == 64 ? launch_kv<128, 128, 64, KDA>(p, stream) : launch_kv<128, 128, 128, KDA>(p, stream));
  else
    fail(str("la_decode: K=", p.K, " V=", p.V, " not supported (64 or 128 each)"));
}

}  // namespace


void la_decode(const LaDecode& p, cudaStream_t stream) {
  DZ_CHECK(p.HK > 0 && p.HV % p.HK == 0, "la_decode: HV=", p.HV, " not a multiple of HK=", p.HK);
  if (p.B == 0 || p.HV == 0) return;
  if (p.kda)
    launch<true>(p, stream);
  else
    launch<false>(p, stream);
}

}  // namespace dz::cuda
