// Speculative decoding (DESIGN §11; job/speculative.hpp, Model::spec_begin / spec_keep) on the CPU
// backend: undoing a verify forward's rejected rows leaves every layer's state as if only the kept
// rows had been forwarded (each mixer family: KDA / GDN replay, MLA / DSA / GQA truncation,
// DeepSeek-V4's snapshot + re-forward), the n-gram drafter, and the rejection sampler's output
// distribution equal to the target's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "job/doc_compute.hpp"
#include "job/speculative.hpp"
#include "job/tools.hpp"  // presets()
#include "model/model.hpp"

using namespace dz;

namespace {

ModelConfig config_of(const std::string& name) {
  if (name == "demo" || name == "hybrid-small") return ModelConfig::from_json(nlohmann::json::parse(presets().at(name)));
  std::ifstream f(std::string(DZ_SOURCE_DIR) + "/tests/golden/" + name + "/config.json");
  REQUIRE(f.good());
  return ModelConfig::from_json(nlohmann::json::parse(f));
}

std::vector<int32_t> toks(int64_t n, int64_t salt, int64_t V) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 37 + salt * 11 + 5) % V);
  return t;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i])), s = std::max(s, std::fabs(double(b[i])));
  return s > 0 ? m / s : m;
}

}  // namespace

TEST_CASE("speculative: keeping k of a verify forward's rows equals forwarding those k alone, in every layer",
          "[unit]") {
  // Two documents verified together (packed, as the decode loop does) with different keeps; then
  // both continue with the same tokens as references that forwarded only the kept rows. The
  // continuation's hidden states and the positions must match, for both restores of the recurrent
  // states (replay; per-token states). Tolerance 2e-5 relative: the verify forward's projections
  // ran over more rows than the reference's (GEMM blocking may round differently), and per-token
  // states come from a row-by-row scan where the reference scanned the rows in one call.
  for (const std::string name : {"kimi_linear", "qwen3_next", "deepseek_v32", "glm5_next", "glm_moe_dsa",
                                 "qwen3_5_moe_text", "deepseek_v4", "kimi_k3", "demo"}) {
    const ModelConfig cfg = config_of(name);
    auto ck = Checkpoint::random(7);
    auto m = Model::build(cfg, *ck);
    Backend& be = m->backend();
    const int64_t V = cfg.vocab_size;
    for (const auto& keeps : std::vector<std::vector<int64_t>>{{1, 5}, {3, 2}, {5, 1}, {4, 4}})
    for (const SpecRestore how : {SpecRestore::Replay, SpecRestore::PerToken}) {
      INFO(name << " keeps " << keeps[0] << ", " << keeps[1] << (how == SpecRestore::Replay ? " replay" : " per-token"));
      const std::vector<int64_t> prompt_len{6, 11};
      const int64_t R = 5;  // verify rows per document (4 drafts + the current token)
      std::vector<Model::State> spec, ref;
      for (size_t b = 0; b < 2; ++b) {
        spec.push_back(m->make_state());
        ref.push_back(m->make_state());
        const auto p = toks(prompt_len[b], int64_t(b), V);
        m->forward(p.data(), prompt_len[b], spec.back());
        m->forward(p.data(), prompt_len[b], ref.back());
      }
      std::vector<int32_t> vt;
      std::vector<int64_t> cu{0};
      std::vector<std::vector<int32_t>> rows(2);
      for (size_t b = 0; b < 2; ++b) {
        rows[b] = toks(R, 40 + int64_t(b), V);
        vt.insert(vt.end(), rows[b].begin(), rows[b].end());
        cu.push_back(cu.back() + R);
      }
      std::vector<Model::State*> sp{&spec[0], &spec[1]};
      m->spec_begin(sp, how);
      m->forward_packed(vt.data(), cu, sp);
      m->spec_keep(sp, keeps);
      for (size_t b = 0; b < 2; ++b) {
        m->forward(rows[b].data(), keeps[b], ref[b]);
        CHECK(spec[b].pos == ref[b].pos);
        for (size_t l = 0; l < spec[b].mixers.size(); ++l) {
          CHECK(spec[b].mixers[l]->pos == ref[b].pos);
          CHECK(!spec[b].mixers[l]->spec);
        }
        const auto more = toks(3, 90 + int64_t(b), V);
        const std::vector<float> ys = be.to_host(m->forward(more.data(), 3, spec[b]));
        const std::vector<float> yr = be.to_host(m->forward(more.data(), 3, ref[b]));
        CHECK(rel_diff(ys, yr) <= 2e-5);
      }
    }
  }
}

TEST_CASE("speculative: a mixer refuses spec_keep without a verify forward, and keeps outside 1..T", "[unit]") {
  const ModelConfig cfg = config_of("demo");
  auto ck = Checkpoint::random(3);
  auto m = Model::build(cfg, *ck);
  Model::State st = m->make_state();
  const auto p = toks(4, 0, cfg.vocab_size);
  m->forward(p.data(), 4, st);
  std::vector<Model::State*> sp{&st};
  CHECK_THROWS(m->spec_keep(sp, {1}));  // no spec_begin
  m->spec_begin(sp, SpecRestore::Replay);
  const auto v = toks(3, 1, cfg.vocab_size);
  m->forward_packed(v.data(), {0, 3}, sp);
  CHECK_THROWS(m->spec_keep(sp, {4}));
}

TEST_CASE("speculative: the n-gram drafter proposes what followed the latest, longest earlier match", "[unit]") {
  {
    NgramDrafter d({1, 2, 3, 4, 9, 9, 1, 2, 3, 5, 7, 1, 2, 3});
    // suffix 1 2 3 (n = 3): latest earlier occurrence at 6..8, followed by 5 7 1 2 3
    CHECK(d.draft(3) == std::vector<int32_t>{5, 7, 1});
    CHECK(d.draft(10) == std::vector<int32_t>{5, 7, 1, 2, 3});  // stops at the context's end
    d.push(5);  // suffix 2 3 5 (n = 3): at 7..9 -> 7 1 2 3 5
    CHECK(d.draft(2) == std::vector<int32_t>{7, 1});
  }
  {
    NgramDrafter d({4, 5, 6, 7, 8});
    CHECK(d.draft(4).empty());  // no earlier match of any suffix of 2+ tokens
    d.push(4);
    CHECK(d.draft(4).empty());  // a 1-token suffix is below kMinN
    d.push(5);
    CHECK(d.draft(2) == std::vector<int32_t>{6, 7});
  }
  {
    // the longest suffix wins over a more recent shorter one
    NgramDrafter d({1, 2, 3, 8, 8, 9, 2, 3, 6, 6, 1, 2, 3});
    CHECK(d.draft(1) == std::vector<int32_t>{8});
  }
  {
    NgramDrafter d({3, 3, 3, 3});  // repeats: the latest earlier occurrence overlaps the suffix
    CHECK(d.draft(4) == std::vector<int32_t>{3});
  }
}

TEST_CASE("speculative: rejection sampling against a one-token draft keeps the target distribution", "[unit]") {
  // P(out = x) = p(d) [x = d] + (1 - p(d)) p(x) / (1 - p(d)) [x != d] = p(x). Chi-square of N draws
  // against p over V = 8 outcomes (7 degrees of freedom): the threshold 35.0 is exceeded with
  // probability ~1e-5 when the sampler is right; every draw is seeded, so the test is deterministic.
  const std::vector<float> logits{1.5f, -0.3f, 0.2f, 2.1f, -1.0f, 0.0f, 0.7f, -2.5f};
  const int64_t V = 8, N = 200000;
  for (double temp : {1.0, 0.6}) {
    for (int32_t d : {3, 4}) {  // a likely and an unlikely draft
      INFO("temperature " << temp << " draft " << d);
      std::vector<double> p(V);
      double s = 0, mx = *std::max_element(logits.begin(), logits.end());
      for (int64_t i = 0; i < V; ++i) s += (p[size_t(i)] = std::exp((logits[size_t(i)] - mx) / temp));
      for (double& x : p) x /= s;
      std::vector<int64_t> n(V, 0);
      int64_t acc_n = 0;
      for (int64_t i = 0; i < N; ++i) {
        bool acc = false;
        const int32_t t = accept_or_resample(logits.data(), V, temp, d, spec_uniform(5, 1, i, 0), spec_uniform(5, 1, i, 1), &acc);
        REQUIRE((t >= 0 && t < V));
        CHECK(acc == (t == d));
        n[size_t(t)] += 1;
        acc_n += acc;
      }
      double chi = 0;
      for (int64_t x = 0; x < V; ++x) chi += std::pow(double(n[size_t(x)]) - N * p[size_t(x)], 2) / (N * p[size_t(x)]);
      CHECK(chi < 35.0);
      CHECK(std::fabs(double(acc_n) / N - p[size_t(d)]) < 5.0 * std::sqrt(p[size_t(d)] * (1 - p[size_t(d)]) / N));
    }
  }
}

TEST_CASE("speculative: sampled generation with drafts has the model's exact distribution (tiny model)", "[unit]") {
  // A 4-layer demo model (KDA + MLA/DSA + MoE + AttnRes) with a 12-token vocabulary samples 3 tokens
  // after a prompt at temperature 0.2, N = 4000 times (one packed batch per seed, each document
  // its own random stream), drafting at every step what greedy decoding would continue with (oracle
  // drafts of up to 3 tokens): drafts are accepted and rejected often (checked). The exact law of (t1, t2, t3) comes from the model
  // itself (1 + 12 + 144 forwards). Three chi-square tests against it: the (t1, t2) joint (cells of
  // expected count < 5 pooled), and the t2 and t3 marginals. Each has a false-alarm rate of 1e-4
  // (threshold: the chi-square quantile at 1 - 1e-4, Wilson-Hilferty), 3e-4 for the case; the
  // seeds are fixed, so the outcome is deterministic.
  nlohmann::json j = nlohmann::json::parse(presets().at("demo"));
  j["vocab_size"] = 12;
  j["eos_token_id"] = 11;
  const ModelConfig cfg = ModelConfig::from_json(j);
  auto ck = Checkpoint::random(21);
  auto m = Model::build(cfg, *ck);
  Backend& be = m->backend();
  const int64_t V = 12;
  const double temp = 0.2;
  const std::vector<int32_t> prompt{3, 5, 7, 3, 5, 7, 3, 5, 7, 3, 5};
  auto probs = [&](const std::vector<int32_t>& t) {  // p(next | t) at the temperature
    Model::State st = m->make_state();
    const DTensor h = m->forward(t.data(), int64_t(t.size()), st);
    std::vector<float> lg(static_cast<size_t>(V));
    m->logits(h.slab(int64_t(t.size()) - 1, int64_t(t.size())), lg.data());
    std::vector<double> p(static_cast<size_t>(V));
    double mx = *std::max_element(lg.begin(), lg.end()), s = 0;
    for (int64_t i = 0; i < V; ++i) s += (p[size_t(i)] = std::exp((lg[size_t(i)] - mx) / temp));
    for (double& x : p) x /= s;
    return p;
  };
  // exact law; EOS (11) ends a sequence early: its later tokens are "none" (index V)
  std::vector<double> P(size_t((V + 1) * (V + 1) * (V + 1)), 0.0);
  auto cell = [&](int64_t a, int64_t b, int64_t c) -> double& { return P[size_t((a * (V + 1) + b) * (V + 1) + c)]; };
  const auto p1 = probs(prompt);
  for (int64_t a = 0; a < V; ++a) {
    if (a == 11) {
      cell(a, V, V) += p1[size_t(a)];
      continue;
    }
    std::vector<int32_t> t1 = prompt;
    t1.push_back(int32_t(a));
    const auto p2 = probs(t1);
    for (int64_t b = 0; b < V; ++b) {
      if (b == 11) {
        cell(a, b, V) += p1[size_t(a)] * p2[size_t(b)];
        continue;
      }
      std::vector<int32_t> t2 = t1;
      t2.push_back(int32_t(b));
      const auto p3 = probs(t2);
      for (int64_t c = 0; c < V; ++c) cell(a, b, c) += p1[size_t(a)] * p2[size_t(b)] * p3[size_t(c)];
    }
  }
  // sampled, with speculation: every step drafts the greedy continuation (oracle drafts), which the
  // sampler accepts often and rejects often at this temperature
  std::vector<int32_t> greedy_cont;
  {
    std::vector<int32_t> t = prompt;
    for (int i = 0; i < 3; ++i) {
      const auto p = probs(t);
      t.push_back(int32_t(std::max_element(p.begin(), p.end()) - p.begin()));
      greedy_cont.push_back(t.back());
    }
  }
  const int64_t per = 2000, rounds = 2, N = per * rounds;
  auto oracle = std::make_shared<std::vector<std::vector<int32_t>>>(static_cast<size_t>(per), greedy_cont);
  std::vector<int64_t> cnt(P.size(), 0);
  int64_t drafted = 0, accepted = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    ModeParams mp;
    mp.mode = OutputMode::Generate;
    mp.max_new_tokens = 3;
    mp.temperature = temp;
    mp.seed = uint64_t(100 + r);
    mp.speculative = "oracle";
    mp.oracle = oracle;
    mp.draft_tokens = 3;
    std::vector<int64_t> docs(static_cast<size_t>(per));
    for (int64_t i = 0; i < per; ++i) docs[size_t(i)] = i;
    const std::vector<std::vector<int32_t>> toks(static_cast<size_t>(per), prompt);
    const std::vector<DocResult> res = compute_packed(*m, docs, toks, mp, {});
    for (const DocResult& d : res) {
      REQUIRE((!d.ids.empty() && d.ids.size() <= 3));
      int64_t x[3] = {V, V, V};
      for (size_t i = 0; i < d.ids.size(); ++i) x[i] = d.ids[i];
      cnt[size_t((x[0] * (V + 1) + x[1]) * (V + 1) + x[2])] += 1;
      drafted += d.stats.spec_drafted, accepted += d.stats.spec_accepted;
    }
  }
  INFO("drafted " << drafted << " accepted " << accepted);
  CHECK(accepted > N / 8);
  CHECK(drafted - accepted > N / 4);
  (void)be;
  auto crit = [](double k) {  // chi-square quantile at 1 - 1e-4 (Wilson-Hilferty; z = 3.719)
    const double z = 3.719, c = 2.0 / (9.0 * k);
    return k * std::pow(1.0 - c + z * std::sqrt(c), 3.0);
  };
  // a chi-square test of counts against probabilities, pooling cells of expected count < 5
  auto test = [&](const std::vector<double>& p, const std::vector<int64_t>& n, const char* what) {
    double chi = 0, pool_e = 0, pool_n = 0;
    int64_t cells = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      const double e = p[i] * double(N);
      if (e < 5) {
        pool_e += e, pool_n += double(n[i]);
        continue;
      }
      chi += (double(n[i]) - e) * (double(n[i]) - e) / e;
      ++cells;
    }
    if (pool_e > 0) chi += (pool_n - pool_e) * (pool_n - pool_e) / pool_e, ++cells;
    INFO(what << ": chi-square " << chi << " over " << cells << " cells, threshold " << crit(double(cells - 1)));
    CHECK(cells >= 5);
    CHECK(chi < crit(double(cells - 1)));
  };
  const int64_t W = V + 1;
  std::vector<double> pj(size_t(W * W), 0.0), p2(size_t(W), 0.0), p3(size_t(W), 0.0);
  std::vector<int64_t> nj(size_t(W * W), 0), n2(size_t(W), 0), n3(size_t(W), 0);
  for (int64_t a = 0; a < W; ++a)
    for (int64_t b = 0; b < W; ++b)
      for (int64_t c = 0; c < W; ++c) {
        const size_t i = size_t((a * W + b) * W + c);
        pj[size_t(a * W + b)] += P[i], nj[size_t(a * W + b)] += cnt[i];
        p2[size_t(b)] += P[i], n2[size_t(b)] += cnt[i];
        p3[size_t(c)] += P[i], n3[size_t(c)] += cnt[i];
      }
  test(pj, nj, "(t1, t2)");
  test(p2, n2, "t2");
  test(p3, n3, "t3");
}
