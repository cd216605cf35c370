// Recurrent decode (kernels/linear_attn_decode.cu) at `bench linear-attn`'s shape, B = 256, H = 32,
// K = V = 128, fp32 state (537 MB, read and written once a step), beside what the same bytes cost in
// a plain in-place float4 pass (x *= 1 over the state: the read + write ceiling of this GPU), with
// and without the streaming cache hints (__ldcs / __stcs). `--test`: one step from a fixed state,
// then a hash of the outputs' and the new state's bits (a change of cache hints or load order must
// leave it as it was; an arithmetic change moves it). Built by decode_run.sh.
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_util.cuh"
#include "linear_attn.cuh"

using namespace dz::cuda;
using benchrand::alloc;
using benchrand::rand_bf16;
using benchrand::rand_f32;

namespace dec {

template <bool HINT>
// x *= s with s = 1 from the host: one read and one write of each byte. A literal 1.f let nvcc drop
// the unhinted pass whole (x * 1 == x, then a store of the loaded value): 0.007 ms for 537 MB.
__global__ void pass_kernel(float4* x, size_t n4, float s) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    float4 v = HINT ? __ldcs(x + i) : x[i];
    v.x *= s, v.y *= s, v.z *= s, v.w *= s;
    if (HINT) __stcs(x + i, v);
    else x[i] = v;
  }
}

uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

}  // namespace dec

int main(int argc, char** argv) {
  const bool test = argc > 1 && std::strcmp(argv[1], "--test") == 0;
  const int B = 256, H = 32, K = 128, V = 128;
  const size_t BH = size_t(B) * H, ns = BH * K * V;
  bf16 *q = rand_bf16(BH * K, 11), *k = rand_bf16(BH * K, 12), *v = rand_bf16(BH * V, 13), *b = rand_bf16(BH, 14);
  bf16 *f = rand_bf16(BH * K, 15, -3.f, 1.f), *o = alloc<bf16>(BH * V);
  float *A_log = rand_f32(size_t(H), 16, -0.5f, 0.5f), *dtb = rand_f32(size_t(H) * K, 17, -0.1f, 0.1f);
  float* st = rand_f32(ns, 18, -0.3f, 0.3f);
  std::vector<int32_t> sh(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) sh[size_t(i)] = (i * 37) % B;  // permuted slots, as the bench
  int32_t* slot = alloc<int32_t>(size_t(B));
  CUDA_CHECK(cudaMemcpy(slot, sh.data(), sh.size() * 4, cudaMemcpyHostToDevice));
  LaDecode p;
  p.q = q, p.k = k, p.v = v, p.b = b, p.gate = {f, A_log, dtb, 0.f};
  p.HK = H, p.HV = H, p.K = K, p.V = V, p.scale = 0.088388f, p.B = B, p.slot = slot, p.o = o, p.states = st;
  if (test) {
    for (int bv : {128, 64, 32}) {  // each from the same state
      float* s0 = rand_f32(ns, 18, -0.3f, 0.3f);
      p.states = s0, p.value_block = bv;
      la_decode(p, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> ho(BH * V);
      std::vector<float> hs(ns);
      CUDA_CHECK(cudaMemcpy(ho.data(), o, ho.size() * 2, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(hs.data(), s0, ns * 4, cudaMemcpyDeviceToHost));
      std::printf("test BV=%d: outputs %016llx state %016llx\n", bv, (unsigned long long)dec::fnv(ho.data(), ho.size() * 2),
                  (unsigned long long)dec::fnv(hs.data(), ns * 4));
      cudaFree(s0);
    }
    return 0;
  }
  const double bytes = 2.0 * ns * 4;  // read + write
  for (int bv : {128, 64, 32}) {
    p.value_block = bv;
    const double ms = median_ms([&] { la_decode(p, nullptr); }, 20, 3);
    std::printf("decode B=%d H=%d BV=%d: %.4f ms, %.0f GB/s on state bytes\n", B, H, bv, ms, bytes / (ms * 1e-3) / 1e9);
  }
  const int blocks = 4 * sm_count();
  for (int hint = 0; hint < 2; ++hint) {
    const double ms = median_ms(
        [&] {
          if (hint) dec::pass_kernel<true><<<blocks, 512>>>(reinterpret_cast<float4*>(st), ns / 4, 1.f);
          else dec::pass_kernel<false><<<blocks, 512>>>(reinterpret_cast<float4*>(st), ns / 4, 1.f);
        },
        20, 3);
    std::printf("in-place float4 pass over the same bytes%s: %.4f ms, %.0f GB/s\n", hint ? " (__ldcs / __stcs)" : "", ms,
                bytes / (ms * 1e-3) / 1e9);
  }
  return 0;
}
