// MTP drafts (model/mtp.hpp, Model::mtp_extend / mtp_draft) on the CPU backend: the MTP layer runs
// one position behind the model, its chained drafts are undone, and after any sequence of verify
// steps (drafts kept or not, several documents packed) every first draft's logits equal those of
// one MTP forward over the whole sequence.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "model/model.hpp"

using namespace dz;

namespace {

// A golden's config declaring one MTP layer; name "deepseek_v4+KIND": DeepSeek-V4 with the MTP
// block's layer_types entry KIND (the compressors' undo over the chained forwards).
ModelConfig mtp_config(std::string name) {
  std::string v4_kind;
  if (name.rfind("deepseek_v4+", 0) == 0) v4_kind = name.substr(12), name = "deepseek_v4";
  std::ifstream f(std::string(DZ_SOURCE_DIR) + "/tests/golden/" + name + "/config.json");
  REQUIRE(f.good());
  nlohmann::json j = nlohmann::json::parse(f);
  nlohmann::json& t = j.contains("text_config") ? j["text_config"] : j;
  t[t["model_type"].get<std::string>().rfind("qwen", 0) == 0 ? "mtp_num_hidden_layers" : "num_nextn_predict_layers"] = 1;
  if (!v4_kind.empty()) t["layer_types"].push_back(v4_kind);
  ModelConfig c = ModelConfig::from_json(j);
  c.load_mtp = true;
  return c;
}

// max |a - b| / max |b| over rows
double rel_diff(const float* a, const float* b, int64_t n) {
  double m = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - b[i])), s = std::max(s, std::fabs(double(b[i])));
  return s > 0 ? m / s : m;
}

}  // namespace

TEST_CASE("MTP: drafts after verify steps equal one MTP forward over the whole sequence", "[unit]") {
  // Two documents decoded together: each step drafts k (1..3) tokens, forwards [current, drafts]
  // as a verify forward, keeps a prescribed number of rows (whatever the model would choose: the
  // MTP layer's exactness holds for any consumed sequence) and picks an arbitrary next token. The
  // logits of each step's first draft are compared with the reference: the whole consumed sequence
  // forwarded once, then the MTP layer over all its rows at once. Tolerance 1e-4 relative: the same
  // fp32 arithmetic over row blocks of other sizes (cached attention vs one pass).
  // defer: each verify step's catch-up rows wait for the next first draft's forward (the decode
  // loop's way), else they are forwarded at once.
  for (const bool defer : {false, true})
  for (const std::string name : {"deepseek_v32", "glm_moe_dsa", "qwen3_next", "qwen3_5_moe_text", "deepseek_v4",
                                  "deepseek_v4+compressed_sparse_attention", "deepseek_v4+heavily_compressed_attention"}) {
    INFO(name << (defer ? ", catch-up deferred" : ""));
    const ModelConfig cfg = mtp_config(name);
    auto ck = Checkpoint::random(11);
    auto m = Model::build(cfg, *ck);
    REQUIRE(m->has_mtp());
    Backend& be = m->backend();
    const int64_t V = cfg.vocab_size;
    const size_t B = 2;
    std::vector<std::vector<int32_t>> seq(B);  // every token a document consumed, then its current one
    std::vector<Model::State> st;
    std::vector<Model::State*> sp;
    for (size_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < 7 + 4 * int64_t(b); ++i) seq[b].push_back(int32_t((i * 37 + 11 * b + 5) % V));
      st.push_back(m->make_state());
    }
    for (auto& s : st) sp.push_back(&s);
    {  // the prompts, packed
      std::vector<int32_t> all;
      std::vector<int64_t> cu{0};
      for (auto& s : seq) all.insert(all.end(), s.begin(), s.end()), cu.push_back(int64_t(all.size()));
      DTensor in;  // what the MTP layer reads (DeepSeek-V4: the streams before the head)
      m->forward_packed(all.data(), cu, sp, {}, nullptr, &in);
      m->mtp_extend(all.data(), cu, in, sp);
    }
    for (size_t b = 0; b < B; ++b) seq[b].push_back(int32_t((90 + 13 * b) % V));
    struct Seen {
      size_t doc;
      int64_t row;  // the MTP row: the model's position at the step, less one
      std::vector<float> logits;
    };
    std::vector<Seen> seen;
    int64_t accepted_rows = 0;
    for (int step = 0; step < 7; ++step) {
      std::vector<int32_t> cur;
      std::vector<int64_t> k;
      for (size_t b = 0; b < B; ++b) cur.push_back(seq[b].back()), k.push_back((step + int64_t(b)) % 3 + 1);
      std::vector<float> fl;
      const auto drafts = m->mtp_draft(cur, sp, k, &fl);
      for (size_t b = 0; b < B; ++b) {
        REQUIRE(int64_t(drafts[b].size()) == k[b]);
        seen.push_back({b, st[b].pos - 1, std::vector<float>(fl.begin() + int64_t(b) * V, fl.begin() + int64_t(b + 1) * V)});
        // the first draft is the argmax of those logits
        CHECK(drafts[b][0] == int32_t(std::max_element(seen.back().logits.begin(), seen.back().logits.end()) -
                                      seen.back().logits.begin()));
      }
      std::vector<int32_t> vt;
      std::vector<int64_t> cu{0}, keep;
      for (size_t b = 0; b < B; ++b) {
        vt.push_back(cur[b]);
        vt.insert(vt.end(), drafts[b].begin(), drafts[b].end());
        cu.push_back(int64_t(vt.size()));
        keep.push_back((step * 5 + int64_t(b) * 3) % (k[b] + 1) + 1);  // 1 .. k + 1 rows
      }
      m->spec_begin(sp, SpecRestore::Replay);
      DTensor h;
      m->forward_packed(vt.data(), cu, sp, {}, nullptr, &h);
      m->spec_keep(sp, keep);
      std::vector<int32_t> kt;
      std::vector<int64_t> kcu{0};
      DTensor hk = be.act({keep[0] + keep[1], h.cols()});
      for (size_t b = 0; b < B; ++b) {
        kt.insert(kt.end(), vt.begin() + cu[b], vt.begin() + cu[b] + keep[b]);
        be.copy_rows(h, cu[b], hk, kcu.back(), keep[b]);
        kcu.push_back(int64_t(kt.size()));
        seq[b].insert(seq[b].end(), vt.begin() + cu[b] + 1, vt.begin() + cu[b] + keep[b]);  // the kept drafts
        seq[b].push_back(int32_t((step * 29 + 7 * int64_t(b) + 3) % V));                     // the next token
        accepted_rows += keep[b] - 1;
      }
      m->mtp_extend(kt.data(), kcu, hk, sp, nullptr, defer);
    }
    CHECK(accepted_rows >= 10);  // the multi-row extend ran
    // The reference: each document's consumed tokens at once, then the MTP layer over all its rows
    // (every row's next token known: the last one's is the current token).
    for (size_t b = 0; b < B; ++b) {
      const int64_t n = int64_t(seq[b].size()) - 1;
      REQUIRE(st[b].pos == n);
      Model::State r = m->make_state();
      DTensor h, out;
      m->forward(seq[b].data(), n, r, {}, nullptr, nullptr, &h);
      m->mtp_extend(seq[b].data(), {0, n}, h, {&r}, &out);
      REQUIRE(out.rows() == n - 1);
      std::vector<float> ref(static_cast<size_t>(n * V));
      m->logits(out, ref.data());
      std::vector<float> last;
      const auto d = m->mtp_draft({seq[b].back()}, {&r}, {1}, &last);
      std::copy(last.begin(), last.end(), ref.begin() + (n - 1) * V);
      int checked = 0;
      for (const Seen& s : seen) {
        if (s.doc != b) continue;
        REQUIRE(s.row >= 0);
        REQUIRE(s.row < n);
        INFO("document " << b << " MTP row " << s.row);
        CHECK(rel_diff(s.logits.data(), ref.data() + s.row * V, V) < 1e-4);
        ++checked;
      }
      CHECK(checked == 7);
      // the last step's rows were extended for good: the state's MTP position is the model's, less one
      CHECK(r.mtp->pos == n);
      (void)d;
    }
  }
}

TEST_CASE("MTP: refused without MTP layers, for families whose MTP layer is not built, and before a prefill",
          "[unit]") {
  auto with = [](const std::string& name, bool declare) {
    std::ifstream f(std::string(DZ_SOURCE_DIR) + "/tests/golden/" + name + "/config.json");
    nlohmann::json j = nlohmann::json::parse(f);
    nlohmann::json& t = j.contains("text_config") ? j["text_config"] : j;
    if (declare) t["num_nextn_predict_layers"] = 1;
    ModelConfig c = ModelConfig::from_json(j);
    c.load_mtp = true;
    return c;
  };
  CHECK_THROWS_WITH(Model::build(with("kimi_linear", false), *Checkpoint::random(1)),
                    Catch::Contains("declares no MTP layers"));
  // GLM-5.3-Flash's release has no MTP layer (its config key is not read): one declared anyway is refused
  ModelConfig glm = with("glm5_next", false);
  glm.mtp_layers = 1;
  CHECK_THROWS_WITH(Model::build(glm, *Checkpoint::random(1)), Catch::Contains("not built"));
  auto m = Model::build(mtp_config("deepseek_v32"), *Checkpoint::random(1));
  Model::State st = m->make_state();
  CHECK_THROWS_WITH(m->mtp_draft({3}, {&st}, {2}), Catch::Contains("no pending MTP row"));
  ModelConfig no_load = mtp_config("deepseek_v32");
  no_load.load_mtp = false;  // declared in config.json, not asked for: not built
  auto plain = Model::build(no_load, *Checkpoint::random(1));
  CHECK_FALSE(plain->has_mtp());
  Model::State ps = plain->make_state();
  CHECK_THROWS_WITH(plain->mtp_draft({3}, {&ps}, {1}), Catch::Contains("without its MTP layer"));
}

TEST_CASE("MTP: DeepSeek-V4's MTP block takes the config's entry num_hidden_layers", "[unit]") {
  // The published config.json carries compress_ratios with one entry past the layers (0: the MTP
  // block is the sliding window alone); transformers' layer_types may too; absent: sliding (vLLM).
  std::ifstream f(std::string(DZ_SOURCE_DIR) + "/tests/golden/deepseek_v4/config.json");
  const nlohmann::json base = nlohmann::json::parse(f);
  auto parse = [&](const nlohmann::json& edit) {
    nlohmann::json j = base;
    j["num_nextn_predict_layers"] = 1;
    j.merge_patch(edit);
    return ModelConfig::from_json(j);
  };
  ModelConfig c = parse(nlohmann::json::object());
  CHECK(c.mtp_compress_rate == 0);
  c = parse({{"layer_types", {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                              "compressed_sparse_attention", "heavily_compressed_attention"}}});
  CHECK(c.mtp_compress_rate == 16);
  CHECK_FALSE(c.mtp_csa);
  CHECK(c.num_layers == 4);
  nlohmann::json raw = base;  // DeepSeek's own keys: compress_ratios (0 / 4 / 128) instead of layer_types
  raw.erase("layer_types");
  raw["compress_ratios"] = {0, 4, 128, 4, 4};
  raw["num_nextn_predict_layers"] = 1;
  c = ModelConfig::from_json(raw);
  CHECK(c.mtp_compress_rate == 4);
  CHECK(c.mtp_csa);
  raw["compress_ratios"] = {0, 4, 128, 4, 0};
  c = ModelConfig::from_json(raw);
  CHECK(c.mtp_compress_rate == 0);
  CHECK(c.to_json()["mtp_attention"] == "sliding");
}
