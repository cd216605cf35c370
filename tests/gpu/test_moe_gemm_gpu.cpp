// The token rows gathered by the expert GEMMs' loaders (grouped_gemm_tc with arow = the dispatch's
// perm) against what they replace: gather_rows, then the GEMM on the gathered copy. The products
// read the same bf16 values in the same order, so the outputs must be bitwise equal, on every kernel
// the GEMMs can take (forced in turn through the DZ_MOE_GEMM_* switches, read at each call; the swap-AB
// one never gathers, so with its switch on the gathering call takes the warp-specialised one). How the
// GEMMs compare with the CPU reference is the MoE backend-op case's business
// (test_backend_ops_gpu.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend_compare.hpp"
#include "backend_ops.cuh"
#include "gpu_fixtures.hpp"
#include "moe_gemm.cuh"

using namespace dz::gputest;
using bf16 = __nv_bfloat16;

namespace {

// Sets an environment switch for the scope (unset: nullptr), restoring it after.
struct EnvSwitch {
  std::string name, old;
  bool had;
  EnvSwitch(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v)
      setenv(n, v, 1);
    else
      unsetenv(n);
  }
  ~EnvSwitch() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

}  // namespace

TEST_CASE("moe gemm gpu: token rows gathered by the expert GEMMs' loaders equal gather_rows and the GEMM, bitwise",
          "[gpu]") {
  struct Shape {
    const char* name;
    std::vector<int32_t> rows;  // per expert
    int64_t T, top_k, N, K;
  };
  std::vector<Shape> shapes = {
      // tails of 1 / 63 / 65 rows, an expert past 256 rows (two swap-AB chunks), empty experts
      {"uneven", {0, 1, 63, 64, 65, 300, 17, 0, 130}, 160, 4, 256, 128},
      {"few rows", {3, 0, 50, 20}, 40, 2, 256, 72},  // n < 128 / 256; K not a multiple of 64
      {"odd width", {5, 70, 0, 140}, 72, 3, 36, 64},  // N not a multiple of 8 or of the column tiles
      {"unaligned K", {9, 40, 0, 31}, 40, 2, 64, 60},  // K % 8 != 0: the element loads
  };
  {  // more experts than the epilogue staging tiles fit beside (E > ~2000)
    std::vector<int32_t> r(2100, 0);
    int64_t n = 0;
    for (size_t e = 0; e < r.size(); e += 7) n += (r[e] = int32_t(1 + e % 90));
    shapes.push_back({"2100 experts", r, (n + 7) / 8, 8, 128, 64});
  }
  struct Kernel {
    const char* name;
    const char *swab, *clusters, *loads;
  };
  const Kernel kernels[] = {{"swap AB switch on", "1", nullptr, nullptr},
                            {"warp specialised", "0", nullptr, nullptr},
                            {"2-CTA clusters", "0", "1", nullptr},
                            {"cp.async", "0", nullptr, "cpasync"},
                            {"element loads", "0", nullptr, "elem"}};
  for (const Shape& sh : shapes) {
    const int E = int(sh.rows.size());
    std::vector<int32_t> off(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + sh.rows[size_t(e)];
    const int64_t n = off[size_t(E)], N = sh.N, K = sh.K, T = sh.T, k = sh.top_k, max_tiles = n / 64 + E + 1;
    REQUIRE(n <= T * k);
    // the dispatch's perm: n distinct assignments t * k + j, shuffled
    std::vector<int32_t> perm(static_cast<size_t>(T * k));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    perm.resize(size_t(n));
    Dev<int32_t> offsets(off), arow(perm);
    Dev<bf16> x(to_bf16(rnd(size_t(T * K), 1, 1.f))), w(to_bf16(rnd(size_t(E * N * K), 2, 0.15f)));
    Dev<bf16> xs(size_t(n * K)), y(size_t(n * N));
    for (const Kernel& kn : kernels) {
      EnvSwitch s1("DZ_MOE_GEMM_SWAPAB", kn.swab), s2("DZ_MOE_GEMM_CLUSTERS", kn.clusters),
          s3("DZ_MOE_GEMM_LOADS", kn.loads);
      INFO(sh.name << ", " << kn.name);
      // the swap-AB kernel does not gather (its shapes are gathered beforehand): the switch that
      // forces it must say so, and the gathering call then takes the warp-specialised kernel
      CHECK(dz::cuda::grouped_gemm_gathers_rows(N, K) == (kn.swab[0] == '0'));
      dz::cuda::gather_rows(x.p, arow.p, n, int(k), K, xs.p, nullptr);
      dz::cuda::grouped_gemm_tc(xs.p, w.p, offsets.p, nullptr, E, max_tiles, N, K, y.p, nullptr);
      const auto ref = y.down();
      y.zero();
      dz::cuda::grouped_gemm_tc(x.p, w.p, offsets.p, nullptr, E, max_tiles, N, K, y.p, nullptr, arow.p, int(k));
      const auto got = y.down();
      CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(bf16)) == 0);
      size_t nz = 0;
      for (const bf16& v : ref) nz += bf(v) != 0.f;
      CHECK(nz > ref.size() * 9 / 10);  // the rows were computed, not left zero
    }
  }
}
