// Fused DSA indexer + Top-K (see indexer.cuh). Tensor-core layout: for one query, A = q [H, D]
// (heads as rows, held in registers for the whole key loop), B = 16 keys per warp step read
// straight from the paged cache into registers. The reduction dimension is permuted (a dot
// product does not care): lane c of a quad holds dims [c*D/4, (c+1)*D/4) of its row, so every
// lane loads one contiguous 16-byte-aligned run (and, for MXFP8, exactly one scale).
#include <algorithm>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "indexer.cuh"
#include "indexer_topk_device.cuh"
#include "quant_device.cuh"

namespace dz::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps (Q in registers)
constexpr int kThreadsQS = 512;  // 16 warps (Q in shared memory)
constexpr int kQRow = 128 * 2 + 16;  // bytes per Q row in shared memory (D <= 128, padded)

constexpr int64_t kFusedMaxKeys = 51200;  // 200 KiB of fp32 scores per block (+ the Q tile)

// Per-warp scorer of one query. D dims, MT m16 tiles of heads. QS: the query lives in shared
// memory (read with ldmatrix; frees 128 registers for twice the warps), else in registers.
template <int D, int MT, bool MX, bool QS>
struct Scorer {
  static constexpr int KS = D / 16;  // k-steps
  static constexpr int LW = D / 8;   // 32-bit words (bf16 pairs) per lane per row
  static constexpr int NWARPS = QS ? kThreadsQS / 32 : kThreads / 32;
  uint32_t a[QS ? 1 : MT][QS ? 1 : KS][4];
  uint32_t sq = 0;  // shared address of the Q tile (QS)
  float wv[MT][2];

  // QS: all threads store q [H, D] into the tile in the permuted k order (row h, k-step ks,
  // logical k l -> physical dim (l%8)/2 * D/4 + 4 ks + (l/8)*2 + l%2); the caller syncs.
  __device__ void store_query_smem(const __nv_bfloat16* q, const float* w, int H, uint8_t* tile) {
    sq = uint32_t(__cvta_generic_to_shared(tile));
    const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q);
    for (int i = threadIdx.x; i < MT * 16 * (D / 2); i += NWARPS * 32) {
      const int h = i / (D / 2), rem = i % (D / 2), ks = rem / 8, l = 2 * (rem % 8);
      const int phys = ((l % 8) / 2) * (D / 4) + 4 * ks + (l / 8) * 2;
      *reinterpret_cast<uint32_t*>(tile + h * kQRow + (ks * 16 + l) * 2) = h < H ? q32[(h * D + phys) / 2] : 0u;
    }
    const int lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = mt * 16 + g + 8 * half;
        wv[mt][half] = h < H ? w[h] : 0.f;
      }
  }

  __device__ void load_query(const __nv_bfloat16* q, const float* w, int H) {
    static_assert(!QS, "QS scorers use store_query_smem");
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = mt * 16 + g + 8 * half;
        uint32_t words[LW];
        if (h < H) {
          const uint4* src = reinterpret_cast<const uint4*>(q + int64_t(h) * D + c * (D / 4));
#pragma unroll
          for (int j = 0; j < LW / 4; ++j) {
            const uint4 v = src[j];
            words[4 * j] = v.x;
            words[4 * j + 1] = v.y;
            words[4 * j + 2] = v.z;
            words[4 * j + 3] = v.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < LW; ++j) words[j] = 0u;
        }
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          a[mt][ks][half] = words[2 * ks];
          a[mt][ks][2 + half] = words[2 * ks + 1];
        }
        wv[mt][half] = h < H ? w[h] : 0.f;
      }
    }
  }

  // Raw cache bytes of one key for this lane (its D/4 dims): BF16 or MXFP8 codes + scale.
  static constexpr int RW = MX ? D / 64 : D / 32;  // uint4 per lane
  struct Raw {
    uint4 v[RW];
    float scale;
  };

  __device__ __forceinline__ void fetch(const BlockTable& bt, const IndexKeyCache& kc, int32_t seq, int s, bool ok,
                                        Raw& r) const {
    const int c = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < RW; ++j) r.v[j] = make_uint4(0, 0, 0, 0);
    r.scale = 0.f;
    if (!ok) return;
    const int64_t slot =
        int64_t(__ldg(bt.table + int64_t(seq) * bt.max_pages + s / bt.page_size)) * bt.page_size + s % bt.page_size;
    if (!MX) {
      const uint4* src = reinterpret_cast<const uint4*>(kc.bf16 + slot * D + c * (D / 4));
#pragma unroll
      for (int j = 0; j < RW; ++j) r.v[j] = __ldg(src + j);
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(kc.codes + slot * D + c * (D / 4));
#pragma unroll
      for (int j = 0; j < RW; ++j) r.v[j] = __ldg(src + j);
      r.scale = dev::e8m0_value(__ldg(kc.scales + slot * (D / 32) + (c * (D / 4)) / 32));
    }
  }

  // B fragments from the raw bytes (MXFP8: dequantized exactly to bf16).
  __device__ __forceinline__ void unpack(const Raw& r, uint32_t b[KS][2]) const {
    uint32_t words[LW];
    if (!MX) {
#pragma unroll
      for (int j = 0; j < RW; ++j) {
        words[4 * j] = r.v[j].x;
        words[4 * j + 1] = r.v[j].y;
        words[4 * j + 2] = r.v[j].z;
        words[4 * j + 3] = r.v[j].w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < RW; ++j) {  // 16 codes per uint4
        const uint32_t u[4] = {r.v[j].x, r.v[j].y, r.v[j].z, r.v[j].w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float2 lo = dev::e4m3x2_to_f2(uint16_t(u[t] & 0xFFFFu));
          const float2 hi = dev::e4m3x2_to_f2(uint16_t(u[t] >> 16));
          words[8 * j + 2 * t] = pack_bf16(lo.x * r.scale, lo.y * r.scale);
          words[8 * j + 2 * t + 1] = pack_bf16(hi.x * r.scale, hi.y * r.scale);
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      b[ks][0] = words[2 * ks];
      b[ks][1] = words[2 * ks + 1];
    }
  }

  // Scores of keys [kb, ke) into out[s - out_off]; warps stride over 16-key steps; the next
  // step's keys are fetched into registers while this step multiplies.
  __device__ void score_range(const BlockTable& bt, const IndexKeyCache& kc, int32_t seq, int kb, int ke,
                              float* out, int out_off) const {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    constexpr int STEP = NWARPS * 16;
    Raw cur[2], nxt[2];
    int s0 = kb + warp * 16;
    fetch(bt, kc, seq, s0 + g, s0 + g < ke, cur[0]);
    fetch(bt, kc, seq, s0 + 8 + g, s0 + 8 + g < ke, cur[1]);
    for (; s0 < ke; s0 += STEP) {
      const int s1 = s0 + STEP;
      fetch(bt, kc, seq, s1 + g, s1 + g < ke, nxt[0]);
      fetch(bt, kc, seq, s1 + 8 + g, s1 + 8 + g < ke, nxt[1]);
      uint32_t b[2][KS][2];
      unpack(cur[0], b[0]);
      unpack(cur[1], b[1]);
      float acc[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[mt][nt][j] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (QS) {
            uint32_t af[4];
            ldsm_x4(af, sq + uint32_t((mt * 16 + (lane & 15)) * kQRow + (ks * 16 + (lane >> 4) * 8) * 2));
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) mma_bf16(acc[mt][nt], af, b[nt][ks][0], b[nt][ks][1]);
          } else {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) mma_bf16(acc[mt][nt], a[mt][ks], b[nt][ks][0], b[nt][ks][1]);
          }
        }
      float part[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float p = 0.f;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            p += wv[mt][0] * fmaxf(acc[mt][nt][j], 0.f) + wv[mt][1] * fmaxf(acc[mt][nt][2 + j], 0.f);
          p += __shfl_xor_sync(0xffffffffu, p, 4);
          p += __shfl_xor_sync(0xffffffffu, p, 8);
          p += __shfl_xor_sync(0xffffffffu, p, 16);
          part[nt][j] = p;
        }
      if (g == 0) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int s = s0 + nt * 8 + 2 * c + j;
            if (s < ke) out[s - out_off] = part[nt][j];
          }
      }
      cur[0] = nxt[0];
      cur[1] = nxt[1];
    }
  }
};

// Fused: one block per query; longest rows first (queries are usually in position order).
template <int D, int MT, bool MX, bool QS>
__global__ void __launch_bounds__(QS ? kThreadsQS : kThreads, 1)
    fused_kernel(const __nv_bfloat16* __restrict__ q, const float* __restrict__ w, const int32_t* __restrict__ seq,
                 const int32_t* __restrict__ pos, int64_t nq, int H, BlockTable bt, IndexKeyCache kc, int K,
                 int32_t* __restrict__ sel) {
  extern __shared__ __align__(16) float sc[];  // QS: Q tile [MT*16, kQRow bytes], then scores [n]
  const int64_t qi = nq - 1 - blockIdx.x;
  const int n = pos[qi] + 1;
  Scorer<D, MT, MX, QS> sco;
  float* scores = sc;
  if constexpr (QS) {
    sco.store_query_smem(q + qi * int64_t(H) * D, w + qi * H, H, reinterpret_cast<uint8_t*>(sc));
    scores = sc + MT * 16 * kQRow / 4;
    __syncthreads();
  } else {
    sco.load_query(q + qi * int64_t(H) * D, w + qi * H, H);
  }
  sco.score_range(bt, kc, seq[qi], 0, n, scores, 0);
  __syncthreads();
  dev::block_topk<QS ? kThreadsQS : kThreads>(scores, n, K, sel + qi * K);
}

// Split: block (split, query) scores keys [split*span, ...) into scratch.
template <int D, int MT, bool MX, bool QS>
__global__ void __launch_bounds__(QS ? kThreadsQS : kThreads, 1)
    split_kernel(const __nv_bfloat16* __restrict__ q, const float* __restrict__ w, const int32_t* __restrict__ seq,
                 const int32_t* __restrict__ pos, int H, BlockTable bt, IndexKeyCache kc, int span,
                 float* __restrict__ scratch, int64_t ld) {
  extern __shared__ __align__(16) float sc[];  // QS: Q tile
  const int64_t qi = blockIdx.y;
  const int n = pos[qi] + 1;
  const int kb = blockIdx.x * span, ke = min(n, kb + span);
  if (kb >= ke) return;
  Scorer<D, MT, MX, QS> sco;
  if constexpr (QS) {
    sco.store_query_smem(q + qi * int64_t(H) * D, w + qi * H, H, reinterpret_cast<uint8_t*>(sc));
    __syncthreads();
  } else {
    sco.load_query(q + qi * int64_t(H) * D, w + qi * H, H);
  }
  sco.score_range(bt, kc, seq[qi], kb, ke, scratch + qi * ld, 0);
}

__global__ void __launch_bounds__(kThreads) topk_kernel(const float* __restrict__ scratch, int64_t ld,
                                                        const int32_t* __restrict__ pos, int K,
                                                        int32_t* __restrict__ sel) {
  const int64_t qi = blockIdx.x;
  dev::block_topk<kThreads>(scratch + qi * ld, pos[qi] + 1, K, sel + qi * K);
}

int num_sms() { return sm_count(); }

// Measured on the H200 (T=32768, H=64): BF16 keys are faster with Q in registers (8 warps),
// MXFP8 keys with Q in shared memory (16 warps hide the in-register dequantization).
bool q_in_smem(bool mx, IndexerVariant v) {
  if (v == IndexerVariant::Auto) return mx;
  return v == IndexerVariant::QInSmem;
}

template <int D, int MT, bool MX, bool QS>
void launch_fused_qs(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq,
                     int H, int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, int K, int32_t* sel,
                     cudaStream_t stream) {
  const size_t qtile = QS ? size_t(MT) * 16 * kQRow : 0;
  const size_t smem = qtile + size_t(max_keys) * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(fused_kernel<D, MT, MX, QS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(4 * 16 * kQRow + kFusedMaxKeys * sizeof(float))));
  fused_kernel<D, MT, MX, QS><<<unsigned(nq), QS ? kThreadsQS : kThreads, smem, stream>>>(q, w, seq, pos, nq, H, bt,
                                                                                         kc, K, sel);
  CUDA_CHECK_LAUNCH();
}

template <int D, int MT, bool MX>
void launch_fused(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq, int H,
                  int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, int K, int32_t* sel,
                  cudaStream_t stream, IndexerVariant variant) {
  if (q_in_smem(MX, variant)) launch_fused_qs<D, MT, MX, true>(q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, stream);
  else launch_fused_qs<D, MT, MX, false>(q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, stream);
}

template <int D, int MT, bool MX>
void launch_split(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq, int H,
                  int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, float* scratch,
                  cudaStream_t stream, IndexerVariant variant) {
  // Enough blocks to fill the GPU twice over, each covering a multiple of 256 keys.
  int64_t nsplit = std::max<int64_t>(1, (2 * num_sms() + nq - 1) / nq);
  nsplit = std::min<int64_t>(nsplit, (max_keys + 1023) / 1024);
  nsplit = std::max<int64_t>(nsplit, 1);
  int64_t span = (max_keys + nsplit - 1) / nsplit;
  span = (span + 255) / 256 * 256;
  nsplit = (max_keys + span - 1) / span;
  DZ_CHECK(nq < 65536, "indexer_scores: ", nq, " queries exceed one launch (65535)");
  const dim3 grid = dim3(static_cast<unsigned>(nsplit), static_cast<unsigned>(nq));
  if (q_in_smem(MX, variant)) {
    const int qtile = MT * 16 * kQRow;
    split_kernel<D, MT, MX, true><<<grid, kThreadsQS, qtile, stream>>>(q, w, seq, pos, H, bt, kc, int(span), scratch,
                                                                       max_keys);
  } else {
    split_kernel<D, MT, MX, false><<<grid, kThreads, 0, stream>>>(q, w, seq, pos, H, bt, kc, int(span), scratch,
                                                                  max_keys);
  }
  CUDA_CHECK_LAUNCH();
}

// Runs CALL with constexpr D, MT, MX matching the runtime head dim, head count and key format.
#define DZ_IDX_ONE(d, mt, m, CALL)          \
  else if (D_ == d && MT_ == mt && MX_ == m) { \
    constexpr int D = d, MT = mt;           \
    constexpr bool MX = m;                  \
    CALL;                                   \
  }
#define DZ_IDX_DISPATCH(Dv, Hv, MXv, CALL)                                                              \
  do {                                                                                                 \
    const int D_ = (Dv), H_ = (Hv);                                                                    \
    const bool MX_ = (MXv);                                                                            \
    DZ_CHECK(D_ == 64 || D_ == 128, "indexer: index head dim ", D_, " not supported (64 or 128)");     \
    DZ_CHECK(H_ >= 1 && H_ <= 64, "indexer: ", H_, " index heads not supported (1..64)");              \
    const int MT_ = H_ <= 16 ? 1 : (H_ <= 32 ? 2 : 4);                                                 \
    if (false) {                                                                                       \
    }                                                                                                  \
    DZ_IDX_ONE(128, 4, false, CALL) DZ_IDX_ONE(128, 4, true, CALL) DZ_IDX_ONE(128, 2, false, CALL)     \
    DZ_IDX_ONE(128, 2, true, CALL) DZ_IDX_ONE(128, 1, false, CALL) DZ_IDX_ONE(128, 1, true, CALL)      \
    DZ_IDX_ONE(64, 4, false, CALL) DZ_IDX_ONE(64, 4, true, CALL) DZ_IDX_ONE(64, 2, false, CALL)        \
    DZ_IDX_ONE(64, 2, true, CALL) DZ_IDX_ONE(64, 1, false, CALL) DZ_IDX_ONE(64, 1, true, CALL)         \
  } while (0)

}  // namespace

int64_t indexer_fused_max_keys() { return kFusedMaxKeys; }

void indexer_scores(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq,
                    int32_t H, int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, float* scores,
                    cudaStream_t stream, IndexerVariant variant) {
  if (nq == 0) return;
  DZ_IDX_DISPATCH(kc.D, H, kc.mxfp8, (launch_split<D, MT, MX>(q, w, seq, pos, nq, H, max_keys, bt, kc, scores, stream, variant)));
}

void topk_from_scores(const float* scores, int64_t ld, const int32_t* pos, int64_t nq, int32_t K, int32_t* sel,
                      cudaStream_t stream) {
  if (nq == 0) return;
  topk_kernel<<<unsigned(nq), kThreads, 0, stream>>>(scores, ld, pos, K, sel);
  CUDA_CHECK_LAUNCH();
}

void indexer_topk(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq,
                  int32_t H, int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, int32_t K, int32_t* sel,
                  float* scratch, cudaStream_t stream, bool force_split, IndexerVariant variant) {
  DZ_CHECK(K >= 1 && max_keys >= 1 && max_keys < (int64_t(1) << 31), "indexer_topk: bad K ", K, " or max_keys ",
           max_keys);
  if (nq == 0) return;
  const bool fits = max_keys <= kFusedMaxKeys;
  const bool split = force_split || !fits || (scratch != nullptr && nq < 2 * num_sms());
  DZ_CHECK(!split || scratch != nullptr, "indexer_topk: ", max_keys,
           " keys need the split mode, which needs scratch [nq, max_keys]");
  if (split) {
    indexer_scores(q, w, seq, pos, nq, H, max_keys, bt, kc, scratch, stream, variant);
    topk_from_scores(scratch, max_keys, pos, nq, K, sel, stream);
    return;
  }
  DZ_IDX_DISPATCH(kc.D, H, kc.mxfp8, (launch_fused<D, MT, MX>(q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, stream, variant)));
}

}  // namespace dz::cuda
