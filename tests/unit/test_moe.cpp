// MoE router, SwiGLU experts and the FFN modules vs hand-computed cases and fp64 naive loops.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "io/checkpoint.hpp"
#include "model/module.hpp"
#include "model/parallel.hpp"
#include "ops/moe.hpp"

using namespace dz;

namespace {
std::vector<float> randv(size_t n, std::mt19937& g, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
float logit(double p) { return float(std::log(p / (1 - p))); }
double sig64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// fp64 reference routing for one token, from logits. Selection by rank counting (an element is
// kept when fewer than k others beat it; a tie is won by the lower index) rather than sorting.
std::map<int, double> ref_select(const RouterConfig& rc, const std::vector<double>& logits, const float* bias) {
  const int E = int(rc.n_experts), G = int(rc.n_group), gs = E / G;
  std::vector<double> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
  if (rc.score_func == ScoreFunc::Softmax) {
    double z = 0;
    for (double l : logits) z += std::exp(l);
    for (int e = 0; e < E; ++e) s[size_t(e)] = std::exp(logits[size_t(e)]) / z;
  } else {
    for (int e = 0; e < E; ++e) s[size_t(e)] = sig64(logits[size_t(e)]);
  }
  for (int e = 0; e < E; ++e) c[size_t(e)] = s[size_t(e)] + (bias ? bias[e] : 0.0);
  auto beats = [](double va, int a, double vb, int b) { return va > vb || (va == vb && a < b); };
  std::vector<bool> ok(static_cast<size_t>(E), true);
  if (rc.topk_group < G) {
    std::vector<double> gsc(static_cast<size_t>(G));
    for (int g = 0; g < G; ++g) {
      std::vector<double> v(c.begin() + g * gs, c.begin() + (g + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      gsc[size_t(g)] = rc.group_score == GroupScore::Top2Sum ? v[0] + v[1] : v[0];
    }
    for (int g = 0; g < G; ++g) {
      int better = 0;
      for (int h = 0; h < G; ++h) better += h != g && beats(gsc[size_t(h)], h, gsc[size_t(g)], g);
      for (int i = 0; i < gs; ++i) ok[size_t(g * gs + i)] = better < rc.topk_group;
    }
  }
  std::map<int, double> r;
  for (int e = 0; e < E; ++e) {
    if (!ok[size_t(e)]) continue;
    int better = 0;
    for (int f = 0; f < E; ++f) better += f != e && ok[size_t(f)] && beats(c[size_t(f)], f, c[size_t(e)], e);
    if (better < rc.top_k) r[e] = s[size_t(e)];
  }
  double sum = 0;
  for (auto& kv : r) sum += kv.second;
  for (auto& kv : r) kv.second = (rc.norm_topk_prob ? kv.second / sum : kv.second) * rc.routed_scaling_factor;
  return r;
}

// fp64 gated MLP of one row: SwiGLU, its clamp (limit > 0) or SiTU (beta > 0; lbeta > 0 bounds u).
std::vector<double> ref_swiglu(const float* x, const float* g, const float* u, const float* dn, int64_t D, int64_t I,
                               int64_t down_ld, double limit = 0, double beta = 0, double lbeta = 0) {
  std::vector<double> a(static_cast<size_t>(I)), y(static_cast<size_t>(D), 0.0);
  for (int64_t i = 0; i < I; ++i) {
    double hg = 0, hu = 0;
    for (int64_t d = 0; d < D; ++d) {
      hg += double(x[d]) * g[i * D + d];
      hu += double(x[d]) * u[i * D + d];
    }
    if (limit > 0) hg = std::min(hg, limit), hu = std::min(std::max(hu, -limit), limit);  // SwiGLU clamp
    if (beta > 0)  // SiTU (Kimi K3)
      a[size_t(i)] = beta * std::tanh(hg / beta) * sig64(hg) * (lbeta > 0 ? lbeta * std::tanh(hu / lbeta) : hu);
    else
      a[size_t(i)] = hg * sig64(hg) * hu;
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t i = 0; i < I; ++i) y[size_t(d)] += double(dn[d * down_ld + i]) * a[size_t(i)];
  return y;
}

RouterConfig router(int64_t E, int64_t k, ScoreFunc f, int64_t G = 1, int64_t TG = 1, bool norm = true,
                    float scale = 1.f, GroupScore gsc = GroupScore::Top2Sum) {
  RouterConfig rc;
  rc.n_experts = E;
  rc.top_k = k;
  rc.score_func = f;
  rc.n_group = G;
  rc.topk_group = TG;
  rc.norm_topk_prob = norm;
  rc.routed_scaling_factor = scale;
  rc.group_score = gsc;
  return rc;
}
}  // namespace

// Hand-computed: sigmoid scores p, 4 groups of 2, keep 2 groups, pick 2 experts.
//   p = [.6 .6 | .5 .55 | .1 .2 | .05 .9]; top-2 group sums 1.2, 1.05, 0.3, 0.95 -> keep groups 0, 1,
//   so expert 7 (the best single score, 0.9) is excluded; picks {0, 1}, weights .6/1.2 * 2.5 = 1.25.
//   With Max group scores (.6, .55, .2, .9) groups 3 and 0 win: picks {0 (ties 1, lower index), 7},
//   weights .6/1.5 * 2.5 = 1.0 and .9/1.5 * 2.5 = 1.5. Tolerance 1e-6: sigmoid(logit(p)) rounds in fp32.
TEST_CASE("moe: group limiting excludes the best expert of a losing group", "[unit]") {
  const double p[8] = {.6, .6, .5, .55, .1, .2, .05, .9};
  std::vector<float> lg(8);
  for (int e = 0; e < 8; ++e) lg[size_t(e)] = logit(p[e]);
  int32_t idx[2];
  float w[2];
  moe_select(router(8, 2, ScoreFunc::Sigmoid, 4, 2, true, 2.5f), lg.data(), nullptr, idx, w);
  REQUIRE(idx[0] == 0);
  REQUIRE(idx[1] == 1);
  REQUIRE(std::abs(w[0] - 1.25) < 1e-6);
  REQUIRE(std::abs(w[1] - 1.25) < 1e-6);

  moe_select(router(8, 2, ScoreFunc::Sigmoid, 4, 2, true, 2.5f, GroupScore::Max), lg.data(), nullptr, idx, w);
  REQUIRE(idx[0] == 0);
  REQUIRE(idx[1] == 7);
  REQUIRE(std::abs(w[0] - 1.0) < 1e-6);
  REQUIRE(std::abs(w[1] - 1.5) < 1e-6);

  // No group limiting (topk_group == n_group): 7 and 0 again.
  moe_select(router(8, 2, ScoreFunc::Sigmoid, 4, 4, true, 2.5f), lg.data(), nullptr, idx, w);
  REQUIRE(idx[0] == 0);
  REQUIRE(idx[1] == 7);
}

// Hand-computed: p = [.9 .8 .7 .3 .2 .1], bias +0.7 on expert 3 -> selection scores put 3 first,
// so top-2 = {0, 3}; weights come from the unbiased p: .9/1.2 = .75 and .3/1.2 = .25; without
// renormalisation .9 * 2 and .3 * 2.
TEST_CASE("moe: correction bias changes the selection but not the weights", "[unit]") {
  const double p[6] = {.9, .8, .7, .3, .2, .1};
  std::vector<float> lg(6);
  for (int e = 0; e < 6; ++e) lg[size_t(e)] = logit(p[e]);
  const float bias[6] = {0, 0, 0, .7f, 0, 0};
  int32_t idx[2];
  float w[2];
  moe_select(router(6, 2, ScoreFunc::Sigmoid), lg.data(), nullptr, idx, w);
  REQUIRE((idx[0] == 0 && idx[1] == 1));
  moe_select(router(6, 2, ScoreFunc::Sigmoid), lg.data(), bias, idx, w);
  REQUIRE((idx[0] == 0 && idx[1] == 3));
  REQUIRE(std::abs(w[0] - .75) < 1e-6);
  REQUIRE(std::abs(w[1] - .25) < 1e-6);
  moe_select(router(6, 2, ScoreFunc::Sigmoid, 1, 1, false, 2.f), lg.data(), bias, idx, w);
  REQUIRE(std::abs(w[0] - 1.8) < 2e-6);
  REQUIRE(std::abs(w[1] - 0.6) < 2e-6);
}

TEST_CASE("moe: ties go to the lower expert index", "[unit]") {
  std::vector<float> lg(7, 0.25f);  // all equal
  int32_t idx[3];
  float w[3];
  moe_select(router(7, 3, ScoreFunc::Softmax, 1, 1, false), lg.data(), nullptr, idx, w);
  REQUIRE((idx[0] == 0 && idx[1] == 1 && idx[2] == 2));
  REQUIRE(std::abs(w[0] - 1.0 / 7) < 1e-7);
}

// Random routing vs the fp64 rank-counting reference. Logits come from fp32 dz::linear (error
// ~1e-7 relative), so the selected set must match exactly (gaps between random scores are far
// larger) and weights to 2e-6 relative (exp/sigmoid and a k-term sum in fp32).
TEST_CASE("moe: routing matches the fp64 reference over configurations", "[unit]") {
  std::mt19937 g(21);
  const int64_t T = 7, D = 19, E = 16;
  auto x = randv(size_t(T * D), g);
  auto W = randv(size_t(E * D), g, 0.3f);
  auto b = randv(size_t(E), g, 0.1f);
  struct C { ScoreFunc f; int64_t G, TG, k; bool bias, norm; GroupScore gs; float scale; };
  for (C c : {C{ScoreFunc::Sigmoid, 4, 2, 3, true, true, GroupScore::Top2Sum, 2.446f},
              C{ScoreFunc::Sigmoid, 8, 3, 4, true, false, GroupScore::Top2Sum, 1.f},
              C{ScoreFunc::Softmax, 4, 1, 2, false, true, GroupScore::Max, 1.f},
              C{ScoreFunc::Softmax, 1, 1, 5, false, true, GroupScore::Top2Sum, 1.f},
              C{ScoreFunc::Softmax, 1, 1, 1, false, false, GroupScore::Top2Sum, 1.f},
              C{ScoreFunc::Sigmoid, 2, 1, 8, true, true, GroupScore::Top2Sum, 1.5f}}) {
    RouterConfig rc = router(E, c.k, c.f, c.G, c.TG, c.norm, c.scale, c.gs);
    std::vector<int32_t> idx(size_t(T * c.k));
    std::vector<float> w(size_t(T * c.k));
    moe_route(rc, x.data(), W.data(), c.bias ? b.data() : nullptr, T, D, idx.data(), w.data());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> lg(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        for (int64_t d = 0; d < D; ++d) lg[size_t(e)] += double(x[size_t(t * D + d)]) * W[size_t(e * D + d)];
      auto ref = ref_select(rc, lg, c.bias ? b.data() : nullptr);
      REQUIRE(int64_t(ref.size()) == c.k);
      for (int64_t j = 0; j < c.k; ++j) {
        const int e = idx[size_t(t * c.k + j)];
        REQUIRE(ref.count(e) == 1);
        if (j > 0) REQUIRE(e > idx[size_t(t * c.k + j - 1)]);  // ascending
        REQUIRE(std::abs(w[size_t(t * c.k + j)] - ref[e]) <= 2e-6 * std::abs(ref[e]) + 1e-9);
      }
    }
  }
}

TEST_CASE("moe: router config validation", "[unit]") {
  REQUIRE_THROWS(router(8, 9, ScoreFunc::Softmax).validate());
  REQUIRE_THROWS(router(9, 2, ScoreFunc::Softmax, 2, 1).validate());  // 2 groups do not divide 9
  REQUIRE_THROWS(router(8, 3, ScoreFunc::Sigmoid, 4, 1).validate());  // 3 picks from one group of 2
  REQUIRE_NOTHROW(router(8, 2, ScoreFunc::Sigmoid, 4, 1).validate());
}

// SwiGLU and the routed expert sum vs fp64 loops. fp32 dot products over D = 19 and I = 7 terms:
// relative error ~1e-6; tolerance 1e-5 of the output's max magnitude.
TEST_CASE("moe: SwiGLU experts, expert-range and width shards match fp64", "[unit]") {
  std::mt19937 g(22);
  const int64_t T = 5, D = 19, I = 7, E = 6, k = 2;
  std::vector<std::vector<float>> Wg, Wu, Wd;
  std::vector<SwigluView> ex;
  for (int64_t e = 0; e < E; ++e) {
    Wg.push_back(randv(size_t(I * D), g, 0.3f));
    Wu.push_back(randv(size_t(I * D), g, 0.3f));
    Wd.push_back(randv(size_t(D * I), g, 0.3f));
  }
  for (int64_t e = 0; e < E; ++e) {
    SwigluView v;
    v.gate = Wg[size_t(e)].data();
    v.up = Wu[size_t(e)].data();
    v.down = Wd[size_t(e)].data();
    v.inter = I;
    v.down_ld = I;
    ex.push_back(v);
  }
  auto x = randv(size_t(T * D), g);
  // Single MLP.
  std::vector<float> y(size_t(T * D));
  swiglu_mlp(ex[0], x.data(), y.data(), T, D);
  for (int64_t t = 0; t < T; ++t) {
    auto r = ref_swiglu(x.data() + t * D, Wg[0].data(), Wu[0].data(), Wd[0].data(), D, I, I);
    double mx = 0;
    for (double v : r) mx = std::max(mx, std::abs(v));
    for (int64_t d = 0; d < D; ++d) REQUIRE(std::abs(y[size_t(t * D + d)] - r[size_t(d)]) <= 1e-5 * mx);
  }
  // The SwiGLU clamp (swiglu_limit): at 0.2 most gate / up values of these weights are clipped.
  SwigluView cl = ex[0];
  cl.act.limit = 0.2f;
  swiglu_mlp(cl, x.data(), y.data(), T, D);
  for (int64_t t = 0; t < T; ++t) {
    auto r = ref_swiglu(x.data() + t * D, Wg[0].data(), Wu[0].data(), Wd[0].data(), D, I, I, 0.2);
    auto plain = ref_swiglu(x.data() + t * D, Wg[0].data(), Wu[0].data(), Wd[0].data(), D, I, I);
    double mx = 0, moved = 0;
    for (size_t d = 0; d < r.size(); ++d) mx = std::max(mx, std::abs(r[d])), moved = std::max(moved, std::abs(r[d] - plain[d]));
    CHECK(moved > 1e-2 * mx);  // the clamp changed the output
    for (int64_t d = 0; d < D; ++d) REQUIRE(std::abs(y[size_t(t * D + d)] - r[size_t(d)]) <= 1e-5 * mx);
  }
  // and a TP width slice keeps the limit
  CHECK(cl.slice(1, 4, D).act.limit == 0.2f);
  // SiTU (Kimi K3's activation) with small betas so both tanh bounds bite on these weights; and
  // with the up branch unbounded (linear_beta null).
  for (const float lb : {0.3f, 0.f}) {
    SwigluView st = ex[0];
    st.act.situ_beta = 0.25f;
    st.act.situ_linear_beta = lb;
    swiglu_mlp(st, x.data(), y.data(), T, D);
    for (int64_t t = 0; t < T; ++t) {
      auto r = ref_swiglu(x.data() + t * D, Wg[0].data(), Wu[0].data(), Wd[0].data(), D, I, I, 0, 0.25, lb);
      auto plain = ref_swiglu(x.data() + t * D, Wg[0].data(), Wu[0].data(), Wd[0].data(), D, I, I);
      double mx = 0, moved = 0;
      for (size_t d = 0; d < r.size(); ++d) mx = std::max(mx, std::abs(r[d])), moved = std::max(moved, std::abs(r[d] - plain[d]));
      CHECK(moved > 1e-2 * mx);  // SiTU is not SiLU here
      for (int64_t d = 0; d < D; ++d) REQUIRE(std::abs(y[size_t(t * D + d)] - r[size_t(d)]) <= 1e-5 * mx);
    }
    CHECK(st.slice(1, 4, D).act == st.act);
  }
  // Routed sum with fixed picks.
  const int32_t idx[T * k] = {0, 3, 1, 5, 2, 3, 0, 4, 4, 5};
  const float w[T * k] = {0.7f, 0.3f, 1.2f, -0.4f, 0.5f, 0.5f, 2.f, 0.1f, 0.9f, 0.05f};
  std::vector<float> full(size_t(T * D), 0.f);
  moe_experts_acc(ex, x.data(), T, D, idx, w, k, 0, E, full.data());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> r(static_cast<size_t>(D), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int e = idx[t * k + j];
      auto ye = ref_swiglu(x.data() + t * D, Wg[size_t(e)].data(), Wu[size_t(e)].data(), Wd[size_t(e)].data(), D, I, I);
      for (int64_t d = 0; d < D; ++d) r[size_t(d)] += w[t * k + j] * ye[size_t(d)];
    }
    double mx = 0;
    for (double v : r) mx = std::max(mx, std::abs(v));
    for (int64_t d = 0; d < D; ++d) REQUIRE(std::abs(full[size_t(t * D + d)] - r[size_t(d)]) <= 1e-5 * mx);
  }
  // Expert-range shards [0,2) [2,5) [5,6) and width shards [0,3) [3,7) each sum to the full result
  // (fp32 reassociation of a few terms: 1e-6 of the max magnitude).
  double fmax = 0;
  for (float v : full) fmax = std::max(fmax, double(std::abs(v)));
  std::vector<float> parts(size_t(T * D), 0.f);
  for (auto r : {std::pair<int64_t, int64_t>{0, 2}, {2, 5}, {5, 6}}) {
    std::vector<float> sh(size_t(T * D), 0.f);
    moe_experts_acc(ex, x.data(), T, D, idx, w, k, r.first, r.second, sh.data());
    for (size_t i = 0; i < sh.size(); ++i) parts[i] += sh[i];
  }
  for (size_t i = 0; i < parts.size(); ++i) REQUIRE(std::abs(parts[i] - full[i]) <= 1e-6 * fmax);
  std::vector<float> wparts(size_t(T * D), 0.f);
  for (auto r : {std::pair<int64_t, int64_t>{0, 3}, {3, 7}}) {
    std::vector<SwigluView> sl;
    for (const auto& v : ex) sl.push_back(v.slice(r.first, r.second, D));
    std::vector<float> sh(size_t(T * D), 0.f);
    moe_experts_acc(sl, x.data(), T, D, idx, w, k, 0, E, sh.data());
    for (size_t i = 0; i < sh.size(); ++i) wparts[i] += sh[i];
  }
  for (size_t i = 0; i < wparts.size(); ++i) REQUIRE(std::abs(wparts[i] - full[i]) <= 2e-6 * fmax);
  // Per-token results do not depend on the batch: token 3 alone gives the same bits.
  std::vector<float> one(size_t(D), 0.f);
  moe_experts_acc(ex, x.data() + 3 * D, 1, D, idx + 3 * k, w + 3 * k, k, 0, E, one.data());
  for (int64_t d = 0; d < D; ++d) REQUIRE(one[size_t(d)] == full[size_t(3 * D + d)]);
}

// ------------------------------------------------------------------------------------------------
// FFN modules on generated checkpoints vs an fp64 straight-line computation from the same tensors.

namespace {
ModelConfig moe_cfg(Family f) {
  ModelConfig c;
  c.family = f;
  c.hidden_size = 19;
  c.intermediate_size = 11;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 3;
  c.moe_intermediate_size = 5;
  if (f == Family::Qwen3Next) {
    c.score_func = ScoreFunc::Softmax;
    c.shared_intermediate_size = 9;
    c.shared_expert_gate = true;
    c.norm_topk_prob = true;
  } else {
    c.score_func = ScoreFunc::Sigmoid;
    c.router_correction_bias = true;
    c.n_shared_experts = 2;  // shared width 2 * 5
    c.routed_scaling_factor = 2.5f;
    c.n_group = 4;
    c.topk_group = 2;
  }
  return c;
}

const Tensor& T_(const std::map<std::string, Tensor>& m, const std::string& n) {
  auto it = m.find(n);
  REQUIRE(it != m.end());
  return it->second;
}

// fp64 MoE output of one token from named tensors (per-expert layout names).
std::vector<double> ref_moe(const ModelConfig& c, const std::map<std::string, Tensor>& m, const std::string& P,
                            const std::string& shared, bool w123, const float* x) {
  const int64_t D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const Tensor& R = T_(m, P + "gate.weight");
  std::vector<double> lg(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t d = 0; d < D; ++d) lg[size_t(e)] += double(x[d]) * R[e * D + d];
  RouterConfig rc = router(E, c.num_experts_per_tok, c.score_func, c.n_group, c.topk_group, c.norm_topk_prob,
                           c.routed_scaling_factor, c.router_correction_bias ? GroupScore::Top2Sum : GroupScore::Max);
  auto sel = ref_select(rc, lg, c.router_correction_bias ? T_(m, P + "gate.e_score_correction_bias").ptr() : nullptr);
  std::vector<double> y(static_cast<size_t>(D), 0.0);
  for (auto& kv : sel) {
    const std::string q = P + "experts." + std::to_string(kv.first) + ".";
    auto ye = ref_swiglu(x, T_(m, q + (w123 ? "w1.weight" : "gate_proj.weight")).ptr(),
                         T_(m, q + (w123 ? "w3.weight" : "up_proj.weight")).ptr(),
                         T_(m, q + (w123 ? "w2.weight" : "down_proj.weight")).ptr(), D, I, I);
    for (int64_t d = 0; d < D; ++d) y[size_t(d)] += kv.second * ye[size_t(d)];
  }
  const int64_t S = c.shared_intermediate_size > 0 ? c.shared_intermediate_size : c.n_shared_experts * I;
  auto ys = ref_swiglu(x, T_(m, P + shared + "gate_proj.weight").ptr(), T_(m, P + shared + "up_proj.weight").ptr(),
                       T_(m, P + shared + "down_proj.weight").ptr(), D, S, S);
  double gate = 1.0;
  if (c.shared_expert_gate) {
    double z = 0;
    for (int64_t d = 0; d < D; ++d) z += double(x[d]) * T_(m, P + "shared_expert_gate.weight")[d];
    gate = sig64(z);
  }
  for (int64_t d = 0; d < D; ++d) y[size_t(d)] += gate * ys[size_t(d)];
  return y;
}

void check_close(const std::vector<float>& got, const std::vector<std::vector<double>>& ref, int64_t D) {
  // fp32 GEMVs over D = 19 / I <= 11 terms and a handful of adds: 1e-5 of the row's max magnitude.
  for (size_t t = 0; t < ref.size(); ++t) {
    double mx = 0;
    for (double v : ref[t]) mx = std::max(mx, std::abs(v));
    REQUIRE(mx > 0);
    for (int64_t d = 0; d < D; ++d) REQUIRE(std::abs(got[t * size_t(D) + size_t(d)] - ref[t][size_t(d)]) <= 1e-5 * mx);
  }
}

std::set<std::string> keys(const std::map<std::string, Tensor>& m) {
  std::set<std::string> s;
  for (const auto& kv : m) s.insert(kv.first);
  return s;
}

std::string tmpdir(const std::string& tag) {
  char buf[] = "/tmp/dz_test_moe_XXXXXX";
  const char* d = mkdtemp(buf);
  REQUIRE(d != nullptr);
  return std::string(d) + "/" + tag;
}
}  // namespace

TEST_CASE("moe: FFN modules write the published names and match fp64 per family", "[unit]") {
  const std::string L = "model.layers.1.";
  std::mt19937 g(23);
  const int64_t T = 5, D = 19;
  auto x = randv(size_t(T * D), g);
  for (Family f : {Family::KimiLinear, Family::Dayzero, Family::DeepseekV32, Family::Qwen3Next}) {
    ModelConfig c = moe_cfg(f);
    auto ck = Checkpoint::random(7);
    auto ffn = make_moe_ffn(c, 1, *ck, L);
    const bool kimi = f == Family::KimiLinear || f == Family::Dayzero;
    const std::string P = L + (kimi ? "block_sparse_moe." : "mlp.");
    const std::string sh = f == Family::Qwen3Next ? "shared_expert." : "shared_experts.";
    std::set<std::string> want{P + "gate.weight", P + sh + "gate_proj.weight", P + sh + "up_proj.weight",
                               P + sh + "down_proj.weight"};
    for (int e = 0; e < 8; ++e)
      for (const char* n : kimi ? std::vector<const char*>{"w1", "w2", "w3"}
                                : std::vector<const char*>{"gate_proj", "up_proj", "down_proj"})
        want.insert(P + "experts." + std::to_string(e) + "." + n + ".weight");
    if (f == Family::Qwen3Next)
      want.insert(P + "shared_expert_gate.weight");
    else
      want.insert(P + "gate.e_score_correction_bias");
    REQUIRE(keys(ck->generated()) == want);

    std::vector<float> out(size_t(T * D));
    ffn->forward(x.data(), T, out.data());
    std::vector<std::vector<double>> ref;
    for (int64_t t = 0; t < T; ++t) ref.push_back(ref_moe(c, ck->generated(), P, sh, kimi, x.data() + t * D));
    check_close(out, ref, D);
  }
}

// Expert parallelism (--ep) inside one process: each shard holds E / ep experts whole (and, under
// TP, its width shard of the shared expert); with no peers to all-reduce over, the shards' outputs
// must add up to the whole FFN's. Shards over TP ranks (members 1) and over CP members (TP 1: only
// member 0 adds the shared expert, the members' sum adds the routed partials). fp32: the same terms
// summed in another order, 1e-5 of the row's largest value.
TEST_CASE("moe: expert-parallel shards add up to the whole FFN", "[unit]") {
  const std::string L = "model.layers.1.";
  std::mt19937 g(31);
  const int64_t T = 6, D = 19;
  auto x = randv(size_t(T * D), g);
  for (Family f : {Family::KimiLinear, Family::Dayzero, Family::DeepseekV32, Family::Qwen3Next}) {
    const ModelConfig c = moe_cfg(f);
    auto ck = Checkpoint::random(7);
    std::vector<float> whole(size_t(T * D));
    make_moe_ffn(c, 1, *ck, L)->forward(x.data(), T, whole.data());
    const std::string dir = tmpdir("ep");  // (a generating checkpoint keeps full widths: shards read files)
    write_safetensors(dir, ck->generated(), DType::F32);
    struct Layout {
      int ep, tp, members;
    };
    std::vector<Layout> layouts = {{2, 1, 2}, {4, 1, 4}, {8, 1, 8}};
    if (f != Family::Qwen3Next) layouts.push_back({2, 2, 1}), layouts.push_back({4, 2, 2});  // (Qwen's shared 9: TP 1)
    for (const Layout& l : layouts) {
      std::vector<float> sum(size_t(T * D), 0.f), part(size_t(T * D));
      for (int r = 0; r < l.ep; ++r) {
        TpShard tp{r % l.tp, l.tp, nullptr, nullptr, EpShard{l.ep, r / l.tp, l.members, nullptr}};
        auto ck_r = Checkpoint::open(dir);
        make_moe_ffn(c, 1, *ck_r, L, tp)->forward(x.data(), T, part.data());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
      INFO("family " << int(f) << " ep " << l.ep << " tp " << l.tp);
      for (int64_t t = 0; t < T; ++t) {
        float mx = 0;
        for (int64_t d = 0; d < D; ++d) mx = std::max(mx, std::abs(whole[size_t(t * D + d)]));
        for (int64_t d = 0; d < D; ++d) REQUIRE(std::abs(sum[size_t(t * D + d)] - whole[size_t(t * D + d)]) <= 1e-5f * mx);
      }
    }
    // An expert count that --ep does not divide is refused by name.
    auto ck3 = Checkpoint::open(dir);
    REQUIRE_THROWS_WITH(make_moe_ffn(c, 1, *ck3, L, TpShard{0, 1, nullptr, nullptr, EpShard{3, 0, 3, nullptr}}),
                        Catch::Contains("not divisible by --ep 3"));
  }
}

// Routing once (Backend::moe_route), then the experts with those ids and weights given
// (MoeWeights::fixed_wt, what expert parallelism runs on received rows): the same bits as moe().
TEST_CASE("moe: moe_route then fixed experts and weights equal moe()", "[unit]") {
  const std::string L = "model.layers.1.";
  std::mt19937 g(32);
  const int64_t T = 7, D = 19, k = 3;
  auto x = randv(size_t(T * D), g);
  for (Family f : {Family::DeepseekV32, Family::Qwen3Next}) {
    const ModelConfig c = moe_cfg(f);
    RouterConfig rc;
    rc.n_experts = 8, rc.top_k = k, rc.score_func = c.score_func, rc.norm_topk_prob = c.norm_topk_prob;
    rc.routed_scaling_factor = c.routed_scaling_factor, rc.n_group = std::max<int64_t>(c.n_group, 1);
    rc.topk_group = std::max<int64_t>(c.topk_group, 1);
    Backend& be = cpu_backend();
    std::mt19937 gw(5);
    MoeWeights w;
    auto router = randv(size_t(8 * D), gw, 0.3f);
    w.router = host_view(router.data(), {8, D});
    std::vector<float> gt = randv(size_t(8 * 5 * D), gw, 0.2f), up = randv(size_t(8 * 5 * D), gw, 0.2f),
                       dn = randv(size_t(8 * D * 5), gw, 0.2f);
    w.experts = {host_view(gt.data(), {8, 5, D}), host_view(up.data(), {8, 5, D}), host_view(dn.data(), {8, D, 5}),
                 GluAct{}};
    std::vector<float> a(size_t(T * D)), b(size_t(T * D)), wt(size_t(T * k));
    std::vector<int32_t> idx(size_t(T * k));
    be.moe(rc, w, host_view(x.data(), {T, D}), host_view(a.data(), {T, D}));
    be.moe_route(rc, w, host_view(x.data(), {T, D}), host_view(idx.data(), {T, k}), host_view(wt.data(), {T, k}));
    MoeWeights wf = w;
    wf.fixed = host_view(idx.data(), {T, k});
    wf.fixed_wt = host_view(wt.data(), {T, k});
    wf.router = DTensor{};  // no router runs
    be.moe(rc, wf, host_view(x.data(), {T, D}), host_view(b.data(), {T, D}));
    REQUIRE(a == b);
    // The experts [4, 8) alone (e0 = 4) plus [0, 4): the whole sum.
    MoeWeights lo = wf, hi = wf;
    lo.experts = {host_view(gt.data(), {4, 5, D}), host_view(up.data(), {4, 5, D}), host_view(dn.data(), {4, D, 5}),
                  GluAct{}};
    hi.experts = {host_view(gt.data() + 4 * 5 * D, {4, 5, D}), host_view(up.data() + 4 * 5 * D, {4, 5, D}),
                  host_view(dn.data() + 4 * D * 5, {4, D, 5}), GluAct{}};
    hi.e0 = 4;
    std::vector<float> pl(size_t(T * D)), ph(size_t(T * D));
    be.moe(rc, lo, host_view(x.data(), {T, D}), host_view(pl.data(), {T, D}));
    be.moe(rc, hi, host_view(x.data(), {T, D}), host_view(ph.data(), {T, D}));
    for (size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(pl[i] + ph[i] - a[i]) <= 1e-5f * (1.f + std::abs(a[i])));
  }
}

TEST_CASE("moe: kimi FFN loads the transformers fused layout and gives the same bits", "[unit]") {
  const std::string L = "model.layers.2.";
  ModelConfig c = moe_cfg(Family::KimiLinear);
  const int64_t D = 19, E = 8, I = 5, T = 3;
  auto gen = Checkpoint::random(11);
  auto ref_ffn = make_moe_ffn(c, 2, *gen, L);
  const auto& m = gen->generated();
  // Rewrite as mlp.gate.*, mlp.experts.gate_up_proj [E, 2I, D], mlp.experts.down_proj [E, D, I].
  std::map<std::string, Tensor> fused;
  const std::string B = L + "block_sparse_moe.", M = L + "mlp.";
  Tensor gu({E, 2 * I, D}), dn({E, D, I});
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = B + "experts." + std::to_string(e) + ".";
    std::copy(T_(m, q + "w1.weight").data.begin(), T_(m, q + "w1.weight").data.end(), gu.ptr() + e * 2 * I * D);
    std::copy(T_(m, q + "w3.weight").data.begin(), T_(m, q + "w3.weight").data.end(), gu.ptr() + (e * 2 + 1) * I * D);
    std::copy(T_(m, q + "w2.weight").data.begin(), T_(m, q + "w2.weight").data.end(), dn.ptr() + e * D * I);
  }
  fused[M + "experts.gate_up_proj"] = gu;
  fused[M + "experts.down_proj"] = dn;
  for (const char* n : {"gate.weight", "gate.e_score_correction_bias", "shared_experts.gate_proj.weight",
                        "shared_experts.up_proj.weight", "shared_experts.down_proj.weight"})
    fused[M + n] = T_(m, B + n);
  const std::string dir = tmpdir("fused");
  write_safetensors(dir, fused, DType::F32);
  auto ck = Checkpoint::open(dir);
  auto ffn = make_moe_ffn(c, 2, *ck, L);
  REQUIRE_NOTHROW(ck->check_all_used());

  std::mt19937 g(24);
  auto x = randv(size_t(T * D), g);
  std::vector<float> a(size_t(T * D)), b(size_t(T * D));
  ref_ffn->forward(x.data(), T, a.data());
  ffn->forward(x.data(), T, b.data());
  REQUIRE(a == b);

  // The published per-expert layout read back from disk: same bits again, and strictness.
  const std::string dir2 = tmpdir("published");
  write_safetensors(dir2, m, DType::F32);
  auto ck2 = Checkpoint::open(dir2);
  auto ffn2 = make_moe_ffn(c, 2, *ck2, L);
  REQUIRE_NOTHROW(ck2->check_all_used());
  ffn2->forward(x.data(), T, b.data());
  REQUIRE(a == b);

  auto broken = m;
  broken.erase(B + "experts.5.w3.weight");
  const std::string dir3 = tmpdir("broken");
  write_safetensors(dir3, broken, DType::F32);
  auto ck3 = Checkpoint::open(dir3);
  REQUIRE_THROWS_WITH(make_moe_ffn(c, 2, *ck3, L), Catch::Contains("experts.5.w3.weight"));
}

// Dense MLP: names and fp64 check (same tolerance argument as the MoE modules).
TEST_CASE("moe: dense MLP FFN matches fp64", "[unit]") {
  ModelConfig c = moe_cfg(Family::DeepseekV32);
  const int64_t D = 19, I = 11, T = 4;
  auto ck = Checkpoint::random(5);
  auto ffn = make_mlp_ffn(c, 0, *ck, "model.layers.0.");
  const auto& m = ck->generated();
  REQUIRE(keys(m) == std::set<std::string>{"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                                           "model.layers.0.mlp.down_proj.weight"});
  std::mt19937 g(25);
  auto x = randv(size_t(T * D), g);
  std::vector<float> out(size_t(T * D));
  ffn->forward(x.data(), T, out.data());
  std::vector<std::vector<double>> ref;
  for (int64_t t = 0; t < T; ++t)
    ref.push_back(ref_swiglu(x.data() + t * D, T_(m, "model.layers.0.mlp.gate_proj.weight").ptr(),
                             T_(m, "model.layers.0.mlp.up_proj.weight").ptr(),
                             T_(m, "model.layers.0.mlp.down_proj.weight").ptr(), D, I, I));
  check_close(out, ref, D);
  c.hidden_act = "gelu";
  REQUIRE_THROWS(make_mlp_ffn(c, 0, *ck, "model.layers.0."));
}
