// The graph runner's decode step (model/decode_runner.hpp) on the CPU backend, where it runs
// eagerly: it must issue exactly Model::forward_packed's ops over one token per document, so its
// hidden states equal forward_packed's bitwise, and each document's equal its own forward() of one
// token; states advance the same way. Batches change between steps (a document finishes), as in
// generate mode. Models: the committed golden configs (KDA + MLA + MoE, GDN + gated GQA + MoE,
// MLA + DSA) and the demo preset (Block AttnRes). The CUDA graphs themselves are tested on the GPU
// (tests/gpu/test_model_gpu.cpp: replayed steps equal eager ones bitwise).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "job/doc_compute.hpp"
#include "job/tools.hpp"  // presets()
#include "model/decode_runner.hpp"
#include "model/lm_head.hpp"
#include "model/model.hpp"

using namespace dz;

namespace {

ModelConfig config_of(const std::string& name) {
  if (name == "demo") return ModelConfig::from_json(nlohmann::json::parse(presets().at(name)));
  std::ifstream f(std::string(DZ_SOURCE_DIR) + "/tests/golden/" + name + "/config.json");
  REQUIRE(f.good());
  return ModelConfig::from_json(nlohmann::json::parse(f));
}

std::vector<float> host(Backend& be, const DTensor& t) { return be.to_host(t); }

// N documents with prompts of different lengths, prefilled one by one.
std::vector<Model::State> prompts(const Model& m, const std::vector<int64_t>& lens) {
  std::vector<Model::State> st;
  const int64_t V = m.config().vocab_size;
  for (size_t b = 0; b < lens.size(); ++b) {
    st.push_back(m.make_state());
    std::vector<int32_t> t(static_cast<size_t>(lens[b]));
    for (int64_t i = 0; i < lens[b]; ++i) t[size_t(i)] = int32_t((i * 37 + int64_t(b) * 11 + 5) % V);
    m.forward(t.data(), lens[b], st.back());
  }
  return st;
}

}  // namespace

TEST_CASE("decode runner: an eager step equals forward_packed of one token per document, and per-document forwards",
          "[unit]") {
  for (const std::string name : {"kimi_linear", "qwen3_next", "deepseek_v32", "demo"}) {
    INFO(name);
    const ModelConfig cfg = config_of(name);
    auto ck = Checkpoint::random(5);
    auto m = Model::build(cfg, *ck);
    Backend& be = m->backend();
    const int64_t V = cfg.vocab_size, D = cfg.hidden_size;
    const std::vector<int64_t> lens{3, 9, 1};
    auto a = prompts(*m, lens), b = prompts(*m, lens), c = prompts(*m, lens);
    DecodeRunner runner(*m, false);
    CHECK(runner.graph_runs() == 0);
    std::vector<size_t> active{0, 1, 2};
    for (int s = 0; s < 6; ++s) {
      if (s == 3) active = {0, 2};  // document 1 finished
      std::vector<int32_t> tok;
      std::vector<Model::State*> pa, pb;
      std::vector<int64_t> cu{0};
      for (size_t d : active) {
        tok.push_back(int32_t((s * 101 + int64_t(d) * 13 + 1) % V));
        pa.push_back(&a[d]);
        pb.push_back(&b[d]);
        cu.push_back(cu.back() + 1);
      }
      const std::vector<float> ya = host(be, runner.step(tok.data(), pa));
      const std::vector<float> yb = host(be, m->forward_packed(tok.data(), cu, pb));
      REQUIRE(ya.size() == active.size() * size_t(D));
      CHECK(ya == yb);
      for (size_t i = 0; i < active.size(); ++i) {
        const std::vector<float> yc = host(be, m->forward(&tok[i], 1, c[active[i]]));
        CHECK(std::vector<float>(ya.begin() + int64_t(i) * D, ya.begin() + int64_t(i + 1) * D) == yc);
      }
    }
    for (size_t d = 0; d < lens.size(); ++d) {
      CHECK(a[d].pos == b[d].pos);
      CHECK(a[d].pos == c[d].pos);
      for (size_t l = 0; l < a[d].mixers.size(); ++l) CHECK(a[d].mixers[l]->pos == c[d].mixers[l]->pos);
    }
  }
}

TEST_CASE("decode runner: graphs on a backend without them are refused by name", "[unit]") {
  auto ck = Checkpoint::random(5);
  auto m = Model::build(config_of("kimi_linear"), *ck);
  CHECK_THROWS_WITH(DecodeRunner(*m, true), Catch::Contains("cpu backend has no graphs"));
  CHECK_THROWS_WITH(m->backend().capture_begin(), Catch::Contains("no graphs"));
}

// Generate mode's batched decode (compute_packed) when documents finish at different steps: a
// finished document stays in the step's batch until half of it has finished, and every document's
// tokens must still equal its own decode (compute_packed of it alone; bitwise on the CPU). The EOS
// id is chosen from a first run so that several documents stop early, at different steps.
TEST_CASE("decode runner: batched generation with documents finishing at different steps equals each alone",
          "[unit]") {
  ModelConfig cfg = config_of("kimi_linear");
  cfg.eos_token_id = -1;
  ModeParams p;
  p.mode = OutputMode::Generate;
  p.max_new_tokens = 12;
  const int64_t V = cfg.vocab_size;
  std::vector<int64_t> docs;
  std::vector<std::vector<int32_t>> toks;
  for (int64_t d = 0; d < 6; ++d) {
    docs.push_back(d);
    std::vector<int32_t> t(static_cast<size_t>(3 + 5 * d));
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((int64_t(i) * 29 + d * 17 + 3) % V);
    toks.push_back(t);
  }
  std::vector<std::vector<int32_t>> free_run;
  {
    auto ck = Checkpoint::random(9);
    auto m = Model::build(cfg, *ck);
    for (const DocResult& r : compute_packed(*m, docs, toks, p, {}, nullptr)) free_run.push_back(r.ids);
  }
  // The token whose first appearances end the most documents early, at the most distinct steps.
  int32_t eos = -1;
  size_t best = 0;
  for (int32_t t = 0; t < int32_t(V); ++t) {
    std::vector<int64_t> first;
    for (const auto& ids : free_run)
      for (size_t i = 0; i + 1 < ids.size(); ++i)
        if (ids[i] == t) {
          first.push_back(int64_t(i));
          break;
        }
    std::sort(first.begin(), first.end());
    const size_t distinct = size_t(std::unique(first.begin(), first.end()) - first.begin());
    if (first.size() >= 3 && first.size() < free_run.size() && distinct >= 2 && first.size() + distinct > best)
      best = first.size() + distinct, eos = t;
  }
  REQUIRE(eos >= 0);  // this seed's documents share a token that stops some of them early
  cfg.eos_token_id = eos;
  auto ck = Checkpoint::random(9);
  auto m = Model::build(cfg, *ck);
  const std::vector<DocResult> all = compute_packed(*m, docs, toks, p, {}, nullptr);
  size_t early = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const DocResult one = compute_packed(*m, {docs[d]}, {toks[d]}, p, {}, nullptr)[0];
    CHECK(all[d].ids == one.ids);
    early += int64_t(all[d].ids.size()) < p.max_new_tokens;
  }
  CHECK(early >= 3);
}

TEST_CASE("LM head: greedy ids equal choose_token's argmax of the full logits, ties to the lower id; NaN rows refused",
          "[unit]") {
  const int64_t V = 50, D = 8, R = 4;
  Backend& be = cpu_backend();
  Tensor W({V, D});
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto rnd = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return float(double(x >> 11) / 9007199254740992.0 - 0.5);
  };
  for (auto& w : W.data) w = rnd();
  for (int64_t d = 0; d < D; ++d) {  // row 7 three times as long, copied to rows 30 and 41: a three-way tie
    W.data[size_t(7 * D + d)] *= 3.f;
    W.data[size_t(30 * D + d)] = W.data[size_t(41 * D + d)] = W.data[size_t(7 * D + d)];
  }
  std::vector<float> hid(size_t(R * D));
  for (auto& h : hid) h = rnd();
  for (int64_t d = 0; d < D; ++d) hid[size_t(d)] = 10.f * W.data[size_t(7 * D + d)];  // row 0: the tie is the max
  LmHead head(W, V, D, TpShard{}, be);
  const DTensor h = be.upload(hid.data(), {R, D}, be.act_dtype());
  std::vector<float> lg(size_t(R * V));
  head.logits_full(h, lg.data());
  std::vector<int32_t> ids(size_t(R), -1);
  head.greedy(h, ids.data());
  for (int64_t r = 0; r < R; ++r) CHECK(ids[size_t(r)] == choose_token(lg.data() + r * V, V, 0.0, 0, 0, 0));
  CHECK(ids[0] == 7);
  CHECK(lg[size_t(7)] == lg[size_t(30)]);
  hid.assign(hid.size(), std::nanf(""));
  CHECK_THROWS_WITH(head.greedy(be.upload(hid.data(), {R, D}, be.act_dtype()), ids.data()),
                    Catch::Contains("no logit that is a number"));
}
