// Causal flash-attention forward on Hopper wgmma for Dk = Dv = 128 and 256 (the softmax layers of
// Qwen3.5 / Qwen3-Next (256) and of the 128-wide GQA models) and Dk = 192, Dv = 128 (MLA without an
// indexer: Kimi-Linear); flash_attention() in flash_attention.cu takes this kernel for those dims
// when q, k, v are 16-byte and out 4-byte aligned, the mma.sync kernel otherwise. Same semantics and numerics as that kernel (bf16
// operands, fp32 softmax and accumulation, P rounded to bf16 as the P V operand).
//
// Warp specialised, FlashAttention-3 style. Block = 128 query rows of one (sequence, query head),
// heaviest tiles first, 3 warpgroups:
//   - warpgroup 0 the producer: one thread loads Q once and K, V blocks of BN keys (128 for
//     Dk = 128 / 192, 64 for Dk = 256) by TMA (3-D maps over [rows, heads, D], boxes of 64 d x 1 head x
//     rows, 128-byte swizzle: the layout the wgmma descriptors read) into two stages each, full /
//     empty mbarriers per stage; its registers are given away (setmaxnreg.dec 24);
//   - warpgroups 1 and 2 the consumers of 64 query rows each (setmaxnreg.inc 240):
//       S = Q K^T   wgmma m64nBNk16, Q and K K-major from shared memory;
//       O += P V    wgmma m64nDvk16, P the register A operand (the S accumulator re-packed to bf16:
//                   accumulator and A-fragment layouts coincide), V N-major from shared memory;
//     step j issues S_j and P_{j-1} V_{j-1} together and runs the online softmax of S_j while P V
//     is on the tensor cores (intra-warpgroup overlap); a consumer releases a stage per warp
//     (predicated arrive) as soon as the products that read it are waited for;
//   - ping-pong: a consumer issues its products only when the other has issued its own (named
//     barriers 1 and 2), so one warpgroup's softmax runs while the other's products are on the
//     tensor cores. Both consumers walk every key block of the tile (uniform trip count: the named
//     barriers and the empty mbarriers count both); the first warpgroup's extra block on diagonal
//     tiles is fully masked (P = 0).
// The mask is branch-free, each step specialised on (S, P V) at compile time and P alternates
// between two register arrays: a branch or a register write inside a wgmma pipeline stage makes
// ptxas serialise the wgmmas (C7513 / C7520). Rows of other sequences inside a box (varlen) are
// loaded but masked (keys >= Lk) or not stored (queries >= Lq); boxes past the tensor's end are
// zero-filled by TMA, which is why the maps need the tensors' row counts (FlashAttnArgs::rows_q / _k).
// Measured on an H200 (kernels/dev/flash_attn/test_flash_attn.cu --bench, one command, 2026-12-02,
// docs/perf/experiments_c6788c6.txt): 256 / 256 GQA 16 / 2 at T = 32768 12.2 ms (718 TFLOP/s) vs
// 21.6 ms for the previous non-specialised wgmma kernel (every thread loading with cp.async, two
// block barriers per key block); 128 / 128 at T = 32768 13.5 ms (651) vs 23.7 ms.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "flash_attention_wgmma.cuh"
#include "mma_sm80.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dz::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kThreads = 384;  // 3 warpgroups

// DK: the q / k head dim, DV: v's (and the output's). DK = 192, DV = 128 is MLA without an indexer
// (Kimi-Linear's q.k over 128 + 64 RoPE dims): the 128 / 128 kernel's key block and registers, Q
// and K three 64-wide column blocks, 208 KB of shared memory.
template <int DK, int DV>
struct Shape {
  static constexpr int BN = DK == 256 ? 64 : 128;
  static constexpr int Q_BYTES = kBM * DK * 2, K_BYTES = BN * DK * 2, V_BYTES = BN * DV * 2;
  // alignment slack, Q, K x 2, V x 2, then 9 mbarriers
  static constexpr int SMEM = 1024 + Q_BYTES + 2 * K_BYTES + 2 * V_BYTES + 128;
  static_assert(SMEM <= 227 * 1024, "flash_attention (wgmma): shared memory");
};

struct Maps {
  CUtensorMap q, k, v;
};

// One arrival from the warp's lane 0, predicated (no branch: this runs inside wgmma stages).
__device__ __forceinline__ void mbar_arrive_lane0(uint32_t bar, int lane) {
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u32 p, %1, 0;\n @p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
}
// the two consumer warpgroups' named barriers (mma_sm80.cuh)
__device__ __forceinline__ void named_sync(int id) { bar_sync(id, 256); }
__device__ __forceinline__ void named_arrive(int id) { bar_arrive(id, 256); }
// bar.arrive when go != 0, predicated (it sits inside a wgmma stage: no branch there).
__device__ __forceinline__ void named_arrive_if(int id, int go) {
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n @p bar.arrive %0, 256;\n}\n" ::"r"(id), "r"(go) : "memory");
}

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads, 1) fa_wgmma_kernel(const __grid_constant__ Maps maps, const FlashAttnArgs a,
                                                            float sl2e) {
  using S = Shape<DK, DV>;
  // NCK / NCV: 64-wide column blocks of Q and K / of V
  constexpr int BN = S::BN, NS = BN / 2, NO = DV / 2, NCK = DK / 64, NCV = DV / 64;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase0 = smem_u32(smem_raw);
  const uint32_t sQ = sbase0 + ((1024u - (sbase0 & 1023u)) & 1023u), sK = sQ + S::Q_BYTES, sV = sK + 2 * S::K_BYTES;
  const uint32_t bQ = sV + 2 * S::V_BYTES;  // mbarriers: Q, full K[2], full V[2], empty K[2], empty V[2]
  auto fullK = [&](int s) { return bQ + 8 * (1 + s); };
  auto fullV = [&](int s) { return bQ + 8 * (3 + s); };
  auto emptyK = [&](int s) { return bQ + 8 * (5 + s); };
  auto emptyV = [&](int s) { return bQ + 8 * (7 + s); };

  const int b = blockIdx.z, h = blockIdx.y;
  const int q_beg = a.cu_q[b], Lq = a.cu_q[b + 1] - q_beg, k_beg = a.cu_k[b], Lk = a.cu_k[b + 1] - k_beg;
  const int tile = int(gridDim.x) - 1 - int(blockIdx.x);  // heaviest first
  if (tile * kBM >= Lq) return;
  const int q0 = tile * kBM, off = Lk - Lq;
  const int hk = h / (a.Hq / a.Hkv);
  const int kv_end = min(Lk, q0 + kBM + off);  // keys visible to the tile's last row
  const int n_blk = kv_end > 0 ? (kv_end + BN - 1) / BN : 0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  if (tid == 0) {
    mbar_init(bQ, 1);
    for (int s = 0; s < 2; ++s) {
      mbar_init(fullK(s), 1);
      mbar_init(fullV(s), 1);
      mbar_init(emptyK(s), 8);  // one arrival per consumer warp
      mbar_init(emptyV(s), 8);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) {
      mbar_expect_tx(bQ, S::Q_BYTES);
      for (int c = 0; c < NCK; ++c) tma_load_3d(sQ + c * kBM * 128, &maps.q, c * 64, h, q_beg + q0, bQ);
      for (int j = 0; j < n_blk; ++j) {
        const int s = j & 1;
        // stage s last held block j - 2: wait for the consumers' release of it (empty phase (j >> 1) - 1)
        if (j >= 2) mbar_wait(emptyK(s), ((j >> 1) - 1) & 1);
        mbar_expect_tx(fullK(s), S::K_BYTES);
        for (int c = 0; c < NCK; ++c)
          tma_load_3d(sK + s * S::K_BYTES + c * BN * 128, &maps.k, c * 64, hk, k_beg + j * BN, fullK(s));
        if (j >= 2) mbar_wait(emptyV(s), ((j >> 1) - 1) & 1);
        mbar_expect_tx(fullV(s), S::V_BYTES);
        for (int c = 0; c < NCV; ++c)
          tma_load_3d(sV + s * S::V_BYTES + c * BN * 128, &maps.v, c * 64, hk, k_beg + j * BN, fullV(s));
      }
    }
    return;
  }

  // consumers: warpgroup wm = wg - 1 owns query rows q0 + 64 wm .. + 63
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int wm = wg - 1, wq = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const int wrow = q0 + wm * 64 + wq * 16;  // the warp's first query row (in the sequence)
  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g, g + 8 (this thread's partial l)
  uint32_t pa[BN / 16][4], pb[BN / 16][4];
  const int my_bar = 1 + wm, other_bar = 2 - wm;  // ping-pong: warpgroup wm issues on barrier 1 + wm
  if (wm == 1) named_arrive(1);                   // the first warpgroup goes first
  mbar_wait(bQ, 0);

  // Step j: S_j (DO_S) and P_{j-1} V_{j-1} (DO_PV), specialised at compile time (no branch on them
  // inside a wgmma stage); last: no hand-over to the other warpgroup after it (the barrier counts).
  auto step = [&](int j, auto DO_S_, auto DO_PV_, auto& pin, auto& pout, bool last) {
    constexpr bool DO_S = decltype(DO_S_)::value, DO_PV = decltype(DO_PV_)::value;
    const int kv0 = j * BN;
    if constexpr (DO_S) mbar_wait(fullK(j & 1), (j >> 1) & 1);
    if constexpr (DO_PV) mbar_wait(fullV((j - 1) & 1), ((j - 1) >> 1) & 1);
    named_sync(my_bar);
    float s[NS];
    wgmma_fence_regs(o);
    wgmma_fence();
    if constexpr (DO_S) {
      const uint32_t kt = sK + (j & 1) * S::K_BYTES;
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        const uint32_t blk = kk >> 2, in = (kk & 3) * 32;
        wgmma_ss<BN>(s, wgmma_desc_sw128(sQ + blk * kBM * 128 + wm * 64 * 128 + in),
                     wgmma_desc_sw128(kt + blk * BN * 128 + in), kk > 0);
      }
      wgmma_commit();
    }
    if constexpr (DO_PV) {
      const uint32_t vt = sV + ((j - 1) & 1) * S::V_BYTES;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_rs_tb<DV>(o, pin[kk], wgmma_desc_nmajor_sw128(vt + kk * 16 * 128, BN * 128), 1);
      wgmma_commit();
    }
    named_arrive_if(other_bar, !last);
    if constexpr (DO_S) {
      if constexpr (DO_PV) wgmma_wait<1>();
      else wgmma_wait<0>();
      wgmma_fence_regs(s);
      mbar_arrive_lane0(emptyK(j & 1), lane);
      int lim[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) lim[hf] = min(wrow + g + 8 * hf + off, Lk - 1) - kv0 - 2 * t;
#pragma unroll
      for (int j8 = 0; j8 < BN / 8; ++j8)
#pragma unroll
        for (int q = 0; q < 4; ++q) s[4 * j8 + q] = 8 * j8 + (q & 1) > lim[q >> 1] ? -INFINITY : s[4 * j8 + q];
      float alpha[2], mu[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = m[hf];
#pragma unroll
        for (int j8 = 0; j8 < BN / 8; ++j8) mx = fmaxf(mx, fmaxf(s[4 * j8 + 2 * hf], s[4 * j8 + 2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mu[hf] = mx == -INFINITY ? 0.f : mx * sl2e;
        alpha[hf] = ex2(m[hf] * sl2e - mu[hf]);
        m[hf] = mx;
        l[hf] *= alpha[hf];
      }
#pragma unroll
      for (int j8 = 0; j8 < BN / 8; ++j8) {
        float p[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          p[q] = ex2(fmaf(s[4 * j8 + q], sl2e, -mu[q >> 1]));
          l[q >> 1] += p[q];
        }
        pout[j8 >> 1][(j8 & 1) * 2 + 0] = pack_bf16(p[0], p[1]);
        pout[j8 >> 1][(j8 & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
      }
      if constexpr (DO_PV) {
        wgmma_wait<0>();
        mbar_arrive_lane0(emptyV((j - 1) & 1), lane);
      }
      wgmma_fence_regs(o);
#pragma unroll
      for (int j8 = 0; j8 < DV / 8; ++j8)
#pragma unroll
        for (int q = 0; q < 4; ++q) o[4 * j8 + q] *= alpha[q >> 1];
    } else {
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      mbar_arrive_lane0(emptyV((j - 1) & 1), lane);
    }
  };
  using T_ = std::true_type;
  using F_ = std::false_type;
  if (n_blk > 0) {
    // steps 0 .. n_blk (the last one P V only); the warpgroup that went second hands over after
    // every step but its last, the first after every step (the other's last sync needs it)
    const bool second = wm == 1;
    int j = 0;
    step(j++, T_{}, F_{}, pb, pa, false);
    for (; j + 1 < n_blk; j += 2) {
      step(j, T_{}, T_{}, pa, pb, false);
      step(j + 1, T_{}, T_{}, pb, pa, false);
    }
    if (j < n_blk) {
      step(j++, T_{}, T_{}, pa, pb, false);
      step(j++, F_{}, T_{}, pb, pa, second);
    } else {
      step(j++, F_{}, T_{}, pa, pb, second);
    }
  } else if (wm == 0) {
    named_sync(1);  // the second warpgroup's opening hand-over
  }

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const float inv = lt > 0.f ? 1.f / lt : 0.f;
    const int qi = wrow + g + 8 * hf;
    if (qi >= Lq) continue;
    bf16* orow = a.out + (int64_t(q_beg) + qi) * a.Hq * DV + int64_t(h) * DV + 2 * t;
#pragma unroll
    for (int j8 = 0; j8 < DV / 8; ++j8)
      *reinterpret_cast<__nv_bfloat162*>(orow + 8 * j8) =
          __floats2bfloat162_rn(o[4 * j8 + 2 * hf] * inv, o[4 * j8 + 2 * hf + 1] * inv);
  }
}

// [T, H, D] bf16, boxes of 64 d x 1 head x rows, 128-byte swizzle, zeros past the tensor's end.
void encode3(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap* m, const bf16* p, int64_t T, int H, int D, int rows) {
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(H), cuuint64_t(T)};
  const cuuint64_t strides[2] = {cuuint64_t(D) * 2, cuuint64_t(H) * D * 2};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(rows)};
  const cuuint32_t estr[3] = {1, 1, 1};
  DZ_CHECK(enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(p), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS,
           "flash_attention (wgmma): tensor map of [", T, ", ", H, ", ", D, "]");
}

template <int DK, int DV>
void launch(const FlashAttnArgs& a, int64_t T_q, int64_t T_k, cudaStream_t s) {
  using S = Shape<DK, DV>;
  const PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  DZ_CHECK(enc, "flash_attention (wgmma): the driver has no cuTensorMapEncodeTiled");
  Maps maps;
  encode3(enc, &maps.q, a.q, T_q, a.Hq, DK, kBM);
  encode3(enc, &maps.k, a.k, T_k, a.Hkv, DK, S::BN);
  encode3(enc, &maps.v, a.v, T_k, a.Hkv, DV, S::BN);
  auto kern = fa_wgmma_kernel<DK, DV>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM));
  const int64_t tiles = (a.max_q + kBM - 1) / kBM;
  DZ_CHECK(tiles < (int64_t(1) << 31) && a.Hq <= 65535 && a.B <= 65535, "flash_attention (wgmma): grid ", tiles,
           " x ", a.Hq, " x ", a.B);
  kern<<<dim3(unsigned(tiles), unsigned(a.Hq), unsigned(a.B)), kThreads, S::SMEM, s>>>(
      maps, a, a.scale * kLog2e);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_wgmma_takes(const FlashAttnArgs& a) {
  const bool dims = (a.Dk == a.Dv && (a.Dk == 128 || a.Dk == 256)) || (a.Dk == 192 && a.Dv == 128);
  return dims && aligned16(a.q) && aligned16(a.k) && aligned16(a.v) &&
         (reinterpret_cast<uintptr_t>(a.out) & 3) == 0;
}

void flash_attention_wgmma(const FlashAttnArgs& a, cudaStream_t s) {
  DZ_CHECK(flash_attention_wgmma_takes(a), "flash_attention_wgmma: dims ", a.Dk, "/", a.Dv, " or alignment");
  // The tensor maps are built over the tensors' extents: the caller's row counts (a map past the
  // allocation would read out of it; one short of it would zero-fill real rows).
  // TMA coordinates are int32.
  DZ_CHECK(a.rows_q >= 1 && a.rows_k >= 1 && a.rows_q < (int64_t(1) << 31) && a.rows_k < (int64_t(1) << 31),
           "flash_attention (wgmma): rows_q ", a.rows_q, " / rows_k ", a.rows_k, " (the q and k / v row counts)");
  if (a.Dk == 128)
    launch<128, 128>(a, a.rows_q, a.rows_k, s);
  else if (a.Dk == 192)
    launch<192, 128>(a, a.rows_q, a.rows_k, s);
  else
    launch<256, 256>(a, a.rows_q, a.rows_k, s);
}

}  // namespace dz::cuda
