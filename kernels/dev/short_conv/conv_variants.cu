// Short-conv prefill variants against production's conv_prefill8_kernel (kernels/short_conv.cu),
// outputs compared bitwise (same products, same order), then timed at GLM-5.3-Flash's KDA shape.
// Why: at 482a8d3 the three q|k|v convs of a GLM-5.3-Flash forward (C = 24576, T = 8192) took
// 1.38 ms, 0.46 ms each for 0.81 GB read + written (~1.75 TB/s, the device copy runs ~4.3 TB/s).
// Production keeps 4 rows of 16-byte loads in flight per thread at 2 CTAs an SM (~32 KiB an SM,
// about what Little's law asks at ~1 us latency, with compute phases between); the variants put
// more bytes in flight:
//   reg<ROWS, PF, MINB>: production's kernel with ROWS rows per CTA, PF rows per prefetch group,
//                        at least MINB CTAs an SM (the register cap that follows);
//   smem<ROWS, MINB>:          every input row of the CTA (ROWS + W - 1) issued at once by cp.async into
//                        the thread's own 16-byte slots of shared memory, one commit group per
//                        4 rows, each row computed as soon as its group has landed.
// build + run: bash kernels/dev/short_conv/run.sh   (BUILD_ONLY=1 builds only, no GPU needed)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common.cuh"  // CUDA_CHECK
#include "core/bf16.hpp"
#include "linear_attn_common.cuh"
#include "short_conv.cuh"

using bf16 = __nv_bfloat16;
using dz::cuda::ConvOut;


namespace {

constexpr int NT = 256;
using dz::cuda::la::bf;
using dz::cuda::la::silu;

struct Bf8 {
  uint4 u;
  __device__ float operator[](int i) const {
    const uint32_t w = i < 2 ? u.x : i < 4 ? u.y : i < 6 ? u.z : u.w;
    return __uint_as_float(i & 1 ? w & 0xffff0000u : w << 16);
  }
};
__device__ __forceinline__ Bf8 ld8(const bf16* p) { return Bf8{*reinterpret_cast<const uint4*>(p)}; }
__device__ __forceinline__ bf16* out_col(const ConvOut& o, int c, int64_t& ld) {
  bf16* y = o.y[0];
  int c0 = 0, c1 = o.c0[1];
#pragma unroll
  for (int s = 1; s < ConvOut::kMax; ++s)
    if (s < o.n && c >= o.c0[s]) y = o.y[s], c0 = o.c0[s], c1 = o.c0[s + 1];
  ld = c1 - c0;
  return y + (c - c0);
}

// The 8 outputs of one row from the P history vectors and the current one (production's order).
template <int W>
__device__ __forceinline__ uint4 conv8(const uint32_t (&wb)[W][4], const float (&b)[8], const Bf8* h, const Bf8& cur) {
  constexpr int P = W - 1;
  auto wt = [&](int j, int i) {
    const uint32_t v = wb[j][i >> 1];
    return __uint_as_float(i & 1 ? v & 0xffff0000u : v << 16);
  };
  uint4 o;
  bf16* oe = reinterpret_cast<bf16*>(&o);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float acc = b[i];
#pragma unroll
    for (int j = 0; j < P; ++j) acc += wt(j, i) * h[j][i];
    acc += wt(P, i) * cur[i];
    oe[i] = __float2bfloat16(silu(acc));
  }
  return o;
}

template <int W>
__device__ __forceinline__ void load_taps(const bf16* w, const bf16* bias, int c, uint32_t (&wb)[W][4], float (&b)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = bias ? bf(bias[c + i]) : 0.f;
#pragma unroll
  for (int j = 0; j < W; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t lo = __bfloat16_as_ushort(w[int64_t(c + 2 * q) * W + j]);
      const uint32_t hi = __bfloat16_as_ushort(w[int64_t(c + 2 * q + 1) * W + j]);
      wb[j][q] = lo | (hi << 16);
    }
}

__device__ __forceinline__ int seq_of(const int32_t* cu, int N, int64_t t) {
  int lo = 0, hi = N - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// reg<ROWS, PF, MINB>: production's conv_prefill8_kernel with its row block and prefetch depth as
// parameters (ROWS = 32, PF = 4, MINB = 1 is production).
template <int W, int ROWS, int PF, int MINB>
__global__ void __launch_bounds__(NT, MINB) conv_reg(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                     const bf16* __restrict__ bias, const int32_t* __restrict__ cu,
                                                     int N, int64_t T, int C, const bf16* __restrict__ state,
                                                     ConvOut out) {
  constexpr int P = W - 1;
  static_assert(ROWS % PF == 0, "whole prefetch groups");
  const int c = (blockIdx.x * NT + threadIdx.x) * 8;
  if (c >= C) return;
  const int64_t t0 = int64_t(blockIdx.y) * ROWS;
  if (t0 >= T) return;
  int64_t ld;
  bf16* yc = out_col(out, c, ld);
  uint32_t wb[W][4];
  float b[8];
  load_taps<W>(w, bias, c, wb, b);
  int lo = seq_of(cu, N, t0);
  int64_t bos = cu[lo], eos = cu[lo + 1];
  Bf8 h[P > 0 ? P : 1];
  auto history = [&](int64_t t) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t s = t - P + j;
      if (s >= bos)
        h[j] = ld8(x + s * C + c);
      else if (state)
        h[j] = ld8(state + (int64_t(lo) * P + P + (s - bos)) * C + c);
      else
        h[j].u = make_uint4(0u, 0u, 0u, 0u);
    }
  };
  history(t0);
  Bf8 cur[PF], nxt[PF];
  auto load_group = [&](int r0, Bf8* g) {
#pragma unroll
    for (int k = 0; k < PF; ++k)
      if (t0 + r0 + k < T) g[k] = ld8(x + (t0 + r0 + k) * C + c);
  };
  load_group(0, cur);
#pragma unroll 1
  for (int r0 = 0; r0 < ROWS; r0 += PF) {
    if (r0 + PF < ROWS) load_group(r0 + PF, nxt);
#pragma unroll
    for (int k = 0; k < PF; ++k) {
      const int64_t t = t0 + r0 + k;
      if (t >= T) return;
      if (t >= eos) {
        while (lo + 1 < N && cu[lo + 1] <= t) ++lo;
        bos = cu[lo], eos = cu[lo + 1];
        history(t);
      }
      *reinterpret_cast<uint4*>(yc + t * ld) = conv8<W>(wb, b, h, cur[k]);
#pragma unroll
      for (int j = 0; j + 1 < P; ++j) h[j] = h[j + 1];
      if (P > 0) h[P - 1] = cur[k];
    }
#pragma unroll
    for (int k = 0; k < PF; ++k) cur[k] = nxt[k];
  }
}

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// smem<ROWS, MINB>: input rows t0 - P .. t0 + ROWS - 1 (those that exist) to shared memory by cp.async,
// slot [r][thread] (16 bytes, a thread reads only what it copied: no barrier), commit groups: the P
// halo rows with the first 4 rows, then 4 rows each. Row t reads tap s from its slot when s is in
// its sequence, else the state row (or zero) as production does.
constexpr int kG = 4;  // rows per commit group
template <int W, int ROWS, int MINB>
__global__ void __launch_bounds__(NT, MINB) conv_smem(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                const bf16* __restrict__ bias, const int32_t* __restrict__ cu, int N,
                                                int64_t T, int C, const bf16* __restrict__ state, ConvOut out) {
  constexpr int P = W - 1, NG = ROWS / kG;
  static_assert(ROWS % kG == 0, "whole groups");
  extern __shared__ __align__(16) uint4 sm[];  // [R][NT]
  const int c = (blockIdx.x * NT + threadIdx.x) * 8;
  const int64_t t0 = int64_t(blockIdx.y) * ROWS;
  if (c >= C || t0 >= T) return;
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(sm)) + threadIdx.x * 16u;
  // group 0: halo + rows 0 .. kG - 1; group g: rows g·kG .. + kG - 1 (slot r = row - (t0 - P))
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    const int r_lo = g == 0 ? 0 : P + g * kG, r_hi = P + (g + 1) * kG;
#pragma unroll
    for (int r = r_lo; r < r_hi; ++r) {
      const int64_t s = t0 - P + r;
      if (s >= 0 && s < T) cp16(sbase + uint32_t(r) * NT * 16u, x + s * C + c);
    }
    cp_commit();
  }
  int64_t ld;
  bf16* yc = out_col(out, c, ld);
  uint32_t wb[W][4];
  float b[8];
  load_taps<W>(w, bias, c, wb, b);
  int lo = seq_of(cu, N, t0);
  int64_t bos = cu[lo], eos = cu[lo + 1];
  auto slot = [&](int64_t s) { return Bf8{sm[size_t(s - (t0 - P)) * NT + threadIdx.x]}; };
  auto tap = [&](int64_t s) {  // input row s of row t's sequence (s < t), from its state before bos
    if (s >= bos) return slot(s);
    if (state) return ld8(state + (int64_t(lo) * P + P + (s - bos)) * C + c);
    Bf8 z;
    z.u = make_uint4(0u, 0u, 0u, 0u);
    return z;
  };
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    // wait until group g has landed: at most NG - 1 - g groups still pending
    switch (NG - 1 - g) {
#define DZ_W(n) \
  case n: cp_wait<n>(); break;
      DZ_W(0) DZ_W(1) DZ_W(2) DZ_W(3) DZ_W(4) DZ_W(5) DZ_W(6) DZ_W(7)
#undef DZ_W
      default: cp_wait<0>();
    }
#pragma unroll
    for (int k = 0; k < kG; ++k) {
      const int64_t t = t0 + g * kG + k;
      if (t >= T) return;
      if (t >= eos) {
        while (lo + 1 < N && cu[lo + 1] <= t) ++lo;
        bos = cu[lo], eos = cu[lo + 1];
      }
      Bf8 h[P > 0 ? P : 1];
#pragma unroll
      for (int j = 0; j < P; ++j) h[j] = tap(t - P + j);
      *reinterpret_cast<uint4*>(yc + t * ld) = conv8<W>(wb, b, h, slot(t));
    }
  }
}

struct Case {
  int64_t T;
  int C, W, N;
  bool bias, state, split;
};

struct Bufs {
  bf16 *x, *w, *bias, *state, *y;
  int32_t* cu;
  ConvOut out;
};

using Launch = void (*)(const Bufs&, const Case&, cudaStream_t);

template <int W, int ROWS, int PF, int MINB>
void launch_reg(const Bufs& b, const Case& k, cudaStream_t st) {
  const dim3 grid(unsigned((k.C / 8 + NT - 1) / NT), unsigned((k.T + ROWS - 1) / ROWS));
  conv_reg<W, ROWS, PF, MINB><<<grid, NT, 0, st>>>(b.x, b.w, b.bias, b.cu, k.N, k.T, k.C, b.state, b.out);
}
template <int W, int ROWS, int MINB>
void launch_smem(const Bufs& b, const Case& k, cudaStream_t st) {
  const size_t sm = size_t(ROWS + W - 1) * NT * 16;
  static bool set = false;  // (harness only)
  if (!set) {
    CUDA_CHECK(cudaFuncSetAttribute(conv_smem<W, ROWS, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm)));
    set = true;
  }
  const dim3 grid(unsigned((k.C / 8 + NT - 1) / NT), unsigned((k.T + ROWS - 1) / ROWS));
  conv_smem<W, ROWS, MINB><<<grid, NT, sm, st>>>(b.x, b.w, b.bias, b.cu, k.N, k.T, k.C, b.state, b.out);
}
void launch_prod(const Bufs& b, const Case& k, cudaStream_t st) {
  // production without its state update (the variants compute outputs only): state read, not written
  dz::cuda::short_conv_prefill(b.x, b.w, b.bias, b.cu, k.N, k.T, k.C, k.W, nullptr, b.out, st);
}

struct Variant {
  std::string name;
  Launch f;
};

// W = 4 only (every KDA / GDN checkpoint dayzero loads has linear_conv_kernel_dim 4).
std::vector<Variant> variants() {
  return {
      {"reg<32,4,1> (= production)", launch_reg<4, 32, 4, 1>},
      {"reg<32,4,2>", launch_reg<4, 32, 4, 2>},
      {"reg<32,8,1>", launch_reg<4, 32, 8, 1>},
      {"reg<32,8,2>", launch_reg<4, 32, 8, 2>},
      {"reg<64,8,2>", launch_reg<4, 64, 8, 2>},
      {"reg<16,16,1>", launch_reg<4, 16, 16, 1>},
      {"reg<32,4,3>", launch_reg<4, 32, 4, 3>},
      {"smem<16,2>", launch_smem<4, 16, 2>},
      {"smem<32,1>", launch_smem<4, 32, 1>},
      {"smem<12,3>", launch_smem<4, 12, 3>},
      {"smem<8,4>", launch_smem<4, 8, 4>},
  };
}


}  // namespace

int main(int argc, char** argv) {
  const bool bench = argc > 1 && std::string(argv[1]) == "--bench";
  std::vector<Case> cases = {
      {8192, 24576, 4, 1, false, false, true},  // GLM-5.3-Flash q|k|v, fresh document (the bench's call)
      {8192, 24576, 4, 1, true, true, true},
      {8192, 8192, 4, 3, true, true, false},     // varlen, three documents with states
      {37, 1000, 4, 5, true, true, false},       // ragged: C not a multiple of 2048, short documents
      {4099, 2056, 4, 7, false, true, true},
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  int fails = 0;
  const auto vs = variants();
  for (const Case& k : cases) {
    if (bench && k.T < 8192) continue;
    const int P = k.W - 1;
    std::vector<uint16_t> hx(size_t(k.T * k.C)), hw(size_t(k.C) * k.W), hb(size_t(k.C)), hs(size_t(k.N) * P * k.C);
    for (auto& v : hx) v = dz::f32_to_bf16(nd(rng));
    for (auto& v : hw) v = dz::f32_to_bf16(0.5f * nd(rng));
    for (auto& v : hb) v = dz::f32_to_bf16(0.1f * nd(rng));
    for (auto& v : hs) v = dz::f32_to_bf16(nd(rng));
    std::vector<int32_t> cu(size_t(k.N) + 1, 0);  // uneven documents (one may be empty)
    for (int n = 1; n < k.N; ++n) cu[size_t(n)] = int32_t(std::min<int64_t>(k.T, k.T * n * n / (k.N * k.N) + n));
    cu[size_t(k.N)] = int32_t(k.T);
    std::sort(cu.begin(), cu.end());
    Bufs b{};
    CUDA_CHECK(cudaMalloc(&b.x, hx.size() * 2));
    CUDA_CHECK(cudaMalloc(&b.w, hw.size() * 2));
    CUDA_CHECK(cudaMalloc(&b.bias, hb.size() * 2));
    CUDA_CHECK(cudaMalloc(&b.state, std::max<size_t>(hs.size(), 1) * 2));
    CUDA_CHECK(cudaMalloc(&b.cu, cu.size() * 4));
    CUDA_CHECK(cudaMalloc(&b.y, hx.size() * 2));
    CUDA_CHECK(cudaMemcpy(b.x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.bias, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    if (!hs.empty()) CUDA_CHECK(cudaMemcpy(b.state, hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.cu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
    bf16 *bias_keep = b.bias, *st_keep = b.state;
    if (!k.bias) b.bias = nullptr;
    if (!k.state) b.state = nullptr;
    // outputs: three column blocks (q | k | v) when split and C % 24 == 0, else one
    const int nb = k.split && k.C % 24 == 0 ? 3 : 1;
    b.out.n = nb;
    for (int s = 0; s < nb; ++s) {
      b.out.c0[s] = s * (k.C / nb);
      b.out.y[s] = b.y + size_t(k.T) * (k.C / nb) * s;
    }
    b.out.c0[nb] = k.C;
    std::vector<uint16_t> ref(hx.size()), got(hx.size());
    CUDA_CHECK(cudaMemset(b.y, 0xff, hx.size() * 2));
    launch_prod(b, k, st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaMemcpy(ref.data(), b.y, ref.size() * 2, cudaMemcpyDeviceToHost));
    std::printf("T %lld C %d W %d N %d bias %d state %d blocks %d\n", (long long)k.T, k.C, k.W, k.N, k.bias, k.state, nb);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    const double bytes = 2.0 * 2.0 * double(k.T) * k.C;  // x read once, y written once
    for (const Variant& v : vs) {
      CUDA_CHECK(cudaMemset(b.y, 0xff, hx.size() * 2));
      v.f(b, k, st);
      CUDA_CHECK(cudaGetLastError());
      CUDA_CHECK(cudaStreamSynchronize(st));
      CUDA_CHECK(cudaMemcpy(got.data(), b.y, got.size() * 2, cudaMemcpyDeviceToHost));
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != ref[i];
      fails += bad != 0;
      std::string timing;
      if (bench) {
        std::vector<float> ms;
        for (int r = 0; r < 3; ++r) v.f(b, k, st);
        for (int r = 0; r < 50; ++r) {
          CUDA_CHECK(cudaEventRecord(e0, st));
          v.f(b, k, st);
          CUDA_CHECK(cudaEventRecord(e1, st));
          CUDA_CHECK(cudaEventSynchronize(e1));
          float m;
          CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
          ms.push_back(m);
        }
        std::sort(ms.begin(), ms.end());
        char buf[128];
        std::snprintf(buf, sizeof buf, "  median %.4f ms  %.2f TB/s (min %.4f)", ms[25], bytes / (ms[25] * 1e-3) / 1e12,
                      ms[0]);
        timing = buf;
      }
      std::printf("  %-28s %s%s\n", v.name.c_str(), bad ? ("FAIL " + std::to_string(bad) + " outputs differ").c_str() : "bitwise equal",
                  timing.c_str());
    }
    CUDA_CHECK(cudaFree(b.x));
    CUDA_CHECK(cudaFree(b.w));
    CUDA_CHECK(cudaFree(bias_keep));
    CUDA_CHECK(cudaFree(st_keep));
    CUDA_CHECK(cudaFree(b.cu));
    CUDA_CHECK(cudaFree(b.y));
  }
  std::printf(fails ? "FAILED: %d variant(s) differ\n" : "all variants bitwise equal to production\n", fails);
  return fails ? 1 : 0;
}
