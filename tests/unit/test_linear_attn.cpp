// Linear attention ops: recurrent vs. an fp64 straight-line reference, chunked vs. recurrent,
// state carry-over, gates, segment transitions, short conv.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ops/linear_attn.hpp"
#include "ops/short_conv.hpp"

namespace {

using Vec = std::vector<float>;

struct LaCase {
  int64_t T, HK, HV, K, V;
  bool per_channel;
  Vec q, k, v, g, beta, S0;  // q, k L2-normalised; S0 [HV, K, V]
};

LaCase make_case(int64_t T, int64_t HK, int64_t HV, int64_t K, int64_t V, bool per_channel, uint32_t seed,
                 float min_log_decay = -1.5f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  LaCase c{T, HK, HV, K, V, per_channel, {}, {}, {}, {}, {}, {}};
  auto normed = [&](Vec& x, int64_t rows) {
    x.resize(size_t(rows * K));
    for (auto& e : x) e = nd(rng);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < K; ++i) s += double(x[size_t(r * K + i)]) * x[size_t(r * K + i)];
      for (int64_t i = 0; i < K; ++i) x[size_t(r * K + i)] = float(x[size_t(r * K + i)] / std::sqrt(s + 1e-6));
    }
  };
  normed(c.q, T * HK);
  normed(c.k, T * HK);
  c.v.resize(size_t(T * HV * V));
  for (auto& e : c.v) e = nd(rng);
  c.g.resize(size_t(T * HV * (per_channel ? K : 1)));
  // log-decays in [min, 0], a quarter of them very close to 0 (slow channels)
  for (auto& e : c.g) e = ud(rng) < 0.25f ? -0.01f * ud(rng) : min_log_decay * ud(rng);
  c.beta.resize(size_t(T * HV));
  for (auto& e : c.beta) e = ud(rng);
  c.S0.resize(size_t(HV * K * V));
  for (auto& e : c.S0) e = 0.5f * nd(rng);
  return c;
}

// fp64 token-by-token recurrence written from the formula (see linear_attn.hpp), independent of the
// fp32 code: o_t = S_t^T (scale q_t), S_t = D_t S + beta k (v - (D_t S)^T k)^T.
void ref_recurrent(const LaCase& c, float scale, bool with_s0, std::vector<double>& o, std::vector<double>& S) {
  const int64_t K = c.K, V = c.V, r = c.HV / c.HK, GK = c.per_channel ? K : 1;
  S.assign(size_t(c.HV * K * V), 0.0);
  if (with_s0)
    for (size_t i = 0; i < S.size(); ++i) S[i] = c.S0[i];
  o.assign(size_t(c.T * c.HV * V), 0.0);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.HV; ++h) {
      double* s = S.data() + h * K * V;
      const float* kt = c.k.data() + (t * c.HK + h / r) * K;
      const float* qt = c.q.data() + (t * c.HK + h / r) * K;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) s[i * V + j] *= std::exp(double(c.g[size_t((t * c.HV + h) * GK + (GK > 1 ? i : 0))]));
      for (int64_t j = 0; j < V; ++j) {
        double pred = 0;
        for (int64_t i = 0; i < K; ++i) pred += kt[i] * s[i * V + j];
        const double u = c.beta[size_t(t * c.HV + h)] * (c.v[size_t((t * c.HV + h) * V + j)] - pred);
        for (int64_t i = 0; i < K; ++i) s[i * V + j] += kt[i] * u;
      }
      for (int64_t j = 0; j < V; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < K; ++i) acc += double(scale) * qt[i] * s[i * V + j];
        o[size_t((t * c.HV + h) * V + j)] = acc;
      }
    }
}

template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}
template <class A>
double max_abs(const A& a) {
  double m = 0;
  for (auto x : a) m = std::max(m, std::abs(double(x)));
  return m;
}

void run_chunked(bool per_channel, const float* q, const float* k, const float* v, const float* g, const float* b,
                 int64_t T, int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* S, float* o) {
  if (per_channel)
    dz::kda_chunked(q, k, v, g, b, T, HK, HV, K, V, scale, S, o);
  else
    dz::gdn_chunked(q, k, v, g, b, T, HK, HV, K, V, scale, S, o);
}
// Runs the op (kda/gdn × recurrent/chunked) over the whole case.
void run_op(const LaCase& c, bool chunk, float scale, bool with_s0, Vec& o, Vec& S) {
  S.assign(size_t(c.HV * c.K * c.V), 0.f);
  if (with_s0) S = c.S0;
  o.assign(size_t(c.T * c.HV * c.V), 0.f);
  if (chunk)
    run_chunked(c.per_channel, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.HK, c.HV, c.K,
                c.V, scale, S.data(), o.data());
  else if (c.per_channel)
    dz::kda_recurrent(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.HK, c.HV, c.K, c.V, scale,
                      S.data(), o.data());
  else
    dz::gdn_recurrent(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.HK, c.HV, c.K, c.V, scale,
                      S.data(), o.data());
}

}  // namespace

// fp32 vs fp64 of the same recurrence: q, k unit vectors and beta in (0, 1) keep |S| = O(1), so
// rounding grows at most linearly in T: 2e-5 absolute over T <= 200 is ~100 ulps of an O(1) value.
TEST_CASE("linear_attn: recurrent forms match an fp64 reference", "[unit]") {
  for (bool per_channel : {true, false})
    for (auto T : {int64_t(1), int64_t(7), int64_t(200)})
      for (bool with_s0 : {false, true}) {
        const int64_t HK = per_channel ? 3 : 2, HV = per_channel ? 3 : 6;
        LaCase c = make_case(T, HK, HV, 19, 13, per_channel, uint32_t(100 + T));
        const float scale = 1.f / std::sqrt(19.f);
        Vec o, S;
        run_op(c, false, scale, with_s0, o, S);
        std::vector<double> ro, rS;
        ref_recurrent(c, scale, with_s0, ro, rS);
        INFO("per_channel=" << per_channel << " T=" << T << " s0=" << with_s0);
        CHECK(max_abs(ro) > 0.05);  // the outputs are not trivially small
        CHECK(max_abs_diff(o, ro) < 2e-5);
        CHECK(max_abs_diff(S, rS) < 2e-5);
      }
}

// Chunked (UT transform) vs recurrent: a different algorithm for the same map; both fp32, errors
// of the order of the fp64 check above. T covers 1, < 64, = 64, 64 + 1 and several chunks + tail.
TEST_CASE("linear_attn: chunked forms equal the recurrent forms", "[unit]") {
  for (bool per_channel : {true, false})
    for (auto T : {int64_t(1), int64_t(3), int64_t(63), int64_t(64), int64_t(65), int64_t(150)})
      for (bool with_s0 : {false, true}) {
        const int64_t HK = per_channel ? 2 : 1, HV = per_channel ? 2 : 3;
        LaCase c = make_case(T, HK, HV, 16, 9, per_channel, uint32_t(7 * T + per_channel));
        Vec o_r, S_r, o_c, S_c;
        run_op(c, false, 0.25f, with_s0, o_r, S_r);
        run_op(c, true, 0.25f, with_s0, o_c, S_c);
        INFO("per_channel=" << per_channel << " T=" << T << " s0=" << with_s0);
        CHECK(max_abs(o_r) > 0.01);
        CHECK(max_abs_diff(o_c, o_r) < 2e-5);
        CHECK(max_abs_diff(S_c, S_r) < 2e-5);
      }
}

// Strong decay (log-decay down to -8 per step, cumulative exp underflows inside a chunk): the
// chunked form only forms exp(G_i - G_j) with j <= i, so it stays finite and equal.
TEST_CASE("linear_attn: chunked KDA is stable under strong decay", "[unit]") {
  LaCase c = make_case(130, 2, 2, 8, 5, true, 99, -8.f);
  Vec o_r, S_r, o_c, S_c;
  run_op(c, false, 0.3f, true, o_r, S_r);
  run_op(c, true, 0.3f, true, o_c, S_c);
  for (float x : o_c) REQUIRE(std::isfinite(x));
  CHECK(max_abs_diff(o_c, o_r) < 2e-5);
  CHECK(max_abs_diff(S_c, S_r) < 2e-5);
}

// Prefill then decode with the carried state == one call over everything (chunked prefill of 100,
// then 1-token recurrent steps, then a chunked 70-token call), against one recurrent run.
TEST_CASE("linear_attn: state carries across calls", "[unit]") {
  for (bool per_channel : {true, false}) {
    LaCase c = make_case(175, 1, 2, 12, 7, per_channel, 5);
    Vec o_all, S_all;
    run_op(c, false, 0.3f, true, o_all, S_all);
    Vec S = c.S0, o(o_all.size(), 0.f);
    const int64_t GK = per_channel ? c.K : 1;
    auto call = [&](int64_t t0, int64_t n, bool chunk) {
      const float* q = c.q.data() + t0 * c.HK * c.K;
      const float* k = c.k.data() + t0 * c.HK * c.K;
      const float* v = c.v.data() + t0 * c.HV * c.V;
      const float* g = c.g.data() + t0 * c.HV * GK;
      const float* b = c.beta.data() + t0 * c.HV;
      float* op = o.data() + t0 * c.HV * c.V;
      if (chunk)
        run_chunked(per_channel, q, k, v, g, b, n, c.HK, c.HV, c.K, c.V, 0.3f, S.data(), op);
      else if (per_channel)
        dz::kda_recurrent(q, k, v, g, b, n, c.HK, c.HV, c.K, c.V, 0.3f, S.data(), op);
      else
        dz::gdn_recurrent(q, k, v, g, b, n, c.HK, c.HV, c.K, c.V, 0.3f, S.data(), op);
    };
    call(0, 100, true);
    for (int64_t t = 100; t < 105; ++t) call(t, 1, false);
    call(105, 70, true);
    INFO("per_channel=" << per_channel);
    CHECK(max_abs_diff(o, o_all) < 2e-5);
    CHECK(max_abs_diff(S, S_all) < 2e-5);
  }
}

// Gates against the formulas evaluated in fp64 (fla naive_kda_gate / naive_kda_lowerbound_gate;
// softplus with torch's threshold 20). 1e-6 relative: a few fp32 roundings of O(1..50) values.
TEST_CASE("linear_attn: KDA gate forms", "[unit]") {
  const int64_t T = 5, H = 3, K = 7;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 3.f);
  Vec f(size_t(T * H * K)), A_log(static_cast<size_t>(H)), dt(size_t(H * K)), g1(f.size()), g2(f.size()), g3(f.size());
  for (auto& x : f) x = nd(rng);
  f[0] = 25.f;  // above the softplus threshold
  for (int64_t h = 0; h < H; ++h) A_log[size_t(h)] = std::log(1.f + 5.f * float(h));
  for (auto& x : dt) x = 0.3f * nd(rng);
  dz::kda_gate_softplus(f.data(), A_log.data(), dt.data(), T, H, K, g1.data());
  dz::kda_gate_lower_bound(f.data(), A_log.data(), dt.data(), -5.f, T, H, K, g2.data());
  dz::kda_gate_lower_bound(f.data(), nullptr, nullptr, -3.f, T, H, K, g3.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < K; ++x) {
        const size_t i = size_t((t * H + h) * K + x), c = size_t(h * K + x);
        const double z = double(f[i]) + dt[c], a = std::exp(double(A_log[size_t(h)]));
        const double sp = z > 20 ? z : std::log1p(std::exp(z));
        const double e1 = -a * sp, e2 = -5.0 / (1.0 + std::exp(-a * z)), e3 = -3.0 / (1.0 + std::exp(-double(f[i])));
        CHECK(std::abs(g1[i] - e1) <= 1e-6 * std::max(1.0, std::abs(e1)));
        CHECK(std::abs(g2[i] - e2) <= 1e-6 * std::max(1.0, std::abs(e2)));
        CHECK(std::abs(g3[i] - e3) <= 1e-6 * std::max(1.0, std::abs(e3)));
        CHECK(g1[i] <= 0.f);
        CHECK((g2[i] < 0.f && g2[i] >= -5.f));
      }
}

// Segment transition: A·S0 + B equals running the recurrence from S0; merging the transitions of
// two consecutive segments equals the transition of their concatenation (fp32 vs fp32, 2e-5 as above).
TEST_CASE("linear_attn: segment transitions", "[unit]") {
  for (bool per_channel : {true, false}) {
    const int64_t T1 = 70, T2 = 33;
    LaCase c = make_case(T1 + T2, 2, per_channel ? 2 : 4, 10, 6, per_channel, 11);
    const int64_t GK = per_channel ? c.K : 1;
    auto tr_of = [&](int64_t t0, int64_t n) {
      const float* k = c.k.data() + t0 * c.HK * c.K;
      const float* v = c.v.data() + t0 * c.HV * c.V;
      const float* g = c.g.data() + t0 * c.HV * GK;
      const float* b = c.beta.data() + t0 * c.HV;
      return per_channel ? dz::kda_transition(k, v, g, b, n, c.HK, c.HV, c.K, c.V)
                         : dz::gdn_transition(k, v, g, b, n, c.HK, c.HV, c.K, c.V);
    };
    Vec o, S_ref;
    run_op(c, false, 0.3f, true, o, S_ref);
    const dz::LaTransition whole = tr_of(0, T1 + T2);
    Vec S(S_ref.size());
    dz::la_transition_apply(whole, c.S0.data(), S.data());
    INFO("per_channel=" << per_channel);
    CHECK(max_abs(S_ref) > 0.1);
    CHECK(max_abs_diff(S, S_ref) < 2e-5);
    const dz::LaTransition merged = dz::la_transition_merge(tr_of(0, T1), tr_of(T1, T2));
    dz::la_transition_apply(merged, c.S0.data(), S.data());
    CHECK(max_abs_diff(S, S_ref) < 2e-5);
    CHECK(max_abs_diff(merged.A, whole.A) < 2e-5);
    // an empty segment is the identity
    const dz::LaTransition empty = tr_of(0, 0);
    dz::la_transition_apply(empty, c.S0.data(), S.data());
    CHECK(max_abs_diff(S, c.S0) == 0.0);
  }
}

// Short conv: fp64 straight convolution with zero left padding; chunked calls bit-identical to one call.
TEST_CASE("linear_attn: short conv streams and matches fp64", "[unit]") {
  for (int64_t W : {int64_t(1), int64_t(4)})
    for (bool with_bias : {false, true}) {
      const int64_t T = 37, C = 19;
      std::mt19937 rng(uint32_t(W * 10 + with_bias));
      std::normal_distribution<float> nd(0.f, 1.f);
      Vec x(size_t(T * C)), w(size_t(C * W)), b(static_cast<size_t>(C));
      for (auto& e : x) e = nd(rng);
      for (auto& e : w) e = nd(rng);
      for (auto& e : b) e = nd(rng);
      const float* bp = with_bias ? b.data() : nullptr;
      Vec y1(x.size()), st1(size_t((W - 1) * C), 0.f);
      dz::short_conv_silu(x.data(), w.data(), bp, T, C, W, st1.data(), y1.data());
      Vec y2(x.size()), st2(size_t((W - 1) * C), 0.f);
      int64_t t0 = 0;
      for (int64_t n : {int64_t(1), int64_t(2), int64_t(1), int64_t(20), int64_t(13)}) {
        dz::short_conv_silu(x.data() + t0 * C, w.data(), bp, n, C, W, st2.data(), y2.data() + t0 * C);
        t0 += n;
      }
      REQUIRE(t0 == T);
      CHECK(max_abs_diff(y1, y2) == 0.0);
      CHECK(max_abs_diff(st1, st2) == 0.0);
      // fp64 reference; 1e-5: W-term fp32 sums of O(1) products
      double m = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) {
          double acc = with_bias ? b[size_t(c)] : 0.0;
          for (int64_t j = 0; j < W; ++j) {
            const int64_t s = t - (W - 1) + j;
            if (s >= 0) acc += double(w[size_t(c * W + j)]) * x[size_t(s * C + c)];
          }
          const double ref = acc / (1.0 + std::exp(-acc));
          m = std::max(m, std::abs(ref - y1[size_t(t * C + c)]));
        }
      CHECK(m < 1e-5);
      for (int64_t r = 0; r < W - 1; ++r)
        for (int64_t c = 0; c < C; ++c) CHECK(st1[size_t(r * C + c)] == x[size_t((T - (W - 1) + r) * C + c)]);
    }
}
