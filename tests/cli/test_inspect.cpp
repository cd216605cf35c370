// `dayzero inspect`: structural diff against what dayzero supports, with the exit code contract.
#include <catch2/catch.hpp>

#include <map>

#include "cli/cli_util.hpp"
#include "io/checkpoint.hpp"

using namespace dzt;

TEST_CASE("inspect: every golden family is fully supported", "[unit][cli]") {
  std::string dir = tmpdir("inspect");
  for (const char* fam : {"kimi_linear", "deepseek_v32", "qwen3_next"}) {
    auto r = dayzero(std::string("inspect --model ") + DZ_SOURCE_DIR + "/tests/golden/" + fam, dir);
    INFO(fam << "\n" << r.out << r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find(", 0 unsupported") != std::string::npos);
    CHECK(r.out.find("reusable with different parameters") != std::string::npos);
  }
  auto r = dayzero(std::string("inspect --json --model ") + DZ_SOURCE_DIR + "/tests/golden/deepseek_v32", dir);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"unsupported\": 0") != std::string::npos);
  CHECK(r.out.find("indexer=16x32/top8") != std::string::npos);
}

TEST_CASE("inspect: an unknown tensor makes its module unsupported (exit 2)", "[unit][cli]") {
  std::string dir = tmpdir("inspect");
  REQUIRE(dayzero("make-model --preset demo --out " + dir + "/m", dir).code == 0);
  auto ck = dz::Checkpoint::open(dir + "/m");
  std::map<std::string, dz::Tensor> ts;
  for (const auto& n : ck->names()) ts[n] = ck->get(n, ck->info(n).shape);
  ts["model.layers.2.self_attn.mystery_proj.weight"] = dz::Tensor({4, 64}, 0.5f);
  std::string m2 = dir + "/m2";
  REQUIRE(std::system(("mkdir -p " + m2 + " && cp " + dir + "/m/config.json " + m2).c_str()) == 0);
  dz::write_safetensors(m2, ts, dz::DType::F32);
  auto r = dayzero("inspect --model " + m2, dir);
  INFO(r.out << r.err);
  CHECK(r.code == 2);
  CHECK(r.out.find("layer 2   token mixer") != std::string::npos);
  CHECK(r.out.find("unexpected tensor model.layers.2.self_attn.mystery_proj.weight") != std::string::npos);
  CHECK(r.out.find(", 1 unsupported") != std::string::npos);
}

TEST_CASE("inspect: an unknown model type is unsupported (exit 2)", "[unit][cli]") {
  std::string dir = tmpdir("inspect");
  REQUIRE(std::system(("mkdir -p " + dir + "/m && echo '{\"model_type\": \"mamba9\", \"hidden_size\": 8}' > " + dir +
                       "/m/config.json")
                          .c_str()) == 0);
  auto r = dayzero("inspect --model " + dir + "/m", dir);
  INFO(r.out << r.err);
  CHECK(r.code == 2);
  CHECK(r.out.find("mamba9") != std::string::npos);
  CHECK(r.out.find("unsupported") != std::string::npos);
}
