// GPU RMSNorm vs the CPU reference (run on the GPU machine: ctest -L gpu).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common.cuh"
#include "core/bf16.hpp"
#include "ops/norm.hpp"
#include "rmsnorm.cuh"

TEST_CASE("gpu rmsnorm equals the CPU reference on bf16-rounded inputs", "[gpu]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int64_t D : {1, 7, 64, 733, 4096}) {
    for (int64_t rows : {1, 3, 19}) {
      for (bool zc : {false, true}) {
        std::vector<uint16_t> xb(static_cast<size_t>(rows * D)), wb(static_cast<size_t>(D));
        std::vector<float> x(xb.size()), w(wb.size());
        for (size_t i = 0; i < xb.size(); ++i) x[i] = dz::bf16_to_f32(xb[i] = dz::f32_to_bf16(nd(rng)));
        for (size_t i = 0; i < wb.size(); ++i) w[i] = dz::bf16_to_f32(wb[i] = dz::f32_to_bf16(nd(rng)));
        std::vector<float> ref(x.size());
        dz::rmsnorm(x.data(), w.data(), ref.data(), rows, D, 1e-6f, zc);
        __nv_bfloat16 *dx, *dw, *dy;
        CUDA_CHECK(cudaMalloc(&dx, xb.size() * 2));
        CUDA_CHECK(cudaMalloc(&dw, wb.size() * 2));
        CUDA_CHECK(cudaMalloc(&dy, xb.size() * 2));
        CUDA_CHECK(cudaMemset(dy, 0xff, xb.size() * 2));  // poison: every element must be written
        CUDA_CHECK(cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dw, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice));
        dz::cuda::rmsnorm_bf16(dx, dw, dy, rows, D, 1e-6f, zc, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> yb(xb.size());
        CUDA_CHECK(cudaMemcpy(yb.data(), dy, yb.size() * 2, cudaMemcpyDeviceToHost));
        double max_rel = 0;
        for (size_t i = 0; i < yb.size(); ++i) {
          float y = dz::bf16_to_f32(yb[i]);
          REQUIRE(std::isfinite(y));
          max_rel = std::max(max_rel, double(std::fabs(y - ref[i])) / (std::fabs(ref[i]) + 1e-3));
        }
        std::printf("rmsnorm D=%lld rows=%lld zc=%d: max rel err %.3g\n", (long long)D, (long long)rows, int(zc),
                    max_rel);
        // The output is rounded to bf16 (8 bits of mantissa): relative error <= 2^-8 plus fp32 noise.
        CHECK(max_rel < 4.0e-3);
        cudaFree(dx);
        cudaFree(dw);
        cudaFree(dy);
      }
    }
  }
}
