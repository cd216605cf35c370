// Standalone test + bench of the earlier fp32 versions of the linear-attention chunked prefill
// (linear_attn_dev.cuh: v1 SIMT, v2 the register-tiled transitions kernel with outputs, v3 key
// side precomputed) and of their parallel scans, against the CPU reference and the production
// version 4 (la_chunk_prefill / la_parallel_prefill).
//   bash kernels/dev/linear_attn/run_gpu.sh   (builds, tests, benches; logs under $OUT), or
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/linear_attn/test_linear_attn.cu
//        kernels/dev/linear_attn/linear_attn_fp32.cu kernels/dev/linear_attn/linear_attn_split.cu
//        kernels/linear_attn.cu kernels/linear_attn_tiled.cu kernels/linear_attn_mma.cu
//        lib/ops/linear_attn.cpp lib/ops/norm.cpp lib/core/linalg.cpp -o /tmp/la && /tmp/la && /tmp/la --bench
// Test: the cases and inputs of tests/gpu/test_linear_attn_gpu.cpp (bf16-rounded draws, same
// seed and order; the CPU reference lib/ops/linear_attn in fp32 on the rounded values). Errors
// are max |x - y| / max |ref| per tensor, outputs and states poisoned (NaN) before each run:
//   v1-v3 vs the CPU reference: outputs < 1e-2 (one bf16 rounding <= 2^-9, plus fp32 noise),
//     states < 2e-3 (fp32 reassociation only), each column block 32, 64, V;
//   v4 (default tuning) vs the CPU reference: < 2e-2 / 1e-2 (its bf16 tensor-core operands), as
//     tests/gpu checks it;
//   v1-v3 vs v4: < 3e-2 / 1.2e-2, the two bounds added (triangle inequality); the printed
//     differences show how far the fp32 versions and v4 are apart.
// Parallel scans v2 / v3 the same way against the CPU reference and the v4 scan.
// Flags: --quick (the cases up to 1000 rows, e.g. for compute-sanitizer), --bench (v3 against
// v4 at B=1 T=65536 K=V=128: serial per column block and output placement, the parallel scan;
// the comparison kernels/bench_linear_attn.cu made while v3 was in the library).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.cuh"
#include "common.cuh"
#include "core/bf16.hpp"
#include "core/linalg.hpp"
#include "linear_attn.cuh"
#include "linear_attn_dev.cuh"
#include "linear_attn_impl.cuh"
#include "../../../tests/gpu/la_gpu_fixtures.hpp"
#include "ops/linear_attn.hpp"
#include "ops/norm.hpp"

using namespace dz::cuda;

namespace {

// ---- device buffers, inputs, the CPU reference: tests/gpu/la_gpu_fixtures.hpp ----
using namespace dz::la_test;

// ---- the test ----

int failures = 0;
void expect(bool ok, const char* what, double err, double tol) {
  if (ok) return;
  ++failures;
  std::printf("FAIL %s: %.3g >= %.3g\n", what, err, tol);
}

// max |a - b| / max |ref| (a, b two GPU results, ref the CPU reference)
double rel_diff(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    md = std::max(md, double(std::fabs(a[i] - b[i])));
    mr = std::max(mr, double(std::fabs(ref[i])));
  }
  return md / std::max(mr, 1e-6);
}

constexpr double kTolO = 1e-2, kTolS = 2e-3;      // fp32 versions vs the CPU reference
constexpr double kTolO4 = 2e-2, kTolS4 = 1e-2;    // v4 vs the CPU reference (tests/gpu)
constexpr double kTolOd = kTolO + kTolO4, kTolSd = kTolS + kTolS4;  // fp32 versions vs v4

void serial_version(int v, const LaPrefill& p) {
  if (v == 1) la_dev::v1_chunk_prefill(p, nullptr);
  if (v == 2) la_dev::v2_chunk_prefill(p, nullptr);
  if (v == 3) la_dev::v3_chunk_prefill(p, nullptr);
  if (v == 4) la_chunk_prefill(p, nullptr);
}
void parallel_version(int v, const LaPrefill& p, int64_t T, int segments, void* ws) {
  if (v == 2) la_dev::v2_parallel_prefill(p, T, segments, ws, nullptr);
  if (v == 3) la_dev::v3_parallel_prefill(p, T, segments, ws, nullptr);
  if (v == 4) la_parallel_prefill(p, T, segments, ws, nullptr);
}

int run_test(bool quick) {
  std::mt19937 rng(11);
  // tests/gpu/test_linear_attn_gpu.cpp's cases, in its order (the inputs are drawn in sequence)
  const std::vector<Case> cases = {
      {true, 1, 1, 64, 64, {1}, false, 0.f, 0, false},
      {true, 2, 2, 128, 128, {0, 1, 63, 64, 65, 200}, true, 0.f, 0, true},
      {true, 2, 4, 64, 64, {100, 0, 33}, true, -5.f, 0, false},
      {true, 64, 64, 128, 128, {70}, true, 0.f, 0, false},
      {true, 4, 4, 128, 128, {3000}, true, -5.f, 5, false},
      {true, 1, 1, 128, 128, {70000}, true, 0.f, 16, false},
      {false, 2, 4, 128, 128, {0, 1, 130, 64}, true, 0.f, 0, true},
      {false, 16, 32, 64, 64, {300}, false, 0.f, 0, false},
      {false, 1, 2, 64, 64, {65600}, true, 0.f, 8, false},
      {true, 2, 2, 128, 128, {300, 17}, true, 0.f, 0, false, 1.5f},
      {true, 1, 2, 64, 64, {200}, true, 0.f, 0, false, 4.f},
  };
  std::vector<Inputs> ins;
  for (const Case& c : cases) ins.push_back(make_inputs(c, rng));
  // CPU references of all cases at once, one thread each (the 70K-row cases take seconds)
  std::vector<std::vector<float>> o_refs(cases.size()), ht_refs(cases.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < cases.size(); ++i)
    if (!quick || ins[i].T <= 1000) th.emplace_back([&, i] { cpu_ref(cases[i], ins[i], o_refs[i], ht_refs[i]); });
  for (auto& t : th) t.join();
  char what[256];
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const Inputs& in = ins[ci];
    if (quick && in.T > 1000) continue;
    const std::vector<float>&o_ref = o_refs[ci], &ht_ref = ht_refs[ci];
    Dev<bf16> q(in.q.bits), k(in.k.bits), v(in.v.bits), b(in.b.bits), f(in.f.bits);
    Dev<float> A_log(in.A_log), dt_bias(in.dt_bias), h0(in.h0);
    Dev<int32_t> cu(in.cu);
    Dev<bf16> o(o_ref.size());
    Dev<float> ht(ht_ref.size());
    LaPrefill p;
    p.kda = c.kda;
    p.q = q.p, p.k = k.p, p.v = v.p, p.b = b.p;
    p.gate = {f.p, A_log.p, dt_bias.p, c.lower_bound};
    p.HK = c.HK, p.HV = c.HV, p.K = c.K, p.V = c.V;
    p.scale = 1.f / std::sqrt(float(c.K));
    p.cu_seqlens = cu.p, p.N = int(c.lens.size());
    p.h0 = c.h0 ? h0.p : nullptr, p.ht = ht.p, p.o = o.p;
    Dev<char> pws(std::max(la_prefill_workspace_bytes(in.T, p.N, c.HV, c.K, c.V),
                           la_dev::v3_workspace_bytes(in.T, p.N, c.HV, c.K, c.V)));
    p.T_total = in.T;
    p.workspace = pws.p;
    // One run: poisoned outputs, then the outputs and the final states.
    auto run = [&](const auto& fn, std::vector<float>& ov, std::vector<float>& sv) {
      CUDA_CHECK(cudaMemset(o.p, 0xff, o.n * 2));
      CUDA_CHECK(cudaMemset(ht.p, 0xff, ht.n * 4));
      fn();
      CUDA_CHECK(cudaDeviceSynchronize());
      ov = bf_to_f(o.get<uint16_t>());
      sv = ht.get<float>();
    };
    std::printf("%s HK=%d HV=%d K=%d V=%d T=%lld N=%zu h0=%d lb=%g\n", c.kda ? "kda" : "gdn", c.HK, c.HV, c.K, c.V,
                (long long)in.T, c.lens.size(), int(c.h0), double(c.lower_bound));
    std::vector<float> o4, s4, ov, sv;
    run([&] { serial_version(4, p); }, o4, s4);  // v4 at its default tuning: the comparison point
    double eo = rel_err(o4, o_ref), es = rel_err(s4, ht_ref);
    std::printf("  v4         vs CPU o %.3g state %.3g\n", eo, es);
    std::snprintf(what, sizeof what, "case %zu v4 vs CPU", ci);
    expect(eo < kTolO4, what, eo, kTolO4);
    expect(es < kTolS4, what, es, kTolS4);
    for (int ver : {1, 2, 3})
      for (int bv : {128, 64, 32}) {  // state columns per CTA (128: whole rows)
        if (bv > c.V) continue;
        p.value_block = bv;
        run([&] { serial_version(ver, p); }, ov, sv);
        eo = rel_err(ov, o_ref), es = rel_err(sv, ht_ref);
        const double d_o = rel_diff(ov, o4, o_ref), d_s = rel_diff(sv, s4, ht_ref);
        std::printf("  v%d BV=%-3d  vs CPU o %.3g state %.3g; vs v4 o %.3g state %.3g\n", ver, bv, eo, es, d_o, d_s);
        std::snprintf(what, sizeof what, "case %zu v%d BV=%d vs CPU", ci, ver, bv);
        expect(eo < kTolO, what, eo, kTolO);
        expect(es < kTolS, what, es, kTolS);
        std::snprintf(what, sizeof what, "case %zu v%d BV=%d vs v4", ci, ver, bv);
        expect(d_o < kTolOd, what, d_o, kTolOd);
        expect(d_s < kTolSd, what, d_s, kTolSd);
      }
    p.value_block = 0;
    if (c.segments <= 1) continue;
    p.workspace = nullptr;  // as tests/gpu: the scans use their own workspace
    Dev<char> ws(std::max(la_scan_workspace_bytes(in.T, c.segments, c.HV, c.K, c.V),
                          la_dev::fp32_scan_workspace_bytes(in.T, c.segments, c.HV, c.K, c.V)));
    run([&] { parallel_version(4, p, in.T, c.segments, ws.p); }, o4, s4);
    eo = rel_err(o4, o_ref), es = rel_err(s4, ht_ref);
    std::printf("  parallel scan, %d segments: v4 vs CPU o %.3g state %.3g\n", c.segments, eo, es);
    std::snprintf(what, sizeof what, "case %zu parallel scan v4 vs CPU", ci);
    expect(eo < kTolO4, what, eo, kTolO4);
    expect(es < kTolS4, what, es, kTolS4);
    for (int ver : {2, 3}) {
      run([&] { parallel_version(ver, p, in.T, c.segments, ws.p); }, ov, sv);
      eo = rel_err(ov, o_ref), es = rel_err(sv, ht_ref);
      const double d_o = rel_diff(ov, o4, o_ref), d_s = rel_diff(sv, s4, ht_ref);
      std::printf("  parallel scan, %d segments: v%d vs CPU o %.3g state %.3g; vs v4 o %.3g state %.3g\n", c.segments,
                  ver, eo, es, d_o, d_s);
      std::snprintf(what, sizeof what, "case %zu parallel scan v%d vs CPU", ci, ver);
      expect(eo < kTolO, what, eo, kTolO);
      expect(es < kTolS, what, es, kTolS);
      std::snprintf(what, sizeof what, "case %zu parallel scan v%d vs v4", ci, ver);
      expect(d_o < kTolOd, what, d_o, kTolOd);
      expect(d_s < kTolSd, what, d_s, kTolSd);
    }
  }
  std::printf("%s: %d failed checks\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}

// ---- the bench: v3 against v4 (kernels/bench_linear_attn.cu's rows while v3 was in the library) ----

using namespace benchrand;  // random device buffers (bench_util.cuh)

int run_bench() {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs\n", prop.name, sms);
  auto row = [](const char* name, const char* shape, double ms, const char* extra) {
    std::printf("%-26s %-26s %9.3f ms  %s\n", name, shape, ms, extra);
    std::fflush(stdout);
  };
  char shape[128], extra[160];
  const int T = 65536, K = 128, V = 128;
  for (int H : {32, 8, 4}) {
    const size_t TH = size_t(T) * H;
    bf16 *q = rand_bf16(TH * K, 1), *k = rand_bf16(TH * K, 2), *v = rand_bf16(TH * V, 3), *b = rand_bf16(TH, 4);
    bf16 *f = rand_bf16(TH * K, 5, -3.f, 1.f), *fg = rand_bf16(TH, 6, -3.f, 1.f), *o = alloc<bf16>(TH * V);
    float *A_log = rand_f32(size_t(H), 7, -0.5f, 0.5f), *dtb = rand_f32(size_t(H) * K, 8, -0.1f, 0.1f);
    float* ht = alloc<float>(size_t(H) * K * V);
    int32_t* cu = alloc<int32_t>(2);
    const int32_t cuh[2] = {0, T};
    CUDA_CHECK(cudaMemcpy(cu, cuh, sizeof cuh, cudaMemcpyHostToDevice));
    const int segs = std::max(1, std::min(64, (sms + H - 1) / H));
    void* ws = alloc<char>(std::max(la_scan_workspace_bytes(T, segs, H, K, V),
                                    la_dev::fp32_scan_workspace_bytes(T, segs, H, K, V)));
    void* pws = alloc<char>(std::max(la_prefill_workspace_bytes(T, 1, H, K, V), la_dev::v3_workspace_bytes(T, 1, H, K, V)));
    LaPrefill p;
    p.q = q, p.k = k, p.v = v, p.b = b, p.HK = H, p.HV = H, p.K = K, p.V = V, p.scale = 0.088388f;
    p.cu_seqlens = cu, p.N = 1, p.ht = ht, p.o = o, p.T_total = T;
    for (bool kda : {true, false}) {
      if (!kda && H != 32) continue;
      p.kda = kda;
      p.gate = {kda ? f : fg, A_log, dtb, 0.f};
      std::snprintf(shape, sizeof shape, "B=1 T=%d H=%d K=%d V=%d", T, H, K, V);
      double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30}, par[5] = {};  // indexed by version (3, 4)
      for (int ver : {3, 4})
        for (int bv : {128, 64, 32, 16})
          for (int fused : {1, 0}) {  // v4: outputs inside the recurrence / in a pass after it
            if ((bv == 128 && (ver == 3 || H > 8)) || (ver == 3 && (bv == 16 || !fused))) continue;
            if (ver == 4 && K == 128 && bv != 64) continue;  // the wgmma recurrence: 64 columns a CTA, always
            p.value_block = bv;
            p.fused_output = fused;
            p.workspace = pws;
            const double ms = median_ms([&] { serial_version(ver, p); }, 3, 1);
            best[ver] = std::min(best[ver], ms);
            std::snprintf(extra, sizeof extra, "v%d BV=%d%s (%d CTAs)", ver, bv,
                          ver == 4 ? (fused ? " fused" : " out-pass") : "", H * (V / bv));
            row(kda ? "kda_chunk_serial" : "gdn_chunk_serial", shape, ms, extra);
          }
      p.value_block = 0;
      p.fused_output = -1;  // the default
      {  // v4's stages apart at the default configuration: the key side (prep), then the recurrence
         // with its outputs from its records (what the recurrence patches of kernels/dev/queued change)
        p.workspace = pws;
        const int bv = la::pick_bv(p, H, V, true);
        const la::ChunkArgs ca{p, true, false};
        const double prep = median_ms([&] { la::mma_prefill(ca, bv, la::kPrep, nullptr); }, 3, 1);
        const double rec = median_ms([&] { la::mma_prefill(ca, bv, la::kRecur | la::kOutput, nullptr); }, 3, 1);
        std::snprintf(extra, sizeof extra, "v4 BV=%d key side alone", bv);
        row(kda ? "kda_stage_prep" : "gdn_stage_prep", shape, prep, extra);
        std::snprintf(extra, sizeof extra, "v4 BV=%d recurrence + outputs alone", bv);
        row(kda ? "kda_stage_recurrence" : "gdn_stage_recurrence", shape, rec, extra);
      }
      p.workspace = nullptr;
      for (int ver : {3, 4}) {
        par[ver] = median_ms([&] { parallel_version(ver, p, T, segs, ws); }, 5, 1);
        std::snprintf(extra, sizeof extra, "v%d segments=%d, %.2fx its best serial", ver, segs, best[ver] / par[ver]);
        row(kda ? "kda_chunk_parallel_scan" : "gdn_chunk_parallel_scan", shape, par[ver], extra);
      }
      std::printf("  v3 / v4: best serial %.2fx, parallel scan %.2fx\n", best[3] / best[4], par[3] / par[4]);
    }
    for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)b, (void*)f, (void*)fg, (void*)o, (void*)A_log,
                      (void*)dtb, (void*)ht, (void*)cu, ws, pws})
      cudaFree(ptr);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool bench = false, quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bench")) bench = true;
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--bench]\n", argv[0]);
      return 2;
    }
  }
  try {
    return bench ? run_bench() : run_test(quick);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
