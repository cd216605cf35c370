// Shared by tests/gpu/test_linear_attn_gpu.cpp and kernels/dev/linear_attn/test_linear_attn.cu:
// device buffers, the bf16-rounded random inputs of a linear-attention case (the same draws in
// the same order for a seed), the max-relative error, and the CPU reference (lib/ops in fp32 on the
// rounded values: what the mixers do, then the recurrent or chunked scan).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common.cuh"
#include "core/bf16.hpp"
#include "linear_attn.cuh"
#include "ops/linear_attn.hpp"
#include "ops/norm.hpp"

namespace dz::la_test {

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t n_) : n(n_) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  template <class U>
  explicit Dev(const std::vector<U>& h) : Dev(h.size()) {
    static_assert(sizeof(U) == sizeof(T), "size");
    CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class U>
  std::vector<U> get() const {
    std::vector<U> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// bf16-rounded random values: raw bits and their float values.
struct Bf {
  std::vector<uint16_t> bits;
  std::vector<float> f;
};
inline Bf rand_bf(std::mt19937& rng, size_t n, float sd, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, sd);
  Bf r{std::vector<uint16_t>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) r.f[i] = dz::bf16_to_f32(r.bits[i] = dz::f32_to_bf16(nd(rng)));
  return r;
}
inline std::vector<float> rand_f(std::mt19937& rng, size_t n, float sd, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> r(n);
  for (auto& x : r) x = nd(rng);
  return r;
}

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;  // unwritten (poisoned) or broken
    md = std::max(md, double(std::fabs(got[i] - ref[i])));
    mr = std::max(mr, double(std::fabs(ref[i])));
  }
  return md / std::max(mr, 1e-6);
}
inline std::vector<float> bf_to_f(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = dz::bf16_to_f32(b[i]);
  return f;
}

struct Case {
  bool kda;
  int HK, HV, K, V;
  std::vector<int> lens;
  bool h0;
  float lower_bound;
  int segments;  // > 1: also run the parallel scan (one sequence)
  bool chunked_ref;
  float a_log_shift = 0.f;  // > 0: fast decays (diagonal blocks past e^-80 take the exact path)
};

// The raw inputs of one case, on host (bf16 bits + values) and device.
struct Inputs {
  int64_t T;
  Bf q, k, v, b, f;
  std::vector<float> A_log, dt_bias, h0;
  std::vector<int32_t> cu;
};

inline Inputs make_inputs(const Case& c, std::mt19937& rng) {
  Inputs in;
  in.cu.push_back(0);
  for (int l : c.lens) in.cu.push_back(in.cu.back() + l);
  in.T = in.cu.back();
  const size_t T = size_t(in.T);
  in.q = rand_bf(rng, T * c.HK * c.K, 1.f);
  in.k = rand_bf(rng, T * c.HK * c.K, 1.f);
  in.v = rand_bf(rng, T * c.HV * c.V, 1.f);
  in.b = rand_bf(rng, T * c.HV, 1.f);
  in.f = rand_bf(rng, T * c.HV * (c.kda ? c.K : 1), 1.f, -1.f);
  in.A_log = rand_f(rng, size_t(c.HV), 0.5f);
  for (float& a : in.A_log) a += c.a_log_shift;
  in.dt_bias = rand_f(rng, size_t(c.HV) * (c.kda ? c.K : 1), 0.3f);
  if (c.h0) in.h0 = rand_f(rng, c.lens.size() * c.HV * c.K * c.V, 0.3f);
  return in;
}

// o (bf16 bits) and ht as `call` leaves them, both poisoned first (NaN unless written).
template <class F>
std::pair<std::vector<uint16_t>, std::vector<float>> run_poisoned(Dev<__nv_bfloat16>& o, Dev<float>& ht, F call) {
  CUDA_CHECK(cudaMemset(o.p, 0xff, o.n * 2));
  CUDA_CHECK(cudaMemset(ht.p, 0xff, ht.n * 4));
  call();
  CUDA_CHECK(cudaDeviceSynchronize());
  return {o.get<uint16_t>(), ht.get<float>()};
}

// A case's inputs on the device and the chunked prefill's arguments over them (outputs o / ht, the
// sequence count and the total rows given): what each prefill test sets up the same way.
struct DevInputs {
  Dev<__nv_bfloat16> q, k, v, b, f;
  Dev<float> A_log, dt_bias, h0;
  Dev<int32_t> cu;
  explicit DevInputs(const Inputs& in)
      : q(in.q.bits), k(in.k.bits), v(in.v.bits), b(in.b.bits), f(in.f.bits), A_log(in.A_log),
        dt_bias(in.dt_bias), h0(in.h0), cu(in.cu) {}
  dz::cuda::LaPrefill prefill(const Case& c, int N, int64_t T, __nv_bfloat16* o, float* ht) const {
    dz::cuda::LaPrefill p;
    p.kda = c.kda;
    p.q = q.p, p.k = k.p, p.v = v.p, p.b = b.p;
    p.gate = {f.p, A_log.p, dt_bias.p, c.lower_bound};
    p.HK = c.HK, p.HV = c.HV, p.K = c.K, p.V = c.V;
    p.scale = 1.f / std::sqrt(float(c.K));
    p.cu_seqlens = cu.p, p.N = N;
    p.h0 = c.h0 ? h0.p : nullptr, p.ht = ht, p.o = o;
    p.T_total = T;
    return p;
  }
};

// CPU reference: what the mixers do (L2 norm, sigmoid beta, gate), then the recurrent or chunked scan.
inline void cpu_ref(const Case& c, const Inputs& in, std::vector<float>& o, std::vector<float>& ht) {
  const int64_t T = in.T;
  std::vector<float> q = in.q.f, k = in.k.f, beta(in.b.f.size()), g(in.f.f.size());
  dz::l2norm(q.data(), q.data(), T * c.HK, c.K, 1e-6f);
  dz::l2norm(k.data(), k.data(), T * c.HK, c.K, 1e-6f);
  for (size_t i = 0; i < beta.size(); ++i) beta[i] = dz::sigmoid(in.b.f[i]);
  const int GK = c.kda ? c.K : 1;
  if (c.lower_bound < 0.f)
    dz::kda_gate_lower_bound(in.f.f.data(), in.A_log.data(), in.dt_bias.data(), c.lower_bound, T, c.HV, GK, g.data());
  else
    dz::kda_gate_softplus(in.f.f.data(), in.A_log.data(), in.dt_bias.data(), T, c.HV, GK, g.data());
  o.assign(size_t(T) * c.HV * c.V, 0.f);
  const size_t SS = size_t(c.HV) * c.K * c.V;
  ht.assign(c.lens.size() * SS, 0.f);
  const float scale = 1.f / std::sqrt(float(c.K));
  for (size_t n = 0; n < c.lens.size(); ++n) {
    const int64_t b = in.cu[n], L = c.lens[n];
    float* st = ht.data() + n * SS;
    if (c.h0) std::copy(in.h0.begin() + long(n * SS), in.h0.begin() + long((n + 1) * SS), st);
    auto fn = c.kda ? (c.chunked_ref ? nullptr : &dz::kda_recurrent) : (c.chunked_ref ? nullptr : &dz::gdn_recurrent);
    const float *qp = q.data() + b * c.HK * c.K, *kp = k.data() + b * c.HK * c.K, *vp = in.v.f.data() + b * c.HV * c.V,
                *gp = g.data() + b * c.HV * GK, *bp = beta.data() + b * c.HV;
    float* op = o.data() + b * c.HV * c.V;
    if (fn)
      fn(qp, kp, vp, gp, bp, L, c.HK, c.HV, c.K, c.V, scale, st, op);
    else if (c.kda)
      dz::kda_chunked(qp, kp, vp, gp, bp, L, c.HK, c.HV, c.K, c.V, scale, st, op);
    else
      dz::gdn_chunked(qp, kp, vp, gp, bp, L, c.HK, c.HV, c.K, c.V, scale, st, op);
  }
}

}  // namespace dz::la_test
