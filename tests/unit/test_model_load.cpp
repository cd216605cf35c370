// Whole-model loading rules: strictness, and the DeepSeek MTP layers that are accepted and skipped.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
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
}  // namespace

TEST_CASE("model load: DeepSeek MTP layers are accepted only when the config declares them", "[unit]") {
  std::string with = copy_with_extra("mtp", "model.layers.3.eh_proj.weight", "\"num_nextn_predict_layers\": 1,");
  CHECK_NOTHROW(dz::Model::load(with));
  std::string without = copy_with_extra("nomtp", "model.layers.3.eh_proj.weight", "");
  CHECK_THROWS_WITH(dz::Model::load(without), Catch::Contains("unexpected tensor model.layers.3.eh_proj.weight"));
  // A stray tensor inside a real layer is still an error even with MTP declared.
  std::string stray = copy_with_extra("stray", "model.layers.1.self_attn.extra.weight", "\"num_nextn_predict_layers\": 1,");
  CHECK_THROWS_WITH(dz::Model::load(stray), Catch::Contains("model.layers.1.self_attn.extra.weight"));
}
