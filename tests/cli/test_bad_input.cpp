// Bad input (DESIGN.md §3): each case gets one clear error line, a non-zero exit before any work,
// and an existing result stays byte-identical.
#include <catch2/catch.hpp>
#include <hdf5.h>

#include <sys/stat.h>

#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.hpp"
#include "io/hdf5_io.hpp"

using namespace dzt;

namespace {

struct Fixture {
  std::string dir, model, good_in, prev_out, prev_bytes;
  Fixture() {
    dir = tmpdir("bad");
    model = dir + "/m";
    REQUIRE(dayzero("make-model --preset demo --out " + model, dir).code == 0);
    good_in = dir + "/good.h5";
    dz::write_input_file(good_in, {5, 6, 7, 8, 9, 10}, {0, 2, 6});
    prev_out = dir + "/out.h5";
    auto r = dayzero("run --model " + model + " --input " + good_in + " --output " + prev_out, dir, 1);
    REQUIRE(r.code == 0);
    prev_bytes = slurp(prev_out);
    REQUIRE(!prev_bytes.empty());
  }
  // Runs against the existing output with --overwrite (so only the bad input can stop it) and
  // checks the contract.
  void expect_refused(const std::string& args, const std::string& needle) {
    auto r = dayzero("run " + args + " --output " + prev_out + " --overwrite", dir, 1);
    INFO("stderr: " << r.err);
    CHECK(r.code != 0);
    CHECK(error_lines(r.err) == 1);
    CHECK(r.err.find(needle) != std::string::npos);
    CHECK(slurp(prev_out) == prev_bytes);
    CHECK(!exists(prev_out + ".part"));
  }
};

void write_raw(const std::string& path, const std::vector<int64_t>* tokens64, const std::vector<int32_t>* tokens,
               const std::vector<int64_t>* offsets, const std::vector<double>* offsets_f = nullptr) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  auto put = [&](const char* name, hid_t type, const void* data, hsize_t n) {
    hid_t s = H5Screate_simple(1, &n, nullptr);
    hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(d);
    H5Sclose(s);
  };
  if (tokens) put("tokens", H5T_NATIVE_INT32, tokens->data(), tokens->size());
  if (tokens64) put("tokens", H5T_NATIVE_INT64, tokens64->data(), tokens64->size());
  if (offsets) put("offsets", H5T_NATIVE_INT64, offsets->data(), offsets->size());
  if (offsets_f) put("offsets", H5T_NATIVE_DOUBLE, offsets_f->data(), offsets_f->size());
  H5Fclose(f);
}

}  // namespace

TEST_CASE("bad input: missing /tokens", "[unit][cli]") {
  Fixture fx;
  std::vector<int64_t> off{0, 2};
  write_raw(fx.dir + "/in.h5", nullptr, nullptr, &off);
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "/tokens");
}

TEST_CASE("bad input: missing /offsets", "[unit][cli]") {
  Fixture fx;
  std::vector<int32_t> tok{1, 2, 3};
  write_raw(fx.dir + "/in.h5", nullptr, &tok, nullptr);
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "/offsets");
}

TEST_CASE("bad input: offsets not monotone", "[unit][cli]") {
  Fixture fx;
  std::vector<int32_t> tok{1, 2, 3, 4};
  std::vector<int64_t> off{0, 3, 2, 4};
  write_raw(fx.dir + "/in.h5", nullptr, &tok, &off);
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "offsets");
}

TEST_CASE("bad input: offsets past the end of /tokens", "[unit][cli]") {
  Fixture fx;
  std::vector<int32_t> tok{1, 2, 3, 4};
  std::vector<int64_t> off{0, 2, 9};
  write_raw(fx.dir + "/in.h5", nullptr, &tok, &off);
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "offsets");
}

TEST_CASE("bad input: token id >= vocab", "[unit][cli]") {
  Fixture fx;
  dz::write_input_file(fx.dir + "/in.h5", {1, 2, 3, 512}, {0, 2, 4});
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "512");
}

TEST_CASE("bad input: negative token id", "[unit][cli]") {
  Fixture fx;
  dz::write_input_file(fx.dir + "/in.h5", {1, -4, 3}, {0, 3});
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "-4");
}

TEST_CASE("bad input: empty document", "[unit][cli]") {
  Fixture fx;
  dz::write_input_file(fx.dir + "/in.h5", {1, 2, 3}, {0, 1, 1, 3});
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "empty");
}

TEST_CASE("bad input: float offsets", "[unit][cli]") {
  Fixture fx;
  std::vector<int32_t> tok{1, 2, 3};
  std::vector<double> off{0, 3};
  write_raw(fx.dir + "/in.h5", nullptr, &tok, nullptr, &off);
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "/offsets");
}

TEST_CASE("bad input: not an HDF5 file", "[unit][cli]") {
  Fixture fx;
  { std::ofstream(fx.dir + "/in.h5") << "this is not hdf5\n"; }
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/in.h5", "in.h5");
}

TEST_CASE("bad input: input file does not exist", "[unit][cli]") {
  Fixture fx;
  fx.expect_refused("--model " + fx.model + " --input " + fx.dir + "/nope.h5", "nope.h5");
}

TEST_CASE("bad input: model directory without config.json", "[unit][cli]") {
  Fixture fx;
  fx.expect_refused("--model " + fx.dir + "/no_model --input " + fx.good_in, "config.json");
}

TEST_CASE("bad input: model with a missing tensor", "[unit][cli]") {
  Fixture fx;
  std::string m2 = fx.dir + "/m2";
  REQUIRE(std::system(("mkdir -p " + m2 + " && cp " + fx.model + "/config.json " + m2).c_str()) == 0);
  // A config with one more layer than the weights hold -> the loader misses layer 4's tensors.
  std::string cfg = slurp(fx.model + "/config.json");
  auto pos = cfg.find("\"num_hidden_layers\": 4");
  REQUIRE(pos != std::string::npos);
  cfg.replace(pos, 22, "\"num_hidden_layers\": 5");
  auto kp = cfg.find("\"kda_layers\": [");
  REQUIRE(kp != std::string::npos);
  cfg.insert(kp + 15, "5, ");
  { std::ofstream(m2 + "/config.json") << cfg; }
  REQUIRE(std::system(("cp " + fx.model + "/*.safetensors* " + m2 + "/").c_str()) == 0);
  fx.expect_refused("--model " + m2 + " --input " + fx.good_in, "model.layers.4");
}

TEST_CASE("bad input: unknown model_type", "[unit][cli]") {
  Fixture fx;
  std::string m2 = fx.dir + "/m2";
  REQUIRE(std::system(("mkdir -p " + m2 + " && cp " + fx.model + "/* " + m2 + "/").c_str()) == 0);
  std::string cfg = slurp(m2 + "/config.json");
  auto pos = cfg.find("dayzero_hybrid");
  cfg.replace(pos, 14, "llama_unknown");
  { std::ofstream(m2 + "/config.json") << cfg; }
  fx.expect_refused("--model " + m2 + " --input " + fx.good_in, "llama_unknown");
}

TEST_CASE("bad input: --cp/--tp not dividing the ranks", "[unit][cli]") {
  Fixture fx;
  fx.expect_refused("--model " + fx.model + " --input " + fx.good_in + " --cp 3", "divisible");
}

TEST_CASE("bad input: existing output without --resume or --overwrite is refused", "[unit][cli]") {
  Fixture fx;
  auto r = dayzero("run --model " + fx.model + " --input " + fx.good_in + " --output " + fx.prev_out, fx.dir, 1);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(error_lines(r.err) == 1);
  CHECK(r.err.find("--resume") != std::string::npos);
  CHECK(slurp(fx.prev_out) == fx.prev_bytes);
}

TEST_CASE("bad input: --resume against an output of another mode", "[unit][cli]") {
  Fixture fx;
  auto r = dayzero("run --model " + fx.model + " --input " + fx.good_in + " --output " + fx.prev_out +
                       " --resume --mode topk --topk 3",
                   fx.dir, 1);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(error_lines(r.err) == 1);
  CHECK(r.err.find("mode") != std::string::npos);
  CHECK(slurp(fx.prev_out) == fx.prev_bytes);
}

TEST_CASE("bad input: head counts not divisible by --tp", "[unit][cli]") {
  Fixture fx;
  // demo: 2 KDA heads, 4 ranks all in one TP group
  auto r = dayzero("run --model " + fx.model + " --input " + fx.good_in + " --output " + fx.prev_out +
                       " --overwrite --tp 4",
                   fx.dir, 4);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(error_lines(r.err) == 1);
  CHECK(r.err.find("is not divisible by --tp 4") != std::string::npos);
  CHECK(slurp(fx.prev_out) == fx.prev_bytes);
}

TEST_CASE("bad input: speculative decoding options", "[unit][cli]") {
  Fixture fx;
  const std::string base = "--model " + fx.model + " --input " + fx.good_in;
  fx.expect_refused(base + " --speculative ngram", "--speculative needs --mode generate");
  // the demo preset has no MTP layer
  fx.expect_refused(base + " --mode generate --speculative mtp", "declares no MTP layers");
  fx.expect_refused(base + " --mode generate --speculative oracle", "--oracle-drafts");
  fx.expect_refused(base + " --mode generate --oracle-drafts " + fx.prev_out, "--oracle-drafts");
  fx.expect_refused(base + " --mode generate --speculative ngram --draft-tokens 0", "--draft-tokens must be in 1..64");
  // an oracle that is not a generate output, and one with another document count
  fx.expect_refused(base + " --mode generate --speculative oracle --oracle-drafts " + fx.good_in,
                    "not a finished generate-mode output");
  const std::string gen = fx.dir + "/gen.h5", in3 = fx.dir + "/in3.h5";
  REQUIRE(dayzero("run " + base + " --mode generate --max-new-tokens 3 --output " + gen, fx.dir, 1).code == 0);
  dz::write_input_file(in3, {5, 6, 7, 8, 9, 10}, {0, 2, 4, 6});
  fx.expect_refused("--model " + fx.model + " --input " + in3 + " --mode generate --speculative oracle --oracle-drafts " +
                        gen,
                    "has 2 documents, the input 3");
}
