// GPU linear attention (KDA / Gated DeltaNet chunked prefill, parallel scan, transitions, merge,
// decode) and short conv vs the CPU reference (run on the GPU machine: ctest -L gpu).
//
// Inputs are drawn, rounded to bf16, and the CPU reference runs on the rounded values (fp32), so
// the fp32 kernels (transitions, merge, decode) differ only by fp32 reassociation (different
// chunking/reduction order) and the bf16 rounding of the GPU outputs. Errors are
// max |gpu - ref| / max |ref| per tensor:
//   outputs o (bf16): < 1e-2  — one bf16 rounding is <= 2^-9 relative, plus fp32 noise;
//   states (fp32):    < 2e-3  — fp32 reassociation only, accumulated over up to 70K tokens.
// The chunked prefill and the parallel scan (tensor cores, bf16 operands): < 2e-2 / 1e-2 (below).
// The earlier fp32 prefill versions are tested in kernels/dev/linear_attn/.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "bench_linear_attn.cuh"
#include "common.cuh"
#include "core/bf16.hpp"
#include "core/linalg.hpp"
#include "la_gpu_fixtures.hpp"
#include "linear_attn.cuh"
#include "ops/linear_attn.hpp"
#include "ops/norm.hpp"
#include "ops/short_conv.hpp"
#include "short_conv.cuh"

using dz::cuda::bf16;
using namespace dz::la_test;

TEST_CASE("gpu linear attention chunked prefill and parallel scan equal the CPU reference", "[gpu]") {
  std::mt19937 rng(11);
  const std::vector<Case> cases = {
      {true, 1, 1, 64, 64, {1}, false, 0.f, 0, false},
      {true, 2, 2, 128, 128, {0, 1, 63, 64, 65, 200}, true, 0.f, 0, true},
      {true, 2, 4, 64, 64, {100, 0, 33}, true, -5.f, 0, false},
      {true, 64, 64, 128, 128, {70}, true, 0.f, 0, false},
      {true, 4, 4, 128, 128, {3000}, true, -5.f, 5, false},
      {true, 1, 1, 128, 128, {70000}, true, 0.f, 16, false},
      {false, 2, 4, 128, 128, {0, 1, 130, 64}, true, 0.f, 0, true},
      // GDN at K = 128 reads the raw q / k in the recurrence (lite records): GQA, the scan's passes
      {false, 1, 2, 128, 128, {3000}, true, 0.f, 5, false},
      {false, 16, 32, 64, 64, {300}, false, 0.f, 0, false},
      {false, 1, 2, 64, 64, {65600}, true, 0.f, 8, false},
      // GDN K = 128 with few heads and >= 16384 rows: la_chunk_prefill takes the scan by itself
      {false, 2, 4, 128, 128, {20000}, true, 0.f, 0, false},
      // exp(A_log) ~ 2-12: 16-row decays per channel around e^-20 .. e^-150, blocks on both sides of
      // e^-80 (both diagonal-block paths of the prefill);
      // exp(A_log) ~ 55: every diagonal block past e^-80 (exact path throughout)
      {true, 2, 2, 128, 128, {300, 17}, true, 0.f, 0, false, 1.5f},
      {true, 1, 2, 64, 64, {200}, true, 0.f, 0, false, 4.f},
  };
  for (const Case& c : cases) {
    Inputs in = make_inputs(c, rng);
    std::vector<float> o_ref, ht_ref;
    cpu_ref(c, in, o_ref, ht_ref);
    const DevInputs d(in);
    Dev<bf16> o(o_ref.size());
    Dev<float> ht(ht_ref.size());
    dz::cuda::LaPrefill p = d.prefill(c, int(c.lens.size()), in.T, o.p, ht.p);
    Dev<char> pws(dz::cuda::la_prefill_workspace_bytes(in.T, p.N, c.HV, c.K, c.V));
    p.workspace = pws.p;
    p.scan_segments = 1;  // the one-pass prefill here; the automatic scan below
    for (int bv : {128, 64, 32, 16})  // state columns per CTA (128: whole rows); K = 128: always 64 (wgmma)
    for (int fused : {1, 0}) {        // outputs inside the recurrence or in a pass after it
      if (bv > c.V || (c.K == 128 && bv != 64)) continue;
      p.value_block = bv;
      p.fused_output = fused;
      const auto r = run_poisoned(o, ht, [&] { dz::cuda::la_chunk_prefill(p, nullptr); });
      const double eo = rel_err(bf_to_f(r.first), o_ref), es = rel_err(r.second, ht_ref);
      std::printf("%s HK=%d HV=%d K=%d V=%d T=%lld N=%zu h0=%d lb=%g BV=%d%s: chunked o err %.3g, state err %.3g\n",
                  c.kda ? "kda" : "gdn", c.HK, c.HV, c.K, c.V, (long long)in.T, c.lens.size(), int(c.h0),
                  double(c.lower_bound), bv, !fused ? " out-pass" : "", eo, es);
      // bf16 operands on the tensor cores (normalised q/k, the decayed keys, (I+L)^-1, W, U, U'
      // and S as a product operand, each rounded to 2^-9 relative; the state itself accumulates
      // in fp32), as fla's kernels do.
      CHECK(eo < 2e-2);
      CHECK(es < 1e-2);
    }
    p.value_block = 0;
    p.fused_output = -1;  // the default
    p.scan_segments = 0;
    if (const int G = dz::cuda::la_scan_segments(p); G > 1) {  // few heads, one long sequence: the scan
      const auto r = run_poisoned(o, ht, [&] { dz::cuda::la_chunk_prefill(p, nullptr); });
      const double po = rel_err(bf_to_f(r.first), o_ref), ps = rel_err(r.second, ht_ref);
      std::printf("    automatic: parallel scan, %d segments, in la_prefill_workspace_bytes: o err %.3g, state err %.3g\n",
                  G, po, ps);
      CHECK(po < 2e-2);  // the scan's tolerances (below)
      CHECK(ps < 1e-2);
    }
    p.workspace = nullptr;
    if (c.segments > 1) {
      Dev<char> ws(dz::cuda::la_scan_workspace_bytes(in.T, c.segments, c.HV, c.K, c.V));
      const auto r = run_poisoned(o, ht, [&] { dz::cuda::la_parallel_prefill(p, in.T, c.segments, ws.p, nullptr); });
      const double po = rel_err(bf_to_f(r.first), o_ref), ps = rel_err(r.second, ht_ref);
      std::printf("    parallel scan, %d segments: o err %.3g, state err %.3g\n", c.segments, po, ps);
      CHECK(po < 2e-2);  // tolerances as for the chunked prefill above
      CHECK(ps < 1e-2);
    }
  }
}

// The pipelined prefill (a segment's prep beside the previous segment's recurrence on a second
// stream, the state carried in fp32) against the one-pass prefill of the same inputs: bitwise, o and
// the final state. Forced segment counts (a ragged last segment; 53 segments of 3 chunks, so both
// workspaces and both states turn over many times), the outputs in the recurrence and in the pass
// after it, K = 64 and 128, with and without h0; then the automatic rule.
TEST_CASE("gpu linear attention pipelined prefill equals the one-pass prefill bitwise", "[gpu]") {
  std::mt19937 rng(29);
  struct PCase {
    Case c;
    int segments, fused;
  };
  const std::vector<PCase> cases = {
      {{true, 2, 2, 128, 128, {10000}, true, 0.f, 0, false}, 3, -1},
      {{true, 2, 2, 128, 128, {10000}, true, 0.f, 0, false}, 64, 0},
      {{false, 1, 2, 128, 128, {4097}, false, 0.f, 0, false}, 5, -1},
      {{false, 2, 2, 128, 128, {5000}, true, 0.f, 0, false}, 3, 0},
      {{true, 1, 2, 64, 64, {6000}, true, -5.f, 0, false}, 4, 1},
      {{false, 2, 4, 64, 64, {3000}, true, 0.f, 0, false}, 2, 0},
  };
  dz::cuda::LaSide side, side_prio;
  side.create();
  side_prio.create(true);
  for (const PCase& pc : cases) {
    const Case& c = pc.c;
    Inputs in = make_inputs(c, rng);
    const DevInputs d(in);
    const size_t no = size_t(in.T) * c.HV * c.V, ns = size_t(c.HV) * c.K * c.V;
    Dev<bf16> o(no);
    Dev<float> ht(ns);
    Dev<char> ws(dz::cuda::la_prefill_workspace_bytes(in.T, 1, c.HV, c.K, c.V));
    dz::cuda::LaPrefill p = d.prefill(c, 1, in.T, o.p, ht.p);
    p.workspace = ws.p;
    p.fused_output = pc.fused;
    auto run = [&](const dz::cuda::LaSide* sd, int segs) {
      p.side = sd;
      p.pipeline_segments = segs;
      return run_poisoned(o, ht, [&] { dz::cuda::la_chunk_prefill(p, nullptr); });
    };
    const auto one = run(nullptr, 0);
    p.side = &side;
    p.pipeline_segments = pc.segments;
    const int S = dz::cuda::la_pipeline_segments(p);
    const auto piped = run(&side, pc.segments);
    const auto piped_prio = run(&side_prio, pc.segments);  // the bench's top-priority variant
    INFO((c.kda ? "kda" : "gdn") << " K=" << c.K << " HV=" << c.HV << " T=" << in.T << " segments asked "
                                 << pc.segments << ", run " << S << ", fused_output " << pc.fused);
    CHECK(S == std::min<int>(pc.segments, int((in.T + 63) / 64)));
    const auto fo = bf_to_f(one.first);
    CHECK(std::all_of(fo.begin(), fo.end(), [](float x) { return std::isfinite(x); }));  // all written
    CHECK(std::memcmp(one.first.data(), piped.first.data(), no * 2) == 0);
    CHECK(std::memcmp(one.second.data(), piped.second.data(), ns * 4) == 0);
    CHECK(std::memcmp(one.first.data(), piped_prio.first.data(), no * 2) == 0);
    CHECK(std::memcmp(one.second.data(), piped_prio.second.data(), ns * 4) == 0);
  }
  // the automatic rule: one sequence of >= 16384 rows with a side stream, recurrence CTAs <= half the SMs
  dz::cuda::LaPrefill a;
  a.HK = a.HV = 2, a.K = a.V = 128, a.N = 1, a.T_total = 65536;
  CHECK(dz::cuda::la_pipeline_segments(a) == 1);  // no side stream
  a.side = &side;
  CHECK(dz::cuda::la_scan_segments(a) > 1);  // two heads: la_chunk_prefill takes the scan, not the pipeline
  CHECK(dz::cuda::la_pipeline_segments(a) == 1);
  a.scan_segments = 1;  // the scan off: the pipelined form's own rule below
  CHECK(dz::cuda::la_pipeline_segments(a) == 8);
  a.T_total = 24576;
  CHECK(dz::cuda::la_pipeline_segments(a) == 3);
  a.T_total = 16383;
  CHECK(dz::cuda::la_pipeline_segments(a) == 1);
  a.T_total = 65536, a.N = 2;
  CHECK(dz::cuda::la_pipeline_segments(a) == 1);
  a.N = 1, a.pipeline_segments = 1;
  CHECK(dz::cuda::la_pipeline_segments(a) == 1);
  a.pipeline_segments = 0, a.HV = a.HK = 1024;  // 2048 recurrence CTAs: every SM busy already
  CHECK(dz::cuda::la_pipeline_segments(a) == 1);
  // the automatic scan, which la_chunk_prefill takes before the pipelined form: one sequence,
  // K = V = 128, >= 16384 rows, 16 HV <= SMs; floor(SMs / HV) segments, <= 64, <= the chunks
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  dz::cuda::LaPrefill g;
  g.K = g.V = 128, g.N = 1, g.T_total = 65536;
  for (int hv : {1, 2, 4, 8, 9, 16, 32}) {
    g.HV = g.HK = hv;
    const int want = 16 * hv <= sms ? std::min(64, sms / hv) : 1;
    INFO("HV " << hv << " on " << sms << " SMs");
    CHECK(dz::cuda::la_scan_segments(g) == want);
  }
  g.HV = g.HK = 4;
  const int g4 = dz::cuda::la_scan_segments(g);
  CHECK(g4 > 1);
  g.T_total = 16383;
  CHECK(dz::cuda::la_scan_segments(g) == 1);
  g.T_total = 20000;  // 313 chunks
  CHECK(dz::cuda::la_scan_segments(g) == std::min(g4, 313));
  g.T_total = 65536, g.N = 2;
  CHECK(dz::cuda::la_scan_segments(g) == 1);
  g.N = 1, g.K = g.V = 64;
  CHECK(dz::cuda::la_scan_segments(g) == 1);
  g.K = g.V = 128, g.scan_segments = 1;
  CHECK(dz::cuda::la_scan_segments(g) == 1);
  // its workspace is in la_prefill_workspace_bytes
  CHECK(dz::cuda::la_prefill_workspace_bytes(65536, 1, 4, 128, 128) >=
        dz::cuda::la_scan_workspace_bytes(65536, g4, 4, 128, 128));
}

TEST_CASE("gpu linear attention transitions and merge equal the CPU LaTransition", "[gpu]") {
  std::mt19937 rng(12);
  for (bool kda : {true, false}) {
    const Case c{kda, 1, 2, 64, 64, {300}, false, 0.f, 0, false};
    Inputs in = make_inputs(c, rng);
    const std::vector<int32_t> seg = {0, 100, 131, 300};
    const int S = 3, GK = kda ? c.K : 1;
    std::vector<float> q = in.q.f, k = in.k.f, beta(in.b.f.size()), g(in.f.f.size());
    dz::l2norm(k.data(), k.data(), in.T * c.HK, c.K, 1e-6f);
    for (size_t i = 0; i < beta.size(); ++i) beta[i] = dz::sigmoid(in.b.f[i]);
    dz::kda_gate_softplus(in.f.f.data(), in.A_log.data(), in.dt_bias.data(), in.T, c.HV, GK, g.data());
    Dev<bf16> qd(in.q.bits), kd(in.k.bits), vd(in.v.bits), bd(in.b.bits), fd(in.f.bits);
    Dev<float> A_log(in.A_log), dt_bias(in.dt_bias);
    Dev<int32_t> segd(seg);
    dz::cuda::LaPrefill p;
    p.kda = kda;
    p.q = qd.p, p.k = kd.p, p.v = vd.p, p.b = bd.p;
    p.gate = {fd.p, A_log.p, dt_bias.p, 0.f};
    p.HK = c.HK, p.HV = c.HV, p.K = c.K, p.V = c.V;
    const size_t AK = size_t(c.HV) * c.K * c.K, BV = size_t(c.HV) * c.K * c.V;
    Dev<float> A(S * AK), B(S * BV), Sinit(S * BV), hfin(BV);
    const std::vector<float> h0v = rand_f(rng, BV, 0.3f);
    Dev<float> h0(h0v);
    dz::cuda::la_transitions(p, segd.p, S, A.p, B.p, nullptr);
    dz::cuda::la_merge(A.p, B.p, h0.p, S, c.HV, c.K, c.V, Sinit.p, hfin.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto Ag = A.get<float>(), Bg = B.get<float>(), Sg = Sinit.get<float>(), hg = hfin.get<float>();
    std::vector<float> cur = h0v, next(BV);
    double ea = 0, eb = 0, em = 0;
    for (int s = 0; s < S; ++s) {
      const int64_t b0 = seg[size_t(s)], L = seg[size_t(s) + 1] - b0;
      auto fn = kda ? &dz::kda_transition : &dz::gdn_transition;
      const dz::LaTransition tr = fn(k.data() + b0 * c.HK * c.K, in.v.f.data() + b0 * c.HV * c.V,
                                     g.data() + b0 * c.HV * GK, beta.data() + b0 * c.HV, L, c.HK, c.HV, c.K, c.V);
      ea = std::max(ea, rel_err(std::vector<float>(Ag.begin() + long(s * AK), Ag.begin() + long((s + 1) * AK)), tr.A));
      eb = std::max(eb, rel_err(std::vector<float>(Bg.begin() + long(s * BV), Bg.begin() + long((s + 1) * BV)), tr.B));
      em = std::max(em, rel_err(std::vector<float>(Sg.begin() + long(s * BV), Sg.begin() + long((s + 1) * BV)), cur));
      dz::la_transition_apply(tr, cur.data(), next.data());
      cur = next;
    }
    em = std::max(em, rel_err(hg, cur));
    std::printf("%s transitions: A err %.3g, B err %.3g, merged states err %.3g\n", kda ? "kda" : "gdn", ea, eb, em);
    CHECK(ea < 2e-3);  // fp32 both sides: reassociation only
    CHECK(eb < 2e-3);
    CHECK(em < 2e-3);
  }
}

TEST_CASE("gpu linear attention decode against state slots equals the CPU recurrent step", "[gpu]") {
  std::mt19937 rng(13);
  struct D { bool kda; int HK, HV, K, V, B, slots; float lb; };
  for (const D& d : {D{true, 3, 3, 128, 128, 7, 10, 0.f}, D{false, 2, 4, 64, 64, 5, 9, 0.f},
                     D{true, 2, 2, 64, 128, 4, 4, -5.f}, D{true, 8, 8, 128, 128, 64, 64, 0.f}}) {
    const Case c{d.kda, d.HK, d.HV, d.K, d.V, std::vector<int>(size_t(d.B), 1), false, d.lb, 0, false};
    Inputs in = make_inputs(c, rng);
    std::vector<int32_t> slot(size_t(d.slots));
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);
    slot.resize(size_t(d.B));
    const size_t SS = size_t(d.HV) * d.K * d.V;
    std::vector<float> states = rand_f(rng, size_t(d.slots) * SS, 0.3f);
    // Reference: each sequence's slot state as h0, one token.
    Case cr = c;
    cr.h0 = true;
    in.h0.resize(size_t(d.B) * SS);
    for (int i = 0; i < d.B; ++i)
      std::copy(states.begin() + long(slot[size_t(i)] * SS), states.begin() + long((slot[size_t(i)] + 1) * SS),
                in.h0.begin() + long(i * SS));
    std::vector<float> o_ref, ht_ref;
    cpu_ref(cr, in, o_ref, ht_ref);
    std::vector<float> st_ref = states;
    for (int i = 0; i < d.B; ++i)
      std::copy(ht_ref.begin() + long(i * SS), ht_ref.begin() + long((i + 1) * SS),
                st_ref.begin() + long(slot[size_t(i)] * SS));
    Dev<bf16> q(in.q.bits), k(in.k.bits), v(in.v.bits), b(in.b.bits), f(in.f.bits), o(o_ref.size());
    Dev<float> A_log(in.A_log), dt_bias(in.dt_bias), st(states);
    Dev<int32_t> sl(slot);
    for (int bv : {0, 32, 64, 128}) {  // state columns per CTA (0: automatic)
    if (bv > d.V) continue;
    CUDA_CHECK(cudaMemcpy(st.p, states.data(), states.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(o.p, 0xff, o.n * 2));
    dz::cuda::LaDecode p;
    p.value_block = bv;
    p.kda = d.kda;
    p.q = q.p, p.k = k.p, p.v = v.p, p.b = b.p;
    p.gate = {f.p, A_log.p, dt_bias.p, d.lb};
    p.HK = d.HK, p.HV = d.HV, p.K = d.K, p.V = d.V, p.scale = 1.f / std::sqrt(float(d.K));
    p.B = d.B, p.slot = sl.p, p.states = st.p, p.o = o.p;
    dz::cuda::la_decode(p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double eo = rel_err(bf_to_f(o.get<uint16_t>()), o_ref), es = rel_err(st.get<float>(), st_ref);
    std::printf("%s decode HK=%d HV=%d K=%d V=%d B=%d slots=%d lb=%g BV=%d: o err %.3g, states err %.3g\n",
                d.kda ? "kda" : "gdn", d.HK, d.HV, d.K, d.V, d.B, d.slots, double(d.lb), bv, eo, es);
    CHECK(eo < 1e-2);
    CHECK(es < 2e-3);
    }
  }
}

TEST_CASE("gpu short conv prefill and update equal the CPU reference", "[gpu]") {
  std::mt19937 rng(14);
  const int C = 200, W = 4, P = W - 1;
  Bf w = rand_bf(rng, size_t(C) * W, 0.5f), bias = rand_bf(rng, size_t(C), 0.3f);
  // The vector kernel's 32-row blocks and 4-row prefetch groups: sequences that start inside a
  // group, empty ones, and a last block that ends inside a group (T = 75).
  for (const std::vector<int>& lens : {std::vector<int>{0, 1, 2, 5, 40}, std::vector<int>{3, 0, 61, 1, 10}}) {
    std::vector<int32_t> cu = {0};
    for (int l : lens) cu.push_back(cu.back() + l);
    const int N = int(lens.size()), T = cu.back();
    Bf x = rand_bf(rng, size_t(T) * C, 1.f);
    Bf st = rand_bf(rng, size_t(N) * P * C, 1.f);
    std::vector<float> y_ref(size_t(T) * C), st_ref = st.f;
    for (int n = 0; n < N; ++n)
      dz::short_conv_silu(x.f.data() + cu[size_t(n)] * C, w.f.data(), bias.f.data(), lens[size_t(n)], C, W,
                          st_ref.data() + size_t(n) * P * C, y_ref.data() + cu[size_t(n)] * C);
    Dev<bf16> xd(x.bits), wd(w.bits), bd(bias.bits), sd(st.bits), yd(y_ref.size());
    Dev<int32_t> cud(cu);
    CUDA_CHECK(cudaMemset(yd.p, 0xff, yd.n * 2));
    dz::cuda::short_conv_prefill(xd.p, wd.p, bd.p, cud.p, N, T, C, W, sd.p, yd.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double ey = rel_err(bf_to_f(yd.get<uint16_t>()), y_ref), es = rel_err(bf_to_f(sd.get<uint16_t>()), st_ref);
    std::printf("short conv prefill C=%d W=%d T=%d N=%d: y err %.3g, state err %.3g\n", C, W, T, N, ey, es);
    CHECK(ey < 1e-2);  // bf16 output rounding
    CHECK(es == 0.0);  // the state holds inputs: exact
    // The output split into three column blocks (q | k | v of the mixers), written in place: bitwise
    // the single output's columns. 64 | 64 | 72: the vector kernel; 60 | 60 | 80: the scalar one.
    for (const std::vector<int>& widths : {std::vector<int>{64, 64, 72}, std::vector<int>{60, 60, 80}}) {
      Dev<bf16> sd2(st.bits), b0(size_t(T) * widths[0]), b1(size_t(T) * widths[1]), b2(size_t(T) * widths[2]);
      dz::cuda::ConvOut out;
      out.n = 3;
      out.y[0] = b0.p, out.y[1] = b1.p, out.y[2] = b2.p;
      for (int s = 0; s < 3; ++s) out.c0[s + 1] = out.c0[s] + widths[size_t(s)];
      dz::cuda::short_conv_prefill(xd.p, wd.p, bd.p, cud.p, N, T, C, W, sd2.p, out, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> y1 = yd.get<uint16_t>(), s1 = sd.get<uint16_t>();
      const std::vector<uint16_t> h[3] = {b0.get<uint16_t>(), b1.get<uint16_t>(), b2.get<uint16_t>()};
      int64_t bad = 0;
      for (int t = 0; t < T; ++t)
        for (int s = 0; s < 3; ++s)
          for (int c = 0; c < widths[size_t(s)]; ++c)
            bad += h[s][size_t(t) * widths[size_t(s)] + c] != y1[size_t(t) * C + out.c0[s] + c];
      std::printf("short conv prefill split %d | %d | %d: %lld outputs differ from the single output\n", widths[0],
                  widths[1], widths[2], (long long)bad);
      CHECK(bad == 0);
      CHECK(sd2.get<uint16_t>() == s1);
    }
  }
  Dev<bf16> wd(w.bits), bd(bias.bits);
  // One decode step for B sequences in shuffled slots.
  const int B = 4, slots = 6;
  std::vector<int32_t> slot = {5, 0, 3, 2};
  Bf x1 = rand_bf(rng, size_t(B) * C, 1.f), s1 = rand_bf(rng, size_t(slots) * P * C, 1.f);
  std::vector<float> y1_ref(size_t(B) * C), s1_ref = s1.f;
  for (int i = 0; i < B; ++i)
    dz::short_conv_silu(x1.f.data() + i * C, w.f.data(), bias.f.data(), 1, C, W,
                        s1_ref.data() + size_t(slot[size_t(i)]) * P * C, y1_ref.data() + i * C);
  Dev<bf16> x1d(x1.bits), s1d(s1.bits), y1d(y1_ref.size());
  Dev<int32_t> sld(slot);
  dz::cuda::short_conv_update(x1d.p, wd.p, bd.p, sld.p, B, C, W, s1d.p, y1d.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const double uy = rel_err(bf_to_f(y1d.get<uint16_t>()), y1_ref), us = rel_err(bf_to_f(s1d.get<uint16_t>()), s1_ref);
  std::printf("short conv update B=%d: y err %.3g, state err %.3g\n", B, uy, us);
  CHECK(uy < 1e-2);
  CHECK(us == 0.0);
}

// Not run by ctest (hidden tag): the bench, `dz_gpu_tests "[.bench]"`, JSON to $DZ_BENCH_JSON.
TEST_CASE("gpu linear attention bench", "[.bench]") {
  const char* out = std::getenv("DZ_BENCH_JSON");
  REQUIRE(dz::cuda::bench_linear_attn(out ? out : "bench_linear_attn.json") == 0);
}
