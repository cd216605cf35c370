// Chunked KDA / Gated DeltaNet prefill, version 3. Measured on v2 (T=65536, K=V=128): of the
// 43-60 ms per head sequence, 36-50 ms was the key side (loads, norms, gates, pair products, the
// UT solve), which the sequential chunk loop repeated for every column block. Here it runs once,
// in parallel over all (chunk, head) pairs (split_prep_kernel), into fp32 records; the sequential
// kernel (split_rec_kernel) streams the records with double-buffered async copies and does only
// the three state products (same register tiles as v2). Math: kernels/linear_attn_tiled.cu.
// Not in the library (kernels/dev/): the comparison version 3, see linear_attn_dev.cuh.
#include <cuda_pipeline.h>

#include "common.cuh"
#include "linear_attn_common.cuh"
#include "linear_attn_dev.cuh"
#include "linear_attn_impl.cuh"

namespace dz::cuda::la {

namespace {

constexpr int BT = kBT, NT = 256, BTP = BT + 4;

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Record layout (floats): Wt [K][BT] | Qt [K][BT] | Kd [BT][K] | At [BT(j)][BT(i)] | U [BT][V] | gl [K]
template <int K, int V>
struct Rec {
  static constexpr size_t Wt = 0, Qt = size_t(K) * BT, Kd = 2 * size_t(K) * BT, At = 3 * size_t(K) * BT,
                          U = At + BT * BT, gl = U + size_t(BT) * V, size = gl + K;
};

__global__ void chunk_base_kernel(const int32_t* cu, int N, int32_t* base) {
  int acc = 0;
  base[0] = 0;
  for (int n = 0; n < N; ++n) base[n + 1] = (acc += (cu[n + 1] - cu[n] + BT - 1) / BT);
}

// One CTA per (chunk, value head): the key side of the chunk, written to its record.
template <int K, bool KDA>
__global__ void __launch_bounds__(NT) split_prep_kernel(const LaPrefill p, const int32_t* __restrict__ base,
                                                        float* __restrict__ records) {
  constexpr int V = K, KS = K + 4;
  using R = Rec<K, V>;
  const int g = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (g >= base[p.N]) return;
  int lo = 0, hi = p.N - 1;  // sequence n: base[n] <= g < base[n + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (base[mid] <= g) lo = mid; else hi = mid - 1;
  }
  const int n = lo, hk = h / (p.HV / p.HK);
  const int64_t bos = p.cu_seqlens[n];
  const int c0 = (g - base[n]) * BT, C = min(BT, int(p.cu_seqlens[n + 1] - bos) - c0);
  extern __shared__ __align__(16) float dsm[];
  float* Kr = dsm;               // [BT][KS]
  float* Qr = Kr + BT * KS;      // [BT][KS]
  float* Gb = Qr + BT * KS;      // [BT][KS]
  float* Wt = Gb + BT * KS;      // [K][BTP]
  float* Ub = Wt + K * BTP;      // [BT][V]
  float* Lb = Ub + BT * V;       // [BT][BT]
  float* At = Lb + BT * BT;      // [BT][BTP]
  float* Qt = At + BT * BTP;     // [K][BTP]
  __shared__ float betas[BT];
  auto G = [&](int i, int x) -> float { return Gb[i * KS + (KDA ? x : 0)]; };
  for (int e = tid; e < BT * BTP; e += NT) At[e] = 0.f;
  const float aexp = p.gate.A_log ? expf(p.gate.A_log[h]) : 1.f;
  const float lb = p.gate.lower_bound;
  const bool has_q = p.q != nullptr;
  for (int i = warp; i < BT; i += NT / 32) {
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
    const float beta = valid ? sigmoid(bf(p.b[t * p.HV + h])) : 0.f;
#pragma unroll
    for (int m = 0; m < K / 32; ++m) {
      const int x = lane + 32 * m;
      Kr[i * KS + x] = kv[m] * ik;
      Qr[i * KS + x] = p.scale * (qv[m] * iq);
      if (KDA) {
        float gv = 0.f;
        if (valid) {
          const int c = h * K + x;
          gv = gate(bf(p.gate.f[t * (int64_t(p.HV) * K) + c]) + (p.gate.dt_bias ? p.gate.dt_bias[c] : 0.f), aexp, lb);
        }
        Gb[i * KS + x] = gv;
      }
    }
    if (!KDA && lane == 0)
      Gb[i * KS] = valid ? gate(bf(p.gate.f[t * p.HV + h]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f), aexp, lb)
                         : 0.f;
    for (int y = lane; y < V; y += 32) Ub[i * V + y] = valid ? beta * bf(p.v[(t * p.HV + h) * V + y]) : 0.f;
    if (lane == 0) betas[i] = beta;
  }
  __syncthreads();
  for (int x = tid; x < (KDA ? K : 1); x += NT) {
    float acc = 0.f;
    for (int i = 0; i < BT; ++i) acc = (Gb[i * KS + x] += acc);
  }
  __syncthreads();
  for (int pi = tid; pi < BT * (BT + 1) / 2; pi += NT) {
    int i = int((sqrtf(8.f * pi + 1.f) - 1.f) * 0.5f);
    while ((i + 1) * (i + 2) / 2 <= pi) ++i;
    while (i * (i + 1) / 2 > pi) --i;
    const int j = pi - i * (i + 1) / 2;
    const float *ki = Kr + i * KS, *kj = Kr + j * KS, *qi = Qr + i * KS, *gi = Gb + i * KS, *gj = Gb + j * KS;
    float l = 0.f, aq = 0.f;
#pragma unroll 4
    for (int x = 0; x < K; x += 4) {
      const float4 A = ld4(ki + x), B = ld4(kj + x), Q = ld4(qi + x);
      float4 e = make_float4(1.f, 1.f, 1.f, 1.f);
      if (KDA) {
        const float4 u = ld4(gi + x), w = ld4(gj + x);
        e = make_float4(expf(u.x - w.x), expf(u.y - w.y), expf(u.z - w.z), expf(u.w - w.w));
      }
      const float4 kb = make_float4(B.x * e.x, B.y * e.y, B.z * e.z, B.w * e.w);
      l += A.x * kb.x + A.y * kb.y + A.z * kb.z + A.w * kb.w;
      aq += Q.x * kb.x + Q.y * kb.y + Q.z * kb.z + Q.w * kb.w;
    }
    const float e = KDA ? 1.f : expf(gi[0] - gj[0]);
    Lb[i * BT + j] = j < i ? betas[i] * (e * l) : 0.f;
    At[j * BTP + i] = e * aq;
  }
  __syncthreads();
  for (int e = tid; e < BT * K; e += NT) {
    const int i = e % BT, x = e / BT;
    const float gi = G(i, x), gl = G(BT - 1, x), kk = Kr[i * KS + x];
    Wt[x * BTP + i] = betas[i] * kk * expf(gi);
    Kr[i * KS + x] = kk * expf(gl - gi);
    Qt[x * BTP + i] = Qr[i * KS + x] * expf(gi);
  }
  __syncthreads();
  for (int c = tid; c < K + V; c += NT) {  // forward substitution, one column per thread
    float* col = c < K ? Wt + c * BTP : Ub + (c - K);
    const int st = c < K ? 1 : V;
    float r[BT];
#pragma unroll
    for (int i = 0; i < BT; ++i) r[i] = col[i * st];
#pragma unroll
    for (int i = 1; i < BT; ++i) {
#pragma unroll
      for (int j = 0; j < i; ++j) r[i] -= Lb[i * BT + j] * r[j];
    }
#pragma unroll
    for (int i = 0; i < BT; ++i) col[i * st] = r[i];
  }
  __syncthreads();
  float* rec = records + (size_t(g) * p.HV + h) * R::size;
  for (int e = tid; e < K * BT; e += NT) {
    const int x = e / BT, i = e % BT;
    rec[R::Wt + e] = Wt[x * BTP + i];
    rec[R::Qt + e] = Qt[x * BTP + i];
    rec[R::Kd + e] = Kr[(e / K) * KS + e % K];
  }
  for (int e = tid; e < BT * BT; e += NT) rec[R::At + e] = At[(e / BT) * BTP + e % BT];
  for (int e = tid; e < BT * V; e += NT) rec[R::U + e] = Ub[e];
  for (int x = tid; x < K; x += NT) rec[R::gl + x] = expf(G(BT - 1, x));
}

// One CTA per (value head, block of BV state columns, sequence): the state recurrence.
template <int K, int V, int BV>
__global__ void __launch_bounds__(NT) split_rec_kernel(const ChunkArgs a, const int32_t* __restrict__ base,
                                                       const float* __restrict__ records) {
  const LaPrefill& p = a.p;
  constexpr int KS = K + 4;
  using R = Rec<K, K>;  // K == V; the transition pass runs with the state [K, K]
  constexpr int BUF = 2 * K * BTP + BT * KS + BT * BTP + BT * BV + K;
  const int h = blockIdx.x / (V / BV), y0 = (blockIdx.x % (V / BV)) * BV;
  const int n = blockIdx.y, tid = threadIdx.x;
  const int64_t bos = p.cu_seqlens[n];
  const int T = int(p.cu_seqlens[n + 1] - bos), g0 = base[n], nch = base[n + 1] - g0;
  extern __shared__ __align__(16) float smem[];
  float* S = smem;  // [K][BV]
  auto buf = [&](int c) { return smem + K * BV + (c & 1) * BUF; };
  const size_t soff = (size_t(n) * p.HV + h) * K * V;
  for (int e = tid; e < K * BV; e += NT) {
    const int x = e / BV, yg = y0 + e % BV;
    S[e] = a.trans_A ? (x == yg ? 1.f : 0.f) : (p.h0 ? p.h0[soff + size_t(x) * V + yg] : 0.f);
  }
  auto issue = [&](int c) {  // async copy of chunk c's record into its buffer
    const float* rec = records + (size_t(g0 + c) * p.HV + h) * R::size;
    float* b = buf(c);
    float *Wt = b, *Qt = Wt + K * BTP, *Kd = Qt + K * BTP, *At = Kd + BT * KS, *Ub = At + BT * BTP, *gl = Ub + BT * BV;
    for (int e = tid; e < K * BT / 4; e += NT) {
      const int x = e / (BT / 4), q = e % (BT / 4);
      __pipeline_memcpy_async(Wt + x * BTP + 4 * q, rec + R::Wt + x * BT + 4 * q, 16);
      if (a.write_o) __pipeline_memcpy_async(Qt + x * BTP + 4 * q, rec + R::Qt + x * BT + 4 * q, 16);
    }
    for (int e = tid; e < BT * K / 4; e += NT) {
      const int j = e / (K / 4), q = e % (K / 4);
      __pipeline_memcpy_async(Kd + j * KS + 4 * q, rec + R::Kd + j * K + 4 * q, 16);
    }
    if (a.write_o)
      for (int e = tid; e < BT * BT / 4; e += NT) {
        const int j = e / (BT / 4), q = e % (BT / 4);
        __pipeline_memcpy_async(At + j * BTP + 4 * q, rec + R::At + j * BT + 4 * q, 16);
      }
    if (!a.trans_A)
      for (int e = tid; e < BT * BV / 4; e += NT) {
        const int j = e / (BV / 4), q = e % (BV / 4);
        __pipeline_memcpy_async(Ub + j * BV + 4 * q, rec + R::U + j * V + y0 + 4 * q, 16);
      }
    for (int e = tid; e < K / 4; e += NT) __pipeline_memcpy_async(gl + 4 * e, rec + R::gl + 4 * e, 16);
  };
  if (nch > 0) issue(0);
  __pipeline_commit();
  constexpr int TN = BV / 32;
  const int ig = tid >> 5, yt = tid & 31;
  for (int c = 0; c < nch; ++c) {
    if (c + 1 < nch) issue(c + 1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncthreads();
    float* b = buf(c);
    float *Wt = b, *Qt = Wt + K * BTP, *Kd = Qt + K * BTP, *At = Kd + BT * KS, *Ub = At + BT * BTP, *gl = Ub + BT * BV;
    const int C = min(BT, T - c * BT);
    {  // U' = U - W S
      float acc[4][TN];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) acc[r][cc] = a.trans_A ? 0.f : Ub[(4 * ig + r) * BV + yt + 32 * cc];
#pragma unroll 4
      for (int x = 0; x < K; ++x) {
        const float4 w = ld4(Wt + x * BTP + 4 * ig);
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) {
          const float s = S[x * BV + yt + 32 * cc];
          acc[0][cc] -= w.x * s, acc[1][cc] -= w.y * s, acc[2][cc] -= w.z * s, acc[3][cc] -= w.w * s;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) Ub[(4 * ig + r) * BV + yt + 32 * cc] = acc[r][cc];
    }
    __syncthreads();
    if (a.write_o) {  // o = Qg S + Aqk U'
      float acc[4][TN];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) acc[r][cc] = 0.f;
#pragma unroll 4
      for (int x = 0; x < K; ++x) {
        const float4 q = ld4(Qt + x * BTP + 4 * ig);
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) {
          const float s = S[x * BV + yt + 32 * cc];
          acc[0][cc] += q.x * s, acc[1][cc] += q.y * s, acc[2][cc] += q.z * s, acc[3][cc] += q.w * s;
        }
      }
#pragma unroll 4
      for (int j = 0; j < BT; ++j) {
        const float4 w = ld4(At + j * BTP + 4 * ig);
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) {
          const float u = Ub[j * BV + yt + 32 * cc];
          acc[0][cc] += w.x * u, acc[1][cc] += w.y * u, acc[2][cc] += w.z * u, acc[3][cc] += w.w * u;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = 4 * ig + r;
        if (i < C)
#pragma unroll
          for (int cc = 0; cc < TN; ++cc)
            p.o[((bos + c * BT + i) * p.HV + h) * V + y0 + yt + 32 * cc] = __float2bfloat16(acc[r][cc]);
      }
      __syncthreads();
    }
    {  // S = e^(G_last) S + Kd^T U'
      constexpr int XG = K / 4, CTS = NT / XG, TNS = BV / CTS;
      const int xg = tid / CTS, yc = tid % CTS;
      float acc[4][TNS];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float d = gl[4 * xg + r];
#pragma unroll
        for (int cc = 0; cc < TNS; ++cc) acc[r][cc] = S[(4 * xg + r) * BV + yc + CTS * cc] * d;
      }
#pragma unroll 2
      for (int j = 0; j < BT; ++j) {
        const float4 kd = ld4(Kd + j * KS + 4 * xg);
#pragma unroll
        for (int cc = 0; cc < TNS; ++cc) {
          const float u = Ub[j * BV + yc + CTS * cc];
          acc[0][cc] += kd.x * u, acc[1][cc] += kd.y * u, acc[2][cc] += kd.z * u, acc[3][cc] += kd.w * u;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int cc = 0; cc < TNS; ++cc) S[(4 * xg + r) * BV + yc + CTS * cc] = acc[r][cc];
    }
    __syncthreads();
  }
  __pipeline_wait_prior(0);
  if (p.ht)
    for (int e = tid; e < K * BV; e += NT) p.ht[soff + size_t(e / BV) * V + y0 + e % BV] = S[e];
}

template <int K, bool KDA>
void prep(const LaPrefill& p, int64_t T_total, const int32_t* base, float* records, cudaStream_t stream) {
  const size_t smem = (3 * BT * (K + 4) + size_t(K) * BTP + BT * K + BT * BT + BT * BTP + size_t(K) * BTP) * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(split_prep_kernel<K, KDA>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  split_prep_kernel<K, KDA><<<dim3(unsigned(split_max_chunks(T_total, p.N)), unsigned(p.HV)), NT, smem, stream>>>(
      p, base, records);
  CUDA_CHECK_LAUNCH();
}

template <int K, int BV>
void recur(const ChunkArgs& a, const int32_t* base, const float* records, cudaStream_t stream) {
  constexpr int KS = K + 4, BUF = 2 * K * BTP + BT * KS + BT * BTP + BT * BV + K;
  const size_t smem = (size_t(K) * BV + 2 * BUF) * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(split_rec_kernel<K, K, BV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  split_rec_kernel<K, K, BV><<<dim3(unsigned(a.p.HV * (K / BV)), unsigned(a.p.N)), NT, smem, stream>>>(a, base, records);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t split_max_chunks(int64_t T_total, int N) { return size_t((T_total + BT - 1) / BT + N); }

void split_prepare(const LaPrefill& p, int64_t T_total, int32_t* chunk_base, float* records, cudaStream_t stream) {
  chunk_base_kernel<<<1, 1, 0, stream>>>(p.cu_seqlens, p.N, chunk_base);
  CUDA_CHECK_LAUNCH();
  if (T_total == 0) return;
  if (p.K == 64)
    p.kda ? prep<64, true>(p, T_total, chunk_base, records, stream) : prep<64, false>(p, T_total, chunk_base, records, stream);
  else
    p.kda ? prep<128, true>(p, T_total, chunk_base, records, stream)
          : prep<128, false>(p, T_total, chunk_base, records, stream);
}

void split_recur(const ChunkArgs& a, int bv, const int32_t* chunk_base, const float* records, cudaStream_t stream) {
  if (a.p.K == 64) {
    if (bv == 32) return recur<64, 32>(a, chunk_base, records, stream);
    return recur<64, 64>(a, chunk_base, records, stream);
  }
  if (bv == 32) return recur<128, 32>(a, chunk_base, records, stream);
  if (bv == 64) return recur<128, 64>(a, chunk_base, records, stream);
  return recur<128, 128>(a, chunk_base, records, stream);
}

}  // namespace dz::cuda::la
