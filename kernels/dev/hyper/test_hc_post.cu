// hc_post_coeff (the fused post + next projection + coefficients, N = 4) against the CPU reference
// (lib/ops/hyper: hc_post then hc_pre on the new streams), then timed at GLM-5.3-Flash's shape.
// Built twice by run.sh: with production's kernels/hyper.cu and with a variant file in its place.
// Pass: NMSE <= 1e-5 on the streams and the coefficients (the Catch test's tolerance,
// tests/gpu/test_backend_ops_gpu.cpp "mHC hyper-connections").
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common.cuh"  // CUDA_CHECK
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "hyper.cuh"
#include "ops/hyper.hpp"


namespace {

double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? num / den : num;
}
template <class T>
T* dev(const std::vector<T>& h) {
  T* p;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(T)));
  if (!h.empty()) CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const bool bench = argc > 1 && std::string(argv[1]) == "--bench";
  struct Case {
    int64_t T, D;
    bool bc;
  };
  std::vector<Case> cases = bench ? std::vector<Case>{{8192, 4096, false}}
                                  : std::vector<Case>{{733, 256, false}, {19, 4608, false}, {37, 256, true},
                                                      {1000, 4096, false}, {17, 4096, true}, {1, 128, false}};
  constexpr int N = 4, C = (2 + N) * N;
  dz::HcParams hp;
  hp.N = N, hp.iters = 20, hp.eps_norm = 1e-5f, hp.eps_hc = 1e-6f;
  dz::cuda::HcKernelParams kp;
  kp.N = N, kp.iters = hp.iters, kp.eps_norm = hp.eps_norm, kp.eps_hc = hp.eps_hc;
  int fails = 0;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  for (const Case& k : cases) {
    const int64_t T = k.T, D = k.D;
    std::vector<float> x(size_t(T * N * D)), h(size_t(T * D)), fn1(size_t(C * N * D)), fn2(size_t(C * N * D)), base(C),
        scale(3), yf(size_t(T * D));
    std::vector<uint16_t> yb(size_t(T * D));
    for (auto& v : x) v = nd(rng);
    for (auto& v : h) v = nd(rng);
    for (auto& v : fn1) v = 0.15f * nd(rng);
    for (auto& v : fn2) v = 0.15f * nd(rng);
    for (auto& v : base) v = 0.3f * nd(rng);
    for (auto& v : scale) v = 1.f + 0.3f * nd(rng);
    for (size_t i = 0; i < yb.size(); ++i) yb[i] = dz::f32_to_bf16(nd(rng)), yf[i] = dz::bf16_to_f32(yb[i]);
    if (k.bc)  // every old stream is h
      for (int64_t t = 0; t < T; ++t)
        for (int n = 0; n < N; ++n) std::copy(h.begin() + t * D, h.begin() + (t + 1) * D, x.begin() + (t * N + n) * D);
    // the sub-layer's coefficients (from the old streams), then the reference post + next pre
    std::vector<float> coeff(size_t(T * C)), in(size_t(T * D)), ref_coeff(size_t(T * C));
    dz::hc_pre(x.data(), fn1.data(), base.data(), scale.data(), hp, T, D, coeff.data(), in.data());
    std::vector<float> ref_x(x);
    dz::hc_post(ref_x.data(), coeff.data(), yf.data(), N, T, D);
    if (!bench) dz::hc_pre(ref_x.data(), fn2.data(), base.data(), scale.data(), hp, T, D, ref_coeff.data(), in.data());
    float *dx = dev(x), *dh = dev(h), *dfn = dev(fn2), *dbase = dev(base), *dscale = dev(scale), *dcoeff = dev(coeff);
    uint16_t* dy = dev(yb);
    if (k.bc) CUDA_CHECK(cudaMemset(dx, 0xff, x.size() * 4));  // written, not read
    DZ_CHECK(dz::cuda::hc_post_coeff_fits(N, D, dx, dy, true, dfn, k.bc ? dh : nullptr), "shape does not fit");
    dz::cuda::hc_post_coeff(dx, dcoeff, dy, true, N, T, D, dfn, dbase, dscale, kp, dcoeff, st, k.bc ? dh : nullptr);
    CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<float> gx(x.size()), gc(coeff.size());
    CUDA_CHECK(cudaMemcpy(gx.data(), dx, gx.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(gc.data(), dcoeff, gc.size() * 4, cudaMemcpyDeviceToHost));
    const double ex = nmse(gx, ref_x);
    std::printf("T %lld D %lld bc %d: streams NMSE %.3e", (long long)T, (long long)D, int(k.bc), ex);
    bool ok = ex <= 1e-5;
    if (!bench) {
      const double ec = nmse(gc, ref_coeff);
      double mx = 0;
      for (size_t i = 0; i < gc.size(); ++i) mx = std::max(mx, std::fabs(double(gc[i]) - ref_coeff[i]));
      std::printf(", coefficients NMSE %.3e (max abs diff %.3e)", ec, mx);
      ok = ok && ec <= 1e-5;
    }
    std::printf("  %s\n", ok ? "ok" : "FAIL");
    fails += !ok;
    if (bench) {
      cudaEvent_t e0, e1;
      CUDA_CHECK(cudaEventCreate(&e0));
      CUDA_CHECK(cudaEventCreate(&e1));
      std::vector<float> ms;
      for (int r = 0; r < 53; ++r) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        dz::cuda::hc_post_coeff(dx, dcoeff, dy, true, N, T, D, dfn, dbase, dscale, kp, dcoeff, st);
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float m;
        CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
        if (r >= 3) ms.push_back(m);
      }
      std::sort(ms.begin(), ms.end());
      const double bytes = double(T) * D * (2.0 * N * 4 + 2);  // streams read + written, y read
      std::printf("  bench T %lld D %lld: median %.4f ms (min %.4f, max %.4f), %.2f TB/s of streams + y\n", (long long)T,
                  (long long)D, ms[ms.size() / 2], ms.front(), ms.back(), bytes / (ms[ms.size() / 2] * 1e-3) / 1e12);
    }
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(dh), static_cast<void*>(dfn), static_cast<void*>(dbase),
                    static_cast<void*>(dscale), static_cast<void*>(dcoeff), static_cast<void*>(dy)})
      CUDA_CHECK(cudaFree(p));
  }
  std::printf(fails ? "FAILED: %d case(s)\n" : "all cases passed\n", fails);
  return fails ? 1 : 0;
}
