#include "common.cuh"
#include "linear_attn_common.cuh"
#include "short_conv.cuh"

namespace dz::cuda {

namespace {

using la::bf;

constexpr int NT = 256, ROWS = 16;  // a CTA: 256 channels x 16 tokens

// y[t, c] = silu(bias[c] + sum_j w[c, j] x[t - P + j, c]), history before a sequence from its state.
__global__ void conv_prefill_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                    const bf16* __restrict__ bias, const int32_t* __restrict__ cu, int N,
                                    int64_t T, int C, int W, const bf16* __restrict__ state, bf16* __restrict__ y) {
  const int c = blockIdx.x * NT + threadIdx.x;
  if (c >= C) return;
  const int P = W - 1;
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
    y[t * C + c] = __float2bfloat16(la::silu(acc));
  }
}

// The same for 8 channels per thread (C % 8 == 0, 16-byte aligned rows) over ROWS8 tokens: the
// weights and the last P inputs live in registers, so each input row is read once (plus a P-row
// halo per CTA) as 16-byte vectors, and the sequence is looked up once per CTA row block. Per
// output the same products are summed in the same order as conv_prefill_kernel. The scalar kernel
// ran at ~7x its bandwidth time on the H200 (ncu: instruction-bound on 2-byte loads, W reloads
// of every input and weight, a binary search per row).
constexpr int ROWS8 = 32, kMaxW = 8;
__device__ __forceinline__ void load8(const bf16* p, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const bf16* e = reinterpret_cast<const bf16*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = bf(e[i]);
}
template <int W>
__global__ void conv_prefill8_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                     const bf16* __restrict__ bias, const int32_t* __restrict__ cu, int N, int64_t T,
                                     int C, const bf16* __restrict__ state, bf16* __restrict__ y) {
  constexpr int P = W - 1;
  const int c = (blockIdx.x * NT + threadIdx.x) * 8;
  if (c >= C) return;
  const int64_t t0 = int64_t(blockIdx.y) * ROWS8;
  if (t0 >= T) return;
  float wt[W][8], b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    b[i] = bias ? bf(bias[c + i]) : 0.f;
#pragma unroll
    for (int j = 0; j < W; ++j) wt[j][i] = bf(w[int64_t(c + i) * W + j]);
  }
  int lo = 0, hi = N - 1;  // sequence n with cu[n] <= t0 < cu[n + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t0) lo = mid; else hi = mid - 1;
  }
  int64_t bos = cu[lo], eos = cu[lo + 1];
  float h[P > 0 ? P : 1][8];  // inputs t-P .. t-1, oldest first
  auto history = [&](int64_t t) {  // the P inputs before t in its sequence (state rows before bos)
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t s = t - P + j;
      if (s >= bos) {
        load8(x + s * C + c, h[j]);
      } else if (state) {
        load8(state + (int64_t(lo) * P + P + (s - bos)) * C + c, h[j]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) h[j][i] = 0.f;
      }
    }
  };
  history(t0);
  // Rows are loaded PF at a time before any is used: PF 16-byte loads in flight per thread (one
  // at a time, the kernel was latency-bound at ~1.5 TB/s: Qwen3.5's C = 8192 at T = 8192, 173 us).
  constexpr int PF = 4;
  static_assert(ROWS8 % PF == 0, "row blocks of whole prefetch groups");
  for (int r0 = 0; r0 < ROWS8; r0 += PF) {
    uint4 raw[PF];
#pragma unroll
    for (int k = 0; k < PF; ++k)
      if (t0 + r0 + k < T) raw[k] = *reinterpret_cast<const uint4*>(x + (t0 + r0 + k) * C + c);
#pragma unroll
    for (int k = 0; k < PF; ++k) {
      const int64_t t = t0 + r0 + k;
      if (t >= T) return;
      if (t >= eos) {  // the next sequence starts here (skipping empty ones): its own history
        while (lo + 1 < N && cu[lo + 1] <= t) ++lo;
        bos = cu[lo], eos = cu[lo + 1];
        history(t);
      }
      float xt[8];
      const bf16* xe = reinterpret_cast<const bf16*>(&raw[k]);
#pragma unroll
      for (int i = 0; i < 8; ++i) xt[i] = bf(xe[i]);
      uint4 o;
      bf16* oe = reinterpret_cast<bf16*>(&o);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float acc = b[i];
#pragma unroll
        for (int j = 0; j < P; ++j) acc += wt[j][i] * h[j][i];
        acc += wt[P][i] * xt[i];
        oe[i] = __float2bfloat16(la::silu(acc));
      }
      *reinterpret_cast<uint4*>(y + t * C + c) = o;
#pragma unroll
      for (int j = 0; j + 1 < P; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) h[j][i] = h[j + 1][i];
      if (P > 0) {
#pragma unroll
        for (int i = 0; i < 8; ++i) h[P - 1][i] = xt[i];
      }
    }
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
                        int64_t T_total, int C, int W, bf16* state, bf16* y, cudaStream_t stream) {
  DZ_CHECK(W >= 1 && C >= 0 && N >= 0, "short_conv_prefill: bad sizes C=", C, " W=", W, " N=", N);
  if (C == 0 || N == 0) return;
  const unsigned cb = unsigned((C + NT - 1) / NT);
  const bool vec = C % 8 == 0 && W >= 1 && W <= kMaxW && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 16 == 0 && (!state || reinterpret_cast<uintptr_t>(state) % 16 == 0);
  if (T_total > 0 && vec) {  // the vector kernel where the rows allow it; the scalar one otherwise
    const dim3 grid(unsigned((C / 8 + NT - 1) / NT), unsigned((T_total + ROWS8 - 1) / ROWS8));
    switch (W) {
#define DZ_CONV8(Wv) \
  case Wv: conv_prefill8_kernel<Wv><<<grid, NT, 0, stream>>>(x, w, bias, cu_seqlens, N, T_total, C, state, y); break;
      DZ_CONV8(1) DZ_CONV8(2) DZ_CONV8(3) DZ_CONV8(4) DZ_CONV8(5) DZ_CONV8(6) DZ_CONV8(7) DZ_CONV8(8)
#undef DZ_CONV8
    }
    CUDA_CHECK_LAUNCH();
  } else if (T_total > 0) {
    conv_prefill_kernel<<<dim3(cb, unsigned((T_total + ROWS - 1) / ROWS)), NT, 0, stream>>>(x, w, bias, cu_seqlens, N,
                                                                                         T_total, C, W, state, y);
    CUDA_CHECK_LAUNCH();
  }
  if (state && W > 1) {
    conv_state_kernel<<<dim3(cb, unsigned(N)), NT, 0, stream>>>(x, cu_seqlens, C, W, state);
    CUDA_CHECK_LAUNCH();
  }
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
