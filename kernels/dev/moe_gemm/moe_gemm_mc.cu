// EXPERIMENT (issue 12 / issue 11's e2e gap): kernels/moe_gemm.cu with the TMA loader made a
// 2-CTA cluster that shares B by TMA multicast. Same symbols as kernels/moe_gemm.cu: link one or the
// other (kernels/dev/moe_gemm/run_device.sh kernels/dev/moe_gemm/moe_gemm_mc.cu tests and benches
// it beside the production kernel). Written 2026-12-02 without device time: compiles, NOT yet run.
//
// Why: the production kernel is L2-bound (ncu on Kimi-Linear's SwiGLU: L2 throughput 83 %, hit
// rate 59 %): a 128 x 256 item streams 48 KiB per 64-deep stage for 4.2 MFLOP, and the items of an
// expert's row tiles each stream the same B. Here (TMA mode only) the two CTAs of a cluster take
// the two 128-row halves of a 256-row "super item" of one expert and column tile; each CTA loads
// its own A and HALF of B (SwiGLU: rank 0 the gate rows, rank 1 the up rows; plain: rows
// 128 r .. 128 r + 127) and multicasts that half into both CTAs' stage. L2 -> SM bytes per pair of
// row tiles: 2 A + 1 B instead of 2 A + 2 B (1.5x less). Costs: a super item whose second half has
// no rows (an expert with <= 128 rows in it) computes that half for nothing, and a stage is
// refilled only when both CTAs released it (the empty mbarriers count the warps of both CTAs:
// every warp arrives on its own CTA's and, through mapa, on the peer's).
// The cp.async / element / MXFP4 loaders are the production kernel's, unchanged (no cluster).
//
// (The production kernel's description follows.)
// Grouped MoE expert GEMMs on tensor cores (see moe_gemm.cuh).
//
// One persistent block per multiprocessor, 8 warps, 128 output rows x 256 B-rows per work item
// (plain: 256 output columns of one W; SwiGLU: 128 columns of Wg and the same 128 of Wu, so the
// thread that holds g[r, c] also holds u[r, c]). A work item is (expert, 128-row pair of the
// expert's 64-row tiles, column tile), items numbered expert by expert, column tile fastest, and
// dealt to the blocks round-robin. Each block first copies offsets into shared memory and scans
// the per-expert pair counts there, so mapping an item to its rows is a shared-memory search.
//
// K runs in steps of 64 through a 4-stage pipeline that is continuous across the block's items:
// loads of the next item start while the current one finishes, and the epilogue writes from
// registers. Tiles are row-major with 128-byte rows whose 16-byte chunks are XOR-swizzled by
// (row & 7): the tensor-memory-access engine's 128-byte swizzle, which is also the layout Hopper's
// wgmma reads through a shared-memory descriptor (wgmma.cuh). Warpgroup wm (warps 4 wm .. 4 wm + 3)
// multiplies A rows 64 wm .. 64 wm + 63 by all 256 B rows: four m64n256k16 wgmmas per stage, both
// operands straight from shared memory, 128 fp32 accumulators per thread. Every warpgroup
// multiplies all its rows; rows outside the item are dropped at the store. Each stage's products
// are waited for before the (divergent) producer code runs: with a wgmma in flight across it,
// ptxas serialises them (C7518); the other warpgroup's products fill the gap. TMA stages are
// released per warp (empty mbarriers), so the warps are not held in step. (mma.sync m16n8k16 with
// ldmatrix before 2026-12-02: 347 / 349 TFLOP/s for Kimi-Linear's SwiGLU / down against 417 / 430
// with wgmma in one device command, docs/perf/moe_gemm_*.txt.)
//
// Loads, by what the shapes allow:
//  - TMA (K % 8 == 0, 16-byte aligned pointers): thread 0 issues one 2-D tensor copy per operand
//    and stage, completing on the stage's mbarrier. Rows past the expert's end (A) or past N (B)
//    are loaded as they are (the next expert's rows, or zeros past the tensor) and only their
//    outputs are dropped, so no row of one output depends on them; k past K is zero-filled. A's
//    box never crosses the last row n = offsets[E] (the host does not know n): a tail item's box
//    is moved up to end at n, and when n < 128 the threads load A themselves.
//  - cp.async (K % 8 == 0 without TMA) and element loads (K % 8 != 0 or unaligned pointers):
//    each thread fills 16-byte chunks, zero past the expert, N and K.
//  - MXFP4 weights (MX4): A by cp.async; each thread loads the 4 packed bytes and the scale of each
//    of its B chunks into registers, and one produce() later (while the stages in between are
//    multiplied) decodes them to 8 bf16 each and stores them, swizzled as the other loaders do.
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

enum Mode { kTma = 0, kCpAsync = 1, kElem = 2 };

__device__ __forceinline__ void st_shared16(uint32_t saddr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(saddr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
// Cluster helpers (multicast experiment).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrival on the mbarrier at the same offset in CTA `rank` of the cluster (release at cluster scope).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
      " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}
// 2-D tensor copy into the same shared-memory offset of every CTA in mask, each completing on its
// mbarrier at bar's offset.
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                               uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
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
  GluAct act;       // SwiGLU / clamp / SiTU
  // MXFP4 weights (MX4 kernels): packed [E*N, K/2] and scales [E*N, K/32] of W / Wg and of Wu
  const uint8_t *q0, *q1, *s0, *s1;
};
struct Maps {  // TMA descriptors (kTma only): xs, W / Wg, Wu
  CUtensorMap a, b0, b1;
};

struct Item {
  int r0, rows, e, n0;
  int a0;  // first row of the A tile in shared memory (r0, or moved up for a TMA tail item)
};

// Expert of item: the largest e with poff[e] <= p (p < poff[E]; experts with no pairs are
// skipped). A block's items ascend, so the search runs forward from the last item's expert
// (e_hint, < 0 the first time: binary search).
template <int BN, int UNIT = kBM>
__device__ __forceinline__ Item map_item(int item, int n_col_tiles, const int32_t* s_off, const int32_t* s_poff,
                                         int E, bool shift_tail, int& e_hint, int half = 0) {
  const int p = item / n_col_tiles, nt = item - p * n_col_tiles;
  int lo = e_hint;
  if (lo < 0) {
    lo = 0;
    int hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_poff[mid] <= p)
        lo = mid;
      else
        hi = mid - 1;
    }
  } else {
    while (s_poff[lo + 1] <= p) ++lo;
  }
  e_hint = lo;
  Item it;
  it.e = lo;
  it.r0 = s_off[lo] + (p - s_poff[lo]) * UNIT + half * kBM;  // half: the CTA's 128 rows of a super item
  it.rows = max(0, min(kBM, s_off[lo + 1] - it.r0));
  it.n0 = nt * BN;
  const int n = s_off[E];
  it.a0 = (shift_tail && it.r0 + kBM > n) ? n - kBM : it.r0;
  return it;
}

template <bool SWIGLU, int MODE, bool MX4 = false>
__global__ void __launch_bounds__(kThreads, 1) k_moe_gemm(const __grid_constant__ Args a,
                                                          const __grid_constant__ Maps maps) {
  static_assert(!MX4 || MODE == kCpAsync, "MXFP4 weights: A by cp.async, B decoded by the threads");
  constexpr int BN = SWIGLU ? kBR / 2 : kBR;  // output columns per item
  constexpr bool MC = MODE == kTma;           // 2-CTA cluster, B multicast
  constexpr int UNIT = MC ? 2 * kBM : kBM;    // rows per item unit (MC: a super item of two halves)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // 1024-byte aligned base (the 128-byte swizzle repeats every 8 rows of 128 bytes).
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int E = a.E, N = a.N, K = a.K;
  const uint32_t sbase = smem_u32(smem), sbar = sbase + kPipeB;
  int32_t* s_off = reinterpret_cast<int32_t*>(smem + kPipeB + kBarB);
  int32_t* s_poff = s_off + (E + 1);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // ---- offsets to shared memory, pairs of 64-row tiles per expert scanned (warp 0) ----
  for (int i = tid; i <= E; i += kThreads) s_off[i] = a.offsets[i];
  if (MODE == kTma && tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(sbar + 8 * s, 1);                         // full: thread 0's expect_tx + the bytes
      mbar_init(sbar + 8 * (kStages + s), (MC ? 2 : 1) * kThreads / 32);  // empty: one arrival per warp (MC: of both CTAs)
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {
    const int per = (E + 31) / 32, b = min(E, lane * per), en = min(E, b + per);
    int sum = 0;
    for (int e = b; e < en; ++e) sum += (s_off[e + 1] - s_off[e] + UNIT - 1) / UNIT;
    int incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    int run = incl - sum;
    for (int e = b; e < en; ++e) {
      s_poff[e] = run;
      run += (s_off[e + 1] - s_off[e] + UNIT - 1) / UNIT;
    }
    if (lane == 31) s_poff[E] = incl;
  }
  __syncthreads();

  const int total = s_poff[E] * a.n_col_tiles;  // < 2^31 (host: max_tiles * column tiles)
  // MC: items are dealt to clusters (both CTAs walk the same items: same stage sequence)
  const int bid = MC ? int(blockIdx.x) >> 1 : int(blockIdx.x), G = MC ? int(gridDim.x) >> 1 : int(gridDim.x);
  const uint32_t crank = MC ? cluster_rank() : 0u, peer = crank ^ 1u;
  if (bid >= total) return;  // uniform in a cluster
  if constexpr (MC) cluster_sync();  // the peer's mbarriers are initialised before any multicast
  const int nq = (total - bid + G - 1) / G;  // items of this block
  const int k_iters = (K + kBK - 1) / kBK;
  const int64_t total_iters = int64_t(nq) * k_iters;
  const int n_rows = s_off[E];
  // TMA: A's box must stay inside rows [0, n); with n < 128 the threads load A instead.
  const bool a_thr = MODE == kTma && n_rows < kBM;
  const bool shift_tail = MODE == kTma && !a_thr;

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
    ld_it = map_item<BN, UNIT>(item, a.n_col_tiles, s_off, s_poff, E, shift_tail, ld_e, int(crank));
    const Item& it = ld_it;
    if constexpr (MODE == kTma) {
      pa = a.xs + (int64_t(it.a0) + prow) * K + pch * 8;
      rmask = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) rmask |= uint32_t(it.a0 + prow + 32 * i < n_rows) << i;
    } else {
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
    if constexpr (MODE == kTma) {
      if (a_thr) {  // n < 128: A from the threads (16-byte loads, zero past n and K)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint4 v = make_uint4(0, 0, 0, 0);
          if (((rmask >> i) & 1) && kc < K) v = __ldg(reinterpret_cast<const uint4*>(pa + i * rstride));
          st_shared16(sA + pdst + i * 32 * kRowB, v);
        }
      }
      if (tid == 0) {
        const uint32_t bar = sbar + 8 * stage;
        const int k0 = ld_k * kBK;
        mbar_expect_tx(bar, uint32_t(a_thr ? kBStage : kStageB));  // B: both halves land here
        if (!a_thr) tma_load_2d(sA, &maps.a, k0, ld_it.a0, bar);
        const int brow = ld_it.e * N + ld_it.n0;
        // this CTA's half of B into both CTAs (SwiGLU: rank 0 the gate rows, rank 1 the up rows)
        if constexpr (SWIGLU)
          tma_load_2d_mc(sB + crank * (kBStage / 2), crank ? &maps.b1 : &maps.b0, k0, brow, bar, 3);
        else
          tma_load_2d_mc(sB + crank * (kBStage / 2), &maps.b0, k0, brow + int(crank) * (kBR / 2), bar, 3);
      }
    } else if constexpr (MODE == kCpAsync) {
      const bool kin = kc < K;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = kin && ((rmask >> i) & 1);
        cp_async16(sA + pdst + i * 32 * kRowB, ok ? pa + i * rstride : a.xs, ok);
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
      for (int i = 0; i < 4; ++i) fill(sA + pdst + i * 32 * kRowB, pa + i * rstride, (rmask >> i) & 1);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        fill(sB + pdst + i * 32 * kRowB, (i < 4 ? pb0 : pb1) + (i & 3) * rstride, (rmask >> (4 + i)) & 1);
    }
    pa += kBK;
    if constexpr (MODE != kTma) {
      pb0 += kBK;
      pb1 += kBK;
    }
  };
  // empty_parity >= 0: (TMA, A not from the threads) thread 0 first waits until every warp has
  // released the stage's previous use.
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
  auto produce = [&](int stage, int empty_parity) {
    mx_store();  // that stage is read two iterations from now, after block barriers
    if (ld_q < nq) {
      if (MODE == kTma && tid == 0 && empty_parity >= 0) mbar_wait_cluster(sbar + 8 * (kStages + stage), empty_parity);
      load_stage(stage);
      if (++ld_k == k_iters) {
        ld_k = 0;
        if (++ld_q < nq) setup_producer(bid + ld_q * G);
      }
    }
    if constexpr (MODE != kTma) cp_commit();
  };

  // ---- consumer: warpgroup wm multiplies A rows wm * 64 .. + 63 by all 256 B rows (wgmma) ----
  const int wm = warp >> 2, wq = warp & 3;
  const uint32_t a_off = uint32_t(wm * 64 * kRowB);
  // Thread-filled stages (cp.async, element loads, MX4 decode, TMA with A from the threads) are
  // refilled by every thread after the block barrier of the next wait_full, which each warp reaches
  // only after its products of the stage completed (wgmma_wait<0>). TMA stages are released per
  // warp on the empty mbarriers.
  const bool thr_fill = MODE != kTma || a_thr;
  // Wait until stage st (parity ph) is filled: its mbarrier (TMA; plus a block barrier when the
  // threads store A), or the cp.async groups and a block barrier. The async-proxy fence makes the
  // threads' shared-memory stores visible to wgmma.
  auto wait_full = [&](int st, uint32_t ph) {
    if constexpr (MODE == kTma) {
      mbar_wait(sbar + 8 * st, ph);
      if (a_thr) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
      }
    } else {
      cp_wait<kStages - 2>();
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
    }
  };

  float acc[kBR / 2];  // [64 x 256] per warpgroup (wgmma.cuh: d[4 j + q])
#pragma unroll
  for (int i = 0; i < kBR / 2; ++i) acc[i] = 0.f;

  setup_producer(bid);
  int mm_e = -1;
  Item cur = map_item<BN, UNIT>(bid, a.n_col_tiles, s_off, s_poff, E, shift_tail, mm_e, int(crank));
  int mm_k = 0;
  int mm_q = 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) produce(s, -1);
  int stage = 0, ld_stage = kStages - 1;
  uint32_t phase = 0;

  // Every warpgroup multiplies all its 64 rows (rows outside the item are dropped in the epilogue).
  for (int64_t g = 0; g < total_iters; ++g) {
    // Refill the stage read in iteration g - 1 (for iteration g + 3), before this iteration's
    // products, so three stages of loads stay in flight. TMA: thread 0 first waits until every
    // warp has released that stage (parity of iteration g - 1). Thread-filled: after the block
    // barrier of wait_full, which every warp reaches only after its products of g - 1 completed.
    if (!thr_fill) {
      produce(ld_stage, g > 0 ? int(stage == 0 ? phase ^ 1u : phase) : -1);
      ld_stage = ld_stage + 1 == kStages ? 0 : ld_stage + 1;
    }
    wait_full(stage, phase);
    if (thr_fill) {
      // MC with A from the threads: B is still multicast, so the refill waits for both CTAs'
      // release of the stage (read in iteration g - 1), like the TMA path
      produce(ld_stage, MC && g > 0 ? int(stage == 0 ? phase ^ 1u : phase) : -1);
      ld_stage = ld_stage + 1 == kStages ? 0 : ld_stage + 1;
    }
    const uint32_t st = sbase + stage * kStageB;
    const uint64_t da = wgmma_desc_sw128(st + a_off), db = wgmma_desc_sw128(st + kAStage);
    wgmma_fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma_ss<256>(acc, wgmma_desc_add(da, kk * 32), wgmma_desc_add(db, kk * 32), (mm_k | kk) != 0);
    wgmma_commit();
    // Nothing stays in flight across the (divergent) producer code: ptxas would serialise the
    // wgmmas otherwise (C7518). The other warpgroup's products keep the tensor cores busy meanwhile.
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    if (MC) {  // this warp is done with the stage, in this CTA and (B) the peer's view of it
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(sbar + 8 * (kStages + stage));
        mbar_arrive_cluster(sbar + 8 * (kStages + stage), peer);
      }
    } else if (!thr_fill) {  // TMA: this warp is done with the stage
      __syncwarp();
      if (lane == 0) mbar_arrive(sbar + 8 * (kStages + stage));
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
    if (stage == 0) phase ^= 1u;

    if (++mm_k == k_iters) {
      // ---- epilogue: registers -> y (rows outside the item and columns past N are dropped) ----
      const int sh = cur.r0 - cur.a0;  // shared-memory row of the item's first row
      const int cbase = cur.n0 + (lane & 3) * 2;
      const int wr = wm * 64 + wq * 16;  // this warp's first shared-memory row
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
            if constexpr (SWIGLU) {
              swiglu_pair(v0, v1, acc[4 * (j + 16) + 2 * hf], acc[4 * (j + 16) + 2 * hf + 1], a.act);
            }
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
            if constexpr (SWIGLU) {
              swiglu_pair(v0, v1, acc[4 * (j + 16) + 2 * hf], acc[4 * (j + 16) + 2 * hf + 1], a.act);
            }
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
      mm_k = 0;
      if (++mm_q < nq)
        cur = map_item<BN, UNIT>(bid + mm_q * G, a.n_col_tiles, s_off, s_poff, E, shift_tail, mm_e, int(crank));
    }
  }
  if constexpr (MODE != kTma) cp_wait<0>();
  if constexpr (MC) cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
}

size_t smem_bytes(int E) { return size_t(1024 + kPipeB + kBarB) + 2 * sizeof(int32_t) * size_t(E + 1); }

template <bool SWIGLU, int MODE, bool MX4 = false>
void launch(const Args& a, const Maps& m, int64_t max_tiles, cudaStream_t s) {
  const size_t smem = smem_bytes(a.E);
  auto kern = k_moe_gemm<SWIGLU, MODE, MX4>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // Items <= pairs * column tiles <= max_tiles * column tiles (each pair holds >= 1 tile).
  const int64_t max_items = max_tiles * a.n_col_tiles;
  if constexpr (MODE == kTma) {  // clusters of 2 CTAs, as many as are resident at once
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(unsigned(2 * (sm_count() / 2)));
    int nc = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&nc, kern, &cfg));
    DZ_CHECK(nc > 0, "grouped GEMM (multicast): no 2-CTA cluster fits (", smem, " bytes of shared memory)");
    cfg.gridDim = dim3(unsigned(2 * std::min<int64_t>(nc, max_items)));
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, a, m));
  } else {
    const unsigned grid = unsigned(std::min<int64_t>(sm_count(), max_items));
    kern<<<grid, kThreads, smem, s>>>(a, m);
  }
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
         const Mx4Weight* mx0 = nullptr, const Mx4Weight* mx1 = nullptr) {
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
  if (mx0) {  // MXFP4 weights: A by cp.async, B decoded by the threads
    DZ_CHECK(K % 32 == 0 && aligned16(xs) && mx0->packed && mx0->scales && (!swiglu || (mx1 && mx1->packed && mx1->scales)),
             name, ": MXFP4 weights need K % 32 == 0 (K ", K, ") and 16-byte aligned activations");
    a.w0 = a.w1 = nullptr;
    a.q0 = mx0->packed, a.s0 = mx0->scales;
    a.q1 = swiglu ? mx1->packed : mx0->packed, a.s1 = swiglu ? mx1->scales : mx0->scales;
    Maps m;
    memset(&m, 0, sizeof(m));
    if (swiglu)
      launch<true, kCpAsync, true>(a, m, max_tiles, s);
    else
      launch<false, kCpAsync, true>(a, m, max_tiles, s);
    return;
  }
  const bool al = K % 8 == 0 && aligned16(xs) && aligned16(w0) && aligned16(a.w1);
  Maps m;
  memset(&m, 0, sizeof(m));
  bool tma = false;
  // TMA coordinates are int32: rows of W (E * N) and of xs (bounded by max_tiles * 64).
  if (al && int64_t(E) * N < (int64_t(1) << 31) && max_tiles * 64 < (int64_t(1) << 31)) {
    if (auto enc = tensor_map_encoder()) {
      const int br = kBR / 2;  // MC: each CTA loads 128 of the 256 B rows (SwiGLU: one of the two maps)
      tma = encode(enc, &m.a, xs, max_tiles * 64, K, kBM) && encode(enc, &m.b0, w0, int64_t(E) * N, K, br) &&
            encode(enc, &m.b1, a.w1, int64_t(E) * N, K, br);
    }
  }
  int mode = tma ? kTma : al ? kCpAsync : kElem;
  // Testing override (kernels/dev/moe_gemm): DZ_MOE_GEMM_LOADS=cpasync|elem forces a slower loader.
  if (const char* f = std::getenv("DZ_MOE_GEMM_LOADS")) {
    if (!strcmp(f, "elem")) mode = kElem;
    if (!strcmp(f, "cpasync") && al) mode = kCpAsync;
  }
  if (swiglu) {
    if (mode == kTma)
      launch<true, kTma>(a, m, max_tiles, s);
    else if (mode == kCpAsync)
      launch<true, kCpAsync>(a, m, max_tiles, s);
    else
      launch<true, kElem>(a, m, max_tiles, s);
  } else {
    if (mode == kTma)
      launch<false, kTma>(a, m, max_tiles, s);
    else if (mode == kCpAsync)
      launch<false, kCpAsync>(a, m, max_tiles, s);
    else
      launch<false, kElem>(a, m, max_tiles, s);
  }
}

}  // namespace

void grouped_gemm_tc(const bf16* xs, const bf16* W, const int32_t* offsets, const int32_t* tile_off, int E,
                     int64_t max_tiles, int64_t N, int64_t K, bf16* y, cudaStream_t s) {
  (void)tile_off;
  run(xs, W, nullptr, offsets, E, max_tiles, N, GluAct{}, K, y, false, s, "grouped_gemm_tc");
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
