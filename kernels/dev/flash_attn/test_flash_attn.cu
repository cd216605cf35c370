// Standalone test + bench of flash_attention (kernels/flash_attention.cu).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/flash_attn/test_flash_attn.cu
//        kernels/flash_attention.cu kernels/flash_attention_wgmma.cu -o /tmp/fa && /tmp/fa && /tmp/fa --bench
// Test: random bf16 inputs, reference = a plain fp64 CPU loop over the same bf16-rounded values
// (causal, bottom-right aligned, GQA, varlen). Every output element is checked.
// Tolerance: |v| <= 1, so |out| <= 1. The kernel rounds the output to bf16 (<= 2^-9 relative,
// ~2e-3 absolute) and P to bf16 as the P.V operand (<= 2^-9 relative per term, at most another
// ~2e-3 in the worst case, far less on average); fp32 accumulation adds ~1e-6. So max abs error
// <= 8e-3 (2x margin over the worst case) and normalised MSE sum (o - ref)^2 / sum ref^2 <= 1e-5
// (bf16 output rounding alone gives ~1.3e-6).
// Flags: --bench (timings + fp64 spot checks of sampled rows; --nocheck skips those), --quick (a
// small subset of the test, e.g. for compute-sanitizer).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "common.cuh"
#include "core/bf16.hpp"
#include "dev/host_util.hpp"
#include "flash_attention.cuh"

using namespace dz::cuda;

namespace {

constexpr double kTolAbs = 8e-3, kTolNmse = 1e-5;


// fp64 reference of one output row (query row qrow of sequence with key rows [k0, k0 + nvis), head h).
void ref_row(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t qrow, int64_t k0, int64_t nvis, int h,
             int Hq, int Hkv, int Dk, int Dv, double scale, double* out) {
  const int g = h / (Hq / Hkv);
  std::vector<double> qd(Dk), s(std::max<int64_t>(nvis, 1));
  for (int d = 0; d < Dk; ++d) qd[d] = dz::bf16_to_f32(q[(qrow * Hq + h) * Dk + d]);
  double m = -INFINITY;
  for (int64_t j = 0; j < nvis; ++j) {
    const uint16_t* kr = k + ((k0 + j) * Hkv + g) * Dk;
    double dot = 0;
    for (int d = 0; d < Dk; ++d) dot += qd[d] * dz::bf16_to_f32(kr[d]);
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  for (int d = 0; d < Dv; ++d) out[d] = 0;
  double l = 0;
  for (int64_t j = 0; j < nvis; ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    const uint16_t* vr = v + ((k0 + j) * Hkv + g) * Dv;
    for (int d = 0; d < Dv; ++d) out[d] += p * dz::bf16_to_f32(vr[d]);
  }
  for (int d = 0; d < Dv; ++d) out[d] = l > 0 ? out[d] / l : 0;
}

struct Case {
  std::vector<int> lq, lk;
  int Hq, Hkv, Dk, Dv;
  bool unaligned = false;  // every pointer one element past a 16-byte boundary (scalar paths)
  int64_t extra_max_q = 0;  // grid larger than needed
};

struct Result {
  double max_abs = 0, nmse = 0;
  bool ok = true;
  std::string why;
};

Result run_case(const Case& c, uint64_t seed) {
  const int B = int(c.lq.size());
  std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0);
  int64_t max_q = 0;
  for (int b = 0; b < B; ++b) {
    cu_q[b + 1] = cu_q[b] + c.lq[b];
    cu_k[b + 1] = cu_k[b] + c.lk[b];
    max_q = std::max<int64_t>(max_q, c.lq[b]);
  }
  const int64_t Tq = cu_q[B], Tk = cu_k[B];
  const int64_t nq = Tq * c.Hq * c.Dk, nk = Tk * c.Hkv * c.Dk, nv = Tk * c.Hkv * c.Dv, no = Tq * c.Hq * c.Dv;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u2(-2.f, 2.f), u1(-1.f, 1.f);
  std::vector<uint16_t> hq(nq), hk(nk), hv(nv);
  for (auto& x : hq) x = dz::f32_to_bf16(u2(rng));
  for (auto& x : hk) x = dz::f32_to_bf16(u2(rng));
  for (auto& x : hv) x = dz::f32_to_bf16(u1(rng));
  const double scale = 1.5 / std::sqrt(double(c.Dk));

  const int sh = c.unaligned ? 1 : 0;  // element shift of every pointer
  constexpr int64_t kGuard = 4096;     // bf16 guard elements after the output
  uint16_t *dq, *dk, *dv, *dout;
  int32_t *dcq, *dck;
  CUDA_CHECK(cudaMalloc(&dq, 2 * (nq + 8)));
  CUDA_CHECK(cudaMalloc(&dk, 2 * (nk + 8)));
  CUDA_CHECK(cudaMalloc(&dv, 2 * (nv + 8)));
  CUDA_CHECK(cudaMalloc(&dout, 2 * (no + 8 + kGuard)));
  CUDA_CHECK(cudaMalloc(&dcq, 4 * (B + 1)));
  CUDA_CHECK(cudaMalloc(&dck, 4 * (B + 1)));
  CUDA_CHECK(cudaMemcpy(dq + sh, hq.data(), 2 * nq, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dk + sh, hk.data(), 2 * nk, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dv + sh, hv.data(), 2 * nv, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dout, 0xff, 2 * (no + 8 + kGuard)));  // 0xffff: a NaN that no write produces
  CUDA_CHECK(cudaMemcpy(dcq, cu_q.data(), 4 * (B + 1), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dck, cu_k.data(), 4 * (B + 1), cudaMemcpyHostToDevice));

  FlashAttnArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(dq + sh);
  a.k = reinterpret_cast<const __nv_bfloat16*>(dk + sh);
  a.v = reinterpret_cast<const __nv_bfloat16*>(dv + sh);
  a.out = reinterpret_cast<__nv_bfloat16*>(dout + sh);
  a.cu_q = dcq;
  a.cu_k = dck;
  a.B = B;
  a.max_q = max_q + c.extra_max_q;
  a.rows_q = Tq;
  a.rows_k = Tk;
  a.Hq = c.Hq, a.Hkv = c.Hkv, a.Dk = c.Dk, a.Dv = c.Dv;
  a.scale = float(scale);
  flash_attention(a, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> hout(no + 8 + kGuard);
  CUDA_CHECK(cudaMemcpy(hout.data(), dout, 2 * hout.size(), cudaMemcpyDeviceToHost));
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dcq), cudaFree(dck);

  Result r;
  for (int64_t i = 0; i < int64_t(hout.size()); ++i) {
    const bool inside = i >= sh && i < sh + no;
    if (!inside && hout[i] != 0xffff) {
      r.ok = false;
      r.why = "write outside the output at element " + std::to_string(i - sh);
      return r;
    }
  }
  // Reference, parallel over (row, head).
  std::vector<double> ref(no);
  std::vector<int> seq_of(Tq);
  for (int b = 0; b < B; ++b)
    for (int i = cu_q[b]; i < cu_q[b + 1]; ++i) seq_of[i] = b;
  dz::dev::parallel_each(Tq * c.Hq, [&](int64_t w) {
    const int64_t row = w / c.Hq;
    const int h = int(w % c.Hq), b = seq_of[row];
    const int64_t i = row - cu_q[b];
    const int64_t nvis = std::max<int64_t>(0, std::min<int64_t>(c.lk[b], i + 1 + (c.lk[b] - c.lq[b])));
    ref_row(hq.data(), hk.data(), hv.data(), row, cu_k[b], nvis, h, c.Hq, c.Hkv, c.Dk, c.Dv, scale,
            ref.data() + (row * c.Hq + h) * c.Dv);
  }, 8);
  double sse = 0, ssr = 0;
  for (int64_t i = 0; i < no; ++i) {
    const float x = dz::bf16_to_f32(hout[sh + i]);
    if (!std::isfinite(x)) {
      r.ok = false;
      r.why = "non-finite / unwritten output at element " + std::to_string(i);
      return r;
    }
    const double e = std::fabs(double(x) - ref[i]);
    r.max_abs = std::max(r.max_abs, e);
    sse += e * e;
    ssr += ref[i] * ref[i];
  }
  r.nmse = ssr > 0 ? sse / ssr : sse;
  if (r.max_abs > kTolAbs || r.nmse > kTolNmse) {
    r.ok = false;
    r.why = "tolerance";
  }
  return r;
}

std::string describe(const Case& c) {
  std::string s = "Dk " + std::to_string(c.Dk) + " Dv " + std::to_string(c.Dv) + " H " + std::to_string(c.Hq) + "/" +
                  std::to_string(c.Hkv) + " (Lq,Lk)=";
  for (size_t b = 0; b < c.lq.size(); ++b) s += "(" + std::to_string(c.lq[b]) + "," + std::to_string(c.lk[b]) + ")";
  if (c.unaligned) s += " unaligned";
  if (c.extra_max_q) s += " max_q+" + std::to_string(c.extra_max_q);
  return s;
}

int test(bool quick) {
  const std::vector<std::pair<int, int>> dims = {{192, 128}, {256, 256}, {128, 128}, {64, 64},
                                                 {24, 16},   {32, 16},   {32, 32},   {96, 64}};
  const std::vector<std::pair<int, int>> heads = {{4, 4}, {4, 2}, {8, 1}};
  const std::vector<int> Lqs = quick ? std::vector<int>{19, 127} : std::vector<int>{1, 3, 7, 19, 64, 127, 733};
  const std::vector<int> extras = {0, 5, 200};
  std::vector<Case> cases;
  for (auto [Dk, Dv] : dims)
    for (auto [Hq, Hkv] : heads)
      for (int B : {1, 3})
        for (int Lq : Lqs)
          for (int ex : extras) {
            if (quick && (Hq != 4 || Hkv != 2 || ex == 5 || B == 1)) continue;
            Case c;
            c.Hq = Hq, c.Hkv = Hkv, c.Dk = Dk, c.Dv = Dv;
            if (B == 1) {
              c.lq = std::vector<int>{Lq};
            } else {
              c.lq = std::vector<int>{Lq, std::max(1, Lq / 2 + 1), Lq};
            }
            for (int l : c.lq) c.lk.push_back(l + ex);
            cases.push_back(c);
          }
  // varlen with empty sequences (no queries; no queries and no keys), an oversized grid
  for (auto [Dk, Dv] : std::vector<std::pair<int, int>>{{128, 128}, {24, 16}, {256, 256}, {192, 128}}) {
    Case c;
    c.Hq = 4, c.Hkv = 2, c.Dk = Dk, c.Dv = Dv;
    c.lq = std::vector<int>{50, 0, 0, 100, 1};
    c.lk = std::vector<int>{50, 0, 30, 164, 300};
    c.extra_max_q = 200;
    cases.push_back(c);
    Case d = c;  // B = 3 with one empty sequence in the middle
    d.lq = std::vector<int>{37, 0, 129};
    d.lk = std::vector<int>{37, 0, 333};
    d.extra_max_q = 0;
    cases.push_back(d);
  }
  // dims that are not multiples of 8 / odd (scalar loads and stores), unaligned pointers
  for (auto [Dk, Dv] :
       std::vector<std::pair<int, int>>{{20, 12}, {1, 1}, {5, 7}, {130, 100}, {250, 256}, {64, 3}, {200, 40}})
    for (int Lq : {1, 19, 127})
      for (int ex : {0, 200}) {
        if (quick && Lq != 19) continue;
        Case c;
        c.Hq = 3, c.Hkv = 1, c.Dk = Dk, c.Dv = Dv;
        c.lq = std::vector<int>{Lq, Lq / 2 + 1};
        c.lk = std::vector<int>{Lq + ex, Lq / 2 + 1 + ex};
        cases.push_back(c);
      }
  for (auto [Dk, Dv] : std::vector<std::pair<int, int>>{{64, 64}, {128, 128}, {192, 128}, {256, 256}, {32, 16}}) {
    Case c;
    c.Hq = 4, c.Hkv = 2, c.Dk = Dk, c.Dv = Dv;
    c.lq = std::vector<int>{127, 19};
    c.lk = std::vector<int>{327, 19};
    c.unaligned = true;
    cases.push_back(c);
  }

  int fails = 0;
  struct Agg {
    int n = 0;
    double max_abs = 0, nmse = 0;
  };
  std::vector<std::pair<std::string, Agg>> agg;
  auto slot = [&](const Case& c) -> Agg& {
    const std::string k = std::to_string(c.Dk) + "x" + std::to_string(c.Dv);
    for (auto& [n, a] : agg)
      if (n == k) return a;
    agg.push_back({k, Agg{}});
    return agg.back().second;
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Result r = run_case(cases[i], 1234 + i);
    Agg& a = slot(cases[i]);
    a.n++;
    a.max_abs = std::max(a.max_abs, r.max_abs);
    a.nmse = std::max(a.nmse, r.nmse);
    if (!r.ok) {
      if (++fails <= 30)
        std::printf("FAIL %s: %s (max abs %.3g, nmse %.3g)\n", describe(cases[i]).c_str(), r.why.c_str(), r.max_abs,
                    r.nmse);
    }
  }
  for (auto& [n, a] : agg)
    std::printf("dims %-8s cases %4d  worst max abs err %.3e  worst nmse %.3e\n", n.c_str(), a.n, a.max_abs, a.nmse);
  std::printf("%zu cases, %d failures (tolerance max abs %.1e, nmse %.1e)\n", cases.size(), fails, kTolAbs, kTolNmse);
  return fails ? 1 : 0;
}

__global__ void fill_random(uint16_t* x, int64_t n, uint64_t seed, float amp) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.f / 16777216.f);  // [0, 1)
    x[i] = __bfloat16_as_ushort(__float2bfloat16_rn(amp * (2.f * u - 1.f)));
  }
}

int bench(bool check) {
  struct Shape {
    int Hq, Hkv, Dk, Dv;
  };
  const Shape shapes[] = {{32, 32, 128, 128}, {16, 2, 256, 256}, {32, 32, 192, 128}};
  int bad = 0;
  for (const Shape& sh : shapes)
    for (int64_t T : {int64_t(8192), int64_t(32768)}) {
      const int64_t nq = T * sh.Hq * sh.Dk, nk = T * sh.Hkv * sh.Dk, nv = T * sh.Hkv * sh.Dv, no = T * sh.Hq * sh.Dv;
      uint16_t *dq, *dk, *dv, *dout;
      int32_t* dcu;
      CUDA_CHECK(cudaMalloc(&dq, 2 * nq));
      CUDA_CHECK(cudaMalloc(&dk, 2 * nk));
      CUDA_CHECK(cudaMalloc(&dv, 2 * nv));
      CUDA_CHECK(cudaMalloc(&dout, 2 * no));
      CUDA_CHECK(cudaMalloc(&dcu, 8));
      fill_random<<<1024, 256>>>(dq, nq, 1, 2.f);
      fill_random<<<1024, 256>>>(dk, nk, 2, 2.f);
      fill_random<<<1024, 256>>>(dv, nv, 3, 1.f);
      CUDA_CHECK_LAUNCH();
      const int32_t cu[2] = {0, int32_t(T)};
      CUDA_CHECK(cudaMemcpy(dcu, cu, 8, cudaMemcpyHostToDevice));
      FlashAttnArgs a;
      a.q = reinterpret_cast<const __nv_bfloat16*>(dq);
      a.k = reinterpret_cast<const __nv_bfloat16*>(dk);
      a.v = reinterpret_cast<const __nv_bfloat16*>(dv);
      a.out = reinterpret_cast<__nv_bfloat16*>(dout);
      a.cu_q = a.cu_k = dcu;
      a.B = 1;
      a.max_q = a.rows_q = a.rows_k = T;
      a.Hq = sh.Hq, a.Hkv = sh.Hkv, a.Dk = sh.Dk, a.Dv = sh.Dv;
      const double scale = 1.5 / std::sqrt(double(sh.Dk));
      a.scale = float(scale);
      const double ms = median_ms([&] { flash_attention(a, 0); }, 5, 1);
      const double flops = double(sh.Hq) * (sh.Dk + sh.Dv) * double(T) * double(T);  // 2 * H * D * T^2 / 2
      std::printf("bench T %6lld Hq %2d Hkv %2d Dk %3d Dv %3d: %8.3f ms  %6.1f TFLOP/s\n", (long long)T, sh.Hq, sh.Hkv,
                  sh.Dk, sh.Dv, ms, flops / ms * 1e-9);
      if (!check) {
        cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dcu);
        continue;
      }
      // fp64 spot check of sampled rows, all heads
      std::vector<uint16_t> hq(nq), hk(nk), hv(nv), hout(no);
      CUDA_CHECK(cudaMemcpy(hq.data(), dq, 2 * nq, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(hk.data(), dk, 2 * nk, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(hv.data(), dv, 2 * nv, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(hout.data(), dout, 2 * no, cudaMemcpyDeviceToHost));
      const std::vector<int64_t> rows = {0,          1,       15,      16,     63,    64,   127, 128, 129, 1000,
                                         T / 2 + 37, T - 129, T - 128, T - 65, T - 2, T - 1};
      std::vector<double> ref(rows.size() * sh.Hq * sh.Dv);
      dz::dev::parallel_each(int64_t(rows.size()) * sh.Hq, [&](int64_t w) {
        const int64_t row = rows[w / sh.Hq];
        const int h = int(w % sh.Hq);
        ref_row(hq.data(), hk.data(), hv.data(), row, 0, row + 1, h, sh.Hq, sh.Hkv, sh.Dk, sh.Dv, scale,
                ref.data() + w * sh.Dv);
      }, 8);
      double max_abs = 0, sse = 0, ssr = 0;
      for (size_t ri = 0; ri < rows.size(); ++ri)
        for (int h = 0; h < sh.Hq; ++h)
          for (int d = 0; d < sh.Dv; ++d) {
            const double x = dz::bf16_to_f32(hout[(rows[ri] * sh.Hq + h) * sh.Dv + d]);
            const double y = ref[(ri * sh.Hq + h) * sh.Dv + d];
            const double e = std::isfinite(x) ? std::fabs(x - y) : INFINITY;
            max_abs = std::max(max_abs, e);
            sse += e * e;
            ssr += y * y;
          }
      const bool ok = max_abs <= kTolAbs && sse / ssr <= kTolNmse;
      bad += !ok;
      std::printf("      spot check %zu rows x %d heads: max abs %.3e nmse %.3e %s\n", rows.size(), sh.Hq, max_abs,
                  sse / ssr, ok ? "ok" : "FAIL");
      cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dcu);
    }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool do_bench = false, quick = false, check = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bench")) do_bench = true;
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--nocheck")) check = false;
  }
  try {
    return do_bench ? bench(check) : test(quick);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
