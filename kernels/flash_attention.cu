// Causal flash-attention forward (see flash_attention.cuh), FlashAttention-2 style on mma.sync.
// Dk = Dv = 128 / 256 with aligned rows go to the Hopper wgmma kernel (flash_attention_wgmma.cu).
// One block = BM = 16 * MT * NW query rows of one (sequence, query head); warp w owns 16 * MT
// consecutive rows (MT = 1 in every instantiation below: 128-row blocks of 8 warps, except 64-row
// blocks of 4 warps for head dims <= 64).
// Per key tile of BN keys (double buffered in shared memory, the next tile's cp.async in flight
// while the current one is used):
//   S = Q K^T       warp: 16 rows x BN keys; Q fragments in registers (or re-read from shared
//                   memory when the accumulators leave too few registers), K by ldmatrix;
//   online softmax  in registers, rows split over the 4 lanes of a quad, exp2 of logits scaled
//                   by scale * log2(e) (one FFMA: scale > 0); the causal mask only on tiles that
//                   cross the warp's diagonal; tiles fully masked for a warp's rows are skipped
//                   by that warp;
//   O += P V        P re-packed from the S accumulators into bf16 A fragments (no shared memory),
//                   V by ldmatrix.trans.
// Shared-memory tiles are row-major with 16-byte chunks XOR-swizzled within each 128 bytes, so
// that ldmatrix reads and cp.async writes are free of bank conflicts. Head dims are padded to an
// instantiated size (DK, DV); the padded columns are zero-filled on load, rows past the sequence
// too. Rows that are not 16-byte aligned (head dim not a multiple of 8, or unaligned pointers)
// are loaded with scalar reads. Query tiles are visited heaviest first (reversed block index).
#include <cmath>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "flash_attention.cuh"
#include "flash_attention_wgmma.cuh"

namespace dz::cuda {

namespace {

using bf16 = __nv_bfloat16;

// Byte offset of 16-byte chunk ch of row r in a tile of CH chunks per row. Rows of >= 8 chunks
// swizzle by (r & 7); rows of 4 chunks (64 bytes, two rows per 128 bytes) by (r >> 1) & 3. Either
// way 8 consecutive rows at one logical chunk land in 8 distinct 16-byte bank groups.
template <int CH>
__device__ __forceinline__ uint32_t swz(int r, int ch) {
  static_assert(CH % 8 == 0 || CH == 4, "tile rows of 4 or a multiple of 8 chunks");
  if constexpr (CH >= 8) return uint32_t(r * (CH * 16) + ((ch ^ (r & 7)) << 4));
  else return uint32_t(r * 64 + ((ch ^ ((r >> 1) & 3)) << 4));
}

// flags passed to the kernel: which operands take 16-byte loads / 4-byte stores.
constexpr int kVecQ = 1, kVecK = 2, kVecV = 4, kPairOut = 8;

template <int DK_, int DV_, int NW_, int MT_, int BN_, bool QREG_, int MINB_>
struct Cfg {
  static constexpr int DK = DK_, DV = DV_, NW = NW_, MT = MT_, BN = BN_, MINB = MINB_;
  static constexpr bool QREG = QREG_;  // Q fragments held in registers for the whole block
  static constexpr int BM = 16 * MT * NW, NT = 32 * NW;  // warp: MT m-tiles of 16 query rows
  static constexpr int KCH = DK / 8, VCH = DV / 8;
  static_assert(DK % 32 == 0 && DV % 32 == 0 && BN % 16 == 0, "tile shapes");
  static constexpr int Q_BYTES = BM * DK * 2, K_BYTES = BN * DK * 2, V_BYTES = BN * DV * 2;
  static constexpr int Q_OFF = 0, K_OFF = Q_BYTES, V_OFF = K_OFF + 2 * K_BYTES;
  static constexpr int SMEM = V_OFF + 2 * V_BYTES;
};

// Rows [0, ROWS) x columns [0, CH * 8) of a tile from global rows base + r * stride (columns
// [0, D) real, the rest zero; rows >= nrows zero). vec: 16-byte cp.async (D % 8 == 0 and aligned),
// else scalar reads and plain shared stores (visible after the next barrier, like the cp.async).
template <int ROWS, int CH, int NT>
__device__ __forceinline__ void load_tile(uint8_t* smem, uint32_t sdst, const bf16* base, int64_t stride,
                                          int nrows, int D, bool vec, int tid) {
  constexpr int N = ROWS * CH;
  if constexpr (NT % CH == 0 && (NT / CH) % 8 == 0 && N % NT == 0) {
    // Fixed chunk per thread, rows r0 + j * RSTEP: the swizzle repeats every 8 rows, so the
    // shared and global addresses advance by compile-time steps.
    constexpr int RSTEP = NT / CH;
    const int c = tid % CH, r0 = tid / CH;
    const bool colok = c * 8 < D;
    const uint32_t d0 = sdst + swz<CH>(r0, c);
    if (vec) {
      const bf16* p = base + r0 * stride + c * 8;
#pragma unroll
      for (int j = 0; j < N / NT; ++j) {
        const bool ok = colok && r0 + j * RSTEP < nrows;
        cp_async16(d0 + j * (RSTEP * CH * 16), ok ? p + j * RSTEP * stride : base, ok);
      }
      return;
    }
  }
  if (vec) {
#pragma unroll
    for (int i0 = 0; i0 < N; i0 += NT) {
      const int i = i0 + tid;
      if (N % NT == 0 || i < N) {
        const int r = i / CH, c = i % CH;
        const bool ok = r < nrows && c * 8 < D;
        cp_async16(sdst + swz<CH>(r, c), ok ? base + r * stride + c * 8 : base, ok);
      }
    }
  } else {
    const uint32_t s0 = smem_u32(smem);
    for (int i = tid; i < N; i += NT) {
      const int r = i / CH, c = i % CH;
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (r < nrows) {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(base + r * stride);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int col = c * 8 + e;
          if (col < D) w[e >> 1] |= uint32_t(src[col]) << (16 * (e & 1));
        }
      }
      *reinterpret_cast<uint4*>(smem + (sdst - s0) + swz<CH>(r, c)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

template <class C>
__global__ void __launch_bounds__(C::NT, C::MINB)
    flash_attn_kernel(const FlashAttnArgs a, float scale_log2, int flags) {
  constexpr int DK = C::DK, DV = C::DV, BM = C::BM, BN = C::BN, NT = C::NT, KCH = C::KCH, VCH = C::VCH;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_u32(smem);
  const uint32_t sQ = sbase + C::Q_OFF;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, h = blockIdx.y;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BM;  // heaviest (latest) query tiles first
  const int64_t qs = a.cu_q[b];
  const int Lq = int(a.cu_q[b + 1] - qs);
  if (q0 >= Lq) return;
  const int64_t kstart = a.cu_k[b];
  const int Lk = int(a.cu_k[b + 1] - kstart);
  const int off = Lk - Lq;  // query i sees keys j <= i + off
  const int hk = h / (a.Hq / a.Hkv);
  const int n_keys = max(0, min(q0 + BM, Lq) + off);  // keys seen by some row of this tile
  const int n_tiles = (n_keys + BN - 1) / BN;

  const int64_t q_stride = int64_t(a.Hq) * a.Dk, k_stride = int64_t(a.Hkv) * a.Dk,
                v_stride = int64_t(a.Hkv) * a.Dv;
  const bf16* qb = a.q + ((qs + q0) * a.Hq + h) * int64_t(a.Dk);
  const bf16* kb = a.k + (kstart * a.Hkv + hk) * int64_t(a.Dk);
  const bf16* vb = a.v + (kstart * a.Hkv + hk) * int64_t(a.Dv);
  const bool vq = flags & kVecQ, vk = flags & kVecK, vv = flags & kVecV;

  auto load_k = [&](int t, int stage) {
    const int k0 = t * BN;
    load_tile<BN, KCH, NT>(smem, sbase + C::K_OFF + stage * C::K_BYTES, kb + k0 * k_stride, k_stride,
                           min(BN, Lk - k0), a.Dk, vk, tid);
  };
  auto load_v = [&](int t, int stage) {
    const int k0 = t * BN;
    load_tile<BN, VCH, NT>(smem, sbase + C::V_OFF + stage * C::V_BYTES, vb + k0 * v_stride, v_stride,
                           min(BN, Lk - k0), a.Dv, vv, tid);
  };

  // This warp's rows (16 MT of them; m-tile mt, half hf: row wr0 + 16 mt + 8 hf + g) and the key
  // tiles they see: [0, w_tiles), a prefix of the block's tiles.
  constexpr int MT = C::MT, WR = 16 * MT;
  const int wr0 = q0 + warp * WR;
  const bool live = wr0 < Lq;
  const int w_last = min(wr0 + WR - 1, Lq - 1) + off;  // last key any live row of the warp sees
  const int w_tiles = live && w_last >= 0 ? min(n_tiles, w_last / BN + 1) : 0;

  uint32_t qf[C::QREG ? MT : 1][C::QREG ? DK / 16 : 1][4];
  float o[MT][DV / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < DV / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  float m[MT][2], l[MT][2];  // running max (log2 units) and this lane's partial sums, per row
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  // Per-lane ldmatrix rows: Q / P-side A fragments (row lane & 15, chunk + lane >> 4), K B fragments
  // (key (lane & 7) + 8 (lane >> 4), chunk + ((lane >> 3) & 1)), V B fragments via .trans
  // (key lane & 15, chunk + lane >> 4).
  const int qrow = warp * WR + (lane & 15), qch = lane >> 4;
  const int krow = (lane & 7) + ((lane >> 4) << 3), kch = (lane >> 3) & 1;
  const int vrow = lane & 15, vch = lane >> 4;

  auto load_qf = [&] {
    if constexpr (C::QREG) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < DK / 16; ++kk) ldsm_x4(qf[mt][kk], sQ + swz<KCH>(qrow + 16 * mt, 2 * kk + qch));
    }
  };
  // S = Q K^T of the key tile in K stage `stage`.
  auto qk = [&](float (&s)[MT][BN / 8][4], int stage) {
    const uint32_t sK = sbase + C::K_OFF + stage * C::K_BYTES;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (C::QREG) {
#pragma unroll
          for (int r = 0; r < 4; ++r) af[mt][r] = qf[mt][kk][r];
        } else {
          ldsm_x4(af[mt], sQ + swz<KCH>(qrow + 16 * mt, 2 * kk + qch));
        }
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4];
        ldsm_x4(bk, sK + swz<KCH>(np * 16 + krow, 2 * kk + kch));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(s[mt][2 * np], af[mt], bk[0], bk[1]);
          mma_bf16(s[mt][2 * np + 1], af[mt], bk[2], bk[3]);
        }
      }
    }
  };
  // Causal mask, online softmax of S (key tile t), then O += P V with V from V stage `stage`.
  auto softmax_pv = [&](float (&s)[MT][BN / 8][4], int t, int stage) {
    const int k0 = t * BN;
    const bool diag = k0 + BN - 1 > wr0 + off;  // the tile crosses this warp's diagonal
    uint32_t pf[MT][BN / 16][4];  // P as A fragments: k-step c = keys 16c .. 16c + 15
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // Raw logits are masked and maximised; scale > 0, so max(scale * s) = scale * max(s) and
      // p = 2^(s * scale_log2 - max) is one FFMA + EX2.
      if (diag) {
        const int lim = wr0 + 16 * mt + g + off;  // row g sees keys <= lim, row g + 8 keys <= lim + 8
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = k0 + n * 8 + 2 * t4 + e;
            if (key > lim) s[mt][n][e] = -INFINITY;
            if (key > lim + 8) s[mt][n][2 + e] = -INFINITY;
          }
      }
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        mx0 = fmaxf(mx0, fmaxf(s[mt][n][0], s[mt][n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[mt][n][2], s[mt][n][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      mx0 = fmaxf(m[mt][0], mx0 * scale_log2);
      mx1 = fmaxf(m[mt][1], mx1 * scale_log2);
      const float u0 = mx0 == -INFINITY ? 0.f : mx0, u1 = mx1 == -INFINITY ? 0.f : mx1;
      const float al0 = ex2(m[mt][0] - u0), al1 = ex2(m[mt][1] - u1);  // 0 while the row has seen nothing
      m[mt][0] = mx0, m[mt][1] = mx1;
      float l0 = l[mt][0] * al0, l1 = l[mt][1] * al1;
#pragma unroll
      for (int n = 0; n < DV / 8; ++n) {
        o[mt][n][0] *= al0, o[mt][n][1] *= al0;
        o[mt][n][2] *= al1, o[mt][n][3] *= al1;
      }
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        const float p0 = ex2(fmaf(s[mt][n][0], scale_log2, -u0)), p1 = ex2(fmaf(s[mt][n][1], scale_log2, -u0));
        const float p2 = ex2(fmaf(s[mt][n][2], scale_log2, -u1)), p3 = ex2(fmaf(s[mt][n][3], scale_log2, -u1));
        l0 += p0 + p1;
        l1 += p2 + p3;
        pf[mt][n >> 1][(n & 1) * 2] = pack_bf16(p0, p1);
        pf[mt][n >> 1][(n & 1) * 2 + 1] = pack_bf16(p2, p3);
      }
      l[mt][0] = l0, l[mt][1] = l1;
    }
    const uint32_t sV = sbase + C::V_OFF + stage * C::V_BYTES;
#pragma unroll
    for (int c = 0; c < BN / 16; ++c) {
#pragma unroll
      for (int dp = 0; dp < DV / 16; ++dp) {
        uint32_t bv[4];
        ldsm_x4_t(bv, sV + swz<VCH>(c * 16 + vrow, 2 * dp + vch));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(o[mt][2 * dp], pf[mt][c], bv[0], bv[1]);
          mma_bf16(o[mt][2 * dp + 1], pf[mt][c], bv[2], bv[3]);
        }
      }
    }
  };

  // Tile it: K and V in stage it & 1; tile it + 1's loads in flight while it is used.
  load_tile<BM, KCH, NT>(smem, sQ, qb, q_stride, min(BM, Lq - q0), a.Dk, vq, tid);
  if (n_tiles > 0) load_k(0, 0), load_v(0, 0);
  cp_commit();
  for (int it = 0; it < n_tiles; ++it) {
    cp_wait<0>();
    __syncthreads();  // tile it is in; every warp is done with tile it - 1 (the other stage)
    if (it + 1 < n_tiles) load_k(it + 1, (it + 1) & 1), load_v(it + 1, (it + 1) & 1);
    cp_commit();
    if (it == 0) load_qf();
    if (it >= w_tiles) continue;  // every key of this tile is masked for this warp
    float s[MT][BN / 8][4];
    qk(s, it & 1);
    softmax_pv(s, it, it & 1);
  }
  cp_wait<0>();
  if (!live) return;

  // ---- normalise and store ----
  const int Dv = a.Dv;
  const bool pair = flags & kPairOut;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lr = l[mt][hf];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const float inv = lr > 0.f ? 1.f / lr : 0.f;
      const int row = wr0 + 16 * mt + 8 * hf + g;
      if (row >= Lq) continue;
      bf16* dst = a.out + ((qs + row) * a.Hq + h) * int64_t(Dv);
#pragma unroll
      for (int n = 0; n < DV / 8; ++n) {
        const int col = n * 8 + 2 * t4;
        if (col >= Dv) continue;
        const float x = o[mt][n][2 * hf] * inv, y = o[mt][n][2 * hf + 1] * inv;
        if (pair) {
          *reinterpret_cast<uint32_t*>(dst + col) = pack_bf16(x, y);
        } else {
          dst[col] = __float2bfloat16_rn(x);
          if (col + 1 < Dv) dst[col + 1] = __float2bfloat16_rn(y);
        }
      }
    }
}

template <class C>
void launch(const FlashAttnArgs& a, int flags, cudaStream_t s) {
  auto kern = flash_attn_kernel<C>;
  if (C::SMEM > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  const int64_t tiles = (a.max_q + C::BM - 1) / C::BM;
  DZ_CHECK(tiles < (int64_t(1) << 31) && a.Hq <= 65535 && a.B <= 65535, "flash_attention: grid ", tiles, " x ",
           a.Hq, " x ", a.B);
  const dim3 grid(unsigned(tiles), unsigned(a.Hq), unsigned(a.B));
  kern<<<grid, C::NT, C::SMEM, s>>>(a, a.scale * kLog2e, flags);
  CUDA_CHECK_LAUNCH();
}

// Instantiated padded sizes, cheapest first; a call takes the first that covers (Dk, Dv).
// Cfg<DK, DV, warps, m-tiles per warp, BN, Q in registers, min blocks per SM>, chosen on an H200
// (B = 1, T = 8K and 32K, causal; kernels/dev/flash_attn/test_flash_attn.cu --bench). Tried and
// slower there: 32 rows per warp (MT = 2; FA2's layout) with 4 or 8 warps, 2 blocks of 4 warps,
// BN = 32 / 64 for 128 x 128, Q in registers for 256 x 256 (spills), and issuing the next tile's
// Q K^T before this tile's softmax (registers; 10-20% slower).
using C32x32 = Cfg<32, 32, 4, 1, 64, true, 4>;
using C64x64 = Cfg<64, 64, 4, 1, 64, true, 3>;
using C128x64 = Cfg<128, 64, 8, 1, 64, true, 1>;
using C128x128 = Cfg<128, 128, 8, 1, 128, true, 1>;
using C192x128 = Cfg<192, 128, 8, 1, 128, true, 1>;
using C256x256 = Cfg<256, 256, 8, 1, 64, false, 1>;

}  // namespace

bool flash_attention_supports(int Dk, int Dv) { return Dk >= 1 && Dk <= 256 && Dv >= 1 && Dv <= 256; }

void flash_attention(const FlashAttnArgs& a, cudaStream_t s) {
  DZ_CHECK(flash_attention_supports(a.Dk, a.Dv), "flash_attention: head dims ", a.Dk, "/", a.Dv,
           " (1 .. 256 each)");
  DZ_CHECK(a.Hq >= 1 && a.Hkv >= 1 && a.Hq % a.Hkv == 0, "flash_attention: heads ", a.Hq, "/", a.Hkv);
  DZ_CHECK(a.scale > 0.f && std::isfinite(a.scale), "flash_attention: softmax scale ", a.scale, " (must be > 0)");
  DZ_CHECK(a.rows_q >= 0 && a.rows_k >= 0, "flash_attention: rows_q ", a.rows_q, " / rows_k ", a.rows_k,
           " (the q and k / v tensors' row counts must be set)");
  if (a.B <= 0 || a.max_q <= 0 || a.rows_q == 0) return;
  // rows_k == 0: no query sees a key (zeros, the mma.sync kernel's case; a TMA map needs rows)
  if (a.rows_k > 0 && flash_attention_wgmma_takes(a)) return flash_attention_wgmma(a, s);
  const int flags = (a.Dk % 8 == 0 && aligned16(a.q) ? kVecQ : 0) | (a.Dk % 8 == 0 && aligned16(a.k) ? kVecK : 0) |
                    (a.Dv % 8 == 0 && aligned16(a.v) ? kVecV : 0) |
                    (a.Dv % 2 == 0 && (reinterpret_cast<uintptr_t>(a.out) & 3) == 0 ? kPairOut : 0);
  const int Dk = a.Dk, Dv = a.Dv;
  if (Dk <= 32 && Dv <= 32) launch<C32x32>(a, flags, s);
  else if (Dk <= 64 && Dv <= 64) launch<C64x64>(a, flags, s);
  else if (Dk <= 128 && Dv <= 64) launch<C128x64>(a, flags, s);
  else if (Dk <= 128 && Dv <= 128) launch<C128x128>(a, flags, s);
  else if (Dk <= 192 && Dv <= 128) launch<C192x128>(a, flags, s);
  else launch<C256x256>(a, flags, s);
}

}  // namespace dz::cuda
