// Experiment (issue 12 / issue 11's e2e gap): causal flash attention with Hopper wgmma for the
// head dims that dominate the 2026 shapes' softmax layers (Dk = Dv = 128, and 256: Qwen3.5's gated
// GQA). Not yet run on a GPU: written 2026-12-02 after the session's device time was spent; the
// first device call runs `kernels/dev/flash_attn/run_wgmma.sh` (the full test of
// test_flash_attn.cu against this file, then the bench beside the production mma.sync kernel).
//
// Drop-in for kernels/flash_attention.cu in the dev harness: this file compiles the production
// kernel under other names and defines flash_attention() itself, taking the wgmma kernel for
// (128, 128) and (256, 256) with 16-byte aligned q / k / v and 4-byte aligned out, and the
// production kernel for everything else (and for all shapes with DZ_FA_MMA=1, the comparison).
//
// Design (FlashAttention-3's math without its warp specialisation, to start):
//   block = 128 query rows of one (sequence, query head), 2 warpgroups of 64 rows; heaviest first.
//   K / V tiles of BN keys (128 for D = 128, 64 for D = 256), two stages, loaded by every thread
//   with cp.async into the 128-byte swizzle (column blocks of 64 d, rows of 128 bytes, chunk
//   c at c ^ (row & 7)), made visible to the tensor cores by fence.proxy.async + a block barrier.
//   S = Q K^T:  wgmma m64nBNk16, Q and K both K-major from shared memory (D / 16 steps);
//   softmax:    online, in registers (rows split over a quad), exp2 of scale * log2(e) logits;
//               causal / length mask only on blocks that cross the warp's limit;
//   O += P V:   wgmma m64nDk16 with P as the register A operand (the S accumulator of 16 keys
//               re-packed to bf16: the accumulator and A-fragment layouts coincide), V from shared
//               memory N-major (imm-trans-b): leading byte offset = the 64-d column block stride
//               (BN * 128 bytes), stride byte offset = 8 keys (1024 bytes). If the first device
//               run shows P V wrong and S right, these two are the suspects (swap them).
//   Each group of wgmmas is waited for before any other code runs (ptxas serialises wgmmas
//   that stay in flight across divergent code: C7518, seen in kernels/moe_gemm.cu).
// Next steps once this is right: TMA loads with a producer warp, the next block's S issued
// before this block's softmax (two accumulators), and the intra-warpgroup ping-pong.
#define flash_attention flash_attention_mma
#define flash_attention_supports flash_attention_supports_mma
#include "../../flash_attention.cu"
#undef flash_attention
#undef flash_attention_supports

#include <cstdlib>
#include <type_traits>

#include "../../wgmma.cuh"
#include "wgmma_fa.cuh"

namespace dz::cuda {

namespace {
namespace w3 {

constexpr int kBM = 128, kThreads = 256;

template <int D>
struct Shape {
  static constexpr int BN = D == 128 ? 128 : 64;
  static constexpr int KCH = D / 8;  // 16-byte chunks per row
  static constexpr int Q_BYTES = kBM * D * 2, KV_BYTES = BN * D * 2;
  static constexpr int SMEM = 1024 + Q_BYTES + 4 * KV_BYTES;  // + alignment slack; K, V: 2 stages each
};

// N-major (transposed B) descriptor of a 128-byte-swizzled tile: lbo = the stride of the 64-wide
// column blocks along N, sbo = the stride of 8 rows along K.
__device__ __forceinline__ uint64_t desc_nmajor(uint32_t saddr, uint32_t lbo) {
  uint64_t d = uint64_t((saddr & 0x3FFFFu) >> 4);
  d |= uint64_t((lbo >> 4) & 0x3FFFu) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

template <int N>
__device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (N == 64) fa3::ss64(d, da, db, scale_d);
  else fa3::ss128(d, da, db, scale_d);
}
template <int N>
__device__ __forceinline__ void rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  if constexpr (N == 128) fa3::rs_tb128(d, a, db, scale_d);
  else fa3::rs_tb256(d, a, db, scale_d);
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) k_fa3(const FlashAttnArgs a, float sl2e) {
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

  // rows [r0, r0 + R) of a [*, D] operand (row stride rs; rows >= lim zero-filled) -> a tile of
  // D / 64 column blocks of R rows x 128 bytes, swizzled.
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
  if (n_blk > 0) {
    load_tile(sK, kg, ks, 0, Lk, RK{});
    load_tile(sV, vg, ks, 0, Lk, RK{});
  }
  cp_commit();
  if (n_blk > 1) {
    load_tile(sK + S::KV_BYTES, kg, ks, BN, Lk, RK{});
    load_tile(sV + S::KV_BYTES, vg, ks, BN, Lk, RK{});
  }
  cp_commit();

  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g, g + 8 (this thread's partial l)
  const int g = lane >> 2, t = lane & 3;
  const int wrow = q0 + wm * 64 + wq * 16;  // the warp's first query row (in the sequence)
  const int wg_last = q0 + wm * 64 + 63;    // the warpgroup's last query row

  for (int j = 0; j < n_blk; ++j) {
    cp_wait<1>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int st = j & 1, kv0 = j * BN;
    // Blocks past the warpgroup's last visible key are skipped by it (uniform per warpgroup).
    if (kv0 <= wg_last + off) {
      float s[NS];
      const uint32_t kt = sK + st * S::KV_BYTES, vt = sV + st * S::KV_BYTES;
      wgmma_fence_regs(s);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t blk = kk >> 2, in = (kk & 3) * 32;
        ss<BN>(s, wgmma_desc_sw128(sQ + blk * kBM * 128 + wm * 64 * 128 + in),
               wgmma_desc_sw128(kt + blk * BN * 128 + in), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(s);

      // mask: keys past the causal limit of the row or past Lk
      if (kv0 + BN - 1 > wrow + off || kv0 + BN > Lk) {
#pragma unroll
        for (int j8 = 0; j8 < BN / 8; ++j8)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int key = kv0 + 8 * j8 + 2 * t + (q & 1), qi = wrow + g + 8 * (q >> 1);
            if (key > qi + off || key >= Lk) s[4 * j8 + q] = -INFINITY;
          }
      }
      // online softmax per row hf (g, g + 8)
      float alpha[2], mu[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = m[hf];
#pragma unroll
        for (int j8 = 0; j8 < BN / 8; ++j8) mx = fmaxf(mx, fmaxf(s[4 * j8 + 2 * hf], s[4 * j8 + 2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mu[hf] = mx == -INFINITY ? 0.f : mx * sl2e;  // no key yet: exponents of -inf stay 0
        alpha[hf] = ex2(m[hf] * sl2e - mu[hf]);        // m = -inf: 0 (o and l are 0 then anyway)
        m[hf] = mx;
        l[hf] *= alpha[hf];
      }
#pragma unroll
      for (int j8 = 0; j8 < D / 8; ++j8)
#pragma unroll
        for (int q = 0; q < 4; ++q) o[4 * j8 + q] *= alpha[q >> 1];
      uint32_t pa[BN / 16][4];
#pragma unroll
      for (int j8 = 0; j8 < BN / 8; ++j8) {
        float p[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          p[q] = ex2(fmaf(s[4 * j8 + q], sl2e, -mu[q >> 1]));
          l[q >> 1] += p[q];  // fp32, before the bf16 rounding of the operand
        }
        // A fragment of k-step j8 / 2: (row g, cols 2t..), (row g + 8, ..), (row g, cols 8 + 2t..), (row g + 8, ..)
        pa[j8 >> 1][(j8 & 1) * 2 + 0] = pack_bf16(p[0], p[1]);
        pa[j8 >> 1][(j8 & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
      }
      wgmma_fence_regs(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) rs_tb<D>(o, pa[kk], desc_nmajor(vt + kk * 16 * 128, BN * 128), 1);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(o);
    }
    __syncthreads();  // every warp is done with stage st
    if (j + 2 < n_blk) {
      load_tile(sK + st * S::KV_BYTES, kg, ks, (j + 2) * BN, Lk, RK{});
      load_tile(sV + st * S::KV_BYTES, vg, ks, (j + 2) * BN, Lk, RK{});
    }
    cp_commit();
  }
  cp_wait<0>();

  // epilogue: O / l (zeros for a row that saw no key), bf16 pairs
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
  auto kern = k_fa3<D>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape<D>::SMEM));
  const int64_t tiles = (a.max_q + kBM - 1) / kBM;
  DZ_CHECK(tiles < (int64_t(1) << 31) && a.Hq <= 65535 && a.B <= 65535, "flash_attention (wgmma): grid ", tiles,
           " x ", a.Hq, " x ", a.B);
  kern<<<dim3(unsigned(tiles), unsigned(a.Hq), unsigned(a.B)), kThreads, Shape<D>::SMEM, s>>>(
      a, a.scale * 1.4426950408889634f);
  CUDA_CHECK_LAUNCH();
}

}  // namespace w3
}  // namespace

bool flash_attention_supports(int Dk, int Dv) { return flash_attention_supports_mma(Dk, Dv); }

void flash_attention(const FlashAttnArgs& a, cudaStream_t s) {
  const bool w3 = a.Dk == a.Dv && (a.Dk == 128 || a.Dk == 256) && aligned16(a.q) && aligned16(a.k) &&
                  aligned16(a.v) && (reinterpret_cast<uintptr_t>(a.out) & 3) == 0 && !std::getenv("DZ_FA_MMA");
  if (!w3) return flash_attention_mma(a, s);
  DZ_CHECK(a.Hq >= 1 && a.Hkv >= 1 && a.Hq % a.Hkv == 0, "flash_attention: heads ", a.Hq, "/", a.Hkv);
  DZ_CHECK(a.scale > 0.f && std::isfinite(a.scale), "flash_attention: softmax scale ", a.scale, " (must be > 0)");
  if (a.B <= 0 || a.max_q <= 0) return;
  if (a.Dk == 128)
    w3::launch<128>(a, s);
  else
    w3::launch<256>(a, s);
}

}  // namespace dz::cuda
