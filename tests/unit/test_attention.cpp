// Softmax attention core, absorbed MLA, DSA indexer scores and Top-K, each against an fp64 naive
// loop or a different algorithm (full stable sort for Top-K).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/attention.hpp"
#include "ops/indexer.hpp"

using namespace dz;

namespace {

std::vector<float> randn(size_t n, std::mt19937& g, float std = 1.f) {
  std::normal_distribution<float> d(0.f, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// fp64 attention for one (query, head) over an explicit key set; keys visited as a set.
void naive_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                     std::vector<double>& out, int64_t T, int64_t pos0, int64_t Hq, int64_t Hkv, int64_t Dk,
                     int64_t Dv, double scale, const std::vector<std::vector<char>>& allowed) {
  // allowed[t][s]: key s visible to query t
  out.assign(size_t(T * Hq * Dv), 0.0);
  const int64_t group = Hq / Hkv;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / group;
      std::vector<double> sc;
      std::vector<int64_t> ks;
      for (int64_t s = 0; s <= pos0 + t; ++s) {
        if (!allowed[size_t(t)][size_t(s)]) continue;
        double d = 0;
        for (int64_t i = 0; i < Dk; ++i) d += double(q[size_t((t * Hq + h) * Dk + i)]) * k[size_t((s * Hkv + kh) * Dk + i)];
        sc.push_back(d * scale);
        ks.push_back(s);
      }
      if (ks.empty()) continue;
      double m = *std::max_element(sc.begin(), sc.end()), z = 0;
      for (auto& x : sc) z += (x = std::exp(x - m));
      for (size_t i = 0; i < ks.size(); ++i)
        for (int64_t d = 0; d < Dv; ++d)
          out[size_t((t * Hq + h) * Dv + d)] += sc[i] / z * v[size_t((ks[i] * Hkv + kh) * Dv + d)];
    }
}

std::vector<std::vector<char>> causal_allowed(int64_t T, int64_t pos0, int64_t S) {
  std::vector<std::vector<char>> a(size_t(T), std::vector<char>(size_t(S), 0));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s <= pos0 + t; ++s) a[size_t(t)][size_t(s)] = 1;
  return a;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("attention: dense causal GQA matches fp64 naive", "[unit]") {
  struct Case { int64_t T, pos0, Hq, Hkv, Dk, Dv; };
  // Odd shapes: decode (T=1), prefill from 0, continuation, GQA groups of 1 / 3 / 7.
  for (Case c : {Case{1, 0, 1, 1, 1, 1}, Case{7, 0, 3, 3, 19, 7}, Case{5, 13, 6, 2, 19, 3}, Case{1, 64, 7, 1, 65, 5},
                 Case{19, 3, 4, 4, 8, 19}}) {
    std::mt19937 g(uint32_t(c.T * 131 + c.pos0 * 7 + c.Hq));
    const int64_t S = c.pos0 + c.T + 2;  // cache rows past the last query must be ignored
    auto q = randn(size_t(c.T * c.Hq * c.Dk), g), k = randn(size_t(S * c.Hkv * c.Dk), g),
         v = randn(size_t(S * c.Hkv * c.Dv), g);
    // scale 1 (not 1/sqrt(Dk)) makes the softmax peaky, so a wrong key set or order shows.
    const float scale = 1.f;
    std::vector<float> out(size_t(c.T * c.Hq * c.Dv));
    causal_attention(q.data(), k.data(), v.data(), out.data(), c.T, c.pos0, S, c.Hq, c.Hkv, c.Dk, c.Dv, scale);
    std::vector<double> ref;
    naive_attention(q, k, v, ref, c.T, c.pos0, c.Hq, c.Hkv, c.Dk, c.Dv, scale, causal_allowed(c.T, c.pos0, S));
    // fp32 dots of up to 65 unit-variance terms (scores up to ~30): exp amplifies the score's
    // absolute rounding (~1e-5) into a relative weight error of the same size; outputs are O(1).
    INFO("T=" << c.T << " pos0=" << c.pos0 << " Hq=" << c.Hq << " Dk=" << c.Dk);
    CHECK(max_abs_diff(out, ref) < 5e-5);
  }
}

TEST_CASE("attention: sparse with every visible key selected equals dense", "[unit]") {
  std::mt19937 g(7);
  const int64_t T = 9, pos0 = 4, S = pos0 + T, Hq = 4, Hkv = 2, Dk = 19, Dv = 7, K = 17;
  auto q = randn(size_t(T * Hq * Dk), g), k = randn(size_t(S * Hkv * Dk), g), v = randn(size_t(S * Hkv * Dv), g);
  std::vector<float> dense(size_t(T * Hq * Dv)), sparse(dense.size()), shuffled(dense.size());
  causal_attention(q.data(), k.data(), v.data(), dense.data(), T, pos0, S, Hq, Hkv, Dk, Dv, 0.5f);

  // Ascending positions, -1 padded (what topk_positions emits): same keys, same order -> bitwise.
  std::vector<int32_t> sel(size_t(T * K), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s <= pos0 + t; ++s) sel[size_t(t * K + s)] = int32_t(s);
  causal_attention(q.data(), k.data(), v.data(), sparse.data(), T, pos0, S, Hq, Hkv, Dk, Dv, 0.5f, sel.data(), K);
  CHECK(sparse == dense);

  // Shuffled, with duplicates and future positions mixed in: still the causal set (as a mask),
  // only the summation order differs -> fp32 rounding only.
  const int64_t K2 = 2 * S;
  std::vector<int32_t> sel2(size_t(T * K2), -1);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> row;
    for (int64_t s = 0; s < S; ++s) row.push_back(int32_t(s));          // includes future keys
    for (int64_t s = 0; s <= pos0 + t; s += 2) row.push_back(int32_t(s)); // duplicates
    std::shuffle(row.begin(), row.end(), g);
    std::copy(row.begin(), row.end(), sel2.begin() + t * K2);
  }
  causal_attention(q.data(), k.data(), v.data(), shuffled.data(), T, pos0, S, Hq, Hkv, Dk, Dv, 0.5f, sel2.data(), K2);
  double m = 0;
  for (size_t i = 0; i < dense.size(); ++i) m = std::max(m, double(std::abs(dense[i] - shuffled[i])));
  CHECK(m < 1e-5);  // reordered fp32 sums of O(1) terms
}

TEST_CASE("attention: sparse random index sets match fp64 naive", "[unit]") {
  std::mt19937 g(11);
  const int64_t T = 13, pos0 = 20, S = pos0 + T, Hq = 6, Hkv = 3, Dk = 19, Dv = 5, K = 7;
  auto q = randn(size_t(T * Hq * Dk), g), k = randn(size_t(S * Hkv * Dk), g), v = randn(size_t(S * Hkv * Dv), g);
  std::vector<int32_t> sel(size_t(T * K));
  std::uniform_int_distribution<int32_t> pick(-1, int32_t(S + 2));  // -1 and future entries included
  for (auto& s : sel) s = pick(g);
  for (int64_t j = 0; j < K; ++j) sel[size_t(3 * K + j)] = -1;  // one query with nothing selected
  std::vector<std::vector<char>> allowed(size_t(T), std::vector<char>(size_t(S), 0));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      int32_t s = sel[size_t(t * K + j)];
      if (s >= 0 && s <= pos0 + t) allowed[size_t(t)][size_t(s)] = 1;
    }
  std::vector<float> out(size_t(T * Hq * Dv));
  causal_attention(q.data(), k.data(), v.data(), out.data(), T, pos0, S, Hq, Hkv, Dk, Dv, 0.7f, sel.data(), K);
  std::vector<double> ref;
  naive_attention(q, k, v, ref, T, pos0, Hq, Hkv, Dk, Dv, 0.7, allowed);
  CHECK(max_abs_diff(out, ref) < 3e-5);  // as the dense case: fp32 scores, peaky softmax
  for (int64_t i = 0; i < Hq * Dv; ++i) CHECK(out[size_t(3 * Hq * Dv + i)] == 0.f);  // empty selection -> 0
}

TEST_CASE("attention: absorbed MLA equals materialised per-head k/v in fp64", "[unit]") {
  for (int64_t rope : {int64_t(0), int64_t(4)}) {  // rope 0: Kimi-style NoPE dims
    std::mt19937 g(uint32_t(17 + rope));
    const int64_t T = 5, pos0 = 6, S = pos0 + T, H = 3, nope = 7, R = 11, vd = 5, Dq = nope + rope, K = 4;
    auto q = randn(size_t(T * H * Dq), g), lat = randn(size_t(S * R), g), kpe = randn(size_t(S * rope), g),
         wkv = randn(size_t(H * (nope + vd) * R), g, 0.3f);
    // Materialise in fp64, then run the fp64 naive attention on the materialised k / v.
    std::vector<float> kf(size_t(S * H * Dq)), vf(size_t(S * H * vd));
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < nope + vd; ++d) {
          double a = 0;
          for (int64_t r = 0; r < R; ++r) a += double(wkv[size_t((h * (nope + vd) + d) * R + r)]) * lat[size_t(s * R + r)];
          if (d < nope) kf[size_t((s * H + h) * Dq + d)] = float(a);
          else vf[size_t((s * H + h) * vd + d - nope)] = float(a);
        }
        for (int64_t d = 0; d < rope; ++d) kf[size_t((s * H + h) * Dq + nope + d)] = kpe[size_t(s * rope + d)];
      }
    for (bool sparse : {false, true}) {
      std::vector<int32_t> sel(size_t(T * K));
      std::uniform_int_distribution<int32_t> pick(-1, int32_t(S - 1));
      for (auto& s : sel) s = pick(g);
      auto allowed = causal_allowed(T, pos0, S);
      if (sparse)
        for (int64_t t = 0; t < T; ++t) {
          std::fill(allowed[size_t(t)].begin(), allowed[size_t(t)].end(), 0);
          for (int64_t j = 0; j < K; ++j) {
            int32_t s = sel[size_t(t * K + j)];
            if (s >= 0 && s <= pos0 + t) allowed[size_t(t)][size_t(s)] = 1;
          }
        }
      std::vector<float> out(size_t(T * H * vd));
      mla_attention_absorbed(q.data(), lat.data(), kpe.data(), wkv.data(), out.data(), T, pos0, S, H, nope, rope, R,
                             vd, 0.4f, sparse ? sel.data() : nullptr, sparse ? K : 0);
      std::vector<double> ref;
      naive_attention(q, kf, vf, ref, T, pos0, H, H, Dq, vd, 0.4, allowed);
      INFO("rope=" << rope << " sparse=" << sparse);
      // The materialised k / v are rounded to fp32 once; the absorbed path reassociates the
      // W_uk / W_uv products: fp32 rounding of O(5)-sized scores and outputs.
      CHECK(max_abs_diff(out, ref) < 1e-4);
    }
  }
}

TEST_CASE("indexer: layer_norm matches fp64", "[unit]") {
  std::mt19937 g(3);
  const int64_t rows = 3, D = 19;
  auto x = randn(size_t(rows * D), g, 2.f), w = randn(size_t(D), g), b = randn(size_t(D), g);
  for (auto& v : x) v += 3.f;  // non-zero mean must be removed
  std::vector<float> y(x.size());
  layer_norm(x.data(), w.data(), b.data(), y.data(), rows, D, 1e-6f);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < D; ++i) mean += x[size_t(r * D + i)];
    mean /= D;
    for (int64_t i = 0; i < D; ++i) var += std::pow(x[size_t(r * D + i)] - mean, 2);
    var /= D;
    for (int64_t i = 0; i < D; ++i) {
      double ref = (x[size_t(r * D + i)] - mean) / std::sqrt(var + 1e-6) * w[size_t(i)] + b[size_t(i)];
      CHECK(std::abs(y[size_t(r * D + i)] - ref) < 2e-5);  // fp32 mean/var of 19 values ~5
    }
  }
}

TEST_CASE("indexer: scores match fp64 naive", "[unit]") {
  std::mt19937 g(5);
  const int64_t T = 7, pos0 = 4, S = pos0 + T + 1, H = 3, D = 19;
  auto q = randn(size_t(T * H * D), g), w = randn(size_t(T * H), g), k = randn(size_t(S * D), g);
  std::vector<float> sc(size_t(T * S));
  indexer_scores(q.data(), w.data(), k.data(), sc.data(), T, pos0, S, H, D);
  int relu_cut = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) {
      const float got = sc[size_t(t * S + s)];
      if (s > pos0 + t) {
        CHECK(std::isinf(got));
        CHECK(got < 0);
        continue;
      }
      double ref = 0;
      for (int64_t h = 0; h < H; ++h) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += double(q[size_t((t * H + h) * D + i)]) * k[size_t(s * D + i)];
        if (d > 0) ref += w[size_t(t * H + h)] * d;
        else ++relu_cut;
      }
      CHECK(std::abs(got - ref) < 2e-5 * (1 + std::abs(ref)));  // fp32 dots of 19 terms
    }
  CHECK(relu_cut > 0);  // the ReLU was exercised
}

TEST_CASE("indexer: Top-K equals a stable-sort reference, ties to the lower position", "[unit]") {
  std::mt19937 g(9);
  const int64_t T = 11, pos0 = 15, S = pos0 + T, K = 6;
  auto sc = randn(size_t(T * S), g);
  std::uniform_int_distribution<int> coin(0, 3);
  for (auto& v : sc)
    if (coin(g) == 0) v = 0.25f;  // many exact ties, around the selection boundary
  sc[0] = std::numeric_limits<float>::quiet_NaN();  // NaN ranks lowest
  std::vector<int32_t> sel(size_t(T * K));
  topk_positions(sc.data(), sel.data(), T, pos0, S, K);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> idx(size_t(pos0 + t + 1));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
    const float* row = sc.data() + t * S;
    auto key = [row](int32_t i) { return std::isnan(row[i]) ? -std::numeric_limits<double>::infinity() : double(row[i]); };
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
    idx.resize(size_t(K));
    std::sort(idx.begin(), idx.end());
    std::vector<int32_t> got(sel.begin() + t * K, sel.begin() + (t + 1) * K);
    CHECK(got == idx);
  }
}

TEST_CASE("indexer: Top-K of a context shorter than K selects everything", "[unit]") {
  std::mt19937 g(13);
  const int64_t T = 5, pos0 = 0, S = 5, K = 8;
  auto sc = randn(size_t(T * S), g);
  std::vector<int32_t> sel(size_t(T * K));
  topk_positions(sc.data(), sel.data(), T, pos0, S, K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) CHECK(sel[size_t(t * K + j)] == (j <= t ? int32_t(j) : -1));
}
