// Chunked KDA / Gated DeltaNet prefill, segment transitions, ordered merge and the intra-GPU
// parallel scan. Math: lib/ops/linear_attn.cpp (chunked()), the oracle these kernels are tested
// against. Version 1: one CTA per (sequence, value head), the state S [K, V] and the chunk's
// matrices in shared memory, fp32 SIMT arithmetic (no tensor cores yet).
#include <algorithm>

#include "common.cuh"
#include "linear_attn.cuh"
#include "linear_attn_common.cuh"
#include "linear_attn_impl.cuh"

namespace dz::cuda {

namespace {

using namespace la;

constexpr int BT = kBT;  // chunk length
constexpr int NT = 256;  // threads per CTA

template <int K, int BV>
constexpr size_t chunk_smem_floats() {
  return size_t(K) * BV + 3 * BT * (K + 1) + BT * K + BT * BV + 2 * BT * BT + BT;
}

// Versions (LaPrefill::variant): 1 SIMT products with broadcast operands; 2 register-tiled
// products; 3 key side precomputed in parallel; 4 tensor cores, chunk 64. Measured on the H200 at
// T=65536 H=32 K=V=128 (docs/perf): v1 108 ms, v2 60 ms, v3 24 ms, v4 6.3 ms (KDA).

// One CTA per (value head, block of BV state columns, sequence): the columns of S evolve
// independently given the key-side quantities (W, Kd, Qg, L, Aqk), which every column block of a
// head recomputes. Per chunk of BT rows starting from state S:
//   G   = cumsum(g) per channel                     L[i][j] = beta_i sum_x k_i k_j e^(G_i - G_j), j < i
//   [W | U] = (I + L)^-1 [beta k e^G | beta v]     (forward substitution, column per thread)
//   U'  = U - W S                                   o_i = (q_i e^G_i) S + sum_{j<=i} Aqk[i][j] U'_j
//   S   = e^(G_last) S + sum_j (k_j e^(G_last - G_j)) U'_j^T
// Decays are only taken as e^(G_i - G_j), j <= i, and e^G: all <= 1.
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

// Column block: enough CTAs to fill the GPU (about two per SM), else whole rows of S (no
// recomputation of the key side).
int pick_bv(const LaPrefill& p, int ctas, int V, bool v4 = false) {
  if (p.value_block) return std::min(p.value_block, V);
  const int sms = sm_count();
  if (v4) {  // v4 recurrence (H200, T=64K): half the SMs busy is enough; down to 16 columns
    int bv = V;           // at H=4/8 (2.08 / 2.61 ms vs 2.46 / 2.91 at 32), 32 at H=32 (6.34 vs 7.49 at 16)
    while (bv > 16 && ctas * (V / bv) < sms / 2) bv /= 2;
    return bv;
  }
  for (int bv = V; bv > 32; bv /= 2)
    if (ctas * (V / bv) >= 2 * sms) return bv;
  return 32;
}

template <bool KDA>
void dispatch_kv(const ChunkArgs& a, int K, int V, cudaStream_t stream) {
  DZ_CHECK(K == V && (K == 64 || K == 128), "linear attention CUDA: K=", K, " V=", V, " not supported (K = V = 64 or 128)");
  const int bv = pick_bv(a.p, a.p.HV * a.p.N, V);
  if (a.p.variant == 2) return launch_chunk_tiled(a, bv, stream);
  if (K == 64) {
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

void run_chunk(const ChunkArgs& a, int V, cudaStream_t stream) {
  DZ_CHECK(a.p.HK > 0 && a.p.HV % a.p.HK == 0, "linear attention CUDA: HV=", a.p.HV, " not a multiple of HK=", a.p.HK);
  if (a.p.N == 0 || a.p.HV == 0) return;
  DZ_CHECK(a.p.variant >= 1 && a.p.variant <= 4, "linear attention CUDA: no kernel version ", a.p.variant);
  DZ_CHECK(a.p.variant < 3 || a.p.workspace, "linear attention CUDA: version ", a.p.variant,
           " needs a workspace (la_prefill_workspace_bytes)");
  if (a.p.variant == 4) return mma_prefill(a, pick_bv(a.p, a.p.HV * a.p.N, V, true), kAllStages, stream);
  if (a.p.variant == 3) {
    DZ_CHECK(a.p.K == V && (V == 64 || V == 128), "linear attention CUDA: K=", a.p.K, " V=", V,
             " not supported (K = V = 64 or 128)");
    auto* base = static_cast<int32_t*>(a.p.workspace);
    auto* records = reinterpret_cast<float*>(static_cast<char*>(a.p.workspace) + align256(size_t(a.p.N + 1) * 4));
    split_prepare(a.p, a.p.T_total, base, records, stream);
    split_recur(a, pick_bv(a.p, a.p.HV * a.p.N, V), base, records, stream);
    return;
  }
  if (a.p.kda)
    dispatch_kv<true>(a, a.p.K, V, stream);
  else
    dispatch_kv<false>(a, a.p.K, V, stream);
}

// The segment transitions run on the register-tiled fp32 chunk kernel (linear_attn_tiled.cu) by
// design, whatever kernel the prefill uses: A and B in fp32 products, as the CPU LaTransition.
void run_transition(const ChunkArgs& a, int V, cudaStream_t stream) {
  DZ_CHECK(a.p.HK > 0 && a.p.HV % a.p.HK == 0, "linear attention CUDA: HV=", a.p.HV, " not a multiple of HK=", a.p.HK);
  if (a.p.N == 0 || a.p.HV == 0) return;
  DZ_CHECK(a.p.K == V && (V == 64 || V == 128), "linear attention CUDA: K=", a.p.K, " V=", V,
           " not supported (K = V = 64 or 128)");
  launch_chunk_tiled(a, pick_bv(a.p, a.p.HV * a.p.N, V), stream);
}

// Ordered merge, grid (HV, V / 32): each CTA carries 32 state columns through all segments.
template <int K>
__global__ void __launch_bounds__(NT) merge_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                                   const float* __restrict__ h0, int S, int HV, int V,
                                                   float* __restrict__ S_init, float* __restrict__ ht) {
  constexpr int RPT = K / (NT / 32);
  extern __shared__ float msmem[];
  float* As = msmem;                                   // [K][K]
  auto Sp = reinterpret_cast<float(*)[32]>(msmem + K * K);  // [K][32]
  const int h = blockIdx.x, y0 = blockIdx.y * 32, tid = threadIdx.x, y = tid & 31, xr = tid >> 5;
  for (int m = 0; m < RPT; ++m) {
    const int x = xr + m * (NT / 32);
    Sp[x][y] = h0 ? h0[(size_t(h) * K + x) * V + y0 + y] : 0.f;
  }
  for (int s = 0; s < S; ++s) {
    const size_t so = (size_t(s) * HV + h) * K;
    for (int m = 0; m < RPT; ++m) {
      const int x = xr + m * (NT / 32);
      S_init[(so + x) * V + y0 + y] = Sp[x][y];
    }
    for (int e = tid; e < K * K; e += NT) As[e] = A[so * K + e];
    __syncthreads();
    float acc[RPT];
#pragma unroll
    for (int m = 0; m < RPT; ++m) acc[m] = B[(so + xr + m * (NT / 32)) * V + y0 + y];
    for (int z = 0; z < K; ++z) {
      const float sz = Sp[z][y];
#pragma unroll
      for (int m = 0; m < RPT; ++m) acc[m] += As[(xr + m * (NT / 32)) * K + z] * sz;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < RPT; ++m) Sp[xr + m * (NT / 32)][y] = acc[m];
  }
  __syncthreads();
  if (ht)
    for (int m = 0; m < RPT; ++m) {
      const int x = xr + m * (NT / 32);
      ht[(size_t(h) * K + x) * V + y0 + y] = Sp[x][y];
    }
}

// Segment boundaries of one sequence: seg_cu[s] = cu[0] + min(s L, T).
__global__ void segment_bounds_kernel(const int32_t* cu, int S, int L, int T, int32_t* seg_cu) {
  const int s = threadIdx.x + blockIdx.x * blockDim.x;
  if (s <= S) seg_cu[s] = cu[0] + min(s * L, T);
}

}  // namespace


void la_chunk_prefill(const LaPrefill& p, cudaStream_t stream) { run_chunk(ChunkArgs{p, p.o != nullptr, false}, p.V, stream); }

size_t la_prefill_workspace_bytes(int64_t T_total, int N, int HV, int K, int V) {
  return std::max(align256(size_t(N + 1) * 4) + records_bytes(T_total, N, HV, K, V),
                  mma_workspace_bytes(T_total, N, HV, K, V));
}

void la_transitions(const LaPrefill& p, const int32_t* seg_cu, int S, float* A, float* B, cudaStream_t stream) {
  LaPrefill q = p;
  q.cu_seqlens = seg_cu;
  q.N = S;
  q.h0 = nullptr;
  q.o = nullptr;
  q.ht = A;
  run_transition(ChunkArgs{q, false, true}, p.K, stream);  // A: the state is [K, K]
  q.ht = B;
  run_transition(ChunkArgs{q, false, false}, p.V, stream);
}

void la_merge(const float* A, const float* B, const float* h0, int S, int HV, int K, int V, float* S_init, float* ht,
              cudaStream_t stream) {
  if (S == 0 || HV == 0) return;
  DZ_CHECK(V % 32 == 0, "la_merge: V=", V, " not a multiple of 32");
  const dim3 grid(unsigned(HV), unsigned(V / 32));
  const size_t smem = size_t(K) * (K + 32) * sizeof(float);
  if (K == 64) {
    merge_kernel<64><<<grid, NT, smem, stream>>>(A, B, h0, S, HV, V, S_init, ht);
  } else if (K == 128) {
    CUDA_CHECK(cudaFuncSetAttribute(merge_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    merge_kernel<128><<<grid, NT, smem, stream>>>(A, B, h0, S, HV, V, S_init, ht);
  } else {
    fail(str("la_merge: K=", K, " not supported (64 or 128)"));
  }
  CUDA_CHECK_LAUNCH();
}

size_t la_scan_workspace_bytes(int64_t T, int segments, int HV, int K, int V) {
  const size_t s = size_t(std::max(segments, 1));
  return align256((s + 1) * 4) + align256(s * HV * K * K * 4) + 2 * align256(s * HV * K * V * 4) +
         std::max(align256((s + 1) * 4) + records_bytes(T, int(s), HV, K, V), mma_workspace_bytes(T, int(s), HV, K, V));
}

void la_parallel_prefill(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream) {
  DZ_CHECK(p.N == 1, "la_parallel_prefill: one sequence expected, got N=", p.N);
  const int CB = p.variant == 4 ? 64 : BT;  // segments of whole chunks of the kernel version
  const int64_t chunks = (T + CB - 1) / CB;
  if (segments <= 1 || chunks <= 1) return la_chunk_prefill(p, stream);
  const int L = int((chunks + segments - 1) / segments) * CB;  // rows per segment
  const int S = int((T + L - 1) / L);
  char* ws = static_cast<char*>(workspace);
  auto* seg_cu = reinterpret_cast<int32_t*>(ws);
  ws += align256(size_t(segments + 1) * 4);
  auto* A = reinterpret_cast<float*>(ws);
  ws += align256(size_t(segments) * p.HV * p.K * p.K * 4);
  auto* B = reinterpret_cast<float*>(ws);
  ws += align256(size_t(segments) * p.HV * p.K * p.V * 4);
  auto* S_init = reinterpret_cast<float*>(ws);
  segment_bounds_kernel<<<1, 1024, 0, stream>>>(p.cu_seqlens, S, L, int(T), seg_cu);
  CUDA_CHECK_LAUNCH();
  if (p.variant == 4) {  // key side once (tensor cores); transitions, zero-state ends, merge, outputs
    ws += align256(size_t(segments) * p.HV * p.K * p.V * 4);
    LaPrefill q = p;
    q.cu_seqlens = seg_cu, q.N = S, q.h0 = nullptr, q.o = nullptr, q.T_total = T, q.workspace = ws;
    mma_prefill(ChunkArgs{q, false, false}, 0, kPrep, stream);
    q.ht = A;
    mma_prefill(ChunkArgs{q, false, true}, pick_bv(p, p.HV * S, p.K, true), kRecur, stream);
    q.ht = B;
    mma_prefill(ChunkArgs{q, false, false}, pick_bv(p, p.HV * S, p.V, true), kRecur, stream);
    la_merge(A, B, p.h0, S, p.HV, p.K, p.V, S_init, p.ht, stream);
    q.h0 = S_init, q.ht = nullptr, q.o = p.o;
    mma_prefill(ChunkArgs{q, true, false}, pick_bv(p, p.HV * S, p.V, true), kRecur | kOutput, stream);
    return;
  }
  if (p.variant == 3) {  // key side once for all chunks; the three passes only stream records
    ws += align256(size_t(segments) * p.HV * p.K * p.V * 4);
    auto* base = reinterpret_cast<int32_t*>(ws);
    auto* records = reinterpret_cast<float*>(ws + align256(size_t(segments + 1) * 4));
    LaPrefill q = p;
    q.cu_seqlens = seg_cu, q.N = S, q.h0 = nullptr, q.o = nullptr, q.workspace = nullptr;
    split_prepare(q, T, base, records, stream);
    q.ht = A;
    split_recur(ChunkArgs{q, false, true}, pick_bv(p, p.HV * S, p.K), base, records, stream);
    q.ht = B;
    split_recur(ChunkArgs{q, false, false}, pick_bv(p, p.HV * S, p.V), base, records, stream);
    la_merge(A, B, p.h0, S, p.HV, p.K, p.V, S_init, p.ht, stream);
    q.h0 = S_init, q.ht = nullptr, q.o = p.o;
    split_recur(ChunkArgs{q, true, false}, pick_bv(p, p.HV * S, p.V), base, records, stream);
    return;
  }
  la_transitions(p, seg_cu, S, A, B, stream);
  la_merge(A, B, p.h0, S, p.HV, p.K, p.V, S_init, p.ht, stream);
  LaPrefill q = p;
  q.cu_seqlens = seg_cu;
  q.N = S;
  q.h0 = S_init;
  q.ht = nullptr;
  q.workspace = nullptr;
  run_chunk(ChunkArgs{q, true, false}, p.V, stream);
}

}  // namespace dz::cuda
