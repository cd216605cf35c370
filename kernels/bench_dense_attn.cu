#include "bench_dense_attn.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "common.cuh"
#include "flash_attention.cuh"

namespace dz::cuda {

using namespace benchrand;

int bench_dense_attn(const std::string& json_out) {
  struct Shape {
    const char* what;
    int Hq, Hkv, Dk, Dv;
  };
  // DESIGN §7 / issue 12: heads 32 x 128 (MHA) and 16 x 256 with 2 KV heads (GQA), and MLA without
  // an indexer as the prefill runs it (Kimi-Linear: 32 heads, q.k over 128 + 64 rope dims, v 128).
  const Shape shapes[] = {{"mha", 32, 32, 128, 128}, {"gqa", 16, 2, 256, 256}, {"mla", 32, 32, 192, 128}};
  // DZ_BENCH_ONLY=<substring> runs only the cases whose name contains it (for profilers).
  const char* only = std::getenv("DZ_BENCH_ONLY");
  std::vector<std::string> res;
  for (const Shape& sh : shapes)
    for (int64_t T : {int64_t(8192), int64_t(32768)}) {
      char name[64];
      std::snprintf(name, sizeof name, "dense_causal_%s_T%lld", sh.what, (long long)T);
      if (only && std::string(name).find(only) == std::string::npos) continue;
      auto* q = rand_bf16(size_t(T) * sh.Hq * sh.Dk, 1);
      auto* k = rand_bf16(size_t(T) * sh.Hkv * sh.Dk, 2);
      auto* v = rand_bf16(size_t(T) * sh.Hkv * sh.Dv, 3);
      auto* o = alloc<__nv_bfloat16>(size_t(T) * sh.Hq * sh.Dv);
      auto* cu = alloc<int32_t>(2);
      const int32_t hcu[2] = {0, int32_t(T)};
      CUDA_CHECK(cudaMemcpy(cu, hcu, sizeof hcu, cudaMemcpyHostToDevice));
      FlashAttnArgs a;
      a.q = q, a.k = k, a.v = v, a.out = o;
      a.cu_q = a.cu_k = cu;
      a.B = 1;
      a.max_q = a.rows_q = a.rows_k = T;
      a.Hq = sh.Hq, a.Hkv = sh.Hkv, a.Dk = sh.Dk, a.Dv = sh.Dv;
      a.scale = float(1.0 / std::sqrt(double(sh.Dk)));
      const double ms = median_ms([&] { flash_attention(a, nullptr); }, 5, 1);
      // causal: half of the T x T scores, 2 FLOP a multiply-add in q.k and in p.v
      const double flop = double(sh.Hq) * (sh.Dk + sh.Dv) * double(T) * double(T);
      const double tflops = flop / ms * 1e-9;
      std::printf("%-28s Hq %2d Hkv %2d Dk %3d Dv %3d: %8.3f ms  %6.1f TFLOP/s\n", name, sh.Hq, sh.Hkv, sh.Dk, sh.Dv, ms,
                  tflops);
      std::fflush(stdout);
      char row[384];
      std::snprintf(row, sizeof row,
                    "{\"name\": \"%s\", \"impl\": \"dayzero\", \"op\": \"dense_causal\", \"T\": %lld, \"Hq\": %d, "
                    "\"Hkv\": %d, \"Dk\": %d, \"Dv\": %d, \"ms\": %.4f, \"tflops\": %.1f}",
                    name, (long long)T, sh.Hq, sh.Hkv, sh.Dk, sh.Dv, ms, tflops);
      res.push_back(row);
      for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)cu}) cudaFree(p);
    }
  CUDA_CHECK(cudaDeviceSynchronize());
  return write_bench_report("dense-attn", res, json_out, false);
}

}  // namespace dz::cuda
