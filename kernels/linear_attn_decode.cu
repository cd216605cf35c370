// Recurrent KDA / Gated DeltaNet decode: one token per sequence against fp32 state slots (or a few
// in order, LaDecode::cu: a speculative verify forward, keeping each row's state when asked).
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


template <int K, int BV>
struct DecodeSmem {  // one row's inputs and the partial sums of the CTA
  static constexpr int RPP = NT / (BV / 4);
  __align__(16) float qs[K], ks[K], ds[K], vs[BV], red[RPP][BV];
  float beta_s;
};

// Row r (of q / k / v / b / gate.f / o) of the sequence whose [K, BV] state block the CTA holds in
// st: decay, delta update, output. S: where the updated state is written (MAYBE_S: nullptr = not here).
template <int K, int V, int BV, bool KDA, bool MAYBE_S>
__device__ __forceinline__ void decode_row(const LaDecode& p, int r, int h, int hk, int y0, float aexp,
                                           float4 (&st)[K / (NT / (BV / 4))], float4* S, DecodeSmem<K, BV>& sm) {
  constexpr int LPR = BV / 4;      // threads per state row (float4 each)
  constexpr int RPP = NT / LPR;    // rows per pass
  constexpr int RPT = K / RPP;     // rows per thread
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cg = tid % LPR, rg = tid / LPR;
  if (warp < 2) {  // warp 0: k, warp 1: q, L2-normalised
    const bf16* src = (warp == 0 ? p.k : p.q) + (size_t(r) * p.HK + hk) * K;
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
        sm.ks[lane + 32 * m] = xv[m] * inv;
      else
        sm.qs[lane + 32 * m] = p.scale * (xv[m] * inv);
    }
  }
  for (int x = tid; x < K; x += NT) {
    float z;
    if (KDA) {
      const int c = h * K + x;
      z = bf(p.gate.f[size_t(r) * p.HV * K + c]) + (p.gate.dt_bias ? p.gate.dt_bias[c] : 0.f);
    } else {
      z = bf(p.gate.f[size_t(r) * p.HV + h]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f);
    }
    sm.ds[x] = expf(gate(z, aexp, p.gate.lower_bound));
  }
  for (int y = tid; y < BV; y += NT) sm.vs[y] = bf(p.v[(size_t(r) * p.HV + h) * V + y0 + y]);
  if (tid == 0) sm.beta_s = sigmoid(bf(p.b[size_t(r) * p.HV + h]));
  __syncthreads();

  // decay, then partial k^T S over this thread's rows
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < RPT; ++m) {
    const int x = rg + m * RPP;
    const float d = sm.ds[x], kx = sm.ks[x];
    st[m].x *= d, st[m].y *= d, st[m].z *= d, st[m].w *= d;
    acc.x += kx * st[m].x, acc.y += kx * st[m].y, acc.z += kx * st[m].z, acc.w += kx * st[m].w;
  }
  reinterpret_cast<float4*>(sm.red[rg])[cg] = acc;
  __syncthreads();
  float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int q = 0; q < RPP; ++q) {
    const float4 pr = reinterpret_cast<const float4*>(sm.red[q])[cg];
    u.x += pr.x, u.y += pr.y, u.z += pr.z, u.w += pr.w;
  }
  const float bt = sm.beta_s;
  const float4 vv = reinterpret_cast<const float4*>(sm.vs)[cg];
  u = make_float4(bt * (vv.x - u.x), bt * (vv.y - u.y), bt * (vv.z - u.z), bt * (vv.w - u.w));
  __syncthreads();  // red is reused below
  acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < RPT; ++m) {
    const int x = rg + m * RPP;
    const float kx = sm.ks[x], qx = sm.qs[x];
    st[m].x += kx * u.x, st[m].y += kx * u.y, st[m].z += kx * u.z, st[m].w += kx * u.w;
    acc.x += qx * st[m].x, acc.y += qx * st[m].y, acc.z += qx * st[m].z, acc.w += qx * st[m].w;
    if (!MAYBE_S || S) S[x * (V / 4) + cg] = st[m];
  }
  reinterpret_cast<float4*>(sm.red[rg])[cg] = acc;
  __syncthreads();
  for (int y = tid; y < BV; y += NT) {
    float o = 0.f;
    for (int q = 0; q < RPP; ++q) o += sm.red[q][y];
    p.o[(size_t(r) * p.HV + h) * V + y0 + y] = __float2bfloat16(o);
  }
}

// One CTA per (value head, block of BV state columns, sequence b). ROWS = false: one token, row b
// (the decode step). ROWS: rows cu[b] .. cu[b+1] of sequence b in order (a speculative verify
// forward), the state after each row to states_out when given, the slot's after the last.
template <int K, int V, int BV, bool KDA, bool ROWS>
__global__ void __launch_bounds__(NT) decode_kernel(const LaDecode p) {
  constexpr int LPR = BV / 4, RPP = NT / LPR, RPT = K / RPP;
  const int h = blockIdx.x / (V / BV), y0 = (blockIdx.x % (V / BV)) * BV;
  const int b = blockIdx.y, tid = threadIdx.x;
  const int slot = p.slot[b];
  if (slot < 0) return;
  const int hk = h / (p.HV / p.HK);
  const int cg = tid % LPR, rg = tid / LPR;
  float4* S = reinterpret_cast<float4*>(p.states + (size_t(slot) * p.HV + h) * K * V + y0);
  float4 st[RPT];
#pragma unroll
  for (int m = 0; m < RPT; ++m) st[m] = S[(rg + m * RPP) * (V / 4) + cg];
  __shared__ DecodeSmem<K, BV> sm;
  const float aexp = p.gate.A_log ? expf(p.gate.A_log[h]) : 1.f;
  if (!ROWS) {
    decode_row<K, V, BV, KDA, false>(p, b, h, hk, y0, aexp, st, S, sm);
    return;
  }
  const int r0 = p.cu[b], r1 = p.cu[b + 1];
  for (int r = r0; r < r1; ++r) {
    if (r > r0) __syncthreads();  // the previous row's shared values are read to the end
    decode_row<K, V, BV, KDA, true>(p, r, h, hk, y0, aexp, st, r + 1 == r1 ? S : nullptr, sm);
    if (p.states_out) {
      float4* So = reinterpret_cast<float4*>(p.states_out + (size_t(r) * p.HV + h) * K * V + y0);
#pragma unroll
      for (int m = 0; m < RPT; ++m) So[(rg + m * RPP) * (V / 4) + cg] = st[m];
    }
  }
}

template <int K, int V, int BV, bool KDA>
void launch_kv(const LaDecode& p, cudaStream_t stream) {
  const dim3 grid(unsigned(p.HV * (V / BV)), unsigned(p.B));
  if (p.cu)
    decode_kernel<K, V, BV, KDA, true><<<grid, NT, 0, stream>>>(p);
  else
    decode_kernel<K, V, BV, KDA, false><<<grid, NT, 0, stream>>>(p);
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
  DZ_CHECK(!p.states_out || p.cu, "la_decode: per-row states (states_out) need the rows of each sequence (cu)");
  if (p.B == 0 || p.HV == 0) return;
  if (p.kda)
    launch<true>(p, stream);
  else
    launch<false>(p, stream);
}

}  // namespace dz::cuda
