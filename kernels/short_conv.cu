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
  if (T_total > 0) {
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
