// Grouped MoE expert GEMMs on tensor cores (see moe_gemm.cuh).
//
// One persistent block per multiprocessor, 128 output rows x 256 B-rows per work item (plain: 256
// output columns of one W; SwiGLU: 128 columns of Wg and the same 128 of Wu, so the thread that
// holds g[r, c] also holds u[r, c]). A work item is (expert, 128-row pair of the expert's 64-row
// tiles, column tile), items numbered expert by expert, column tile fastest, and dealt to the
// blocks round-robin. Each block first copies offsets into shared memory and scans the per-expert
// pair counts there, so mapping an item to its rows is a shared-memory search.
//
// K runs in steps of 64 through a 4-stage pipeline that is continuous across the block's items:
// loads of the next item start while the current one finishes. Tiles are row-major with 128-byte
// rows whose 16-byte chunks are XOR-swizzled by (row & 7): the tensor-memory-access engine's
// 128-byte swizzle, which is also the layout Hopper's wgmma reads through a shared-memory
// descriptor (wgmma.cuh). Warpgroup wm multiplies A rows 64 wm .. 64 wm + 63 of the item by all
// 256 B rows: four m64n256k16 wgmmas per stage, both operands straight from shared memory, 128 fp32
// accumulators per thread. Same item order, tiles and fp32 accumulation order in both kernels, so
// their outputs are bitwise equal.
//
// Three kernels, by what the shapes allow:
//  - k_moe_gemm_swab ("swap AB"), the plain (non-SwiGLU) GEMMs with TMA loads and no clusters where
//    N >= 2048 and K >= 2048 (swab_shape(); DZ_MOE_GEMM_SWAPAB=1 takes every TMA shape, =0 none): the
//    WEIGHTS on wgmma's M side, an expert's TOKENS on its N side. Production's items are 128 token
//    rows, so each expert's rows pad to a multiple of 128: at GLM-5.3-Flash's shapes (E = 288, top-8,
//    T = 8192: ~228 rows an expert) ~20-28 % of the products are padding. wgmma's N may be any
//    multiple of 8 up to 256, so here an expert of r rows is ceil(r / 256) chunks of balanced size and
//    each pads to 16 (228 -> 240). Item = (expert, token chunk, 128 weight rows = output columns),
//    numbered expert by expert, column tile fastest, dealt round-robin. Per stage (k = 64, 4 stages of
//    48 KiB) thread 0 of the producer loads W_e[n0 .. n0 + 127, k0 .. k0 + 63] (one TMA box) and the
//    64-row token boxes the products read (1 to 4); consumer warpgroup wm multiplies weight rows
//    64 wm .. + 63 by the token tile from its row b, wgmma m64nNk16 with N = the chunk's rows rounded
//    up to 16 (a warp-uniform switch over 16 instantiations), N / 2 of the 128 fp32 accumulators.
//    Epilogue transposed (y[token][column]): a warp's 16 columns x 64 tokens at a time through its
//    staging tile by stmatrix.trans, each token's 16 columns (one 32-byte sector) out as two 16-byte
//    stores. A chunk within 256 rows of n = offsets[E] has its tile moved up to end at n (products
//    from row b = (r0 - a0) rounded down to 16, so b + N <= 256); n < 256: the producer's 128 threads
//    load the tokens. Same fp32 order over k as k_moe_gemm_ws: its outputs are bitwise those of the
//    other kernels (the harness checks it). Measured on the H200 (2026-12-03, one command,
//    docs/perf/experiments_2026-12-03d.txt), against k_moe_gemm_ws: GLM-5.3-Flash T = 8192 gate / up
//    1.73 vs 2.35 ms (uniform routing), 2.13 vs 2.67 (the bench's skewed routing), down 2.05 vs 2.13 /
//    2.44 vs 2.54; but slower at small K or N (Qwen3.5 down, K = 512: 1.17 vs 1.01 ms; Kimi-Linear
//    down, K = 1024: 2.54 vs 2.08; Qwen3.5 gate / up, N = 512: 0.29 vs 0.27 at T = 8192), where an
//    item's few k stages do not hide its transposed epilogue: hence swab_shape().
//  - k_moe_gemm_ws, TMA loads (K % 8 == 0, 16-byte aligned pointers, the maps encodable), warp
//    specialised as FlashAttention-3 is: warpgroup 0 is the producer (thread 0 issues one 2-D tensor
//    copy per operand and stage onto the stage's full mbarrier; registers given away with
//    setmaxnreg.dec), warpgroups 1 and 2 the consumers (setmaxnreg.inc), each keeping one stage's
//    products in flight while it waits for the next and releasing a stage (empty mbarrier, one
//    arrival per warp) once the products that read it are done; the producer runs ahead across
//    items, so the next item's loads overlap the epilogue. An item whose rows lie in one 64-row half (an
//    expert's tail of <= 64 rows) is split by columns in the plain kernel: both warpgroups multiply
//    that half, each by 128 of the B rows (m64n128), instead of one idling (2026-12-03: GLM-5.3-Flash's
//    expert GEMMs 2.69 -> 2.58 / 2.61 ms on the bench's routing, 171 of 665 items; docs/perf); in the
//    SwiGLU and cluster kernels the warpgroup with no rows issues no products for it. The epilogue goes through a
//    per-warp staging tile, 64 columns at a time, out as whole 128-byte row lines (the fragments'
//    own bf16x2 stores fill half of each 32-byte sector). Rows past the expert's end (A) or past N
//    (B) are loaded as they are (the next expert's rows, or zeros past the tensor) and only their
//    outputs are dropped; k past K is zero-filled. A's box never crosses the last row
//    n = offsets[E] (the host does not know n): a tail item's box is moved up to end at n, and when
//    n < 128 the producer's 128 threads load A themselves. (Against the non-specialised TMA kernel
//    it replaced, one device command, docs/perf/moe_gemm_ws_*.txt: Qwen3.5 T = 32768 gate/up 0.829
//    vs 1.010 ms, down 0.967 vs 1.572; GLM-5.3-Flash T = 8192 2.174 vs 2.187, 2.184 vs 2.393.)
//    Its plain GEMMs can run as 2-CTA clusters (clusters(): not by default), a cluster's item being
//    two pairs of one expert and one column tile: the two CTAs share nothing, the cluster only puts
//    the two readers of one weight tile on one GPC (11 % less DRAM traffic).
//    Multicasting the weight tile into both CTAs was tried and ran 1.5x slower: each stage then
//    waits for both CTAs' consumers (docs/perf/experiments_2026-12-03.txt; git history of
//    kernels/dev/moe_gemm/moe_gemm_mc.cu).
//    Gathered token rows (grouped_gemm_tc's arow, the dispatch's perm): the producer warpgroup's 128
//    threads cp.async A's 128 rows of each stage through perm (8 a thread; each row's token index
//    held by one of its row's eight lanes and shuffled to the others), one
//    cp.async.mbarrier.arrive.noinc each on the stage's full barrier (129 arrivals with thread 0's
//    expect_tx for B's TMA); the consumers fence.proxy.async before their wgmmas read it. The
//    swap-AB kernel does not gather (grouped_gemm_gathers_rows says why).
//  - k_moe_gemm, 8 warps that all load and all multiply: cp.async (K % 8 == 0 without TMA), element
//    loads (K % 8 != 0 or unaligned pointers), and MXFP4 weights (MX4: A by cp.async; each thread
//    loads the 4 packed bytes and the scale of each of its B chunks into registers, and one
//    produce() later, while the stages in between are multiplied, decodes them to 8 bf16 each and
//    stores them swizzled). Each thread fills 16-byte chunks, zero past the expert, N and K; each
//    stage's products are waited for before the (divergent) producer code runs (with a wgmma in
//    flight across it ptxas serialises them, C7518) and the other warpgroup's products fill the gap.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "glu.cuh"
#include "mma_sm80.cuh"
#include "moe_gemm.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dz::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kBM = 128;        // rows per item
constexpr int kBR = 256;        // B rows per item (plain: columns; SwiGLU: 128 gate + 128 up)
constexpr int kBK = 64;         // k per stage
constexpr int kStages = 4;
constexpr int kRowB = kBK * 2;  // bytes per tile row (8 chunks of 16 bytes)
constexpr int kAStage = kBM * kRowB;
constexpr int kBStage = kBR * kRowB;
constexpr int kStageB = kAStage + kBStage;
constexpr int kPipeB = kStages * kStageB;  // 192 KiB
constexpr int kBarB = 64;                  // mbarriers: full[kStages], empty[kStages]
constexpr int kMaxE = 4096;

enum Mode { kTma = 0, kCpAsync = 1, kElem = 2 };  // kTma: k_moe_gemm_ws; the others: k_moe_gemm

__device__ __forceinline__ void st_shared16(uint32_t saddr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(saddr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
// v = act(g, u) for two columns (glu.cuh: SwiGLU with fast exp, its clamp, SiTU).
__device__ __forceinline__ void swiglu_pair(float& g0, float& g1, float u0, float u1, const GluAct& act) {
  g0 = glu_dev(act, g0, u0);
  g1 = glu_dev(act, g1, u1);
}

// 8 MXFP4 elements (the nibbles of pk, element j in bits 4j..4j+3) with E8M0 scale code sc -> 8
// bf16 in a 16-byte chunk (element 0 at the lowest address). Exact: e2m1 * 2^(sc - 127) has one
// mantissa bit, and 2^-128 at the smallest is a subnormal of fp32 and of bf16.
__device__ __forceinline__ uint4 mx4_decode8(uint32_t pk, uint32_t sc) {
  const float s = sc ? __int_as_float(int(sc << 23)) : __int_as_float(0x00400000);  // 2^(sc-127); sc 0: 2^-127
  uint32_t w[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    float v[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const uint32_t n = (pk >> (8 * h + 4 * q)) & 15u, mag = n & 7u;
      // |e2m1|: 0, 0.5 (mag 1), else (2 + m) * 2^(e - 2) with e = mag >> 1, m = mag & 1
      const uint32_t bits = mag == 0u ? 0u : mag == 1u ? 0x3F000000u : ((126u + (mag >> 1)) << 23) | ((mag & 1u) << 22);
      v[q] = __uint_as_float(bits | ((n & 8u) << 28)) * s;
    }
    const __nv_bfloat162 b = __floats2bfloat162_rn(v[0], v[1]);
    w[h] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

struct Args {
  const bf16* xs;
  const bf16* w0;  // W (plain) or Wg
  const bf16* w1;  // Wu (SwiGLU) or = w0
  const int32_t* offsets;
  bf16* y;
  int E, N, K;
  int n_col_tiles;  // column tiles per pair
  int vec_store;    // N even and y 4-byte aligned: bf16x2 stores
  int stage_epi;    // k_moe_gemm_ws: the per-warp epilogue staging tiles fit in shared memory
  GluAct act;       // SwiGLU / clamp / SiTU
  // plain BF16 kernels: A row r is xs[arow[r] / top_k] (xs the tokens [T, K], arow the dispatch's
  // perm: the gather before the expert GEMMs done by their loaders); nullptr: A row r is xs[r]
  const int32_t* arow;
  int top_k;
  // MXFP4 weights (MX4 kernels): packed [E*N, K/2] and scales [E*N, K/32] of W / Wg and of Wu
  const uint8_t *q0, *q1, *s0, *s1;
};
struct Maps {  // TMA descriptors of the warp-specialised kernel: xs, W / Wg, Wu
  CUtensorMap a, b0, b1;
};
// Row r of the A operand (elements): xs + r K, or the gathered token row xs + (arow[r] / top_k) K.
__device__ __forceinline__ int64_t a_row_off(const Args& a, int64_t r) {
  return (a.arow ? int64_t(__ldg(a.arow + r) / a.top_k) : r) * a.K;
}

struct Item {
  int r0, rows, e, n0;
  int a0;  // first row of the A tile in shared memory (r0, or moved up for a TMA tail item)
};

// The expert of item number p of an exclusive scan s_cum [E + 1] over the experts' item counts:
// the largest e with s_cum[e] <= p (p < s_cum[E]; experts with no items are skipped). A block's
// items ascend, so the search runs forward from the last item's expert (e_hint, < 0 the first time:
// binary search); e_hint is updated.
__device__ __forceinline__ int expert_of(int p, const int32_t* s_cum, int E, int& e_hint) {
  int lo = e_hint;
  if (lo < 0) {
    lo = 0;
    int hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_cum[mid] <= p)
        lo = mid;
      else
        hi = mid - 1;
    }
  } else {
    while (s_cum[lo + 1] <= p) ++lo;
  }
  e_hint = lo;
  return lo;
}

// Item of the plain / SwiGLU kernels: its expert by expert_of over the pairs' scan s_poff. CL pairs per item (2: a 2-CTA cluster's item j, whose
// CTA `rank` takes the expert's pair 2 j + rank, rows = 0 when the expert has no such pair).
template <int BN, int CL = 1>
__device__ __forceinline__ Item map_item(int item, int rank, int n_col_tiles, const int32_t* s_off,
                                         const int32_t* s_poff, int E, bool shift_tail, int& e_hint) {
  const int p = item / n_col_tiles, nt = item - p * n_col_tiles;
  const int lo = expert_of(p, s_poff, E, e_hint);
  Item it;
  it.e = lo;
  it.r0 = s_off[lo] + ((p - s_poff[lo]) * CL + rank) * kBM;
  it.rows = min(kBM, s_off[lo + 1] - it.r0);
  if (CL > 1 && it.rows <= 0) it.r0 = s_off[lo], it.rows = 0;
  it.n0 = nt * BN;
  const int n = s_off[E];
  it.a0 = (shift_tail && it.r0 + kBM > n) ? n - kBM : it.r0;
  return it;
}

// Warp 0: s_cum[e] = exclusive scan over experts of items(e) (s_off complete in shared memory
// first), s_cum[E] the total.
template <class Items>
__device__ __forceinline__ void scan_items(int32_t* s_cum, int E, int lane, Items items) {
  const int per = (E + 31) / 32, b = min(E, lane * per), en = min(E, b + per);
  int sum = 0;
  for (int e = b; e < en; ++e) sum += items(e);
  int incl = sum;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  int run = incl - sum;
  for (int e = b; e < en; ++e) {
    s_cum[e] = run;
    run += items(e);
  }
  if (lane == 31) s_cum[E] = incl;
}

// s_poff: the items of each expert, ceil(pairs / CL) with pairs its 128-row pairs of 64-row tiles.
template <int CL = 1>
__device__ __forceinline__ void scan_pairs(const int32_t* s_off, int32_t* s_poff, int E, int lane) {
  scan_items(s_poff, E, lane, [&](int e) { return ((s_off[e + 1] - s_off[e] + kBM - 1) / kBM + CL - 1) / CL; });
}

// One stage's products of a warpgroup: its 64 A rows (a_off into the stage) by the 256 B rows, k = 64.
// (accumulate: false on an item's first stage)
__device__ __forceinline__ void mma_stage(float (&acc)[kBR / 2], uint32_t st, uint32_t a_off, bool accumulate) {
  const uint64_t da = wgmma_desc_sw128(st + a_off), db = wgmma_desc_sw128(st + kAStage);
  wgmma_fence_regs(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
    wgmma_ss<256>(acc, wgmma_desc_add(da, kk * 32), wgmma_desc_add(db, kk * 32), accumulate || kk != 0);
  wgmma_commit();
}

// One stage of a split item: this warpgroup's 64 rows at a_off by B rows b_row0 .. + 127
// (wgmma m64n128 into acc[0 .. 63]: the fragments of columns 0 .. 127 of the m64n256 layout).
__device__ __forceinline__ void mma_stage_half(float (&acc)[kBR / 2], uint32_t st, uint32_t a_off, uint32_t b_off,
                                               bool accumulate) {
  float (&lo)[64] = *reinterpret_cast<float(*)[64]>(&acc[0]);
  const uint64_t da = wgmma_desc_sw128(st + a_off), db = wgmma_desc_sw128(st + kAStage + b_off);
  wgmma_fence_regs(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
    wgmma_ss<128>(lo, wgmma_desc_add(da, kk * 32), wgmma_desc_add(db, kk * 32), accumulate || kk != 0);
  wgmma_commit();
}

// Epilogue of one warp straight from its fragments: registers -> y (rows outside the item and
// columns past N are dropped). wr: the warp's first shared-memory row.
template <bool SWIGLU, int BN>
__device__ __forceinline__ void store_fragments(const float (&acc)[kBR / 2], const Args& a, const Item& cur, int wr,
                                                int lane) {
  const int N = a.N;
  const int sh = cur.r0 - cur.a0;  // shared-memory row of the item's first row
  const int cbase = cur.n0 + (lane & 3) * 2;
  const bool full_cols = a.vec_store && cur.n0 + BN <= N;
  if (full_cols && sh <= wr && wr + 16 <= sh + cur.rows) {
    // all 16 rows and all columns of this warp are inside: no per-element checks
    bf16* yw = a.y + (int64_t(cur.a0) + wr + (lane >> 2)) * N + cbase;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      bf16* yr = yw + int64_t(hf * 8) * N;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        float v0 = acc[4 * j + 2 * hf], v1 = acc[4 * j + 2 * hf + 1];
        if constexpr (SWIGLU) swiglu_pair(v0, v1, acc[4 * (j + 16) + 2 * hf], acc[4 * (j + 16) + 2 * hf + 1], a.act);
        *reinterpret_cast<__nv_bfloat162*>(yr + j * 8) = __floats2bfloat162_rn(v0, v1);
      }
    }
  } else {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int lr = wr + (lane >> 2) + hf * 8;  // shared-memory row
      if (lr < sh || lr >= sh + cur.rows) continue;
      bf16* yr = a.y + (int64_t(cur.a0) + lr) * N + cbase;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        float v0 = acc[4 * j + 2 * hf], v1 = acc[4 * j + 2 * hf + 1];
        if constexpr (SWIGLU) swiglu_pair(v0, v1, acc[4 * (j + 16) + 2 * hf], acc[4 * (j + 16) + 2 * hf + 1], a.act);
        const int col = cbase + j * 8;
        if (full_cols) {
          *reinterpret_cast<__nv_bfloat162*>(yr + j * 8) = __floats2bfloat162_rn(v0, v1);
        } else if (a.vec_store) {
          if (col < N) *reinterpret_cast<__nv_bfloat162*>(yr + j * 8) = __floats2bfloat162_rn(v0, v1);
        } else {
          if (col < N) yr[j * 8] = __float2bfloat16_rn(v0);
          if (col + 1 < N) yr[j * 8 + 1] = __float2bfloat16_rn(v1);
        }
      }
    }
  }
}

template <bool SWIGLU, int MODE, bool MX4 = false>
__global__ void __launch_bounds__(kThreads, 1) k_moe_gemm(const __grid_constant__ Args a) {
  static_assert(!MX4 || MODE == kCpAsync, "MXFP4 weights: A by cp.async, B decoded by the threads");
  constexpr int BN = SWIGLU ? kBR / 2 : kBR;  // output columns per item
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // 1024-byte aligned base (the 128-byte swizzle repeats every 8 rows of 128 bytes).
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int E = a.E, N = a.N, K = a.K;
  const uint32_t sbase = smem_u32(smem);
  int32_t* s_off = reinterpret_cast<int32_t*>(smem + kPipeB + kBarB);
  int32_t* s_poff = s_off + (E + 1);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // ---- offsets to shared memory, pairs of 64-row tiles per expert scanned (warp 0) ----
  for (int i = tid; i <= E; i += kThreads) s_off[i] = a.offsets[i];
  __syncthreads();
  if (warp == 0) scan_pairs(s_off, s_poff, E, lane);
  __syncthreads();

  const int total = s_poff[E] * a.n_col_tiles;  // < 2^31 (host: max_tiles * column tiles)
  if (int(blockIdx.x) >= total) return;
  const int G = gridDim.x;
  const int nq = (total - int(blockIdx.x) + G - 1) / G;  // items of this block
  const int k_iters = (K + kBK - 1) / kBK;
  const int64_t total_iters = int64_t(nq) * k_iters;
  const bool shift_tail = false;  // (TMA only: these loaders zero the rows past the expert)

  // ---- producer ----
  // Thread-filled tiles: thread loads chunk pch of rows prow + 32 i (A: i < 4, B: i < 8).
  const int prow = tid >> 3, pch = tid & 7;
  const uint32_t pdst = uint32_t(prow * kRowB + ((pch ^ (prow & 7)) << 4));
  const int64_t rstride = int64_t(32) * K;  // 32 rows, elements
  const bf16 *pa = a.xs, *pb0 = a.w0, *pb1 = a.w0;
  uint32_t rmask = 0;  // bit i: A row i valid; 4 + i: B row i valid
  // MX4: this thread's packed-byte and scale rows (chunk pch of B rows prow + 32 i), and the loads
  // of one stage held in registers until the next produce() stores them (stage mx_stage; -1: none)
  const uint8_t *pq0 = nullptr, *pq1 = nullptr, *ps0 = nullptr, *ps1 = nullptr;
  uint32_t mx_pk[8], mx_sc[8];
  int mx_stage = -1;
  const int64_t qstride = int64_t(32) * (K / 2), sstride = int64_t(32) * (K / 32);  // 32 rows
  Item ld_it;
  int ld_k = 0;
  int ld_q = 0, ld_e = -1;
  auto setup_producer = [&](int item) {
    ld_it = map_item<BN>(item, 0, a.n_col_tiles, s_off, s_poff, E, shift_tail, ld_e);
    const Item& it = ld_it;
    {
      pa = a.xs + (int64_t(it.r0) + prow) * K + pch * 8;
      const int64_t wrow = (int64_t(it.e) * N + it.n0 + prow) * K + pch * 8;
      if constexpr (MX4) {
        const int64_t qrow = int64_t(it.e) * N + it.n0 + prow;
        pq0 = a.q0 + qrow * (K / 2) + pch * 4;
        ps0 = a.s0 + qrow * (K / 32) + pch / 4;
        pq1 = SWIGLU ? a.q1 + qrow * (K / 2) + pch * 4 : pq0 + 4 * qstride;
        ps1 = SWIGLU ? a.s1 + qrow * (K / 32) + pch / 4 : ps0 + 4 * sstride;
      }
      int lim0 = N - it.n0, lim1 = SWIGLU ? lim0 : lim0 - 128;
      if constexpr (!MX4) {
        pb0 = a.w0 + wrow;
        pb1 = SWIGLU ? a.w1 + wrow : pb0 + 4 * rstride;
      }
      rmask = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = prow + 32 * i;
        rmask |= uint32_t(r < it.rows) << i;
        rmask |= uint32_t(r < lim0) << (4 + i);
        rmask |= uint32_t(r < lim1) << (8 + i);
      }
    }
  };
  auto load_stage = [&](int stage) {
    const uint32_t sA = sbase + stage * kStageB, sB = sA + kAStage;
    const int kc = ld_k * kBK + pch * 8;
    if constexpr (MODE == kCpAsync) {
      const bool kin = kc < K;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = kin && ((rmask >> i) & 1);
        // (gathered rows: the token row looked up per stage, only for rows inside the item: a row past
        // the last expert has no perm entry; these loaders are not the fast path)
        const bf16* src = !ok ? a.xs : a.arow ? a.xs + a_row_off(a, ld_it.r0 + prow + 32 * i) + kc : pa + i * rstride;
        cp_async16(sA + pdst + i * 32 * kRowB, src, ok);
      }
      if constexpr (MX4) {  // 4 packed bytes + the scale of each chunk, stored by the next produce()
        const int64_t qo = int64_t(ld_k) * (kBK / 2), so = int64_t(ld_k) * (kBK / 32);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const bool ok = kin && ((rmask >> (4 + i)) & 1);
          mx_pk[i] = ok ? __ldg(reinterpret_cast<const uint32_t*>((i < 4 ? pq0 : pq1) + (i & 3) * qstride + qo)) : 0u;
          mx_sc[i] = ok ? uint32_t(__ldg((i < 4 ? ps0 : ps1) + (i & 3) * sstride + so)) : 127u;
        }
        mx_stage = stage;
      } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const bool ok = kin && ((rmask >> (4 + i)) & 1);
        const bf16* src = (i < 4 ? pb0 : pb1) + (i & 3) * rstride;
        cp_async16(sB + pdst + i * 32 * kRowB, ok ? src : a.w0, ok);
      }
      }
    } else {
      auto fill = [&](uint32_t dst, const bf16* src, bool rok) {
        uint32_t w[4];
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          uint32_t lo = 0, hi = 0;
          if (rok && kc + 2 * h < K) lo = __ldg(reinterpret_cast<const unsigned short*>(src + 2 * h));
          if (rok && kc + 2 * h + 1 < K) hi = __ldg(reinterpret_cast<const unsigned short*>(src + 2 * h + 1));
          w[h] = lo | (hi << 16);
        }
        st_shared16(dst, make_uint4(w[0], w[1], w[2], w[3]));
      };
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool rok = (rmask >> i) & 1;
        const bf16* src = a.arow && rok ? a.xs + a_row_off(a, ld_it.r0 + prow + 32 * i) + kc : pa + i * rstride;
        fill(sA + pdst + i * 32 * kRowB, src, rok);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i)
        fill(sB + pdst + i * 32 * kRowB, (i < 4 ? pb0 : pb1) + (i & 3) * rstride, (rmask >> (4 + i)) & 1);
    }
    pa += kBK;
    pb0 += kBK;
    pb1 += kBK;
  };
  // MX4: the B chunks loaded by the last produce(), decoded into their stage.
  auto mx_store = [&]() {
    if constexpr (MX4) {
      if (mx_stage < 0) return;
      const uint32_t sB = sbase + mx_stage * kStageB + kAStage;
#pragma unroll
      for (int i = 0; i < 8; ++i) st_shared16(sB + pdst + i * 32 * kRowB, mx4_decode8(mx_pk[i], mx_sc[i]));
      mx_stage = -1;
    }
  };
  auto produce = [&](int stage) {
    mx_store();  // that stage is read two iterations from now, after block barriers
    if (ld_q < nq) {
      load_stage(stage);
      if (++ld_k == k_iters) {
        ld_k = 0;
        if (++ld_q < nq) setup_producer(blockIdx.x + ld_q * G);
      }
    }
    cp_commit();
  };

  // ---- consumer: warpgroup wm multiplies A rows wm * 64 .. + 63 by all 256 B rows (wgmma) ----
  const int wm = warp >> 2, wq = warp & 3;
  const uint32_t a_off = uint32_t(wm * 64 * kRowB);
  // Stages (cp.async, element loads, MX4 decode) are refilled by every thread after the block
  // barrier of the next wait_full, which each warp reaches only after its products of the stage
  // completed (wgmma_wait<0>).
  // Wait until the next stage is filled: the cp.async groups and a block barrier. The async-proxy
  // fence makes the threads' shared-memory stores visible to wgmma.
  auto wait_full = [&]() {
    cp_wait<kStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  };

  float acc[kBR / 2];  // [64 x 256] per warpgroup (wgmma.cuh: d[4 j + q])
#pragma unroll
  for (int i = 0; i < kBR / 2; ++i) acc[i] = 0.f;

  setup_producer(blockIdx.x);
  int mm_e = -1;
  Item cur = map_item<BN>(blockIdx.x, 0, a.n_col_tiles, s_off, s_poff, E, shift_tail, mm_e);
  int mm_k = 0;
  int mm_q = 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) produce(s);
  int stage = 0, ld_stage = kStages - 1;

  // Every warpgroup multiplies all its 64 rows (rows outside the item are dropped in the epilogue).
  for (int64_t g = 0; g < total_iters; ++g) {
    // Refill the stage read in iteration g - 1 (for iteration g + 3), before this iteration's
    // products, so three stages of loads stay in flight: after the block barrier of wait_full,
    // which every warp reaches only after its products of g - 1 completed.
    wait_full();
    produce(ld_stage);
    ld_stage = ld_stage + 1 == kStages ? 0 : ld_stage + 1;
    mma_stage(acc, sbase + stage * kStageB, a_off, mm_k != 0);
    // Nothing stays in flight across the (divergent) producer code: ptxas would serialise the
    // wgmmas otherwise (C7518). The other warpgroup's products keep the tensor cores busy meanwhile.
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    stage = stage + 1 == kStages ? 0 : stage + 1;

    if (++mm_k == k_iters) {
      store_fragments<SWIGLU, BN>(acc, a, cur, wm * 64 + wq * 16, lane);
      mm_k = 0;
      if (++mm_q < nq) cur = map_item<BN>(blockIdx.x + mm_q * G, 0, a.n_col_tiles, s_off, s_poff, E, shift_tail, mm_e);
    }
  }
  cp_wait<0>();
}

constexpr int kThreadsWs = 384;  // producer warpgroup + 2 consumer warpgroups

// Shared memory: production's layout (pipeline, mbarriers, offsets), then one epilogue staging
// tile per consumer warp: 16 rows x 64 bf16 columns, rows 144 bytes apart (conflict-free both ways).
constexpr int kStgRowB = 144, kStgWarpB = 16 * kStgRowB;
__host__ __device__ constexpr size_t stg_offset(int E) { return (size_t(kPipeB + kBarB) + 8 * size_t(E + 1) + 15) & ~size_t(15); }
size_t smem_ws(int E, bool staged) { return 1024 + stg_offset(E) + (staged ? 8 * size_t(kStgWarpB) : 0); }

// CL = 2: launched as 2-CTA clusters, item j of a cluster is two 128-row pairs of one expert and one
// column tile, one pair per CTA (the CTAs share nothing: the cluster only places the two, which read
// the same weight tile at about the same time, on one GPC; clusters() says when it runs). A CTA
// whose expert has no second pair still loads the weight tile and runs through the stages, without
// products: the two CTAs then stay on the same item. (Skipping such items instead let the CTAs drift
// apart: 0.92x / 0.83x of the plain kernel on GLM-5.3-Flash's gate / down, against 1.25x / 1.09x.)
template <bool SWIGLU, int CL>
__global__ void __launch_bounds__(kThreadsWs, 1) k_moe_gemm_ws(const __grid_constant__ Args a,
                                                              const __grid_constant__ Maps maps) {
  constexpr int BN = SWIGLU ? kBR / 2 : kBR;  // output columns per item
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int E = a.E, N = a.N, K = a.K;
  const uint32_t sbase = smem_u32(smem), sbar = sbase + kPipeB;
  int32_t* s_off = reinterpret_cast<int32_t*>(smem + kPipeB + kBarB);
  int32_t* s_poff = s_off + (E + 1);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  auto full = [&](int s) { return sbar + 8 * s; };
  auto empty = [&](int s) { return sbar + 8 * (kStages + s); };

  // ---- offsets to shared memory, pairs of 64-row tiles per expert scanned (warp 0) ----
  for (int i = tid; i <= E; i += kThreadsWs) s_off[i] = a.offsets[i];
  __syncthreads();
  if (warp == 0) scan_pairs<CL>(s_off, s_poff, E, lane);
  const int n_rows = s_off[E];  // (s_off is complete after the first barrier)
  // TMA: A's box must stay inside rows [0, n); with n < 128 the producer's threads load A. Gathered
  // rows (a.arow): the producer's threads cp.async A's rows of the item (zeros outside it).
  const bool gat = a.arow != nullptr;
  const bool a_thr = n_rows < kBM;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // thread 0's expect_tx (+ the other producer threads; gathered: + each thread's cp.async arrival)
      mbar_init(full(s), gat ? 129u : a_thr ? 128u : 1u);
      mbar_init(empty(s), 8);                 // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  // a cluster's CTAs are consecutive blocks (rank = blockIdx.x % CL); both take the cluster's items
  const int rank = int(blockIdx.x) % CL, slot = int(blockIdx.x) / CL, G = int(gridDim.x) / CL;
  const int total = s_poff[E] * a.n_col_tiles;
  if (slot >= total) return;
  const int nq = (total - slot + G - 1) / G;  // items of this block
  const int k_iters = (K + kBK - 1) / kBK;
  const bool shift_tail = !a_thr;

  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    if (!a_thr && !gat && tid != 0) return;
    const int prow = tid >> 3, pch = tid & 7;  // a_thr / gat: chunk pch of A rows prow + 16 i
    int e_hint = -1;
    int f = 0;  // fill index over the block's stages
    for (int q = 0; q < nq; ++q) {
      const Item it = map_item<BN, CL>(slot + q * G, rank, a.n_col_tiles, s_off, s_poff, E, shift_tail, e_hint);
      const int brow = it.e * N + it.n0;
      // gat: A row prow + 16 i as a token row (-1: outside the item, zeros) is held by lane pch = i of
      // the eight lanes that load that row's chunks, and shuffled to the others at each stage (eight
      // indices a thread would not fit the producer's 56 registers)
      int32_t my_tok = -1;
      if (gat) {
        const int sh = it.r0 - it.a0, r = prow + 16 * pch;
        if (r >= sh && r < sh + it.rows) my_tok = __ldg(a.arow + it.a0 + r) / a.top_k;
      }
      for (int kk = 0; kk < k_iters; ++kk, ++f) {
        const int s = f % kStages, u = f / kStages;
        if (u > 0) mbar_wait(empty(s), (u - 1) & 1);
        const uint32_t sA = sbase + s * kStageB, sB = sA + kAStage;
        const int k0 = kk * kBK;
        if (gat) {  // the item's A rows by cp.async (zero fill past K and outside the item)
          const bool kin = k0 + pch * 8 < K;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int r = prow + 16 * i;
            const int tok = __shfl_sync(0xffffffffu, my_tok, (lane & ~7) | i);
            const bool ok = kin && tok >= 0;
            cp_async16(sA + uint32_t(r * kRowB + ((pch ^ (r & 7)) << 4)),
                       ok ? a.xs + int64_t(tok) * K + k0 + pch * 8 : a.xs, ok);
          }
          cp_async_mbar_arrive(full(s));
        } else if (a_thr) {  // n < 128: A rows from the threads (16-byte loads, zero past n and K)
          const int kc = k0 + pch * 8;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int r = prow + 16 * i;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (it.a0 + r < n_rows && kc < K)
              v = __ldg(reinterpret_cast<const uint4*>(a.xs + (int64_t(it.a0) + r) * K + kc));
            st_shared16(sA + uint32_t(r * kRowB + ((pch ^ (r & 7)) << 4)), v);
          }
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          if (tid != 0) mbar_arrive(full(s));
        }
        if (tid == 0) {
          const bool load_a = !a_thr && !gat && it.rows > 0;
          mbar_expect_tx(full(s), uint32_t(load_a ? kStageB : kBStage));
          if (load_a) tma_load_2d(sA, &maps.a, k0, it.a0, full(s));
          if constexpr (SWIGLU) {
            tma_load_2d(sB, &maps.b0, k0, brow, full(s));
            tma_load_2d(sB + kBStage / 2, &maps.b1, k0, brow, full(s));
          } else if constexpr (CL > 1) {  // (the map's box is 128 rows here, as SwiGLU's)
            tma_load_2d(sB, &maps.b0, k0, brow, full(s));
            tma_load_2d(sB + kBStage / 2, &maps.b0, k0, brow + 128, full(s));
          } else {
            tma_load_2d(sB, &maps.b0, k0, brow, full(s));
          }
        }
      }
    }
    return;
  }

  // ---- consumers: warpgroup wm multiplies A rows wm * 64 .. + 63 by all 256 B rows ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
  const int wm = wg - 1, wq = warp & 3;
  const uint32_t a_off = uint32_t(wm * 64 * kRowB);
  float acc[kBR / 2];  // [64 x 256] per warpgroup (wgmma.cuh: d[4 j + q])
#pragma unroll
  for (int i = 0; i < kBR / 2; ++i) acc[i] = 0.f;
  int e_hint = -1;
  int f = 0;
  for (int q = 0; q < nq; ++q) {
    // A warpgroup whose 64 rows hold none of the item's (an expert's tail of <= 64 rows, about half
    // the experts: ~a tenth of the MMA work at GLM-5.3-Flash's ~230 rows per expert) issues no
    // products for it and only releases the stages; the other warpgroup has the tensor cores alone.
    // An item whose rows lie in one 64-row half (plain kernel, no clusters) is split by columns:
    // both warpgroups take that half, warpgroup wm columns 128 wm .. + 127.
    bool busy;
    int half;  // >= 0: the split item's half
    {
      int e2 = e_hint;
      const Item it = map_item<BN, CL>(slot + q * G, rank, a.n_col_tiles, s_off, s_poff, E, shift_tail, e2);
      const int lo = it.r0 - it.a0;
      busy = it.rows > 0 && wm * 64 < lo + it.rows && wm * 64 + 64 > lo;
      half = (SWIGLU || CL > 1 || it.rows == 0) ? -1 : lo + it.rows <= 64 ? 0 : lo >= 64 ? 1 : -1;
    }
    for (int kk = 0; kk < k_iters; ++kk, ++f) {
      const int s = f % kStages, u = f / kStages;
      mbar_wait(full(s), u & 1);
      if (gat) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async rows -> wgmma
      if (half >= 0)
        mma_stage_half(acc, sbase + s * kStageB, uint32_t(half * 64 * kRowB), uint32_t(wm * 128 * kRowB), kk != 0);
      else if (busy)
        mma_stage(acc, sbase + s * kStageB, a_off, kk != 0);
      // the previous stage's products are done: release it (lane 0 of each warp, predicated)
      wgmma_wait<1>();
      if (kk > 0) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty((f - 1) % kStages));
      }
    }
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty((f - 1) % kStages));

    // ---- epilogue: registers -> y (rows outside the item and columns past N are dropped) ----
    // (the item is mapped here, not before the loop: nothing of it stays live across the products)
    const Item cur0 = map_item<BN, CL>(slot + q * G, rank, a.n_col_tiles, s_off, s_poff, E, shift_tail, e_hint);
    if (half >= 0) {  // a split item: this warpgroup's 128 columns of the half's rows, from acc[0 .. 63]
      if constexpr (!SWIGLU) {
        Item cur = cur0;
        cur.n0 += wm * 128;
        const int wr = half * 64 + wq * 16, sh = cur.r0 - cur.a0;
        if (cur.n0 < N && wr + 16 > sh && wr < sh + cur.rows) store_fragments<false, 128>(acc, a, cur, wr, lane);
      }
      continue;
    }
    const Item& cur = cur0;
    const int sh = cur.r0 - cur.a0;  // shared-memory row of the item's first row
    const int wr = wm * 64 + wq * 16;  // this warp's first shared-memory row
    const bool full_cols = a.vec_store && cur.n0 + BN <= N;
    if (cur.rows == 0 || wr + 16 <= sh || wr >= sh + cur.rows) continue;  // none of this warp's rows is the item's
    if (a.stage_epi && full_cols && (N & 7) == 0 && (reinterpret_cast<uintptr_t>(a.y) & 15) == 0) {
      // Through the warp's staging tile, 64 columns at a time, so that each row goes out as whole
      // 128-byte lines (the fragments' own stores fill half of each 32-byte sector they touch).
      uint8_t* stg = smem + stg_offset(E) + (warp - 4) * kStgWarpB;
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int qd = 0; qd < BN / 64; ++qd) {
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = qd * 8 + jj;
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            float v0 = acc[4 * j + 2 * hf], v1 = acc[4 * j + 2 * hf + 1];
            if constexpr (SWIGLU) swiglu_pair(v0, v1, acc[4 * (j + 16) + 2 * hf], acc[4 * (j + 16) + 2 * hf + 1], a.act);
            *reinterpret_cast<__nv_bfloat162*>(stg + (g + 8 * hf) * kStgRowB + (8 * jj + 2 * t) * 2) =
                __floats2bfloat162_rn(v0, v1);
          }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int rl = (lane >> 3) + 4 * i, c = lane & 7, lr = wr + rl;
          if (lr >= sh && lr < sh + cur.rows)
            *reinterpret_cast<uint4*>(a.y + (int64_t(cur.a0) + lr) * N + cur.n0 + qd * 64 + c * 8) =
                *reinterpret_cast<const uint4*>(stg + rl * kStgRowB + c * 16);
        }
        __syncwarp();
      }
    } else {
      store_fragments<SWIGLU, BN>(acc, a, cur, wr, lane);
    }
  }
}

// ---- swap AB: weights on wgmma's M side, tokens on its N side (k_moe_gemm_swab) ----
constexpr int kSwW = 128;                  // weight rows (output columns) per item: 64 per consumer warpgroup
constexpr int kSwT = 256;                  // token rows per chunk, at most (wgmma N <= 256)
constexpr int kSwGran = 16;                // token rows padded to this (wgmma N)
constexpr int kSwBox = 64;                 // token rows per TMA box
constexpr int kSwWStage = kSwW * kRowB;    // 16 KiB of weights, then the token tile
constexpr int kSwBoxB = kSwBox * kRowB;    // 8 KiB
static_assert(kSwWStage + kSwT * kRowB == kStageB, "production's stage size: [128 w | 256 tokens] x 64 k");
static_assert(kSwT % kSwBox == 0 && kSwBox % kSwGran == 0 && kSwGran % 8 == 0, "tile row groups of 8 (1 KiB)");

// A swap-AB item. Token column c of the products is tile row b + c, i.e. xs / y row a0 + b + c; the
// item's tokens are the columns r0 - a0 - b .. + rows - 1.
struct SwItem {
  int e, r0, rows, n0;
  int a0;  // xs row of tile row 0 (r0, or moved up to end at n for a tail chunk)
  int b;   // first tile row the products read (a multiple of kSwGran)
  int nw;  // wgmma N (a multiple of kSwGran): tile rows b .. b + nw - 1, b + nw <= kSwT
};

// Swap-AB item: its expert by expert_of over the chunks' scan s_coff.
__device__ __forceinline__ SwItem map_sw(int item, int n_col_tiles, const int32_t* s_off, const int32_t* s_coff,
                                         int E, int n_rows, bool shift_tail, int& e_hint) {
  const int ch = item / n_col_tiles, nt = item - ch * n_col_tiles;
  const int lo = expert_of(ch, s_coff, E, e_hint);
  SwItem it;
  it.e = lo;
  // chunk i of c: rows [i r / c, (i + 1) r / c) of the expert's r (each floor or ceil of r / c, <= 256, >= 1)
  const int base = s_off[lo], r = s_off[lo + 1] - base, c = (r + kSwT - 1) / kSwT, i = ch - s_coff[lo];
  it.r0 = base + int(int64_t(i) * r / c);
  it.rows = base + int(int64_t(i + 1) * r / c) - it.r0;
  it.n0 = nt * kSwW;
  // tail: r0 + rows <= n = a0 + 256, so sh + rows <= 256 and b + nw <= 256 (256 - b is a multiple of 16)
  it.a0 = shift_tail ? min(it.r0, n_rows - kSwT) : it.r0;
  const int sh = it.r0 - it.a0;
  it.b = sh & ~(kSwGran - 1);
  it.nw = (sh - it.b + it.rows + kSwGran - 1) & ~(kSwGran - 1);
  return it;
}

// s_coff: the chunks of each expert, ceil(rows / 256) (scan_items).
__device__ __forceinline__ void scan_chunks(const int32_t* s_off, int32_t* s_coff, int E, int lane) {
  scan_items(s_coff, E, lane, [&](int e) { return (s_off[e + 1] - s_off[e] + kSwT - 1) / kSwT; });
}

// One stage's products, N = NW: the warpgroup's 64 weight rows (descriptor da) by the tokens (db), k = 64.
// The fences and the commit are inside each case of mma_stage_sw's switch: with the fence before the
// switch, ptxas injected its own warpgroup.arrive in the cases N <= 160 and serialised the wgmmas
// (C7519 / C7520).
template <int NW>
__device__ __forceinline__ void mma_sw(float (&acc)[kBR / 2], uint64_t da, uint64_t db, bool accumulate) {
  float (&d)[NW / 2] = *reinterpret_cast<float(*)[NW / 2]>(&acc[0]);
  wgmma_fence_regs(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
    wgmma_ss<NW>(d, wgmma_desc_add(da, kk * 32), wgmma_desc_add(db, kk * 32), accumulate || kk != 0);
  wgmma_commit();
}
// nw: the item's wgmma N (warp-uniform); wa / wb: shared addresses of the weight rows and token row b.
__device__ __forceinline__ void mma_stage_sw(float (&acc)[kBR / 2], int nw, uint32_t wa, uint32_t wb, bool accumulate) {
  const uint64_t da = wgmma_desc_sw128(wa), db = wgmma_desc_sw128(wb);
  switch (nw / kSwGran) {
#define DZ_SW_CASE(n) \
  case n / kSwGran:   \
    mma_sw<n>(acc, da, db, accumulate); \
    break;
    DZ_SW_CASE(16) DZ_SW_CASE(32) DZ_SW_CASE(48) DZ_SW_CASE(64) DZ_SW_CASE(80) DZ_SW_CASE(96) DZ_SW_CASE(112)
    DZ_SW_CASE(128) DZ_SW_CASE(144) DZ_SW_CASE(160) DZ_SW_CASE(176) DZ_SW_CASE(192) DZ_SW_CASE(208)
    DZ_SW_CASE(224) DZ_SW_CASE(240) DZ_SW_CASE(256)
#undef DZ_SW_CASE
    default:
      break;
  }
}


// Same block, barriers, shared memory and pipeline as k_moe_gemm_ws (plain, CL = 1); see the top of
// the file for the items and tiles. Stage: [128 weight rows | 256 token rows] x 128 bytes, swizzled.
__global__ void __launch_bounds__(kThreadsWs, 1) k_moe_gemm_swab(const __grid_constant__ Args a,
                                                                const __grid_constant__ Maps maps) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int E = a.E, N = a.N, K = a.K;
  const uint32_t sbase = smem_u32(smem), sbar = sbase + kPipeB;
  int32_t* s_off = reinterpret_cast<int32_t*>(smem + kPipeB + kBarB);
  int32_t* s_coff = s_off + (E + 1);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  auto full = [&](int s) { return sbar + 8 * s; };
  auto empty = [&](int s) { return sbar + 8 * (kStages + s); };

  // ---- offsets to shared memory, chunks per expert scanned (warp 0) ----
  for (int i = tid; i <= E; i += kThreadsWs) s_off[i] = a.offsets[i];
  __syncthreads();
  if (warp == 0) scan_chunks(s_off, s_coff, E, lane);
  const int n_rows = s_off[E];
  // TMA: token boxes must stay inside rows [0, n); with n < 256 the producer's threads load the tokens.
  const bool a_thr = n_rows < kSwT;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), a_thr ? 128u : 1u);  // thread 0's expect_tx (+ the other producer threads)
      mbar_init(empty(s), 8);                 // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int total = s_coff[E] * a.n_col_tiles;  // < 2^31 (host: max_tiles * column tiles)
  if (int(blockIdx.x) >= total) return;
  const int G = int(gridDim.x);
  const int nq = (total - int(blockIdx.x) + G - 1) / G;  // items of this block
  const int k_iters = (K + kBK - 1) / kBK;
  const bool shift_tail = !a_thr;

  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    if (!a_thr && tid != 0) return;
    const int prow = tid >> 3, pch = tid & 7;  // a_thr: chunk pch of token rows prow + 16 i
    int e_hint = -1;
    int f = 0;  // fill index over the block's stages
    for (int q = 0; q < nq; ++q) {
      const SwItem it = map_sw(int(blockIdx.x) + q * G, a.n_col_tiles, s_off, s_coff, E, n_rows, shift_tail, e_hint);
      const int brow = it.e * N + it.n0;  // < E * N < 2^31 (host)
      // the 64-row token boxes holding tile rows b .. b + nw - 1 (each inside [0, n): a0 + 256 <= n)
      const int x0 = it.b / kSwBox, x1 = (it.b + it.nw + kSwBox - 1) / kSwBox;
      for (int kk = 0; kk < k_iters; ++kk, ++f) {
        const int s = f % kStages, u = f / kStages;
        if (u > 0) mbar_wait(empty(s), (u - 1) & 1);
        const uint32_t sW = sbase + s * kStageB, sX = sW + kSwWStage;
        const int k0 = kk * kBK;
        if (a_thr) {  // n < 256: token rows 0 .. nw - 1 (b = 0) from the threads, zero past n and K
          const int kc = k0 + pch * 8;
#pragma unroll 4
          for (int i = 0; i < kSwT / 16; ++i) {
            const int r = prow + 16 * i;
            if (r >= it.nw) break;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (it.a0 + r < n_rows && kc < K)
              v = __ldg(reinterpret_cast<const uint4*>(a.xs + (int64_t(it.a0) + r) * K + kc));
            st_shared16(sX + uint32_t(r * kRowB + ((pch ^ (r & 7)) << 4)), v);
          }
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          if (tid != 0) mbar_arrive(full(s));
        }
        if (tid == 0) {
          // a box always transfers (and counts) all its bytes, zero-filled past the map's dims
          mbar_expect_tx(full(s), uint32_t(kSwWStage + (a_thr ? 0 : (x1 - x0) * kSwBoxB)));
          tma_load_2d(sW, &maps.b0, k0, brow, full(s));
          if (!a_thr)
            for (int x = x0; x < x1; ++x) tma_load_2d(sX + x * kSwBoxB, &maps.a, k0, it.a0 + x * kSwBox, full(s));
        }
      }
    }
    return;
  }

  // ---- consumers: warpgroup wm multiplies weight rows wm * 64 .. + 63 by the chunk's tokens ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
  const int wm = wg - 1, wq = warp & 3;
  float acc[kBR / 2];  // [64 columns x nw tokens] per warpgroup: acc[0 .. nw / 2 - 1] (d[4 j + q] as wgmma.cuh)
#pragma unroll
  for (int i = 0; i < kBR / 2; ++i) acc[i] = 0.f;
  const bool vec16 = (N & 7) == 0 && (reinterpret_cast<uintptr_t>(a.y) & 15) == 0;
  int e_hint = -1;
  int f = 0;
  for (int q = 0; q < nq; ++q) {
    int nw, b;
    bool busy;  // any of this warpgroup's 64 columns < N (else it only releases the stages)
    {
      int e2 = e_hint;
      const SwItem it = map_sw(int(blockIdx.x) + q * G, a.n_col_tiles, s_off, s_coff, E, n_rows, shift_tail, e2);
      nw = it.nw;
      b = it.b;
      busy = it.n0 + wm * 64 < N;
    }
    for (int kk = 0; kk < k_iters; ++kk, ++f) {
      const int s = f % kStages, u = f / kStages;
      mbar_wait(full(s), u & 1);
      const uint32_t st = sbase + s * kStageB;
      if (busy) mma_stage_sw(acc, nw, st + uint32_t(wm * 64 * kRowB), st + uint32_t(kSwWStage + b * kRowB), kk != 0);
      // the previous stage's products are done: release it (lane 0 of each warp, predicated)
      wgmma_wait<1>();
      if (kk > 0) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty((f - 1) % kStages));
      }
    }
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty((f - 1) % kStages));

    // ---- epilogue, transposed: acc[4 j + q] = (column wc0 + g + 8 (q >> 1), token 8 j + 2 t + (q & 1)) ----
    // (the item is mapped again here: nothing of it but nw and b stays live across the products)
    const SwItem cur = map_sw(int(blockIdx.x) + q * G, a.n_col_tiles, s_off, s_coff, E, n_rows, shift_tail, e_hint);
    const int wc0 = cur.n0 + wm * 64 + wq * 16;  // this warp's first output column
    if (wc0 >= N) continue;
    const int c_lo = cur.r0 - cur.a0 - cur.b, c_hi = c_lo + cur.rows;  // the item's token columns
    const int64_t trow0 = int64_t(cur.a0) + cur.b;                      // y row of token column 0
    if (a.stage_epi) {
      // 64 tokens x 16 columns at a time through the warp's staging tile: token rows of 32 bytes, their
      // two 16-byte halves swapped when (token >> 2) & 1 (stmatrix and the 16-byte reads conflict-free)
      const uint32_t stg = smem_u32(smem + stg_offset(E) + (warp - 4) * kStgWarpB);
      auto slot = [&](int tl, int h) { return stg + uint32_t(tl * 32 + ((h ^ ((tl >> 2) & 1)) << 4)); };
      const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
      for (int p = 0; p < kSwT / 64; ++p) {
        if (64 * p >= c_hi) break;  // (warp-uniform)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // matrices (j, columns 0-7), (j, 8-15), (j + 1, 0-7), (j + 1, 8-15); lane 8 m + i: token row i
          const int j = 8 * p + 2 * c;
          stmatrix_x4_trans(slot(16 * c + 8 * (mi >> 1) + ri, mi & 1), pack_bf16(acc[4 * j], acc[4 * j + 1]),
                            pack_bf16(acc[4 * j + 2], acc[4 * j + 3]), pack_bf16(acc[4 * j + 4], acc[4 * j + 5]),
                            pack_bf16(acc[4 * j + 6], acc[4 * j + 7]));
        }
        __syncwarp();
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int tl = 16 * v + (lane >> 1), h = lane & 1, tc = 64 * p + tl;
          if (tc < c_lo || tc >= c_hi) continue;
          uint4 val;
          asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                       : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                       : "r"(slot(tl, h))
                       : "memory");
          const int col = wc0 + 8 * h;
          bf16* dst = a.y + (trow0 + tc) * N + col;
          if (vec16 && col + 8 <= N) {
            *reinterpret_cast<uint4*>(dst) = val;
          } else {  // columns past N dropped; N % 8 != 0 or y not 16-byte aligned: element stores
            const uint32_t w[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
            for (int e = 0; e < 8; ++e)
              if (col + e < N) reinterpret_cast<uint16_t*>(dst)[e] = uint16_t(w[e >> 1] >> (16 * (e & 1)));
          }
        }
        __syncwarp();
      }
    } else {
      // no staging tiles (E > ~2000): each value on its own (a register pair is two tokens of one column)
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int j = 0; j < kBR / 8; ++j) {
        if (8 * j >= c_hi) break;
#pragma unroll
        for (int qd = 0; qd < 4; ++qd) {
          const int tc = 8 * j + 2 * t + (qd & 1), col = wc0 + g + 8 * (qd >> 1);
          if (tc >= c_lo && tc < c_hi && col < N) a.y[(trow0 + tc) * N + col] = __float2bfloat16_rn(acc[4 * j + qd]);
        }
      }
    }
  }
}

size_t smem_bytes(int E) { return size_t(1024 + kPipeB + kBarB) + 2 * sizeof(int32_t) * size_t(E + 1); }

// Blocks: one per SM, or fewer when there are fewer work items. Items <= pairs * column tiles <=
// max_tiles * column tiles (each pair holds >= 1 tile).
unsigned grid_of(const Args& a, int64_t max_tiles) {
  return unsigned(std::min<int64_t>(sm_count(), max_tiles * a.n_col_tiles));
}

template <bool SWIGLU, int MODE, bool MX4 = false>
void launch(const Args& a, int64_t max_tiles, cudaStream_t s) {
  static_assert(MODE != kTma, "the TMA loads run in the warp-specialised kernel (launch_ws)");
  const size_t smem = smem_bytes(a.E);
  CUDA_CHECK(cudaFuncSetAttribute(k_moe_gemm<SWIGLU, MODE, MX4>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  k_moe_gemm<SWIGLU, MODE, MX4><<<grid_of(a, max_tiles), kThreads, smem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

// CL = 2: 2-CTA clusters, as many as can be resident at once (a GPC with an odd number of free
// SMs leaves one out), at most one per item.
template <bool SWIGLU, int CL>
void launch_ws(Args a, const Maps& m, int64_t max_tiles, cudaStream_t s) {
  a.stage_epi = smem_ws(a.E, true) <= size_t(227) * 1024;  // E <= ~2000
  const size_t smem = smem_ws(a.E, a.stage_epi);
  const auto kern = k_moe_gemm_ws<SWIGLU, CL>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if constexpr (CL == 1) {
    kern<<<grid_of(a, max_tiles), kThreadsWs, smem, s>>>(a, m);
  } else {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CL, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(kThreadsWs);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(CL);
    int max_clusters = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, kern, &cfg));
    DZ_CHECK(max_clusters >= 1, "grouped expert GEMM: no ", CL, "-CTA cluster fits on this device");
    cfg.gridDim = dim3(unsigned(CL * std::min<int64_t>(max_clusters, max_tiles * a.n_col_tiles)));
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, a, m));
  }
  CUDA_CHECK_LAUNCH();
}

// The 2-CTA clusters (k_moe_gemm_ws<false, 2>) are not taken by default: DZ_MOE_GEMM_CLUSTERS=1 runs
// every plain TMA GEMM on them (the GPU tests run the MoE cases so too). On the H200 (2026-12-03,
// docs/perf/README.md) with ~uniform routing at GLM-5.3-Flash's shapes they ran gate / up 1.25x and
// down 1.09x faster than k_moe_gemm_ws<false, 1> (kernels/dev/moe_gemm bench, outputs bitwise
// equal), Qwen3.5's shapes 0.86-0.92x; yet GLM-5.3-Flash's 4-layer forward at T = 8192 took 78.9 ms
// with them against 70.5 ms without (same command, median of 5). The routing that forward produces
// is not uniform, and with ~2 pairs an expert each uneven expert idles a CTA of its cluster: what
// decides it (and a rule the host can apply, or one the kernel takes from the offsets) is next.
bool clusters() {
  const char* f = std::getenv("DZ_MOE_GEMM_CLUSTERS");
  return f && f[0] == '1';
}

// The swap-AB kernel takes the plain TMA GEMMs with N >= 2048 and K >= 2048 (where it was measured
// faster, see the top); DZ_MOE_GEMM_SWAPAB=1 gives it every such GEMM (the GPU tests run the MoE cases
// so too), =0 none.
bool swab_shape(int64_t N, int64_t K) {
  const char* f = std::getenv("DZ_MOE_GEMM_SWAPAB");
  if (f && f[0] == '1') return true;
  if (f && f[0] == '0') return false;
  return N >= 2048 && K >= 2048;
}

// Items: chunks x column tiles of 128 <= max_tiles * column tiles (each chunk holds >= 1 row, so at
// least one 64-row tile of its expert).
void launch_swab(Args a, const Maps& m, int64_t max_tiles, cudaStream_t s) {
  a.n_col_tiles = int((int64_t(a.N) + kSwW - 1) / kSwW);
  a.stage_epi = smem_ws(a.E, true) <= size_t(227) * 1024;  // E <= ~2000
  const size_t smem = smem_ws(a.E, a.stage_epi);
  CUDA_CHECK(cudaFuncSetAttribute(k_moe_gemm_swab, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  k_moe_gemm_swab<<<grid_of(a, max_tiles), kThreadsWs, smem, s>>>(a, m);
  CUDA_CHECK_LAUNCH();
}

// Row-major bf16 [rows, K] with boxes of 64 k x box_rows rows, 128-byte swizzle, zeros outside.
bool encode(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap* m, const bf16* p, int64_t rows, int64_t K,
            int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(K) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBK), cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(p), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

void run(const bf16* xs, const bf16* w0, const bf16* w1, const int32_t* offsets, int E, int64_t max_tiles, int64_t N,
         const GluAct& act, int64_t K, bf16* y, bool swiglu, cudaStream_t s, const char* name,
         const Mx4Weight* mx0 = nullptr, const Mx4Weight* mx1 = nullptr, const int32_t* arow = nullptr,
         int top_k = 1) {
  if (max_tiles <= 0 || N <= 0 || E <= 0) return;
  DZ_CHECK(K >= 1 && N < (int64_t(1) << 31) && K < (int64_t(1) << 31) && E <= kMaxE, name, ": N ", N, ", K ", K,
           ", E ", E, " (N, K < 2^31, E <= ", kMaxE, ")");
  Args a;
  memset(&a, 0, sizeof(a));
  a.xs = xs;
  a.w0 = w0;
  a.w1 = swiglu ? w1 : w0;
  a.act = act;
  a.offsets = offsets;
  a.y = y;
  a.E = E;
  a.N = int(N);
  a.K = int(K);
  const int64_t bn = swiglu ? kBR / 2 : kBR;
  a.n_col_tiles = int((N + bn - 1) / bn);
  DZ_CHECK(max_tiles * a.n_col_tiles < (int64_t(1) << 31), name, ": ", max_tiles, " row tiles x ", a.n_col_tiles,
           " column tiles (< 2^31 work items)");
  a.vec_store = (N % 2 == 0) && (reinterpret_cast<uintptr_t>(y) & 3) == 0;
  a.arow = arow;
  a.top_k = top_k;
  DZ_CHECK(!arow || (!swiglu && !mx0 && top_k >= 1), name,
           ": gathered rows are for the plain BF16 GEMMs (top_k ", top_k, ")");
  if (mx0) {  // MXFP4 weights: A by cp.async, B decoded by the threads
    DZ_CHECK(K % 32 == 0 && aligned16(xs) && mx0->packed && mx0->scales && (!swiglu || (mx1 && mx1->packed && mx1->scales)),
             name, ": MXFP4 weights need K % 32 == 0 (K ", K, ") and 16-byte aligned activations");
    a.w0 = a.w1 = nullptr;
    a.q0 = mx0->packed, a.s0 = mx0->scales;
    a.q1 = swiglu ? mx1->packed : mx0->packed, a.s1 = swiglu ? mx1->scales : mx0->scales;
    if (swiglu)
      launch<true, kCpAsync, true>(a, max_tiles, s);
    else
      launch<false, kCpAsync, true>(a, max_tiles, s);
    return;
  }
  const bool al = K % 8 == 0 && aligned16(xs) && aligned16(w0) && aligned16(a.w1);
  Maps m;
  memset(&m, 0, sizeof(m));
  bool tma = false;
  const bool cl2 = !swiglu && clusters();  // (TMA only)
  // swap AB where production ran k_moe_gemm_ws<false, 1> (items: chunks x ceil(N / 128) < 2^31)
  Maps msw;
  memset(&msw, 0, sizeof(msw));
  // (gathered rows: never swap AB, see grouped_gemm_gathers_rows)
  bool swab = !swiglu && !cl2 && !arow && swab_shape(N, K) && max_tiles * ((N + kSwW - 1) / kSwW) < (int64_t(1) << 31);
  // TMA coordinates are int32: rows of W (E * N) and of xs (bounded by max_tiles * 64).
  if (al && int64_t(E) * N < (int64_t(1) << 31) && max_tiles * 64 < (int64_t(1) << 31)) {
    if (auto enc = tensor_map_encoder()) {
      const int br = (swiglu || cl2) ? kBR / 2 : kBR;
      // (gathered rows: A by the producer's cp.async, no map)
      tma = (arow || encode(enc, &m.a, xs, max_tiles * 64, K, kBM)) && encode(enc, &m.b0, w0, int64_t(E) * N, K, br) &&
            encode(enc, &m.b1, a.w1, int64_t(E) * N, K, br);
      // swap AB: tokens in boxes of 64 rows, weights in boxes of 128 (b1 unused)
      swab = tma && swab && encode(enc, &msw.a, xs, max_tiles * 64, K, kSwBox) &&
             encode(enc, &msw.b0, w0, int64_t(E) * N, K, kSwW);
    }
  }
  int mode = tma ? kTma : al ? kCpAsync : kElem;
  // Testing override (kernels/dev/moe_gemm): DZ_MOE_GEMM_LOADS=cpasync|elem forces a slower loader.
  if (const char* f = std::getenv("DZ_MOE_GEMM_LOADS")) {
    if (!strcmp(f, "elem")) mode = kElem;
    if (!strcmp(f, "cpasync") && al) mode = kCpAsync;
  }
  if (mode == kTma) {
    if (swiglu)
      launch_ws<true, 1>(a, m, max_tiles, s);
    else if (cl2)
      launch_ws<false, 2>(a, m, max_tiles, s);
    else if (swab)
      launch_swab(a, msw, max_tiles, s);
    else
      launch_ws<false, 1>(a, m, max_tiles, s);
  } else if (mode == kCpAsync) {
    if (swiglu)
      launch<true, kCpAsync>(a, max_tiles, s);
    else
      launch<false, kCpAsync>(a, max_tiles, s);
  } else {
    if (swiglu)
      launch<true, kElem>(a, max_tiles, s);
    else
      launch<false, kElem>(a, max_tiles, s);
  }
}

}  // namespace

// The swap-AB kernel's token tile is up to 256 rows a stage: gathered by its producer's cp.async it
// ran GLM-5.3-Flash's gate GEMM (T = 8192, N = 2048, K = 4096) 1.99 -> 3.31 ms on the H100, more than
// the 0.34 ms gather_rows it saves (kernels/dev/moe_gemm bench, 2026-12-06, docs/perf/README.md);
// the warp-specialised kernel's 128 rows a stage gathered cost ~nothing (Qwen3.5: 0.325 -> 0.332 ms,
// saving 0.160). So shapes the swap-AB kernel takes are gathered beforehand.
bool grouped_gemm_gathers_rows(int64_t N, int64_t K) { return !swab_shape(N, K); }

void grouped_gemm_tc(const bf16* xs, const bf16* W, const int32_t* offsets, const int32_t* tile_off, int E,
                     int64_t max_tiles, int64_t N, int64_t K, bf16* y, cudaStream_t s, const int32_t* arow,
                     int top_k) {
  (void)tile_off;
  run(xs, W, nullptr, offsets, E, max_tiles, N, GluAct{}, K, y, false, s, "grouped_gemm_tc", nullptr, nullptr, arow,
      top_k);
}

void grouped_gemm_swiglu_tc(const bf16* xs, const bf16* Wg, const bf16* Wu, const int32_t* offsets,
                            const int32_t* tile_off, int E, int64_t max_tiles, int64_t N, int64_t K, bf16* h,
                            cudaStream_t s, const GluAct& act) {
  (void)tile_off;
  run(xs, Wg, Wu, offsets, E, max_tiles, N, act, K, h, true, s, "grouped_gemm_swiglu_tc");
}

void grouped_gemm_mx4_tc(const bf16* xs, const Mx4Weight& W, const int32_t* offsets, int E, int64_t max_tiles,
                         int64_t N, int64_t K, bf16* y, cudaStream_t s) {
  run(xs, nullptr, nullptr, offsets, E, max_tiles, N, GluAct{}, K, y, false, s, "grouped_gemm_mx4_tc", &W);
}

void grouped_gemm_glu_mx4_tc(const bf16* xs, const Mx4Weight& Wg, const Mx4Weight& Wu, const int32_t* offsets, int E,
                             int64_t max_tiles, int64_t N, int64_t K, bf16* h, cudaStream_t s, const GluAct& act) {
  run(xs, nullptr, nullptr, offsets, E, max_tiles, N, act, K, h, true, s, "grouped_gemm_glu_mx4_tc", &Wg, &Wu);
}

}  // namespace dz::cuda
