// Whole-model loading rules: strictness, and the DeepSeek MTP layers that are accepted and skipped.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "io/checkpoint.hpp"
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
