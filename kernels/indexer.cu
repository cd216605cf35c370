// Fused DSA indexer + Top-K (see indexer.cuh). Tensor-core layout: for one query, A = q [H, D]
// (heads as rows, held in registers for the whole key loop), B = 16 keys per warp step read
// straight from the paged cache into registers. The reduction dimension is permuted (a dot
// product does not care): lane c of a quad holds dims [c*D/4, (c+1)*D/4) of its row, so every
// lane loads one contiguous 16-byte-aligned run (and, for MXFP8, exactly one scale).
#include <algorithm>

#include "common.cuh"
#include "indexer.cuh"
#include "indexer_topk_device.cuh"
#include "quant_device.cuh"

namespace dz::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int64_t kFusedMaxKeys = 52224;  // 204 KiB of fp32 scores per block

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Per-warp scorer of one query. D dims, MT m16 tiles of heads.
template <int D, int MT, bool MX>
struct Scorer {
  static constexpr int KS = D / 16;  // k-steps
  static constexpr int LW = D / 8;   // 32-bit words (bf16 pairs) per lane per row
  uint32_t a[MT][KS][4];
  float wv[MT][2];

  __device__ void load_query(const __nv_bfloat16* q, const float* w, int H) {
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

  // B fragments of the key at position s (zeros when !ok).
  __device__ void load_key(const BlockTable& bt, const IndexKeyCache& kc, int32_t seq, int s, bool ok,
                           uint32_t b[KS][2]) const {
    const int c = threadIdx.x & 3;
    uint32_t words[LW];
#pragma unroll
    for (int j = 0; j < LW; ++j) words[j] = 0u;
    if (ok) {
      const int64_t slot =
          int64_t(bt.table[int64_t(seq) * bt.max_pages + s / bt.page_size]) * bt.page_size + s % bt.page_size;
      if (!MX) {
        const uint4* src = reinterpret_cast<const uint4*>(kc.bf16 + slot * D + c * (D / 4));
#pragma unroll
        for (int j = 0; j < LW / 4; ++j) {
          const uint4 v = __ldg(src + j);
          words[4 * j] = v.x;
          words[4 * j + 1] = v.y;
          words[4 * j + 2] = v.z;
          words[4 * j + 3] = v.w;
        }
      } else {
        const uint4* src = reinterpret_cast<const uint4*>(kc.codes + slot * D + c * (D / 4));
        const float sc = dev::e8m0_value(__ldg(kc.scales + slot * (D / 32) + (c * (D / 4)) / 32));
#pragma unroll
        for (int j = 0; j < D / 64; ++j) {  // 16 codes per uint4
          const uint4 v = __ldg(src + j);
          const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const float2 lo = dev::e4m3x2_to_f2(uint16_t(u[t] & 0xFFFFu));
            const float2 hi = dev::e4m3x2_to_f2(uint16_t(u[t] >> 16));
            words[8 * j + 2 * t] = pack_bf16(lo.x * sc, lo.y * sc);
            words[8 * j + 2 * t + 1] = pack_bf16(hi.x * sc, hi.y * sc);
          }
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      b[ks][0] = words[2 * ks];
      b[ks][1] = words[2 * ks + 1];
    }
  }

  // Scores of keys [kb, ke) into out[s - out_off]; warps stride over 16-key steps.
  __device__ void score_range(const BlockTable& bt, const IndexKeyCache& kc, int32_t seq, int kb, int ke,
                              float* out, int out_off) const {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    for (int s0 = kb + warp * 16; s0 < ke; s0 += kWarps * 16) {
      uint32_t b[2][KS][2];
      load_key(bt, kc, seq, s0 + g, s0 + g < ke, b[0]);
      load_key(bt, kc, seq, s0 + 8 + g, s0 + 8 + g < ke, b[1]);
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
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) mma_bf16(acc[mt][nt], a[mt][ks], b[nt][ks][0], b[nt][ks][1]);
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
    }
  }
};

// Fused: one block per query; longest rows first (queries are usually in position order).
template <int D, int MT, bool MX>
__global__ void __launch_bounds__(kThreads, 1)
    fused_kernel(const __nv_bfloat16* __restrict__ q, const float* __restrict__ w, const int32_t* __restrict__ seq,
                 const int32_t* __restrict__ pos, int64_t nq, int H, BlockTable bt, IndexKeyCache kc, int K,
                 int32_t* __restrict__ sel) {
  extern __shared__ float sc[];  // [n]
  const int64_t qi = nq - 1 - blockIdx.x;
  const int n = pos[qi] + 1;
  Scorer<D, MT, MX> sco;
  sco.load_query(q + qi * int64_t(H) * D, w + qi * H, H);
  sco.score_range(bt, kc, seq[qi], 0, n, sc, 0);
  __syncthreads();
  dev::block_topk(sc, n, K, sel + qi * K);
}

// Split: block (split, query) scores keys [split*span, ...) into scratch.
template <int D, int MT, bool MX>
__global__ void __launch_bounds__(kThreads, 1)
    split_kernel(const __nv_bfloat16* __restrict__ q, const float* __restrict__ w, const int32_t* __restrict__ seq,
                 const int32_t* __restrict__ pos, int H, BlockTable bt, IndexKeyCache kc, int span,
                 float* __restrict__ scratch, int64_t ld) {
  const int64_t qi = blockIdx.y;
  const int n = pos[qi] + 1;
  const int kb = blockIdx.x * span, ke = min(n, kb + span);
  if (kb >= ke) return;
  Scorer<D, MT, MX> sco;
  sco.load_query(q + qi * int64_t(H) * D, w + qi * H, H);
  sco.score_range(bt, kc, seq[qi], kb, ke, scratch + qi * ld, 0);
}

__global__ void __launch_bounds__(kThreads) topk_kernel(const float* __restrict__ scratch, int64_t ld,
                                                        const int32_t* __restrict__ pos, int K,
                                                        int32_t* __restrict__ sel) {
  const int64_t qi = blockIdx.x;
  dev::block_topk(scratch + qi * ld, pos[qi] + 1, K, sel + qi * K);
}

int num_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

template <int D, int MT, bool MX>
void launch(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq, int H,
            int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, int K, int32_t* sel, float* scratch,
            cudaStream_t stream, bool split) {
  if (!split) {
    const size_t smem = size_t(max_keys) * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(fused_kernel<D, MT, MX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kFusedMaxKeys * sizeof(float))));
    fused_kernel<D, MT, MX><<<unsigned(nq), kThreads, smem, stream>>>(q, w, seq, pos, nq, H, bt, kc, K, sel);
    CUDA_CHECK_LAUNCH();
    return;
  }
  // Enough blocks to fill the GPU twice over, each covering a multiple of 128 keys.
  int64_t nsplit = std::max<int64_t>(1, (2 * num_sms() + nq - 1) / nq);
  nsplit = std::min<int64_t>(nsplit, (max_keys + 1023) / 1024);
  nsplit = std::max<int64_t>(nsplit, 1);
  int64_t span = (max_keys + nsplit - 1) / nsplit;
  span = (span + 127) / 128 * 128;
  nsplit = (max_keys + span - 1) / span;
  split_kernel<D, MT, MX><<<dim3(unsigned(nsplit), unsigned(nq)), kThreads, 0, stream>>>(q, w, seq, pos, H, bt, kc,
                                                                                       int(span), scratch, max_keys);
  CUDA_CHECK_LAUNCH();
  topk_kernel<<<unsigned(nq), kThreads, 0, stream>>>(scratch, max_keys, pos, K, sel);
  CUDA_CHECK_LAUNCH();
}

template <int D, bool MX>
void by_heads(int MT, const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq,
              int H, int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, int K, int32_t* sel,
              float* scratch, cudaStream_t stream, bool split) {
  if (MT == 1) launch<D, 1, MX>(q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, scratch, stream, split);
  else if (MT == 2) launch<D, 2, MX>(q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, scratch, stream, split);
  else launch<D, 4, MX>(q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, scratch, stream, split);
}

}  // namespace

int64_t indexer_fused_max_keys() { return kFusedMaxKeys; }

void indexer_topk(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq,
                  int32_t H, int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, int32_t K, int32_t* sel,
                  float* scratch, cudaStream_t stream, bool force_split) {
  DZ_CHECK(kc.D == 64 || kc.D == 128, "indexer_topk: index head dim ", kc.D, " not supported (64 or 128)");
  DZ_CHECK(H >= 1 && H <= 64, "indexer_topk: ", H, " index heads not supported (1..64)");
  DZ_CHECK(K >= 1 && max_keys >= 1 && max_keys < (int64_t(1) << 31), "indexer_topk: bad K ", K, " or max_keys ",
           max_keys);
  if (nq == 0) return;
  const bool fits = max_keys <= kFusedMaxKeys;
  const bool split = force_split || !fits || (scratch != nullptr && nq < 2 * num_sms());
  DZ_CHECK(!split || scratch != nullptr, "indexer_topk: ", max_keys,
           " keys need the split mode, which needs scratch [nq, max_keys]");
  const int MT = H <= 16 ? 1 : (H <= 32 ? 2 : 4);
  if (kc.D == 128) {
    if (kc.mxfp8) by_heads<128, true>(MT, q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, scratch, stream, split);
    else by_heads<128, false>(MT, q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, scratch, stream, split);
  } else {
    if (kc.mxfp8) by_heads<64, true>(MT, q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, scratch, stream, split);
    else by_heads<64, false>(MT, q, w, seq, pos, nq, H, max_keys, bt, kc, K, sel, scratch, stream, split);
  }
}

}  // namespace dz::cuda
