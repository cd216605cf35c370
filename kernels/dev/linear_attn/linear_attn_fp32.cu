// The earlier fp32 versions of the chunked prefill as callable comparison versions (see
// linear_attn_dev.cuh): version 1's kernel, and the entry points of versions 1-3 and of their
// parallel scans (moved here from kernels/linear_attn.cu, with the same dispatch, checks and
// workspace layouts). Not in the library.
#include <algorithm>

#include "common.cuh"
#include "linear_attn_common.cuh"
#include "linear_attn_dev.cuh"
#include "linear_attn_impl.cuh"

namespace dz::cuda::la_dev {

namespace {

using namespace la;

constexpr int BT = kBT;  // chunk length
constexpr int NT = 256;  // threads per CTA

template <int K, int BV>
constexpr size_t chunk_smem_floats() {
  return size_t(K) * BV + 3 * BT * (K + 1) + BT * K + BT * BV + 2 * BT * BT + BT;
}

// Version 1: one CTA per (value head, block of BV state columns, sequence), the state columns and
// the chunk's matrices in shared memory, fp32 SIMT products with broadcast operands (one shared
// load per FMA). Algorithm and math: the register-tiled kernel, kernels/linear_attn_tiled.cu.
template <int K, int V, int BV, bool KDA>
__global__ void __launch_bounds__(NT) chunk_kernel(const ChunkArgs a) {
  const LaPrefill& p = a.p;
  constexpr int KP = K + 1;  // padded row stride: the pair products read rows i and j at one x
  const int h = blockIdx.x / (V / BV), y0 = (blockIdx.x % (V / BV)) * BV;
  const int n = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hk = h / (p.HV / p.HK);
  const int64_t bos = p.cu_seqlens[n];
  const int T = int(p.cu_seqlens[n + 1] - bos);
  extern __shared__ float smem[];
  float* S = smem;             // [K][BV] columns y0 .. y0 + BV - 1 of the state
  float* Kb = S + K * BV;      // [BT][KP] k (L2-normalised), later k e^(G_last - G)
  float* Qb = Kb + BT * KP;    // [BT][KP] scale q (normalised), later scale q e^G
  float* Gb = Qb + BT * KP;    // [BT][KP] cumulative log-decay (GDN: column 0)
  float* Wb = Gb + BT * KP;    // [BT][K]
  float* Ub = Wb + BT * K;     // [BT][BV] u, then U'
  float* Lb = Ub + BT * BV;    // [BT][BT]
  float* Ab = Lb + BT * BT;    // [BT][BT] q-k decayed products
  float* betas = Ab + BT * BT; // [BT]
  auto G = [&](int i, int x) -> float& { return Gb[i * KP + (KDA ? x : 0)]; };

  const size_t soff = (size_t(n) * p.HV + h) * K * V;
  for (int e = tid; e < K * BV; e += NT) {
    const int x = e / BV, yg = y0 + e % BV;
    S[e] = a.trans_A ? (x == yg ? 1.f : 0.f) : (p.h0 ? p.h0[soff + size_t(x) * V + yg] : 0.f);
  }
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
        Kb[i * KP + x] = kv[m] * ik;
        Qb[i * KP + x] = p.scale * (qv[m] * iq);
        if (KDA) {
          float g = 0.f;
          if (valid) {
            const int c = h * K + x;
            g = gate(bf(p.gate.f[t * (int64_t(p.HV) * K) + c]) + (p.gate.dt_bias ? p.gate.dt_bias[c] : 0.f), aexp, lb);
          }
          Gb[i * KP + x] = g;
        }
      }
      if (!KDA && lane == 0)
        Gb[i * KP] = valid ? gate(bf(p.gate.f[t * p.HV + h]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f), aexp, lb)
                           : 0.f;
      for (int y = lane; y < BV; y += 32)
        Ub[i * BV + y] = (valid && !a.trans_A) ? beta * bf(p.v[(t * p.HV + h) * V + y0 + y]) : 0.f;
      if (lane == 0) betas[i] = beta;
    }
    __syncthreads();
    // ---- cumulative log-decay, in row order as the reference ----
    for (int x = tid; x < (KDA ? K : 1); x += NT) {
      float acc = 0.f;
      for (int i = 0; i < BT; ++i) acc = (Gb[i * KP + x] += acc);
    }
    __syncthreads();
    // ---- pair products: one warp per (i, j), j <= i, lanes over channels ----
    for (int pi = warp; pi < BT * (BT + 1) / 2; pi += NT / 32) {
      int i = int((sqrtf(8.f * pi + 1.f) - 1.f) * 0.5f);
      while ((i + 1) * (i + 2) / 2 <= pi) ++i;
      while (i * (i + 1) / 2 > pi) --i;
      const int j = pi - i * (i + 1) / 2;
      float l = 0.f, aq = 0.f;
#pragma unroll
      for (int m = 0; m < K / 32; ++m) {
        const int x = lane + 32 * m;
        const float kj = Kb[j * KP + x];
        const float e = KDA ? expf(Gb[i * KP + x] - Gb[j * KP + x]) : 1.f;
        l += Kb[i * KP + x] * kj * e;
        if (a.write_o) aq += Qb[i * KP + x] * kj * e;
      }
      l = warp_sum(l);
      if (a.write_o) aq = warp_sum(aq);
      if (lane == 0) {
        const float e = KDA ? 1.f : expf(G(i, 0) - G(j, 0));
        Lb[i * BT + j] = j < i ? betas[i] * (e * l) : 0.f;
        Ab[i * BT + j] = e * aq;
      }
    }
    __syncthreads();
    // ---- W = beta k e^G, Kd = k e^(G_last - G), Qg = q e^G ----
    for (int e = tid; e < BT * K; e += NT) {
      const int i = e / K, x = e % K;
      const float gi = G(i, x), gl = G(BT - 1, x), kk = Kb[i * KP + x];
      Wb[i * K + x] = betas[i] * kk * expf(gi);
      Kb[i * KP + x] = kk * expf(gl - gi);
      if (a.write_o) Qb[i * KP + x] *= expf(gi);
    }
    __syncthreads();
    // ---- forward substitution (I + L) [W | U] = [W | U], one column per thread ----
    for (int c = tid; c < K + BV; c += NT) {
      if (a.trans_A && c >= K) break;  // U is zero in the transition pass
      float* col = c < K ? Wb + c : Ub + (c - K);
      const int st = c < K ? K : BV;
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
    constexpr int RG = NT / BV, RPT = BT / RG;  // row groups and rows per thread for [BT][BV] products
    const int y = tid % BV, rg = tid / BV;
    // ---- U' = U - W S (each thread owns (rows rg + m RG, column y)) ----
    {
      float acc[RPT];
#pragma unroll
      for (int m = 0; m < RPT; ++m) acc[m] = Ub[(rg + m * RG) * BV + y];
      for (int x = 0; x < K; ++x) {
        const float s = S[x * BV + y];
#pragma unroll
        for (int m = 0; m < RPT; ++m) acc[m] -= Wb[(rg + m * RG) * K + x] * s;
      }
#pragma unroll
      for (int m = 0; m < RPT; ++m) Ub[(rg + m * RG) * BV + y] = acc[m];
    }
    __syncthreads();
    // ---- outputs ----
    if (a.write_o) {
      float acc[RPT];
#pragma unroll
      for (int m = 0; m < RPT; ++m) acc[m] = 0.f;
      for (int x = 0; x < K; ++x) {
        const float s = S[x * BV + y];
#pragma unroll
        for (int m = 0; m < RPT; ++m) acc[m] += Qb[(rg + m * RG) * KP + x] * s;
      }
      for (int j = 0; j < BT; ++j) {
        const float u = Ub[j * BV + y];
#pragma unroll
        for (int m = 0; m < RPT; ++m) {
          const int i = rg + m * RG;
          if (j <= i) acc[m] += Ab[i * BT + j] * u;
        }
      }
#pragma unroll
      for (int m = 0; m < RPT; ++m) {
        const int i = rg + m * RG;
        if (i < C) p.o[((bos + c0 + i) * p.HV + h) * V + y0 + y] = __float2bfloat16(acc[m]);
      }
      __syncthreads();
    }
    // ---- state update ----
    {
      float un[BT];
#pragma unroll
      for (int j = 0; j < BT; ++j) un[j] = Ub[j * BV + y];
      for (int x = rg; x < K; x += RG) {
        float acc = S[x * BV + y] * expf(G(BT - 1, x));
#pragma unroll
        for (int j = 0; j < BT; ++j) acc += Kb[j * KP + x] * un[j];
        S[x * BV + y] = acc;
      }
    }
    __syncthreads();
  }
  if (p.ht)
    for (int e = tid; e < K * BV; e += NT) p.ht[soff + size_t(e / BV) * V + y0 + e % BV] = S[e];
}

template <int K, int V, int BV, bool KDA>
void launch_chunk(const ChunkArgs& a, cudaStream_t stream) {
  const size_t smem = chunk_smem_floats<K, BV>() * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(chunk_kernel<K, V, BV, KDA>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  chunk_kernel<K, V, BV, KDA><<<dim3(unsigned(a.p.HV * (V / BV)), unsigned(a.p.N)), NT, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <bool KDA>
void v1_dispatch(const ChunkArgs& a, int bv, cudaStream_t stream) {
  if (a.p.K == 64) {
    if (bv == 32) return launch_chunk<64, 64, 32, KDA>(a, stream);
    return launch_chunk<64, 64, 64, KDA>(a, stream);
  }
  if (bv == 32) return launch_chunk<128, 128, 32, KDA>(a, stream);
  if (bv == 64) return launch_chunk<128, 128, 64, KDA>(a, stream);
  return launch_chunk<128, 128, 128, KDA>(a, stream);
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

size_t records_bytes(int64_t T, int N, int HV, int K, int V) {
  return split_max_chunks(T, N) * HV * split_record_floats(K, V) * sizeof(float);
}

// The library's checks for a prefill over p's sequences with state [K, V]; false: nothing to do.
bool check(const LaPrefill& p, int V) {
  DZ_CHECK(p.HK > 0 && p.HV % p.HK == 0, "linear attention CUDA: HV=", p.HV, " not a multiple of HK=", p.HK);
  if (p.N == 0 || p.HV == 0) return false;
  DZ_CHECK(p.K == V && (V == 64 || V == 128), "linear attention CUDA: K=", p.K, " V=", V,
           " not supported (K = V = 64 or 128)");
  return true;
}

// Segment boundaries of one sequence: seg_cu[s] = cu[0] + min(s L, T) (as kernels/linear_attn.cu).
__global__ void segment_bounds_kernel(const int32_t* cu, int S, int L, int T, int32_t* seg_cu) {
  const int s = threadIdx.x + blockIdx.x * blockDim.x;
  if (s <= S) seg_cu[s] = cu[0] + min(s * L, T);
}

// The parallel scan's segments (whole 32-row chunks) and its workspace, laid out as
// la_parallel_prefill's; false: one segment or one chunk (run the serial version).
struct Scan {
  int S;
  int32_t* seg_cu;
  float *A, *B, *S_init;
  char* rest;  // v3's chunk bases and records
};
bool split_segments(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream, Scan& sc) {
  DZ_CHECK(p.N == 1, "parallel prefill: one sequence expected, got N=", p.N);
  const int64_t chunks = (T + BT - 1) / BT;
  if (segments <= 1 || chunks <= 1) return false;
  const int L = int((chunks + segments - 1) / segments) * BT;  // rows per segment
  sc.S = int((T + L - 1) / L);
  char* ws = static_cast<char*>(workspace);
  sc.seg_cu = reinterpret_cast<int32_t*>(ws);
  ws += align256(size_t(segments + 1) * 4);
  sc.A = reinterpret_cast<float*>(ws);
  ws += align256(size_t(segments) * p.HV * p.K * p.K * 4);
  sc.B = reinterpret_cast<float*>(ws);
  ws += align256(size_t(segments) * p.HV * p.K * p.V * 4);
  sc.S_init = reinterpret_cast<float*>(ws);
  sc.rest = ws + align256(size_t(segments) * p.HV * p.K * p.V * 4);
  segment_bounds_kernel<<<1, 1024, 0, stream>>>(p.cu_seqlens, sc.S, L, int(T), sc.seg_cu);
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

void v1_chunk_prefill(const LaPrefill& p, cudaStream_t stream) {
  if (!check(p, p.V)) return;
  const ChunkArgs a{p, p.o != nullptr, false};
  const int bv = pick_bv(p, p.HV * p.N, p.V, false);
  if (p.kda)
    v1_dispatch<true>(a, bv, stream);
  else
    v1_dispatch<false>(a, bv, stream);
}

void v2_chunk_prefill(const LaPrefill& p, cudaStream_t stream) {
  if (!check(p, p.V)) return;
  launch_chunk_tiled(ChunkArgs{p, p.o != nullptr, false}, pick_bv(p, p.HV * p.N, p.V, false), stream);
}

size_t v3_workspace_bytes(int64_t T_total, int N, int HV, int K, int V) {
  return align256(size_t(N + 1) * 4) + records_bytes(T_total, N, HV, K, V);
}

void v3_chunk_prefill(const LaPrefill& p, cudaStream_t stream) {
  if (!check(p, p.V)) return;
  DZ_CHECK(p.workspace, "linear attention CUDA v3: needs a workspace (v3_workspace_bytes)");
  auto* base = static_cast<int32_t*>(p.workspace);
  auto* records = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + align256(size_t(p.N + 1) * 4));
  split_prepare(p, p.T_total, base, records, stream);
  split_recur(ChunkArgs{p, p.o != nullptr, false}, pick_bv(p, p.HV * p.N, p.V, false), base, records, stream);
}

size_t fp32_scan_workspace_bytes(int64_t T, int segments, int HV, int K, int V) {
  const size_t s = size_t(std::max(segments, 1));
  return align256((s + 1) * 4) + align256(s * HV * K * K * 4) + 2 * align256(s * HV * K * V * 4) +
         align256((s + 1) * 4) + records_bytes(T, int(s), HV, K, V);
}

void v2_parallel_prefill(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream) {
  Scan sc;
  if (!split_segments(p, T, segments, workspace, stream, sc)) return v2_chunk_prefill(p, stream);
  la_transitions(p, sc.seg_cu, sc.S, sc.A, sc.B, stream);
  la_merge(sc.A, sc.B, p.h0, sc.S, p.HV, p.K, p.V, sc.S_init, p.ht, stream);
  LaPrefill q = p;
  q.cu_seqlens = sc.seg_cu;
  q.N = sc.S;
  q.h0 = sc.S_init;
  q.ht = nullptr;
  q.workspace = nullptr;
  v2_chunk_prefill(q, stream);
}

void v3_parallel_prefill(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream) {
  Scan sc;
  if (!split_segments(p, T, segments, workspace, stream, sc)) return v3_chunk_prefill(p, stream);
  // key side once for all chunks; the three passes only stream records
  auto* base = reinterpret_cast<int32_t*>(sc.rest);
  auto* records = reinterpret_cast<float*>(sc.rest + align256(size_t(segments + 1) * 4));
  const int S = sc.S;
  LaPrefill q = p;
  q.cu_seqlens = sc.seg_cu, q.N = S, q.h0 = nullptr, q.o = nullptr, q.workspace = nullptr;
  split_prepare(q, T, base, records, stream);
  q.ht = sc.A;
  split_recur(ChunkArgs{q, false, true}, pick_bv(p, p.HV * S, p.K, false), base, records, stream);
  q.ht = sc.B;
  split_recur(ChunkArgs{q, false, false}, pick_bv(p, p.HV * S, p.V, false), base, records, stream);
  la_merge(sc.A, sc.B, p.h0, S, p.HV, p.K, p.V, sc.S_init, p.ht, stream);
  q.h0 = sc.S_init, q.ht = nullptr, q.o = p.o;
  split_recur(ChunkArgs{q, true, false}, pick_bv(p, p.HV * S, p.V, false), base, records, stream);
}

}  // namespace dz::cuda::la_dev
