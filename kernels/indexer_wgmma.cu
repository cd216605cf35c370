// DSA indexer scores on Hopper wgmma (see indexer_wgmma.cuh).
//
// Why this shape: kernels/indexer.cu gives every query its own block, which reads every key it
// sees from L2 (T^2 / 2 key rows: 137 GB at T = 32768, H = 64, D = 128) and multiplies 64 heads by
// 16 keys per mma.sync step; 35 of its 39 ms at T = 32768 are the scores (docs/perf/README.md,
// sparse attention). Here the products are transposed, S^T = K Q^T: a block holds the queries of
// 2 x 256 / H consecutive positions in shared memory (B operand, N = 256 = queries x heads) and
// streams 64-key tiles past them (A operand, M = 64), so one key tile serves 8 queries at H = 64
// (L2 traffic / 8) and the head sum is a reduction along N: inside each thread's accumulators,
// then over the 4 lanes of a quad (a reduce-scatter: each lane ends with whole queries).
//
// Warp specialised: warpgroup 0 the producer (one thread issues the TMA loads: the two query
// tiles once, then key tiles of 64 rows through kStages stages with full / empty mbarriers;
// setmaxnreg.dec 24), warpgroups 1 and 2 the consumers of one query tile each (setmaxnreg.inc
// 240: 128 accumulators + 64 head weights per thread). Both consumers read every key tile; while
// one runs its ReLU / weight / sum epilogue the other's products run on the tensor cores.
#include "indexer_wgmma.cuh"

#include "common.cuh"
#include "indexer.cuh"
#include "indexer_topk_device.cuh"
#include "mma_sm80.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#include <algorithm>

namespace dz::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 384;  // producer + 2 consumer warpgroups
constexpr int kKeys = 64;      // keys per tile (the wgmma M)
constexpr int kCols = 256;     // query columns per consumer (queries x heads: the wgmma N)
constexpr int kStages = 4;
constexpr int kHistBins = 1024, kHistWords = kHistBins / 2;  // bin = order_key(score) >> 22

template <int D, int H>
struct Shape {
  static constexpr int NCB = D / 64;               // 64-wide (128-byte) column blocks of d
  static constexpr int QB = kCols / H;             // queries per consumer warpgroup
  static constexpr int Q_BYTES = kCols * D * 2;    // one consumer's query tile
  static constexpr int K_BYTES = kKeys * D * 2;    // one key stage
  // HIST: each query's histogram of its scores' order-key top 10 bits, 16-bit counts (rows <
  // 65536 keys) two to a word
  static constexpr int HIST_BYTES = 2 * QB * kHistWords * 4;
  // alignment slack, 2 query tiles, the key stages, the mbarriers (Q, full[], empty[]), [histograms]
  static constexpr int BAR_BYTES = 8 * (1 + 2 * kStages);
  static constexpr int SMEM = 1024 + 2 * Q_BYTES + kStages * K_BYTES + BAR_BYTES;
  static constexpr int SMEM_HIST = SMEM + HIST_BYTES;
};

struct Maps {
  CUtensorMap q, k;
};

// One arrival from the warp's lane 0.
__device__ __forceinline__ void arrive_lane0(uint32_t bar, int lane) {
  if (lane == 0) mbar_arrive(bar);
}

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// HIST: also the histograms of every query's scores (hist [n, kHistWords] words of two 16-bit
// counts, bin = order_key >> 22), for topk_from_hist.
template <int D, int H, bool HIST>
__global__ void __launch_bounds__(kThreads, 1)
    idx_wgmma_kernel(const __grid_constant__ Maps maps, const float* __restrict__ w, int64_t n, int64_t pos0,
                     float* __restrict__ scores, int64_t ld, uint32_t* __restrict__ hist) {
  using S = Shape<D, H>;
  constexpr int QB = S::QB, NCB = S::NCB;
  static_assert(QB % 4 == 0, "the quad reduce-scatter hands each lane whole queries: 256 / H a multiple of 4");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase0 = smem_u32(smem_raw);
  const uint32_t sQ = sbase0 + ((1024u - (sbase0 & 1023u)) & 1023u), sK = sQ + 2 * S::Q_BYTES;
  const uint32_t bQ = sK + kStages * S::K_BYTES;
  auto full = [&](int s) { return bQ + 8 * (1 + s); };
  auto empty = [&](int s) { return bQ + 8 * (1 + kStages + s); };

  const int64_t q0 = (int64_t(gridDim.x) - 1 - blockIdx.x) * 2 * QB;  // heaviest (latest) queries first
  const int64_t q_last = min(n, q0 + 2 * QB) - 1;
  const int ntiles = int((pos0 + q_last + 1 + kKeys - 1) / kKeys);  // key tiles the last query sees
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  if (tid == 0) {
    mbar_init(bQ, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 8);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) {
      // rows past n * H (a partial last block) are zero-filled by TMA; their weights are 0
      mbar_expect_tx(bQ, 2 * S::Q_BYTES);
      for (int c = 0; c < 2; ++c)
        for (int cb = 0; cb < NCB; ++cb)
          tma_load_2d(sQ + c * S::Q_BYTES + cb * kCols * 128, &maps.q, cb * 64, int((q0 + c * QB) * H), bQ);
      for (int j = 0; j < ntiles; ++j) {
        const int s = j % kStages;
        // stage s last held tile j - kStages: wait for both consumers' release of it
        if (j >= kStages) mbar_wait(empty(s), ((j / kStages) - 1) & 1);
        mbar_expect_tx(full(s), S::K_BYTES);
        for (int cb = 0; cb < NCB; ++cb)
          tma_load_2d(sK + s * S::K_BYTES + cb * kKeys * 128, &maps.k, cb * 64, j * kKeys, full(s));
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int wm = wg - 1, wq = warp & 3, g = lane >> 2, t = lane & 3;
  uint32_t* sh = reinterpret_cast<uint32_t*>(smem_raw + (bQ - sbase0) + S::BAR_BYTES);  // [2 QB][kHistWords]
  if constexpr (HIST) {
    for (int i = tid - 128; i < 2 * QB * kHistWords; i += 256) sh[i] = 0u;
    consumers_sync();
  }
  const int64_t qw0 = q0 + wm * QB;  // this warpgroup's first query
  // head weights of this thread's columns 8 j + 2 t + e (query (8 j) / H: a group of 8 columns
  // never straddles two queries, H >= 16)
  float wv[kCols / 8][2];
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * t + e;
      wv[j][e] = qw0 + col / H < n ? __ldg(w + qw0 * H + col) : 0.f;
    }
  const bool b1 = (t & 2) != 0, b0 = (t & 1) != 0;
  mbar_wait(bQ, 0);

  float acc[kCols / 2];
  for (int j = 0; j < ntiles; ++j) {
    const int s = j % kStages;
    mbar_wait(full(s), (j / kStages) & 1);
    wgmma_fence();
    const uint32_t kt = sK + s * S::K_BYTES, qt = sQ + wm * S::Q_BYTES;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t blk = kk >> 2, in = (kk & 3) * 32;
      wgmma_ss<kCols>(acc, wgmma_desc_sw128(kt + blk * kKeys * 128 + in), wgmma_desc_sw128(qt + blk * kCols * 128 + in),
                      kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    arrive_lane0(empty(s), lane);

    // acc[4 c + 2 hf + e]: key row 16 wq + g + 8 hf of the tile, column 8 c + 2 t + e
    float p[QB][2];
#pragma unroll
    for (int qq = 0; qq < QB; ++qq) p[qq][0] = p[qq][1] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols / 8; ++c) {
      const int qq = (8 * c) / H;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int e = 0; e < 2; ++e) p[qq][hf] = fmaf(wv[c][e], fmaxf(acc[4 * c + 2 * hf + e], 0.f), p[qq][hf]);
    }
    // quad reduce-scatter: after it lane t holds the sums of queries 4 a + t
    float r[QB / 2][2];  // xor 2: keep the queries whose bit 1 is t's
#pragma unroll
    for (int a = 0; a < QB / 4; ++a)
#pragma unroll
      for (int lo = 0; lo < 2; ++lo)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float x0 = p[4 * a + lo][hf], x1 = p[4 * a + lo + 2][hf];
          r[2 * a + lo][hf] = (b1 ? x1 : x0) + __shfl_xor_sync(0xffffffffu, b1 ? x0 : x1, 2);
        }
    float f[QB / 4][2];  // xor 1: keep the query whose bit 0 is t's
#pragma unroll
    for (int a = 0; a < QB / 4; ++a)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float x0 = r[2 * a][hf], x1 = r[2 * a + 1][hf];
        f[a][hf] = (b0 ? x1 : x0) + __shfl_xor_sync(0xffffffffu, b0 ? x0 : x1, 1);
      }
    const int64_t key = int64_t(j) * kKeys + 16 * wq + g;
#pragma unroll
    for (int a = 0; a < QB / 4; ++a) {
      const int64_t qi = qw0 + 4 * a + t;
      if (qi >= n) continue;
      float* row = scores + qi * ld;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        if (key + 8 * hf <= pos0 + qi) {
          row[key + 8 * hf] = f[a][hf];
          if constexpr (HIST) {
            const uint32_t bin = dev::order_key(f[a][hf]) >> 22;
            atomicAdd(sh + (wm * QB + 4 * a + t) * kHistWords + (bin >> 1), 1u << (16 * (bin & 1)));
          }
        }
    }
  }
  if constexpr (HIST) {
    consumers_sync();
    for (int i = tid - 128; i < 2 * QB * kHistWords; i += 256) {
      const int64_t qi = q0 + i / kHistWords;
      if (qi < n) hist[qi * kHistWords + i % kHistWords] = sh[i];
    }
  }
}

// rows x D bf16, boxes of 64 d x box_rows rows, 128-byte swizzle, zeros past the tensor's end.
void encode2(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap* m, const bf16* p, int64_t rows, int D, int box_rows,
             const char* what) {
  const cuuint64_t dims[2] = {cuuint64_t(D), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(D) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  DZ_CHECK(enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(p), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS,
           "indexer_scores_wgmma: tensor map of the ", what, " [", rows, ", ", D, "]");
}

template <int D, int H, bool HIST>
void launch(const bf16* q, const float* w, const bf16* keys, int64_t n, int64_t pos0, int64_t S_rows, float* scores,
            int64_t ld, uint32_t* hist, cudaStream_t stream) {
  using S = Shape<D, H>;
  const PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  DZ_CHECK(enc, "indexer_scores_wgmma: the driver has no cuTensorMapEncodeTiled");
  Maps maps;
  encode2(enc, &maps.q, q, n * H, D, kCols, "queries");
  encode2(enc, &maps.k, keys, S_rows, D, kKeys, "keys");
  auto kern = idx_wgmma_kernel<D, H, HIST>;
  const int smem = HIST ? S::SMEM_HIST : S::SMEM;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t blocks = (n + 2 * S::QB - 1) / (2 * S::QB);
  kern<<<unsigned(blocks), kThreads, smem, stream>>>(maps, w, n, pos0, scores, ld, hist);
  CUDA_CHECK_LAUNCH();
}

constexpr int kTopkThreads = 512;
constexpr int64_t kTopkMaxKeys = 51200;

__global__ void __launch_bounds__(kTopkThreads) topk_smem_kernel(const float* __restrict__ scores, int64_t ld,
                                                                  const int32_t* __restrict__ pos, int K,
                                                                  int32_t* __restrict__ sel) {
  extern __shared__ __align__(16) float row[];
  const int64_t qi = blockIdx.x;
  const int n = pos[qi] + 1;
  const float* src = scores + qi * ld;
  // 16-byte loads where the row allows (ld % 4 == 0 keeps every row aligned), scalar otherwise
  const int n4 = (ld % 4 == 0 && (reinterpret_cast<uintptr_t>(scores) & 15) == 0) ? n / 4 : 0;
  for (int i = threadIdx.x; i < n4; i += kTopkThreads)
    reinterpret_cast<float4*>(row)[i] = __ldg(reinterpret_cast<const float4*>(src) + i);
  for (int i = 4 * n4 + threadIdx.x; i < n; i += kTopkThreads) row[i] = __ldg(src + i);
  __syncthreads();
  dev::block_topk<kTopkThreads>(row, n, K, sel + qi * K);
}

constexpr int kCandMax = 12288;  // keys of the threshold bin kept in shared memory (48 KiB)

// Top-K of one row from its scores and its histogram (idx_wgmma_kernel<..., true>), in two passes
// over the row. The bin of the K-th best comes from the histogram. Pass one: warp w over its span
// (warp_span, as block_compact_write's) counts the keys of higher bins and keeps that bin's keys in
// shared memory, tagged with w. The exact K-th key by two radix steps over the kept keys; their tags
// add each warp's keys above it and equal to it; pass two: block_compact_write. More than kCandMax
// keys in the bin: block_topk over the row instead (five passes).
// (Before 2026-12-06: the bin's keys gathered by the block's threads in position-strided order, one
// shared atomic a key, then block_compact's count and write passes: three passes over the row,
// 4.1 ms at H = 64, T = 32768 on an H100.)
__global__ void __launch_bounds__(kTopkThreads) topk_hist_kernel(const float* __restrict__ scores, int64_t ld,
                                                                  const uint32_t* __restrict__ hist,
                                                                  const int32_t* __restrict__ pos, int K,
                                                                  int32_t* __restrict__ sel) {
  constexpr int NW = kTopkThreads / 32;
  static_assert(NW <= 16, "a kept key's warp in its 4 tag bits (22-bit key + 4 <= 32)");
  extern __shared__ uint32_t cand[];  // the bin's keys: low 22 bits | warp << 22
  __shared__ uint32_t h[2048];
  __shared__ uint32_t s_bin_rem[2], s_nc, part[NW], s_gt[NW], s_eq[NW];
  const int64_t qi = blockIdx.x;
  const int n = pos[qi] + 1, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* row = scores + qi * ld;
  int32_t* out = sel + qi * K;
  if (n <= K) return dev::block_topk<kTopkThreads>(row, n, K, out);  // its short-row padding
  for (int i = tid; i < kHistWords; i += kTopkThreads) {
    const uint32_t v = hist[qi * kHistWords + i];
    h[2 * i] = v & 0xFFFFu;
    h[2 * i + 1] = v >> 16;
  }
  if (tid == 0) s_nc = 0;
  if (tid < NW) s_eq[tid] = 0;
  __syncthreads();
  dev::block_find_bin<kTopkThreads>(h, kHistBins, uint32_t(K), part, s_bin_rem);
  const uint32_t bstar = s_bin_rem[0];
  uint32_t remaining = s_bin_rem[1];
  if (h[bstar] > uint32_t(kCandMax)) {  // uniform: every thread reads the same count
    dev::block_topk<kTopkThreads>(row, n, K, out);
    return;
  }
  __syncthreads();
  // pass one over warp w's span [b, e): kU x 32 keys loaded before their ballots; the bin's keys
  // appended by one shared atomic a warp and ballot
  int b, e;
  dev::warp_span<NW>(n, warp, b, e);
  const uint32_t lt = (1u << lane) - 1u;
  uint32_t n_gt = 0;
  for (int i0 = b; i0 < e; i0 += 32 * dev::kU) {
    uint32_t k[dev::kU];
    dev::warp_keys(row, i0, e, lane, k);
#pragma unroll
    for (int u = 0; u < dev::kU; ++u) {
      const bool in = i0 + 32 * u + lane < e;
      n_gt += __popc(__ballot_sync(0xffffffffu, in && (k[u] >> 22) > bstar));
      const uint32_t cm = __ballot_sync(0xffffffffu, in && (k[u] >> 22) == bstar);
      if (cm) {  // (warp-uniform)
        uint32_t base = 0;
        if (lane == 0) base = atomicAdd(&s_nc, uint32_t(__popc(cm)));
        base = __shfl_sync(0xffffffffu, base, 0);
        if ((cm >> lane) & 1u) cand[base + __popc(cm & lt)] = (k[u] & 0x3FFFFFu) | (uint32_t(warp) << 22);
      }
    }
  }
  if (lane == 0) s_gt[warp] = n_gt;
  __syncthreads();
  const int nc = int(s_nc);  // = h[bstar]
  uint32_t prefix = bstar << 22, mask = 0xFFC00000u;
  auto key_of = [&](int i) { return (bstar << 22) | (cand[i] & 0x3FFFFFu); };
  for (int shift : {11, 0})
    dev::block_radix_pass<kTopkThreads>(key_of, nc, shift, 11, prefix, mask, remaining, h, part, s_bin_rem);
  // prefix: the K-th best key. The kept keys above it and equal to it, added to their warps' counts
  // (one atomic per run of equal tags in a warp's 32: the keys were appended a warp at a time)
  for (int i0 = 0; i0 < nc; i0 += kTopkThreads) {
    const int i = i0 + tid;
    const bool valid = i < nc;
    const uint32_t c = valid ? cand[i] : 0u, key = (bstar << 22) | (c & 0x3FFFFFu);
    const uint32_t tag = valid ? c >> 22 : 0xFFu;
    const uint32_t peers = __match_any_sync(0xffffffffu, tag);
    const uint32_t gm = __ballot_sync(0xffffffffu, valid && key > prefix);
    const uint32_t em = __ballot_sync(0xffffffffu, valid && key == prefix);
    if (valid && lane == __ffs(peers) - 1) {
      const uint32_t g = __popc(gm & peers), q = __popc(em & peers);
      if (g) atomicAdd(&s_gt[tag], g);
      if (q) atomicAdd(&s_eq[tag], q);
    }
  }
  __syncthreads();
  dev::block_compact_write<kTopkThreads>(row, n, prefix, remaining, s_gt, s_eq, out);
}

}  // namespace

void topk_from_hist(const float* scores, int64_t ld, const uint32_t* hist, const int32_t* pos, int64_t nq, int32_t K,
                    int32_t* sel, cudaStream_t stream) {
  if (nq == 0) return;
  DZ_CHECK(ld < 65536 && nq < (int64_t(1) << 31), "topk_from_hist: rows of ", ld, " keys (16-bit histogram counts)");
  const size_t smem = size_t(kCandMax) * 4;
  CUDA_CHECK(cudaFuncSetAttribute(topk_hist_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  topk_hist_kernel<<<unsigned(nq), kTopkThreads, smem, stream>>>(scores, ld, hist, pos, K, sel);
  CUDA_CHECK_LAUNCH();
}

void topk_from_scores_smem(const float* scores, int64_t ld, const int32_t* pos, int64_t nq, int32_t K, int32_t* sel,
                           cudaStream_t stream) {
  if (nq == 0) return;
  DZ_CHECK(ld <= kTopkMaxKeys && nq < (int64_t(1) << 31), "topk_from_scores_smem: rows of ", ld, " keys (at most ",
           kTopkMaxKeys, ")");
  const size_t smem = size_t(ld) * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(topk_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  topk_smem_kernel<<<unsigned(nq), kTopkThreads, smem, stream>>>(scores, ld, pos, K, sel);
  CUDA_CHECK_LAUNCH();
}

bool indexer_scores_wgmma_takes(int H, int D, const void* q, const void* keys) {
  return (D == 64 || D == 128) && (H == 16 || H == 32 || H == 64) && aligned16(q) && aligned16(keys);
}

void indexer_scores_wgmma(const bf16* q, const float* w, const bf16* keys, int64_t n, int64_t pos0, int H, int D,
                          int64_t S, float* scores, int64_t ld, cudaStream_t stream, uint32_t* hist) {
  if (n == 0) return;
  DZ_CHECK(indexer_scores_wgmma_takes(H, D, q, keys), "indexer_scores_wgmma: H ", H, " D ", D,
           " (H 16 / 32 / 64, D 64 / 128, 16-byte aligned rows) not supported");
  DZ_CHECK(pos0 >= 0 && S >= pos0 + n && S < (int64_t(1) << 31) && n * H < (int64_t(1) << 31) && ld >= pos0 + n,
           "indexer_scores_wgmma: ", n, " queries at ", pos0, " over ", S, " key rows, ld ", ld);
  DZ_CHECK(!hist || indexer_hist_takes(H, ld), "indexer_scores_wgmma: histograms need H 32 / 64 and rows < 65536 keys");
#define DZ_IDXW(d, h)                                                                              \
  if (D == d && H == h) {                                                                          \
    if (hist) return launch<d, h, h != 16>(q, w, keys, n, pos0, S, scores, ld, hist, stream);       \
    return launch<d, h, false>(q, w, keys, n, pos0, S, scores, ld, nullptr, stream);               \
  }
  DZ_IDXW(128, 64) DZ_IDXW(128, 32) DZ_IDXW(128, 16) DZ_IDXW(64, 64) DZ_IDXW(64, 32) DZ_IDXW(64, 16)
#undef DZ_IDXW
}

void indexer_topk_wgmma(const bf16* q, const float* w, const bf16* keys, int64_t S, int64_t T, int64_t pos0, int H,
                        int D, const int32_t* pos, int32_t K, int32_t* sel, int64_t block, float* scratch,
                        uint32_t* hist, cudaStream_t stream, const TopkSide* side) {
  const int64_t ld = pos0 + T;
  DZ_CHECK(block > 0 && scratch && (hist != nullptr) == indexer_hist_takes(H, ld), "indexer_topk_wgmma: block ",
           block, ", histograms ", hist ? "given" : "not given", " for H ", H, " and rows of ", ld, " keys");
  DZ_CHECK(!side || side->made(), "indexer_topk_wgmma: a side stream needs its two pairs of events (TopkSide::create)");
  int64_t i = 0;
  for (int64_t t0 = 0; t0 < T; t0 += block, ++i) {
    const int64_t n = std::min(block, T - t0), b = side ? (i & 1) : 0;
    float* sc = scratch + b * block * ld;  // [n, ld]
    uint32_t* hb = hist ? hist + b * block * 512 : nullptr;
    // block i - 2's Top-K has read this scratch block
    if (side && i >= 2) CUDA_CHECK(cudaStreamWaitEvent(stream, side->freed(b), 0));
    indexer_scores_wgmma(q + t0 * H * D, w + t0 * H, keys, n, pos0 + t0, H, D, S, sc, ld, stream, hb);
    cudaStream_t ts = stream;
    if (side) {
      CUDA_CHECK(cudaEventRecord(side->scored(b), stream));
      CUDA_CHECK(cudaStreamWaitEvent(side->stream, side->scored(b), 0));
      ts = side->stream;
    }
    if (hb) topk_from_hist(sc, ld, hb, pos + t0, n, K, sel + t0 * K, ts);
    else topk_from_scores(sc, ld, pos + t0, n, K, sel + t0 * K, ts);
    if (side) CUDA_CHECK(cudaEventRecord(side->freed(b), side->stream));
  }
  // the side stream runs in order: its last event covers every Top-K
  if (side && i > 0) CUDA_CHECK(cudaStreamWaitEvent(stream, side->freed((i - 1) & 1), 0));
}

}  // namespace dz::cuda
