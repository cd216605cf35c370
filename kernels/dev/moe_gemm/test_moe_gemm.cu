// Standalone test + bench of kernels/moe_gemm.cu (grouped_gemm_tc, grouped_gemm_swiglu_tc).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/moe_gemm/test_moe_gemm.cu
//        kernels/moe_gemm.cu kernels/backend_ops.cu -lcublas -lcuda -o /tmp/mg && /tmp/mg && /tmp/mg --bench
//   (run_device.sh compiles the three in parallel)
// Test: offsets / tile_off built on the host as moe_dispatch defines them, bf16 data from a hash,
// reference in fp64 over the same bf16 values (all rows for small shapes; first, last and one
// random row of every expert for the large ones). Error = |y - ref| / max_c |ref[row, c]|;
// tolerance 4e-3 (bf16 output rounding is <= 2^-9 = 1.95e-3 of the value; fp32 accumulation
// adds ~1e-6). Rows past the last expert are checked untouched (a sentinel). Determinism: the
// same rows placed at another offset inside their expert's tiles give bitwise-equal output.
// The grid runs four times: default loads (TMA where K % 8 == 0), the same with every plain TMA GEMM
// as 2-CTA clusters (DZ_MOE_GEMM_CLUSTERS=1), then DZ_MOE_GEMM_LOADS=cpasync and =elem (the
// fallbacks for shapes or pointers TMA cannot take).
// Bench: the real shapes with ~uniform routing, median of 10 (cudaEvents), against cuBLAS
// cublasGemmEx of one dense GEMM with the same total rows; the plain GEMMs also with the clusters
// forced off and on, their outputs compared bitwise; gather_rows + the gate GEMM against the gate GEMM
// gathering its rows in its loaders, outputs compared bitwise.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend_ops.cuh"
#include "core/bf16.hpp"
#include "moe_gemm.cuh"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)

using bf16 = __nv_bfloat16;

// ---- bf16 data from a hash, identical on host and device ----
__host__ __device__ inline uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return uint32_t(x);
}
// uniform in [-scale, scale) (scale a power of two), rounded to bf16 (ties to even)
__host__ __device__ inline uint16_t rand_bf16(uint64_t i, uint32_t seed, float scale) {
  const float u = float(hash32(i, seed) >> 8) * (1.f / 16777216.f);
  const float v = (2.f * u - 1.f) * scale;
  uint32_t b;
  memcpy(&b, &v, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}
__global__ void k_fill(uint16_t* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = rand_bf16(uint64_t(i), seed, scale);
}
static void fill(bf16* p, int64_t n, uint32_t seed, float scale) {
  if (n <= 0) return;
  k_fill<<<1024, 256>>>(reinterpret_cast<uint16_t*>(p), n, seed, scale);
  CK(cudaGetLastError());
}
static float pow2_scale(int64_t K) {  // ~ 2 / sqrt(K), a power of two
  return std::exp2(std::round(std::log2(2.0 / std::sqrt(double(K)))));
}

struct Layout {
  int E = 0;
  std::vector<int32_t> offsets, tile_off;
  int64_t n = 0, max_tiles = 0;
  int32_t *d_off = nullptr, *d_toff = nullptr;
};
static Layout make_layout(const std::vector<int>& rows) {
  Layout L;
  L.E = int(rows.size());
  L.offsets.assign(L.E + 1, 0);
  L.tile_off.assign(L.E + 1, 0);
  for (int e = 0; e < L.E; ++e) {
    L.offsets[e + 1] = L.offsets[e] + rows[e];
    L.tile_off[e + 1] = L.tile_off[e] + (rows[e] + 63) / 64;
  }
  L.n = L.offsets[L.E];
  L.max_tiles = L.n / 64 + L.E + 1;  // as the backend sizes the grid
  CK(cudaMalloc(&L.d_off, sizeof(int32_t) * (L.E + 1)));
  CK(cudaMalloc(&L.d_toff, sizeof(int32_t) * (L.E + 1)));
  CK(cudaMemcpy(L.d_off, L.offsets.data(), sizeof(int32_t) * (L.E + 1), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(L.d_toff, L.tile_off.data(), sizeof(int32_t) * (L.E + 1), cudaMemcpyHostToDevice));
  return L;
}
static void free_layout(Layout& L) {
  CK(cudaFree(L.d_off));
  CK(cudaFree(L.d_toff));
}
static int expert_of(const Layout& L, int64_t r) {
  return int(std::upper_bound(L.offsets.begin(), L.offsets.end(), int32_t(r)) - L.offsets.begin()) - 1;
}

static double dot(const double* x, const uint16_t* w, int64_t K) {
  double s[4] = {0, 0, 0, 0};  // four partial sums (speed; fp64 order does not matter here)
  for (int64_t k = 0; k < K; ++k) s[k & 3] += x[k] * double(dz::bf16_to_f32(w[k]));
  return (s[0] + s[1]) + (s[2] + s[3]);
}

struct Err {
  double max_rel = 0;
  int64_t bad = 0, checked = 0;
};
// fp64 reference on the listed rows; W0 (and W1 for SwiGLU) on the device, copied per expert.
static Err check_rows(const Layout& L, const bf16* d_xs, const bf16* d_w0, const bf16* d_w1, const bf16* d_y,
                      int64_t N, int64_t K, std::vector<int64_t> rows, bool swiglu, double tol) {
  Err err;
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<uint16_t> w0(size_t(N * K)), w1(swiglu ? size_t(N * K) : 0), x(static_cast<size_t>(K)),
      y(static_cast<size_t>(N));
  std::vector<double> xd(static_cast<size_t>(K)), ref(static_cast<size_t>(N));
  int cur_e = -1;
  for (int64_t r : rows) {
    const int e = expert_of(L, r);
    if (e != cur_e) {
      CK(cudaMemcpy(w0.data(), d_w0 + int64_t(e) * N * K, sizeof(uint16_t) * N * K, cudaMemcpyDeviceToHost));
      if (swiglu)
        CK(cudaMemcpy(w1.data(), d_w1 + int64_t(e) * N * K, sizeof(uint16_t) * N * K, cudaMemcpyDeviceToHost));
      cur_e = e;
    }
    CK(cudaMemcpy(x.data(), d_xs + r * K, sizeof(uint16_t) * K, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), d_y + r * N, sizeof(uint16_t) * N, cudaMemcpyDeviceToHost));
    for (int64_t k = 0; k < K; ++k) xd[k] = dz::bf16_to_f32(x[k]);
    double mx = 0;
    for (int64_t c = 0; c < N; ++c) {
      const double g = dot(xd.data(), w0.data() + c * K, K);
      if (swiglu) {
        const double u = dot(xd.data(), w1.data() + c * K, K);
        ref[c] = g / (1.0 + std::exp(-g)) * u;
      } else {
        ref[c] = g;
      }
      mx = std::max(mx, std::fabs(ref[c]));
    }
    const double scale = std::max(mx, 1e-30);
    for (int64_t c = 0; c < N; ++c) {
      const double v = dz::bf16_to_f32(y[c]);
      const double rel = std::isfinite(v) ? std::fabs(v - ref[c]) / scale : INFINITY;
      if (!(rel <= tol)) {
        if (err.bad < 5)
          fprintf(stderr, "    row %lld (expert %d) col %lld: got %g, want %g\n", (long long)r, e, (long long)c, v,
                  ref[c]);
        ++err.bad;
      }
      err.max_rel = std::max(err.max_rel, rel);
    }
    err.checked += N;
  }
  return err;
}

static int g_fail = 0;

// One grid point: E experts with the given row counts, (N, K); plain and SwiGLU.
static void test_case(const std::vector<int>& rows, int64_t N, int64_t K, std::mt19937& rng, uint32_t seed) {
  Layout L = make_layout(rows);
  const int E = L.E;
  const int64_t pad = 70;  // sentinel rows after the last expert
  const int64_t n = L.n, nalloc = n + pad;
  bf16 *xs, *w0, *w1, *y, *h;
  CK(cudaMalloc(&xs, sizeof(bf16) * std::max<int64_t>(1, nalloc * K)));
  CK(cudaMalloc(&w0, sizeof(bf16) * E * N * K));
  CK(cudaMalloc(&w1, sizeof(bf16) * E * N * K));
  CK(cudaMalloc(&y, sizeof(bf16) * nalloc * N));
  CK(cudaMalloc(&h, sizeof(bf16) * nalloc * N));
  fill(xs, nalloc * K, seed, 1.f);
  const float ws = pow2_scale(K);
  fill(w0, E * N * K, seed + 1, ws);
  fill(w1, E * N * K, seed + 2, ws);
  CK(cudaMemset(y, 0xFF, sizeof(bf16) * nalloc * N));
  CK(cudaMemset(h, 0xFF, sizeof(bf16) * nalloc * N));
  dz::cuda::grouped_gemm_tc(xs, w0, L.d_off, L.d_toff, E, L.max_tiles, N, K, y, 0);
  dz::cuda::grouped_gemm_swiglu_tc(xs, w0, w1, L.d_off, L.d_toff, E, L.max_tiles, N, K, h, 0);
  CK(cudaDeviceSynchronize());

  // rows to check: all for small shapes, else first / last / one random row of each expert
  std::vector<int64_t> chk;
  const bool all = n * N * K <= int64_t(400) * 1000 * 1000;
  for (int e = 0; e < E; ++e) {
    const int64_t a = L.offsets[e], b = L.offsets[e + 1];
    if (a == b) continue;
    if (all) {
      for (int64_t r = a; r < b; ++r) chk.push_back(r);
    } else {
      chk.push_back(a);
      chk.push_back(b - 1);
      chk.push_back(a + int64_t(rng() % uint32_t(b - a)));
      if (b - a > 128) chk.push_back(a + 128);
    }
  }
  const double tol = 4e-3;
  const Err ep = check_rows(L, xs, w0, nullptr, y, N, K, chk, false, tol);
  const Err es = check_rows(L, xs, w0, w1, h, N, K, chk, true, tol);
  // sentinel rows untouched
  std::vector<uint16_t> tail(size_t(pad * N));
  int64_t touched = 0;
  for (bf16* p : {y, h}) {
    CK(cudaMemcpy(tail.data(), p + n * N, sizeof(uint16_t) * pad * N, cudaMemcpyDeviceToHost));
    for (uint16_t v : tail) touched += v != 0xFFFF;
  }
  const bool ok = ep.bad == 0 && es.bad == 0 && touched == 0;
  if (!ok) ++g_fail;
  printf("%s E=%-3d n=%-6lld N=%-5lld K=%-5lld rows checked %-6lld | plain max err %.2e | swiglu max err %.2e%s\n",
         ok ? "ok  " : "FAIL", E, (long long)n, (long long)N, (long long)K, (long long)(chk.size()), ep.max_rel,
         es.max_rel, touched ? " | SENTINEL OVERWRITTEN" : "");
  CK(cudaFree(xs));
  CK(cudaFree(w0));
  CK(cudaFree(w1));
  CK(cudaFree(y));
  CK(cudaFree(h));
  free_layout(L);
}

// The rows of expert 0 shifted by `shift` inside their tiles (other rows prepended) must give
// bitwise the same outputs.
static void test_determinism(int64_t N, int64_t K, int shift) {
  const std::vector<int> rows_a = {200, 77, 131}, rows_b = {200 + shift, 77, 131};
  Layout A = make_layout(rows_a), B = make_layout(rows_b);
  const int E = 3;
  bf16 *xa, *xb, *w0, *w1, *ya, *yb, *ha, *hb;
  CK(cudaMalloc(&xa, sizeof(bf16) * A.n * K));
  CK(cudaMalloc(&xb, sizeof(bf16) * B.n * K));
  CK(cudaMalloc(&w0, sizeof(bf16) * E * N * K));
  CK(cudaMalloc(&w1, sizeof(bf16) * E * N * K));
  for (bf16** p : {&ya, &yb, &ha, &hb}) CK(cudaMalloc(p, sizeof(bf16) * B.n * N));
  fill(xa, A.n * K, 7, 1.f);
  fill(xb, shift * K, 8, 1.f);
  CK(cudaMemcpy(xb + shift * K, xa, sizeof(bf16) * A.n * K, cudaMemcpyDeviceToDevice));
  fill(w0, E * N * K, 9, pow2_scale(K));
  fill(w1, E * N * K, 10, pow2_scale(K));
  dz::cuda::grouped_gemm_tc(xa, w0, A.d_off, A.d_toff, E, A.max_tiles, N, K, ya, 0);
  dz::cuda::grouped_gemm_tc(xb, w0, B.d_off, B.d_toff, E, B.max_tiles, N, K, yb, 0);
  dz::cuda::grouped_gemm_swiglu_tc(xa, w0, w1, A.d_off, A.d_toff, E, A.max_tiles, N, K, ha, 0);
  dz::cuda::grouped_gemm_swiglu_tc(xb, w0, w1, B.d_off, B.d_toff, E, B.max_tiles, N, K, hb, 0);
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> a(size_t(A.n * N)), b(size_t(A.n * N));
  int64_t diff = 0;
  for (int which = 0; which < 2; ++which) {
    CK(cudaMemcpy(a.data(), which ? ha : ya, sizeof(bf16) * A.n * N, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), (which ? hb : yb) + shift * N, sizeof(bf16) * A.n * N, cudaMemcpyDeviceToHost));
    diff += int64_t(memcmp(a.data(), b.data(), a.size() * 2) != 0);
  }
  if (diff) ++g_fail;
  printf("%s determinism N=%lld K=%lld shift=%d: outputs %s\n", diff ? "FAIL" : "ok  ", (long long)N, (long long)K,
         shift, diff ? "DIFFER" : "bitwise equal");
  for (bf16* p : {xa, xb, w0, w1, ya, yb, ha, hb}) CK(cudaFree(p));
  free_layout(A);
  free_layout(B);
}

static void test_grid() {
  std::mt19937 rng(12345);
  const int Es[] = {1, 3, 8, 64};
  const int64_t shapes[][2] = {{16, 24},    {48, 32},   {96, 64},  {1024, 2304}, {2304, 1024},
                               {512, 2048}, {130, 200}, {17, 13},  {40, 36},     {7, 5}};
  uint32_t seed = 100;
  for (auto& sh : shapes)
    for (int E : Es) {
      std::vector<int> rows(E);
      for (int e = 0; e < E; ++e) rows[e] = (rng() % 5 == 0) ? 0 : int(rng() % 301);
      if (E == 1 && rows[0] == 0) rows[0] = 129;
      if (E == 8) {  // tile edges: 64, 65, 127, 128, 129 rows
        rows[1] = 64;
        rows[2] = 65;
        rows[3] = 128;
        rows[4] = 129;
        rows[5] = 127;
      }
      test_case(rows, sh[0], sh[1], rng, seed += 3);
    }
  // all experts empty: nothing may be written
  test_case({0, 0, 0}, 64, 64, rng, seed += 3);
  test_determinism(96, 64, 37);
  test_determinism(1024, 2304, 5);
  // E > ~2000: the TMA kernel's epilogue without its staging tiles (they no longer fit beside offsets)
  std::vector<int> many(2100);
  for (int& r : many) r = (rng() % 4 == 0) ? int(rng() % 140) : 0;
  test_case(many, 256, 64, rng, seed += 3);
  test_case(many, 96, 72, rng, seed += 3);
}

// The whole grid with each loader: TMA (the default where shapes allow), the same with every plain
// TMA GEMM as 2-CTA clusters (DZ_MOE_GEMM_CLUSTERS=1; not the default), the same with every plain
// TMA GEMM on the swap-AB kernel (DZ_MOE_GEMM_SWAPAB=1), cp.async, element loads.
static int run_tests() {
  const char* modes[] = {nullptr, "clusters", "swapab", "cpasync", "elem"};
  for (const char* m : modes) {
    unsetenv("DZ_MOE_GEMM_LOADS");
    unsetenv("DZ_MOE_GEMM_CLUSTERS");
    unsetenv("DZ_MOE_GEMM_SWAPAB");
    if (m && !strcmp(m, "clusters"))
      setenv("DZ_MOE_GEMM_CLUSTERS", "1", 1);
    else if (m && !strcmp(m, "swapab"))
      setenv("DZ_MOE_GEMM_SWAPAB", "1", 1);
    else if (m)
      setenv("DZ_MOE_GEMM_LOADS", m, 1);
    printf("--- loads: %s ---\n", m ? m : "default (TMA where K % 8 == 0)");
    test_grid();
  }
  unsetenv("DZ_MOE_GEMM_LOADS");
  unsetenv("DZ_MOE_GEMM_CLUSTERS");
  unsetenv("DZ_MOE_GEMM_SWAPAB");
  printf(g_fail ? "%d FAILED\n" : "all tests passed\n", g_fail);
  return g_fail ? 1 : 0;
}

// ---- bench ----
static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
template <class F>
static float time_ms(F&& f, int reps = 10) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();
  f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(t);
}
static void dense(cublasHandle_t hb, const bf16* x, const bf16* W, bf16* y, int64_t M, int64_t N, int64_t K) {
  const float one = 1.f, zero = 0.f;
  // row-major y[M][N] = x[M][K] . W[N][K]^T  <=>  col-major y^T = W^T(op T) . x^T
  const cublasStatus_t st = cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, W, CUDA_R_16BF,
                                         int(K), x, CUDA_R_16BF, int(K), &zero, y, CUDA_R_16BF, int(N),
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasGemmEx failed: %d\n", int(st));
    exit(2);
  }
}

// DZ_BENCH_ROWS=file: E row counts (whitespace-separated) instead of rows, e.g. a model's routing
static void read_rows_env(std::vector<int>& rows, int E, int64_t n) {
  if (const char* f = getenv("DZ_BENCH_ROWS")) {
    FILE* fp = fopen(f, "r");
    if (!fp) {
      fprintf(stderr, "DZ_BENCH_ROWS: cannot open %s\n", f);
      exit(2);
    }
    int64_t sum = 0;
    for (int e = 0; e < E; ++e) {
      if (fscanf(fp, "%d", &rows[e]) != 1 || rows[e] < 0) {
        fprintf(stderr, "DZ_BENCH_ROWS: %s has fewer than %d counts\n", f, E);
        exit(2);
      }
      sum += rows[e];
    }
    fclose(fp);
    if (sum != n) {
      fprintf(stderr, "DZ_BENCH_ROWS: %s sums to %lld rows, the bench has %lld\n", f, (long long)sum, (long long)n);
      exit(2);
    }
    printf("rows per expert from %s\n", f);
  }
}

static void bench_model(const char* name, int E, int top_k, int64_t D, int64_t I, cublasHandle_t hb,
                        int64_t T = 32768) {
  const int64_t n = T * top_k;
  std::mt19937 rng(777);
  std::vector<int> rows(E, 0);
  for (int64_t a = 0; a < n; ++a) ++rows[rng() % uint32_t(E)];  // ~uniform routing
  read_rows_env(rows, E, n);
  Layout L = make_layout(rows);
  bf16 *xs, *wg, *wu, *wd, *h, *yd, *yc;
  CK(cudaMalloc(&xs, sizeof(bf16) * n * D));
  CK(cudaMalloc(&wg, sizeof(bf16) * E * I * D));
  CK(cudaMalloc(&wu, sizeof(bf16) * E * I * D));
  CK(cudaMalloc(&wd, sizeof(bf16) * E * D * I));
  CK(cudaMalloc(&h, sizeof(bf16) * n * I));
  CK(cudaMalloc(&yd, sizeof(bf16) * n * D));
  CK(cudaMalloc(&yc, sizeof(bf16) * n * std::max(D, I)));
  fill(xs, n * D, 1, 1.f);
  fill(wg, E * I * D, 2, pow2_scale(D));
  fill(wu, E * I * D, 3, pow2_scale(D));
  fill(wd, E * D * I, 4, pow2_scale(I));
  CK(cudaDeviceSynchronize());
  const int mn = *std::min_element(rows.begin(), rows.end()), mx = *std::max_element(rows.begin(), rows.end());
  printf("\n%s: E=%d top_k=%d n=%lld rows/expert %d..%d, D=%lld I=%lld\n", name, E, top_k, (long long)n, mn, mx,
         (long long)D, (long long)I);

  const double fl_gu = 2.0 * n * I * D, fl_d = 2.0 * n * D * I;
  const float t_g = time_ms([&] { dz::cuda::grouped_gemm_tc(xs, wg, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0); });
  setenv("DZ_MOE_GEMM_LOADS", "cpasync", 1);
  const float t_g_cp =
      time_ms([&] { dz::cuda::grouped_gemm_tc(xs, wg, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0); });
  unsetenv("DZ_MOE_GEMM_LOADS");
  const float t_c1 = time_ms([&] { dense(hb, xs, wg, yc, n, I, D); });
  const float t_s = time_ms(
      [&] { dz::cuda::grouped_gemm_swiglu_tc(xs, wg, wu, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0); });
  const float t_d = time_ms([&] { dz::cuda::grouped_gemm_tc(h, wd, L.d_off, L.d_toff, E, L.max_tiles, D, I, yd, 0); });
  const float t_c2 = time_ms([&] { dense(hb, h, wd, yc, n, D, I); });
  // the plain GEMMs with the 2-CTA clusters off and on (DZ_BENCH_AB_VAR names another switch to
  // toggle, between the values DZ_BENCH_AB_OFF / _ON, 0 / 1 unless set), and their outputs compared
  // bitwise (same k order: they must be equal)
  const char* abv = getenv("DZ_BENCH_AB_VAR") ? getenv("DZ_BENCH_AB_VAR") : "DZ_MOE_GEMM_CLUSTERS";
  const char* ab_val[2] = {getenv("DZ_BENCH_AB_OFF") ? getenv("DZ_BENCH_AB_OFF") : "0",
                           getenv("DZ_BENCH_AB_ON") ? getenv("DZ_BENCH_AB_ON") : "1"};
  float t_cl[2][2];
  std::vector<uint16_t> out_cl[2][2];
  for (int on = 0; on < 2; ++on) {
    setenv(abv, ab_val[on], 1);
    for (int d = 0; d < 2; ++d) {
      auto f = [&] {
        if (d)
          dz::cuda::grouped_gemm_tc(h, wd, L.d_off, L.d_toff, E, L.max_tiles, D, I, yd, 0);
        else
          dz::cuda::grouped_gemm_tc(xs, wg, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0);
      };
      t_cl[on][d] = time_ms(f);
      f();
      out_cl[on][d].resize(size_t(n * (d ? D : I)));
      CK(cudaMemcpy(out_cl[on][d].data(), d ? yd : h, out_cl[on][d].size() * 2, cudaMemcpyDeviceToHost));
    }
  }
  unsetenv(abv);
  auto tf = [](double fl, float ms) { return fl / (ms * 1e-3) / 1e12; };
  printf("  gate/up  grouped_gemm_tc  N=%-5lld K=%-5lld %8.3f ms %7.1f TFLOP/s | cuBLAS dense %8.3f ms %7.1f TFLOP/s | ratio %.2f\n",
         (long long)I, (long long)D, t_g, tf(fl_gu, t_g), t_c1, tf(fl_gu, t_c1), t_c1 / t_g);
  printf("  gate/up  (cp.async loads)  %8.3f ms %7.1f TFLOP/s\n", t_g_cp, tf(fl_gu, t_g_cp));
  printf("  swiglu   (gate+up fused)  N=%-5lld K=%-5lld %8.3f ms %7.1f TFLOP/s | cuBLAS 2x dense %8.3f ms %7.1f TFLOP/s | ratio %.2f\n",
         (long long)I, (long long)D, t_s, tf(2 * fl_gu, t_s), 2 * t_c1, tf(2 * fl_gu, 2 * t_c1), 2 * t_c1 / t_s);
  printf("  down     grouped_gemm_tc  N=%-5lld K=%-5lld %8.3f ms %7.1f TFLOP/s | cuBLAS dense %8.3f ms %7.1f TFLOP/s | ratio %.2f\n",
         (long long)D, (long long)I, t_d, tf(fl_d, t_d), t_c2, tf(fl_d, t_c2), t_c2 / t_d);

  // gather_rows then the gate GEMM on the gathered copy, against the gate GEMM gathering the token
  // rows in its loaders (a shuffled perm over T tokens x top_k), outputs compared bitwise
  float t_gather, t_g2, t_gat;
  bool gat_eq;
  {
    const int64_t T = n / top_k;
    std::vector<int32_t> perm(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) perm[size_t(i)] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(9));
    int32_t* d_perm;
    bf16* x;
    CK(cudaMalloc(&d_perm, sizeof(int32_t) * n));
    CK(cudaMalloc(&x, sizeof(bf16) * T * D));
    CK(cudaMemcpy(d_perm, perm.data(), sizeof(int32_t) * n, cudaMemcpyHostToDevice));
    fill(x, T * D, 5, 1.f);
    t_gather = time_ms([&] { dz::cuda::gather_rows(x, d_perm, n, top_k, D, xs, 0); });
    t_g2 = time_ms([&] { dz::cuda::grouped_gemm_tc(xs, wg, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0); });
    std::vector<uint16_t> ref(size_t(n * I)), got(size_t(n * I));
    CK(cudaMemcpy(ref.data(), h, ref.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemset(h, 0, ref.size() * 2));
    t_gat = time_ms(
        [&] { dz::cuda::grouped_gemm_tc(x, wg, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0, d_perm, top_k); });
    CK(cudaMemcpy(got.data(), h, got.size() * 2, cudaMemcpyDeviceToHost));
    gat_eq = ref == got;
    if (!gat_eq) ++g_fail;
    CK(cudaFree(d_perm));
    CK(cudaFree(x));
  }
  printf("  gather + gate %.3f + %.3f = %.3f ms | gate gathering its rows %.3f ms (%.3f ms saved); outputs %s; "
         "production %s\n",
         t_gather, t_g2, t_gather + t_g2, t_gat, t_gather + t_g2 - t_gat, gat_eq ? "bitwise equal" : "DIFFER (FAIL)",
         dz::cuda::grouped_gemm_gathers_rows(I, D) ? "gathers in the loaders" : "gathers beforehand");

  const bool cl_eq = out_cl[0][0] == out_cl[1][0] && out_cl[0][1] == out_cl[1][1];
  if (!cl_eq) ++g_fail;
  printf("  2-CTA clusters (%s) off / on: gate/up %.3f / %.3f ms (%.2fx), down %.3f / %.3f ms (%.2fx); outputs %s\n",
         abv, t_cl[0][0], t_cl[1][0], t_cl[0][0] / t_cl[1][0], t_cl[0][1], t_cl[1][1], t_cl[0][1] / t_cl[1][1],
         cl_eq ? "bitwise equal" : "DIFFER (FAIL)");
  // spot-check the bench outputs (swiglu h, then down on that h): a few rows of some experts
  std::vector<int64_t> chk;
  for (int e = 0; e < E; e += std::max(1, E / 8)) {
    const int64_t a = L.offsets[e], b = L.offsets[e + 1];
    if (a == b) continue;
    chk.push_back(a);
    chk.push_back(b - 1);
    chk.push_back(a + int64_t(rng() % uint32_t(b - a)));
  }
  dz::cuda::grouped_gemm_swiglu_tc(xs, wg, wu, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0);
  dz::cuda::grouped_gemm_tc(h, wd, L.d_off, L.d_toff, E, L.max_tiles, D, I, yd, 0);
  CK(cudaDeviceSynchronize());
  const Err es = check_rows(L, xs, wg, wu, h, I, D, chk, true, 4e-3);
  const Err ed = check_rows(L, h, wd, nullptr, yd, D, I, chk, false, 4e-3);
  const bool ok = es.bad == 0 && ed.bad == 0;
  if (!ok) ++g_fail;
  printf("  %s spot check %zu rows: swiglu max err %.2e, down max err %.2e\n", ok ? "ok" : "FAIL", chk.size(),
         es.max_rel, ed.max_rel);
  for (bf16* p : {xs, wg, wu, wd, h, yd, yc}) CK(cudaFree(p));
  free_layout(L);
}

static int run_bench(const std::string& only) {
  cublasHandle_t hb;
  if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasCreate failed\n");
    return 2;
  }
  if (std::string("Kimi-Linear-48B").find(only) != std::string::npos) bench_model("Kimi-Linear-48B", 256, 8, 2304, 1024, hb);
  if (std::string("Qwen3-Next-80B").find(only) != std::string::npos) bench_model("Qwen3-Next-80B", 512, 10, 2048, 512, hb);
  if (std::string("Qwen3.5-35B-A3B").find(only) != std::string::npos) bench_model("Qwen3.5-35B-A3B", 256, 8, 2048, 512, hb);
  if (std::string("Qwen3.5-35B-A3B T=8192").find(only) != std::string::npos) bench_model("Qwen3.5-35B-A3B T=8192", 256, 8, 2048, 512, hb, 8192);
  if (std::string("GLM-5.3-Flash T=8192").find(only) != std::string::npos) bench_model("GLM-5.3-Flash T=8192", 288, 8, 4096, 2048, hb, 8192);
  cublasDestroy(hb);
  return g_fail ? 1 : 0;
}

// --profile [glm]: one launch of each kernel on the Kimi shapes, or GLM-5.3-Flash's at T = 8192 (for ncu;
// DZ_BENCH_ROWS as in the bench).
static int run_profile(bool glm) {
  const int E = glm ? 288 : 256;
  const int64_t n = glm ? 8192 * 8 : 32768 * 8, D = glm ? 4096 : 2304, I = glm ? 2048 : 1024;
  std::vector<int> rows(E, int(n / E));
  read_rows_env(rows, E, n);
  Layout L = make_layout(rows);
  bf16 *xs, *wg, *wu, *wd, *h, *yd;
  CK(cudaMalloc(&xs, sizeof(bf16) * n * D));
  CK(cudaMalloc(&wg, sizeof(bf16) * E * I * D));
  CK(cudaMalloc(&wu, sizeof(bf16) * E * I * D));
  CK(cudaMalloc(&wd, sizeof(bf16) * E * D * I));
  CK(cudaMalloc(&h, sizeof(bf16) * n * I));
  CK(cudaMalloc(&yd, sizeof(bf16) * n * D));
  fill(xs, n * D, 1, 1.f);
  fill(wg, E * I * D, 2, pow2_scale(D));
  fill(wu, E * I * D, 3, pow2_scale(D));
  fill(wd, E * D * I, 4, pow2_scale(I));
  dz::cuda::grouped_gemm_tc(xs, wg, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0);
  dz::cuda::grouped_gemm_swiglu_tc(xs, wg, wu, L.d_off, L.d_toff, E, L.max_tiles, I, D, h, 0);
  dz::cuda::grouped_gemm_tc(h, wd, L.d_off, L.d_toff, E, L.max_tiles, D, I, yd, 0);
  CK(cudaDeviceSynchronize());
  for (bf16* p : {xs, wg, wu, wd, h, yd}) CK(cudaFree(p));
  free_layout(L);
  printf("profile done\n");
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    const std::string arg = argc > 2 ? argv[2] : "";
    if (mode == "--profile") return run_profile(arg == "glm");
    return mode == "--bench" ? run_bench(arg) : run_tests();
  } catch (const std::exception& e) {
    fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
