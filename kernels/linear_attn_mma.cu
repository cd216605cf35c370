// Chunked KDA / Gated DeltaNet prefill, version 4: tensor cores (mma.sync m16n8k16, bf16 operands,
// fp32 accumulation), chunk 64, and the output products taken out of the sequential loop.
// v3 (linear_attn_split.cu) spent 9.6 ms on the key side in fp32 SIMT and ~14 ms in a recurrence
// that did three fp32 products per 32-row chunk (ncu, docs/cuda_linear_attention.md). Here:
//   prep (chunk, head), parallel: gates, norms, pair products L and Aqk — off-diagonal 16-row
//        blocks on tensor cores with a reference row r between the blocks, so both factors
//        e^(G_i - G_r) and e^(G_r - G_j) are <= 1; diagonal blocks exact per element (KDA) —,
//        (I + L)^-1 by forward substitution, W = Ainv (β k e^G) and U = Ainv (β v) on tensor
//        cores; bf16 records.
//   rec  (value head, column block, sequence), sequential over chunks: S in fp32 mma accumulators;
//        per chunk U' = U - W S and S = e^(G_last) S + Kdᵀ U'; stores the bf16 state entering
//        each chunk and U' for
//   out  (chunk, head), parallel: o = (q e^G) S + Aqk U'.
// The state accumulates in fp32 and is rounded to bf16 only as a product operand (as fla's chunk
// kernels do); the tests state the tolerance this needs.
#include <cuda_pipeline.h>

#include <algorithm>

#include "common.cuh"
#include "linear_attn_common.cuh"
#include "linear_attn_impl.cuh"

namespace dz::cuda::la {

namespace {

constexpr int BT = 64, NT = 256, AP = BT + 8;  // AP: padded bf16 row of 64 (conflict-free fragments)

// Record of one (chunk, value head), bf16: W [BT][K] | KdT [K][BT] | U [BT][V] | Qg [BT][K] | Aqk [BT][BT]
template <int K, int V>
struct R4 {
  static constexpr size_t W = 0, KdT = size_t(BT) * K, U = 2 * size_t(BT) * K, Qg = U + size_t(BT) * V,
                          Aqk = Qg + size_t(BT) * K, size = Aqk + BT * BT;
};
constexpr size_t rec_elems(int K, int V) { return 3 * size_t(BT) * K + size_t(BT) * V + BT * BT; }

__device__ __forceinline__ uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// A fragment: rows r0..r0+15, k k0..k0+15 of a row-major [rows][ld] bf16 matrix.
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16* A, int ld, int r0, int k0, int lane) {
  const bf16* q = A + (r0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
  a[0] = ld32(q), a[1] = ld32(q + 8 * ld), a[2] = ld32(q + 8), a[3] = ld32(q + 8 * ld + 8);
}
// B fragment: k k0..k0+15, columns n0..n0+7, from the transposed (column-major) [n][ld] matrix.
__device__ __forceinline__ void frag_b(uint32_t b[2], const bf16* Bt, int ld, int n0, int k0, int lane) {
  const bf16* q = Bt + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
  b[0] = ld32(q), b[1] = ld32(q + 8);
}

__global__ void base64_kernel(const int32_t* cu, int N, int32_t* base) {
  int acc = 0;
  base[0] = 0;
  for (int n = 0; n < N; ++n) base[n + 1] = (acc += (cu[n + 1] - cu[n] + BT - 1) / BT);
}

// Sequence n of record chunk g: base[n] <= g < base[n + 1].
__device__ __forceinline__ int seq_of(const int32_t* base, int N, int g) {
  int lo = 0, hi = N - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (base[mid] <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <int K, bool KDA>
constexpr size_t prep_smem_bytes() {
  constexpr int KP = K + 8, GS = KDA ? K + 1 : 1;
  constexpr size_t uni = std::max(size_t(2 * (BT - 16) + 16) * KP, size_t(BT) * AP + size_t(K) * AP) * 2;
  return size_t(2 * BT * (K + 2)) * 2 + size_t(BT * GS) * 4 + size_t(BT * (BT + 1)) * 4 + uni;
}

// One CTA per (chunk, value head): the key side of the chunk into its record.
template <int K, bool KDA>
__global__ void __launch_bounds__(NT, 2) mma_prep_kernel(const LaPrefill p, const int32_t* __restrict__ base,
                                                         bf16* __restrict__ records, float* __restrict__ gls) {
  constexpr int V = K, KN = K + 2, KP = K + 8, GS = KDA ? K + 1 : 1, LS = BT + 1;
  using R = R4<K, V>;
  const int g = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (g >= base[p.N]) return;
  const int n = seq_of(base, p.N, g), hk = h / (p.HV / p.HK);
  const int64_t bos = p.cu_seqlens[n];
  const int c0 = (g - base[n]) * BT, C = min(BT, int(p.cu_seqlens[n + 1] - bos) - c0);
  extern __shared__ __align__(16) unsigned char sm4[];
  bf16* Kn = reinterpret_cast<bf16*>(sm4);          // [BT][KN] L2-normalised k (odd word stride: SIMT rows)
  bf16* Qn = Kn + BT * KN;                          // [BT][KN] L2-normalised q * scale
  float* Gc = reinterpret_cast<float*>(Qn + BT * KN);  // [BT][GS] cumulative log-decay in the chunk
  float* L = Gc + BT * GS;                          // [BT][LS] beta_i k_i.k_j e^(G_i - G_j), j < i
  bf16* Ka = reinterpret_cast<bf16*>(L + BT * LS);  // pair phase: [BT-16][KP] k_i e^(G_i - G_r), rows 16..
  bf16* Qa = Ka + (BT - 16) * KP;                   //             [BT-16][KP] q_i e^(G_i - G_r)
  bf16* Kb = Qa + (BT - 16) * KP;                   //             [16][KP] k_j e^(G_r - G_j)
  bf16* Ai = Ka;                                    // solve phase: [BT][AP] (I + L)^-1
  bf16* Bt = Ai + BT * AP;                          //              [K][AP] (beta k e^G)^T, then (beta v)^T
  __shared__ float betas[BT];
  bf16* rec = records + (size_t(g) * p.HV + h) * R::size;
  auto G = [&](int i, int x) -> float { return Gc[i * GS + (KDA ? x : 0)]; };

  const float aexp = p.gate.A_log ? expf(p.gate.A_log[h]) : 1.f, lb = p.gate.lower_bound;
  const bool has_q = p.q != nullptr;
  for (int i = warp; i < BT; i += NT / 32) {  // a warp per row: norms, beta, gates
    const bool valid = i < C;
    const int64_t t = bos + c0 + i;
    float kv[K / 32], qv[K / 32], ss = 0.f, sq = 0.f;
#pragma unroll
    for (int m = 0; m < K / 32; ++m) {
      const int x = lane + 32 * m;
      kv[m] = valid ? bf(p.k[(t * p.HK + hk) * K + x]) : 0.f;
      qv[m] = valid && has_q ? bf(p.q[(t * p.HK + hk) * K + x]) : 0.f;
      ss += kv[m] * kv[m];
      sq += qv[m] * qv[m];
    }
    ss = warp_sum(ss);
    sq = warp_sum(sq);
    const float ik = 1.f / sqrtf(ss + 1e-6f), iq = 1.f / sqrtf(sq + 1e-6f);
#pragma unroll
    for (int m = 0; m < K / 32; ++m) {
      const int x = lane + 32 * m;
      Kn[i * KN + x] = __float2bfloat16(kv[m] * ik);
      Qn[i * KN + x] = __float2bfloat16(p.scale * (qv[m] * iq));
      if (KDA) {
        const int c = h * K + x;
        Gc[i * GS + x] = valid ? gate(bf(p.gate.f[t * (int64_t(p.HV) * K) + c]) + (p.gate.dt_bias ? p.gate.dt_bias[c] : 0.f),
                                      aexp, lb)
                               : 0.f;
      }
    }
    if (lane == 0) {
      betas[i] = valid ? sigmoid(bf(p.b[t * p.HV + h])) : 0.f;
      if (!KDA)
        Gc[i] = valid ? gate(bf(p.gate.f[t * p.HV + h]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f), aexp, lb) : 0.f;
    }
  }
  __syncthreads();
  for (int x = tid; x < (KDA ? K : 1); x += NT) {  // invalid rows have gate 0: G stays at G_(C-1)
    float acc = 0.f;
    for (int i = 0; i < BT; ++i) acc = (Gc[i * GS + x] += acc);
  }
  __syncthreads();
  const int gq = lane >> 2, tq = lane & 3;
  if (KDA) {
    // Diagonal 16x16 blocks, exact: e^(G_i - G_j) per channel (j <= i, so <= 1). Zeros above.
    for (int task = tid; task < 4 * 256; task += NT) {
      const int b = task >> 8, i = 16 * b + ((task >> 4) & 15), j = 16 * b + (task & 15);
      if (j > i) {
        L[i * LS + j] = 0.f;
        rec[R::Aqk + i * BT + j] = __float2bfloat16(0.f);
        continue;
      }
      const bf16 *ki = Kn + i * KN, *kj = Kn + j * KN, *qi = Qn + i * KN;
      const float *gi = Gc + i * GS, *gj = Gc + j * GS;
      float l = 0.f, aq = 0.f;
#pragma unroll 8
      for (int x = 0; x < K; ++x) {
        const float kb = bf(kj[x]) * __expf(gi[x] - gj[x]);
        l += bf(ki[x]) * kb;
        aq += bf(qi[x]) * kb;
      }
      L[i * LS + j] = j < i ? betas[i] * l : 0.f;
      rec[R::Aqk + i * BT + j] = __float2bfloat16(aq);
    }
    // Blocks above the diagonal: zeros.
    for (int e = tid; e < 6 * 256; e += NT) {
      const int pr = e >> 8, bi = pr < 3 ? 0 : (pr < 5 ? 1 : 2), bj = pr < 3 ? pr + 1 : (pr < 5 ? pr - 1 : 3);
      const int i = 16 * bi + ((e >> 4) & 15), j = 16 * bj + (e & 15);
      L[i * LS + j] = 0.f;
      rec[R::Aqk + i * BT + j] = __float2bfloat16(0.f);
    }
    // Off-diagonal blocks (bi > bj) on tensor cores, reference row r = last row of block bj.
    for (int bj = 0; bj < 3; ++bj) {
      const int r = 16 * bj + 15, r0 = 16 * (bj + 1);
      __syncthreads();  // previous bj's operands consumed
      for (int e = tid; e < (BT - r0) * K; e += NT) {
        const int i = r0 + e / K, x = e % K;
        const float d = __expf(G(i, x) - G(r, x));
        Ka[(i - 16) * KP + x] = __float2bfloat16(bf(Kn[i * KN + x]) * d);
        Qa[(i - 16) * KP + x] = __float2bfloat16(bf(Qn[i * KN + x]) * d);
      }
      for (int e = tid; e < 16 * K; e += NT) {
        const int j = 16 * bj + e / K, x = e % K;
        Kb[(e / K) * KP + x] = __float2bfloat16(bf(Kn[j * KN + x]) * __expf(G(r, x) - G(j, x)));
      }
      __syncthreads();
      const int tasks = (3 - bj) * 4;  // (row block, column half, L or Aqk)
      for (int tk = warp; tk < tasks; tk += NT / 32) {
        const int bi = bj + 1 + (tk >> 2), half = (tk >> 1) & 1;
        const bool isq = tk & 1;
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        uint32_t a[4], b[2];
#pragma unroll
        for (int k0 = 0; k0 < K; k0 += 16) {
          frag_a(a, isq ? Qa : Ka, KP, 16 * bi - 16, k0, lane);
          frag_b(b, Kb, KP, 8 * half, k0, lane);
          mma16816(c, a, b);
        }
        const int i = 16 * bi + gq, j = 16 * bj + 8 * half + 2 * tq;
        if (isq) {
          *reinterpret_cast<uint32_t*>(rec + R::Aqk + i * BT + j) = pack2(c[0], c[1]);
          *reinterpret_cast<uint32_t*>(rec + R::Aqk + (i + 8) * BT + j) = pack2(c[2], c[3]);
        } else {
          L[i * LS + j] = betas[i] * c[0], L[i * LS + j + 1] = betas[i] * c[1];
          L[(i + 8) * LS + j] = betas[i + 8] * c[2], L[(i + 8) * LS + j + 1] = betas[i + 8] * c[3];
        }
      }
    }
  } else {
    // Scalar decay: k_i.k_j and q_i.k_j for all lower blocks on tensor cores, then e^(G_i - G_j).
    for (int tk = warp; tk < 10 * 4; tk += NT / 32) {
      const int pr = tk >> 2, half = (tk >> 1) & 1;
      const bool isq = tk & 1;
      int bi = 0;
      while ((bi + 1) * (bi + 2) / 2 <= pr) ++bi;
      const int bj = pr - bi * (bi + 1) / 2;
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      uint32_t a[4], b[2];
#pragma unroll
      for (int k0 = 0; k0 < K; k0 += 16) {
        frag_a(a, isq ? Qn : Kn, KN, 16 * bi, k0, lane);
        frag_b(b, Kn, KN, 16 * bj + 8 * half, k0, lane);
        mma16816(c, a, b);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * bi + gq + 8 * (e >> 1), j = 16 * bj + 8 * half + 2 * tq + (e & 1);
        const float d = j <= i ? __expf(Gc[i] - Gc[j]) : 0.f;
        if (isq)
          rec[R::Aqk + i * BT + j] = __float2bfloat16(c[e] * d);
        else
          L[i * LS + j] = j < i ? betas[i] * c[e] * d : 0.f;
      }
    }
    for (int e = tid; e < 6 * 256; e += NT) {
      const int pr = e >> 8, bi = pr < 3 ? 0 : (pr < 5 ? 1 : 2), bj = pr < 3 ? pr + 1 : (pr < 5 ? pr - 1 : 3);
      const int i = 16 * bi + ((e >> 4) & 15), j = 16 * bj + (e & 15);
      L[i * LS + j] = 0.f;
      rec[R::Aqk + i * BT + j] = __float2bfloat16(0.f);
    }
  }
  __syncthreads();
  if (tid < BT) {
    // (I + L)^-1, one column per thread by forward substitution (L reads are warp broadcasts).
    const int c = tid;
    float xs[BT];
#pragma unroll
    for (int i = 0; i < BT; ++i) xs[i] = i == c ? 1.f : 0.f;
#pragma unroll
    for (int i = 1; i < BT; ++i) {
      float s = xs[i];
#pragma unroll
      for (int j = 0; j < i; ++j) s -= L[i * LS + j] * xs[j];
      xs[i] = s;
    }
#pragma unroll
    for (int i = 0; i < BT; ++i) Ai[i * AP + c] = __float2bfloat16(xs[i]);
  } else {
    // Meanwhile: q e^G, k e^(G_last - G) (transposed), (beta k e^G)^T and e^G_last.
    const int t2 = tid - BT, n2 = NT - BT;
    for (int e = t2; e < BT * K; e += n2) {
      const int i = e / K, x = e % K;
      rec[R::Qg + e] = __float2bfloat16(bf(Qn[i * KN + x]) * __expf(G(i, x)));
    }
    for (int e = t2; e < K * BT; e += n2) {
      const int x = e / BT, j = e % BT;
      const float kj = bf(Kn[j * KN + x]), gj = G(j, x);
      rec[R::KdT + e] = __float2bfloat16(kj * __expf(G(BT - 1, x) - gj));
      Bt[x * AP + j] = __float2bfloat16(betas[j] * kj * __expf(gj));
    }
    for (int x = t2; x < K; x += n2) gls[(size_t(g) * p.HV + h) * K + x] = __expf(G(BT - 1, x));
  }
  __syncthreads();
  // W = Ainv (beta k e^G), U = Ainv (beta v): [BT][K] each, 4 row tiles x K/8 column tiles.
  const int mt = warp & 3, nt0 = (warp >> 2) * (K / 16);
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      __syncthreads();
      for (int e = tid; e < BT * V; e += NT) {
        const int j = e / V, y = e % V;
        Bt[y * AP + j] = __float2bfloat16(j < C ? betas[j] * bf(p.v[((bos + c0 + j) * p.HV + h) * V + y]) : 0.f);
      }
      __syncthreads();
    }
    float c[K / 16][4];
#pragma unroll
    for (int t = 0; t < K / 16; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < BT; k0 += 16) {
      uint32_t a[4], b[2];
      frag_a(a, Ai, AP, 16 * mt, k0, lane);
#pragma unroll
      for (int t = 0; t < K / 16; ++t) {
        frag_b(b, Bt, AP, 8 * (nt0 + t), k0, lane);
        mma16816(c[t], a, b);
      }
    }
    bf16* out = rec + (pass == 0 ? R::W : R::U);
#pragma unroll
    for (int t = 0; t < K / 16; ++t) {
      const int i = 16 * mt + gq, x = 8 * (nt0 + t) + 2 * tq;
      *reinterpret_cast<uint32_t*>(out + i * K + x) = pack2(c[t][0], c[t][1]);
      *reinterpret_cast<uint32_t*>(out + (i + 8) * K + x) = pack2(c[t][2], c[t][3]);
    }
  }
}

template <int K, int BV>
constexpr size_t rec_smem_bytes() {
  constexpr int KP = K + 8, BVP = BV + 8;
  return (size_t(BV) * KP + size_t(BV) * AP) * 2 + 2 * ((size_t(BT) * KP + size_t(K) * AP + size_t(BT) * BVP) * 2 + K * 4);
}

// One CTA per (value head, block of BV state columns, sequence): the state recurrence.
template <int K, int BV>
__global__ void __launch_bounds__(NT, 1) mma_rec_kernel(const LaPrefill p, const int32_t* __restrict__ base,
                                                        const bf16* __restrict__ records, const float* __restrict__ gls,
                                                        bf16* __restrict__ Sg, bf16* __restrict__ Ug) {
  constexpr int V = K, KP = K + 8, BVP = BV + 8;
  constexpr int BUF = (BT * KP + K * AP + BT * BVP) * 2 + K * 4;  // bytes per record buffer
  using R = R4<K, V>;
  const int h = blockIdx.x / (V / BV), y0 = (blockIdx.x % (V / BV)) * BV, n = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int g0 = base[n], nch = base[n + 1] - g0;
  extern __shared__ __align__(16) unsigned char sm4[];
  bf16* St = reinterpret_cast<bf16*>(sm4);  // [BV][KP] bf16 S^T (the product operand)
  bf16* Ut = St + BV * KP;                  // [BV][AP] bf16 U'^T
  unsigned char* bufs = reinterpret_cast<unsigned char*>(Ut + BV * AP);
  auto Wb = [&](int c) { return reinterpret_cast<bf16*>(bufs + (c & 1) * BUF); };  // [BT][KP]
  auto Kb = [&](int c) { return Wb(c) + BT * KP; };                                  // [K][AP] Kd^T
  auto Ub = [&](int c) { return Kb(c) + K * AP; };                                   // [BT][BVP]
  auto Gb = [&](int c) { return reinterpret_cast<float*>(Ub(c) + BT * BVP); };       // [K] e^G_last
  // S [K][BV] in accumulators: warp owns row tile sm and NTW column tiles from sn0.
  constexpr int MT = K / 16, NTW = (BV / 8) / (8 / MT);
  const int sm = warp % MT, sn0 = (warp / MT) * NTW;
  // U' [BT][BV]: row tile um, UN column tiles from un0.
  constexpr int UN = (BV / 8) / 2;
  const int um = warp & 3, un0 = (warp >> 2) * UN;
  const size_t soff = (size_t(n) * p.HV + h) * K * V;
  float S[NTW][4];
#pragma unroll
  for (int t = 0; t < NTW; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int x = 16 * sm + gq + 8 * (e >> 1), y = y0 + 8 * (sn0 + t) + 2 * tq + (e & 1);
      S[t][e] = p.h0 ? p.h0[soff + size_t(x) * V + y] : 0.f;
    }
  auto store_St = [&] {
#pragma unroll
    for (int t = 0; t < NTW; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int x = 16 * sm + gq + 8 * (e >> 1), y = 8 * (sn0 + t) + 2 * tq + (e & 1);
        St[y * KP + x] = __float2bfloat16(S[t][e]);
      }
  };
  store_St();
  auto issue = [&](int c) {
    const size_t gh = size_t(g0 + c) * p.HV + h;
    const bf16* r = records + gh * R::size;
    bf16 *W = Wb(c), *Kd = Kb(c), *U = Ub(c);
    for (int e = tid; e < BT * K / 8; e += NT) {
      const int i = e / (K / 8), q = e % (K / 8);
      __pipeline_memcpy_async(W + i * KP + 8 * q, r + R::W + i * K + 8 * q, 16);
    }
    for (int e = tid; e < K * BT / 8; e += NT) {
      const int x = e / (BT / 8), q = e % (BT / 8);
      __pipeline_memcpy_async(Kd + x * AP + 8 * q, r + R::KdT + x * BT + 8 * q, 16);
    }
    for (int e = tid; e < BT * BV / 8; e += NT) {
      const int i = e / (BV / 8), q = e % (BV / 8);
      __pipeline_memcpy_async(U + i * BVP + 8 * q, r + R::U + i * V + y0 + 8 * q, 16);
    }
    for (int e = tid; e < K / 4; e += NT) __pipeline_memcpy_async(Gb(c) + 4 * e, gls + gh * K + 4 * e, 16);
  };
  if (nch > 0) issue(0);
  __pipeline_commit();
  for (int c = 0; c < nch; ++c) {
    if (c + 1 < nch) issue(c + 1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncthreads();
    const size_t gh = size_t(g0 + c) * p.HV + h;
    {  // the state entering chunk c, for the output kernel: Sg [.., V][K]
      bf16* dst = Sg + gh * V * K + size_t(y0) * K;
      for (int e = tid; e < BV * K / 8; e += NT) {
        const int y = e / (K / 8), q = e % (K / 8);
        *reinterpret_cast<uint4*>(dst + y * K + 8 * q) = *reinterpret_cast<const uint4*>(St + y * KP + 8 * q);
      }
    }
    {  // U' = U - W S
      const bf16 *W = Wb(c), *U = Ub(c);
      float u[UN][4];
#pragma unroll
      for (int t = 0; t < UN; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          u[t][e] = bf(U[(16 * um + gq + 8 * (e >> 1)) * BVP + 8 * (un0 + t) + 2 * tq + (e & 1)]);
#pragma unroll
      for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[4], b[2];
        frag_a(a, W, KP, 16 * um, k0, lane);
#pragma unroll
        for (int m = 0; m < 4; ++m) a[m] ^= 0x80008000u;  // -W
#pragma unroll
        for (int t = 0; t < UN; ++t) {
          frag_b(b, St, KP, 8 * (un0 + t), k0, lane);
          mma16816(u[t], a, b);
        }
      }
#pragma unroll
      for (int t = 0; t < UN; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * um + gq + 8 * (e >> 1), y = 8 * (un0 + t) + 2 * tq + (e & 1);
          Ut[y * AP + i] = __float2bfloat16(u[t][e]);
        }
    }
    __syncthreads();
    {  // U' for the output kernel: Ug [.., V][BT]
      bf16* dst = Ug + gh * V * BT + size_t(y0) * BT;
      for (int e = tid; e < BV * BT / 8; e += NT) {
        const int y = e / (BT / 8), q = e % (BT / 8);
        *reinterpret_cast<uint4*>(dst + y * BT + 8 * q) = *reinterpret_cast<const uint4*>(Ut + y * AP + 8 * q);
      }
    }
    {  // S = e^G_last S + Kd^T U'
      const bf16* Kd = Kb(c);
      const float* gl = Gb(c);
      const float d0 = gl[16 * sm + gq], d1 = gl[16 * sm + gq + 8];
#pragma unroll
      for (int t = 0; t < NTW; ++t) S[t][0] *= d0, S[t][1] *= d0, S[t][2] *= d1, S[t][3] *= d1;
#pragma unroll
      for (int k0 = 0; k0 < BT; k0 += 16) {
        uint32_t a[4], b[2];
        frag_a(a, Kd, AP, 16 * sm, k0, lane);
#pragma unroll
        for (int t = 0; t < NTW; ++t) {
          frag_b(b, Ut, AP, 8 * (sn0 + t), k0, lane);
          mma16816(S[t], a, b);
        }
      }
    }
    store_St();
    __syncthreads();
  }
  __pipeline_wait_prior(0);
  if (p.ht)
#pragma unroll
    for (int t = 0; t < NTW; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int x = 16 * sm + gq + 8 * (e >> 1), y = y0 + 8 * (sn0 + t) + 2 * tq + (e & 1);
        p.ht[soff + size_t(x) * V + y] = S[t][e];
      }
}

template <int K>
constexpr size_t out_smem_bytes() {
  return (size_t(BT) * (K + 8) + size_t(K) * (K + 8) + size_t(BT) * AP + size_t(K) * AP) * 2;
}

// One CTA per (chunk, value head): o = (q e^G) S + Aqk U'.
template <int K>
__global__ void __launch_bounds__(NT, 2) mma_out_kernel(const LaPrefill p, const int32_t* __restrict__ base,
                                                        const bf16* __restrict__ records, const bf16* __restrict__ Sg,
                                                        const bf16* __restrict__ Ug) {
  constexpr int V = K, KP = K + 8;
  using R = R4<K, V>;
  const int g = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (g >= base[p.N]) return;
  const int n = seq_of(base, p.N, g);
  const int64_t bos = p.cu_seqlens[n];
  const int c0 = (g - base[n]) * BT, C = min(BT, int(p.cu_seqlens[n + 1] - bos) - c0);
  extern __shared__ __align__(16) unsigned char sm4[];
  bf16* Qs = reinterpret_cast<bf16*>(sm4);  // [BT][KP]
  bf16* Ss = Qs + BT * KP;                  // [V][KP]  S^T
  bf16* As = Ss + V * KP;                   // [BT][AP] Aqk
  bf16* Us = As + BT * AP;                  // [V][AP]  U'^T
  const size_t gh = size_t(g) * p.HV + h;
  const bf16* r = records + gh * R::size;
  for (int e = tid; e < BT * K / 8; e += NT) {
    const int i = e / (K / 8), q = e % (K / 8);
    __pipeline_memcpy_async(Qs + i * KP + 8 * q, r + R::Qg + i * K + 8 * q, 16);
  }
  for (int e = tid; e < V * K / 8; e += NT) {
    const int y = e / (K / 8), q = e % (K / 8);
    __pipeline_memcpy_async(Ss + y * KP + 8 * q, Sg + gh * V * K + y * K + 8 * q, 16);
  }
  for (int e = tid; e < BT * BT / 8; e += NT) {
    const int i = e / (BT / 8), q = e % (BT / 8);
    __pipeline_memcpy_async(As + i * AP + 8 * q, r + R::Aqk + i * BT + 8 * q, 16);
  }
  for (int e = tid; e < V * BT / 8; e += NT) {
    const int y = e / (BT / 8), q = e % (BT / 8);
    __pipeline_memcpy_async(Us + y * AP + 8 * q, Ug + gh * V * BT + y * BT + 8 * q, 16);
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  constexpr int TN = V / 16;  // column tiles per warp
  const int mt = warp & 3, nt0 = (warp >> 2) * TN, gq = lane >> 2, tq = lane & 3;
  float c[TN][4];
#pragma unroll
  for (int t = 0; t < TN; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;
  uint32_t a[4], b[2];
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    frag_a(a, Qs, KP, 16 * mt, k0, lane);
#pragma unroll
    for (int t = 0; t < TN; ++t) {
      frag_b(b, Ss, KP, 8 * (nt0 + t), k0, lane);
      mma16816(c[t], a, b);
    }
  }
#pragma unroll
  for (int k0 = 0; k0 < BT; k0 += 16) {
    frag_a(a, As, AP, 16 * mt, k0, lane);
#pragma unroll
    for (int t = 0; t < TN; ++t) {
      frag_b(b, Us, AP, 8 * (nt0 + t), k0, lane);
      mma16816(c[t], a, b);
    }
  }
#pragma unroll
  for (int t = 0; t < TN; ++t)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = 16 * mt + gq + 8 * hh, y = 8 * (nt0 + t) + 2 * tq;
      if (i < C)
        *reinterpret_cast<uint32_t*>(p.o + ((bos + c0 + i) * p.HV + h) * V + y) = pack2(c[t][2 * hh], c[t][2 * hh + 1]);
    }
}

size_t al256(size_t b) { return (b + 255) / 256 * 256; }

struct Ws4 {
  int32_t* base;
  bf16 *records, *Sg, *Ug;
  float* gls;
  size_t bytes;  // the whole workspace
};
// Workspace layout (ws may be null: sizes only).
Ws4 carve(void* ws, int64_t T, int N, int HV, int K, int V) {
  const size_t G = size_t((T + BT - 1) / BT + N);
  const size_t o_rec = al256(size_t(N + 1) * 4), o_gl = o_rec + al256(G * HV * rec_elems(K, V) * 2),
               o_S = o_gl + al256(G * HV * K * 4), o_U = o_S + al256(G * HV * V * K * 2),
               end = o_U + al256(G * HV * V * BT * 2);
  char* w = static_cast<char*>(ws);
  if (!w) return Ws4{nullptr, nullptr, nullptr, nullptr, nullptr, end};
  return Ws4{reinterpret_cast<int32_t*>(w), reinterpret_cast<bf16*>(w + o_rec), reinterpret_cast<bf16*>(w + o_S),
             reinterpret_cast<bf16*>(w + o_U), reinterpret_cast<float*>(w + o_gl), end};
}

template <int K, bool KDA>
void launch_prep(const LaPrefill& p, size_t G, const Ws4& w, cudaStream_t stream) {
  constexpr size_t smem = prep_smem_bytes<K, KDA>();
  CUDA_CHECK(cudaFuncSetAttribute(mma_prep_kernel<K, KDA>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  mma_prep_kernel<K, KDA><<<dim3(unsigned(G), unsigned(p.HV)), NT, smem, stream>>>(p, w.base, w.records, w.gls);
  CUDA_CHECK_LAUNCH();
}

template <int K, int BV>
void launch_rec(const LaPrefill& p, const Ws4& w, cudaStream_t stream) {
  constexpr size_t smem = rec_smem_bytes<K, BV>();
  CUDA_CHECK(cudaFuncSetAttribute(mma_rec_kernel<K, BV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  mma_rec_kernel<K, BV><<<dim3(unsigned(p.HV * (K / BV)), unsigned(p.N)), NT, smem, stream>>>(p, w.base, w.records, w.gls,
                                                                                              w.Sg, w.Ug);
  CUDA_CHECK_LAUNCH();
}

template <int K>
void launch_out(const LaPrefill& p, size_t G, const Ws4& w, cudaStream_t stream) {
  constexpr size_t smem = out_smem_bytes<K>();
  CUDA_CHECK(cudaFuncSetAttribute(mma_out_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  mma_out_kernel<K><<<dim3(unsigned(G), unsigned(p.HV)), NT, smem, stream>>>(p, w.base, w.records, w.Sg, w.Ug);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t mma_workspace_bytes(int64_t T_total, int N, int HV, int K, int V) {
  return carve(nullptr, T_total, N, HV, K, V).bytes;
}

void mma_prefill(const LaPrefill& p, int bv, cudaStream_t stream) {
  DZ_CHECK(p.K == p.V && (p.K == 64 || p.K == 128), "linear attention CUDA v4: K=", p.K, " V=", p.V,
           " not supported (K = V = 64 or 128)");
  const Ws4 w = carve(p.workspace, p.T_total, p.N, p.HV, p.K, p.V);
  base64_kernel<<<1, 1, 0, stream>>>(p.cu_seqlens, p.N, w.base);
  CUDA_CHECK_LAUNCH();
  const size_t G = size_t((p.T_total + BT - 1) / BT + p.N);
  if (p.T_total > 0) {
    if (p.K == 64)
      p.kda ? launch_prep<64, true>(p, G, w, stream) : launch_prep<64, false>(p, G, w, stream);
    else
      p.kda ? launch_prep<128, true>(p, G, w, stream) : launch_prep<128, false>(p, G, w, stream);
  }
  if (p.K == 64) {
    bv == 32 ? launch_rec<64, 32>(p, w, stream) : launch_rec<64, 64>(p, w, stream);
  } else {
    if (bv == 32) launch_rec<128, 32>(p, w, stream);
    else if (bv == 64) launch_rec<128, 64>(p, w, stream);
    else launch_rec<128, 128>(p, w, stream);
  }
  if (p.o && p.T_total > 0) p.K == 64 ? launch_out<64>(p, G, w, stream) : launch_out<128>(p, G, w, stream);
}

}  // namespace dz::cuda::la
