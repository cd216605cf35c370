// Experiment (issue 11: Qwen3.5's logprobs forward costs 233.6 ms vs 133.3 ms for last-logits at
// T = 32768, docs/perf/bench_e2e_gpu_2026_0a9939c.log; the LM head's 31 chunks of 1081 x 248320
// fp32 logits each go through row_max, a host round trip, then softmax_parts with a double-precision
// exp per logit). One pass instead: per row the max, the sum of exp(x - max) and the target's logit
// together, online (a thread's running max and sum, rescaled when the max grows; threads merged
// in a fixed order), exp in fp32 (x - max <= 0: expf is within 2 ulp) summed in fp64.
// Written 2026-12-02 after the session's device time was spent: compiled, NOT yet run.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/lm_head/lse_onepass.cu
//        kernels/backend_ops.cu -o /tmp/lse && /tmp/lse && /tmp/lse --bench
// Test: rows of logits in [-20, 20) with a few large values, against an fp64 host loop: log-sum-exp
// within 1e-6 absolute (double sums; the fp32 exp's 2^-23 relative error per term bounds the sum's
// relative error the same way), target logits exact; production's two kernels as the control.
// Bench: 1081 x 248320 (Qwen3.5's chunk) and 1733 x 154880 (GLM-5.3-Flash's), production's row_max +
// softmax_parts (without the host round trip between them) against the one pass.
// For production: the backend op would return (max, sum, target logit) per row, and LmHead::chunk
// would merge TP shards as M = max_r m_r, S = sum_r s_r exp(m_r - M) (one allreduce of each).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend_ops.cuh"
#include "bench_util.cuh"
#include "common.cuh"

using namespace dz::cuda;

namespace {

constexpr int kThr = 512;

// out[3 r .. 3 r + 2] = (max, sum exp(x - max), x[target - v0] or 0) of row r.
__global__ void __launch_bounds__(kThr) k_lse_onepass(const float* __restrict__ lg, int64_t n,
                                                      const int32_t* __restrict__ target, int64_t v0,
                                                      double* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const float* x = lg + r * n;
  float m = -INFINITY;
  double s = 0.0;
  // 16-byte loads when the row allows (n % 4 == 0 keeps every row 16-byte aligned)
  if ((n & 3) == 0 && (reinterpret_cast<uintptr_t>(lg) & 15) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t j = threadIdx.x; j < n / 4; j += kThr) {
      const float4 v = x4[j];
      const float vm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
      if (vm > m) {  // rescale the running sum to the new max (rare after the first loads)
        s = m == -INFINITY ? 0.0 : s * double(expf(m - vm));
        m = vm;
      }
      s += double(expf(v.x - m)) + double(expf(v.y - m)) + double(expf(v.z - m)) + double(expf(v.w - m));
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += kThr) {
      const float v = x[j];
      if (v > m) {
        s = m == -INFINITY ? 0.0 : s * double(expf(m - v));
        m = v;
      }
      s += double(expf(v - m));
    }
  }
  // merge the block's (m, s) pairs: warps by butterfly, then warp 0 over the warps in order
  __shared__ float wm[kThr / 32];
  __shared__ double ws[kThr / 32];
  for (int o = 16; o; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const double os = __shfl_xor_sync(0xffffffffu, s, o);
    const float nm = fmaxf(m, om);
    if (nm != -INFINITY) s = s * double(expf(m - nm)) + os * double(expf(om - nm));
    m = nm;
  }
  if ((threadIdx.x & 31) == 0) {
    wm[threadIdx.x >> 5] = m;
    ws[threadIdx.x >> 5] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int w = 0; w < kThr / 32; ++w) M = fmaxf(M, wm[w]);
    double S = 0.0;
    for (int w = 0; w < kThr / 32; ++w)
      if (wm[w] != -INFINITY) S += ws[w] * double(expf(wm[w] - M));
    const int64_t t = target ? int64_t(target[r]) - v0 : -1;
    out[3 * r] = M;
    out[3 * r + 1] = S;
    out[3 * r + 2] = (t >= 0 && t < n) ? double(x[t]) : 0.0;
  }
}

int fails = 0;

void test(int64_t m, int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-20.f, 20.f);
  std::vector<float> h(static_cast<size_t>(m * n));
  for (auto& v : h) v = u(g);
  for (int64_t r = 0; r < m; ++r) h[size_t(r * n + (r * 7919) % n)] = 35.f + float(r % 5);  // a few peaks
  std::vector<int32_t> tgt(static_cast<size_t>(m));
  const int64_t v0 = 1000;
  for (int64_t r = 0; r < m; ++r) tgt[size_t(r)] = int32_t(v0 + (r % 3 == 2 ? n + 5 : (r * 131) % n));  // some outside
  float* d = nullptr;
  int32_t* dt = nullptr;
  double *o1 = nullptr, *o0 = nullptr;
  float* mx = nullptr;
  CUDA_CHECK(cudaMalloc(&d, 4 * h.size()));
  CUDA_CHECK(cudaMalloc(&dt, 4 * m));
  CUDA_CHECK(cudaMalloc(&o1, 8 * 3 * m));
  CUDA_CHECK(cudaMalloc(&o0, 8 * 2 * m));
  CUDA_CHECK(cudaMalloc(&mx, 4 * m));
  CUDA_CHECK(cudaMemcpy(d, h.data(), 4 * h.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dt, tgt.data(), 4 * m, cudaMemcpyHostToDevice));
  k_lse_onepass<<<unsigned(m), kThr>>>(d, n, dt, v0, o1);
  row_max(d, m, n, mx, 0);
  softmax_parts(d, m, n, mx, dt, v0, o0, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> a1(static_cast<size_t>(3 * m)), a0(static_cast<size_t>(2 * m));
  std::vector<float> m0(static_cast<size_t>(m));
  CUDA_CHECK(cudaMemcpy(a1.data(), o1, 8 * 3 * m, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(a0.data(), o0, 8 * 2 * m, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(m0.data(), mx, 4 * m, cudaMemcpyDeviceToHost));
  double e1 = 0, e0 = 0;
  bool tgt_ok = true;
  for (int64_t r = 0; r < m; ++r) {
    double M = -INFINITY;
    for (int64_t j = 0; j < n; ++j) M = std::max(M, double(h[size_t(r * n + j)]));
    double S = 0;
    for (int64_t j = 0; j < n; ++j) S += std::exp(double(h[size_t(r * n + j)]) - M);
    const double lse = M + std::log(S);
    e1 = std::max(e1, std::fabs(a1[size_t(3 * r)] + std::log(a1[size_t(3 * r + 1)]) - lse));
    e0 = std::max(e0, std::fabs(double(m0[size_t(r)]) + std::log(a0[size_t(2 * r)]) - lse));
    const int64_t t = int64_t(tgt[size_t(r)]) - v0;
    const double want = (t >= 0 && t < n) ? double(h[size_t(r * n + t)]) : 0.0;
    tgt_ok = tgt_ok && a1[size_t(3 * r + 2)] == want && a0[size_t(2 * r + 1)] == want;
  }
  const bool ok = e1 <= 1e-6 && e0 <= 1e-6 && tgt_ok;
  std::printf("%s m %5lld n %7lld: |lse err| one pass %.2e, production %.2e, target logits %s\n", ok ? "ok  " : "FAIL",
              (long long)m, (long long)n, e1, e0, tgt_ok ? "exact" : "WRONG");
  if (!ok) ++fails;
  cudaFree(d), cudaFree(dt), cudaFree(o1), cudaFree(o0), cudaFree(mx);
}

void bench(int64_t m, int64_t n, const char* what) {
  float* d = nullptr;
  int32_t* dt = nullptr;
  double *o1 = nullptr, *o0 = nullptr;
  float* mx = nullptr;
  CUDA_CHECK(cudaMalloc(&d, 4 * m * n));
  CUDA_CHECK(cudaMalloc(&dt, 4 * m));
  CUDA_CHECK(cudaMalloc(&o1, 8 * 3 * m));
  CUDA_CHECK(cudaMalloc(&o0, 8 * 2 * m));
  CUDA_CHECK(cudaMalloc(&mx, 4 * m));
  CUDA_CHECK(cudaMemset(d, 0, 4 * m * n));
  CUDA_CHECK(cudaMemset(dt, 0, 4 * m));
  const double t0 = median_ms(
      [&] {
        row_max(d, m, n, mx, 0);
        softmax_parts(d, m, n, mx, dt, 0, o0, 0);
      },
      10);
  const double t1 = median_ms([&] { k_lse_onepass<<<unsigned(m), kThr>>>(d, n, dt, 0, o1); }, 10);
  const double gb = 4.0 * double(m) * double(n) * 1e-9;
  std::printf("bench %-34s production (2 kernels) %7.3f ms  one pass %7.3f ms (%.2f TB/s)  %.2fx\n", what, t0, t1,
              gb / t1, t0 / t1);
  cudaFree(d), cudaFree(dt), cudaFree(o1), cudaFree(o0), cudaFree(mx);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && !std::strcmp(argv[1], "--bench")) {
    bench(1081, 248320, "Qwen3.5 chunk 1081 x 248320");
    bench(1733, 154880, "GLM-5.3-Flash chunk 1733 x 154880");
    return 0;
  }
  test(7, 248320, 1);
  test(33, 4099, 2);  // n % 4 != 0: scalar loads
  test(5, 3, 3);      // fewer columns than threads
  test(64, 154880, 4);
  std::printf("%d failures\n", fails);
  return fails ? 1 : 0;
}
