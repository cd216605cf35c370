// A golden checkpoint with its MTP fixture (tests/golden/mtp/, make_mtp.py) beside it, for the MTP
// tests of both backends.
#pragma once
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"

namespace dzt {

// tests/golden/<fam> with tests/golden/mtp/<fam>.safetensors, its config declaring one MTP layer
// (the key its family publishes; DeepSeek-V4 also its attention kind), written under `root`;
// returns the directory.
inline std::string golden_with_mtp(const std::string& fam, const std::string& root) {
  const std::string src = std::string(DZ_SOURCE_DIR) + "/tests/golden/";
  const std::string dst = root + "/mtp_golden_" + fam;
  REQUIRE(std::system(("rm -rf " + dst + " && mkdir -p " + dst).c_str()) == 0);
  std::map<std::string, dz::Tensor> ts;
  for (const std::string& file : {src + fam, src + "mtp/" + fam + ".safetensors"}) {
    auto ck = dz::Checkpoint::open(file);
    for (const auto& n : ck->names()) ts[n] = ck->get(n, ck->info(n).shape);
  }
  dz::write_safetensors(dst, ts, dz::DType::F32);
  std::ifstream f(src + fam + "/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  j[fam.rfind("qwen", 0) == 0 ? "mtp_num_hidden_layers" : "num_nextn_predict_layers"] = 1;
  if (fam == "deepseek_v4") j["layer_types"].push_back("sliding_attention");  // the MTP block's entry, as published
  std::ofstream(dst + "/config.json") << j.dump(2);
  return dst;
}

}  // namespace dzt
