// Checkpoint reader/writer, dtype conversions and the generating mode.
// Raw safetensors files for the decode tests are assembled byte by byte here (not with
// write_safetensors), so reader and writer are checked against an independent encoding.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "core/dummy_values.hpp"
#include "core/fp8.hpp"
#include "error_of.hpp"
#include "io/checkpoint.hpp"
#include "backend/backend.hpp"

namespace fs = std::filesystem;
using namespace dz;

namespace {

// A fresh scratch directory per test case, removed at the end.
struct Scratch {
  std::string path;
  explicit Scratch(const std::string& tag) {
    fs::path p = fs::temp_directory_path() / ("dz_ckpt_" + std::to_string(::getpid()) + "_" + tag);
    fs::remove_all(p);
    fs::create_directories(p);
    path = p.string();
  }
  ~Scratch() { fs::remove_all(path); }
};

using dz::test::error_of;

// Writes a safetensors file from a literal header JSON and raw data bytes.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(char(n >> (8 * i)));
  f << header;
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

Tensor iota_tensor(Shape s, float scale, float shift) {
  Tensor t(std::move(s));
  for (int64_t i = 0; i < t.size(); ++i) t[i] = shift + scale * float(i) * (i % 2 ? -1.f : 1.f);
  return t;
}

// Nearest bf16 by brute force in double: the two candidates are truncation and truncation + 1 ulp.
float ref_bf16(float x) {
  uint32_t u = f32_bits(x);
  float lo = f32_from_bits(u & 0xffff0000u);
  float hi = f32_from_bits((u & 0xffff0000u) + 0x10000u);
  double dlo = std::fabs(double(x) - lo), dhi = std::fabs(double(hi) - x);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return ((f32_bits(lo) >> 16) & 1) ? hi : lo;  // tie: even mantissa
}

}  // namespace

TEST_CASE("checkpoint: bf16 round-to-nearest-even on hand values", "[unit]") {
  CHECK(round_bf16(1.0f) == 1.0f);
  CHECK(round_bf16(1.00390625f) == 1.0f);       // 1 + 2^-8: tie, 1.0 has the even mantissa
  CHECK(round_bf16(1.01171875f) == 1.015625f);  // 1 + 3*2^-8: tie, rounds up to even 1 + 2^-6
  CHECK(round_bf16(std::nextafter(1.00390625f, 2.f)) == 1.0078125f);  // just above the tie
  CHECK(round_bf16(-1.00390625f) == -1.0f);
  CHECK(f32_to_bf16(3.4028235e38f) == 0x7f80);  // FLT_MAX rounds to +Inf, as IEEE RNE does
  CHECK(std::isinf(round_bf16(INFINITY)));
  CHECK(std::isnan(round_bf16(NAN)));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0x7f800001u)))));  // NaN with low payload only
  CHECK(f32_to_bf16(-0.0f) == 0x8000);
}

TEST_CASE("checkpoint: bf16 rounding matches a brute-force nearest search", "[unit]") {
  std::mt19937 g(11);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float x = f32_from_bits(bits(g));
    if (std::isnan(x) || std::isinf(x) || std::fabs(x) > 3.38e38f) continue;
    REQUIRE(f32_bits(round_bf16(x)) == f32_bits(ref_bf16(x)));
  }
  for (uint32_t h = 0; h < 65536; ++h)  // widening then narrowing is the identity (non-NaN)
    if (!std::isnan(bf16_to_f32(uint16_t(h)))) REQUIRE(f32_to_bf16(bf16_to_f32(uint16_t(h))) == h);
}

TEST_CASE("checkpoint: f16 conversions on hand values and exhaustively", "[unit]") {
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0xc000) == -2.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.f, -24));
  CHECK(f16_to_f32(0x7bff) == 65504.f);
  CHECK(f16_to_f32(0x3555) == 0.333251953125f);
  CHECK(std::isinf(f16_to_f32(0x7c00)));
  CHECK(std::isnan(f16_to_f32(0x7e00)));
  CHECK(f32_to_f16(65519.f) == 0x7bff);  // below the halfway point to 65536
  CHECK(f32_to_f16(65520.f) == 0x7c00);  // tie with odd 65504 -> rounds to Inf
  CHECK(f32_to_f16(std::ldexp(1.f, -25)) == 0x0000);        // tie between 0 and 2^-24 -> even 0
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(f32_to_f16(std::ldexp(3.f, -25)) == 0x0002);        // tie 1.5 ulp -> even 2
  CHECK(f32_to_f16(1.0f + std::ldexp(1.f, -11)) == 0x3c00); // tie at 1 -> even
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (!std::isnan(f)) REQUIRE(f32_to_f16(f) == h);
  }
}

TEST_CASE("checkpoint: F32 round trip, header layout", "[unit]") {
  Scratch sd("f32");
  const std::string& dir = sd.path;
  std::map<std::string, Tensor> ts;
  ts["b.weight"] = iota_tensor({3, 7}, 0.37f, -1.f);
  ts["a.bias"] = iota_tensor({1}, 1.f, 5.f);
  ts["c.x"] = iota_tensor({19, 1, 2}, 1e-3f, 0.25f);
  write_safetensors(dir, ts, DType::F32);
  REQUIRE(fs::exists(dir + "/model.safetensors"));

  // Header: length multiple of 8 padded with spaces, data in name order.
  std::ifstream f(dir + "/model.safetensors", std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  CHECK(n % 8 == 0);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  auto h = nlohmann::json::parse(header);
  CHECK(h["a.bias"]["data_offsets"][0] == 0);
  CHECK(h["a.bias"]["data_offsets"][1] == 4);
  CHECK(h["b.weight"]["data_offsets"][0] == 4);
  CHECK(h["c.x"]["data_offsets"][0] == 4 + 21 * 4);
  CHECK(h["b.weight"]["dtype"] == "F32");
  CHECK(header.find("\"a.bias\"") < header.find("\"b.weight\""));

  auto ck = Checkpoint::open(dir);
  CHECK(ck->names() == std::vector<std::string>{"a.bias", "b.weight", "c.x"});
  for (const auto& [name, t] : ts) {
    Tensor r = ck->get(name, t.shape);
    CHECK(r.data == t.data);  // F32 round trip is bit exact
  }
  CHECK(ck->info("b.weight").dtype == DType::F32);
  ck->check_all_used();
}

TEST_CASE("checkpoint: BF16 round trip rounds each value to nearest even", "[unit]") {
  Scratch sd("bf16");
  const std::string& dir = sd.path;
  std::map<std::string, Tensor> ts;
  Tensor w({7, 3});
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : w.data) v = nd(g);
  w[0] = 1.00390625f;
  w[1] = 1.01171875f;
  w[2] = NAN;
  ts["w"] = w;
  write_safetensors(dir, ts, DType::BF16);
  auto ck = Checkpoint::open(dir);
  CHECK(ck->info("w").dtype == DType::BF16);
  Tensor r = ck->get("w", {7, 3});
  CHECK(r[0] == 1.0f);
  CHECK(r[1] == 1.015625f);
  CHECK(std::isnan(r[2]));
  for (int64_t i = 3; i < r.size(); ++i) CHECK(r[i] == ref_bf16(w[i]));
}

TEST_CASE("checkpoint: sharded round trip and index", "[unit]") {
  Scratch sd("shard");
  const std::string& dir = sd.path;
  std::map<std::string, Tensor> ts;
  for (int i = 0; i < 7; ++i) ts["layer." + std::to_string(i) + ".w"] = iota_tensor({3, 5 + i}, 0.1f * i, float(i));
  write_safetensors(dir, ts, DType::F32, 200);  // 60..132 bytes each: several shards
  CHECK(!fs::exists(dir + "/model.safetensors"));
  std::ifstream fi(dir + "/model.safetensors.index.json");
  auto idx = nlohmann::json::parse(fi);
  uint64_t total = 0;
  for (const auto& [n, t] : ts) total += uint64_t(t.size()) * 4;
  CHECK(idx["metadata"]["total_size"] == total);
  std::set<std::string> shards;
  for (auto& [k, v] : idx["weight_map"].items()) shards.insert(v.get<std::string>());
  CHECK(shards.size() >= 3);
  CHECK(shards.count("model-00001-of-0000" + std::to_string(shards.size()) + ".safetensors"));
  auto ck = Checkpoint::open(dir);
  for (const auto& [name, t] : ts) CHECK(ck->get(name, t.shape).data == t.data);
  ck->check_all_used();

  // A shard named in the index but absent on disk.
  fs::remove(dir + "/" + *shards.rbegin());
  std::string e = error_of([&] { Checkpoint::open(dir); });
  CHECK(e.find("missing shard") != std::string::npos);
  CHECK(e.find(*shards.rbegin()) != std::string::npos);
}

TEST_CASE("checkpoint: truncated file and bad header errors", "[unit]") {
  Scratch sd("trunc");
  const std::string& dir = sd.path;
  std::map<std::string, Tensor> ts;
  ts["a"] = Tensor({3}, 1.f);
  ts["z.last"] = Tensor({19}, 2.f);
  write_safetensors(dir, ts, DType::F32);
  const std::string file = dir + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 5);
  std::string e = error_of([&] { Checkpoint::open(dir); });
  CHECK(e.find("truncated") != std::string::npos);
  CHECK(e.find(file) != std::string::npos);
  CHECK(e.find("z.last") != std::string::npos);
  CHECK(e.find('\n') == std::string::npos);

  write_raw(file, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], ", {});  // JSON cut short
  e = error_of([&] { Checkpoint::open(dir); });
  CHECK(e.find("bad safetensors header in " + file) != std::string::npos);

  write_raw(file, "{\"a\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", std::vector<uint8_t>(8));
  e = error_of([&] { Checkpoint::open(dir); });
  CHECK(e.find("unsupported dtype F64") != std::string::npos);

  // Offsets that do not match dtype x shape.
  write_raw(file, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", std::vector<uint8_t>(8));
  e = error_of([&] { Checkpoint::open(dir); });
  CHECK(e.find("tensor a") != std::string::npos);

  // Header length larger than the file.
  {
    std::ofstream f(file, std::ios::binary);
    const char len[8] = {char(0xff), 0, 0, 0, 0, 0, 0, 0};
    f.write(len, 8);
    f << "{}";
  }
  e = error_of([&] { Checkpoint::open(dir); });
  CHECK(e.find("header length") != std::string::npos);

  e = error_of([&] { Checkpoint::open(dir + "/nowhere"); });
  CHECK(e.find("no model.safetensors") != std::string::npos);
}

TEST_CASE("checkpoint: shape, missing and unexpected tensor messages", "[unit]") {
  Scratch sd("msg");
  const std::string& dir = sd.path;
  std::map<std::string, Tensor> ts;
  ts["a.weight"] = Tensor({3, 7}, 1.f);
  ts["b"] = Tensor({2}, 1.f);
  ts["c"] = Tensor({2}, 1.f);
  write_safetensors(dir, ts, DType::F32);
  auto ck = Checkpoint::open(dir);
  CHECK(error_of([&] { ck->get("a.weight", {3, 8}); }) ==
        "tensor a.weight: expected shape [3, 8], checkpoint has [3, 7]");
  CHECK(error_of([&] { ck->get("nope", {1}); }) == "missing tensor nope in " + dir);
  CHECK(ck->get_optional("nope", {1}).empty());
  ck->get("a.weight", {3, 7});
  CHECK(ck->unused() == std::vector<std::string>{"b", "c"});
  CHECK(error_of([&] { ck->check_all_used(); }) == "unexpected tensor b (and 1 more) in " + dir);
  ck->get("b", {2});
  CHECK(error_of([&] { ck->check_all_used(); }) == "unexpected tensor c in " + dir);
  CHECK(ck->get_optional("c", {2}).size() == 2);
  ck->check_all_used();

  // Dry run: same name and shape checks, no data.
  auto dry = Checkpoint::open(dir);
  dry->set_dry_run(true);
  Tensor t = dry->get("a.weight", {3, 7});
  CHECK(t.shape == Shape{3, 7});
  CHECK(t.data.empty());
  CHECK(error_of([&] { dry->get("a.weight", {7, 3}); }) ==
        "tensor a.weight: expected shape [7, 3], checkpoint has [3, 7]");
  CHECK(error_of([&] { dry->get("nope", {1}); }) == "missing tensor nope in " + dir);
  CHECK(dry->unused() == std::vector<std::string>{"b", "c"});
}

TEST_CASE("checkpoint: F16, F8_E4M3 and integer decode on hand values", "[unit]") {
  Scratch sd("dec");
  const std::string& dir = sd.path;
  // F16 [5] at 0..10, F8 [7] at 10..17, I32 [2] at 17..25, I64 [1] at 25..33, U8 [2] at 33..35
  std::vector<uint8_t> b = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0xff, 0x7b, 0x55, 0x35,
                            0x7e, 0x01, 0x80, 0x7f, 0x38, 0xc4, 0x08,
                            0xfd, 0xff, 0xff, 0xff, 0x07, 0x00, 0x00, 0x00,
                            0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
                            0x00, 0xff};
  write_raw(dir + "/model.safetensors",
            R"({"__metadata__": {"format": "pt"},
                "h": {"dtype": "F16", "shape": [5], "data_offsets": [0, 10]},
                "e": {"dtype": "F8_E4M3", "shape": [7], "data_offsets": [10, 17]},
                "i": {"dtype": "I32", "shape": [2], "data_offsets": [17, 25]},
                "l": {"dtype": "I64", "shape": [1], "data_offsets": [25, 33]},
                "u": {"dtype": "U8", "shape": [1, 2], "data_offsets": [33, 35]}})",
            b);
  auto ck = Checkpoint::open(dir);
  Tensor h = ck->get("h", {5});
  CHECK(h.data == std::vector<float>{1.f, -2.f, std::ldexp(1.f, -24), 65504.f, 0.333251953125f});
  Tensor e = ck->get("e", {7});
  CHECK(e[0] == 448.f);                    // 0x7E: 2^8 * 1.75, the largest finite e4m3fn
  CHECK(e[1] == std::ldexp(1.f, -9));      // 0x01: smallest subnormal
  CHECK((e[2] == 0.f && std::signbit(e[2])));  // 0x80: -0
  CHECK(std::isnan(e[3]));                 // 0x7F: NaN (the "fn" format has no Inf)
  CHECK(e[4] == 1.f);                      // 0x38: exponent 7 = bias
  CHECK(e[5] == -3.f);                     // 0xC4: -(1 + 4/8) * 2^1
  CHECK(e[6] == std::ldexp(1.f, -6));      // 0x08: smallest normal
  CHECK(ck->get("i", {2}).data == std::vector<float>{-3.f, 7.f});
  CHECK(ck->get("l", {1})[0] == 16777216.f);
  CHECK(ck->get("u", {1, 2}).data == std::vector<float>{0.f, 255.f});
  ck->check_all_used();
}

TEST_CASE("checkpoint: F8_E4M3 with 128x128 block scale_inv is dequantised", "[unit]") {
  Scratch sd("fp8");
  const std::string& dir = sd.path;
  const int R = 130, C = 3;  // two row blocks (128 + a ragged 2), one column block
  std::vector<uint8_t> b(size_t(R * C));
  for (int i = 0; i < R * C; ++i) b[size_t(i)] = uint8_t(0x30 + i % 16);  // 0.5 .. 1.875 (exp 6/7)
  const float s[2] = {2.f, 0.5f};
  for (float v : s) {
    uint8_t raw[4];
    std::memcpy(raw, &v, 4);
    b.insert(b.end(), raw, raw + 4);
  }
  const std::string hdr = nlohmann::json{
      {"m.weight", {{"dtype", "F8_E4M3"}, {"shape", {R, C}}, {"data_offsets", {0, R * C}}}},
      {"m.weight_scale_inv", {{"dtype", "F32"}, {"shape", {2, 1}}, {"data_offsets", {R * C, R * C + 8}}}}}.dump();
  write_raw(dir + "/model.safetensors", hdr, b);
  auto ck = Checkpoint::open(dir);
  Tensor w = ck->get("m.weight", {R, C});
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int code = (r * C + c) % 16;  // 0x30 + code: exponent 6 (code < 8) or 7, mantissa code % 8
      const float v = std::ldexp(1.f + float(code % 8) / 8.f, code < 8 ? -1 : 0);
      REQUIRE(w.row(r)[c] == v * (r < 128 ? 2.f : 0.5f));  // exact: power-of-two scales
    }
  ck->check_all_used();  // the scale counts as used
  REQUIRE(w.fp8_block_scales);  // what a backend keeping FP8 needs
  CHECK(w.fp8_block_scales->shape == Shape({2, 1}));
  CHECK(w.fp8_block_scales->data == std::vector<float>{2.f, 0.5f});
  CHECK(ck->fp8_block_tensors() == 1);

  auto dry = Checkpoint::open(dir);
  dry->set_dry_run(true);
  CHECK(dry->get("m.weight", {R, C}).data.empty());
  dry->check_all_used();  // the scale is checked and counted in a dry run too
}

TEST_CASE("checkpoint: random mode is deterministic per (seed, name)", "[unit]") {
  auto a = Checkpoint::random(7), b = Checkpoint::random(7), c = Checkpoint::random(8);
  CHECK(a->generating());
  CHECK(!a->has("x.weight"));
  Tensor x1 = a->get("x.weight", {19, 3}, Init::normal(0.02f));
  CHECK(a->has("x.weight"));
  CHECK(a->generated().count("x.weight"));
  Tensor y1 = a->get("y.weight", {19, 3}, Init::normal(0.02f));
  // Order of requests does not matter: b asks for y first.
  Tensor y2 = b->get("y.weight", {19, 3}, Init::normal(0.02f));
  Tensor x2 = b->get("x.weight", {19, 3}, Init::normal(0.02f));
  CHECK(x1.data == x2.data);
  CHECK(y1.data == y2.data);
  CHECK(x1.data != y1.data);
  CHECK(c->get("x.weight", {19, 3}, Init::normal(0.02f)).data != x1.data);
  CHECK(a->get("x.weight", {19, 3}).data == x1.data);  // second request returns the same tensor
  CHECK(error_of([&] { a->get("x.weight", {3, 19}); }).find("expected shape [3, 19]") != std::string::npos);
  CHECK(a->get_optional("bias", {3}).empty());  // optional tensors are not generated
  CHECK(!a->has("bias"));

  // Moments of a large normal sample: mean 0 +- 4 sigma/sqrt(n), std within 2% (n = 40001, odd).
  Tensor n = a->get("big", {40001}, Init::normal(0.5f));
  double m = 0, q = 0;
  for (float v : n.data) m += v;
  m /= double(n.size());
  for (float v : n.data) q += (v - m) * (v - m);
  const double sd = std::sqrt(q / double(n.size()));
  CHECK(std::fabs(m) < 4 * 0.5 / std::sqrt(40001.0));
  CHECK(std::fabs(sd - 0.5) < 0.01);

  Tensor u = a->get("u", {1001}, Init::uniform(-0.3f, 0.7f));
  float lo = 1, hi = -1;
  for (float v : u.data) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo >= -0.3f);
  CHECK(hi <= 0.7f);
  CHECK(lo < -0.29f);
  CHECK(hi > 0.69f);
  CHECK(a->get("o", {3}, Init::ones()).data == std::vector<float>(3, 1.f));
  CHECK(a->get("z", {3}, Init::zeros()).data == std::vector<float>(3, 0.f));
  CHECK(a->get("k", {2}, Init::constant(-5.f)).data == std::vector<float>(2, -5.f));

  // What was generated writes and reads back bit-exactly.
  Scratch gd("gen");
  const std::string& dir = gd.path;
  write_safetensors(dir, a->generated(), DType::F32);
  auto r = Checkpoint::open(dir);
  for (const auto& [name, t] : a->generated()) CHECK(r->get(name, t.shape).data == t.data);
  r->check_all_used();
}

TEST_CASE("checkpoint: dummy mode keeps nothing, and in-place windows equal the host tensor's slices", "[unit]") {
  auto a = Checkpoint::dummy(0), b = Checkpoint::dummy(0);
  CHECK(a->dummy());
  CHECK(!a->keeps_full());
  CHECK(a->generated().empty());
  const int64_t R = 37, C = 29;
  Tensor x = a->get("e.weight", {R, C}, Init::normal(0.02f));
  CHECK(a->generated().empty());                                    // nothing kept
  CHECK(a->names() == std::vector<std::string>{"e.weight"});        // but the name and shape are recorded
  CHECK(b->get("e.weight", {R, C}, Init::normal(0.02f)).data == x.data);  // deterministic
  // Normal(0.02): mean ~0, std ~0.02, bounded by the Irwin-Hall range.
  double s = 0, s2 = 0, mx = 0;
  for (float v : x.data) s += v, s2 += double(v) * v, mx = std::max(mx, double(std::fabs(v)));
  const double n = double(x.size()), sd = std::sqrt(s2 / n - (s / n) * (s / n));
  CHECK(std::fabs(s / n) < 0.003);
  CHECK(sd == Approx(0.02).epsilon(0.1));
  CHECK(mx <= 0.02 * 3.4642);
  Tensor u = a->get("u.weight", {R, C}, Init::uniform(-4.f, -1.f));
  for (float v : u.data) CHECK((v >= -4.f && v < -1.f));
  CHECK(a->get("n.weight", {C}, Init::ones()).data == std::vector<float>(size_t(C), 1.f));
  // A [5, 7] window at (11, 13) made in place by the backend equals that slice, bit for bit.
  const uint64_t key = a->dummy_key("e.weight", {R, C});
  Tensor w({5, 7});
  cpu_backend().fill_dummy(host_view(w.ptr(), {5, 7}), key, DummyDist{false, 0.02f, 0.f}, C, 11, 13);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 7; ++c) CHECK(w.data[size_t(r * 7 + c)] == x.data[size_t((11 + r) * C + 13 + c)]);
}

// The FP8 weights a backend keeps come back from the dequantised fp32 values (fp8_block_codes):
// every code, with scales that are not powers of two (the product code * scale rounds in fp32).
TEST_CASE("checkpoint: FP8 block codes come back exactly from the dequantised values; slices keep block scales", "[unit]") {
  Scratch sd("fp8codes");
  const std::string& dir = sd.path;
  const int R = 300, C = 260;  // 3 x 3 blocks, ragged in both dims
  std::mt19937 rng(5);
  std::vector<uint8_t> b(size_t(R * C));
  for (auto& c : b) {
    c = uint8_t(rng() & 0xFF);
    if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
  }
  std::vector<float> s(9);
  std::uniform_real_distribution<float> u(1e-4f, 3.f);
  for (auto& v : s) v = u(rng);
  s[4] = 0.f;  // an all-zero block: codes come back as 0
  std::vector<uint8_t> raw = b;
  for (float v : s) {
    uint8_t f[4];
    std::memcpy(f, &v, 4);
    raw.insert(raw.end(), f, f + 4);
  }
  const std::string hdr = nlohmann::json{
      {"m.weight", {{"dtype", "F8_E4M3"}, {"shape", {R, C}}, {"data_offsets", {0, R * C}}}},
      {"m.weight_scale_inv", {{"dtype", "F32"}, {"shape", {3, 3}}, {"data_offsets", {R * C, R * C + 36}}}}}.dump();
  write_raw(dir + "/model.safetensors", hdr, raw);
  auto ck = Checkpoint::open(dir);
  Tensor w = ck->get("m.weight", {R, C});
  REQUIRE(w.fp8_block_scales);
  std::vector<uint8_t> back(size_t(R * C));
  fp8_block_codes(w.ptr(), R, C, w.fp8_block_scales->ptr(), back.data());
  int64_t wrong = 0;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(r * C + c);
      const bool zero_block = r / 128 == 1 && c / 128 == 1;
      wrong += zero_block ? back[i] != 0 : back[i] != b[i];
    }
  CHECK(wrong == 0);

  // TP slices on block boundaries (or ending at the last row / column) keep their block scales;
  // any other slice is a plain fp32 tensor.
  const Tensor r1 = slice_rows(w, 128, 300);
  REQUIRE(r1.fp8_block_scales);
  CHECK(r1.fp8_block_scales->shape == Shape({2, 3}));
  CHECK(r1.fp8_block_scales->row(0)[0] == s[3]);
  CHECK(!slice_rows(w, 64, 192).fp8_block_scales);
  const Tensor c1 = slice_cols(w, 0, 256);
  REQUIRE(c1.fp8_block_scales);
  CHECK(c1.fp8_block_scales->shape == Shape({3, 2}));
  CHECK(c1.fp8_block_scales->row(2)[1] == s[7]);
  CHECK(!slice_cols(w, 0, 100).fp8_block_scales);
  Tensor rs = w;
  rs.reshape({C, R});
  CHECK(!rs.fp8_block_scales);  // the blocks belong to the 2-D layout
  std::vector<uint8_t> back1(size_t(r1.size()));
  fp8_block_codes(r1.ptr(), 172, C, r1.fp8_block_scales->ptr(), back1.data());
  CHECK(std::equal(back1.begin(), back1.begin() + 260, back.begin() + 128 * C));
}

// compressed-tensors MXFP4 (Kimi K3's routed experts): X.weight_packed U8 [R, C/2] + X.weight_scale U8
// [R, C/32] read as X.weight [R, C], decoded exactly; the values re-encode to the same numbers
// (what the CUDA backend keeps); broken pairs are named.
TEST_CASE("checkpoint: MXFP4 packed pairs decode exactly, re-encode, and bad scales are named", "[unit]") {
  Scratch sd("mxfp4");
  const std::string& dir = sd.path;
  const int R = 3, C = 64;  // two groups of 32 per row
  // E2M1 by hand: nibble -> value (sign in bit 3), the spec's table, independent of core/fp8
  const float e2m1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  std::vector<uint8_t> packed(size_t(R * C / 2)), scale(size_t(R * C / 32));
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t((i * 37 + 11) & 0xFF);
  const uint8_t sc[6] = {127, 130, 1, 0, 200, 120};  // 2^0, 2^3, 2^-126, 2^-127 (subnormal), 2^73, 2^-7
  std::copy(sc, sc + 6, scale.begin());
  std::vector<uint8_t> bytes = packed;
  bytes.insert(bytes.end(), scale.begin(), scale.end());
  const int P = R * C / 2;
  auto header = [&](const char* sdtype) {
    return nlohmann::json{
        {"e.w1.weight_packed", {{"dtype", "U8"}, {"shape", {R, C / 2}}, {"data_offsets", {0, P}}}},
        {"e.w1.weight_scale", {{"dtype", sdtype}, {"shape", {R, C / 32}}, {"data_offsets", {P, P + R * C / 32}}}}}.dump();
  };
  write_raw(dir + "/model.safetensors", header("U8"), bytes);
  auto ck = Checkpoint::open(dir);
  CHECK(ck->mxfp4_tensors() == 1);
  REQUIRE(ck->has("e.w1.weight"));
  CHECK(!ck->has("e.w1.weight_packed"));
  CHECK(ck->info("e.w1.weight").shape == Shape({R, C}));
  Tensor w = ck->get("e.w1.weight", {R, C});
  CHECK(w.mxfp4);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const uint8_t b = packed[size_t((r * C + c) / 2)];
      const float v = std::ldexp(e2m1[c % 2 ? b >> 4 : b & 15], int(scale[size_t(r * 2 + c / 32)]) - 127);
      REQUIRE(w.row(r)[c] == v);
      REQUIRE(std::signbit(w.row(r)[c]) == std::signbit(v));
    }
  ck->check_all_used();  // both files' tensors count as used
  // the decoded values re-encode exactly; decoding that gives the same numbers
  std::vector<uint8_t> p2(packed.size()), s2(scale.size());
  REQUIRE(mxfp4_encode_exact(w.ptr(), R, C, p2.data(), s2.data()));
  std::vector<float> back(size_t(R * C));
  mxfp4_dequantize(p2.data(), s2.data(), R, C, back.data());
  for (int i = 0; i < R * C; ++i) REQUIRE(back[size_t(i)] == w.ptr()[i]);
  // ... and anything that is not MXFP4 is refused
  std::vector<float> notmx(w.data);
  notmx[5] = 0.1f;
  CHECK(!mxfp4_encode_exact(notmx.data(), R, C, p2.data(), s2.data()));
  // TP slices keep the flag on whole 32-column groups only; rows always
  CHECK(slice_rows(w, 1, 3).mxfp4);
  CHECK(slice_cols(w, 32, 64).mxfp4);
  CHECK(!slice_cols(w, 16, 48).mxfp4);

  // a NaN scale (0xFF) is a broken checkpoint, named by the file's tensor
  bytes[size_t(P + 2)] = 0xFF;
  write_raw(dir + "/model.safetensors", header("U8"), bytes);
  auto bad = Checkpoint::open(dir);
  CHECK(error_of([&] { bad->get("e.w1.weight", {R, C}); }).find("e.w1.weight_scale: E8M0 scale 0xFF (NaN)") !=
        std::string::npos);
  // scales of another dtype (NVFP4's E4M3 per 16, say) are not an MXFP4 pair: the files' names stay
  bytes[size_t(P + 2)] = 1;
  write_raw(dir + "/model.safetensors", header("F8_E4M3"), bytes);
  auto other = Checkpoint::open(dir);
  CHECK(other->mxfp4_tensors() == 0);
  CHECK(other->has("e.w1.weight_packed"));
  CHECK(error_of([&] { other->get("e.w1.weight", {R, C}); }).find("missing tensor e.w1.weight") != std::string::npos);
}

// --dummy-weights of MXFP4 experts (Kimi K3): the dummy values rounded per 32 columns to MXFP4, the
// same window of the same virtual tensor whatever slice asks for it, and every group an MXFP4 group.
TEST_CASE("checkpoint: dummy MXFP4 expert stacks are MXFP4, and windows equal the whole tensor's", "[unit]") {
  const DummyDist d{false, 0.02f, 0.f};
  const std::vector<uint64_t> keys = {0x1234, 0x9876};
  const int64_t R = 6, C = 96;
  const std::vector<float> whole = cpu_backend().to_host(cpu_backend().dummy_mx4_experts(keys, R, C, d, C, 0, 0));
  REQUIRE(int64_t(whole.size()) == 2 * R * C);
  std::vector<uint8_t> p(size_t(2 * R * C / 2)), s(size_t(2 * R * C / 32));
  CHECK(mxfp4_encode_exact(whole.data(), 2 * R, C, p.data(), s.data()));
  // rounded, not the plain dummy values: at most half an E2M1 step away from them, and close in mean
  double err = 0, mag = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float v = dummy_value(keys[0], uint64_t(r * C + c), d);
      err = std::max(err, double(std::fabs(whole[size_t(r * C + c)] - v)) / 0.02);
      mag += std::fabs(v);
    }
  CHECK(err < 0.6);  // |v - q| <= 1 * scale, scale <= amax / 4 <= 0.87 sigma at 3.46 sigma
  CHECK(mag > 0);
  // a [3, 32] window at (2, 64) equals that part of the whole, bit for bit (a TP slice of the width)
  const std::vector<float> win = cpu_backend().to_host(cpu_backend().dummy_mx4_experts(keys, 3, 32, d, C, 2, 64));
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 32; ++c)
        CHECK(win[size_t((e * 3 + r) * 32 + c)] == whole[size_t((e * R + 2 + r) * C + 64 + c)]);
  CHECK_THROWS_WITH(cpu_backend().dummy_mx4_experts(keys, 3, 16, d, C, 0, 0), Catch::Contains("groups of 32"));
}
