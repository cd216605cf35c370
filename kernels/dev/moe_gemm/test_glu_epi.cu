// Test + bench of the fused up-GEMM + activation epilogue (kernels/dev/moe_gemm/moe_gemm_glu.cu,
// grouped_gemm_tc_glu) against what the CUDA backend runs today: grouped_gemm_tc(xs, Wu) -> u, then
// backend_ops' silu_mul(g, u, h, n * N, act) (kernels/backend_ops.cu, linked as it is).
//   bash kernels/dev/moe_gemm/run_glu_epi.sh   (or: /tmp/glu_epi [--bench])
// Test: BITWISE equality of h over all n * N elements (a device compare), rows past n untouched (a
// sentinel), for a grid of shapes (small odd ones: N = 130 / 17 / 7 / 264, K = 200 / 13, experts with
// 0 rows, n < 128 and < 256 rows in total, E = 2100 (the epilogues without staging tiles); Qwen3.5's
// E = 256, K = 2048, N = 512 and GLM-5.3-Flash's E = 288, K = 4096, N = 2048 at n = 65536, uniform
// routing and the rows of kernels/dev/moe_gemm/rows_glm5_3_flash_dummy_T8192.txt), every GluAct
// variant (SwiGLU, its clamp, SiTU with and without the linear bound and with the clamp), out of place
// and in place (h == g), g / h 16-byte aligned and not (+4 and +1 elements), and each loader choice:
// default, DZ_MOE_GEMM_SWAPAB=1 (every TMA shape on k_moe_gemm_swab), =0 (k_moe_gemm_ws<false, 1>),
// DZ_MOE_GEMM_LOADS=cpasync / elem and DZ_MOE_GEMM_CLUSTERS=1 (the unfused fallback).
// Bench (--bench): fused vs unfused (grouped_gemm_tc + silu_mul, two launches) at GLM-5.3-Flash's and
// Qwen3.5's shapes, CUDA events, median of 10; DZ_BENCH_ROWS=file gives the rows per expert.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend_ops.cuh"
#include "moe_gemm.cuh"

namespace dz::cuda {
// (moe_gemm_glu.cu; not in moe_gemm.cuh)
void grouped_gemm_tc_glu(const __nv_bfloat16* xs, const __nv_bfloat16* Wu, const int32_t* offsets,
                         const int32_t* tile_off, int E, int64_t max_tiles, int64_t N, int64_t K,
                         const __nv_bfloat16* g, GluAct act, __nv_bfloat16* h, cudaStream_t s);
}  // namespace dz::cuda

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

using bf16 = __nv_bfloat16;
using dz::GluAct;

// ---- bf16 data from a hash (as test_moe_gemm.cu) ----
__host__ __device__ inline uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return uint32_t(x);
}
__global__ void k_fill(uint16_t* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(hash32(uint64_t(i), seed) >> 8) * (1.f / 16777216.f);
    const float v = (2.f * u - 1.f) * scale;
    uint32_t b = __float_as_uint(v);
    b += 0x7FFFu + ((b >> 16) & 1u);
    p[i] = uint16_t(b >> 16);
  }
}
static void fill(bf16* p, int64_t n, uint32_t seed, float scale) {
  if (n <= 0) return;
  k_fill<<<1024, 256>>>(reinterpret_cast<uint16_t*>(p), n, seed, scale);
  CK(cudaGetLastError());
}
static float pow2_scale(int64_t K) { return std::exp2(std::round(std::log2(2.0 / std::sqrt(double(K))))); }

// mismatches of a[0 .. n) against b (or, b == nullptr, against the value v), and the first index
__global__ void k_cmp(const uint16_t* a, const uint16_t* b, uint16_t v, int64_t n, unsigned long long* res) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (a[i] != (b ? b[i] : v)) {
      atomicAdd(&res[0], 1ull);
      atomicMin(&res[1], (unsigned long long)i);
    }
  }
}
static unsigned long long* g_res = nullptr;
static int64_t count_ne(const bf16* a, const bf16* b, int64_t n, int64_t* first, uint16_t v = 0xFFFF) {
  if (n <= 0) return 0;
  unsigned long long h[2] = {0, ~0ull};
  CK(cudaMemcpy(g_res, h, sizeof(h), cudaMemcpyHostToDevice));
  k_cmp<<<1024, 256>>>(reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), v, n, g_res);
  CK(cudaGetLastError());
  CK(cudaMemcpy(h, g_res, sizeof(h), cudaMemcpyDeviceToHost));
  if (first) *first = int64_t(h[1]);
  return int64_t(h[0]);
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

// E counts summing to n from a file (whitespace-separated, as test_moe_gemm.cu's DZ_BENCH_ROWS);
// false (with a note) when it cannot be read or does not fit.
static bool rows_from_file(const char* f, int E, int64_t n, std::vector<int>& rows) {
  FILE* fp = fopen(f, "r");
  if (!fp) {
    printf("note: cannot open %s\n", f);
    return false;
  }
  std::vector<int> r(E);
  int64_t sum = 0;
  bool ok = true;
  for (int e = 0; e < E && ok; ++e) {
    ok = fscanf(fp, "%d", &r[e]) == 1 && r[e] >= 0;
    if (ok) sum += r[e];
  }
  fclose(fp);
  if (!ok || sum != n) {
    printf("note: %s does not hold %d counts summing to %lld\n", f, E, (long long)n);
    return false;
  }
  rows = r;
  return true;
}
static std::vector<int> uniform_rows(int E, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> rows(E, 0);
  for (int64_t a = 0; a < n; ++a) ++rows[rng() % uint32_t(E)];
  return rows;
}

struct Act {
  const char* name;
  GluAct a;
};
static std::vector<Act> all_acts() {
  std::vector<Act> v;
  GluAct a;
  v.push_back({"swiglu", a});
  a = GluAct{};
  a.limit = 0.75f;  // triggers on g (|g| < 4) and on u (|u| ~ 0.7)
  v.push_back({"swiglu-clamp", a});
  a = GluAct{};
  a.situ_beta = 1.5f;
  v.push_back({"situ", a});
  a = GluAct{};
  a.situ_beta = 2.f, a.situ_linear_beta = 0.5f;
  v.push_back({"situ-linear", a});
  a = GluAct{};
  a.limit = 1.f, a.situ_beta = 2.f, a.situ_linear_beta = 0.5f;
  v.push_back({"situ-clamp", a});
  return v;
}

static void set_mode(const char* m) {
  unsetenv("DZ_MOE_GEMM_SWAPAB");
  unsetenv("DZ_MOE_GEMM_LOADS");
  unsetenv("DZ_MOE_GEMM_CLUSTERS");
  if (!strcmp(m, "swapab=1")) setenv("DZ_MOE_GEMM_SWAPAB", "1", 1);
  if (!strcmp(m, "swapab=0")) setenv("DZ_MOE_GEMM_SWAPAB", "0", 1);
  if (!strcmp(m, "cpasync")) setenv("DZ_MOE_GEMM_LOADS", "cpasync", 1);
  if (!strcmp(m, "elem")) setenv("DZ_MOE_GEMM_LOADS", "elem", 1);
  if (!strcmp(m, "clusters")) setenv("DZ_MOE_GEMM_CLUSTERS", "1", 1);
}

static int g_fail = 0, g_cases = 0;

// One layout and shape under the current mode: for each act, out of place and in place, with g / h
// at element offset `off` (0: 16-byte aligned buffers).
static void test_case(const char* label, const std::vector<int>& rows, int64_t N, int64_t K, const std::vector<Act>& acts,
                      const std::vector<int>& offs, uint32_t seed) {
  Layout L = make_layout(rows);
  const int E = L.E, fail0 = g_fail;
  const int64_t pad = 70, n = L.n, nalloc = n + pad, slack = 16;  // sentinel rows; room for the offsets
  bf16 *xs, *wu, *u, *g0, *ref0, *h0, *hin0;
  CK(cudaMalloc(&xs, sizeof(bf16) * std::max<int64_t>(1, nalloc * K)));
  CK(cudaMalloc(&wu, sizeof(bf16) * E * N * K));
  CK(cudaMalloc(&u, sizeof(bf16) * nalloc * N));
  for (bf16** p : {&g0, &ref0, &h0, &hin0}) CK(cudaMalloc(p, sizeof(bf16) * (nalloc * N + slack)));
  fill(xs, nalloc * K, seed, 1.f);
  fill(wu, E * N * K, seed + 1, pow2_scale(K));
  fill(g0, nalloc * N + slack, seed + 2, 4.f);
  CK(cudaMemset(u, 0xFF, sizeof(bf16) * nalloc * N));
  dz::cuda::grouped_gemm_tc(xs, wu, L.d_off, L.d_toff, E, L.max_tiles, N, K, u, 0);
  CK(cudaDeviceSynchronize());
  for (int off : offs) {
    bf16 *g = g0 + off, *ref = ref0 + off, *h = h0 + off, *hin = hin0 + off;
    if (n * N > 16) {  // large gate values (expf over- / underflows) and -0. (No inf / NaN: a NaN's bits
      // after the bf16 conversion may differ between silu_mul's own two kernels, bf16x2 and scalar.)
      const uint16_t sp[6] = {0x4780, 0xC780, 0x8000, 0x4300, 0xC300, 0x0000};  // +-65536, -0, +-128, 0
      for (int i = 0; i < 6; ++i) CK(cudaMemcpy(g + 3 * i + 1, &sp[i], 2, cudaMemcpyHostToDevice));
    }
    for (const Act& act : acts) {
      dz::cuda::silu_mul(g, u, ref, n * N, act.a, 0);
      for (int inplace = 0; inplace < 2; ++inplace) {
        bf16* out = inplace ? hin : h;
        CK(cudaMemset(out, 0xFF, sizeof(bf16) * nalloc * N));
        if (inplace) CK(cudaMemcpy(hin, g, sizeof(bf16) * n * N, cudaMemcpyDeviceToDevice));
        dz::cuda::grouped_gemm_tc_glu(xs, wu, L.d_off, L.d_toff, E, L.max_tiles, N, K, inplace ? hin : g, act.a, out, 0);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        int64_t first = -1, first_s = -1;
        const int64_t bad = count_ne(out, ref, n * N, &first);
        const int64_t touched = count_ne(out + n * N, nullptr, pad * N, &first_s);
        const bool ok = bad == 0 && touched == 0;
        ++g_cases;
        if (!ok) {
          ++g_fail;
          uint16_t gv = 0, rv = 0, ov = 0;
          if (bad) {
            CK(cudaMemcpy(&gv, g + first, 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&rv, ref + first, 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&ov, out + first, 2, cudaMemcpyDeviceToHost));
          }
          printf("FAIL %-14s E=%-4d n=%-6lld N=%-5lld K=%-5lld %-13s %s off=%d: %lld of %lld differ (first row %lld col %lld:"
                 " g %04x want %04x got %04x), %lld sentinel elements overwritten\n",
                 label, E, (long long)n, (long long)N, (long long)K, act.name, inplace ? "in-place" : "separate", off,
                 (long long)bad, (long long)(n * N), bad ? (long long)(first / N) : -1ll, bad ? (long long)(first % N) : -1ll,
                 gv, rv, ov, (long long)touched);
        }
      }
    }
  }
  printf("%s %-14s E=%-4d n=%-6lld N=%-5lld K=%-5lld (%zu acts x 2 x %zu offsets)\n", g_fail > fail0 ? "FAIL" : "ok  ", label, E,
         (long long)n, (long long)N, (long long)K, acts.size(), offs.size());
  for (bf16* p : {xs, wu, u, g0, ref0, h0, hin0}) CK(cudaFree(p));
  free_layout(L);
}

static void test_grid(const char* mode, bool big) {
  std::mt19937 rng(12345);
  const std::vector<Act> acts = all_acts();
  const std::vector<int> offs = {0, 4, 1};  // 16-byte aligned; 8-byte (4-byte ops, not 16); 2-byte (scalar)
  uint32_t seed = 100;
  const int Es[] = {1, 3, 8, 64};
  // (N, K): odd N, N % 8 != 0, N past a 128 / 256 column tile, K not a multiple of 8 / 64, and
  // N, K >= 2048 (swap AB by default)
  const int64_t shapes[][2] = {{130, 200}, {17, 13}, {7, 5}, {264, 72}, {96, 64}, {512, 256}, {2048, 2048}};
  for (auto& sh : shapes)
    for (int E : Es) {
      if (sh[0] * sh[1] >= 2048 * 2048 && E > 8) continue;  // (the big shape with few experts only)
      std::vector<int> rows(E);
      for (int e = 0; e < E; ++e) rows[e] = (rng() % 5 == 0) ? 0 : int(rng() % 301);
      if (E == 1 && rows[0] == 0) rows[0] = 129;
      if (E == 8) {  // tile edges: 0, 64, 65, 128, 129, 127 rows
        rows[0] = 0, rows[1] = 64, rows[2] = 65, rows[3] = 128, rows[4] = 129, rows[5] = 127;
      }
      test_case("grid", rows, sh[0], sh[1], acts, offs, seed += 3);
    }
  // few rows in all: n < 128 (ws: the producer's threads load A) and 128 <= n < 256 (swab: the same)
  test_case("n<128", {0, 50, 0, 70, 0}, 264, 64, acts, offs, seed += 3);
  test_case("n<256", {0, 150, 1, 70}, 2048, 2048, acts, offs, seed += 3);
  test_case("n<256", {33, 0, 190}, 136, 96, acts, offs, seed += 3);
  test_case("empty", {0, 0, 0}, 64, 64, acts, offs, seed += 3);
  // E > ~2000: the epilogues without staging tiles (store_fragments; swab's element stores)
  std::vector<int> many(2100);
  for (int& r : many) r = (rng() % 4 == 0) ? int(rng() % 140) : 0;
  test_case("E=2100", many, 256, 64, acts, {0, 1}, seed += 3);
  test_case("E=2100", many, 96, 72, acts, {0}, seed += 3);
  if (!big) return;
  // the models' shapes, n = 65536 (T = 8192, top-8); two acts, aligned
  const std::vector<Act> acts2 = {acts[0], acts[1]};
  test_case("Qwen3.5", uniform_rows(256, 65536, 777), 512, 2048, acts2, {0}, seed += 3);
  test_case("GLM-5.3-Flash", uniform_rows(288, 65536, 777), 2048, 4096, acts2, {0}, seed += 3);
  std::vector<int> rf;
  if (rows_from_file("kernels/dev/moe_gemm/rows_glm5_3_flash_dummy_T8192.txt", 288, 65536, rf))
    test_case("GLM rows file", rf, 2048, 4096, {acts[1]}, {0}, seed += 3);
  (void)mode;
}

static int run_tests() {
  CK(cudaMalloc(&g_res, 2 * sizeof(unsigned long long)));
  // the two fused kernels (default picks swab for N, K >= 2048, else ws), then the fallbacks
  const char* modes[] = {"default", "swapab=1", "swapab=0", "cpasync", "elem", "clusters"};
  for (const char* m : modes) {
    set_mode(m);
    printf("--- mode: %s ---\n", m);
    const bool big = !strcmp(m, "default") || !strcmp(m, "swapab=1") || !strcmp(m, "swapab=0") || !strcmp(m, "cpasync");
    test_grid(m, big);
  }
  set_mode("default");
  printf("%d cases\n", g_cases);
  printf(g_fail ? "%d FAILED\n" : "all tests passed\n", g_fail);
  return g_fail ? 1 : 0;
}

// ---- bench ----
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
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static void bench_model(const char* name, int E, int64_t D, int64_t I, int64_t n) {
  std::vector<int> rows = uniform_rows(E, n, 777);
  const char* rf = getenv("DZ_BENCH_ROWS");
  const bool from_file = rf && rows_from_file(rf, E, n, rows);
  Layout L = make_layout(rows);
  bf16 *xs, *wu, *g, *u, *h, *h2;
  CK(cudaMalloc(&xs, sizeof(bf16) * n * D));
  CK(cudaMalloc(&wu, sizeof(bf16) * E * I * D));
  for (bf16** p : {&g, &u, &h, &h2}) CK(cudaMalloc(p, sizeof(bf16) * n * I));
  fill(xs, n * D, 1, 1.f);
  fill(wu, E * I * D, 3, pow2_scale(D));
  fill(g, n * I, 5, 4.f);
  CK(cudaDeviceSynchronize());
  const int mn = *std::min_element(rows.begin(), rows.end()), mx = *std::max_element(rows.begin(), rows.end());
  printf("\n%s: E=%d n=%lld rows/expert %d..%d (%s), K=%lld N=%lld\n", name, E, (long long)n, mn, mx,
         from_file ? rf : "uniform", (long long)D, (long long)I);
  GluAct act;
  act.limit = 7.f;  // (GLM-5.3-Flash's experts use the clamp; the cost is the same either way)
  for (const char* m : {"default", "swapab=0", "swapab=1"}) {
    set_mode(m);
    const float t_gemm =
        time_ms([&] { dz::cuda::grouped_gemm_tc(xs, wu, L.d_off, L.d_toff, E, L.max_tiles, I, D, u, 0); });
    const float t_act = time_ms([&] { dz::cuda::silu_mul(g, u, h, n * I, act, 0); });
    const float t_unf = time_ms([&] {
      dz::cuda::grouped_gemm_tc(xs, wu, L.d_off, L.d_toff, E, L.max_tiles, I, D, u, 0);
      dz::cuda::silu_mul(g, u, h, n * I, act, 0);
    });
    const float t_fus = time_ms(
        [&] { dz::cuda::grouped_gemm_tc_glu(xs, wu, L.d_off, L.d_toff, E, L.max_tiles, I, D, g, act, h2, 0); });
    CK(cudaDeviceSynchronize());
    int64_t first = -1;
    const int64_t bad = count_ne(h, h2, n * I, &first);
    if (bad) ++g_fail;
    printf("  %-9s up GEMM %7.3f ms + silu_mul %6.3f ms | unfused (2 launches) %7.3f ms | fused %7.3f ms | "
           "unfused / fused %.3f | saved %6.3f ms | outputs %s\n",
           m, t_gemm, t_act, t_unf, t_fus, t_unf / t_fus, t_unf - t_fus, bad ? "DIFFER (FAIL)" : "bitwise equal");
  }
  set_mode("default");
  for (bf16* p : {xs, wu, g, u, h, h2}) CK(cudaFree(p));
  free_layout(L);
}

static int run_bench() {
  CK(cudaMalloc(&g_res, 2 * sizeof(unsigned long long)));
  bench_model("GLM-5.3-Flash T=8192 up", 288, 4096, 2048, 8192 * 8);
  bench_model("Qwen3.5-35B-A3B T=8192 up", 256, 2048, 512, 8192 * 8);
  bench_model("Qwen3.5-35B-A3B T=32768 up", 256, 2048, 512, 32768 * 8);
  return g_fail ? 1 : 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    return mode == "--bench" ? run_bench() : run_tests();
  } catch (const std::exception& e) {
    fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
