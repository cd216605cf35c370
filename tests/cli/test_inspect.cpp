// `dayzero inspect`: structural diff against what dayzero supports, with the exit code contract.
#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "cli/cli_util.hpp"
#include "io/checkpoint.hpp"

using namespace dzt;

TEST_CASE("inspect: every golden family is fully supported", "[unit][cli]") {
  std::string dir = tmpdir("inspect");
  for (const char* fam : {"kimi_linear", "deepseek_v32", "qwen3_next", "kimi_linear_tf523", "deepseek_v32_tf523",
                          "qwen3_next_tf523", "qwen3_5_moe", "qwen3_5_moe_text", "glm_moe_dsa"}) {
    auto r = dayzero(std::string("inspect --model ") + DZ_SOURCE_DIR + "/tests/golden/" + fam, dir);
    INFO(fam << "\n" << r.out << r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find(", 0 new") != std::string::npos);
    CHECK(r.out.find("reusable with different parameters") != std::string::npos);
  }
  auto r = dayzero(std::string("inspect --json --model ") + DZ_SOURCE_DIR + "/tests/golden/deepseek_v32", dir);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"new\": 0") != std::string::npos);
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
  CHECK(r.out.find(", 1 new") != std::string::npos);
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
  CHECK(r.out.find("new") != std::string::npos);
}

// ---- the structural diff of a family dayzero has no parser for (issue 11 item 4) ----
namespace {
// A copy of a checkpoint directory with config.json edited and tensors added (extra: name -> shape).
std::string variant(const std::string& src, const std::string& dst, const std::function<void(nlohmann::json&)>& edit,
                    const std::map<std::string, dz::Shape>& extra = {}) {
  REQUIRE(std::system(("rm -rf " + dst + " && mkdir -p " + dst).c_str()) == 0);
  auto ck = dz::Checkpoint::open(src);
  std::map<std::string, dz::Tensor> ts;
  for (const auto& n : ck->names()) ts[n] = ck->get(n, ck->info(n).shape);
  for (const auto& kv : extra) ts[kv.first] = dz::Tensor(kv.second, 0.5f);
  dz::write_safetensors(dst, ts, dz::DType::F32);
  std::ifstream f(src + "/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  edit(j);
  std::ofstream(dst + "/config.json") << j.dump(2);
  return dst;
}

nlohmann::json inspect_json(const std::string& model, const std::string& dir, int* code) {
  auto r = dayzero("inspect --json --model " + model, dir);
  INFO(r.out << r.err);
  *code = r.code;
  return nlohmann::json::parse(r.out);
}

// Rows of `j` whose where/module match (module "" = any).
std::vector<nlohmann::json> rows(const nlohmann::json& j, const std::string& where, const std::string& module) {
  std::vector<nlohmann::json> v;
  for (const auto& r : j["modules"])
    if (r["where"] == where && (module.empty() || r["module"] == module)) v.push_back(r);
  return v;
}
}  // namespace

TEST_CASE("inspect: the 2026 families with their support switched off are classified from tensors alone",
          "[unit][cli]") {
  std::string dir = tmpdir("inspect_struct");
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/";
  int code = 0;
  // Qwen3.5 (wrapper and text model renamed): every module dayzero's, only the normaliser is new
  auto q = inspect_json(variant(g + "qwen3_5_moe", dir + "/q35", [](nlohmann::json& j) {
    j["model_type"] = "qwen3_5_moe_off";
    j["text_config"]["model_type"] = "qwen3_5_moe_text_off";
  }), dir, &code);
  CHECK(code == 2);
  CHECK(q["structural"] == true);
  CHECK(q["summary"]["new"] == 1);
  CHECK(rows(q, "config", "normaliser")[0]["status"] == "new");
  for (int l = 0; l < 3; ++l) {
    auto m = rows(q, "layer " + std::to_string(l), "token mixer");
    REQUIRE(m.size() == 1);
    CHECK(m[0]["kind"] == (l < 2 ? "GDN" : "GQA"));
    CHECK(m[0]["status"] == "reusable with different parameters");
    if (l < 2) CHECK(m[0]["params"] == "GDN v_heads=4 v=16 qk_width=32 conv=4 projections=split");
    auto f = rows(q, "layer " + std::to_string(l), "ffn");
    REQUIRE(f.size() == 1);
    CHECK(f[0]["kind"] == "MoE");
  }
  CHECK(rows(q, "model", "vision tower")[0]["status"] == "reusable");
  // GLM-5 renamed: MLA with the indexer on its full layers, without on its shared ones
  auto glm = inspect_json(variant(g + "glm_moe_dsa", dir + "/glm5", [](nlohmann::json& j) { j["model_type"] = "glm_x"; }),
                          dir, &code);
  CHECK(code == 2);
  CHECK(glm["summary"]["new"] == 1);
  CHECK(rows(glm, "layer 0", "token mixer")[0]["params"] ==
        "MLA heads=4 q_lora=32 kv_lora=32 nope=16 rope=16 v=16 out_gate=0 indexer=16x32/top8");
  CHECK(rows(glm, "layer 1", "token mixer")[0]["params"] == "MLA heads=4 q_lora=32 kv_lora=32 nope=16 rope=16 v=16 out_gate=0");
}

TEST_CASE("inspect: Kimi K3 parsed, and from tensors alone with its support switched off", "[unit][cli]") {
  const std::string dir = tmpdir("inspect_k3");
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/kimi_k3";
  int code = 0;
  auto parsed = inspect_json(g, dir, &code);
  CHECK(code == 0);
  CHECK(parsed["summary"]["new"] == 0);
  CHECK(parsed["family"] == "kimi_linear (in kimi_k3)");
  CHECK(rows(parsed, "layer 0", "token mixer")[0]["params"] ==
        "KDA heads=4 k=16 v=16 conv=4 gate=lower_bound_sigmoid out_gate=full_rank");
  CHECK(rows(parsed, "layer 1", "ffn")[0]["params"] ==
        "MoE experts=8 top=2 width=128 shared=2x128 score=sigmoid groups=1/1 act=situ(1.5,2) latent=32 mxfp4");
  // the wrapper and its text model renamed: only the normaliser is new; the MXFP4 experts, the latent
  // MoE, the full-rank KDA gate, the gated MLA and the AttnRes sites are dayzero's, read off the tensors
  // (the files copied as they are: the MXFP4 pairs stay packed)
  REQUIRE(std::system(("rm -rf " + dir + "/k3 && mkdir -p " + dir + "/k3 && cp " + g + "/model.safetensors " + dir + "/k3")
                          .c_str()) == 0);
  {
    std::ifstream f(g + "/config.json");
    nlohmann::json j = nlohmann::json::parse(f);
    j["model_type"] = "kimi_k3_off";
    j["text_config"]["model_type"] = "kimi_linear_off";
    std::ofstream(dir + "/k3/config.json") << j.dump(2);
  }
  auto k = inspect_json(dir + "/k3", dir, &code);
  CHECK(code == 2);
  CHECK(k["structural"] == true);
  CHECK(k["family"] == "kimi_linear_off (in kimi_k3_off)");
  CHECK(k["summary"]["new"] == 1);  // the normaliser
  CHECK(rows(k, "config", "keys").empty());  // activation_situ_*, quantization_config: keys dayzero reads
  CHECK(rows(k, "layer 0", "token mixer")[0]["params"] == "KDA heads=4 k=16 v=16 conv=4 out_gate=full_rank");
  CHECK(rows(k, "layer 3", "token mixer")[0]["params"] == "MLA heads=4 q_lora=32 kv_lora=32 nope=16 rope=8 v=16 out_gate=1");
  const auto moe = rows(k, "layer 1", "ffn")[0];
  CHECK(moe["status"] == "reusable with different parameters");
  CHECK(moe["params"] == "MoE experts=8 width=128 shared_width=256 correction_bias=1 shared_gate=0 latent=32 mxfp4");
  for (int l = 0; l < 6; ++l) CHECK(rows(k, "layer " + std::to_string(l), "residual")[0]["kind"] == "Block AttnRes");
  CHECK(rows(k, "model", "residual (output site)")[0]["status"] == "reusable with different parameters");
  CHECK(rows(k, "model", "vision tower")[0]["status"] == "reusable");
}

TEST_CASE("inspect: GLM-5.3-Flash and DeepSeek-V4 (transformers 5.23 checkpoints) show what is new", "[unit][cli]") {
  std::string dir = tmpdir("inspect_struct");
  const std::string fx = std::string(DZ_SOURCE_DIR) + "/tests/fixtures/";
  int code = 0;
  // GLM-5.3-Flash: dayzero parses it; with its support switched off every module is still dayzero's
  auto parsed = inspect_json(fx + "glm5_next", dir, &code);
  CHECK(code == 0);
  CHECK(parsed["summary"]["new"] == 0);
  auto g = inspect_json(variant(fx + "glm5_next", dir + "/g53", [](nlohmann::json& j) {
    j["model_type"] = "glm5_next_off";
    j["text_config"]["model_type"] = "glm5_next_text_off";
  }), dir, &code);
  CHECK(code == 2);
  CHECK(g["family"] == "glm5_next_text_off (in glm5_next_off)");
  CHECK(g["summary"]["new"] == 1);  // the normaliser
  CHECK(rows(g, "config", "keys").empty());  // hc_mult, swiglu_limit, index_kpool: keys dayzero reads
  for (int l = 0; l < 4; ++l) {
    auto r = rows(g, "layer " + std::to_string(l), "residual");
    REQUIRE(r.size() == 1);
    CHECK(r[0]["status"] == "reusable with different parameters");
    CHECK(r[0]["params"] == "mHC streams=4");
  }
  CHECK(rows(g, "layer 0", "token mixer")[0]["params"] == "KDA heads=4 k=16 v=16 conv=4");
  auto mla = rows(g, "layer 3", "token mixer")[0];
  CHECK(mla["status"] == "reusable with different parameters");
  CHECK(mla["params"] == "MLA heads=4 q_lora=32 kv_lora=32 nope=32 rope=0 v=32 out_gate=0 indexer=16x32/top16 kpool=4");

  // DeepSeek-V4: dayzero parses it; with its support switched off every module is still dayzero's
  auto dp = inspect_json(fx + "deepseek_v4", dir, &code);
  CHECK(code == 0);
  CHECK(dp["summary"]["new"] == 0);
  auto d = inspect_json(variant(fx + "deepseek_v4", dir + "/v4", [](nlohmann::json& j) { j["model_type"] = "deepseek_v4_off"; }),
                        dir, &code);
  CHECK(code == 2);
  CHECK(d["summary"]["new"] == 1);  // the normaliser
  CHECK(rows(d, "config", "keys").empty());  // compress_rates, o_groups, sliding_window: keys dayzero reads
  CHECK(rows(d, "model", "hyper-connection head")[0]["status"] == "reusable with different parameters");
  CHECK(rows(d, "layer 1", "residual")[0]["status"] == "reusable with different parameters");  // the same mHC
  CHECK(rows(d, "model", "embedding, final norm, LM head")[0]["status"] == "reusable");  // head.weight
  auto att = rows(d, "layer 3", "token mixer")[0];
  CHECK(att["status"] == "reusable with different parameters");
  CHECK(att["params"].get<std::string>().find("DSV4 heads=4 head_dim=32") == 0);
  CHECK(att["params"].get<std::string>().find("CSA/4 indexer=16x32") != std::string::npos);
  CHECK(rows(d, "layer 0", "token mixer")[0]["params"].get<std::string>().find("HCA/128") != std::string::npos);
  auto hash = rows(d, "layer 0", "ffn")[0];  // a hash-routed MoE layer: the MoE plus gate.tid2eid
  CHECK(hash["status"] == "reusable with different parameters");
  CHECK(hash["params"].get<std::string>().find("hash_routed=1") != std::string::npos);
  CHECK(rows(d, "layer 3", "ffn")[0]["status"] == "reusable with different parameters");
  CHECK(rows(d, "model", "MTP layers").empty());  // the fixture's MTP layer is not saved by transformers
}

TEST_CASE("inspect: an invented module in an otherwise known family is new, with its tensors", "[unit][cli]") {
  std::string dir = tmpdir("inspect_struct");
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/";
  int code = 0;
  auto j = inspect_json(variant(g + "qwen3_5_moe", dir + "/inv",
                                [](nlohmann::json& c) {
                                  c["model_type"] = "qwen3_5_moe_off";
                                  c["text_config"]["memory_slots"] = 16;
                                },
                                {{"model.language_model.layers.1.memory.keys", {16, 64}},
                                 {"model.language_model.layers.1.memory.values", {16, 64}},
                                 {"model.language_model.layers.2.mlp.router_temperature", {1}}}),
                        dir, &code);
  CHECK(code == 2);
  auto mem = rows(j, "layer 1", "memory");
  REQUIRE(mem.size() == 1);
  CHECK(mem[0]["status"] == "new");
  CHECK(mem[0]["note"].get<std::string>().find("model.layers.1.memory.keys [16, 64]") != std::string::npos);
  auto ffn = rows(j, "layer 2", "ffn")[0];
  CHECK(ffn["status"] == "new");
  CHECK(ffn["note"].get<std::string>().find("router_temperature") != std::string::npos);
  CHECK(rows(j, "config", "keys")[0]["note"].get<std::string>().find("memory_slots=16") != std::string::npos);
  CHECK(rows(j, "layer 0", "ffn")[0]["status"] == "reusable with different parameters");  // the rest is unchanged
  // the same checkpoint under its real model_type: dayzero's loader names the stray tensor
  auto k = inspect_json(variant(g + "qwen3_5_moe", dir + "/inv2", [](nlohmann::json&) {},
                                {{"model.language_model.layers.1.memory.keys", {16, 64}}}),
                        dir, &code);
  CHECK(code == 2);
  CHECK(k["structural"] == false);
}
