// Sparse MLA core (see sparse_mla.cuh). Prefill and large decode batches on the BF16 cache with
// R = 512 go to the wgmma kernel (sparse_mla_wgmma.cu); this file's kernel takes the rest (split-KV
// decode, the FP8 cache, R = 128). One block = one query × 64 heads, 8 warps, mma.sync.
// Per chunk of 64 entries (selected positions, or 64 consecutive ones in the dense mode): gather
// the 64 key rows (BF16: cp.async, double buffered; FP8: register-prefetched loads dequantized
// into BF16 shared memory), S = Q K^T (warp = 16 heads × 32 keys), online softmax across the two
// key halves through shared memory, then O += P V (warp = 64 heads × R/8 value dims, V = the
// first R dims of the same key rows).
// Shared-memory tiles are row-major with 16-byte chunks XOR-swizzled by (row & 7) so that
// ldmatrix reads are free of bank conflicts.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "quant_device.cuh"
#include "sparse_mla.cuh"
#include "sparse_mla_wgmma.cuh"

namespace dz::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int HB = 64;  // heads per block
constexpr int NK = 64;  // selected entries per chunk
// Split-KV parts at most: one query with H <= 64 is one block, so a long dense decode fills up to
// 128 of the H200's 132 multiprocessors. Scratch stays bounded whatever the cap: parts are only
// made while the grid is smaller than the GPU, so parts x blocks < 2 x SMs (see max_splits).
constexpr int kMaxSplit = 128;

template <int R, int DR>
struct Geo {
  static constexpr int DK = R + DR;
  static constexpr int DKC = DK / 8;  // 16-byte chunks per key row
  static_assert(DKC % 8 == 0, "swizzle needs rows of a multiple of 8 chunks");
  static constexpr int ROWB = DK * 2;
  static constexpr int Q_OFF = 0;
  static constexpr int K_OFF = HB * ROWB;
  static constexpr int P_OFF = K_OFF + 2 * NK * ROWB;
  static constexpr int F_OFF = P_OFF + HB * NK * 2;        // floats: maxpart[2][HB] sumpart[2][HB] m[HB] l[HB]
  static constexpr int V_OFF = F_OFF + 6 * HB * 4;         // int valid[2][NK]
  static constexpr int SMEM = V_OFF + 2 * NK * 4;
  // byte offset of (row, chunk) in a swizzled tile with DKC chunks per row
  __device__ static __forceinline__ uint32_t off(int row, int chunk) {
    return uint32_t(row * ROWB + ((chunk ^ (row & 7)) << 4));
  }
  __device__ static __forceinline__ uint32_t offp(int row, int chunk) {  // P tile: 8 chunks per row
    return uint32_t(row * (NK * 2) + ((chunk ^ (row & 7)) << 4));
  }
};

template <int R, int DR, bool FP8>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_kernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ sel, int K,
                      const int32_t* __restrict__ seq, const int32_t* __restrict__ pos, int H, BlockTable bt,
                      LatentCache cache, float scale_log2, __nv_bfloat16* __restrict__ out, int chunks_per_split,
                      float* __restrict__ part_o, float* __restrict__ part_lse) {
  using G = Geo<R, DR>;
  constexpr int DK = G::DK, DKC = G::DKC;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_u32(smem);
  float* sMaxPart = reinterpret_cast<float*>(smem + G::F_OFF);
  float* sSumPart = sMaxPart + 2 * HB;
  float* sM = sMaxPart + 4 * HB;
  float* sL = sMaxPart + 5 * HB;
  int* sValid = reinterpret_cast<int*>(smem + G::V_OFF);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int64_t qi = blockIdx.y;
  const int h0 = blockIdx.x * HB;
  const int p = pos[qi];
  const int32_t sq = seq[qi];
  // sel == nullptr: dense causal, entry k is position k. Its chunks past the query's position
  // hold no visible entry and are skipped (a selection may list positions in any order).
  const int32_t* selq = sel ? sel + qi * K : nullptr;
  const int nchunks = (K + NK - 1) / NK;
  const int cend = selq ? nchunks : min(nchunks, p / NK + 1);
  // Split-KV (blockIdx.z): this block covers chunks [c0, c1) of the entries (none when c0 >= c1:
  // zeros and an empty log-sum-exp, which the merge ignores).
  const int c0 = blockIdx.z * chunks_per_split;
  const int c1 = min(cend, c0 + chunks_per_split);

  // Q tile (rows past H are zeros).
  for (int i = tid; i < HB * DKC; i += kThreads) {
    const int row = i / DKC, ch = i % DKC;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + row < H) v = *reinterpret_cast<const uint4*>(q + ((qi * H + h0 + row) * DK + ch * 8));
    *reinterpret_cast<uint4*>(smem + G::Q_OFF + G::off(row, ch)) = v;
  }
  if (tid < HB) {
    sM[tid] = -INFINITY;
    sL[tid] = 0.f;
  }

  // Gather: thread -> key row tid / 4, quarter tid % 4 of that row.
  const int grow = tid >> 2, gsub = tid & 3;
  auto slot_of = [&](int kc, bool& valid) -> int64_t {
    const int kidx = kc * NK + grow;
    const int idx = kidx < K ? (selq ? selq[kidx] : kidx) : -1;
    valid = idx >= 0 && idx <= p;
    if (!valid) return 0;
    return int64_t(bt.table[int64_t(sq) * bt.max_pages + idx / bt.page_size]) * bt.page_size + idx % bt.page_size;
  };
  auto gather_bf16 = [&](int kc, int stage) {
    bool valid;
    const int64_t slot = slot_of(kc, valid);
    const __nv_bfloat16* src = cache.bf16 + slot * DK;
    const uint32_t dst = sbase + G::K_OFF + stage * NK * G::ROWB;
    for (int ch = gsub; ch < DKC; ch += 4) cp_async16(dst + G::off(grow, ch), src + ch * 8, valid);
    if (gsub == 0) sValid[stage * NK + grow] = valid;
  };
  // FP8 registers: codes [R/64 uint4] (one tile's run), rope [DR/32 uint4], the tile scale.
  constexpr int NC = FP8 ? R / 64 : 1, NR = FP8 ? DR / 32 : 1;
  uint4 rc[NC], rr[NR];
  float rscale = 0.f;
  bool rvalid = false;
  auto load_fp8 = [&](int kc) {
    const int64_t slot = slot_of(kc, rvalid);
    if (rvalid) {
      const uint4* cs = reinterpret_cast<const uint4*>(cache.codes + slot * R) + gsub * NC;
#pragma unroll
      for (int j = 0; j < NC; ++j) rc[j] = __ldg(cs + j);
      const uint4* rs = reinterpret_cast<const uint4*>(cache.rope + slot * DR) + gsub * NR;
#pragma unroll
      for (int j = 0; j < NR; ++j) rr[j] = __ldg(rs + j);
      rscale = __ldg(cache.scales + slot * (R / 128) + (gsub * (R / 4)) / 128);
    }
  };
  auto store_fp8 = [&](int stage) {
    uint8_t* dst = smem + G::K_OFF + stage * NK * G::ROWB;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      const int u = gsub * NC + j;  // 16 codes -> smem chunks 2u, 2u+1
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (rvalid) {
        const uint32_t w[4] = {rc[j].x, rc[j].y, rc[j].z, rc[j].w};
        uint32_t o[8];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float2 a = dev::e4m3x2_to_f2(uint16_t(w[t] & 0xFFFFu));
          const float2 b = dev::e4m3x2_to_f2(uint16_t(w[t] >> 16));
          o[2 * t] = pack_bf16(a.x * rscale, a.y * rscale);
          o[2 * t + 1] = pack_bf16(b.x * rscale, b.y * rscale);
        }
        lo = make_uint4(o[0], o[1], o[2], o[3]);
        hi = make_uint4(o[4], o[5], o[6], o[7]);
      }
      *reinterpret_cast<uint4*>(dst + G::off(grow, 2 * u)) = lo;
      *reinterpret_cast<uint4*>(dst + G::off(grow, 2 * u + 1)) = hi;
    }
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const int v = gsub * NR + j;
      *reinterpret_cast<uint4*>(dst + G::off(grow, R / 8 + v)) = rvalid ? rr[j] : make_uint4(0, 0, 0, 0);
    }
    if (gsub == 0) sValid[stage * NK + grow] = rvalid;
  };

  // Output accumulators: warp -> value dims [warp * R/8, +R/8), all 64 heads.
  constexpr int DVW = R / 8, NT = DVW / 8;
  static_assert(NT % 2 == 0, "R must be a multiple of 128");
  float o[4][NT][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[mt][nt][j] = 0.f;

  if (c0 < c1) {
    if (FP8) {
      load_fp8(c0);
      store_fp8(0);
    } else {
      gather_bf16(c0, 0);
      cp_commit();
    }
  }

  const int smt = warp & 3, snh = warp >> 2;  // S phase: heads smt*16.., keys snh*32..
  for (int kc = c0; kc < c1; ++kc) {
    const int stage = (kc - c0) & 1;
    const bool more = kc + 1 < c1;
    if (FP8) {
      if (more) load_fp8(kc + 1);
    } else {
      if (more) {
        gather_bf16(kc + 1, stage ^ 1);
        cp_commit();
        cp_wait<1>();
      } else {
        cp_wait<0>();
      }
    }
    __syncthreads();
    const uint32_t sK = sbase + G::K_OFF + stage * NK * G::ROWB;
    const int* valid = sValid + stage * NK;

    // ---- S = Q K^T for 16 heads x 32 keys ----
    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[nt][j] = 0.f;
#pragma unroll 4
    for (int ks = 0; ks < DK / 16; ++ks) {
      uint32_t a[4];
      ldsm_x4(a, sbase + G::Q_OFF + G::off(smt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const int m = lane >> 3;
        uint32_t b[4];
        ldsm_x4(b, sK + G::off(snh * 32 + pr * 16 + (m >> 1) * 8 + (lane & 7), 2 * ks + (m & 1)));
        mma_bf16(acc[2 * pr], a, b[0], b[1]);
        mma_bf16(acc[2 * pr + 1], a, b[2], b[3]);
      }
    }
    const int r0 = smt * 16 + g, r1 = r0 + 8;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool ok = valid[snh * 32 + nt * 8 + 2 * c + j] != 0;
        acc[nt][j] = ok ? acc[nt][j] * scale_log2 : -INFINITY;
        acc[nt][2 + j] = ok ? acc[nt][2 + j] * scale_log2 : -INFINITY;
        mx0 = fmaxf(mx0, acc[nt][j]);
        mx1 = fmaxf(mx1, acc[nt][2 + j]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (c == 0) {
      sMaxPart[snh * HB + r0] = mx0;
      sMaxPart[snh * HB + r1] = mx1;
    }
    __syncthreads();
    auto m_use = [&](int r) {
      const float m = fmaxf(sM[r], fmaxf(sMaxPart[r], sMaxPart[HB + r]));
      return m == -INFINITY ? 0.f : m;
    };
    {
      const float u0 = m_use(r0), u1 = m_use(r1);
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float p0 = exp2f(acc[nt][0] - u0), p1 = exp2f(acc[nt][1] - u0);
        const float p2 = exp2f(acc[nt][2] - u1), p3 = exp2f(acc[nt][3] - u1);
        s0 += p0 + p1;
        s1 += p2 + p3;
        const int col = snh * 32 + nt * 8 + 2 * c;
        *reinterpret_cast<uint32_t*>(smem + G::P_OFF + G::offp(r0, col >> 3) + (col & 7) * 2) = pack_bf16(p0, p1);
        *reinterpret_cast<uint32_t*>(smem + G::P_OFF + G::offp(r1, col >> 3) + (col & 7) * 2) = pack_bf16(p2, p3);
      }
      s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
      if (c == 0) {
        sSumPart[snh * HB + r0] = s0;
        sSumPart[snh * HB + r1] = s1;
      }
    }
    __syncthreads();

    // ---- O = O * alpha + P V ----
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const int ra = mt * 16 + g, rb = ra + 8;
      const float al0 = exp2f(sM[ra] - m_use(ra)), al1 = exp2f(sM[rb] - m_use(rb));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[mt][nt][0] *= al0;
        o[mt][nt][1] *= al0;
        o[mt][nt][2] *= al1;
        o[mt][nt][3] *= al1;
      }
    }
    const int dv0 = warp * DVW;
#pragma unroll
    for (int ks = 0; ks < NK / 16; ++ks) {
      uint32_t a[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        ldsm_x4(a[mt], sbase + G::P_OFF + G::offp(mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        const int m = lane >> 3;
        uint32_t b[4];
        ldsm_x4_t(b, sK + G::off(ks * 16 + (m & 1) * 8 + (lane & 7), (dv0 + np * 16) / 8 + (m >> 1)));
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          mma_bf16(o[mt][2 * np], a[mt], b[0], b[1]);
          mma_bf16(o[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();
    if (tid < HB) {
      const float mo = sM[tid];
      const float mn = fmaxf(mo, fmaxf(sMaxPart[tid], sMaxPart[HB + tid]));
      const float mu = mn == -INFINITY ? 0.f : mn;
      sL[tid] = sL[tid] * exp2f(mo - mu) + sSumPart[tid] + sSumPart[HB + tid];
      sM[tid] = mn;
    }
    if (FP8 && more) store_fp8(stage ^ 1);
  }
  __syncthreads();

  const int dv0 = warp * DVW;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g + 8 * half;
      if (h0 + r >= H) continue;
      const float l = sL[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (part_o) {  // split-KV: normalized partial output and its log2-sum-exp2 (scaled logits)
        const int64_t row = (int64_t(blockIdx.z) * gridDim.y + qi) * H + h0 + r;
        float* po = part_o + row * R + dv0;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          *reinterpret_cast<float2*>(po + nt * 8 + 2 * c) =
              make_float2(o[mt][nt][2 * half] * inv, o[mt][nt][2 * half + 1] * inv);
        if (warp == 0 && c == 0) part_lse[row] = l > 0.f ? sM[r] + log2f(l) : -INFINITY;
        continue;
      }
      __nv_bfloat16* dst = out + (qi * H + h0 + r) * R + dv0;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<uint32_t*>(dst + nt * 8 + 2 * c) =
            pack_bf16(o[mt][nt][2 * half] * inv, o[mt][nt][2 * half + 1] * inv);
    }
  }
}

// out[q, h, :] = sum_s w_s part_o[s, q, h, :] / sum_s w_s, w_s = 2^(lse_s - max lse).
// grid (q * H, ceil(R / 128)), 128 threads (nsplit <= kMaxSplit = 128: one part per thread for
// the weights). The weights go to shared memory once; each thread then sums one column over the
// parts with independent loads in flight (a thread per row walking all parts serially took
// ~113 us at 65 parts: ncu at 03f4246). Fixed orders (butterfly, warps ascending, parts
// ascending): deterministic.
constexpr int kCombineThreads = 128;
static_assert(kMaxSplit <= kCombineThreads, "combine_kernel: one part per thread");
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const float* __restrict__ part_o,
                                                                  const float* __restrict__ part_lse, int nsplit,
                                                                  int64_t rows, int R, __nv_bfloat16* __restrict__ out) {
  const int64_t row = blockIdx.x;  // q * H + h
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  __shared__ float w[kCombineThreads];
  __shared__ float red[kCombineThreads / 32];
  const float ls = t < nsplit ? part_lse[t * rows + row] : -INFINITY;
  float mx = ls;
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int q = 1; q < kCombineThreads / 32; ++q) mx = fmaxf(mx, red[q]);
  const float ws = ls == -INFINITY ? 0.f : exp2f(ls - mx);  // mx == -inf: every ls too
  w[t] = ws;
  float sum = ws;
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();  // every warp has read red[] (the max) before it holds the sums
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  float wsum = 0.f;
  for (int q = 0; q < kCombineThreads / 32; ++q) wsum += red[q];
  const int j = int(blockIdx.y) * kCombineThreads + t;
  if (j >= R) return;
  const float* po = part_o + row * R + j;
  const int64_t stride = rows * R;  // part s of (row, j) is po[s * stride]
  float acc = 0.f;
#pragma unroll 8
  for (int s = 0; s < nsplit; ++s) acc += w[s] * po[s * stride];
  out[row * R + j] = __float2bfloat16_rn(wsum > 0.f ? acc / wsum : 0.f);
}

int num_sms() { return sm_count(); }

// Split-KV parts of a call of nq queries: more than one only while the (query, 64-head block)
// grid leaves multiprocessors idle; at most kMaxSplit, enough to cover the SMs, and no more than
// the chunks of NK entries (launch() then evens the chunks per part, >= 1).
int64_t max_splits(int64_t nq, int32_t H, int32_t K) {
  const int64_t blocks = nq * ((H + HB - 1) / HB), sms = num_sms();
  if (blocks >= sms) return 1;
  return std::max<int64_t>(1, std::min<int64_t>({int64_t(kMaxSplit), (K + NK - 1) / NK, (sms + blocks - 1) / blocks}));
}

template <int R, int DR, bool FP8>
void launch(const __nv_bfloat16* q, const int32_t* sel, int K, const int32_t* seq, const int32_t* pos, int64_t nq,
            int H, const BlockTable& bt, const LatentCache& cache, float scale, __nv_bfloat16* out,
            cudaStream_t stream, int nsplit, float* scratch) {
  constexpr int smem = Geo<R, DR>::SMEM;
  auto kern = sparse_mla_kernel<R, DR, FP8>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int nchunks = (K + NK - 1) / NK;
  const int cps = (nchunks + nsplit - 1) / nsplit;
  nsplit = (nchunks + cps - 1) / cps;
  const dim3 grid(unsigned((H + HB - 1) / HB), unsigned(nq), unsigned(nsplit));
  float* part_o = nsplit > 1 ? scratch : nullptr;
  float* part_lse = nsplit > 1 ? scratch + int64_t(nsplit) * nq * H * R : nullptr;
  kern<<<grid, kThreads, smem, stream>>>(q, sel, K, seq, pos, H, bt, cache, scale * kLog2e, out, cps,
                                         part_o, part_lse);
  CUDA_CHECK_LAUNCH();
  if (nsplit > 1) {
    const dim3 cgrid(unsigned(nq * H), unsigned((R + kCombineThreads - 1) / kCombineThreads));
    combine_kernel<<<cgrid, kCombineThreads, 0, stream>>>(part_o, part_lse, nsplit, nq * H, R, out);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

// (512, 0) is MLA without RoPE (GLM-5.3-Flash's NoPE-256 heads absorbed into the 512 latent).
bool sparse_mla_supports(int32_t R, int32_t DR) { return (DR == 64 && (R == 512 || R == 128)) || (DR == 0 && R == 512); }

int64_t sparse_mla_scratch_elems(int64_t nq, int32_t H, int32_t R, int32_t K) {
  const int64_t nsplit = max_splits(nq, H, K);
  return nsplit > 1 ? nsplit * nq * H * (int64_t(R) + 1) : 0;
}

void sparse_mla(const __nv_bfloat16* q, const int32_t* sel, int32_t K, const int32_t* seq, const int32_t* pos,
                int64_t nq, int32_t H, const BlockTable& bt, const LatentCache& cache, float scale, __nv_bfloat16* out,
                cudaStream_t stream, float* scratch, int64_t scratch_elems) {
  DZ_CHECK(K >= 1 && H >= 1, "sparse_mla: bad K ", K, " or H ", H);
  DZ_CHECK(nq < 65536, "sparse_mla: ", nq, " queries exceed one launch (65535); split the batch");
  if (nq == 0) return;
  // Split-KV when the (query, head-block) grid leaves multiprocessors idle and scratch allows.
  int nsplit = 1;
  if (scratch) {
    for (int64_t sp = max_splits(nq, H, K); sp > 1; --sp)
      if (sp * nq * H * (int64_t(cache.R) + 1) <= scratch_elems) {
        nsplit = int(sp);
        break;
      }
  }
  // Prefill and large decode batches at R = 512: the wgmma kernel (sparse_mla_wgmma.cu).
  if (sparse_mla_wgmma_takes(cache, nq, nsplit))
    return sparse_mla_wgmma(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream);
  if (cache.R == 512 && cache.DR == 64) {
    if (cache.fp8) launch<512, 64, true>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream, nsplit, scratch);
    else launch<512, 64, false>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream, nsplit, scratch);
  } else if (cache.R == 128 && cache.DR == 64) {
    if (cache.fp8) launch<128, 64, true>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream, nsplit, scratch);
    else launch<128, 64, false>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream, nsplit, scratch);
  } else if (cache.R == 512 && cache.DR == 0) {
    // no FP8 variant: its rope part would be empty, and the model's NoPE cache is BF16 rows
    DZ_CHECK(!cache.fp8, "sparse_mla: (512, 0) runs on the BF16 cache only");
    launch<512, 0, false>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream, nsplit, scratch);
  } else {
    dz::fail(dz::str("sparse_mla: latent/rope dims (", cache.R, ", ", cache.DR,
                     ") not supported: (512, 64), (128, 64) or (512, 0)"));
  }
}

}  // namespace dz::cuda
