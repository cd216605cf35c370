#include "common.cuh"
#include "linear_attn_common.cuh"
#include "short_conv.cuh"

namespace dz::cuda {

namespace {

using la::bf;

constexpr int NT = 256, ROWS = 16;  // a CTA: 256 channels x 16 tokens

struct Bf8 {  // 8 bf16 values in one 16-byte vector
  uint4 u;
  __device__ float operator[](int i) const {
    const uint32_t w = i < 2 ? u.x : i < 4 ? u.y : i < 6 ? u.z : u.w;
    return __uint_as_float(i & 1 ? w & 0xffff0000u : w << 16);
  }
};
__device__ __forceinline__ Bf8 ld8(const bf16* p) { return Bf8{*reinterpret_cast<const uint4*>(p)}; }
// Channel c's output block of o: its pointer (at column c) and row stride.
__device__ __forceinline__ bf16* out_col(const ConvOut& o, int c, int64_t& ld) {
  bf16* y = o.y[0];
  int c0 = 0, c1 = o.c0[1];
#pragma unroll
  for (int s = 1; s < ConvOut::kMax; ++s)  // constant indices: the parameters stay in the constant bank
    if (s < o.n && c >= o.c0[s]) y = o.y[s], c0 = o.c0[s], c1 = o.c0[s + 1];
  ld = c1 - c0;
  return y + (c - c0);
}
// y[t, c] = silu(bias[c] + sum_j w[c, j] x[t - P + j, c]), history before a sequence from its state.
__global__ void conv_prefill_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                    const bf16* __restrict__ bias, const int32_t* __restrict__ cu, int N,
                                    int64_t T, int C, int W, const bf16* __restrict__ state, ConvOut out) {
  const int c = blockIdx.x * NT + threadIdx.x;
  if (c >= C) return;
  const int P = W - 1;
  int64_t ld;
  bf16* yc = out_col(out, c, ld);
  for (int r = 0; r < ROWS; ++r) {
    const int64_t t = int64_t(blockIdx.y) * ROWS + r;
    if (t >= T) return;
    int lo = 0, hi = N - 1;  // sequence n with cu[n] <= t < cu[n + 1]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (cu[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int64_t bos = cu[lo];
    float acc = bias ? bf(bias[c]) : 0.f;
    for (int j = 0; j < W; ++j) {
      const int64_t s = t - P + j;
      float xv;
      if (s >= bos)
        xv = bf(x[s * C + c]);
      else
        xv = state ? bf(state[(int64_t(lo) * P + P + (s - bos)) * C + c]) : 0.f;
      acc += bf(w[int64_t(c) * W + j]) * xv;
    }
    yc[t * ld] = __float2bfloat16(la::silu(acc));
  }
}

// The same for 8 channels per thread (C % 8 == 0, 16-byte aligned rows) over ROWS8 tokens: the
// weights and the last P inputs live in registers as their bf16 bits (exact, and half the
// registers of fp32 copies), so each input row is read once (plus a P-row halo per CTA) as 16-byte
// vectors, and the sequence is looked up once per CTA row block. Per output the same products are
// summed in the same order as conv_prefill_kernel. (The scalar kernel ran at ~7x its bandwidth
// time on the H200: instruction-bound on 2-byte loads, W reloads of every input and weight, a
// binary search per row.)
constexpr int ROWS8 = 32, kMaxW = 8;
template <int W>
__global__ void __launch_bounds__(NT) conv_prefill8_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                           const bf16* __restrict__ bias, const int32_t* __restrict__ cu,
                                                           int N, int64_t T, int C, const bf16* __restrict__ state,
                                                           ConvOut out) {
  constexpr int P = W - 1;
  const int c = (blockIdx.x * NT + threadIdx.x) * 8;
  if (c >= C) return;
  const int64_t t0 = int64_t(blockIdx.y) * ROWS8;
  if (t0 >= T) return;
  int64_t ld;
  bf16* yc = out_col(out, c, ld);
  uint32_t wb[W][4];  // tap j of the 8 channels, bf16 pairs
  float b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = bias ? bf(bias[c + i]) : 0.f;
#pragma unroll
  for (int j = 0; j < W; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t lo = __bfloat16_as_ushort(w[int64_t(c + 2 * q) * W + j]);
      const uint32_t hi = __bfloat16_as_ushort(w[int64_t(c + 2 * q + 1) * W + j]);
      wb[j][q] = lo | (hi << 16);
    }
  auto wt = [&](int j, int i) {
    const uint32_t v = wb[j][i >> 1];
    return __uint_as_float(i & 1 ? v & 0xffff0000u : v << 16);
  };
  int lo = 0, hi = N - 1;  // sequence n with cu[n] <= t0 < cu[n + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t0) lo = mid; else hi = mid - 1;
  }
  int64_t bos = cu[lo], eos = cu[lo + 1];
  Bf8 h[P > 0 ? P : 1];  // inputs t-P .. t-1, oldest first
  auto history = [&](int64_t t) {  // the P inputs before t in its sequence (state rows before bos)
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t s = t - P + j;
      if (s >= bos)
        h[j] = ld8(x + s * C + c);
      else if (state)
        h[j] = ld8(state + (int64_t(lo) * P + P + (s - bos)) * C + c);
      else
        h[j].u = make_uint4(0u, 0u, 0u, 0u);
    }
  };
  history(t0);
  // Rows in groups of PF, the next group's loads issued before the current group is computed, so
  // 4-8 16-byte loads stay in flight per thread (one group at a time, loaded then computed, the
  // kernel held ~2 TB/s at 124 registers: GLM-5.3-Flash's C = 24576 at T = 8192, 0.41 ms).
  constexpr int PF = 4;
  static_assert(ROWS8 % PF == 0, "row blocks of whole prefetch groups");
  Bf8 cur[PF], nxt[PF];
  auto load_group = [&](int r0, Bf8* g) {
#pragma unroll
    for (int k = 0; k < PF; ++k)
      if (t0 + r0 + k < T) g[k] = ld8(x + (t0 + r0 + k) * C + c);
  };
  load_group(0, cur);
#pragma unroll 1
  for (int r0 = 0; r0 < ROWS8; r0 += PF) {
    if (r0 + PF < ROWS8) load_group(r0 + PF, nxt);
#pragma unroll
    for (int k = 0; k < PF; ++k) {
      const int64_t t = t0 + r0 + k;
      if (t >= T) return;
      if (t >= eos) {  // the next sequence starts here (skipping empty ones): its own history
        while (lo + 1 < N && cu[lo + 1] <= t) ++lo;
        bos = cu[lo], eos = cu[lo + 1];
        history(t);
      }
      uint4 o;
      bf16* oe = reinterpret_cast<bf16*>(&o);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float acc = b[i];
#pragma unroll
        for (int j = 0; j < P; ++j) acc += wt(j, i) * h[j][i];
        acc += wt(P, i) * cur[k][i];
        oe[i] = __float2bfloat16(la::silu(acc));
      }
      *reinterpret_cast<uint4*>(yc + t * ld) = o;
#pragma unroll
      for (int j = 0; j + 1 < P; ++j) h[j] = h[j + 1];
      if (P > 0) h[P - 1] = cur[k];
    }
#pragma unroll
    for (int k = 0; k < PF; ++k) cur[k] = nxt[k];
  }
}

// New state: the last P rows of [state; x] per sequence, in place (row r reads row T_n + r >= r).
__global__ void conv_state_kernel(const bf16* __restrict__ x, const int32_t* __restrict__ cu, int C, int W,
                                  bf16* __restrict__ state) {
  const int c = blockIdx.x * NT + threadIdx.x, n = blockIdx.y;
  if (c >= C) return;
  const int P = W - 1;
  const int64_t bos = cu[n], Tn = cu[n + 1] - bos;
  bf16* st = state + int64_t(n) * P * C;
  for (int r = 0; r < P; ++r) {
    const int64_t s = Tn - P + r;
    st[r * C + c] = s >= 0 ? x[(bos + s) * C + c] : st[(P + s) * C + c];
  }
}

__global__ void conv_update_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                   const bf16* __restrict__ bias, const int32_t* __restrict__ slot, int C, int W,
                                   bf16* __restrict__ states, bf16* __restrict__ y) {
  const int c = blockIdx.x * NT + threadIdx.x, b = blockIdx.y;
  if (c >= C || slot[b] < 0) return;
  const int P = W - 1;
  bf16* st = states + int64_t(slot[b]) * P * C;
  const bf16 xb = x[int64_t(b) * C + c];
  float acc = bias ? bf(bias[c]) : 0.f;
  for (int j = 0; j < P; ++j) acc += bf(w[int64_t(c) * W + j]) * bf(st[j * C + c]);
  acc += bf(w[int64_t(c) * W + P]) * bf(xb);
  y[int64_t(b) * C + c] = __float2bfloat16(la::silu(acc));
  for (int j = 0; j + 1 < P; ++j) st[j * C + c] = st[(j + 1) * C + c];
  if (P > 0) st[(P - 1) * C + c] = xb;
}

}  // namespace

void short_conv_prefill(const bf16* x, const bf16* w, const bf16* bias, const int32_t* cu_seqlens, int N,
                        int64_t T_total, int C, int W, bf16* state, const ConvOut& out, cudaStream_t stream) {
  DZ_CHECK(W >= 1 && C >= 0 && N >= 0, "short_conv_prefill: bad sizes C=", C, " W=", W, " N=", N);
  DZ_CHECK(out.n >= 1 && out.n <= ConvOut::kMax && out.c0[0] == 0 && out.c0[out.n] == C,
           "short_conv_prefill: ", out.n, " output blocks ending at column ", out.c0[out.n], " of ", C);
  bool aligned = C % 8 == 0;  // every block's width and pointer a multiple of 16 bytes
  for (int s = 0; s < out.n; ++s) {
    DZ_CHECK(out.c0[s] <= out.c0[s + 1] && out.y[s], "short_conv_prefill: output block ", s, " is malformed");
    aligned = aligned && out.c0[s] % 8 == 0 && reinterpret_cast<uintptr_t>(out.y[s]) % 16 == 0;
  }
  if (C == 0 || N == 0) return;
  const unsigned cb = unsigned((C + NT - 1) / NT);
  const bool vec = aligned && W >= 1 && W <= kMaxW && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   (!state || reinterpret_cast<uintptr_t>(state) % 16 == 0);
  if (T_total > 0 && vec) {  // the vector kernel where the rows allow it; the scalar one otherwise
    const dim3 grid(unsigned((C / 8 + NT - 1) / NT), unsigned((T_total + ROWS8 - 1) / ROWS8));
    switch (W) {
#define DZ_CONV8(Wv) \
  case Wv: conv_prefill8_kernel<Wv><<<grid, NT, 0, stream>>>(x, w, bias, cu_seqlens, N, T_total, C, state, out); break;
      DZ_CONV8(1) DZ_CONV8(2) DZ_CONV8(3) DZ_CONV8(4) DZ_CONV8(5) DZ_CONV8(6) DZ_CONV8(7) DZ_CONV8(8)
#undef DZ_CONV8
    }
    CUDA_CHECK_LAUNCH();
  } else if (T_total > 0) {
    conv_prefill_kernel<<<dim3(cb, unsigned((T_total + ROWS - 1) / ROWS)), NT, 0, stream>>>(x, w, bias, cu_seqlens, N,
                                                                                         T_total, C, W, state, out);
    CUDA_CHECK_LAUNCH();
  }
  if (state && W > 1) {
    conv_state_kernel<<<dim3(cb, unsigned(N)), NT, 0, stream>>>(x, cu_seqlens, C, W, state);
    CUDA_CHECK_LAUNCH();
  }
}
void short_conv_prefill(const bf16* x, const bf16* w, const bf16* bias, const int32_t* cu_seqlens, int N,
                        int64_t T_total, int C, int W, bf16* state, bf16* y, cudaStream_t stream) {
  ConvOut out;
  out.y[0] = y;
  out.c0[1] = C;
  short_conv_prefill(x, w, bias, cu_seqlens, N, T_total, C, W, state, out, stream);
}

void short_conv_update(const bf16* x, const bf16* w, const bf16* bias, const int32_t* slot, int B, int C, int W,
                       bf16* states, bf16* y, cudaStream_t stream) {
  DZ_CHECK(W >= 1 && C >= 0 && B >= 0, "short_conv_update: bad sizes C=", C, " W=", W, " B=", B);
  if (C == 0 || B == 0) return;
  conv_update_kernel<<<dim3(unsigned((C + NT - 1) / NT), unsigned(B)), NT, 0, stream>>>(x, w, bias, slot, C, W, states,
                                                                                       y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
