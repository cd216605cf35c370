// Experiment (issue 11 / 12: the expert GEMMs are the largest kernel group left, 0.45-0.76 of one
// cuBLAS GEMM of the same rows, docs/perf/experiments_c6788c6.txt): kernels/moe_gemm.cu's TMA path
// made warp specialised, as the flash attention's was (12.2 vs 21.6 ms there). Run with
//   bash kernels/dev/moe_gemm/run_device.sh kernels/dev/moe_gemm/moe_gemm_ws.cu
// (the harness tests and benches production, then this file, in the same command). First run,
// 2026-12-02 (docs/perf/moe_gemm_ws_7498749.txt): all tests pass; 1.04-1.11x faster than production
// on the plain GEMMs of every shape but GLM-5.3-Flash's down projection (0.98x), e.g. Qwen3.5 at
// T = 32768 gate/up 0.918 vs 0.998 ms, down 1.498 vs 1.648 ms. The next step is to hide the
// epilogue (ping-pong: each consumer warpgroup its own item, as CUTLASS's pingpong kernel does).
//
// Drop-in for kernels/moe_gemm.cu in the dev harness: compiles the production file under other
// names and defines grouped_gemm_tc / grouped_gemm_swiglu_tc itself, taking this kernel where
// production would take its TMA loader (K % 8 == 0, 16-byte aligned pointers, the maps encodable,
// no DZ_MOE_GEMM_LOADS override), production otherwise (and always with DZ_MOE_GEMM_BASE=1).
//
// What changes against production (where thread 0 of the consumers issues the loads, and every
// stage's products are waited for before that divergent code runs, so the tensor cores idle while
// each warpgroup turns around):
//   - 3 warpgroups: warpgroup 0 the producer (thread 0 issues the TMA copies; all 128 threads
//     store A when the rows n < 128, as production's threads do), its registers given away with
//     setmaxnreg.dec to 56 (ptxas holds the code after it to that: at 40 the producer spilled);
//     warpgroups 1 and 2 the consumers of A rows 0..63 and 64..127 of the item (setmaxnreg.inc
//     to 224; ptxas -v: no spills for the plain kernel, 8 bytes for the SwiGLU epilogue);
//   - a consumer keeps one stage's products in flight (wgmma_wait<1>) while it waits for the next
//     stage, and releases a stage (empty mbarrier, one arrival per warp) once the products that
//     read it are done;
//   - the producer runs ahead across items, so the next item's first stages load during the
//     epilogue (as in production);
//   - (added after the first run, NOT yet measured) a consumer warpgroup whose 64 rows hold none of
//     the item's issues no products for it: an expert's tail of <= 64 rows no longer costs a full
//     128-row item of tensor time (ptxas: still no spills, no wgmma serialisation);
//   - (also added after the first run, NOT yet measured) the epilogue goes through a per-warp
//     staging tile in shared memory, 64 columns at a time, and out as whole 128-byte row lines:
//     the fragments' own bf16x2 stores fill half of each 32-byte sector they write, which matters
//     most for the down projections (K = 512 to 2048: the epilogue is a large share of an item).
// Same item order, tile shapes, swizzle and fp32 accumulation order as production: the outputs
// must be bitwise equal to its (the harness checks against fp64 and for determinism).
#define grouped_gemm_tc grouped_gemm_tc_base
#define grouped_gemm_swiglu_tc grouped_gemm_swiglu_tc_base
#include "../../moe_gemm.cu"
#undef grouped_gemm_tc
#undef grouped_gemm_swiglu_tc

namespace dz::cuda {

namespace {
namespace ws {

constexpr int kThreadsWs = 384;  // producer warpgroup + 2 consumer warpgroups

// Shared memory: production's layout (pipeline, mbarriers, offsets), then one epilogue staging
// tile per consumer warp: 16 rows x 64 bf16 columns, rows 144 bytes apart (conflict-free both ways).
constexpr int kStgRowB = 144, kStgWarpB = 16 * kStgRowB;
__host__ __device__ constexpr size_t stg_offset(int E) { return (size_t(kPipeB + kBarB) + 8 * size_t(E + 1) + 15) & ~size_t(15); }
size_t smem_ws(int E) { return 1024 + stg_offset(E) + 8 * size_t(kStgWarpB); }

template <bool SWIGLU>
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
  if (warp == 0) {
    const int per = (E + 31) / 32, b = min(E, lane * per), en = min(E, b + per);
    int sum = 0;
    for (int e = b; e < en; ++e) sum += (s_off[e + 1] - s_off[e] + kBM - 1) / kBM;
    int incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    int run = incl - sum;
    for (int e = b; e < en; ++e) {
      s_poff[e] = run;
      run += (s_off[e + 1] - s_off[e] + kBM - 1) / kBM;
    }
    if (lane == 31) s_poff[E] = incl;
  }
  const int n_rows = s_off[E];  // (s_off is complete after the first barrier)
  // TMA: A's box must stay inside rows [0, n); with n < 128 the producer's threads load A.
  const bool a_thr = n_rows < kBM;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), a_thr ? 128u : 1u);  // thread 0's expect_tx (+ the other producer threads)
      mbar_init(empty(s), 8);                 // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int total = s_poff[E] * a.n_col_tiles;
  if (int(blockIdx.x) >= total) return;
  const int G = gridDim.x;
  const int nq = (total - int(blockIdx.x) + G - 1) / G;  // items of this block
  const int k_iters = (K + kBK - 1) / kBK;
  const bool shift_tail = !a_thr;

  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    if (!a_thr && tid != 0) return;
    const int prow = tid >> 3, pch = tid & 7;  // a_thr: chunk pch of A rows prow + 16 i
    int e_hint = -1;
    int f = 0;  // fill index over the block's stages
    for (int q = 0; q < nq; ++q) {
      const Item it = map_item<BN>(blockIdx.x + q * G, a.n_col_tiles, s_off, s_poff, E, shift_tail, e_hint);
      const int brow = it.e * N + it.n0;
      for (int kk = 0; kk < k_iters; ++kk, ++f) {
        const int s = f % kStages, u = f / kStages;
        if (u > 0) mbar_wait(empty(s), (u - 1) & 1);
        const uint32_t sA = sbase + s * kStageB, sB = sA + kAStage;
        const int k0 = kk * kBK;
        if (a_thr) {  // n < 128: A rows from the threads (16-byte loads, zero past n and K)
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
          mbar_expect_tx(full(s), uint32_t(a_thr ? kBStage : kStageB));
          if (!a_thr) tma_load_2d(sA, &maps.a, k0, it.a0, full(s));
          tma_load_2d(sB, &maps.b0, k0, brow, full(s));
          if constexpr (SWIGLU) tma_load_2d(sB + kBStage / 2, &maps.b1, k0, brow, full(s));
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
    bool busy;
    {
      int e2 = e_hint;
      const Item it = map_item<BN>(blockIdx.x + q * G, a.n_col_tiles, s_off, s_poff, E, shift_tail, e2);
      const int lo = it.r0 - it.a0;
      busy = wm * 64 < lo + it.rows && wm * 64 + 64 > lo;
    }
    for (int kk = 0; kk < k_iters; ++kk, ++f) {
      const int s = f % kStages, u = f / kStages;
      mbar_wait(full(s), u & 1);
      if (busy) {
        const uint32_t st = sbase + s * kStageB;
        const uint64_t da = wgmma_desc_sw128(st + a_off), db = wgmma_desc_sw128(st + kAStage);
        wgmma_fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kBK / 16; ++j)
          wgmma_ss<256>(acc, wgmma_desc_add(da, j * 32), wgmma_desc_add(db, j * 32), (kk | j) != 0);
        wgmma_commit();
      }
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
    const Item cur = map_item<BN>(blockIdx.x + q * G, a.n_col_tiles, s_off, s_poff, E, shift_tail, e_hint);
    const int sh = cur.r0 - cur.a0;  // shared-memory row of the item's first row
    const int cbase = cur.n0 + (lane & 3) * 2;
    const int wr = wm * 64 + wq * 16;  // this warp's first shared-memory row
    const bool full_cols = a.vec_store && cur.n0 + BN <= N;
    if (wr + 16 <= sh || wr >= sh + cur.rows) continue;  // none of this warp's rows is the item's
    if (full_cols && (N & 7) == 0 && (reinterpret_cast<uintptr_t>(a.y) & 15) == 0) {
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
    } else if (full_cols && sh <= wr && wr + 16 <= sh + cur.rows) {
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
}

// The production run()'s TMA case with this kernel; false (nothing launched) where production
// would not take TMA.
bool run_ws(const bf16* xs, const bf16* w0, const bf16* w1, const int32_t* offsets, int E, int64_t max_tiles, int64_t N,
            const GluAct& act, int64_t K, bf16* y, bool swiglu, cudaStream_t s) {
  if (std::getenv("DZ_MOE_GEMM_BASE") || std::getenv("DZ_MOE_GEMM_LOADS")) return false;
  if (max_tiles <= 0 || N <= 0 || E <= 0 || K < 1 || E > kMaxE || N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31))
    return false;
  const bf16* wu = swiglu ? w1 : w0;
  if (!(K % 8 == 0 && aligned16(xs) && aligned16(w0) && aligned16(wu))) return false;
  if (!(int64_t(E) * N < (int64_t(1) << 31) && max_tiles * 64 < (int64_t(1) << 31))) return false;
  Args a;
  memset(&a, 0, sizeof(a));
  a.xs = xs;
  a.w0 = w0;
  a.w1 = wu;
  a.act = act;
  a.offsets = offsets;
  a.y = y;
  a.E = E;
  a.N = int(N);
  a.K = int(K);
  const int64_t bn = swiglu ? kBR / 2 : kBR;
  a.n_col_tiles = int((N + bn - 1) / bn);
  if (max_tiles * a.n_col_tiles >= (int64_t(1) << 31)) return false;
  a.vec_store = (N % 2 == 0) && (reinterpret_cast<uintptr_t>(y) & 3) == 0;
  Maps m;
  memset(&m, 0, sizeof(m));
  const auto enc = tensor_map_encoder();
  const int br = swiglu ? kBR / 2 : kBR;
  if (!enc || !encode(enc, &m.a, xs, max_tiles * 64, K, kBM) || !encode(enc, &m.b0, w0, int64_t(E) * N, K, br) ||
      !encode(enc, &m.b1, wu, int64_t(E) * N, K, br))
    return false;
  const size_t smem = smem_ws(E);
  if (smem > size_t(227) * 1024) return false;  // the staging tiles do not fit beside E's offsets
  auto kern = swiglu ? k_moe_gemm_ws<true> : k_moe_gemm_ws<false>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t max_items = max_tiles * a.n_col_tiles;
  const unsigned grid = unsigned(std::min<int64_t>(sm_count(), max_items));
  kern<<<grid, kThreadsWs, smem, s>>>(a, m);
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace ws
}  // namespace

void grouped_gemm_tc(const bf16* xs, const bf16* W, const int32_t* offsets, const int32_t* tile_off, int E,
                     int64_t max_tiles, int64_t N, int64_t K, bf16* y, cudaStream_t s) {
  if (!ws::run_ws(xs, W, nullptr, offsets, E, max_tiles, N, GluAct{}, K, y, false, s))
    grouped_gemm_tc_base(xs, W, offsets, tile_off, E, max_tiles, N, K, y, s);
}

void grouped_gemm_swiglu_tc(const bf16* xs, const bf16* Wg, const bf16* Wu, const int32_t* offsets,
                            const int32_t* tile_off, int E, int64_t max_tiles, int64_t N, int64_t K, bf16* h,
                            cudaStream_t s, const GluAct& act) {
  if (!ws::run_ws(xs, Wg, Wu, offsets, E, max_tiles, N, act, K, h, true, s))
    grouped_gemm_swiglu_tc_base(xs, Wg, Wu, offsets, tile_off, E, max_tiles, N, K, h, s, act);
}

}  // namespace dz::cuda
