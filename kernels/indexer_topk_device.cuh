// Block-wide Top-K over a score row (shared or global memory): radix select on order-preserving
// keys (11 + 11 + 10 bits), then a warp-ballot compaction in position order.
#pragma once
#include <cstdint>

namespace dz::cuda::dev {

// Keys each thread loads before it uses any, in the passes over a row below.
constexpr int kU = 4;

// Higher score -> larger key; -0 == +0; NaN -> 0 (lowest; no number maps to 0).
__device__ __forceinline__ uint32_t order_key(float s) {
  if (isnan(s)) return 0u;
  if (s == 0.f) s = 0.f;
  const uint32_t u = __float_as_uint(s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int NT>
__device__ inline void block_compact(const float* sc, int n, uint32_t thr, uint32_t remaining, int32_t* __restrict__ out);

// Of the histogram hist[0..nb) walked from its top bin down, the bin holding the remaining-th
// count: s_bin_rem[0] = that bin, s_bin_rem[1] = how many of its entries are still to take. Thread
// t owns bins [nb - (t+1)*per, nb - t*per) (threads in order walk the bins downwards; nb a
// multiple of NT); part: NT / 32 words of shared memory. Ends with a block barrier.
template <int NT>
__device__ inline void block_find_bin(const uint32_t* hist, int nb, uint32_t remaining, uint32_t* part,
                                      uint32_t* s_bin_rem) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = nb / NT;
  const int hi = nb - 1 - tid * per;
  uint32_t local = 0;
  for (int j = 0; j < per; ++j) local += hist[hi - j];
  uint32_t x = local;  // inclusive warp scan
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) part[warp] = x;
  __syncthreads();
  uint32_t before = x - local;
  for (int w2 = 0; w2 < warp; ++w2) before += part[w2];
  if (before < remaining && before + local >= remaining) {
    uint32_t cum = before;
    for (int j = 0; j < per; ++j) {
      const uint32_t h = hist[hi - j];
      if (cum + h >= remaining) {
        s_bin_rem[0] = uint32_t(hi - j);
        s_bin_rem[1] = remaining - cum;
        break;
      }
      cum += h;
    }
  }
  __syncthreads();
}

// One radix pass over the keys key(0..n): the histogram of their `bits` bits at `shift` among
// those matching prefix / mask, then the bin holding the remaining-th largest; prefix, mask and
// remaining move to it (the same values in every thread). hist: 1 << bits words of shared memory.
template <int NT, class KeyAt>
__device__ inline void block_radix_pass(KeyAt key, int n, int shift, int bits, uint32_t& prefix, uint32_t& mask,
                                        uint32_t& remaining, uint32_t* hist, uint32_t* part, uint32_t* s_bin_rem) {
  const uint32_t nb = 1u << bits;
  for (uint32_t i = threadIdx.x; i < nb; i += NT) hist[i] = 0;
  __syncthreads();
  // kU keys loaded before any is counted: kU loads in flight a thread (one at a time left a row in
  // global memory at ~1 TB/s, latency-bound)
  for (int i0 = threadIdx.x; i0 < n; i0 += NT * kU) {
    uint32_t k[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) k[u] = i0 + u * NT < n ? key(i0 + u * NT) : 0u;
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (i0 + u * NT < n && (k[u] & mask) == prefix) atomicAdd(&hist[(k[u] >> shift) & (nb - 1)], 1u);
  }
  __syncthreads();
  block_find_bin<NT>(hist, int(nb), remaining, part, s_bin_rem);
  prefix |= s_bin_rem[0] << shift;
  mask |= (nb - 1) << shift;
  remaining = s_bin_rem[1];
  __syncthreads();
}

// out[0..K) = positions of the K best of sc[0..n), ascending; -1 padded when n < K.
// NT: the block's thread count (256 or 512).
template <int NT>
__device__ inline void block_topk(const float* sc, int n, int K, int32_t* __restrict__ out) {
  constexpr int kTopkThreads = NT;
  __shared__ uint32_t hist[2048];
  __shared__ uint32_t part[kTopkThreads / 32 + 1];
  __shared__ uint32_t s_br[2];
  const int tid = threadIdx.x;
  if (n <= K) {
    for (int i = tid; i < K; i += kTopkThreads) out[i] = i < n ? i : -1;
    return;
  }
  uint32_t prefix = 0, mask = 0, remaining = uint32_t(K);
  for (int p = 0; p < 3; ++p)
    block_radix_pass<NT>([&](int i) { return order_key(sc[i]); }, n, p == 0 ? 21 : (p == 1 ? 10 : 0), p < 2 ? 11 : 10,
                         prefix, mask, remaining, hist, part, s_br);
  block_compact<NT>(sc, n, prefix, remaining, out);  // prefix: the K-th best key
}

// The order keys of positions i0 + 32 u + lane (u < kU) below e, 0 past it: a warp's kU x 32 keys
// loaded before any is used (block_compact's two passes).
__device__ __forceinline__ void warp_keys(const float* sc, int i0, int e, int lane, uint32_t (&k)[kU]) {
#pragma unroll
  for (int u = 0; u < kU; ++u) k[u] = i0 + 32 * u + lane < e ? order_key(sc[i0 + 32 * u + lane]) : 0u;
}

// The contiguous positions [b, e) of n that warp `warp` of NW scans in block_compact's passes (and
// topk_hist_kernel's first): span = ceil(n / NW) each, the last ones short or empty.
template <int NW>
__device__ __forceinline__ void warp_span(int n, int warp, int& b, int& e) {
  const int span = (n + NW - 1) / NW;
  b = min(n, warp * span);
  e = min(n, b + span);
}

// The writes of block_compact: out[] = the positions i < n (ascending) whose key beats thr, and the
// first `remaining` (by position) whose key equals it, given each warp's counts over its span
// (s_gt[w] above thr, s_eq[w] equal to it; NT / 32 words each). Warp w writes the positions of the
// contiguous range warp_span gives it: one pass over the row.
template <int NT>
__device__ inline void block_compact_write(const float* sc, int n, uint32_t thr, uint32_t remaining,
                                           const uint32_t* s_gt, const uint32_t* s_eq, int32_t* __restrict__ out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int b, e;
  warp_span<NT / 32>(n, warp, b, e);
  uint32_t eq_before = 0, out_pos = 0;
  for (int w2 = 0; w2 < warp; ++w2) {
    const uint32_t take_eq = s_eq[w2] < (remaining > eq_before ? remaining - eq_before : 0u)
                                 ? s_eq[w2]
                                 : (remaining > eq_before ? remaining - eq_before : 0u);
    out_pos += s_gt[w2] + take_eq;
    eq_before += s_eq[w2];
  }
  const uint32_t lt = (1u << lane) - 1u;
  // kU x 32 keys a warp loaded before its ballots (in position order, as one at a time)
  for (int i0 = b; i0 < e; i0 += 32 * kU) {
    uint32_t k[kU];
    warp_keys(sc, i0, e, lane, k);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + 32 * u + lane;
      const bool gt = i < e && k[u] > thr, eq = i < e && k[u] == thr;
      const uint32_t eqm = __ballot_sync(0xffffffffu, eq);
      const bool take = gt || (eq && eq_before + __popc(eqm & lt) < remaining);
      const uint32_t tm = __ballot_sync(0xffffffffu, take);
      if (take) out[out_pos + __popc(tm & lt)] = i;
      out_pos += __popc(tm);
      eq_before += __popc(eqm);
    }
  }
}

// out[] = the positions i < n (ascending) whose key beats thr, and the first `remaining` (by
// position) whose key equals it: each warp counts both over its span (one pass), then
// block_compact_write (a second).
template <int NT>
__device__ inline void block_compact(const float* sc, int n, uint32_t thr, uint32_t remaining, int32_t* __restrict__ out) {
  constexpr int NW = NT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int b, e;
  warp_span<NW>(n, warp, b, e);
  uint32_t n_gt = 0, n_eq = 0;
  for (int i0 = b; i0 < e; i0 += 32 * kU) {
    uint32_t k[kU];
    warp_keys(sc, i0, e, lane, k);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool in = i0 + 32 * u + lane < e;
      n_gt += __popc(__ballot_sync(0xffffffffu, in && k[u] > thr));
      n_eq += __popc(__ballot_sync(0xffffffffu, in && k[u] == thr));
    }
  }
  __shared__ uint32_t s_gt[NW], s_eq[NW];
  if (lane == 0) {
    s_gt[warp] = n_gt;
    s_eq[warp] = n_eq;
  }
  __syncthreads();
  block_compact_write<NT>(sc, n, thr, remaining, s_gt, s_eq, out);
}

}  // namespace dz::cuda::dev
