// Causal flash-attention forward on Hopper wgmma for Dk = Dv = 128 and 256 (the softmax layers of
// Qwen3.5 / Qwen3-Next (256) and of the 128-wide GQA models); flash_attention() in
// flash_attention.cu takes this kernel for those dims when q, k, v rows are 16-byte aligned and out
// 4-byte aligned, the mma.sync kernel otherwise. Same semantics and numerics as that kernel (bf16
// operands, fp32 softmax and accumulation, P rounded to bf16 as the P V operand).
//
// Block = 128 query rows of one (sequence, query head), 2 warpgroups of 64 rows; heaviest tiles
// first. K / V tiles of BN keys (128 for D = 128, 64 for D = 256) in two stages each, loaded by
// every thread with cp.async into the 128-byte swizzle (column blocks of 64 d, rows of 128 bytes,
// chunk c at c ^ (row & 7)) and handed to the tensor cores by fence.proxy.async + a barrier.
//   S = Q K^T   wgmma m64nBNk16, Q and K K-major from shared memory;
//   O += P V    wgmma m64nDk16, P the register A operand (the S accumulator of 16 keys re-packed to
//               bf16: accumulator and A-fragment layouts coincide), V N-major from shared memory.
// FlashAttention-3's intra-warpgroup overlap: step j issues S_j and P_{j-1} V_{j-1} together, waits
// for S_j alone, runs the online softmax of S_j while P V is on the tensor cores, then waits for it
// and rescales O. The mask is branch-free, each step is specialised on (S, P V) at compile time and
// P alternates between two register arrays: a branch or a register write inside a wgmma pipeline
// stage makes ptxas serialise the wgmmas (C7513 / C7520).
// Measured on an H200 (kernels/dev/flash_attn/test_flash_attn.cu --bench, one command, 2026-12-02):
// 256 / 256 GQA 16 / 2 at T = 32768: 21.7 ms (405 TFLOP/s) vs 27.9 ms for the mma.sync kernel;
// 128 / 128 at T = 32768: 23.6 ms (372) vs 25.9 ms. The same without the overlap: 22.6 / 25.9 ms.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "flash_attention_wgmma.cuh"
#include "mma_sm80.cuh"
#include "wgmma.cuh"

namespace dz::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kThreads = 256;

template <int D>
struct Shape {
  static constexpr int BN = D == 128 ? 128 : 64;
  static constexpr int KCH = D / 8;  // 16-byte chunks per row
  static constexpr int Q_BYTES = kBM * D * 2, KV_BYTES = BN * D * 2;
  static constexpr int SMEM = 1024 + Q_BYTES + 4 * KV_BYTES;  // + alignment slack; K, V: 2 stages each
};

// Shared-memory stages: step j reads K_j and V_{j-1}; its end refills K slot j & 1 with K_{j+2}
// and V slot (j + 1) & 1 with V_{j+1} (one cp.async group a step). Prologue groups: {Q, K_0},
// {K_1, V_0}; a step waits for all groups but the newest.
template <int D>
__global__ void __launch_bounds__(kThreads, 1) fa_wgmma_kernel(const FlashAttnArgs a, float sl2e) {
  using S = Shape<D>;
  constexpr int BN = S::BN, KCH = S::KCH, NS = BN / 2, NO = D / 2;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase0 = smem_u32(smem_raw);
  const uint32_t sQ = sbase0 + ((1024u - (sbase0 & 1023u)) & 1023u), sK = sQ + S::Q_BYTES, sV = sK + 2 * S::KV_BYTES;

  const int b = blockIdx.z, h = blockIdx.y;
  const int q_beg = a.cu_q[b], Lq = a.cu_q[b + 1] - q_beg, k_beg = a.cu_k[b], Lk = a.cu_k[b + 1] - k_beg;
  const int tile = int(gridDim.x) - 1 - int(blockIdx.x);  // heaviest first
  if (tile * kBM >= Lq) return;
  const int q0 = tile * kBM, off = Lk - Lq;
  const int hk = h / (a.Hq / a.Hkv);
  const int kv_end = min(Lk, q0 + kBM + off);  // keys visible to the tile's last row
  const int n_blk = kv_end > 0 ? (kv_end + BN - 1) / BN : 0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wq = warp & 3;
  const int64_t qs = int64_t(a.Hq) * D, ks = int64_t(a.Hkv) * D;  // row strides (elements)
  const bf16* qg = a.q + int64_t(q_beg) * qs + int64_t(h) * D;
  const bf16* kg = a.k + int64_t(k_beg) * ks + int64_t(hk) * D;
  const bf16* vg = a.v + int64_t(k_beg) * ks + int64_t(hk) * D;

  auto load_tile = [&](uint32_t dst, const bf16* src, int64_t rs, int r0, int lim, auto R_) {
    constexpr int R = decltype(R_)::value;
#pragma unroll 4
    for (int i = tid; i < R * KCH; i += kThreads) {
      const int r = i / KCH, c = i % KCH;
      const bool ok = r0 + r < lim;
      const uint32_t o = uint32_t((c >> 3) * R * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
      cp_async16(dst + o, ok ? src + int64_t(r0 + r) * rs + c * 8 : src, ok);
    }
  };
  using RQ = std::integral_constant<int, kBM>;
  using RK = std::integral_constant<int, BN>;
  load_tile(sQ, qg, qs, q0, Lq, RQ{});
  if (n_blk > 0) load_tile(sK, kg, ks, 0, Lk, RK{});
  cp_commit();
  if (n_blk > 1) load_tile(sK + S::KV_BYTES, kg, ks, BN, Lk, RK{});
  if (n_blk > 0) load_tile(sV, vg, ks, 0, Lk, RK{});
  cp_commit();

  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g, g + 8 (this thread's partial l)
  const int g = lane >> 2, t = lane & 3;
  const int wrow = q0 + wm * 64 + wq * 16;  // the warp's first query row (in the sequence)
  const int wg_last = q0 + wm * 64 + 63;    // the warpgroup's last query row
  // blocks this warpgroup reads: keys <= wg_last + off and < Lk
  const int n_wg = max(0, min(n_blk, (min(Lk - 1, wg_last + off) + BN) / BN));
  uint32_t pa[BN / 16][4];

  // One iteration: S_j (DO_S) and P_{j-1} V_{j-1} (DO_PV). The four loops below each run one
  // specialisation, so that no branch on these sits inside a wgmma pipeline stage (C7520);
  // every iteration has the same two block barriers whatever the warpgroup does.
  uint32_t pb[BN / 16][4];  // P of the other parity: step j reads pin = P_{j-1}, writes pout = P_j
  auto step = [&](int j, auto DO_S_, auto DO_PV_, auto& pin, auto& pout) {
    constexpr bool DO_S = decltype(DO_S_)::value, DO_PV = decltype(DO_PV_)::value;
    if (j < n_blk) cp_wait<1>();
    else cp_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if constexpr (DO_S || DO_PV) {
      const int kv0 = j * BN;
      float s[NS];
      wgmma_fence_regs(o);
      wgmma_fence();
      if constexpr (DO_S) {
        const uint32_t kt = sK + (j & 1) * S::KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint32_t blk = kk >> 2, in = (kk & 3) * 32;
          wgmma_ss<BN>(s, wgmma_desc_sw128(sQ + blk * kBM * 128 + wm * 64 * 128 + in),
                 wgmma_desc_sw128(kt + blk * BN * 128 + in), kk > 0);
        }
        wgmma_commit();
      }
      if constexpr (DO_PV) {
        const uint32_t vt = sV + ((j - 1) & 1) * S::KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
          wgmma_rs_tb<D>(o, pin[kk], wgmma_desc_nmajor_sw128(vt + kk * 16 * 128, BN * 128), 1);
        wgmma_commit();
      }
      if constexpr (DO_S) {
        if constexpr (DO_PV) wgmma_wait<1>();
        else wgmma_wait<0>();
        wgmma_fence_regs(s);
        // mask without branches: key kv0 + 8 j8 + 2 t + (q & 1) is visible to row hf iff
        // 8 j8 + (q & 1) <= lim[hf]
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
        if constexpr (DO_PV) wgmma_wait<0>();
        wgmma_fence_regs(o);
#pragma unroll
        for (int j8 = 0; j8 < D / 8; ++j8)
#pragma unroll
          for (int q = 0; q < 4; ++q) o[4 * j8 + q] *= alpha[q >> 1];
      } else {
        wgmma_wait<0>();
        wgmma_fence_regs(o);
      }
    }
    __syncthreads();  // every warp is done with K slot j & 1 and V slot (j - 1) & 1
    if (j + 2 < n_blk) load_tile(sK + (j & 1) * S::KV_BYTES, kg, ks, (j + 2) * BN, Lk, RK{});
    if (j + 1 < n_blk) load_tile(sV + ((j + 1) & 1) * S::KV_BYTES, vg, ks, (j + 1) * BN, Lk, RK{});
    cp_commit();
  };
  using T_ = std::true_type;
  using F_ = std::false_type;
  int j = 0;
  if (n_wg > 0) step(j++, T_{}, F_{}, pb, pa);
  for (; j + 1 < n_wg; j += 2) {  // two steps per trip: P alternates between pa and pb without copies
    step(j, T_{}, T_{}, pa, pb);
    step(j + 1, T_{}, T_{}, pb, pa);
  }
  if (j < n_wg) {
    step(j++, T_{}, T_{}, pa, pb);
    step(j++, F_{}, T_{}, pb, pa);
  } else if (n_wg > 0) {
    step(j++, F_{}, T_{}, pa, pb);
  }
  for (; j <= n_blk; ++j) step(j, F_{}, F_{}, pa, pb);

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const float inv = lt > 0.f ? 1.f / lt : 0.f;
    const int qi = wrow + g + 8 * hf;
    if (qi >= Lq) continue;
    bf16* orow = a.out + (int64_t(q_beg) + qi) * a.Hq * D + int64_t(h) * D + 2 * t;
#pragma unroll
    for (int j8 = 0; j8 < D / 8; ++j8)
      *reinterpret_cast<__nv_bfloat162*>(orow + 8 * j8) =
          __floats2bfloat162_rn(o[4 * j8 + 2 * hf] * inv, o[4 * j8 + 2 * hf + 1] * inv);
  }
}

template <int D>
void launch(const FlashAttnArgs& a, cudaStream_t s) {
  auto kern = fa_wgmma_kernel<D>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape<D>::SMEM));
  const int64_t tiles = (a.max_q + kBM - 1) / kBM;
  DZ_CHECK(tiles < (int64_t(1) << 31) && a.Hq <= 65535 && a.B <= 65535, "flash_attention (wgmma): grid ", tiles,
           " x ", a.Hq, " x ", a.B);
  kern<<<dim3(unsigned(tiles), unsigned(a.Hq), unsigned(a.B)), kThreads, Shape<D>::SMEM, s>>>(
      a, a.scale * 1.4426950408889634f);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_wgmma_takes(const FlashAttnArgs& a) {
  return a.Dk == a.Dv && (a.Dk == 128 || a.Dk == 256) && aligned16(a.q) && aligned16(a.k) && aligned16(a.v) &&
         (reinterpret_cast<uintptr_t>(a.out) & 3) == 0;
}

void flash_attention_wgmma(const FlashAttnArgs& a, cudaStream_t s) {
  DZ_CHECK(flash_attention_wgmma_takes(a), "flash_attention_wgmma: dims ", a.Dk, "/", a.Dv, " or alignment");
  if (a.Dk == 128)
    launch<128>(a, s);
  else
    launch<256>(a, s);
}

}  // namespace dz::cuda
