// Sparse MLA core on Hopper wgmma for the BF16 latent cache with (R, DR) = (512, 0) (GLM-5.3-Flash)
// and (512, 64) (DeepSeek-V3.2 / GLM-5) when the call does not split the entries (prefill, large
// decode batches); sparse_mla() (sparse_mla.cu) routes there, to the mma.sync kernel otherwise
// (split-KV, FP8 cache, R = 128). Same semantics and numerics (sparse_mla.cuh).
//
// Block = one query x 64 heads (one m64 tile), 2 warpgroups; per chunk of 64 entries:
//   gather    the 64 latent rows by cp.async (TMA cannot gather rows of a paged cache) into the
//             wgmma layout (column blocks of 64 dims, 128-byte rows, chunk c at c ^ (row & 7)), the
//             next chunk's gather in flight during this one;
//   S         warpgroup w: the 64 heads x keys 32 w .. 32 w + 31, wgmma m64n32k16 over R + DR
//             (Q and K K-major from shared memory);
//   softmax   the two halves' row maxima and sums meet in shared memory; each warpgroup writes its
//             P half (bf16) into a shared [64 x 64] tile;
//   O += P V  warpgroup w: O[:, 256 w .. 256 w + 255] (128 accumulators a thread), wgmma
//             m64n256k16 over the 64 keys, P K-major and V N-major (the latent rows' first R dims).
// Measured on an H200 (kernels/dev/sparse_mla/test_sparse_mla.cu --bench, 2026-12-02,
// docs/perf/experiments_c6788c6.txt): GLM-5.3-Flash (H 64, DR 0, K 2048, 8192 queries) 7.50 ms
// (256 TFLOP/s) vs 9.91 ms on mma.sync; DeepSeek-V3.2 (H 128, DR 64) 15.7 vs 20.3 ms.
// The gathers' addresses are pipelined: chunk c's selection index is loaded two chunks ahead and
// its page-table entry one chunk ahead, so those two dependent global loads no longer stand in
// front of every chunk's cp.asyncs (H200, one command, 2026-12-03: 6.98 vs 7.57 ms on GLM-5.3-Flash's
// shape, 14.67 vs 15.76 ms on DeepSeek-V3.2's; docs/perf/experiments_2026-12-03c.txt).
// With a selection the loop ends at the chunk of the query's last valid entry (see cend below).
#include <cmath>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "sparse_mla_wgmma.cuh"
#include "wgmma.cuh"

namespace dz::cuda {

namespace {

constexpr int kThreads = 256, HB = 64, NK = 64, R = 512;

template <int DR>
struct Geo {
  static constexpr int DK = R + DR, DKC = DK / 8, NCB = DK / 64;  // dims, 16-byte chunks, column blocks
  static constexpr int CB = 64 * 128;                             // one column block of 64 rows
  static constexpr int Q_OFF = 0, K_OFF = NCB * CB, P_OFF = K_OFF + 2 * NCB * CB;
  static constexpr int F_OFF = P_OFF + CB;          // floats: maxpart[2][HB] sumpart[2][HB] m[HB] l[HB]
  static constexpr int V_OFF = F_OFF + 6 * HB * 4;  // int valid[2][NK]
  static constexpr int SMEM = 1024 + V_OFF + 2 * NK * 4;  // (DR = 64: 227 KiB, all there is)
  // byte offset of 16-byte chunk ch of row r (64-row tiles in column blocks)
  __device__ static __forceinline__ uint32_t off(int r, int ch) {
    return uint32_t((ch >> 3) * CB + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
  }
};

template <int DR>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_wgmma_kernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ sel, int K,
                      const int32_t* __restrict__ seq, const int32_t* __restrict__ pos, int H, BlockTable bt,
                      const __nv_bfloat16* __restrict__ cache, float scale_log2, __nv_bfloat16* __restrict__ out) {
  using G = Geo<DR>;
  constexpr int DK = G::DK, DKC = G::DKC;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t pad = (1024u - (sraw & 1023u)) & 1023u;  // the 128-byte swizzle wants 1024-byte tiles
  uint8_t* smem = smem_raw + pad;
  const uint32_t sbase = sraw + pad;
  float* sMaxPart = reinterpret_cast<float*>(smem + G::F_OFF);
  float* sSumPart = sMaxPart + 2 * HB;
  float* sM = sMaxPart + 4 * HB;
  float* sL = sMaxPart + 5 * HB;
  int* sValid = reinterpret_cast<int*>(smem + G::V_OFF);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, w = warp >> 2, wq = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const int64_t qi = blockIdx.y;
  const int h0 = blockIdx.x * HB;
  const int p = pos[qi];
  const int32_t sq = seq[qi];
  const int32_t* selq = sel ? sel + qi * K : nullptr;
  const int nchunks = (K + NK - 1) / NK;
  int cend = selq ? nchunks : min(nchunks, p / NK + 1);
  // With a selection, the chunks after the last valid entry (idx in [0, p]) are skipped: a chunk of
  // masked entries leaves m, l and O bitwise as they are (its scores are -inf: alpha = 1, P = 0), so
  // the outputs are those of the whole loop. The indexers write a query's entries first and pad with
  // -1, so a query before position K (a prefill's first K tokens) ends early: ~1/8 of the chunks of
  // an 8192-token prefill with Top-2048.
  if (selq) {
    int last = -1;  // ascending k per thread: the thread's last valid entry
    for (int k = tid; k < K; k += kThreads) {
      const int v = __ldg(selq + k);
      if (v >= 0 && v <= p) last = k;
    }
    last = __reduce_max_sync(0xffffffffu, last);
    int* sLast = reinterpret_cast<int*>(sSumPart);  // [warps]: free until the first chunk's softmax
    if (lane == 0) sLast[warp] = last;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) last = max(last, sLast[i]);
    cend = (last + NK) / NK;  // last = -1: no chunk
  }

  // Q tile (rows past H are zeros), in the wgmma layout.
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

  // Gather: thread -> key row tid / 4, chunks tid % 4, + 4, ...
  const int grow = tid >> 2, gsub = tid & 3;
  // The gathers' addresses, pipelined: load_idx(c) two chunks ahead of chunk c's gather, load_page
  // one chunk ahead (each value is first used an iteration after its load is issued).
  auto load_idx = [&](int kc) -> int {  // the entry's position, -1 past K or past the chunks
    const int kidx = kc * NK + grow;
    return (kc < cend && kidx < K) ? (selq ? __ldg(selq + kidx) : kidx) : -1;
  };
  auto load_page = [&](int idx) -> int32_t {  // its page (0 for a masked entry: never read)
    return (idx >= 0 && idx <= p) ? __ldg(bt.table + int64_t(sq) * bt.max_pages + idx / bt.page_size) : 0;
  };
  auto gather = [&](int idx, int32_t page, int stage) {
    const bool valid = idx >= 0 && idx <= p;
    const int64_t slot = valid ? int64_t(page) * bt.page_size + idx % bt.page_size : 0;
    const __nv_bfloat16* src = cache + slot * DK;
    const uint32_t dst = sbase + G::K_OFF + stage * G::NCB * G::CB;
    for (int ch = gsub; ch < DKC; ch += 4) cp_async16(dst + G::off(grow, ch), src + ch * 8, valid);
    if (gsub == 0) sValid[stage * NK + grow] = valid;
  };

  float o[128];  // O[:, 256 w .. 256 w + 255]: d[4 j + q] = head 16 wq + g + 8 (q >> 1), column 8 j + 2 t + (q & 1)
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  int idx1 = load_idx(1), idx2 = load_idx(2);
  {
    const int idx0 = load_idx(0);
    if (cend > 0) {
      gather(idx0, load_page(idx0), 0);
      cp_commit();
    }
  }
  int32_t pg1 = load_page(idx1);
  const int r0 = wq * 16 + g, r1 = r0 + 8;  // this thread's heads (rows of both products)
  for (int kc = 0; kc < cend; ++kc) {
    const int stage = kc & 1;
    if (kc + 1 < cend) {
      gather(idx1, pg1, stage ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    // advance the pipeline: chunk kc + 2's page (its index came in an iteration ago), kc + 3's index
    idx1 = idx2;
    pg1 = load_page(idx2);
    idx2 = load_idx(kc + 3);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async / st.shared -> wgmma
    __syncthreads();
    const uint32_t sK = sbase + G::K_OFF + stage * G::NCB * G::CB;
    const int* valid = sValid + stage * NK;

    // ---- S = Q K^T: 64 heads x keys 32 w .. 32 w + 31 ----
    float s[16];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      const uint32_t blk = kk >> 2, in = (kk & 3) * 32;
      wgmma_ss<32>(s, wgmma_desc_sw128(sbase + G::Q_OFF + blk * G::CB + in),
                   wgmma_desc_sw128(sK + blk * G::CB + w * 32 * 128 + in), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(s);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = valid[w * 32 + 8 * j + 2 * t + e] != 0;
        s[4 * j + e] = ok ? s[4 * j + e] * scale_log2 : -INFINITY;
        s[4 * j + 2 + e] = ok ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
        mx0 = fmaxf(mx0, s[4 * j + e]);
        mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (t == 0) {
      sMaxPart[w * HB + r0] = mx0;
      sMaxPart[w * HB + r1] = mx1;
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
      for (int j = 0; j < 4; ++j) {
        const float p0 = ex2(s[4 * j] - u0), p1 = ex2(s[4 * j + 1] - u0);
        const float p2 = ex2(s[4 * j + 2] - u1), p3 = ex2(s[4 * j + 3] - u1);
        s0 += p0 + p1;
        s1 += p2 + p3;
        const int key = w * 32 + 8 * j + 2 * t;  // P tile: row = head, 64 keys = one column block
        *reinterpret_cast<uint32_t*>(smem + G::P_OFF + G::off(r0, key >> 3) + (key & 7) * 2) = pack_bf16(p0, p1);
        *reinterpret_cast<uint32_t*>(smem + G::P_OFF + G::off(r1, key >> 3) + (key & 7) * 2) = pack_bf16(p2, p3);
      }
      s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
      if (t == 0) {
        sSumPart[w * HB + r0] = s0;
        sSumPart[w * HB + r1] = s1;
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // P tile -> wgmma
    __syncthreads();

    // ---- O = O * alpha + P V over this warpgroup's 256 value dims ----
    {
      const float al0 = ex2(sM[r0] - m_use(r0)), al1 = ex2(sM[r1] - m_use(r1));
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= al0;
        o[4 * j + 1] *= al0;
        o[4 * j + 2] *= al1;
        o[4 * j + 3] *= al1;
      }
    }
    wgmma_fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < NK / 16; ++kk)
      wgmma_ss_tb<256>(o, wgmma_desc_sw128(sbase + G::P_OFF + kk * 32),
                       wgmma_desc_nmajor_sw128(sK + w * 4 * G::CB + kk * 16 * 128, G::CB), 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(o);
    __syncthreads();  // both warpgroups are done with this stage, the P tile and the partials
    if (tid < HB) {
      const float mo = sM[tid];
      const float mn = fmaxf(mo, fmaxf(sMaxPart[tid], sMaxPart[HB + tid]));
      const float mu = mn == -INFINITY ? 0.f : mn;
      sL[tid] = sL[tid] * ex2(mo - mu) + sSumPart[tid] + sSumPart[HB + tid];
      sM[tid] = mn;
    }
  }
  __syncthreads();

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r1 : r0;
    if (h0 + r >= H) continue;
    const float l = sL[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    __nv_bfloat16* dst = out + (qi * H + h0 + r) * R + w * 256 + 2 * t;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack_bf16(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
  }
}

template <int DR>
void launch(const __nv_bfloat16* q, const int32_t* sel, int K, const int32_t* seq, const int32_t* pos, int64_t nq,
            int H, const BlockTable& bt, const LatentCache& cache, float scale, __nv_bfloat16* out,
            cudaStream_t stream) {
  constexpr int smem = Geo<DR>::SMEM;
  auto kern = sparse_mla_wgmma_kernel<DR>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(unsigned((H + HB - 1) / HB), unsigned(nq));
  kern<<<grid, kThreads, smem, stream>>>(q, sel, K, seq, pos, H, bt, cache.bf16, scale * 1.4426950408889634f, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool sparse_mla_wgmma_takes(const LatentCache& cache, int64_t nq, int nsplit) {
  return !cache.fp8 && cache.R == 512 && (cache.DR == 0 || cache.DR == 64) && nq > 0 && nq < 65536 && nsplit == 1;
}

void sparse_mla_wgmma(const __nv_bfloat16* q, const int32_t* sel, int32_t K, const int32_t* seq, const int32_t* pos,
                      int64_t nq, int32_t H, const BlockTable& bt, const LatentCache& cache, float scale,
                      __nv_bfloat16* out, cudaStream_t stream) {
  DZ_CHECK(sparse_mla_wgmma_takes(cache, nq, 1) && K >= 1 && H >= 1, "sparse_mla_wgmma: cache (", cache.R, ", ",
           cache.DR, cache.fp8 ? ", fp8" : "", "), ", nq, " queries, K ", K, ", H ", H);
  if (cache.DR == 0)
    launch<0>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream);
  else
    launch<64>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream);
}

}  // namespace dz::cuda
