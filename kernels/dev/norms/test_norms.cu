// Test + bench of the vectorised norms / adds (norms_vec.cuh) beside production (backend_ops.cuh).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/norms/test_norms.cu
//        kernels/dev/norms/norms_vec.cu kernels/backend_ops.cu -o /tmp/norms && /tmp/norms && /tmp/norms --bench
// Test: random inputs (x in [-2, 2), weights in [0.5, 1.5), gates in [-3, 3)), every output element
// against an fp64 host loop over the same (bf16-rounded) inputs. Tolerance: bf16 outputs are rounded
// once (<= 2^-9 relative) and fp32 math adds ~1e-6: |err| <= 2^-8 |ref| + 1e-5; fp32 outputs
// |err| <= 1e-5 (|ref| + 1). The same check runs on production's output as a control: both must pass.
// Shapes: D = 2048 / 4096 (a residual norm), 128 / 256 (per-head norms: 2 rows a warp at 128),
// 40 / 72 (L = 4 / 8 lanes a row), 8200 (chunks past the register cache), odd row counts.
// Bench: the T = 32768 shapes of Qwen3.5-35B-A3B and GLM-5.3-Flash, median of 20.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backend_ops.cuh"
#include "bench_util.cuh"
#include "common.cuh"
#include "core/bf16.hpp"
#include "dev/norms/norms_vec.cuh"

using namespace dz::cuda;
using bf16 = __nv_bfloat16;

namespace {

template <class T>
T* upload(const std::vector<float>& v) {
  std::vector<T> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) h[i] = __float2bfloat16_rn(v[i]);
    else h[i] = v[i];
  }
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, sizeof(T) * (v.size() + 8)));
  CUDA_CHECK(cudaMemcpy(d, h.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice));
  return d;
}
template <class T>
std::vector<double> download(const T* d, size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost));
  std::vector<double> o(n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bf16>) o[i] = __bfloat162float(h[i]);
    else o[i] = h[i];
  }
  return o;
}
std::vector<float> rnd(size_t n, float lo, float hi, uint32_t seed, bool to_bf16) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = to_bf16 ? dz::round_bf16(u(g)) : u(g);
  return v;
}

int fails = 0;
void check(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref, bool bf16_out) {
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]);
    const double tol = bf16_out ? std::ldexp(std::fabs(ref[i]), -8) + 1e-5 : 1e-5 * (std::fabs(ref[i]) + 1);
    worst = std::max(worst, e / tol);
    if (!(e <= tol)) ++bad;
  }
  std::printf("%s %-58s worst err / tol %.3f%s\n", bad ? "FAIL" : "ok  ", what.c_str(), worst,
              bad ? (" (" + std::to_string(bad) + " bad)").c_str() : "");
  if (bad) ++fails;
}

// rmsnorm: x TX -> y TY; both kernels, against fp64
template <class TX, class TY>
void test_rmsnorm(int64_t rows, int64_t D, bool with_w, bool zc) {
  constexpr bool xb = std::is_same_v<TX, bf16>, yb = std::is_same_v<TY, bf16>;
  const auto x = rnd(size_t(rows * D), -2, 2, uint32_t(rows * 7 + D), xb);
  const auto w = rnd(size_t(D), 0.5f, 1.5f, uint32_t(D), false);
  std::vector<double> ref(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(x[r * D + d]) * x[r * D + d];
    const double inv = 1.0 / std::sqrt(ss / double(D) + 1e-6);
    for (int64_t d = 0; d < D; ++d)
      ref[r * D + d] = x[r * D + d] * inv * (with_w ? (zc ? 1.0 + w[d] : double(w[d])) : 1.0);
  }
  TX* dx = upload<TX>(x);
  float* dw = upload<float>(w);
  TY *y0, *y1;
  CUDA_CHECK(cudaMalloc(&y0, sizeof(TY) * x.size()));
  CUDA_CHECK(cudaMalloc(&y1, sizeof(TY) * x.size()));
  const float* wp = with_w ? dw : nullptr;
  rmsnorm(dx, xb ? Dt::BF16 : Dt::F32, wp, y0, yb ? Dt::BF16 : Dt::F32, rows, D, 1e-6f, zc, 0);
  const bool took = dev::rmsnorm_vec<TX, TY>(dx, wp, y1, rows, D, 1e-6f, zc, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::string sh = std::string("rmsnorm ") + (xb ? "bf16" : "f32") + "->" + (yb ? "bf16" : "f32") +
                         " rows " + std::to_string(rows) + " D " + std::to_string(D) + (with_w ? (zc ? " zc" : " w") : "");
  check("production " + sh, download(y0, x.size()), ref, yb);
  if (took) check("vec        " + sh, download(y1, x.size()), ref, yb);
  else std::printf("--   vec declined %s\n", sh.c_str());
  cudaFree(dx), cudaFree(dw), cudaFree(y0), cudaFree(y1);
}

void test_gated(int64_t rows, int64_t D, int act) {
  const auto x = rnd(size_t(rows * D), -2, 2, uint32_t(rows + D), true);
  const auto g = rnd(size_t(rows * D), -3, 3, uint32_t(rows + 3 * D), true);
  const auto w = rnd(size_t(D), 0.5f, 1.5f, uint32_t(D + 1), false);
  std::vector<double> ref(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(x[r * D + d]) * x[r * D + d];
    const double inv = 1.0 / std::sqrt(ss / double(D) + 1e-6);
    for (int64_t d = 0; d < D; ++d) {
      const double gv = g[r * D + d], sg = 1.0 / (1.0 + std::exp(-gv));
      ref[r * D + d] = x[r * D + d] * inv * w[d] * (act == 0 ? gv * sg : sg);
    }
  }
  bf16 *dx = upload<bf16>(x), *dg = upload<bf16>(g), *y0, *y1;
  float* dw = upload<float>(w);
  CUDA_CHECK(cudaMalloc(&y0, 2 * x.size()));
  CUDA_CHECK(cudaMalloc(&y1, 2 * x.size()));
  gated_rmsnorm(dx, Dt::BF16, dg, Dt::BF16, dw, y0, Dt::BF16, rows, D, 1e-6f, act, 0);
  const bool took = dev::gated_rmsnorm_vec<bf16, bf16, bf16>(dx, dg, dw, y1, rows, D, 1e-6f, act, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::string sh = "gated rows " + std::to_string(rows) + " D " + std::to_string(D) + (act ? " sigmoid" : " silu");
  check("production " + sh, download(y0, x.size()), ref, true);
  if (took) check("vec        " + sh, download(y1, x.size()), ref, true);
  else std::printf("--   vec declined %s\n", sh.c_str());
  cudaFree(dx), cudaFree(dg), cudaFree(dw), cudaFree(y0), cudaFree(y1);
}

void test_add(int64_t n) {
  const auto h = rnd(size_t(n), -2, 2, 5, false), y = rnd(size_t(n), -2, 2, 6, true);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = double(h[i]) + y[i];
  float *h0 = upload<float>(h), *h1 = upload<float>(h);
  bf16* dy = upload<bf16>(y);
  add(h0, Dt::F32, dy, Dt::BF16, n, 0);
  const bool took = dev::add_vec<float, bf16>(h1, dy, n, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  check("production add f32 += bf16 n " + std::to_string(n), download(h0, n), ref, false);
  if (took) check("vec        add f32 += bf16 n " + std::to_string(n), download(h1, n), ref, false);
  else std::printf("--   vec declined add n %lld\n", (long long)n);
  cudaFree(h0), cudaFree(h1), cudaFree(dy);
}

void test_shared(int64_t T, int64_t D, bool gated) {
  const auto x = rnd(size_t(T * D), -1, 1, 11, true), sh = rnd(size_t(T * D), -2, 2, 12, true),
             y = rnd(size_t(T * D), -2, 2, 13, true), gt = rnd(size_t(D), -0.05f, 0.05f, 14, false);
  std::vector<double> ref(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double d = 0;
    for (int64_t i = 0; i < D; ++i) d += double(x[t * D + i]) * gt[i];
    const double g = gated ? 1.0 / (1.0 + std::exp(-d)) : 1.0;
    for (int64_t i = 0; i < D; ++i) ref[t * D + i] = y[t * D + i] + g * sh[t * D + i];
  }
  bf16 *dx = upload<bf16>(x), *ds = upload<bf16>(sh), *y0 = upload<bf16>(y), *y1 = upload<bf16>(y);
  float* dg = upload<float>(gt);
  shared_expert_add(dx, gated ? dg : nullptr, ds, T, D, y0, 0);
  const bool took = dev::shared_expert_add_vec(dx, gated ? dg : nullptr, ds, T, D, y1, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::string s = "shared add T " + std::to_string(T) + " D " + std::to_string(D) + (gated ? " gated" : "");
  check("production " + s, download(y0, x.size()), ref, true);
  if (took) check("vec        " + s, download(y1, x.size()), ref, true);
  else std::printf("--   vec declined %s\n", s.c_str());
  cudaFree(dx), cudaFree(ds), cudaFree(y0), cudaFree(y1), cudaFree(dg);
}

__global__ void fill(float* p, int64_t n, float a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = a * float((i * 2654435761u) % 1000) / 1000.f - a / 2;
}
__global__ void fill_bf(bf16* p, int64_t n, float a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(a * float((i * 2654435761u) % 1000) / 1000.f - a / 2);
}

void bench() {
  const int64_t T = 32768;
  auto line = [](const char* what, double bytes, double t0, double t1) {
    std::printf("bench %-52s production %7.3f ms (%4.2f TB/s)  vec %7.3f ms (%4.2f TB/s)  %.2fx\n", what, t0,
                bytes / t0 * 1e-9, t1, bytes / t1 * 1e-9, t0 / t1);
  };
  const int64_t big = T * 4096 * 2;  // elements of the largest buffer below
  float *xf, *hf, *w;
  bf16 *xb, *gb, *yb, *sb;
  CUDA_CHECK(cudaMalloc(&xf, 4 * big));
  CUDA_CHECK(cudaMalloc(&hf, 4 * big));
  CUDA_CHECK(cudaMalloc(&w, 4 * 8192));
  CUDA_CHECK(cudaMalloc(&xb, 2 * big));
  CUDA_CHECK(cudaMalloc(&gb, 2 * big));
  CUDA_CHECK(cudaMalloc(&yb, 2 * big));
  CUDA_CHECK(cudaMalloc(&sb, 2 * big));
  fill<<<1024, 256>>>(xf, big, 4.f);
  fill<<<1024, 256>>>(hf, big, 4.f);
  fill<<<8, 256>>>(w, 8192, 1.f);
  fill_bf<<<1024, 256>>>(xb, big, 4.f);
  fill_bf<<<1024, 256>>>(gb, big, 6.f);
  fill_bf<<<1024, 256>>>(sb, big, 4.f);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int64_t D : {2048, 4096}) {  // the residual norm (Qwen3.5 2048, GLM-5.3-Flash 4096): f32 -> bf16
    const double t0 = median_ms([&] { rmsnorm(xf, Dt::F32, w, yb, Dt::BF16, T, D, 1e-6f, false, 0); }, 20);
    const double t1 = median_ms([&] { dev::rmsnorm_vec<float, bf16>(xf, w, yb, T, D, 1e-6f, false, 0); }, 20);
    line(("rmsnorm f32->bf16 T 32768 D " + std::to_string(D)).c_str(), double(T) * D * 6, t0, t1);
  }
  {  // Qwen3.5 q / k norms: 16 heads of 256, bf16 in place
    const int64_t rows = T * 16, D = 256;
    const double t0 = median_ms([&] { rmsnorm(xb, Dt::BF16, w, yb, Dt::BF16, rows, D, 1e-6f, true, 0); }, 20);
    const double t1 = median_ms([&] { dev::rmsnorm_vec<bf16, bf16>(xb, w, yb, rows, D, 1e-6f, true, 0); }, 20);
    line("rmsnorm bf16->bf16 rows T*16 D 256", double(rows) * D * 4, t0, t1);
  }
  {  // Qwen3.5 GDN output norm: 32 heads of 128, SiLU gate
    const int64_t rows = T * 32, D = 128;
    const double t0 =
        median_ms([&] { gated_rmsnorm(xb, Dt::BF16, gb, Dt::BF16, w, yb, Dt::BF16, rows, D, 1e-6f, 0, 0); }, 20);
    const double t1 =
        median_ms([&] { dev::gated_rmsnorm_vec<bf16, bf16, bf16>(xb, gb, w, yb, rows, D, 1e-6f, 0, 0); }, 20);
    line("gated rmsnorm bf16 rows T*32 D 128", double(rows) * D * 6, t0, t1);
  }
  {
    const int64_t n = T * 2048;
    const double t0 = median_ms([&] { add(hf, Dt::F32, yb, Dt::BF16, n, 0); }, 20);
    const double t1 = median_ms([&] { dev::add_vec<float, bf16>(hf, yb, n, 0); }, 20);
    line("add f32 += bf16 T 32768 x 2048", double(n) * 10, t0, t1);
  }
  {
    const int64_t D = 2048;
    const double t0 = median_ms([&] { shared_expert_add(xb, w, sb, T, D, yb, 0); }, 20);
    const double t1 = median_ms([&] { dev::shared_expert_add_vec(xb, w, sb, T, D, yb, 0); }, 20);
    line("shared expert add (gated) T 32768 D 2048", double(T) * D * 8, t0, t1);
  }
  for (void* p : {(void*)xf, (void*)hf, (void*)w, (void*)xb, (void*)gb, (void*)yb, (void*)sb}) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && !std::strcmp(argv[1], "--bench")) {
    bench();
    return 0;
  }
  for (int64_t rows : {1, 7, 333})
    for (int64_t D : {40, 72, 128, 256, 2048, 4096, 8200}) {
      test_rmsnorm<float, bf16>(rows, D, true, false);
      test_rmsnorm<bf16, bf16>(rows, D, true, true);
    }
  test_rmsnorm<float, float>(129, 2048, false, false);
  test_rmsnorm<float, bf16>(3, 36, true, false);  // D % 8 != 0: vec declines
  for (int64_t rows : {1, 5, 1000})
    for (int64_t D : {64, 128, 256}) {
      test_gated(rows, D, 0);
      test_gated(rows, D, 1);
    }
  test_add(8 * 12345);
  test_add(8 * 12345 + 3);  // n % 8 != 0: vec declines
  test_shared(9, 2048, true);
  test_shared(9, 4096, false);
  test_shared(3, 2040, true);  // D % 8 == 0, not a multiple of 2048
  std::printf("%d failures\n", fails);
  return fails ? 1 : 0;
}
