// Whole-model loading rules: strictness, and the DeepSeek MTP layers that are accepted and skipped.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "error_of.hpp"
#include "job/tools.hpp"
#include "model/model.hpp"

namespace {
std::string copy_with_extra(const std::string& tag, const std::string& extra_name, const std::string& cfg_patch) {
  std::string src = std::string(DZ_SOURCE_DIR) + "/tests/golden/deepseek_v32";
  std::string dst = "/tmp/dz_model_load_" + tag;
  REQUIRE(std::system(("rm -rf " + dst + " && mkdir -p " + dst).c_str()) == 0);
  auto ck = dz::Checkpoint::open(src);
  std::map<std::string, dz::Tensor> ts;
  for (const auto& n : ck->names()) ts[n] = ck->get(n, ck->info(n).shape);
  ts[extra_name] = dz::Tensor({2, 3}, 1.f);
  dz::write_safetensors(dst, ts, dz::DType::F32);
  std::ifstream f(src + "/config.json");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string cfg = ss.str();
  if (!cfg_patch.empty()) cfg.insert(cfg.find('{') + 1, cfg_patch);
  std::ofstream(dst + "/config.json") << cfg;
  return dst;
}

// The kimi_linear golden with every tensor name passed through `rename`.
std::string kimi_renamed(const std::string& tag, const std::function<std::string(const std::string&)>& rename) {
  std::string src = std::string(DZ_SOURCE_DIR) + "/tests/golden/kimi_linear";
  std::string dst = "/tmp/dz_model_load_" + tag;
  REQUIRE(std::system(("rm -rf " + dst + " && mkdir -p " + dst + " && cp " + src + "/config.json " + dst).c_str()) == 0);
  auto ck = dz::Checkpoint::open(src);
  std::map<std::string, dz::Tensor> ts;
  for (const auto& n : ck->names()) ts[rename(n)] = ck->get(n, ck->info(n).shape);
  dz::write_safetensors(dst, ts, dz::DType::F32);
  return dst;
}

// A golden checkpoint rewritten: tensor names through `rename` ("" drops one), `extra` added, and
// config.json through `edit`.
std::string rewrite_golden(const std::string& tag, const std::string& family,
                           const std::function<std::string(const std::string&)>& rename,
                           const std::function<void(nlohmann::json&)>& edit = {},
                           const std::vector<std::string>& extra = {}) {
  std::string src = std::string(DZ_SOURCE_DIR) + "/tests/golden/" + family;
  std::string dst = "/tmp/dz_model_load_" + tag;
  REQUIRE(std::system(("rm -rf " + dst + " && mkdir -p " + dst).c_str()) == 0);
  auto ck = dz::Checkpoint::open(src);
  std::map<std::string, dz::Tensor> ts;
  for (const auto& n : ck->names()) {
    const std::string m = rename(n);
    if (!m.empty()) ts[m] = ck->get(n, ck->info(n).shape);
  }
  for (const auto& n : extra) ts[n] = dz::Tensor({2, 3}, 1.f);
  dz::write_safetensors(dst, ts, dz::DType::F32);
  std::ifstream f(src + "/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  if (edit) edit(j);
  std::ofstream(dst + "/config.json") << j.dump(2);
  return dst;
}

std::string swap_prefix(const std::string& n, const std::string& from, const std::string& to) {
  return n.rfind(from, 0) == 0 ? to + n.substr(from.size()) : n;
}

using dz::test::error_of;

std::vector<float> last_hidden(const dz::Model& m, const std::vector<int32_t>& tok) {
  auto st = m.make_state();
  return m.backend().to_host(m.forward(tok.data(), int64_t(tok.size()), st));
}
}  // namespace

// transformers 5.17's save_pretrained writes Kimi's dense layer under block_sparse_moe. (DESIGN §2).
TEST_CASE("model load: a dense Kimi layer saved under block_sparse_moe. loads and scores the same", "[unit]") {
  const std::string pre = "model.layers.0.mlp.";
  std::string moved = kimi_renamed("kimi517", [&](const std::string& n) {
    return n.rfind(pre, 0) == 0 ? "model.layers.0.block_sparse_moe." + n.substr(pre.size()) : n;
  });
  auto a = dz::Model::load(std::string(DZ_SOURCE_DIR) + "/tests/golden/kimi_linear");
  auto b = dz::Model::load(moved);
  const std::vector<int32_t> tok = {5, 17, 200, 3, 99, 41, 7};
  CHECK(last_hidden(*a, tok) == last_hidden(*b, tok));
  // Both names at once: the block_sparse_moe. copy is left over and refused by name.
  std::string src = std::string(DZ_SOURCE_DIR) + "/tests/golden/kimi_linear", both = "/tmp/dz_model_load_kimi_both";
  REQUIRE(std::system(("rm -rf " + both + " && mkdir -p " + both + " && cp " + src + "/config.json " + both).c_str()) == 0);
  auto ck = dz::Checkpoint::open(src);
  std::map<std::string, dz::Tensor> ts;
  for (const auto& n : ck->names()) {
    ts[n] = ck->get(n, ck->info(n).shape);
    if (n.rfind(pre, 0) == 0) ts["model.layers.0.block_sparse_moe." + n.substr(pre.size())] = ts[n];
  }
  dz::write_safetensors(both, ts, dz::DType::F32);
  CHECK_THROWS_WITH(dz::Model::load(both), Catch::Contains("model.layers.0.block_sparse_moe."));
}

TEST_CASE("model load: DeepSeek MTP layers are accepted only when the config declares them", "[unit]") {
  std::string with = copy_with_extra("mtp", "model.layers.3.eh_proj.weight", "\"num_nextn_predict_layers\": 1,");
  CHECK_NOTHROW(dz::Model::load(with));
  std::string without = copy_with_extra("nomtp", "model.layers.3.eh_proj.weight", "");
  CHECK_THROWS_WITH(dz::Model::load(without), Catch::Contains("unexpected tensor model.layers.3.eh_proj.weight"));
  // A stray tensor inside a real layer is still an error even with MTP declared.
  std::string stray = copy_with_extra("stray", "model.layers.1.self_attn.extra.weight", "\"num_nextn_predict_layers\": 1,");
  CHECK_THROWS_WITH(dz::Model::load(stray), Catch::Contains("model.layers.1.self_attn.extra.weight"));
}

// Multimodal wrappers (DESIGN §2): the text model under model.language_model. (Qwen3.5, GLM-5.3)
// or language_model.model. + language_model.lm_head. (Kimi K3); vision towers recognised only when
// the config declares one; the text model's tensors named one way only.
TEST_CASE("model load: multimodal wrapper layouts", "[unit]") {
  const std::string fam = "qwen3_5_moe";
  const std::vector<int32_t> tok = {5, 17, 200, 3, 99, 41, 7, 250, 12};
  auto ref = dz::Model::load(std::string(DZ_SOURCE_DIR) + "/tests/golden/" + fam);
  CHECK(ref->config().wrapper_model_type == "qwen3_5_moe");
  CHECK(ref->config().has_vision);
  const std::vector<float> want = last_hidden(*ref, tok);

  // language_model.model.* / language_model.lm_head.* (K3's packaging): same model
  std::string k3 = rewrite_golden("wrap_k3", fam, [](const std::string& n) {
    return swap_prefix(swap_prefix(n, "model.language_model.", "language_model.model."), "lm_head.", "language_model.lm_head.");
  });
  CHECK(last_hidden(*dz::Model::load(k3), tok) == want);

  // the text-only class's config (qwen3_5_moe_text) over the wrapper's tensors: the vision tower
  // is not declared, so its tensors are unexpected and named
  std::string novis = rewrite_golden("wrap_novis", fam, [](const std::string& n) { return n; }, [](nlohmann::json& j) {
    nlohmann::json t = j["text_config"];
    j = t;
  });
  CHECK_THROWS_WITH(dz::Model::load(novis), Catch::Contains("unexpected tensor model.visual."));
  // ... and without them it loads and scores the same
  std::string text = rewrite_golden("wrap_text", fam, [](const std::string& n) {
    return n.rfind("model.visual.", 0) == 0 ? std::string() : n;
  }, [](nlohmann::json& j) {
    nlohmann::json t = j["text_config"];
    j = t;
  });
  CHECK(last_hidden(*dz::Model::load(text), tok) == want);

  // one tensor of the text model outside the wrapper's prefix: refused by its file name
  std::string mixed = rewrite_golden("wrap_mixed", fam, [](const std::string& n) {
    return n == "model.language_model.norm.weight" ? std::string("model.norm.weight") : n;
  });
  CHECK_THROWS_WITH(dz::Model::load(mixed), Catch::Contains("model.norm.weight"));
  // a missing tensor is named as the file would name it
  std::string missing = rewrite_golden("wrap_missing", fam, [](const std::string& n) {
    return n == "model.language_model.layers.1.linear_attn.in_proj_z.weight" ? std::string() : n;
  });
  CHECK_THROWS_WITH(dz::Model::load(missing),
                    Catch::Contains("missing tensor model.language_model.layers.1.linear_attn.in_proj_z.weight"));
  // the wrapper's text_config must be the family it wraps
  std::string wrong = rewrite_golden("wrap_wrongtype", fam, [](const std::string& n) { return n; },
                                     [](nlohmann::json& j) { j["text_config"]["model_type"] = "qwen3_next"; });
  CHECK_THROWS_WITH(dz::Model::load(wrong), Catch::Contains("text_config.model_type"));
}

// Qwen3.5 keeps its MTP layers under mtp. (mtp_num_hidden_layers): accepted, not run.
TEST_CASE("model load: Qwen3.5 MTP tensors are accepted only as the config declares them", "[unit]") {
  const std::string fam = "qwen3_5_moe";
  auto same = [](const std::string& n) { return n; };
  auto declare = [](int n) { return [n](nlohmann::json& j) { j["text_config"]["mtp_num_hidden_layers"] = n; }; };
  const std::vector<std::string> mtp = {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.norm.weight",
                                        "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.mlp.gate.weight"};
  CHECK_NOTHROW(dz::Model::load(rewrite_golden("mtp_ok", fam, same, declare(1), mtp)));
  CHECK_THROWS_WITH(dz::Model::load(rewrite_golden("mtp_undeclared", fam, same, {}, mtp)),
                    Catch::Contains("unexpected tensor mtp."));
  std::vector<std::string> two = mtp;
  two.push_back("mtp.layers.1.input_layernorm.weight");
  CHECK_THROWS_WITH(dz::Model::load(rewrite_golden("mtp_two", fam, same, declare(1), two)),
                    Catch::Contains("mtp.layers.1.input_layernorm.weight"));
}

// Qwen3-Next's release declares no MTP layer in config.json but ships mtp.*: counted from the names.
TEST_CASE("model load: Qwen3-Next mtp.* tensors without a config key are its MTP layers", "[unit]") {
  auto same = [](const std::string& n) { return n; };
  const std::vector<std::string> mtp = {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.input_layernorm.weight"};
  const std::string nokey = rewrite_golden("qn_mtp_nokey", "qwen3_next", same, {}, mtp);
  CHECK_NOTHROW(dz::Model::load(nokey));
  CHECK(dz::inspect(nokey, true) == 0);  // inspect reads them as the MTP layer too, nothing new
  // a stray tensor elsewhere is still refused
  std::vector<std::string> stray = mtp;
  stray.push_back("model.layers.0.extra.weight");
  CHECK_THROWS_WITH(dz::Model::load(rewrite_golden("qn_mtp_stray", "qwen3_next", same, {}, stray)),
                    Catch::Contains("model.layers.0.extra.weight"));
}

// Kimi K3 (tests/golden/kimi_k3, the release's packaging: the kimi_k3 wrapper, language_model.*,
// MXFP4 routed experts, A_log padded to 128 heads) and the other layouts of the same weights that
// users have: a dequantised export (plain BF16/F32 experts beside the same quantization_config),
// the text-only checkpoint (model.* / lm_head.weight under a kimi_linear config).
TEST_CASE("model load: Kimi K3 layouts (MXFP4 or plain experts, wrapped or text-only, padded A_log)", "[unit]") {
  const std::string src = std::string(DZ_SOURCE_DIR) + "/tests/golden/kimi_k3";
  const std::vector<int32_t> tok = {5, 17, 200, 3, 99, 31, 64, 7, 250, 12};
  auto packed = dz::Model::load(src);
  const auto ref = last_hidden(*packed, tok);

  // the experts written plain (their decoded values): the same numbers
  auto plain = rewrite_golden("k3plain", "kimi_k3", [](const std::string& n) { return n; });
  CHECK(last_hidden(*dz::Model::load(plain), tok) == ref);
  // text-only: model.* and lm_head.weight under the text config itself
  auto text = rewrite_golden(
      "k3text", "kimi_k3",
      [](const std::string& n) {
        if (n.rfind("vision_tower.", 0) == 0 || n.rfind("mm_projector.", 0) == 0) return std::string();
        return swap_prefix(swap_prefix(n, "language_model.model.", "model."), "language_model.lm_head.", "lm_head.");
      },
      [](nlohmann::json& j) { j = nlohmann::json(j["text_config"]); });
  CHECK(last_hidden(*dz::Model::load(text), tok) == ref);
  // A_log as [H] (not padded) loads the same; a non-zero padding entry is a head the config lacks
  auto unpadded = rewrite_golden("k3alog", "kimi_k3", [](const std::string& n) { return n; });
  {
    auto ck = dz::Checkpoint::open(unpadded);
    std::map<std::string, dz::Tensor> ts;
    for (const auto& n : ck->names()) ts[n] = ck->get(n, ck->info(n).shape);
    const std::string a = "language_model.model.layers.0.self_attn.A_log";
    dz::Tensor h({4});
    std::copy_n(ts[a].ptr(), 4, h.ptr());
    ts[a] = h;
    dz::write_safetensors(unpadded, ts, dz::DType::F32);
    CHECK(last_hidden(*dz::Model::load(unpadded), tok) == ref);
    ts[a] = dz::Tensor({128}, 0.f);
    ts[a].ptr()[9] = 0.5f;
    dz::write_safetensors(unpadded, ts, dz::DType::F32);
    const std::string e = error_of([&] { dz::Model::load(unpadded); });
    CHECK(e.find("A_log: entry 9 of the padding past the 4 heads is 0.5") != std::string::npos);
  }
  // MXFP4 pairs in the files without the quantization_config that declares them
  const std::string noq = "/tmp/dz_model_load_k3noq";
  REQUIRE(std::system(("rm -rf " + noq + " && mkdir -p " + noq + " && cp " + src + "/model.safetensors " + noq).c_str()) == 0);
  {
    std::ifstream f(src + "/config.json");
    nlohmann::json j = nlohmann::json::parse(f);
    j["text_config"].erase("quantization_config");
    std::ofstream(noq + "/config.json") << j.dump(2);
  }
  const std::string e = error_of([&] { dz::Model::load(noq); });
  CHECK(e.find("MXFP4-packed weights") != std::string::npos);
  CHECK(e.find("declares no compressed-tensors mxfp4-pack-quantized quantization_config") != std::string::npos);
}
