// Chunked KDA / Gated DeltaNet prefill, version 4: tensor cores (mma.sync m16n8k16, bf16 operands,
// fp32 accumulation), chunk 64, and the output products taken out of the sequential loop.
// v3 (kernels/dev/linear_attn/linear_attn_split.cu) spent 9.6 ms on the key side in fp32 SIMT
// and ~14 ms in a recurrence that did three fp32 products per 32-row chunk (ncu,
// docs/cuda_linear_attention.md). Here:
//   prep (chunk, head), parallel: gates, norms, pair products L and Aqk — off-diagonal 16-row
//        blocks on tensor cores with a reference row r between the blocks, so both factors
//        e^(G_i - G_r) and e^(G_r - G_j) are <= 1; diagonal blocks exact per element (KDA) —,
//        (I + L)^-1 in 16-row blocks (forward substitution, then 3xTF32 block products),
//        W = Ainv (β k e^G) and U = Ainv (β v) on tensor cores; bf16 records. G is kept in log2
//        units, each factor one ex2.approx.ftz (H100, KDA H=32 T=64K: prep 3.75 -> 3.27 ms).
//   rec  (value head, column block, sequence), sequential over chunks: S in fp32 accumulators;
//        per chunk U' = U - W S and S = e^(G_last) S + Kdᵀ U', and o = (q e^G) S + Aqk U' in the
//        same step (fused) or, from the bf16 state entering each chunk and U' it stores, in
//   out  (chunk, head), parallel.
//        K = 128: wgmma, one warpgroup per 64 columns fed by TMA (rec_wgmma_kernel; H100, T=64K,
//        H=32: 1.25 ms against the mma.sync kernel's 2.32). K = 64: mma.sync (mma_rec_kernel).
// The state accumulates in fp32 and is rounded to bf16 only as a product operand (as fla's chunk
// kernels do); the tests state the tolerance this needs.
#include <cuda_pipeline.h>

#include <algorithm>

#include "common.cuh"
#include "linear_attn_common.cuh"
#include "linear_attn_impl.cuh"
#include "mma_sm80.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dz::cuda::la {

namespace {

constexpr int BT = kMmaBT, NT = 256, AP = BT + 8;  // AP: padded bf16 row of 64 (conflict-free fragments)
constexpr int FS = BT + 4;  // fp32 row of the solve's blocks: A-fragment reads (rows gq, columns tq) conflict-free
// Outputs inside the mma.sync recurrence (K = 64): -1 automatic, 0 off, 1 on (LaPrefill::fused_output).
// Measured at K = 128 when that kernel served it, H200, T=64K:
// fused 6.28 vs 6.40 ms at H=32 (128 recurrence CTAs), but 2.67 vs 2.08 ms at H=4 (32 CTAs,
// where the longer sequential step is the whole cost); the scan's last pass: 1.30 vs 1.37 ms.
bool fuse_outputs(int mode, int ctas) {
  if (mode >= 0) return mode == 1;
  return 2 * ctas >= sm_count();
}

// Record of one (chunk, value head), bf16: W [BT][K] | Kd [BT][K] | U [BT][V] | Qg [BT][K] | Aqk [BT][BT]
// GDN at K = 128 ("lite" records): q e^G, k e^(G_last - G) and k e^G are row scalings of the
// normalised q and k (the decay is one scalar a row), so the prep writes none of them. The recurrence
// and the output pass read the raw q and k and apply the rows' factors, fk[BT] (k's inverse norm
// e^(G_last - G)), fq[BT] (scale, q's inverse norm, e^G) and fe[BT] (k's inverse norm e^G), which the
// prep writes as fp32 at the start of Qg's space. Nor does it write W and U: U' = U - W S =
// Ai diag(beta) (v - (k e^G) S), so the recurrence takes v from the inputs and Ai diag(beta) [BT][BT]
// bf16 from the start of W's space (the prep no longer reads v nor multiplies by Ai). 16.75 of the
// record's 72 KB a chunk and head are written.
// The one rule for both sides: the prep writes lite records exactly where the recurrence and the
// output pass read them.
__host__ __device__ constexpr bool lite_records(int K, bool kda) { return !kda && K == 128; }
template <int K, int V>
struct R4 {
  static constexpr size_t W = 0, Kd = size_t(BT) * K, U = 2 * size_t(BT) * K, Qg = U + size_t(BT) * V,
                          Aqk = Qg + size_t(BT) * K, size = Aqk + BT * BT;
};
constexpr size_t rec_elems(int K, int V) { return 3 * size_t(BT) * K + size_t(BT) * V + BT * BT; }

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
// A fragment: rows r0..r0+15, k k0..k0+15 of a row-major [rows][ld] bf16 matrix (16-byte rows).
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16* A, int ld, int r0, int k0, int lane) {
  const bf16* q = A + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + k0 + 8 * (lane >> 4);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(smem_addr(q)));
}
// B fragment: k k0..k0+15, columns n0..n0+7, from the transposed (column-major) [n][ld] matrix.
__device__ __forceinline__ void frag_b(uint32_t b[2], const bf16* Bt, int ld, int n0, int k0, int lane) {
  const bf16* q = Bt + (n0 + (lane & 7)) * ld + k0 + 8 * ((lane >> 3) & 1);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(b[0]), "=r"(b[1]) : "r"(smem_addr(q)));
}

// c[t] += A[m0 .. m0+15][0 .. kdim) · B[0 .. kdim)[n0 + 8t .. +7] for t < TN; A row-major, B
// given transposed ([n][k], as frag_b reads it).
template <int TN>
__device__ __forceinline__ void mma_rows(float (*c)[4], const bf16* A, int lda, int m0, const bf16* Bt, int ldb, int n0,
                                         int kdim, int lane) {
#pragma unroll
  for (int k0 = 0; k0 < kdim; k0 += 16) {
    uint32_t a[4], b[2];
    frag_a(a, A, lda, m0, k0, lane);
#pragma unroll
    for (int t = 0; t < TN; ++t) {
      frag_b(b, Bt, ldb, n0 + 8 * t, k0, lane);
      mma16816(c[t], a, b);
    }
  }
}

// c += A · B for A a 16 x 16 fp32 block (row-major, stride lda) and B 16 x 8 (row-major, stride
// ldb), both in shared memory, as 3xTF32 on tensor cores (m16n8k8; the solve's blocks are far too
// small for load efficiency to matter: scalar fragment loads).
__device__ __forceinline__ void mma_16x8x16_3xtf32(float (&c)[4], const float* A, int lda, const float* B, int ldb,
                                                   int lane) {
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int k0 = 0; k0 < 16; k0 += 8) {
    uint32_t ah[4], al[4], bh0, bl0, bh1, bl1;
    split_tf32(A[gq * lda + k0 + tq], ah[0], al[0]);
    split_tf32(A[(gq + 8) * lda + k0 + tq], ah[1], al[1]);
    split_tf32(A[gq * lda + k0 + tq + 4], ah[2], al[2]);
    split_tf32(A[(gq + 8) * lda + k0 + tq + 4], ah[3], al[3]);
    split_tf32(B[(k0 + tq) * ldb + gq], bh0, bl0);
    split_tf32(B[(k0 + tq + 4) * ldb + gq], bh1, bl1);
    mma_tf32(c, al, bh0, bh1);
    mma_tf32(c, ah, bl0, bl1);
    mma_tf32(c, ah, bh0, bh1);
  }
}
// A 16 x 8 accumulator tile (mma layout) times s into a row-major fp32 matrix at D (stride ld).
__device__ __forceinline__ void tile_store(float* D, int ld, const float c[4], int lane, float s) {
  const int gq = lane >> 2, tq = lane & 3;
  D[gq * ld + 2 * tq] = s * c[0];
  D[gq * ld + 2 * tq + 1] = s * c[1];
  D[(gq + 8) * ld + 2 * tq] = s * c[2];
  D[(gq + 8) * ld + 2 * tq + 1] = s * c[3];
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// B fragments of two column tiles (n0..n0+15), k k0..k0+15, from a row-major [k][ld] matrix.
__device__ __forceinline__ void frag_b2_rowmajor(uint32_t b0[2], uint32_t b1[2], const bf16* B, int ld, int k0, int n0,
                                                 int lane) {
  uint32_t r[4];
  ldsm_x4_trans(r, B + (k0 + (lane & 15)) * ld + n0 + 8 * (lane >> 4));
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
// A fragment (rows m0..m0+15, k k0..k0+15) of A = S^T, S stored row-major [k][ld].
__device__ __forceinline__ void frag_a_trans(uint32_t a[4], const bf16* S, int ld, int m0, int k0, int lane) {
  const int q = lane >> 3;
  ldsm_x4_trans(a, S + (k0 + (lane & 7) + 8 * (q >> 1)) * ld + m0 + 8 * (q & 1));
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

constexpr int NTP = 512;        // prep threads: 16 warps, two CTAs per SM (their phases overlap); GDN
                                // at K = 128 three (61 KB of shared memory each, 40 registers: its
                                // barrier-bound phases, and the pipelined prep beside the recurrence)
constexpr float kSpanMax = 80.f;  // diagonal blocks factor e^(G_i - G_j) through their middle row when
                                  // every channel decays by at most e^-80 across the 16 rows (no overflow)

template <int K, bool KDA>
constexpr size_t prep_smem_bytes() {
  constexpr int KP = K + 8;
  // X: KDA's pair operands [112][KP] bf16 (GDN: its staged Aqk [BT][AP]), later (I+L)^-1 as bf16
  // [BT][AP] and its fp32 blocks [BT][FS] (lite records: in Kn / Qn's space instead)
  constexpr size_t solve = size_t(BT * AP) * 2 + size_t(BT * FS) * 4;
  constexpr size_t xb = KDA ? std::max(size_t(112 * KP) * 2, solve) : (lite_records(K, KDA) ? size_t(BT * AP) * 2 : solve);
  return size_t(2 * BT * KP) * 2 + size_t(BT * (KDA ? K : 1)) * 4 + size_t(BT * (BT + 1)) * 4 + xb;
}
// three GDN K = 128 prep CTAs an SM (mma_prep_kernel's launch bounds): dynamic + static (< 1 KB) shared
// memory, and the 1 KB the SM reserves a CTA
static_assert(3 * (prep_smem_bytes<128, false>() + 1024 + 1024) <= 228 * 1024, "three GDN prep CTAs fit an SM");

__device__ __forceinline__ void unpack8(const uint4 u, float f[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = __uint_as_float(w[e] << 16);
    f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {
  return make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
}

// The gate with MUFU exp/log: softplus(z) = log(1 + e^z) to ~1e-7 absolute, e^z below -15 (where
// 1 + e^z rounds to 1); the log-decay is then within 1e-7 of the CPU's log1pf form per step.
__device__ __forceinline__ float gate_fast(float z, float a, float lower_bound) {
  if (lower_bound < 0.f) return lower_bound / (1.f + ex2(-a * z * kLog2e));
  const float sp = z > 20.f ? z : (z < -15.f ? ex2(z * kLog2e) : lg2(1.f + ex2(z * kLog2e)) * (1.f / kLog2e));
  return -a * sp;
}

// One CTA per (chunk, value head): the key side of the chunk into its record. Work is spread in
// 8-channel slots (16-byte loads and stores); barriers separate the phases.
template <int K, bool KDA>
__global__ void __launch_bounds__(NTP, (K == 128 && !KDA) ? 3 : 2)
    mma_prep_kernel(const LaPrefill p, const int32_t* __restrict__ base, bf16* __restrict__ records,
                    float* __restrict__ gls) {
  constexpr int V = K, KP = K + 8, GS = KDA ? K : 1, LS = BT + 1, SPR = K / 8, SLOTS = BT * SPR;
  constexpr bool LITE = lite_records(K, KDA);
  using R = R4<K, V>;
  const int g = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  if (g >= base[p.N]) return;
  const int n = seq_of(base, p.N, g), hk = h / (p.HV / p.HK);
  const int64_t bos = p.cu_seqlens[n];
  const int c0 = (g - base[n]) * BT, C = min(BT, int(p.cu_seqlens[n + 1] - bos) - c0);
  extern __shared__ __align__(16) unsigned char sm4[];
  bf16* Kn = reinterpret_cast<bf16*>(sm4);             // [BT][KP] L2-normalised k; later v
  bf16* Qn = Kn + BT * KP;                             // [BT][KP] L2-normalised q * scale; later k e^G
  float* Gc = reinterpret_cast<float*>(Qn + BT * KP);  // [BT][GS] cumulative log2-decay in the chunk
  float* L = Gc + BT * GS;                             // [BT][LS] beta_i k_i.k_j e^(G_i - G_j), j < i
  bf16* X = reinterpret_cast<bf16*>(L + BT * LS);      // [112][KP] pair operands; later (I+L)^-1 [BT][AP]
  __shared__ float betas[BT];
  __shared__ float inv_kq[2][LITE ? BT : 1];  // lite records: the rows' inverse norms of k, q
  __shared__ int wide[4];  // diagonal block whose decay span is too wide to factor: computed exactly
  bf16* rec = records + (size_t(g) * p.HV + h) * R::size;
  // KDA's rows of Gc hold channels x0 .. x0 + 3 of each 8-channel slot at x0 / 2 and x0 + 4 .. x0 + 7
  // at K / 2 + x0 / 2: a quarter-warp's 8 slots read 128 contiguous bytes (no bank conflict).
  auto gp = [](int x) { return KDA ? ((x >> 3) << 2) + (x & 3) + (x & 4 ? K / 2 : 0) : 0; };
  auto G = [&](int i, int x) -> float { return Gc[i * GS + gp(x)]; };
  auto G8 = [&](int i, int x0, float f[8]) {
    if (KDA) {
      const float4 a = *reinterpret_cast<const float4*>(Gc + i * GS + gp(x0)),
                   b = *reinterpret_cast<const float4*>(Gc + i * GS + gp(x0 + 4));
      f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = Gc[i];
    }
  };
  if (tid < 4) wide[tid] = 0;

  // ---- rows: every load in flight at once; L2 norms; gates; beta ----
  const float aexp = p.gate.A_log ? expf(p.gate.A_log[h]) : 1.f, lb = p.gate.lower_bound;
  {
    constexpr int NS = SLOTS / NTP;  // slots per thread (the same 8 channels x0 in each)
    const int x0 = 8 * (tid % SPR);
    // The row's beta (and GDN's gate) logit, loaded with the rows: issued after them, they were a
    // second and third DRAM round trip on the first two warps that the whole CTA waited for.
    // GDN: warp 0 takes the gate logits of rows lane and lane + 32 and sums them in the rows phase.
    bf16 braw = __float2bfloat16(0.f), fgraw[2] = {__float2bfloat16(0.f), __float2bfloat16(0.f)};
    if (tid < BT && tid < C) braw = p.b[(bos + c0 + tid) * p.HV + h];
    if (!KDA && tid < 32)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (tid + 32 * r < C) fgraw[r] = p.gate.f[(bos + c0 + tid + 32 * r) * p.HV + h];
    uint4 kr[NS], qr[NS], fr[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int i = (tid + NTP * s) / SPR;
      const bool valid = i < C;
      const int64_t t = bos + c0 + i;
      const uint4 z = make_uint4(0, 0, 0, 0);
      kr[s] = valid ? *reinterpret_cast<const uint4*>(p.k + (t * p.HK + hk) * K + x0) : z;
      qr[s] = valid && p.q ? *reinterpret_cast<const uint4*>(p.q + (t * p.HK + hk) * K + x0) : z;
      if (KDA) fr[s] = valid ? *reinterpret_cast<const uint4*>(p.gate.f + t * (int64_t(p.HV) * K) + h * K + x0) : z;
    }
    float db[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) db[e] = KDA && p.gate.dt_bias ? p.gate.dt_bias[h * K + x0 + e] : 0.f;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int i = (tid + NTP * s) / SPR;
      float kf[8], qf[8], ss = 0.f, sq = 0.f;
      unpack8(kr[s], kf);
      unpack8(qr[s], qf);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += kf[e] * kf[e], sq += qf[e] * qf[e];
#pragma unroll
      for (int o = SPR / 2; o > 0; o >>= 1) {  // the SPR lanes of a row are adjacent
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
      }
      const float ik = 1.f / sqrtf(ss + 1e-6f), iq = 1.f / sqrtf(sq + 1e-6f);
      if (LITE && x0 == 0) inv_kq[0][i] = ik, inv_kq[1][i] = iq;
#pragma unroll
      for (int e = 0; e < 8; ++e) kf[e] *= ik, qf[e] = p.scale * (qf[e] * iq);
      *reinterpret_cast<uint4*>(Kn + i * KP + x0) = pack8(kf);
      *reinterpret_cast<uint4*>(Qn + i * KP + x0) = pack8(qf);
      if (KDA) {
        float ff[8];
        unpack8(fr[s], ff);
#pragma unroll
        for (int e = 0; e < 8; ++e) ff[e] = i < C ? gate_fast(ff[e] + db[e], aexp, lb) : 0.f;
        *reinterpret_cast<float4*>(Gc + i * GS + gp(x0)) = make_float4(ff[0], ff[1], ff[2], ff[3]);
        *reinterpret_cast<float4*>(Gc + i * GS + gp(x0 + 4)) = make_float4(ff[4], ff[5], ff[6], ff[7]);
      }
    }
    if (tid < BT) betas[tid] = tid < C ? sigmoid(bf(braw)) : 0.f;
    if (!KDA && tid < 32) {
      // GDN's cumulative sum in warp 0, the same additions in the same order as KDA's per-channel
      // sum below (16-row parts summed row after row, then the earlier parts' totals added from
      // 0 in order), so no barrier phase of its own: v[r] is row lane + 32 r.
      float v[2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
        v[r] = tid + 32 * r < C ? gate(bf(fgraw[r]) + (p.gate.dt_bias ? p.gate.dt_bias[h] : 0.f), aexp, lb) : 0.f;
#pragma unroll
      for (int st = 1; st < 16; ++st)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float prev = __shfl_up_sync(0xffffffffu, v[r], 1);
          if ((lane & 15) == st) v[r] += prev;
        }
      const float t0 = __shfl_sync(0xffffffffu, v[0], 15), t1 = __shfl_sync(0xffffffffu, v[0], 31),
                  t2 = __shfl_sync(0xffffffffu, v[1], 15);
      const float o1 = 0.f + t0, o2 = o1 + t1, o3 = o2 + t2;  // parts 1, 2, 3
      Gc[tid] = (v[0] + (lane < 16 ? 0.f : o1)) * kLog2e;
      Gc[tid + 32] = (v[1] + (lane < 16 ? o2 : o3)) * kLog2e;
    }
  }
  __syncthreads();
  if (KDA) {  // cumulative sum per channel (position q of the row), 16 rows a thread; then to log2 units
    const int q = tid % GS, part = tid / GS;  // a warp: 32 consecutive positions of one part
    const bool act = part < 4;
    float v[16];
    if (act) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = Gc[(16 * part + i) * GS + q];
#pragma unroll
      for (int i = 1; i < 16; ++i) v[i] += v[i - 1];
      L[part * GS + q] = v[15];  // the 16-row totals, in L's space (unused until the pair products)
      if (v[0] - v[15] > kSpanMax) wide[part] = 1;
    }
    __syncthreads();
    if (act) {
      float off = 0.f;
      for (int pp = 0; pp < part; ++pp) off += L[pp * GS + q];
#pragma unroll
      for (int i = 0; i < 16; ++i) Gc[(16 * part + i) * GS + q] = (v[i] + off) * kLog2e;
    }
    __syncthreads();
  }

  // ---- q e^G and k e^(G_last - G) (row-major) and e^G_last to the record ----
  if (LITE) {  // their row factors instead; rows past the sequence: 0 (the raw rows
    if (tid < BT) {              // there are the next sequence's)
      float* fac = reinterpret_cast<float*>(rec + R::Qg);  // fk [BT] | fq [BT] | fe [BT]
      const bool valid = tid < C;
      const float eg = valid ? ex2(Gc[tid]) : 0.f;
      fac[tid] = valid ? inv_kq[0][tid] * ex2(Gc[BT - 1] - Gc[tid]) : 0.f;
      fac[BT + tid] = p.scale * inv_kq[1][tid] * eg;
      fac[2 * BT + tid] = inv_kq[0][tid] * eg;  // fe: k e^G = diag(fe) k
    } else if (tid < BT + K) {
      gls[(size_t(g) * p.HV + h) * K + tid - BT] = ex2(Gc[BT - 1]);
    }
  } else {
    for (int sl = tid; sl < SLOTS; sl += NTP) {
      const int i = sl / SPR, x0 = 8 * (sl % SPR);
      float gi[8], gl[8], a[8], b[8];
      G8(i, x0, gi);
      G8(BT - 1, x0, gl);
      unpack8(*reinterpret_cast<const uint4*>(Qn + i * KP + x0), a);
      unpack8(*reinterpret_cast<const uint4*>(Kn + i * KP + x0), b);
#pragma unroll
      for (int e = 0; e < 8; ++e) a[e] *= ex2(gi[e]), b[e] *= ex2(gl[e] - gi[e]);
      *reinterpret_cast<uint4*>(rec + R::Qg + i * K + x0) = pack8(a);
      *reinterpret_cast<uint4*>(rec + R::Kd + i * K + x0) = pack8(b);
      if (i == 0)
#pragma unroll
        for (int e = 0; e < 8; ++e) gls[(size_t(g) * p.HV + h) * K + x0 + e] = ex2(gl[e]);
    }
  }
  // Aqk goes to the record directly for KDA (X holds its pair operands); GDN stages it in X (free
  // until the solve) and writes it out as whole 128-byte rows after the pair products (its 4-byte
  // fragments went out as partial sectors). Row stride AP = BT + 8: the fragments' writes are free of
  // bank conflicts.
  constexpr int AQL = KDA ? BT : AP;
  bf16* const aq = KDA ? rec + R::Aqk : X;  // [BT][AQL]
  // Aqk above the diagonal blocks: zeros (the inverse never reads L there).
  for (int e = tid; e < 6 * 32; e += NTP) {
    const int pr = e >> 5, bi = pr < 3 ? 0 : (pr < 5 ? 1 : 2), bj = pr < 3 ? pr + 1 : (pr < 5 ? pr - 1 : 3);
    *reinterpret_cast<uint4*>(aq + (16 * bi + (e & 15)) * AQL + 16 * bj + 8 * ((e >> 4) & 1)) = make_uint4(0, 0, 0, 0);
  }
  // Pair products into L (fp32, beta_i folded in, j < i) and Aqk (bf16, j <= i).
  auto store_pair = [&](bool isq, const float c[4], int i, int j) {  // rows i, i+8; columns j, j+1
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int ii = i + 8 * hh;
      const float c0v = c[2 * hh] * (j <= ii), c1v = c[2 * hh + 1] * (j + 1 <= ii);
      if (isq) {
        *reinterpret_cast<uint32_t*>(aq + ii * AQL + j) = pack_bf16(c0v, c1v);
      } else {
        if (j < ii) L[ii * LS + j] = betas[ii] * c0v;  // only j < i is ever read
        if (j + 1 < ii) L[ii * LS + j + 1] = betas[ii] * c1v;
      }
    }
  };
  if (KDA) {
    // Off-diagonal blocks (bi > bj): reference row r = last row of block bj, so e^(G_i - G_r) and
    // e^(G_r - G_j) are both <= 1.
    bf16 *Ka = X, *Qa = X + 48 * KP, *Kb = X + 96 * KP;  // rows 16.. ; rows 16.. ; block bj
    for (int bj = 0; bj < 3; ++bj) {
      const int r = 16 * bj + 15, r0 = 16 * (bj + 1);
      // X is read by the previous key block's products; for bj = 0 nothing has touched X since the
      // cumsum's barrier, which also completed what the build reads (Kn, Qn, Gc): no barrier there,
      // so the records' q e^G / k e^(G_last - G) and the first build share one phase.
      if (bj > 0) __syncthreads();
      for (int sl = tid; sl < (BT - r0 + 16) * SPR; sl += NTP) {
        const int row = sl / SPR, x0 = 8 * (sl % SPR);
        float gr[8], gi[8], kf[8];
        G8(r, x0, gr);
        if (row < BT - r0) {
          const int i = r0 + row;
          float qf[8];
          G8(i, x0, gi);
          unpack8(*reinterpret_cast<const uint4*>(Kn + i * KP + x0), kf);
          unpack8(*reinterpret_cast<const uint4*>(Qn + i * KP + x0), qf);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float d = ex2(gi[e] - gr[e]);
            kf[e] *= d, qf[e] *= d;
          }
          *reinterpret_cast<uint4*>(Ka + (i - 16) * KP + x0) = pack8(kf);
          *reinterpret_cast<uint4*>(Qa + (i - 16) * KP + x0) = pack8(qf);
        } else {
          const int jr = row - (BT - r0), j = 16 * bj + jr;
          G8(j, x0, gi);
          unpack8(*reinterpret_cast<const uint4*>(Kn + j * KP + x0), kf);
#pragma unroll
          for (int e = 0; e < 8; ++e) kf[e] *= ex2(gr[e] - gi[e]);
          *reinterpret_cast<uint4*>(Kb + jr * KP + x0) = pack8(kf);
        }
      }
      __syncthreads();
      for (int tk = warp; tk < (3 - bj) * 4; tk += NTP / 32) {
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
        store_pair(isq, c, 16 * bi + gq, 16 * bj + 8 * half + 2 * tq);
      }
    }
    // Diagonal blocks, two at a time: factor through the middle row m (exponents within +-span).
    bf16 *Ad = X, *Qd = X + 32 * KP, *Bd = X + 64 * KP;  // [32][KP] each
    for (int hb = 0; hb < 2; ++hb) {
      __syncthreads();
      for (int sl = tid; sl < 32 * SPR; sl += NTP) {
        const int row = sl / SPR, x0 = 8 * (sl % SPR), i = 32 * hb + row, m = (i & ~15) + 7;
        float gm[8], gi[8], kf[8], qf[8], kb[8];
        G8(m, x0, gm);
        G8(i, x0, gi);
        unpack8(*reinterpret_cast<const uint4*>(Kn + i * KP + x0), kf);
        unpack8(*reinterpret_cast<const uint4*>(Qn + i * KP + x0), qf);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = ex2(fminf(gi[e] - gm[e], kSpanMax * kLog2e)),
                      u = ex2(fminf(gm[e] - gi[e], kSpanMax * kLog2e));
          kb[e] = kf[e] * u, kf[e] *= d, qf[e] *= d;
        }
        *reinterpret_cast<uint4*>(Ad + row * KP + x0) = pack8(kf);
        *reinterpret_cast<uint4*>(Qd + row * KP + x0) = pack8(qf);
        *reinterpret_cast<uint4*>(Bd + row * KP + x0) = pack8(kb);
      }
      __syncthreads();
      for (int tk = warp; tk < 8; tk += NTP / 32) {
        const int lbk = tk >> 2, b = 2 * hb + lbk, half = (tk >> 1) & 1;
        const bool isq = tk & 1;
        if (wide[b]) continue;
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        uint32_t a[4], bb[2];
#pragma unroll
        for (int k0 = 0; k0 < K; k0 += 16) {
          frag_a(a, isq ? Qd : Ad, KP, 16 * lbk, k0, lane);
          frag_b(bb, Bd, KP, 16 * lbk + 8 * half, k0, lane);
          mma16816(c, a, bb);
        }
        store_pair(isq, c, 16 * b + gq, 16 * b + 8 * half + 2 * tq);
      }
    }
    if (wide[0] | wide[1] | wide[2] | wide[3]) {  // rare: exact per element for those blocks
      for (int task = tid; task < 4 * 256; task += NTP) {
        const int b = task >> 8, i = 16 * b + ((task >> 4) & 15), j = 16 * b + (task & 15);
        if (!wide[b] || j > i) continue;
        float l = 0.f, aq = 0.f;
        for (int x = 0; x < K; ++x) {
          const float kb = bf(Kn[j * KP + x]) * ex2(G(i, x) - G(j, x));
          l += bf(Kn[i * KP + x]) * kb;
          aq += bf(Qn[i * KP + x]) * kb;
        }
        if (j < i) L[i * LS + j] = betas[i] * l;
        rec[R::Aqk + i * BT + j] = __float2bfloat16(aq);
        if (j < i) rec[R::Aqk + j * BT + i] = __float2bfloat16(0.f);
      }
    }
  } else {
    // Scalar decay: k_i.k_j and q_i.k_j for all lower blocks, then e^(G_i - G_j) (j <= i). A warp
    // takes one block pair (bi, bj), both products and both 8-column halves: one round of 10 warps,
    // the key block's fragments loaded once for both (was 40 warp tasks of one 16 x 8 tile: three
    // rounds of short tasks, overhead-bound). Each tile's products run in the same order as before.
    for (int pr = warp; pr < 10; pr += NTP / 32) {
      int bi = 0;
      while ((bi + 1) * (bi + 2) / 2 <= pr) ++bi;
      const int bj = pr - bi * (bi + 1) / 2;
      float ck[2][4] = {}, cq[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t ak[4], aq[4], b0[2], b1[2];
        frag_a(ak, Kn, KP, 16 * bi, k0, lane);
        frag_a(aq, Qn, KP, 16 * bi, k0, lane);
        frag_b(b0, Kn, KP, 16 * bj, k0, lane);
        frag_b(b1, Kn, KP, 16 * bj + 8, k0, lane);
        mma16816(ck[0], ak, b0);
        mma16816(ck[1], ak, b1);
        mma16816(cq[0], aq, b0);
        mma16816(cq[1], aq, b1);
      }
      const int i = 16 * bi + gq;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 16 * bj + 8 * half + 2 * tq;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ii = i + 8 * (e >> 1), jj = j + (e & 1);
          const float d = jj <= ii ? ex2(Gc[ii] - Gc[jj]) : 0.f;
          ck[half][e] *= d;
          cq[half][e] *= d;
        }
        store_pair(false, ck[half], i, j);
        store_pair(true, cq[half], i, j);
      }
    }
  }
  // Ke goes to Qn's space: GDN's products read Qn (and its staged Aqk is written out below), KDA's
  // read only X, so KDA needs the barrier only when the exact path for wide blocks read Qn.
  if (!KDA || (wide[0] | wide[1] | wide[2] | wide[3])) __syncthreads();
  // k e^G into Qn's space (the B operand of W); then v into Kn's space (of U), in flight during the solve.
  // Lite records need neither: the recurrence forms U' from v and k itself.
  bf16 *Ke = Qn, *Vs = Kn;
  if constexpr (!LITE) {
    for (int sl = tid; sl < SLOTS; sl += NTP) {
      const int i = sl / SPR, x0 = 8 * (sl % SPR);
      float gi[8], kf[8];
      G8(i, x0, gi);
      unpack8(*reinterpret_cast<const uint4*>(Kn + i * KP + x0), kf);
#pragma unroll
      for (int e = 0; e < 8; ++e) kf[e] *= ex2(gi[e]);
      *reinterpret_cast<uint4*>(Ke + i * KP + x0) = pack8(kf);
    }
  }
  // A [BT][BT] bf16 tile from shared memory (row stride ld) to the record at dst, whole 128-byte
  // rows: one 16-byte chunk a thread.
  auto tile_out = [&](bf16* dst, const bf16* src, int ld) {
    static_assert(BT * BT / 8 == NTP, "one 16-byte chunk of a [BT][BT] tile a thread");
    const int r = tid >> 3, ch = tid & 7;
    *reinterpret_cast<uint4*>(dst + r * BT + 8 * ch) = *reinterpret_cast<const uint4*>(src + r * ld + 8 * ch);
  };
  if (!KDA) tile_out(rec + R::Aqk, aq, AQL);  // the staged Aqk
  // Lite records: the solve works in Kn / Qn's space (dead after the pair products), so the staged
  // Aqk in X is read out beside it, with no barrier between.
  if constexpr (!LITE) {
    __syncthreads();
    for (int sl = tid; sl < BT * (V / 8); sl += NTP) {
      const int j = sl / (V / 8), y0 = 8 * (sl % (V / 8));
      if (j < C)
        __pipeline_memcpy_async(Vs + j * KP + y0, p.v + ((bos + c0 + j) * p.HV + h) * V + y0, 16);
      else
        *reinterpret_cast<uint4*>(Vs + j * KP + y0) = make_uint4(0, 0, 0, 0);
    }
  }
  __pipeline_commit();  // (an empty group for lite records)
  // (I + L)^-1 in 16-row blocks (fla's solve_tril shape): the four diagonal blocks' inverses D_b by
  // forward substitution (15 steps, all four at once), then the blocks below them on tensor cores
  // (3xTF32, ~fp32's accuracy): Ai_ij = -D_i X_ij, X_ij = sum_{j<=k<i} L_ik Ai_kj, in dependency
  // order over five barrier-separated phases. Ai's column c is scaled by beta_c as it is stored
  // (W = Ainv diag(beta) K e^G). fp32 blocks that later products read stay in F.
  // (Before: forward substitution over all 63 steps, one scalar L load per FMA, ~250 a thread.)
  bf16* Ai = LITE ? Kn : X;                             // [BT][AP] bf16, the product operand
  float* F = reinterpret_cast<float*>(Ai + BT * AP);    // [BT][FS] fp32 D_b, X_ij scratch, Ai_ij
  static_assert(!LITE || BT * AP * 2 + BT * FS * 4 <= 2 * BT * KP * 2, "lite: the solve fits in Kn / Qn's space");
  auto Lb = [&](int bi, int bk) { return L + 16 * bi * LS + 16 * bk; };
  auto Fb = [&](int bi, int bk) { return F + 16 * bi * FS + 16 * bk; };
  // Ai block (bi, bj) columns 8t + 2tq, +1 from a tile c (16 x 8, mma layout), negated and scaled.
  auto store_ai = [&](const float c[4], int bi, int bj, int t, bool keep_fp32) {
    const int i = 16 * bi + gq, j = 16 * bj + 8 * t + 2 * tq;
    const float b0 = betas[j], b1 = betas[j + 1];
    *reinterpret_cast<uint32_t*>(Ai + i * AP + j) = pack_bf16(-c[0] * b0, -c[1] * b1);
    *reinterpret_cast<uint32_t*>(Ai + (i + 8) * AP + j) = pack_bf16(-c[2] * b0, -c[3] * b1);
    if (keep_fp32) tile_store(Fb(bi, bj) + 8 * t, FS, c, lane, -1.f);
  };
  {
    const int b = tid >> 7, c = (tid >> 3) & 15, r = tid & 7;  // block, column, owner of rows r, r + 8
    const float* Ld = Lb(b, b);
    float x0 = r == c ? 1.f : 0.f, x1 = 8 + r == c ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < 15; ++j) {
      const float xj = __shfl_sync(0xffffffffu, j < 8 ? x0 : x1, (lane & ~7) | (j & 7));
      if (r > j) x0 -= Ld[r * LS + j] * xj;
      if (8 + r > j) x1 -= Ld[(8 + r) * LS + j] * xj;
    }
    const int i = 16 * b + r, j = 16 * b + c;
    F[i * FS + j] = x0;
    F[(i + 8) * FS + j] = x1;
    Ai[i * AP + j] = __float2bfloat16(x0 * betas[j]);
    Ai[(i + 8) * AP + j] = __float2bfloat16(x1 * betas[j]);
    for (int e = tid; e < 6 * 128; e += NTP) {  // the blocks above the diagonal: zeros
      const int pr = e >> 7, bi = pr < 3 ? 0 : (pr < 5 ? 1 : 2), bj = pr < 3 ? pr + 1 : (pr < 5 ? pr - 1 : 3);
      *reinterpret_cast<uint32_t*>(Ai + (16 * bi + ((e >> 3) & 15)) * AP + 16 * bj + 2 * (e & 7)) = 0u;
    }
  }
  __syncthreads();
  {
    // warps 0-5: (b + 1, b) for b = w / 2; 6-7: (2, 0); 8-9: (3, 1); 10-11: (3, 0); t = w % 2 the
    // 8-column tile of the 16-column block
    // Each phase reads the fp32 blocks of the warps before it, so they meet by named barriers among
    // only those warps (1: warps 0-3 -> 6-11, 2: warps 6-7 -> 10-11) or, where a warp reads only its
    // own 8 columns, __syncwarp; warps 12-15 go straight to the barrier after the solve.
    const int t = warp & 1, b = warp >> 1;
    float P[4] = {0.f, 0.f, 0.f, 0.f};
    if (warp < 6) {  // X_{b+1,b} = L_{b+1,b} D_b into F as scratch, then Ai_{b+1,b} = -D_{b+1} X
      mma_16x8x16_3xtf32(P, Lb(b + 1, b), LS, Fb(b, b) + 8 * t, FS, lane);
      tile_store(Fb(b + 1, b) + 8 * t, FS, P, lane, 1.f);
      __syncwarp();  // in place: this warp alone reads and writes these 8 columns
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      mma_16x8x16_3xtf32(c, Fb(b + 1, b + 1), FS, Fb(b + 1, b) + 8 * t, FS, lane);
      store_ai(c, b + 1, b, t, b < 2);  // Ai_10, Ai_21 are read by warps 6-11
      if (warp < 4) bar_arrive(1, 320);
    } else if (warp < 12) {
      const int bi = warp < 10 ? b - 1 : 3, bk = warp < 8 ? 0 : (warp < 10 ? 1 : 0);  // L_20 D_0, L_31 D_1, L_30 D_0
      mma_16x8x16_3xtf32(P, Lb(bi, bk), LS, Fb(bk, bk) + 8 * t, FS, lane);
      bar_sync(1, 320);  // Ai_10, Ai_21 (warps 0-3)
      {  // + L_21 Ai_10 = X_20; + L_32 Ai_21 = X_31; + L_31 Ai_10 (of X_30)
        const int bi = warp < 8 ? 2 : 3, bk = warp < 8 ? 1 : (warp < 10 ? 2 : 1), bj = bk - 1;
        mma_16x8x16_3xtf32(P, Lb(bi, bk), LS, Fb(bk, bj) + 8 * t, FS, lane);
        if (warp < 10) tile_store(Fb(bi, bj) + 8 * t, FS, P, lane, 1.f);
      }
      if (warp < 10) {  // Ai_20 = -D_2 X_20 (read by warps 10-11), Ai_31 = -D_3 X_31: own columns
        __syncwarp();
        const int bi = warp < 8 ? 2 : 3, bj = bi - 2;
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        mma_16x8x16_3xtf32(c, Fb(bi, bi), FS, Fb(bi, bj) + 8 * t, FS, lane);
        store_ai(c, bi, bj, t, bi == 2);
        if (warp < 8) bar_arrive(2, 128);
      } else {  // X_30 = ... + L_32 Ai_20; Ai_30 = -D_3 X_30
        bar_sync(2, 128);  // Ai_20 (warps 6-7)
        mma_16x8x16_3xtf32(P, Lb(3, 2), LS, Fb(2, 0) + 8 * t, FS, lane);
        tile_store(Fb(3, 0) + 8 * t, FS, P, lane, 1.f);
        __syncwarp();
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        mma_16x8x16_3xtf32(c, Fb(3, 3), FS, Fb(3, 0) + 8 * t, FS, lane);
        store_ai(c, 3, 0, t, false);
      }
    }
  }
  __syncthreads();
  if (LITE) {  // Ai diag(beta) to the record in W's place
    tile_out(rec + R::W, Ai, AP);
    return;
  }
  // W = Ai (k e^G), U = Ai v: [BT][K] each; warp: row tile mt, K/32 column tiles from nt0.
  constexpr int TW = K / 32;
  static_assert(16 * (NTP / 32) * TW * 16 <= BT * (BT + 1) * 4, "the W / U staging tiles fit in L's space");
  const int mt = warp & 3, nt0 = (warp >> 2) * TW;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      __pipeline_wait_prior(0);
      __syncthreads();
    }
    const bf16* B = pass == 0 ? Ke : Vs;
    float c[TW][4];
#pragma unroll
    for (int t = 0; t < TW; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < BT; k0 += 16) {
      uint32_t a[4], b0[2], b1[2];
      frag_a(a, Ai, AP, 16 * mt, k0, lane);
#pragma unroll
      for (int t = 0; t < TW; t += 2) {
        frag_b2_rowmajor(b0, b1, B, KP, k0, 8 * (nt0 + t), lane);
        mma16816(c[t], a, b0);
        mma16816(c[t + 1], a, b1);
      }
    }
    // To the record through the warp's staging tile [16 rows][TW 16-byte chunks] in L's space (free
    // after the solve): whole 16-byte row segments, so each row's 16 TW bytes go out as whole
    // sectors, not as 4-byte fragments. Chunk c of row r sits at c ^ ((r >> SW) & (TW - 1)): the
    // fragment writes (8 rows, one chunk) and the 16-byte reads (128 contiguous bytes a quarter
    // warp) are free of bank conflicts.
    constexpr int SW = TW == 4 ? 1 : 2;
    auto chunk_at = [](int r, int ch) { return r * TW + (ch ^ ((r >> SW) & (TW - 1))); };
    bf16* stg = reinterpret_cast<bf16*>(L) + warp * 16 * TW * 8;
#pragma unroll
    for (int t = 0; t < TW; ++t) {
      *reinterpret_cast<uint32_t*>(stg + chunk_at(gq, t) * 8 + 2 * tq) = pack_bf16(c[t][0], c[t][1]);
      *reinterpret_cast<uint32_t*>(stg + chunk_at(gq + 8, t) * 8 + 2 * tq) = pack_bf16(c[t][2], c[t][3]);
    }
    __syncwarp();
    bf16* out = rec + (pass == 0 ? R::W : R::U);
#pragma unroll
    for (int e = lane; e < 16 * TW; e += 32) {
      const int r = e / TW, ch = e % TW;
      *reinterpret_cast<uint4*>(out + (16 * mt + r) * K + 8 * (nt0 + ch)) =
          *reinterpret_cast<const uint4*>(stg + chunk_at(r, ch) * 8);
    }
    __syncwarp();  // the next pass rewrites the tile
  }
}

// Bytes of one record buffer of the recurrence; FUSE adds q e^G and Aqk (outputs in the loop).
template <int K, int BV, bool FUSE>
__host__ __device__ constexpr int rec_buf_bytes() {
  return (2 * BT * (K + 8) + BT * (BV + 8)) * 2 + K * 4 + (FUSE ? (BT * (K + 8) + BT * AP) * 2 : 0);
}
template <int K, int BV, bool FUSE>
__host__ __device__ constexpr int rec_stages() {  // three buffers where they fit in 227 KB, else two
  return (BV * (K + 8) + BV * AP) * 2 + 3 * rec_buf_bytes<K, BV, FUSE>() <= 227 * 1024 ? 3 : 2;
}
template <int K, int BV, bool FUSE>
constexpr size_t rec_smem_bytes() {
  return size_t(BV * (K + 8) + BV * AP) * 2 + size_t(rec_stages<K, BV, FUSE>()) * rec_buf_bytes<K, BV, FUSE>();
}

// One CTA per (value head, block of BV state columns, sequence): the state recurrence.
// trans_A: the transition pass of the parallel scan (S0 = I, v = 0, so S_end = A; needs V == K);
// store: write the per-chunk states and U' for the output kernel (false: final states only);
// FUSE: compute the outputs in the loop instead (o = q e^G S + Aqk U'; no output kernel).
template <int K, int BV, bool FUSE>
__global__ void __launch_bounds__(NT, 1) mma_rec_kernel(const LaPrefill p, const int32_t* __restrict__ base,
                                                        const bf16* __restrict__ records, const float* __restrict__ gls,
                                                        bf16* __restrict__ Sg, bf16* __restrict__ Ug, bool trans_A,
                                                        bool store) {
  constexpr int V = K, KP = K + 8, BVP = BV + 8, kStages = rec_stages<K, BV, FUSE>();
  constexpr int BUF = rec_buf_bytes<K, BV, FUSE>();
  using R = R4<K, V>;
  const int h = blockIdx.x / (V / BV), y0 = (blockIdx.x % (V / BV)) * BV, n = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int g0 = base[n], nch = base[n + 1] - g0;
  extern __shared__ __align__(16) unsigned char sm4[];
  bf16* St = reinterpret_cast<bf16*>(sm4);  // [BV][KP] bf16 S^T (the product operand)
  bf16* Ut = St + BV * KP;                  // [BV][AP] bf16 U'^T
  unsigned char* bufs = reinterpret_cast<unsigned char*>(Ut + BV * AP);
  auto Wb = [&](int c) { return reinterpret_cast<bf16*>(bufs + (c % kStages) * BUF); };  // [BT][KP]
  auto Kb = [&](int c) { return Wb(c) + BT * KP; };                                  // [BT][KP] Kd
  auto Ub = [&](int c) { return Kb(c) + BT * KP; };                                  // [BT][BVP]
  auto Gb = [&](int c) { return reinterpret_cast<float*>(Ub(c) + BT * BVP); };       // [K] e^G_last
  auto Qb = [&](int c) { return reinterpret_cast<bf16*>(Gb(c) + K); };               // [BT][KP] q e^G (FUSE)
  auto Ab = [&](int c) { return Qb(c) + BT * KP; };                                  // [BT][AP] Aqk (FUSE)
  const int64_t bos = p.cu_seqlens[n];
  const int T = int(p.cu_seqlens[n + 1] - bos);
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
      S[t][e] = trans_A ? (x == y ? 1.f : 0.f) : (p.h0 ? p.h0[soff + size_t(x) * V + y] : 0.f);
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
    for (int e = tid; e < BT * K / 8; e += NT) {
      const int j = e / (K / 8), q = e % (K / 8);
      __pipeline_memcpy_async(Kd + j * KP + 8 * q, r + R::Kd + j * K + 8 * q, 16);
    }
    for (int e = tid; e < BT * BV / 8 && !trans_A; e += NT) {
      const int i = e / (BV / 8), q = e % (BV / 8);
      __pipeline_memcpy_async(U + i * BVP + 8 * q, r + R::U + i * V + y0 + 8 * q, 16);
    }
    for (int e = tid; e < K / 4; e += NT) __pipeline_memcpy_async(Gb(c) + 4 * e, gls + gh * K + 4 * e, 16);
    if (FUSE) {
      for (int e = tid; e < BT * K / 8; e += NT) {
        const int i = e / (K / 8), q = e % (K / 8);
        __pipeline_memcpy_async(Qb(c) + i * KP + 8 * q, r + R::Qg + i * K + 8 * q, 16);
      }
      for (int e = tid; e < BT * BT / 8; e += NT) {
        const int i = e / (BT / 8), q = e % (BT / 8);
        __pipeline_memcpy_async(Ab(c) + i * AP + 8 * q, r + R::Aqk + i * BT + 8 * q, 16);
      }
    }
  };
  for (int c = 0; c < kStages - 1; ++c) {  // records stream kStages - 1 chunks ahead
    if (c < nch) issue(c);
    __pipeline_commit();
  }
  for (int c = 0; c < nch; ++c) {
    if (c + kStages - 1 < nch) issue(c + kStages - 1);
    __pipeline_commit();
    __pipeline_wait_prior(kStages - 1);
    __syncthreads();
    const size_t gh = size_t(g0 + c) * p.HV + h;
    if (store) {  // the state entering chunk c, for the output kernel: Sg [.., V][K]
      bf16* dst = Sg + gh * V * K + size_t(y0) * K;
      for (int e = tid; e < BV * K / 8; e += NT) {
        const int y = e / (K / 8), q = e % (K / 8);
        *reinterpret_cast<uint4*>(dst + y * K + 8 * q) = *reinterpret_cast<const uint4*>(St + y * KP + 8 * q);
      }
    }
    float o[UN][4];  // FUSE: this warp's output tiles, (q e^G) S here, + Aqk U' after the barrier
    {  // U' = U - W S
      const bf16 *W = Wb(c), *U = Ub(c);
      float u[UN][4];
#pragma unroll
      for (int t = 0; t < UN; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
#pragma unroll
      for (int t = 0; t < UN; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          u[t][e] = trans_A ? 0.f : bf(U[(16 * um + gq + 8 * (e >> 1)) * BVP + 8 * (un0 + t) + 2 * tq + (e & 1)]);
#pragma unroll
      for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[4], aq[4], b[2];
        frag_a(a, W, KP, 16 * um, k0, lane);
        if (FUSE) frag_a(aq, Qb(c), KP, 16 * um, k0, lane);
#pragma unroll
        for (int m = 0; m < 4; ++m) a[m] ^= 0x80008000u;  // -W
#pragma unroll
        for (int t = 0; t < UN; ++t) {
          frag_b(b, St, KP, 8 * (un0 + t), k0, lane);
          mma16816(u[t], a, b);
          if (FUSE) mma16816(o[t], aq, b);
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
    if (store) {  // U' for the output kernel: Ug [.., V][BT]
      bf16* dst = Ug + gh * V * BT + size_t(y0) * BT;
      for (int e = tid; e < BV * BT / 8; e += NT) {
        const int y = e / (BT / 8), q = e % (BT / 8);
        *reinterpret_cast<uint4*>(dst + y * BT + 8 * q) = *reinterpret_cast<const uint4*>(Ut + y * AP + 8 * q);
      }
    }
    if (FUSE) {  // o += Aqk U', rows of the chunk that exist
      mma_rows<UN>(o, Ab(c), AP, 16 * um, Ut, AP, 8 * un0, BT, lane);
      const int C = min(BT, T - c * BT);
#pragma unroll
      for (int t = 0; t < UN; ++t)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = 16 * um + gq + 8 * hh, y = y0 + 8 * (un0 + t) + 2 * tq;
          if (i < C)
            *reinterpret_cast<uint32_t*>(p.o + ((bos + c * BT + i) * p.HV + h) * V + y) =
                pack_bf16(o[t][2 * hh], o[t][2 * hh + 1]);
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
        frag_a_trans(a, Kd, KP, 16 * sm, k0, lane);
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


// ---- The recurrence on wgmma (K = V = 128) ----
// One warpgroup per (value head, 64 state columns, sequence) keeps the state transposed,
// S^T [64 y][128 x] fp32, in its accumulators for the whole sequence; a producer warp streams the
// records into 128-byte-swizzled tiles by TMA. Per chunk, with A operands taken from registers:
//   -U'^T = S^T W^T - U^T            wgmma_rs<64>,       B = W [j][x] (K-major)
//   o^T   = S^T Qg^T + U'^T Aqk^T    wgmma_rs<64> x 2,   B = Qg [i][x], Aqk [i][j] (FUSE)
//   S^T   = S^T e^G_last + U'^T Kd   wgmma_rs_tb<128>,   B = Kd [j][x] (N-major)
// STORE (outputs in the later pass): the bf16 state entering each chunk and U', as the mma.sync
// kernel stores them for mma_out_kernel.
// LITE (GDN's lite records): Kd and Qg are the raw k and q, loaded by TMA from the inputs, and the
// rows' factors are applied to the other operand: the state update takes U'^T diag(fk) as its A
// operand, and the outputs' first product is scaled by fq per column before Aqk U' is added. U'
// comes from v (TMA from the inputs) and Ai diag(beta) instead of U and W:
//   -U'^T = -v^T Ai^T                  wgmma_ss_mn_neg<64>, A = v [j][y] (M-major), B = Ai [i][j]
//           + (S^T k^T diag(fe)) Ai^T  wgmma_rs<64> x 2,    B = k [j][x], then Ai [i][j]
// (Ai with diag(beta) folded in; fe: k e^G = diag(fe) k): one more dependent product (4 k16 steps)
// in the step; the prep writes 23.75 KB less a chunk and head and reads no v, and this CTA reads
// 8 KB less a chunk (Ai and v's columns for W and U's).
// No shared-memory round trip of S or U' and no block barrier in the step: the mma.sync kernel's
// step is issue-latency bound (ncu 2026-12-06: 8 warps an SM, 0.45 eligible a scheduler). Same
// roundings as that kernel (S and U' to bf16 as operands, fp32 accumulation).
namespace rw {
constexpr int kThreads = 160, kStages = 3, kRows = 288;  // warpgroup + producer warp; 128-wide rows a record
constexpr uint32_t W = 0, KD = 16384, U = 32768, QG = 40960, AQK = 57344, GL = 65536, STAGE = 66560;
constexpr uint32_t OST = 48;  // bytes a row of a warp's output staging tile [64 i][16 y] (16 + padding)
constexpr size_t kSmem = 1024 + size_t(kStages) * STAGE + 4 * 64 * OST + 64;
struct Maps {
  CUtensorMap rows, aqk;  // records as [rows of 256 bytes][2 halves][64]: boxes 64 x 1 x 64 / 64 x 2 x 32
  CUtensorMap k, q;       // LITE: the inputs as [T][HK][2 halves][64]: box 64 x 1 x 1 x 64 (64 tokens)
  CUtensorMap v;          // LITE: v as [T][HV][2 halves][64], the same boxes (not for the transition pass)
};
}  // namespace rw

template <bool FUSE, bool STORE, bool LITE>
__global__ void __launch_bounds__(rw::kThreads, 1) rec_wgmma_kernel(const __grid_constant__ rw::Maps maps,
                                                                     const LaPrefill p, const int32_t* __restrict__ base,
                                                                     const bf16* __restrict__ records,
                                                                     const float* __restrict__ gls, bf16* __restrict__ Sg,
                                                                     bf16* __restrict__ Ug, bool trans_A) {
  constexpr int K = 128, V = 128;
  const int h = blockIdx.x >> 1, y0 = (blockIdx.x & 1) * 64, n = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g0 = base[n], nch = base[n + 1] - g0;
  extern __shared__ uint8_t rw_smem[];
  const uint32_t sb = smem_u32(rw_smem), s0 = sb + ((1024u - (sb & 1023u)) & 1023u);
  const uint32_t ostage = s0 + rw::kStages * rw::STAGE;  // 4 warps' output staging tiles
  const uint32_t bars = ostage + 4 * 64 * rw::OST;       // full[3], empty[3]
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (rw::kStages + s); };
  auto stage = [&](int s) { return s0 + s * rw::STAGE; };
  if (tid == 0) {
    for (int s = 0; s < rw::kStages; ++s) mbar_init(full(s), 1), mbar_init(empty(s), 4);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == 4) {  // producer
    if (lane == 0) {
      // W and Kd, e^G_last, U's 64 columns (not for the transition pass), q e^G and Aqk (FUSE);
      // LITE: Ai diag(beta) and the rows' factors (fk, fq, fe) in W's space, the raw k and q instead of
      // Kd and q e^G, v's 64 columns instead of U's
      const uint32_t bytes =
          (LITE ? 16384u + 8192u + 768u : 32768u) + 512u + (trans_A ? 0u : 8192u) + (FUSE ? 16384u + 8192u : 0u);
      const int hk = h / (p.HV / p.HK), tok0 = int(p.cu_seqlens[n]);
      for (int c = 0; c < nch; ++c) {
        const int s = c % rw::kStages;
        if (c >= rw::kStages) mbar_wait(empty(s), ((c / rw::kStages) - 1) & 1);
        mbar_expect_tx(full(s), bytes);
        const size_t gh = size_t(g0 + c) * p.HV + h;
        const int r0 = int(gh * rw::kRows);
        const uint32_t st = stage(s);
        for (int hf = 0; hf < 2; ++hf) {
          if (!LITE) tma_load_3d(st + rw::W + 8192 * hf, &maps.rows, 0, hf, r0, full(s));
          if (LITE) {
            tma_load_4d(st + rw::KD + 8192 * hf, &maps.k, 0, hf, hk, tok0 + 64 * c, full(s));
            if (FUSE) tma_load_4d(st + rw::QG + 8192 * hf, &maps.q, 0, hf, hk, tok0 + 64 * c, full(s));
          } else {
            tma_load_3d(st + rw::KD + 8192 * hf, &maps.rows, 0, hf, r0 + 64, full(s));
            if (FUSE) tma_load_3d(st + rw::QG + 8192 * hf, &maps.rows, 0, hf, r0 + 192, full(s));
          }
        }
        if (LITE) {
          tma_load_3d(st + rw::W, &maps.aqk, 0, 0, r0, full(s));  // Ai [64][64]: W's first 32 rows
          bulk_g2s(st + rw::W + 8192, records + gh * R4<K, V>::size + R4<K, V>::Qg, 768, full(s));
          if (!trans_A) tma_load_4d(st + rw::U, &maps.v, 0, y0 >> 6, h, tok0 + 64 * c, full(s));
        } else if (!trans_A) {
          tma_load_3d(st + rw::U, &maps.rows, 0, y0 >> 6, r0 + 128, full(s));
        }
        if (FUSE) tma_load_3d(st + rw::AQK, &maps.aqk, 0, 0, r0 + 256, full(s));
        bulk_g2s(st + rw::GL, gls + gh * K, 512, full(s));
      }
    }
    return;
  }

  const int w = warp, gq = lane >> 2, tq = lane & 3;
  const int64_t bos = p.cu_seqlens[n];
  const int T = int(p.cu_seqlens[n + 1] - bos);
  const size_t soff = (size_t(n) * p.HV + h) * K * V;
  // S^T: accS[4 j + q] = S[x][y0 + y], y = 16 w + gq + 8 (q >> 1), x = 8 j + 2 tq + (q & 1)
  float accS[64];
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int y = 16 * w + gq + 8 * (q >> 1), x = 8 * j + 2 * tq + (q & 1);
      accS[4 * j + q] = trans_A ? (x == y0 + y ? 1.f : 0.f) : (p.h0 ? p.h0[soff + size_t(x) * V + y0 + y] : 0.f);
    }
  // Per-thread offsets the loop reuses (no address arithmetic in the step): U^T element (y, j) of the
  // swizzled U tile, j = 8 jj + jq, jq = 2 tq + (q & 1), y = 16 w + gq + 8 (q >> 1), is at
  // 1024 jj + uoff[q]; the row j & 7 = jq of the XOR is the same for every jj.
  uint32_t uoff[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int jq = 2 * tq + (q & 1), y = 16 * w + gq + 8 * (q >> 1);
    uoff[q] = uint32_t(jq * 128 + (((y >> 3) ^ jq) << 4) + (y & 7) * 2);
  }
  // The warp's outputs o[i][y0 + 16 w + yl] go through its staging tile [64 i][16 yl] (rows OST bytes):
  // written by stmatrix (transposed), read back as 16-byte halves of the 32-byte row segments,
  // lane -> rows (lane >> 1) + 16 k, half lane & 1: whole sectors to global memory.
  uint8_t* ost = rw_smem + (ostage - sb) + w * 64 * rw::OST;
  // this lane's stmatrix row: row lane & 7 of block lane >> 3 = (jj + (lane >> 4), y half (lane >> 3) & 1)
  const uint32_t ost_lane =
      smem_u32(ost) + uint32_t((8 * (lane >> 4) + (lane & 7)) * rw::OST + 16 * ((lane >> 3) & 1));
  const int64_t orow = int64_t(p.HV) * V, o16 = 16 * orow;  // elements between token rows of o; 16 rows
  // this lane's output row of the chunk's first 16 (+ 16 k for the others), advanced a chunk a step
  bf16* o_chunk = FUSE ? p.o + (bos + (lane >> 1)) * orow + int64_t(h) * V + y0 + 16 * w + 8 * (lane & 1) : nullptr;
  for (int c = 0; c < nch; ++c) {
    const int s = c % rw::kStages;
    const uint32_t st = stage(s);
    // the stage's operand descriptors: K-major (W, Kd, Qg, Aqk; LITE: Ai, k, q) and N-major (U / v, Kd)
    const WgmmaDesc dk = wgmma_base_sw128(st), dn = wgmma_base_nmajor_sw128(st, 8192);
    mbar_wait(full(s), (c / rw::kStages) & 1);
    uint32_t aS[8][4];  // bf16 S^T as the A operand, k slices of 16 x
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int m = 0; m < 4; ++m) aS[kk][m] = pack_bf16(accS[8 * kk + 2 * m], accS[8 * kk + 2 * m + 1]);
    const size_t gh = size_t(g0 + c) * p.HV + h;
    if constexpr (STORE) {  // Sg [.., V][K]: row y0 + y holds S[.][y0 + y]; pairs of x are adjacent
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int y = 16 * w + gq + 8 * hf, x = 8 * j + 2 * tq;
          *reinterpret_cast<uint32_t*>(Sg + (gh * V + y0 + y) * K + x) = aS[j >> 1][2 * (j & 1) + hf];
        }
    }
    float accU[32], accO[32];  // [64 y][64 j] / [64 y][64 i]: d[4 jj + q], col 8 jj + 2 tq + (q & 1)
    const uint8_t* Us = rw_smem + (st - sb + rw::U);  // U's 64 columns; LITE: v's
    // LITE's factors fk | fq | fe [64] each, after Ai in W's space
    const float* fac = reinterpret_cast<const float*>(rw_smem + (st - sb + rw::W + 8192));
    if constexpr (LITE) {
      // -U'^T = -v^T (Ai diag(beta))^T + ((S^T k^T) diag(fe)) (Ai diag(beta))^T. Issue order (the
      // tensor pipe runs the groups in order): S^T k^T first; the S-free v^T product in flight while
      // its operand is formed; then the second product, and only after it the outputs' S^T q^T,
      // which runs while U'^T's operands are packed (the state update waits on U', not on o).
      float accD[32];  // S^T k^T [64 y][64 j]
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        wgmma_rs<64>(accD, aS[kk], dk.at(rw::KD + (kk >> 2) * 8192 + (kk & 3) * 32), kk > 0);
      wgmma_commit();
      if (!trans_A) {
        wgmma_fence();  // a branch of its own: ptxas would insert this fence itself
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // A = v^T from v's [j][y] tile (M-major), negated
          wgmma_ss_mn_neg<64>(accU, dn.at(rw::U + kk * 16 * 128),
                              dk.at(rw::W + kk * 32), kk > 0);
      }
      wgmma_commit();  // (empty for the transition pass)
      wgmma_wait<1>();
      wgmma_fence_regs(accD);
      uint32_t aD[4][4];  // bf16 (k e^G S)^T, k slices of 16 j: accD[8 kk + 2 m + e] is column 8 (2 kk + (m >> 1)) + 2 tq + e
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float2 f = *reinterpret_cast<const float2*>(fac + 128 + 8 * (2 * kk + (m >> 1)) + 2 * tq);
          aD[kk][m] = pack_bf16(accD[8 * kk + 2 * m] * f.x, accD[8 * kk + 2 * m + 1] * f.y);
        }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs<64>(accU, aD[kk], dk.at(rw::W + kk * 32), !trans_A || kk > 0);
      wgmma_commit();
      if constexpr (FUSE) {  // waited for before fq scales it, below
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          wgmma_rs<64>(accO, aS[kk], dk.at(rw::QG + (kk >> 2) * 8192 + (kk & 3) * 32), kk > 0);
        wgmma_commit();
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      wgmma_fence_regs(accU);
    } else {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          accU[4 * jj + q] = trans_A ? 0.f : -bf(*reinterpret_cast<const bf16*>(Us + 1024 * jj + uoff[q]));
      wgmma_fence_regs(accU);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        wgmma_rs<64>(accU, aS[kk], dk.at(rw::W + (kk >> 2) * 8192 + (kk & 3) * 32), 1);
      if constexpr (FUSE) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          wgmma_rs<64>(accO, aS[kk], dk.at(rw::QG + (kk >> 2) * 8192 + (kk & 3) * 32), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(accU);
      if constexpr (FUSE) wgmma_fence_regs(accO);
    }
    uint32_t aU[4][4];  // bf16 U'^T = -accU as the A operand, k slices of 16 j
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int m = 0; m < 4; ++m) aU[kk][m] = pack_bf16(accU[8 * kk + 2 * m], accU[8 * kk + 2 * m + 1]) ^ 0x80008000u;
    const float* gl = reinterpret_cast<const float*>(rw_smem + (st - sb + rw::GL));
    uint32_t aK[4][4];  // LITE: U'^T diag(fk), the state update's A operand
    if constexpr (LITE) {
      const float *fk = fac, *fq = fac + 64;  // column j of U'^T is 8 jj + 2 tq + (q & 1)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float2 f = *reinterpret_cast<const float2*>(fk + 8 * (2 * kk + (m >> 1)) + 2 * tq);
          aK[kk][m] = pack_bf16(accU[8 * kk + 2 * m] * f.x, accU[8 * kk + 2 * m + 1] * f.y) ^ 0x80008000u;
        }
      if constexpr (FUSE) {  // (q S)^T's column i times fq_i: (q e^G S)^T
        wgmma_wait<0>();
        wgmma_fence_regs(accO);
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const float2 f = *reinterpret_cast<const float2*>(fq + 8 * jj + 2 * tq);
          accO[4 * jj] *= f.x, accO[4 * jj + 1] *= f.y, accO[4 * jj + 2] *= f.x, accO[4 * jj + 3] *= f.y;
        }
        wgmma_fence_regs(accO);
      }
    }
    if constexpr (STORE) {  // Ug [.., V][BT]: row y0 + y holds U'[.][y0 + y]
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int y = 16 * w + gq + 8 * hf, j = 8 * jj + 2 * tq;
          *reinterpret_cast<uint32_t*>(Ug + (gh * V + y0 + y) * BT + j) = aU[jj >> 1][2 * (jj & 1) + hf];
        }
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float2 d = *reinterpret_cast<const float2*>(gl + 8 * j + 2 * tq);
      accS[4 * j] *= d.x, accS[4 * j + 1] *= d.y, accS[4 * j + 2] *= d.x, accS[4 * j + 3] *= d.y;
    }
    wgmma_fence_regs(accS);
    wgmma_fence();
    if constexpr (FUSE) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_rs<64>(accO, aU[kk], dk.at(rw::AQK + kk * 32), 1);
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_rs_tb<128>(accS, LITE ? aK[kk] : aU[kk], dn.at(rw::KD + kk * 16 * 128), 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(accS);
    if constexpr (FUSE) wgmma_fence_regs(accO);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty(s));  // this warp is done with the stage
    if constexpr (FUSE) {
      // o^T's 8 x 8 blocks (y rows, i columns in the accumulators) stored transposed, 4 a stmatrix:
      // blocks (jj, y 0-7), (jj, y 8-15), (jj + 1, ..); lane l gives row l & 7 of block l >> 3
#pragma unroll
      for (int jj = 0; jj < 8; jj += 2)
        stmatrix_x4_trans(ost_lane + jj * 8 * rw::OST,
                          pack_bf16(accO[4 * jj], accO[4 * jj + 1]), pack_bf16(accO[4 * jj + 2], accO[4 * jj + 3]),
                          pack_bf16(accO[4 * jj + 4], accO[4 * jj + 5]), pack_bf16(accO[4 * jj + 6], accO[4 * jj + 7]));
      __syncwarp();
      const int C = min(64, T - c * 64);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = (lane >> 1) + 16 * k;
        const uint4 v = *reinterpret_cast<const uint4*>(ost + i * rw::OST + 16 * (lane & 1));
        if (i < C) *reinterpret_cast<uint4*>(o_chunk + k * o16) = v;
      }
      o_chunk += 4 * o16;
      __syncwarp();  // the tile is rewritten next chunk
    }
  }
  if (p.ht)
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int y = 16 * w + gq + 8 * (q >> 1), x = 8 * j + 2 * tq + (q & 1);
        p.ht[soff + size_t(x) * V + y0 + y] = accS[4 * j + q];
      }
}

template <int K>
constexpr size_t out_smem_bytes() {
  return (size_t(BT) * (K + 8) + size_t(K) * (K + 8) + size_t(BT) * AP + size_t(K) * AP) * 2;
}

// One CTA per (chunk, value head): o = (q e^G) S + Aqk U'. lite (GDN's lite records): q S from the
// raw q, its rows times fq, then + Aqk U'.
template <int K>
__global__ void __launch_bounds__(NT, 2) mma_out_kernel(const LaPrefill p, const int32_t* __restrict__ base,
                                                        const bf16* __restrict__ records, const bf16* __restrict__ Sg,
                                                        const bf16* __restrict__ Ug, bool lite) {
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
  if (lite) {  // the raw q rows of the chunk, zeros past its end
    const int hk = h / (p.HV / p.HK);
    for (int e = tid; e < BT * K / 8; e += NT) {
      const int i = e / (K / 8), q = e % (K / 8);
      if (i < C)
        __pipeline_memcpy_async(Qs + i * KP + 8 * q, p.q + ((bos + c0 + i) * p.HK + hk) * K + 8 * q, 16);
      else
        *reinterpret_cast<uint4*>(Qs + i * KP + 8 * q) = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int e = tid; e < BT * K / 8; e += NT) {
      const int i = e / (K / 8), q = e % (K / 8);
      __pipeline_memcpy_async(Qs + i * KP + 8 * q, r + R::Qg + i * K + 8 * q, 16);
    }
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
  mma_rows<TN>(c, Qs, KP, 16 * mt, Ss, KP, 8 * nt0, K, lane);
  if (lite) {  // rows i = 16 mt + gq (+ 8) times fq_i
    const float* fq = reinterpret_cast<const float*>(r + R::Qg) + BT;
    const float f0 = fq[16 * mt + gq], f1 = fq[16 * mt + gq + 8];
#pragma unroll
    for (int t = 0; t < TN; ++t) c[t][0] *= f0, c[t][1] *= f0, c[t][2] *= f1, c[t][3] *= f1;
  }
  mma_rows<TN>(c, As, AP, 16 * mt, Us, AP, 8 * nt0, BT, lane);
#pragma unroll
  for (int t = 0; t < TN; ++t)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = 16 * mt + gq + 8 * hh, y = 8 * (nt0 + t) + 2 * tq;
      if (i < C)
        *reinterpret_cast<uint32_t*>(p.o + ((bos + c0 + i) * p.HV + h) * V + y) =
            pack_bf16(c[t][2 * hh], c[t][2 * hh + 1]);
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
  CUDA_CHECK(cudaFuncSetAttribute(mma_prep_kernel<K, KDA>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  mma_prep_kernel<K, KDA><<<dim3(unsigned(G), unsigned(p.HV)), NTP, smem, stream>>>(p, w.base, w.records, w.gls);
  CUDA_CHECK_LAUNCH();
}

template <int K, int BV>
void launch_rec(const LaPrefill& p, const Ws4& w, bool trans_A, bool out, bool fuse, cudaStream_t stream) {
  const dim3 grid(unsigned(p.HV * (K / BV)), unsigned(p.N));
  if (out && fuse) {
    constexpr size_t smem = rec_smem_bytes<K, BV, true>();
    CUDA_CHECK(cudaFuncSetAttribute(mma_rec_kernel<K, BV, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    mma_rec_kernel<K, BV, true><<<grid, NT, smem, stream>>>(p, w.base, w.records, w.gls, w.Sg, w.Ug, trans_A, false);
  } else {
    constexpr size_t smem = rec_smem_bytes<K, BV, false>();
    CUDA_CHECK(cudaFuncSetAttribute(mma_rec_kernel<K, BV, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    mma_rec_kernel<K, BV, false><<<grid, NT, smem, stream>>>(p, w.base, w.records, w.gls, w.Sg, w.Ug, trans_A, out);
  }
  CUDA_CHECK_LAUNCH();
}


// fuse_out: outputs in the loop; store: the per-chunk states and U' for mma_out_kernel instead.
// The recurrence's instance: outputs fused (FUSE), the states stored for a later output pass
// (STORE), or neither.
template <bool LITE>
auto rec_wgmma_variant(bool fuse_out, bool store) {
  return fuse_out ? rec_wgmma_kernel<true, false, LITE>
                  : (store ? rec_wgmma_kernel<false, true, LITE> : rec_wgmma_kernel<false, false, LITE>);
}

// rows_qk: the token rows of p.q / p.k (the lite records' tensor maps span them).
void launch_rec_wgmma(const LaPrefill& p, int64_t rows_qk, const Ws4& w, bool trans_A, bool fuse_out, bool store,
                      cudaStream_t stream) {
  const PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  DZ_CHECK(enc, "linear attention (wgmma recurrence): the driver has no cuTensorMapEncodeTiled");
  const size_t G = size_t((p.T_total + BT - 1) / BT + p.N);
  const size_t rows = G * size_t(p.HV) * rw::kRows;
  DZ_CHECK(rows < (size_t(1) << 31), "linear attention (wgmma recurrence): ", rows, " record rows");
  rw::Maps maps{};
  const cuuint64_t dims[3] = {64, 2, cuuint64_t(rows)};
  const cuuint64_t strides[2] = {128, 256};
  const cuuint32_t estr[3] = {1, 1, 1};
  const cuuint32_t box_rows[3] = {64, 1, 64}, box_aqk[3] = {64, 2, 32};
  for (int m = 0; m < 2; ++m)
    DZ_CHECK(enc(m ? &maps.aqk : &maps.rows, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, w.records, dims, strides,
                 m ? box_aqk : box_rows, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS,
             "linear attention (wgmma recurrence): tensor map of the records");
  const bool lite = lite_records(p.K, p.kda);
  if (lite) {  // the raw k and q as [rows][HK][2][64]: 64 tokens of one head a box
    DZ_CHECK(rows_qk > 0 && rows_qk < (int64_t(1) << 31) && (!fuse_out || p.q),
             "linear attention (wgmma recurrence): ", rows_qk, " rows of q / k", p.q ? "" : ", no q");
    const cuuint64_t kdims[4] = {64, 2, cuuint64_t(p.HK), cuuint64_t(rows_qk)};
    const cuuint64_t kstr[3] = {128, 256, cuuint64_t(p.HK) * 256};
    const cuuint32_t kbox[4] = {64, 1, 1, 64}, kestr[4] = {1, 1, 1, 1};
    for (int m = 0; m < 2; ++m) {
      const bf16* src = m ? (p.q ? p.q : p.k) : p.k;
      DZ_CHECK(enc(m ? &maps.q : &maps.k, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<bf16*>(src), kdims, kstr,
                   kbox, kestr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS,
               "linear attention (wgmma recurrence): tensor map of the raw ", m ? "q" : "k");
    }
    if (!trans_A) {  // v as [rows][HV][2][64]: 64 tokens, 64 columns of one head a box
      DZ_CHECK(p.v, "linear attention (wgmma recurrence): no v");
      const cuuint64_t vdims[4] = {64, 2, cuuint64_t(p.HV), cuuint64_t(rows_qk)};
      const cuuint64_t vstr[3] = {128, 256, cuuint64_t(p.HV) * 256};
      DZ_CHECK(enc(&maps.v, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<bf16*>(p.v), vdims, vstr, kbox, kestr,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS,
               "linear attention (wgmma recurrence): tensor map of v");
    }
  }
  const auto kern = lite ? rec_wgmma_variant<true>(fuse_out, store) : rec_wgmma_variant<false>(fuse_out, store);
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(rw::kSmem)));
  kern<<<dim3(unsigned(p.HV * 2), unsigned(p.N)), rw::kThreads, rw::kSmem, stream>>>(maps, p, w.base, w.records, w.gls,
                                                                                      w.Sg, w.Ug, trans_A);
  CUDA_CHECK_LAUNCH();
}

template <int K>
void launch_out(const LaPrefill& p, size_t G, const Ws4& w, cudaStream_t stream) {
  constexpr size_t smem = out_smem_bytes<K>();
  CUDA_CHECK(cudaFuncSetAttribute(mma_out_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  mma_out_kernel<K><<<dim3(unsigned(G), unsigned(p.HV)), NT, smem, stream>>>(p, w.base, w.records, w.Sg, w.Ug,
                                                                            lite_records(K, p.kda));
  CUDA_CHECK_LAUNCH();
}

}  // namespace


size_t mma_workspace_bytes(int64_t T_total, int N, int HV, int K, int V) {
  return carve(nullptr, T_total, N, HV, K, V).bytes;
}

void mma_prefill(const ChunkArgs& a, int bv, unsigned stages, cudaStream_t stream) {
  const LaPrefill& p = a.p;
  DZ_CHECK(p.K == p.V && (p.K == 64 || p.K == 128), "linear attention CUDA v4: K=", p.K, " V=", p.V,
           " not supported (K = V = 64 or 128)");
  const Ws4 w = carve(p.workspace, p.T_total, p.N, p.HV, p.K, p.V);
  const size_t G = size_t((p.T_total + BT - 1) / BT + p.N);
  if (stages & kPrep) {
    base64_kernel<<<1, 1, 0, stream>>>(p.cu_seqlens, p.N, w.base);
    CUDA_CHECK_LAUNCH();
    if (p.T_total > 0) {
      if (p.K == 64)
        p.kda ? launch_prep<64, true>(p, G, w, stream) : launch_prep<64, false>(p, G, w, stream);
      else
        p.kda ? launch_prep<128, true>(p, G, w, stream) : launch_prep<128, false>(p, G, w, stream);
    }
  }
  const bool out = a.write_o && p.o && p.T_total > 0;
  DZ_CHECK(!out || p.q, "linear attention CUDA v4: outputs without q");
  // K = 128: the wgmma recurrence, its outputs fused unless p.fused_output == 0 (H100, T=64K, KDA H=8:
  // 1.25 ms fused, 1.73 with the later pass; 1.25 at H=32 too, the step's latency the whole cost).
  const bool fuse =
      p.K == 128 ? p.fused_output != 0 : fuse_outputs(p.fused_output, p.HV * p.N * (p.K / std::max(bv, 16)));
  if (stages & kRecur) {
    if (p.K == 128) launch_rec_wgmma(p, a.rows ? a.rows : p.T_total, w, a.trans_A, out && fuse, out && !fuse, stream);
    else if (bv == 16) launch_rec<64, 16>(p, w, a.trans_A, out, fuse, stream);
    else if (bv == 32) launch_rec<64, 32>(p, w, a.trans_A, out, fuse, stream);
    else launch_rec<64, 64>(p, w, a.trans_A, out, fuse, stream);
  }
  if ((stages & kOutput) && out && !fuse)
    p.K == 64 ? launch_out<64>(p, G, w, stream) : launch_out<128>(p, G, w, stream);
}

}  // namespace dz::cuda::la
