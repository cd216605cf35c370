// The up expert GEMM with the activation in its epilogue (grouped_gemm_gin_tc) against what it
// replaces: grouped_gemm_tc into g and into u, then silu_mul(g, u). Both read u as bf16 and run the
// same glu_pass, so the outputs must be bitwise equal, on every kernel the GEMMs can take (the
// kernel choice is forced through the DZ_MOE_GEMM_* switches, read at each call) and in place (h = g,
// as the CUDA backend calls it). How both compare with the CPU reference is the MoE backend-op
// case's business (test_backend_ops_gpu.cpp).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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

std::vector<float> rnd(size_t n, unsigned seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST_CASE("moe gemm gpu: the up GEMM with the activation in its epilogue equals two GEMMs and the pass, bitwise",
          "[gpu]") {
  struct Shape {
    const char* name;
    std::vector<int32_t> rows;  // per expert
    int64_t N, K;
  };
  std::vector<Shape> shapes = {
      // tails of 1 / 63 / 65 rows, an expert past 256 rows (two swap-AB chunks), empty experts
      {"uneven", {0, 1, 63, 64, 65, 300, 17, 0, 130}, 256, 128},
      // n < 128 / 256 (the producers' threads load the tokens), K not a multiple of 64
      {"few rows", {3, 0, 50, 20}, 256, 72},
      // N not a multiple of 8 or of the column tiles (element stores, columns dropped)
      {"odd width", {5, 70, 0, 140}, 36, 64},
  };
  {  // more experts than the epilogue staging tiles fit beside (E > ~2000): the unstaged epilogues
    std::vector<int32_t> r(2100, 0);
    for (size_t e = 0; e < r.size(); e += 7) r[e] = int32_t(1 + e % 90);
    shapes.push_back({"2100 experts", r, 128, 64});
  }
  const dz::GluAct acts[] = {{0.f, 0.f, 0.f}, {0.05f, 0.f, 0.f}, {0.f, 0.4f, 0.6f}};
  const char* act_names[] = {"SwiGLU", "SwiGLU clamp", "SiTU"};
  struct Kernel {
    const char* name;
    const char *swab, *clusters, *loads;
  };
  const Kernel kernels[] = {{"swap AB", "1", nullptr, nullptr},
                            {"warp specialised", "0", nullptr, nullptr},
                            {"2-CTA clusters", "0", "1", nullptr},
                            {"cp.async", "0", nullptr, "cpasync"},
                            {"element loads", "0", nullptr, "elem"}};
  for (const Shape& sh : shapes) {
    const int E = int(sh.rows.size());
    std::vector<int32_t> off(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + sh.rows[size_t(e)];
    const int64_t n = off[size_t(E)], N = sh.N, K = sh.K, max_tiles = n / 64 + E + 1;
    Dev<int32_t> offsets(off);
    Dev<bf16> xs(to_bf16(rnd(size_t(n * K), 1, 1.f))), wg(to_bf16(rnd(size_t(E * N * K), 2, 0.15f))),
        wu(to_bf16(rnd(size_t(E * N * K), 3, 0.15f)));
    Dev<bf16> g(size_t(n * N)), u(size_t(n * N)), h(size_t(n * N));
    for (int ai = 0; ai < 3; ++ai)
      for (const Kernel& kn : kernels) {
        EnvSwitch s1("DZ_MOE_GEMM_SWAPAB", kn.swab), s2("DZ_MOE_GEMM_CLUSTERS", kn.clusters),
            s3("DZ_MOE_GEMM_LOADS", kn.loads);
        INFO(sh.name << ", " << act_names[ai] << ", " << kn.name);
        const dz::GluAct& act = acts[ai];
        dz::cuda::grouped_gemm_tc(xs.p, wg.p, offsets.p, nullptr, E, max_tiles, N, K, g.p, nullptr);
        dz::cuda::grouped_gemm_tc(xs.p, wu.p, offsets.p, nullptr, E, max_tiles, N, K, u.p, nullptr);
        dz::cuda::silu_mul(g.p, u.p, h.p, n * N, act, nullptr);
        const auto ref = h.down(), gate = g.down();
        // into another buffer
        h.zero();
        dz::cuda::grouped_gemm_gin_tc(xs.p, wu.p, offsets.p, nullptr, E, max_tiles, N, K, g.p, act, h.p, nullptr);
        const auto other = h.down();
        // in place over the gate's output, as the CUDA backend calls it
        dz::cuda::grouped_gemm_gin_tc(xs.p, wu.p, offsets.p, nullptr, E, max_tiles, N, K, g.p, act, g.p, nullptr);
        const auto inplace = g.down();
        CUDA_CHECK(cudaDeviceSynchronize());
        size_t nz = 0, diff_other = 0, diff_inplace = 0, moved = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          uint16_t r, o, p, gb;
          std::memcpy(&r, static_cast<const void*>(&ref[i]), 2);
          std::memcpy(&o, static_cast<const void*>(&other[i]), 2);
          std::memcpy(&p, static_cast<const void*>(&inplace[i]), 2);
          std::memcpy(&gb, static_cast<const void*>(&gate[i]), 2);
          nz += (r & 0x7fff) != 0;
          diff_other += r != o;
          diff_inplace += r != p;
          moved += r != gb;
        }
        CHECK(diff_other == 0);
        CHECK(diff_inplace == 0);
        // the check means something: outputs mostly non-zero, and not the gate's values
        CHECK(nz > ref.size() * 9 / 10);
        CHECK(moved > ref.size() * 9 / 10);
      }
  }
}
