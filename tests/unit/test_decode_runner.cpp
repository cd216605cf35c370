// The graph runner's decode step (model/decode_runner.hpp) on the CPU backend, where it runs
// eagerly: it must issue exactly Model::forward_packed's ops over one token per document, so its
// hidden states equal forward_packed's bitwise, and each document's equal its own forward() of one
// token; states advance the same way. Batches change between steps (a document finishes), as in
// generate mode. Models: the committed golden configs (KDA + MLA + MoE, GDN + gated GQA + MoE,
// MLA + DSA) and the demo preset (Block AttnRes). The CUDA graphs themselves are tested on the GPU
// (tests/gpu/test_model_gpu.cpp: replayed steps equal eager ones bitwise).
#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "job/tools.hpp"  // presets()
#include "model/decode_runner.hpp"
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
