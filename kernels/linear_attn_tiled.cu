// The register-tiled fp32 chunk kernel: the segment transitions (la_transitions, S0 = I or 0,
// no outputs). Written as the chunked prefill's version 2 (it still computes outputs with
// a.write_o, which kernels/dev/linear_attn/ uses to compare it with v4): version 1's algorithm
// (kernels/dev/linear_attn/linear_attn_fp32.cu) with the three [BT x K] x [K x BV]-sized products
// register-tiled (each thread a 4-row x TN-column tile, one float4 shared load feeding 4*TN FMAs)
// instead of one shared load per FMA, and the pair products one thread per pair (no shuffles).
// v1 measured 76 us per 32-row chunk at K = V = 128 (T=65536 H=32: 156 ms), bound by shared-memory
// instruction issue; this cuts the shared loads of the products about 4x.
//
// One CTA per (value head, block of BV state columns, sequence): the columns of S evolve
// independently given the key-side quantities (W, Kd, Qg, L, Aqk), which every column block of a
// head recomputes. Per chunk of BT rows starting from state S:
//   G   = cumsum(g) per channel                     L[i][j] = beta_i sum_x k_i k_j e^(G_i - G_j), j < i
//   [W | U] = (I + L)^-1 [beta k e^G | beta v]     (forward substitution, column per thread)
//   U'  = U - W S                                   o_i = (q_i e^G_i) S + sum_{j<=i} Aqk[i][j] U'_j
//   S   = e^(G_last) S + sum_j (k_j e^(G_last - G_j)) U'_j^T
// Decays are only taken as e^(G_i - G_j), j <= i, and e^G: all <= 1. Math: lib/ops/linear_attn.cpp.
#include "common.cuh"
#include "linear_attn_common.cuh"
#include "linear_attn_impl.cuh"

namespace dz::cuda::la {

namespace {

constexpr int BT = kBT, NT = 256, BTP = BT + 4;  // BTP: 16-byte aligned transposed rows

template <int K, int BV>
constexpr size_t tiled_smem_floats() {
  return size_t(K) * BV + 3 * BT * (K + 4) + 2 * K * BTP + BT * BV + BT * BT + BT * BTP + BT;
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

template <int K, int V, int BV, bool KDA>
__global__ void __launch_bounds__(NT) tiled_kernel(const ChunkArgs a) {
  const LaPrefill& p = a.p;
  constexpr int KS = K + 4;
  const int h = blockIdx.x / (V / BV), y0 = (blockIdx.x % (V / BV)) * BV;
  const int n = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hk = h / (p.HV / p.HK);
  const int64_t bos = p.cu_seqlens[n];
  const int T = int(p.cu_seqlens[n + 1] - bos);
  extern __shared__ __align__(16) float smem[];
  float* S = smem;               // [K][BV]   state columns y0 .. y0 + BV - 1
  float* Kr = S + K * BV;        // [BT][KS]  k (normalised), later Kd = k e^(G_last - G)
  float* Qr = Kr + BT * KS;      // [BT][KS]  scale q (normalised)
  float* Gb = Qr + BT * KS;      // [BT][KS]  cumulative log-decay (GDN: column 0)
  float* Wt = Gb + BT * KS;      // [K][BTP]  W transposed
  float* Qt = Wt + K * BTP;      // [K][BTP]  q e^G transposed
  float* Ub = Qt + K * BTP;      // [BT][BV]  u, then U'
  float* Lb = Ub + BT * BV;      // [BT][BT]
  float* At = Lb + BT * BT;      // [BT(j)][BTP(i)] q-k decayed products, zero for j > i
  float* betas = At + BT * BTP;  // [BT]
  auto G = [&](int i, int x) -> float { return Gb[i * KS + (KDA ? x : 0)]; };

  const size_t soff = (size_t(n) * p.HV + h) * K * V;
  for (int e = tid; e < K * BV; e += NT) {
    const int x = e / BV, yg = y0 + e % BV;
    S[e] = a.trans_A ? (x == yg ? 1.f : 0.f) : (p.h0 ? p.h0[soff + size_t(x) * V + yg] : 0.f);
  }
  for (int e = tid; e < BT * BTP; e += NT) At[e] = 0.f;
  const float aexp = p.gate.A_log ? expf(p.gate.A_log[h]) : 1.f;
  const float lb = p.gate.lower_bound;

  for (int c0 = 0; c0 < T; c0 += BT) {
    const int C = min(BT, T - c0);
    // ---- load and normalise the chunk's rows (one warp per row); rows >= C are zero ----
    for (int i = warp; i < BT; i += NT / 32) {
      const bool valid = i < C;
      const int64_t t = bos + c0 + i;
      float kv[K / 32], qv[K / 32], ss = 0.f, sq = 0.f;
#pragma unroll
      for (int m = 0; m < K / 32; ++m) {
        const int x = lane + 32 * m;
        kv[m] = valid ? bf(p.k[(t * p.HK + hk) * K + x]) : 0.f;
        qv[m] = valid && a.write_o ? bf(p.q[(t * p.HK + hk) * K + x]) : 0.f;
        ss += kv[m] * kv[m];
        sq += qv[m] * qv[m];
      }
      ss = warp_sum(ss);
      sq = warp_sum(sq);
      const float ik = 1.f / sqrtf(ss + 1e-6f), iq = 1.f / sqrtf(sq + 1e-6f);
      const float beta = valid ? sigmoid(bf(p.b[t * p.HV + h])) : 0.f;
#pragma unroll
      for (int m = 0; m < K / 32; ++m) {
        const int x = lane + 32 * m;
        Kr[i * KS + x] = kv[m] * ik;
        Qr[i * KS + x] = p.scale * (qv[m] * iq);
        if (KDA) {
          float g = 0.f;
          if (valid) {
            const int c = h * K + x;
            g = gate(bf(p.gate.f[t * (int64_t(p.HV) * K) + c]) + (p.gate.dt_bias ? p.gate.dt_bias[c] : 0.f), aexp, lb);
          }
          Gb[i * KS + x] = g;
        }
      }
      if (!KDA && lane == 0)
        Gb[i * KS] = valid ? gate(bf(p.gate.f[t * p.HV + h]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f), aexp, lb)
                           : 0.f;
      for (int y = lane; y < BV; y += 32)
        Ub[i * BV + y] = (valid && !a.trans_A) ? beta * bf(p.v[(t * p.HV + h) * V + y0 + y]) : 0.f;
      if (lane == 0) betas[i] = beta;
    }
    __syncthreads();
    for (int x = tid; x < (KDA ? K : 1); x += NT) {  // cumulative log-decay, row order as the reference
      float acc = 0.f;
      for (int i = 0; i < BT; ++i) acc = (Gb[i * KS + x] += acc);
    }
    __syncthreads();
    // ---- pair products, one thread per (i, j), j <= i ----
    for (int pi = tid; pi < BT * (BT + 1) / 2; pi += NT) {
      int i = int((sqrtf(8.f * pi + 1.f) - 1.f) * 0.5f);
      while ((i + 1) * (i + 2) / 2 <= pi) ++i;
      while (i * (i + 1) / 2 > pi) --i;
      const int j = pi - i * (i + 1) / 2;
      const float *ki = Kr + i * KS, *kj = Kr + j * KS, *qi = Qr + i * KS, *gi = Gb + i * KS, *gj = Gb + j * KS;
      float l = 0.f, aq = 0.f;
#pragma unroll 4
      for (int x = 0; x < K; x += 4) {
        const float4 A = ld4(ki + x), B = ld4(kj + x);
        float4 e = make_float4(1.f, 1.f, 1.f, 1.f);
        if (KDA) {
          const float4 u = ld4(gi + x), w = ld4(gj + x);
          e = make_float4(expf(u.x - w.x), expf(u.y - w.y), expf(u.z - w.z), expf(u.w - w.w));
        }
        const float4 kb = make_float4(B.x * e.x, B.y * e.y, B.z * e.z, B.w * e.w);
        l += A.x * kb.x + A.y * kb.y + A.z * kb.z + A.w * kb.w;
        if (a.write_o) {
          const float4 Q = ld4(qi + x);
          aq += Q.x * kb.x + Q.y * kb.y + Q.z * kb.z + Q.w * kb.w;
        }
      }
      const float e = KDA ? 1.f : expf(gi[0] - gj[0]);
      Lb[i * BT + j] = j < i ? betas[i] * (e * l) : 0.f;
      At[j * BTP + i] = e * aq;
    }
    __syncthreads();
    // ---- W^T = (beta k e^G)^T, Kd = k e^(G_last - G), Qg^T = (q e^G)^T ----
    for (int e = tid; e < BT * K; e += NT) {
      const int i = e % BT, x = e / BT;
      const float gi = G(i, x), gl = G(BT - 1, x), kk = Kr[i * KS + x];
      Wt[x * BTP + i] = betas[i] * kk * expf(gi);
      Kr[i * KS + x] = kk * expf(gl - gi);
      if (a.write_o) Qt[x * BTP + i] = Qr[i * KS + x] * expf(gi);
    }
    __syncthreads();
    // ---- forward substitution (I + L) [W | U] = [W | U], one column per thread ----
    for (int c = tid; c < K + BV; c += NT) {
      if (a.trans_A && c >= K) break;  // U is zero in the transition pass
      float r[BT];
      if (c < K) {
#pragma unroll
        for (int i = 0; i < BT; i += 4) {
          const float4 w = ld4(Wt + c * BTP + i);
          r[i] = w.x, r[i + 1] = w.y, r[i + 2] = w.z, r[i + 3] = w.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < BT; ++i) r[i] = Ub[i * BV + c - K];
      }
#pragma unroll
      for (int i = 1; i < BT; ++i) {
#pragma unroll
        for (int j = 0; j < i; ++j) r[i] -= Lb[i * BT + j] * r[j];
      }
      if (c < K) {
#pragma unroll
        for (int i = 0; i < BT; i += 4)
          *reinterpret_cast<float4*>(Wt + c * BTP + i) = make_float4(r[i], r[i + 1], r[i + 2], r[i + 3]);
      } else {
#pragma unroll
        for (int i = 0; i < BT; ++i) Ub[i * BV + c - K] = r[i];
      }
    }
    __syncthreads();
    // ---- [BT x BV] products: thread tile rows 4 ig .. 4 ig + 3, columns yt + 32 n ----
    constexpr int TN = BV / 32;
    const int ig = tid >> 5, yt = tid & 31;
    {  // U' = U - W S
      float acc[4][TN];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = Ub[(4 * ig + r) * BV + yt + 32 * c];
#pragma unroll 4
      for (int x = 0; x < K; ++x) {
        const float4 w = ld4(Wt + x * BTP + 4 * ig);
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          const float s = S[x * BV + yt + 32 * c];
          acc[0][c] -= w.x * s, acc[1][c] -= w.y * s, acc[2][c] -= w.z * s, acc[3][c] -= w.w * s;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) Ub[(4 * ig + r) * BV + yt + 32 * c] = acc[r][c];
    }
    __syncthreads();
    if (a.write_o) {  // o = Qg S + Aqk U'
      float acc[4][TN];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = 0.f;
#pragma unroll 4
      for (int x = 0; x < K; ++x) {
        const float4 q = ld4(Qt + x * BTP + 4 * ig);
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          const float s = S[x * BV + yt + 32 * c];
          acc[0][c] += q.x * s, acc[1][c] += q.y * s, acc[2][c] += q.z * s, acc[3][c] += q.w * s;
        }
      }
#pragma unroll 4
      for (int j = 0; j < BT; ++j) {
        const float4 w = ld4(At + j * BTP + 4 * ig);
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          const float u = Ub[j * BV + yt + 32 * c];
          acc[0][c] += w.x * u, acc[1][c] += w.y * u, acc[2][c] += w.z * u, acc[3][c] += w.w * u;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = 4 * ig + r;
        if (i < C)
#pragma unroll
          for (int c = 0; c < TN; ++c)
            p.o[((bos + c0 + i) * p.HV + h) * V + y0 + yt + 32 * c] = __float2bfloat16(acc[r][c]);
      }
      __syncthreads();
    }
    {  // S = e^(G_last) S + Kd^T U': thread tile rows 4 xg .. 4 xg + 3, columns yc + CTS n
      constexpr int XG = K / 4, CTS = NT / XG, TNS = BV / CTS;
      const int xg = tid / CTS, yc = tid % CTS;
      float acc[4][TNS];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float d = expf(G(BT - 1, 4 * xg + r));
#pragma unroll
        for (int c = 0; c < TNS; ++c) acc[r][c] = S[(4 * xg + r) * BV + yc + CTS * c] * d;
      }
#pragma unroll 2
      for (int j = 0; j < BT; ++j) {
        const float4 kd = ld4(Kr + j * KS + 4 * xg);
#pragma unroll
        for (int c = 0; c < TNS; ++c) {
          const float u = Ub[j * BV + yc + CTS * c];
          acc[0][c] += kd.x * u, acc[1][c] += kd.y * u, acc[2][c] += kd.z * u, acc[3][c] += kd.w * u;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < TNS; ++c) S[(4 * xg + r) * BV + yc + CTS * c] = acc[r][c];
    }
    __syncthreads();
  }
  if (p.ht)
    for (int e = tid; e < K * BV; e += NT) p.ht[soff + size_t(e / BV) * V + y0 + e % BV] = S[e];
}

template <int K, int BV, bool KDA>
void launch(const ChunkArgs& a, cudaStream_t stream) {
  const size_t smem = tiled_smem_floats<K, BV>() * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(tiled_kernel<K, K, BV, KDA>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  tiled_kernel<K, K, BV, KDA><<<dim3(unsigned(a.p.HV * (K / BV)), unsigned(a.p.N)), NT, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <bool KDA>
void dispatch(const ChunkArgs& a, int bv, cudaStream_t stream) {
  if (a.p.K == 64) {
    if (bv == 32) return launch<64, 32, KDA>(a, stream);
    return launch<64, 64, KDA>(a, stream);
  }
  if (bv == 32) return launch<128, 32, KDA>(a, stream);
  if (bv == 64) return launch<128, 64, KDA>(a, stream);
  return launch<128, 128, KDA>(a, stream);
}

}  // namespace

void launch_chunk_tiled(const ChunkArgs& a, int bv, cudaStream_t stream) {
  if (a.p.kda)
    dispatch<true>(a, bv, stream);
  else
    dispatch<false>(a, bv, stream);
}

}  // namespace dz::cuda::la
