// Sparse MLA core on Hopper wgmma for the BF16 latent cache with (R, DR) = (512, 0) (GLM-5.3-Flash)
// and (512, 64) (DeepSeek-V3.2 / GLM-5), and the FP8 cache at (512, 64), when the call does not split
// the entries (prefill, large decode batches); sparse_mla() (sparse_mla.cu) routes there, to the
// mma.sync kernel otherwise (split-KV, R = 128). Same semantics as sparse_mla.cuh; P is rounded to
// bf16 for P V; FP8 entries are dequantized to bf16 (code x tile scale, rounded) as the mma.sync
// kernel does, by the producer into the same tiles (setmaxnreg 80 / 208 there instead of 72 / 216).
//
// Block = one query x 64 heads (one m64 tile), 384 threads, warp specialised:
//   warpgroup 2 (producer) gathers key block 2i into buffer 0 and 2i + 1 into buffer 1 by cp.async
//     (TMA cannot gather the rows of a paged cache) into the wgmma layout (column blocks of 64
//     dims, 128-byte rows, chunk c at c ^ (row & 7)), each buffer in two halves (column blocks
//     0-3 = value dims 0-255; 4 .. NCB - 1) with a full and an empty mbarrier each, refilling first
//     the halves that free first (buffer 0's left, buffer 1's right);
//   warpgroup w (consumer) owns O[:, 256 w .. 256 w + 255] and key block 2i + w: S_w = Q K_w^T as
//     m64n64 (Q read from shared memory once per 64 keys), the half freed first before the other;
//     w = 0: m' = max(m, rowmax S_0), P_0 = exp2(S_0 - m'), O += P_0 V_0[:, own] (P from registers);
//     w = 1: m'' = max(m', rowmax S_1) (m' from warpgroup 0), P_1 = exp2(S_1 - m''),
//            O += P_1 V_1[:, own];
//     then warpgroup 0 rescales O and P_0 by exp2(m' - m'') (P_0 rounded to bf16 once more when that
//     factor is not 1) and each takes the other's P (bf16 in shared memory) times its own value dims
//     of the other block.
//   Named barriers: 1 m' ready, 2 m'' ready, 3 P_0 stored, 4 P_1 stored, 5 the consumers.
// Every wgmma is waited for before a branch or a loop edge; the loop over block pairs is peeled so
// the last pair needs no branch inside (a wgmma in flight across a branch makes ptxas serialise
// them, C7520). Descriptors are recomputed in the loop (hoisted, they spill: 168 registers at
// launch, 216 for the consumers after setmaxnreg, 72 for the producer).
// With a selection the loop ends at the block pair of the query's last valid entry (see cend).
//
// Measured on an H200 (kernels/dev/sparse_mla/compare.sh, one command, 2026-12-03,
// docs/perf/experiments_2026-12-03f.txt), median of 3: GLM-5.3-Flash's shape (H 64, DR 0, K 2048,
// 8192 queries) 4.67 ms (412 TFLOP/s on valid entries) against 6.15 ms for the previous kernel (one
// warpgroup pair in step over 64-key chunks, S as two m64n32 halves, 4 block barriers a chunk; it
// was 6.98 ms before the chunk skip); DeepSeek-V3.2's (H 128, DR 64) 10.02 vs 12.95 ms. ncu of the
// previous kernel: tensor pipe 33 % busy, barrier stalls first.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "quant_device.cuh"
#include "sparse_mla_wgmma.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dz::cuda {

namespace {

constexpr int kThreads = 384, HB = 64, NK = 64, R = 512;
constexpr float kMinit = -1e30f;  // the running maximum's start: finite, so exp2(m - m') is never NaN

template <int DR>
struct Geo {
  static constexpr int DK = R + DR, DKC = DK / 8, NCB = DK / 64;  // dims, 16-byte chunks, column blocks
  static constexpr int CB = 64 * 128;                             // one column block of 64 rows
  static constexpr int KBUF = NCB * CB;                           // one key block
  static constexpr int Q_OFF = 0, K_OFF = NCB * CB, S1_OFF = K_OFF + 2 * KBUF;
  // P_0's tile: at DR = 64 in buffer 0's rope column block (only S reads it; 227 KiB is all there is)
  static constexpr int S0_OFF = DR ? K_OFF + 8 * CB : S1_OFF + CB;
  static constexpr int FLAG_OFF = S1_OFF + (DR ? 1 : 2) * CB;  // int [2][NK]: entry valid
  static constexpr int M0_OFF = FLAG_OFF + 2 * NK * 4;         // float [HB]: m'
  static constexpr int M1_OFF = M0_OFF + HB * 4;               // float [HB]: m''
  static constexpr int L_OFF = M1_OFF + HB * 4;                // float [2][HB]: the row sums
  static constexpr int LAST_OFF = L_OFF + 2 * HB * 4;          // int [12]: the last valid entry per warp
  static constexpr int BAR_OFF = LAST_OFF + 64;                // mbarriers: full [2][2], empty [2][2]
  static constexpr int SMEM = 1024 + BAR_OFF + 8 * 8;          // DR = 64: 226.6 KiB
  // byte offset of 16-byte chunk ch of row r (64-row tiles in column blocks)
  __device__ static __forceinline__ uint32_t off(int r, int ch) {
    return uint32_t((ch >> 3) * CB + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
  }
};
static_assert(Geo<64>::SMEM <= 227 * 1024, "sparse MLA (wgmma): shared memory at DR = 64");

// the two consumer warpgroups' named barriers (mma_sm80.cuh)
__device__ __forceinline__ void named_sync(int id) { bar_sync(id, 256); }
__device__ __forceinline__ void named_arrive(int id) { bar_arrive(id, 256); }
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One arrival from the warp's lane 0, predicated (no branch between wgmma issues and waits: a branch
// there makes ptxas serialise the wgmmas, C7520).
__device__ __forceinline__ void mbar_arrive_lane0(uint32_t bar, int lane) {
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u32 p, %1, 0;\n @p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
}
// Hides a value from the optimiser (keeps loop-invariant wgmma descriptors from being hoisted).
__device__ __forceinline__ void opaque(uint32_t& v) { asm volatile("" : "+r"(v)); }

// FP8: the cache's E4M3 codes (a fp32 scale per 128 dims) and bf16 RoPE rows, dequantized by the
// producer into the same bf16 tiles the consumers read (DR = 64 only).
template <int DR, bool FP8>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_wgmma_kernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ sel, int K,
                            const int32_t* __restrict__ seq, const int32_t* __restrict__ pos, int H, BlockTable bt,
                            const LatentCache cache_, float scale_log2, __nv_bfloat16* __restrict__ out) {
  static_assert(!FP8 || DR == 64, "sparse MLA (wgmma): the FP8 cache has a 64-dim RoPE part");
  using G = Geo<DR>;
  const __nv_bfloat16* __restrict__ cache = cache_.bf16;
  constexpr int DK = G::DK, DKC = G::DKC, NCB = G::NCB;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t pad = (1024u - (sraw & 1023u)) & 1023u;  // the 128-byte swizzle wants 1024-byte tiles
  uint8_t* smem = smem_raw + pad;
  const uint32_t sbase = sraw + pad;
  int* sFlag = reinterpret_cast<int*>(smem + G::FLAG_OFF);
  float* sM0 = reinterpret_cast<float*>(smem + G::M0_OFF);
  float* sM1 = reinterpret_cast<float*>(smem + G::M1_OFF);
  float* sL = reinterpret_cast<float*>(smem + G::L_OFF);
  int* sLast = reinterpret_cast<int*>(smem + G::LAST_OFF);
  const uint32_t bars = sbase + G::BAR_OFF;
  auto full = [&](int b, int h) { return bars + 8u * uint32_t(2 * b + h); };
  auto empty = [&](int b, int h) { return bars + 8u * uint32_t(4 + 2 * b + h); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  const int64_t qi = blockIdx.y;
  const int h0 = blockIdx.x * HB;
  const int p = pos[qi];
  const int32_t sq = seq[qi];
  const int32_t* selq = sel ? sel + qi * K : nullptr;
  const int nchunks = (K + NK - 1) / NK;
  int cend = selq ? nchunks : min(nchunks, p / NK + 1);

  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(full(b, 0), 128 + 64);  // every producer thread's cp.asyncs + the 64 writers of the valid flags
      mbar_init(full(b, 1), 128);
      mbar_init(empty(b, 0), 4);  // one arrival per consumer warp
      mbar_init(empty(b, 1), 4);
    }
    mbar_init_fence();
  }
  // With a selection, the blocks after the last valid entry (idx in [0, p]) are skipped: a block of
  // masked entries leaves m, l and O as they are, so the outputs are those of the whole loop. The
  // indexers write a query's entries first and pad with -1, so a query before position K (a
  // prefill's first K tokens) ends early: ~1/8 of the blocks of an 8192-token prefill with Top-2048.
  int last = -1;
  if (selq) {
    for (int k = tid; k < K; k += kThreads) {  // ascending k per thread: the thread's last valid entry
      const int v = __ldg(selq + k);
      if (v >= 0 && v <= p) last = k;
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0) sLast[warp] = last;
  }
  __syncthreads();
  if (selq) {
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) last = max(last, sLast[i]);
    cend = (last + NK) / NK;  // last = -1: no block
  }
  const int niter = (cend + 1) / 2;  // block pairs; a pair's second block past cend is all masked

  if (wg == 2) {  // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FP8 ? 80 : 72) : "memory");  // FP8: its codes in registers
    // thread -> key row pt / 2 of both blocks of a pair, 16-byte chunks pt % 2 + 2 j
    const int pt = tid - 256, sub = pt & 1, row = pt >> 1;
    int idx[2];
    int32_t pg[2];
    auto fetch = [&](int it, int (&ix)[2], int32_t (&pgo)[2]) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int kc = 2 * it + b, kidx = kc * NK + row;
        ix[b] = (kc < cend && kidx < K) ? (selq ? __ldg(selq + kidx) : kidx) : -1;
      }
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int v = ix[b];
        pgo[b] = (v >= 0 && v <= p) ? __ldg(bt.table + int64_t(sq) * bt.max_pages + v / bt.page_size) : 0;
      }
    };
    // half h of the key block in buffer b; h = 0 also writes the valid flags (then arrives: release)
    auto copy_half = [&](int b, int h) {
      const uint32_t dst = sbase + G::K_OFF + b * G::KBUF;
      const int v = idx[b];
      const bool valid = v >= 0 && v <= p;
      const int64_t slot = valid ? int64_t(pg[b]) * bt.page_size + v % bt.page_size : 0;
      const __nv_bfloat16* src = cache + slot * DK;
      if (h == 0) {
#pragma unroll
        for (int j = 0; j < 16; ++j) cp_async16(dst + G::off(row, sub + 2 * j), src + (sub + 2 * j) * 8, valid);
        if (sub == 0) {
          sFlag[b * NK + row] = valid;
          mbar_arrive(full(b, 0));
        }
      } else {
#pragma unroll
        for (int j = 16; j < DKC / 2; ++j) cp_async16(dst + G::off(row, sub + 2 * j), src + (sub + 2 * j) * 8, valid);
      }
      cp_async_mbar_arrive(full(b, h));
    };
    if constexpr (FP8) {
      // Thread (row, sub) dequantizes 16 whole chunks a half (one 128-dim scale tile): half 0 dims
      // 128 sub .. +127, half 1 dims 256 + 128 sub .. +127 and RoPE chunks 64 + 4 sub .. +3. The
      // codes are loaded before the wait for the buffer (their latency under it), then converted,
      // stored, made visible to the async proxy and the arrival given (128 a half, + 64 flags).
      // Rows not selected (or past the query) are zeros, as cp.async's zero fill gives the bf16 path.
      uint4 rc[8];
      float rs = 0.f;
      bool rv = false;
      int64_t rslot = 0;
      auto load_half = [&](int b, int h) {
        const int v = idx[b];
        rv = v >= 0 && v <= p;
        const int64_t slot = rv ? int64_t(pg[b]) * bt.page_size + v % bt.page_size : 0;
        const int tile = 2 * h + sub;
        if (rv) {
          const uint4* cs = reinterpret_cast<const uint4*>(cache_.codes + slot * R + tile * 128);
#pragma unroll
          for (int j = 0; j < 8; ++j) rc[j] = __ldg(cs + j);
          rs = __ldg(cache_.scales + slot * (R / 128) + tile);
        }
        rslot = slot;
      };
      auto store_half = [&](int b, int h) {
        uint8_t* dst = smem + G::K_OFF + b * G::KBUF;
        const int c0 = 16 * (2 * h + sub);  // this thread's first value chunk
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // 16 codes -> chunks c0 + 2 j, c0 + 2 j + 1
          uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
          if (rv) {
            const uint32_t w4[4] = {rc[j].x, rc[j].y, rc[j].z, rc[j].w};
            uint32_t o8[8];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 a = dev::e4m3x2_to_f2(uint16_t(w4[e] & 0xFFFFu));
              const float2 c = dev::e4m3x2_to_f2(uint16_t(w4[e] >> 16));
              o8[2 * e] = pack_bf16(a.x * rs, a.y * rs);
              o8[2 * e + 1] = pack_bf16(c.x * rs, c.y * rs);
            }
            lo = make_uint4(o8[0], o8[1], o8[2], o8[3]);
            hi = make_uint4(o8[4], o8[5], o8[6], o8[7]);
          }
          *reinterpret_cast<uint4*>(dst + G::off(row, c0 + 2 * j)) = lo;
          *reinterpret_cast<uint4*>(dst + G::off(row, c0 + 2 * j + 1)) = hi;
        }
        if (h == 1) {  // the RoPE chunks, loaded only now (with the codes they would not fit 72 registers)
          uint4 rr[4];
          const uint4* rp = reinterpret_cast<const uint4*>(cache_.rope + rslot * DR) + 4 * sub;
#pragma unroll
          for (int j = 0; j < 4; ++j) rr[j] = rv ? __ldg(rp + j) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int j = 0; j < 4; ++j) *reinterpret_cast<uint4*>(dst + G::off(row, 64 + 4 * sub + j)) = rr[j];
        } else if (sub == 0) {
          sFlag[b * NK + row] = rv;
          mbar_arrive(full(b, 0));
        }
        fence_proxy_async();  // the generic-proxy stores -> the consumers' wgmma (async proxy)
        mbar_arrive(full(b, h));
      };
      if (niter > 0) fetch(0, idx, pg);
      for (int it = 0; it < niter; ++it) {
        const uint32_t par = uint32_t(it - 1) & 1u;
        load_half(0, 0);
        if (it) mbar_wait(empty(0, 0), par);
        store_half(0, 0);
        load_half(1, 1);
        if (it) mbar_wait(empty(1, 1), par);
        store_half(1, 1);
        int nidx[2];
        int32_t npg[2];
        if (it + 1 < niter) fetch(it + 1, nidx, npg);
        load_half(0, 1);
        if (it) mbar_wait(empty(0, 1), par);
        store_half(0, 1);
        load_half(1, 0);
        if (it) mbar_wait(empty(1, 0), par);
        store_half(1, 0);
        if (it + 1 < niter) idx[0] = nidx[0], idx[1] = nidx[1], pg[0] = npg[0], pg[1] = npg[1];
      }
      return;
    }
    if (niter > 0) fetch(0, idx, pg);
    for (int it = 0; it < niter; ++it) {
      const uint32_t par = uint32_t(it - 1) & 1u;  // the empty phases of the previous pair
      if (it) mbar_wait(empty(0, 0), par);  // warpgroup 0's own product (early)
      copy_half(0, 0);
      if (it) mbar_wait(empty(1, 1), par);  // warpgroup 1's own product (early)
      copy_half(1, 1);
      int nidx[2];
      int32_t npg[2];
      if (it + 1 < niter) fetch(it + 1, nidx, npg);  // the next pair's addresses, in flight while waiting
      if (it) mbar_wait(empty(0, 1), par);  // warpgroup 1's product with P_0 (late)
      copy_half(0, 1);
      if (it) mbar_wait(empty(1, 0), par);  // warpgroup 0's product with P_1 (late)
      copy_half(1, 0);
      if (it + 1 < niter) idx[0] = nidx[0], idx[1] = nidx[1], pg[0] = npg[0], pg[1] = npg[1];
    }
    return;
  }

  // ---------------- consumers: warpgroup w = wg owns key block 2 i + w and O[:, 256 w ..] ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FP8 ? 208 : 216) : "memory");
  const int ct = tid, wq = warp & 3, g = lane >> 2, t = lane & 3;
  // Q tile (rows past H are zeros), in the wgmma layout.
  for (int i = ct; i < HB * DKC; i += 256) {
    const int row = i / DKC, ch = i % DKC;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + row < H) v = *reinterpret_cast<const uint4*>(q + ((qi * H + h0 + row) * DK + ch * 8));
    *reinterpret_cast<uint4*>(smem + G::Q_OFF + G::off(row, ch)) = v;
  }
  fence_proxy_async();
  named_sync(5);

  // the consumers' code once per warpgroup, w a constant: no branch on it near a wgmma
  auto consume = [&](auto w_) {
  constexpr int w = decltype(w_)::value;
  const int r0 = wq * 16 + g, r1 = r0 + 8;  // this thread's heads (rows of every product)
  uint32_t sQ_ = sbase + G::Q_OFF, kOwn_ = sbase + G::K_OFF + w * G::KBUF;
  uint32_t kOth_ = sbase + G::K_OFF + (w ^ 1) * G::KBUF;
  const uint32_t pOth = sbase + (w ? G::S0_OFF : G::S1_OFF);
  const int* flags = sFlag + w * NK;
  uint8_t* pOwnPtr = smem + (w ? G::S1_OFF : G::S0_OFF);

  float o[128];  // O[:, 256 w .. 256 w + 255]: d[4 j + q] = head r0 (q < 2) / r1, column 8 j + 2 t + (q & 1)
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[32];  // S_w: d[4 j + q] = head r0 / r1, key 8 j + 2 t + (q & 1)
  float m[2] = {kMinit, kMinit}, l[2] = {0.f, 0.f};  // running max (log2 units), this thread's partial row sums

  // S over column blocks [c0, c1) of buffer kOwn (the first call clears)
  auto qk = [&](uint32_t sQ, uint32_t kOwn, auto c0_, auto c1_, auto first_) {
    constexpr int c0 = decltype(c0_)::value, c1 = decltype(c1_)::value;
    constexpr bool first = decltype(first_)::value;
#pragma unroll
    for (int cb = c0; cb < c1; ++cb)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_ss<64>(s, wgmma_desc_sw128(sQ + cb * G::CB + kk * 32), wgmma_desc_sw128(kOwn + cb * G::CB + kk * 32),
                     (first && cb == c0 && kk == 0) ? 0 : 1);
  };
  // warpgroup 0 takes its left half first, warpgroup 1 its right half (the halves freed first)
  using Ca0 = std::integral_constant<int, w ? 4 : 0>;
  using Ca1 = std::integral_constant<int, w ? NCB : 4>;
  using Cb0 = std::integral_constant<int, w ? 0 : 4>;
  using Cb1 = std::integral_constant<int, w ? 4 : NCB>;
  // S = Q K_w^T once both halves of the block are in (every wgmma is waited for before a branch or
  // a spin: one in flight across them makes ptxas serialise the wgmmas, C7520)
  auto issue_qk = [&](uint32_t ph) {
    opaque(sQ_), opaque(kOwn_);  // no descriptors hoisted out of the loop (they would take ~150 registers)
    const uint32_t sQ = sQ_, kOwn = kOwn_;
    mbar_wait(full(w, w), ph);
    fence_proxy_async();
    wgmma_fence();
    qk(sQ, kOwn, Ca0{}, Ca1{}, std::true_type{});
    wgmma_commit();
    mbar_wait(full(w, w ^ 1), ph);
    fence_proxy_async();
    qk(sQ, kOwn, Cb0{}, Cb1{}, std::false_type{});
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(s);
  };
  // S: mask invalid keys, scale to log2 units; returns this block's row maxima
  auto mask_max = [&](float& mx0, float& mx1) {
    mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = flags[8 * j + 2 * t + e] != 0;
        s[4 * j + e] = ok ? s[4 * j + e] * scale_log2 : -INFINITY;
        s[4 * j + 2 + e] = ok ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
        mx0 = fmaxf(mx0, s[4 * j + e]);
        mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  };
  // O *= (a0, a1) per row, skipped when the warp's factors are all 1 (the maximum did not move: most
  // blocks once it has settled); no wgmma is in flight here, so the branch is free
  auto rescale = [&](float a0, float a1) {
    if (__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) return;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= a0;
      o[4 * j + 1] *= a0;
      o[4 * j + 2] *= a1;
      o[4 * j + 3] *= a1;
    }
  };
  // P = exp2(S - n) in s, its bf16 A fragments, l = l * alpha + row sums, O *= alpha
  uint32_t pa[4][4];
  auto softmax = [&](float n0, float n1) {
    const float al0 = ex2(m[0] - n0), al1 = ex2(m[1] - n1);
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[4 * j] = ex2(s[4 * j] - n0);
      s[4 * j + 1] = ex2(s[4 * j + 1] - n0);
      s[4 * j + 2] = ex2(s[4 * j + 2] - n1);
      s[4 * j + 3] = ex2(s[4 * j + 3] - n1);
      s0 += s[4 * j] + s[4 * j + 1];
      s1 += s[4 * j + 2] + s[4 * j + 3];
      pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(s[4 * j], s[4 * j + 1]);
      pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
    }
    l[0] = l[0] * al0 + s0;
    l[1] = l[1] * al1 + s1;
    m[0] = n0, m[1] = n1;
    rescale(al0, al1);
  };
  // P (the bf16 fragments, times f per row: f = 1 leaves them as they are) into this warpgroup's P
  // tile for the other warpgroup
  auto store_p = [&](float f0, float f1) {
    auto scaled = [](uint32_t v, float f) {
      return pack_bf16(__uint_as_float(v << 16) * f, __uint_as_float(v & 0xffff0000u) * f);
    };
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int key = 8 * j + 2 * t;  // P tile: row = head, 64 keys = one column block
      *reinterpret_cast<uint32_t*>(pOwnPtr + G::off(r0, key >> 3) + (key & 7) * 2) =
          scaled(pa[j >> 1][(j & 1) * 2 + 0], f0);
      *reinterpret_cast<uint32_t*>(pOwnPtr + G::off(r1, key >> 3) + (key & 7) * 2) =
          scaled(pa[j >> 1][(j & 1) * 2 + 1], f1);
    }
    fence_proxy_async();  // P tile -> the other warpgroup's wgmma
  };
  auto pv_own = [&]() {  // O += P (registers) V_own[:, 256 w ..]
    opaque(kOwn_);
    const uint32_t kOwn = kOwn_;
    wgmma_fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_rs_tb<256>(o, pa[kk], wgmma_desc_nmajor_sw128(kOwn + w * 4 * G::CB + kk * 16 * 128, G::CB), 1);
    wgmma_commit();
  };
  auto pv_other = [&]() {  // O += P_other (shared) V_other[:, 256 w ..]
    opaque(kOth_);
    const uint32_t kOth = kOth_;
    wgmma_fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_ss_tb<256>(o, wgmma_desc_sw128(pOth + kk * 32),
                       wgmma_desc_nmajor_sw128(kOth + w * 4 * G::CB + kk * 16 * 128, G::CB), 1);
    wgmma_commit();
  };

  // One block pair; the last one issues no next S (no branch inside: the loop is peeled).
  auto body = [&](int it, auto last_) {
    constexpr bool last = decltype(last_)::value;
    float mx0, mx1;
    mask_max(mx0, mx1);
    if constexpr (w == 0) {
      const float n0 = fmaxf(m[0], mx0), n1 = fmaxf(m[1], mx1);
      sM0[r0] = n0, sM0[r1] = n1;  // the quad's 4 lanes store the same value
      named_arrive(1);
      softmax(n0, n1);
      pv_own();
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      mbar_arrive_lane0(empty(0, 0), lane);
      named_sync(2);
      const float f0 = ex2(n0 - sM1[r0]), f1 = ex2(n1 - sM1[r1]);
      m[0] = sM1[r0], m[1] = sM1[r1];
      l[0] *= f0, l[1] *= f1;
      rescale(f0, f1);
      store_p(f0, f1);
      named_arrive(3);
      named_sync(4);
      pv_other();
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      mbar_arrive_lane0(empty(1, 0), lane);
    } else {
      named_sync(1);
      const float n0 = fmaxf(sM0[r0], mx0), n1 = fmaxf(sM0[r1], mx1);  // sM0 >= m (it took m in)
      sM1[r0] = n0, sM1[r1] = n1;
      named_arrive(2);
      softmax(n0, n1);
      pv_own();
      store_p(1.f, 1.f);
      named_arrive(4);
      named_sync(3);
      pv_other();
      wgmma_wait<1>();  // the own product: buffer 1's right half is free
      wgmma_fence_regs(o);
      mbar_arrive_lane0(empty(1, 1), lane);
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      mbar_arrive_lane0(empty(0, 1), lane);
    }
    if constexpr (!last) issue_qk(uint32_t(it + 1) & 1u);
  };
  if (niter > 0) {
    issue_qk(0);
    for (int it = 0; it + 1 < niter; ++it) body(it, std::false_type{});
    body(niter - 1, std::true_type{});
  }

  // l = both warpgroups' row sums (against the same final maximum)
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
  }
  if (t == 0) sL[w * HB + r0] = l[0], sL[w * HB + r1] = l[1];
  named_sync(5);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r1 : r0;
    if (h0 + r >= H) continue;
    const float lt = sL[r] + sL[HB + r];
    const float inv = lt > 0.f ? 1.f / lt : 0.f;
    __nv_bfloat16* dst = out + (qi * H + h0 + r) * R + w * 256 + 2 * t;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack_bf16(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
  }
  };
  if (wg == 0)
    consume(std::integral_constant<int, 0>{});
  else
    consume(std::integral_constant<int, 1>{});
}

template <int DR, bool FP8>
void launch(const __nv_bfloat16* q, const int32_t* sel, int K, const int32_t* seq, const int32_t* pos, int64_t nq,
            int H, const BlockTable& bt, const LatentCache& cache, float scale, __nv_bfloat16* out,
            cudaStream_t stream) {
  constexpr int smem = Geo<DR>::SMEM;
  auto kern = sparse_mla_wgmma_kernel<DR, FP8>;
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(unsigned((H + HB - 1) / HB), unsigned(nq));
  kern<<<grid, kThreads, smem, stream>>>(q, sel, K, seq, pos, H, bt, cache, scale * kLog2e, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool sparse_mla_wgmma_takes(const LatentCache& cache, int64_t nq, int nsplit) {
  return cache.R == 512 && (cache.DR == 64 || (cache.DR == 0 && !cache.fp8)) && nq > 0 && nq < 65536 && nsplit == 1;
}

void sparse_mla_wgmma(const __nv_bfloat16* q, const int32_t* sel, int32_t K, const int32_t* seq, const int32_t* pos,
                      int64_t nq, int32_t H, const BlockTable& bt, const LatentCache& cache, float scale,
                      __nv_bfloat16* out, cudaStream_t stream) {
  DZ_CHECK(sparse_mla_wgmma_takes(cache, nq, 1) && K >= 1 && H >= 1, "sparse_mla_wgmma: cache (", cache.R, ", ",
           cache.DR, cache.fp8 ? ", fp8" : "", "), ", nq, " queries, K ", K, ", H ", H);
  if (cache.DR == 0)
    launch<0, false>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream);
  else if (cache.fp8)
    launch<64, true>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream);
  else
    launch<64, false>(q, sel, K, seq, pos, nq, H, bt, cache, scale, out, stream);
}

}  // namespace dz::cuda
