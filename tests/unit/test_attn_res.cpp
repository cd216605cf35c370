// Block Attention Residuals (lib/model/attn_res.hpp) against an independent fp64 straight-line
// formulation that indexes sub-layers directly (paper Eq. for V per sub-layer), hand-computed
// means for zero pseudo-queries, token independence, call-order checks and the loader.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "model/attn_res.hpp"

using namespace dz;

namespace {

using VecD = std::vector<double>;

// Sub-layer stand-in: f_j(x) = tanh(W_j x), W_j [D, D]; depends on its input so any wiring
// error in the value sets propagates to everything after it.
struct Sublayers {
  int64_t D;
  std::vector<std::vector<float>> W;  // [2L][D * D]
  Sublayers(int64_t D_, int count, std::mt19937& rng) : D(D_) {
    std::normal_distribution<float> nd(0.f, 1.f / std::sqrt(float(D_)));
    W.resize(size_t(count));
    for (auto& w : W) {
      w.resize(size_t(D * D));
      for (auto& v : w) v = 1.5f * nd(rng);
    }
  }
  void apply(int j, const float* x, float* y) const {  // fp32 path
    for (int64_t d = 0; d < D; ++d) {
      float a = 0.f;
      for (int64_t e = 0; e < D; ++e) a += W[size_t(j)][size_t(d * D + e)] * x[e];
      y[d] = std::tanh(a);
    }
  }
  VecD apply(int j, const VecD& x) const {  // fp64 path
    VecD y(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) {
      double a = 0.0;
      for (int64_t e = 0; e < D; ++e) a += double(W[size_t(j)][size_t(d * D + e)]) * x[size_t(e)];
      y[size_t(d)] = std::tanh(a);
    }
    return y;
  }
};

// fp64: sum_i softmax_i(q · v_i / rms(v_i)) v_i with q = norm_w ⊙ proj_w.
VecD ref_mix(const std::vector<VecD>& V, const float* nw, const float* pw, double eps) {
  const size_t D = V[0].size();
  std::vector<double> sc;
  for (const auto& v : V) {
    double ss = 0;
    for (double x : v) ss += x * x;
    const double r = 1.0 / std::sqrt(ss / double(D) + eps);
    double s = 0;
    for (size_t d = 0; d < D; ++d) s += (v[d] * r) * (double(nw[d]) * double(pw[d]));
    sc.push_back(s);
  }
  const double m = *std::max_element(sc.begin(), sc.end());
  double z = 0;
  for (auto& s : sc) z += (s = std::exp(s - m));
  VecD out(D, 0.0);
  for (size_t i = 0; i < V.size(); ++i)
    for (size_t d = 0; d < D; ++d) out[d] += sc[i] / z * V[i][d];
  return out;
}

VecD add(const VecD& a, const VecD& b) {
  VecD r(a);
  for (size_t i = 0; i < r.size(); ++i) r[i] += b[i];
  return r;
}

// Straight-line reference for one token. Sub-layer j (layer j / 2) belongs to block
// k(j) = 1 + (j / 2) / bs; b_0 = embedding; b_k = sum of the outputs of block k's sub-layers.
// Sub-layer j reads V = [b_0 .. b_{k-1}] plus, when an earlier sub-layer of block k exists, the
// partial sum of block k so far. The output reads [b_0 .. b_N], b_N the last (maybe partial) block.
struct RefResult {
  std::vector<VecD> inputs;  // [2L] sub-layer inputs
  VecD out;
};
RefResult ref_forward(const VecD& embed, int L, int bs, const Sublayers& f, const Tensor& nw, const Tensor& pw,
                      double eps) {
  const int S = 2 * L;
  auto blk = [&](int j) { return 1 + (j / 2) / bs; };
  std::vector<VecD> outs;  // outputs of sub-layers so far
  RefResult r;
  const size_t D = embed.size();
  auto block_sum = [&](int k, int upto) {  // sum of outputs of sub-layers j < upto in block k
    VecD s(D, 0.0);
    bool any = false;
    for (int j = 0; j < upto; ++j)
      if (blk(j) == k) {
        s = add(s, outs[size_t(j)]);
        any = true;
      }
    return std::make_pair(s, any);
  };
  for (int j = 0; j < S; ++j) {
    const int k = blk(j);
    std::vector<VecD> V{embed};
    for (int m = 1; m < k; ++m) V.push_back(block_sum(m, j).first);
    auto part = block_sum(k, j);
    if (part.second) V.push_back(part.first);
    const VecD in = ref_mix(V, nw.row(j), pw.row(j), eps);
    r.inputs.push_back(in);
    outs.push_back(f.apply(j, in));
  }
  std::vector<VecD> V{embed};
  for (int m = 1; m <= blk(S - 1); ++m) V.push_back(block_sum(m, S).first);
  r.out = ref_mix(V, nw.row(S), pw.row(S), eps);
  return r;
}

// Runs AttnRes with the fp32 sub-layers; returns the sub-layer inputs [2L][T, D] and output [T, D].
std::pair<std::vector<std::vector<float>>, std::vector<float>> run(const AttnRes& ar, const float* embed, int64_t T,
                                                                    const Sublayers& f) {
  const int64_t D = ar.hidden();
  auto s = ar.begin(embed, T);
  std::vector<std::vector<float>> ins;
  std::vector<float> in(size_t(T * D)), o(size_t(T * D));
  for (int l = 0; l < ar.num_layers(); ++l)
    for (int w = 0; w < 2; ++w) {
      ar.sublayer_input(s, l, w, in.data());
      ins.push_back(in);
      for (int64_t t = 0; t < T; ++t) f.apply(2 * l + w, in.data() + t * D, o.data() + t * D);
      ar.add_output(s, l, w, o.data());
    }
  std::vector<float> out(size_t(T * D));
  ar.final_output(s, out.data());
  return {ins, out};
}

}  // namespace

TEST_CASE("attn_res: matches the fp64 straight-line formulation", "[unit]") {
  struct Case {
    int bs, L;
    int64_t D;
  };
  // partial final blocks (5 % 2, 7 % 3, 3 % 4), exact multiples (6 % 3, 4 % 1), one layer
  const Case cases[] = {{1, 4, 19}, {2, 5, 7}, {3, 7, 19}, {3, 6, 65}, {2, 1, 3}, {4, 3, 19}};
  const double eps = 1e-5;
  for (const Case& c : cases) {
    std::mt19937 rng(uint32_t(100 * c.bs + c.L));
    const int S = 2 * c.L;
    Tensor nw({S + 1, c.D}), pw({S + 1, c.D});
    std::uniform_real_distribution<float> un(0.5f, 1.5f);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : nw.data) v = un(rng);
    for (auto& v : pw.data) v = 0.4f * nd(rng);  // scores of O(1): mixtures far from uniform
    const AttnRes ar(c.D, c.L, c.bs, float(eps), nw, pw);
    const Sublayers f(c.D, S, rng);
    const int64_t T = 3;
    std::vector<float> embed(size_t(T * c.D));
    for (auto& v : embed) v = nd(rng);
    const auto got = run(ar, embed.data(), T, f);
    for (int64_t t = 0; t < T; ++t) {
      const VecD e(embed.begin() + t * c.D, embed.begin() + (t + 1) * c.D);
      const RefResult ref = ref_forward(e, c.L, c.bs, f, nw, pw, eps);
      // fp32 vs fp64 through <= 14 sub-layers of O(1) values, each a few O(D) reductions with
      // relative rounding ~1e-7: the largest error observed here is 3-5e-6; 2e-5 leaves margin
      // while a wiring error (a wrong value set) changes the inputs by O(0.1) and a 1e-5
      // relative change of one mixture weight already fails.
      const double tol = 2e-5;
      for (int j = 0; j < S; ++j)
        for (int64_t d = 0; d < c.D; ++d) {
          INFO("bs " << c.bs << " L " << c.L << " t " << t << " sub-layer " << j << " d " << d);
          CHECK(std::fabs(got.first[size_t(j)][size_t(t * c.D + d)] - ref.inputs[size_t(j)][size_t(d)]) <= tol);
        }
      for (int64_t d = 0; d < c.D; ++d) {
        INFO("bs " << c.bs << " L " << c.L << " t " << t << " output d " << d);
        CHECK(std::fabs(got.second[size_t(t * c.D + d)] - ref.out[size_t(d)]) <= tol);
      }
    }
  }
}

TEST_CASE("attn_res: zero pseudo-queries give the plain mean of the value set", "[unit]") {
  // bs = 2, L = 3: blocks b_0 = e, b_1 = layers 0-1, partial b_2 = layer 2.
  // Sub-layer outputs are fixed vectors o_j (independent of the input), so every input is a
  // hand-written mean.
  const int64_t D = 3;
  const int L = 3;
  Tensor nw({2 * L + 1, D}, 1.f), pw({2 * L + 1, D}, 0.f);
  const AttnRes ar(D, L, 2, 1e-6f, nw, pw);
  const float e[D] = {1.f, -2.f, 4.f};
  float o[6][D];
  for (int j = 0; j < 6; ++j)
    for (int d = 0; d < D; ++d) o[j][d] = float((j + 1) * (d + 2)) * (j % 2 ? -0.5f : 1.f);
  auto s = ar.begin(e, 1);
  float in[D], out[D];
  auto expect = [&](const char* what, std::vector<std::vector<double>> V) {
    for (int d = 0; d < D; ++d) {
      double m = 0;
      for (auto& v : V) m += v[size_t(d)];
      m /= double(V.size());
      INFO(what << " d " << d);
      CHECK(std::fabs(in[d] - m) <= 1e-6 * (1 + std::fabs(m)));  // fp32 sum of <= 3 terms and a divide
    }
  };
  auto vec = [&](std::initializer_list<int> js, bool with_e) {
    std::vector<double> v(D, 0.0);
    for (int d = 0; d < D; ++d) {
      if (with_e) v[size_t(d)] += e[d];
      for (int j : js) v[size_t(d)] += o[j][d];
    }
    return v;
  };
  ar.sublayer_input(s, 0, 0, in);
  expect("layer 0 mixer: [e]", {vec({}, true)});
  ar.add_output(s, 0, 0, o[0]);
  ar.sublayer_input(s, 0, 1, in);
  expect("layer 0 ffn: [e, o0]", {vec({}, true), vec({0}, false)});
  ar.add_output(s, 0, 1, o[1]);
  ar.sublayer_input(s, 1, 0, in);
  expect("layer 1 mixer: [e, o0+o1]", {vec({}, true), vec({0, 1}, false)});
  ar.add_output(s, 1, 0, o[2]);
  ar.sublayer_input(s, 1, 1, in);
  expect("layer 1 ffn: [e, o0+o1+o2]", {vec({}, true), vec({0, 1, 2}, false)});
  ar.add_output(s, 1, 1, o[3]);
  ar.sublayer_input(s, 2, 0, in);
  expect("layer 2 mixer: [e, b1]", {vec({}, true), vec({0, 1, 2, 3}, false)});
  ar.add_output(s, 2, 0, o[4]);
  CHECK(s.n_blocks == 2);
  ar.sublayer_input(s, 2, 1, in);
  expect("layer 2 ffn: [e, b1, o4]", {vec({}, true), vec({0, 1, 2, 3}, false), vec({4}, false)});
  ar.add_output(s, 2, 1, o[5]);
  ar.final_output(s, out);
  std::memcpy(in, out, sizeof(out));
  expect("output: [e, b1, o4+o5]", {vec({}, true), vec({0, 1, 2, 3}, false), vec({4, 5}, false)});
}

TEST_CASE("attn_res: tokens are independent (prefill over T equals T decodes)", "[unit]") {
  std::mt19937 rng(3);
  const int64_t D = 19, T = 5;
  const int L = 4, S = 8;
  Tensor nw({S + 1, D}), pw({S + 1, D});
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : nw.data) v = 1.f + 0.3f * nd(rng);
  for (auto& v : pw.data) v = 0.5f * nd(rng);
  const AttnRes ar(D, L, 3, 1e-6f, nw, pw);
  const Sublayers f(D, S, rng);
  std::vector<float> embed(size_t(T * D));
  for (auto& v : embed) v = nd(rng);
  const auto all = run(ar, embed.data(), T, f);
  for (int64_t t = 0; t < T; ++t) {
    const auto one = run(ar, embed.data() + t * D, 1, f);
    CHECK(std::memcmp(one.second.data(), all.second.data() + t * D, size_t(D) * sizeof(float)) == 0);
    for (int j = 0; j < S; ++j)
      CHECK(std::memcmp(one.first[size_t(j)].data(), all.first[size_t(j)].data() + t * D, size_t(D) * sizeof(float)) ==
            0);
  }
}

TEST_CASE("attn_res: layer 0's mixer input is the embedding bit for bit; call order is checked", "[unit]") {
  const int64_t D = 7;
  Tensor nw({5, D}, 1.f), pw({5, D}, 0.3f);
  const AttnRes ar(D, 2, 1, 1e-6f, nw, pw);
  std::vector<float> e(size_t(2 * D));
  for (size_t i = 0; i < e.size(); ++i) e[i] = std::sin(float(i) + 0.5f) * 3.f;
  e[3] = -0.f;
  auto s = ar.begin(e.data(), 2);
  std::vector<float> in(e.size()), out(e.size());
  ar.sublayer_input(s, 0, 0, in.data());
  CHECK(std::memcmp(in.data(), e.data(), e.size() * sizeof(float)) == 0);
  CHECK_THROWS_AS(ar.sublayer_input(s, 0, 1, in.data()), Error);  // FFN before the mixer's output
  CHECK_THROWS_AS(ar.add_output(s, 1, 0, in.data()), Error);
  CHECK_THROWS_AS(ar.final_output(s, out.data()), Error);
  ar.add_output(s, 0, 0, in.data());
  CHECK_THROWS_AS(ar.add_output(s, 0, 0, in.data()), Error);  // the same site twice
  Tensor bad({4, D});
  CHECK_THROWS_AS(AttnRes(D, 2, 1, 1e-6f, bad, pw), Error);
  CHECK_THROWS_AS(AttnRes(D, 2, 0, 1e-6f, nw, pw), Error);
}

TEST_CASE("attn_res: loader asks for the published names and matches direct weights", "[unit]") {
  ModelConfig cfg;
  cfg.hidden_size = 19;
  cfg.num_layers = 5;
  cfg.attn_res_block_size = 2;
  cfg.rms_norm_eps = 1e-5f;
  auto ck = Checkpoint::random(42);
  const AttnRes ar(cfg, *ck);
  const auto& g = ck->generated();
  CHECK(g.size() == size_t(4 * cfg.num_layers + 2));
  Tensor nw({11, 19}), pw({11, 19});
  for (int s = 0; s < 11; ++s) {
    const std::string base = s == 10 ? "model.output_attn_res"
                                     : "model.layers." + std::to_string(s / 2) + (s % 2 ? ".mlp_res" : ".self_attention_res");
    INFO(base);
    REQUIRE(g.count(base + "_norm.weight") == 1);
    REQUIRE(g.count(base + "_proj.weight") == 1);
    const Tensor& n = g.at(base + "_norm.weight");
    const Tensor& p = g.at(base + "_proj.weight");
    CHECK(n.shape == Shape{19});
    CHECK(p.shape == Shape{1, 19});
    CHECK(n[0] == 1.f);  // norms generated as ones
    std::memcpy(nw.row(s), n.ptr(), 19 * sizeof(float));
    std::memcpy(pw.row(s), p.ptr(), 19 * sizeof(float));
  }
  const AttnRes direct(19, 5, 2, 1e-5f, nw, pw);
  std::mt19937 rng(9);
  const Sublayers f(19, 10, rng);
  std::vector<float> embed(3 * 19);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : embed) v = nd(rng);
  const auto a = run(ar, embed.data(), 3, f), b = run(direct, embed.data(), 3, f);
  CHECK(std::memcmp(a.second.data(), b.second.data(), a.second.size() * sizeof(float)) == 0);

  // round trip through a safetensors directory, strictly: all used; a missing tensor is named
  char tmpl[] = "/tmp/dz_attn_res_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  write_safetensors(dir, g, DType::F32);
  {
    auto rd = Checkpoint::open(dir);
    const AttnRes loaded(cfg, *rd);
    rd->check_all_used();
    const auto c = run(loaded, embed.data(), 3, f);
    CHECK(std::memcmp(a.second.data(), c.second.data(), a.second.size() * sizeof(float)) == 0);
  }
  cfg.num_layers = 6;  // asks for layer 5, which the file does not hold
  {
    auto rd = Checkpoint::open(dir);
    CHECK_THROWS_WITH(AttnRes(cfg, *rd), Catch::Contains("model.layers.5.self_attention_res_norm.weight"));
  }
  for (const char* fn : {"model.safetensors", "model.safetensors.index.json"}) std::remove((dir + "/" + fn).c_str());
  std::remove(dir.c_str());
}
