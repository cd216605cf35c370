// Packed prefill of several documents through the softmax-attention mixers (GQA, MLA dense / DSA,
// explicit and absorbed forms): Mixer::forward_packed must equal one forward() per document
// bitwise on the CPU backend -- outputs, cache rows (k / v, latent, index keys) and the DSA Top-K
// rows -- and must really batch: one varlen attention call and one call per projection for all
// documents (counted through a forwarding backend). States with history (a decode step of one
// token per document: projections over all documents at once; continuations: per document) are
// bitwise equal too.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn_fixtures.hpp"
#include "io/checkpoint.hpp"
#include "model/module.hpp"
#include "ops/attention.hpp"
#include "ops/rope.hpp"
#include "model/attn_cache.hpp"

namespace fs = std::filesystem;
using namespace dz;

namespace {

// The CPU backend behind a counter of the calls the mixers make (everything forwarded as is).
class CountingBackend final : public Backend {
 public:
  Backend& be = cpu_backend();
  int64_t linear_calls = 0, attention_calls = 0, varlen_attention_calls = 0, rope_calls = 0, varlen_rope_calls = 0;
  void reset() { linear_calls = attention_calls = varlen_attention_calls = rope_calls = varlen_rope_calls = 0; }

  std::string name() const override { return be.name(); }
  Device device() const override { return be.device(); }
  DType act_dtype() const override { return be.act_dtype(); }
  DType weight_dtype() const override { return be.weight_dtype(); }
  DTensor alloc(const Shape& s, DType dt) override { return be.alloc(s, dt); }
  DTensor upload(const float* src, const Shape& s, DType dt) override { return be.upload(src, s, dt); }
  DTensor upload_i32(const int32_t* src, const Shape& s) override { return be.upload_i32(src, s); }
  void download(const DTensor& t, float* dst) override { be.download(t, dst); }
  void download_i32(const DTensor& t, int32_t* dst) override { be.download_i32(t, dst); }
  void fill_zero(const DTensor& t) override { be.fill_zero(t); }
  void copy_rows(const DTensor& s, int64_t s0, const DTensor& d, int64_t d0, int64_t n) override {
    be.copy_rows(s, s0, d, d0, n);
  }
  void copy_cols(const DTensor& s, int64_t s0, const DTensor& d, int64_t d0, int64_t w) override {
    be.copy_cols(s, s0, d, d0, w);
  }
  void convert(const DTensor& s, const DTensor& d) override { be.convert(s, d); }
  void fill_dummy(const DTensor& t, uint64_t key, const DummyDist& d, int64_t ld, int64_t r0, int64_t c0) override {
    be.fill_dummy(t, key, d, ld, r0, c0);
  }
  void sync() override { be.sync(); }
  void allreduce_sum(const Collectives* comm, const DTensor& t) override { be.allreduce_sum(comm, t); }
  std::unique_ptr<PendingRows> start_allgather_rows(const Collectives& comm, const DTensor& mine,
                                                    const std::vector<int64_t>& rows_of, int64_t) override {
    return be.allgather_rows_start(&comm, mine, rows_of);
  }
  std::unique_ptr<PendingRows> start_alltoall_rows(const Collectives& comm, const DTensor& send,
                                                   const std::vector<int64_t>& send_rows,
                                                   const std::vector<int64_t>& recv_rows, int64_t) override {
    return be.alltoall_rows_start(&comm, send, send_rows, recv_rows);
  }
  void embed(const DTensor& table, const DTensor& ids, const DTensor& out) override { be.embed(table, ids, out); }
  void rmsnorm(const DTensor& x, const DTensor& w, const DTensor& y, float eps, bool zc) override {
    be.rmsnorm(x, w, y, eps, zc);
  }
  void gated_rmsnorm(const DTensor& x, const DTensor& g, const DTensor& w, const DTensor& y, float eps,
                     GateAct act) override {
    be.gated_rmsnorm(x, g, w, y, eps, act);
  }
  void add(const DTensor& h, const DTensor& y) override { be.add(h, y); }
  void mul_sigmoid(const DTensor& x, const DTensor& g) override { be.mul_sigmoid(x, g); }
  void linear(const DTensor& x, const DTensor& W, const DTensor& b, const DTensor& y) override {
    ++linear_calls;
    be.linear(x, W, b, y);
  }
  void swiglu_mlp(const DTensor& x, const SwigluWeights& w, const DTensor& y) override { be.swiglu_mlp(x, w, y); }
  void moe(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& y) override {
    be.moe(rc, w, x, y);
  }  void moe_route(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& idx,
                 const DTensor& wt) override {
    be.moe_route(rc, w, x, idx, wt);
  }

  void short_conv(const DTensor& x, const DTensor& w, const DTensor& s, const DTensor& y) override {
    be.short_conv(x, w, s, y);
  }
  void la_scan(const LaScanArgs& a) override { be.la_scan(a); }
  void la_transition(const LaScanArgs& a, const DTensor& A, const DTensor& B) override { be.la_transition(a, A, B); }
  void la_merge(const DTensor& A, const DTensor& B, int64_t n, const DTensor& Si, const DTensor& Sf) override {
    be.la_merge(A, B, n, Si, Sf);
  }
  void rope(const Rope& r, const DTensor& x, int64_t H, int64_t hs, int64_t off, int64_t pos0) override {
    ++rope_calls;
    be.rope(r, x, H, hs, off, pos0);
  }
  void rope_varlen(const Rope& r, const DTensor& x, int64_t H, int64_t hs, int64_t off,
                   const std::vector<int64_t>& cu) override {
    ++varlen_rope_calls;
    be.rope_varlen(r, x, H, hs, off, cu);
  }
  void attention(const AttnArgs& a) override {
    ++attention_calls;
    if (!a.cu.empty()) ++varlen_attention_calls;
    be.attention(a);
  }
  void head_matmul(const DTensor& x, int64_t x_hs, int64_t k, const DTensor& W, int64_t w0, int64_t w_hs, bool tw,
                   const DTensor& y, int64_t y_hs, int64_t n, int64_t H) override {
    be.head_matmul(x, x_hs, k, W, w0, w_hs, tw, y, y_hs, n, H);
  }
  void mla_latent_attention(const DTensor& q, const DTensor& kv, const DTensor& sel, int64_t pos0, int64_t H,
                            int64_t R, int64_t DR, float scale, const DTensor& out) override {
    ++attention_calls;
    be.mla_latent_attention(q, kv, sel, pos0, H, R, DR, scale, out);
  }
  void layer_norm(const DTensor& x, const DTensor& w, const DTensor& b, const DTensor& y, float eps) override {
    be.layer_norm(x, w, b, y, eps);
  }
  void indexer_topk(const DTensor& q, const DTensor& w, float ws, const DTensor& keys, int64_t pos0, int64_t H,
                    int64_t K, const DTensor& sel) override {
    be.indexer_topk(q, w, ws, keys, pos0, H, K, sel);
  }
  void quant_round(const DTensor& x, Round kind) override { be.quant_round(x, kind); }
  void attn_res_mix(const DTensor& b, int64_t n, const DTensor& p, const DTensor& q, float eps,
                    const DTensor& out) override {
    be.attn_res_mix(b, n, p, q, eps, out);
  }
  void indexer_kpool_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& cache, const DTensor& ape,
                          int64_t P, int64_t pos0, int64_t H, int64_t Kp, bool tail, const DTensor& sel) override {
    be.indexer_kpool_topk(q, w, wscale, cache, ape, P, pos0, H, Kp, tail, sel);
  }
  void pool_softmax(const DTensor& src, const DTensor& ape, int64_t P, const DTensor& out) override {
    be.pool_softmax(src, ape, P, out);
  }
  void group_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& keys, int64_t P, int64_t pos0,
                  int64_t H, int64_t K, const DTensor& sel) override {
    be.group_topk(q, w, wscale, keys, P, pos0, H, K, sel);
  }
  void dsv4_attention(const DTensor& q, const DTensor& raw, const DTensor& comp, const DTensor& sel,
                      const DTensor& sinks, int64_t pos0, int64_t H, int64_t W, int64_t m, float scale,
                      const DTensor& out) override {
    be.dsv4_attention(q, raw, comp, sel, sinks, pos0, H, W, m, scale, out);
  }
  void hc_pre(const DTensor& x, const DTensor& fn, const DTensor& base, const DTensor& scale, const dz::HcParams& p,
              const DTensor& coeff, const DTensor& in) override {
    be.hc_pre(x, fn, base, scale, p, coeff, in);
  }
  void hc_post(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N) override { be.hc_post(x, coeff, y, N); }
  void hc_expand(const DTensor& h, int64_t N, const DTensor& x) override { be.hc_expand(h, N, x); }
  void hc_mean(const DTensor& x, int64_t N, const DTensor& out) override { be.hc_mean(x, N, out); }
  void lse_parts(const DTensor& l, const std::vector<int32_t>& t, int64_t v0, std::vector<double>& parts) override {
    be.lse_parts(l, t, v0, parts);
  }
  void row_topk(const DTensor& l, int64_t k, std::vector<int32_t>& ids, std::vector<float>& vals) override {
    be.row_topk(l, k, ids, vals);
  }
  int64_t lm_rows_per_chunk(int64_t n) const override { return be.lm_rows_per_chunk(n); }
  std::string describe() const override { return "counting " + be.describe(); }
  int device_index() const override { return be.device_index(); }
  void* native_stream() const override { return be.native_stream(); }
  int64_t peak_memory_bytes() const override { return be.peak_memory_bytes(); }
  int64_t memory_in_use_bytes() const override { return be.memory_in_use_bytes(); }
  void reset_peak_memory() override { be.reset_peak_memory(); }
};

struct Scratch {
  std::string path;
  explicit Scratch(const std::string& tag) {
    fs::path p = fs::temp_directory_path() / ("dz_attn_packed_" + std::to_string(::getpid()) + "_" + tag);
    fs::remove_all(p);
    fs::create_directories(p);
    path = p.string();
  }
  ~Scratch() { fs::remove_all(path); }
};

// O(1)-scaled random weights (attn_fixtures: peaky softmax), with or without the optional biases
// (the fixture's biases are the gated GQA's), loaded on `be` through the strict reader.
std::unique_ptr<Mixer> build(const ModelConfig& cfg, const dzt::Factory& make, uint32_t seed, bool biases,
                             Backend& be) {
  Scratch dir("w" + std::to_string(seed));
  if (biases) {
    dzt::write_weights(cfg, make, seed, dir.path);
  } else {
    auto gen = Checkpoint::random(seed);
    make(cfg, 0, *gen, dzt::kPrefix, TpShard{}, cpu_backend());
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::map<std::string, Tensor> w;
    const bool zc = cfg.norm_zero_centered || cfg.family == Family::Qwen3Next;
    for (const auto& [name, t0] : gen->generated()) {
      Tensor t(t0.shape);
      const bool norm_w = name.find("norm.weight") != std::string::npos;
      for (auto& v : t.data) {
        if (norm_w) v = (zc ? 0.f : 1.f) + 0.3f * nd(g);
        else if (t.ndim() == 1) v = 0.3f * nd(g);
        else v = 1.5f * nd(g) / std::sqrt(float(t.shape[1]));
      }
      w[name] = t;
    }
    write_safetensors(dir.path, w, DType::F32);
  }
  auto ck = Checkpoint::open(dir.path);
  auto m = make(cfg, 0, *ck, dzt::kPrefix, TpShard{}, be);
  ck->check_all_used();
  return m;
}

// What a document's state holds, on the host: position, every cache's rows, the Top-K rows.
struct Held {
  int64_t pos = 0, topk_width = 0;
  std::vector<float> latent, index_k, k, v;
  std::vector<int32_t> topk;
  bool operator==(const Held& o) const {
    return pos == o.pos && topk_width == o.topk_width && latent == o.latent && index_k == o.index_k && k == o.k &&
           v == o.v && topk == o.topk;
  }
};
Held held(const MixerState& s) {
  auto& a = dynamic_cast<const AttnCache&>(s);
  return {a.pos, a.topk_width, a.latent.host(), a.index_k.host(), a.k.host(), a.v.host(), a.last_topk()};
}

struct Run {
  std::vector<float> out;  // [rows, D]
  std::vector<Held> st;    // per document
};

// One forward() per document, or one forward_packed over all; then `step` more tokens per document
// the same way (per document / packed, through the states with history).
void run(const Mixer& m, const std::vector<float>& x, const std::vector<int64_t>& cu, bool packed,
         std::vector<std::unique_ptr<MixerState>>& sts, Run& r) {
  const int64_t D = m.hidden(), N = int64_t(cu.size()) - 1, T = cu.back();
  r.out.assign(size_t(T * D), 0.f);
  if (packed) {
    std::vector<MixerState*> p;
    for (auto& s : sts) p.push_back(s.get());
    DTensor xo = host_view(const_cast<float*>(x.data()), {T, D}), o = host_view(r.out.data(), {T, D});
    m.forward_packed(xo, cu, p, o);
  } else {
    for (int64_t b = 0; b < N; ++b)
      m.forward(x.data() + cu[size_t(b)] * D, cu[size_t(b) + 1] - cu[size_t(b)], *sts[size_t(b)],
                r.out.data() + cu[size_t(b)] * D);
  }
  r.st.clear();
  for (auto& s : sts) r.st.push_back(held(*s));
}

struct Case {
  std::string name;
  ModelConfig cfg;
  dzt::Factory make;
  bool biases;
  bool absorbed;  // a fresh document takes the absorbed form (2R < nope + vd)
};

}  // namespace

TEST_CASE("attn packed: forward_packed of documents {1, 7, 30, 2} equals one forward per document, bitwise",
          "[unit]") {
  auto mla = [](Family f, int64_t q_lora, bool gate, bool idx, bool yarn) {
    return dzt::mla_cfg(f, q_lora, gate, idx, yarn, /*topk=*/5, /*yarn_orig=*/16);
  };
  std::vector<Case> cases = {
      {"MLA deepseek_v32 DSA, q_lora", mla(Family::DeepseekV32, 11, false, true, false), make_mla_mixer, true, false},
      {"MLA deepseek_v32 dense, q_lora, YaRN", mla(Family::DeepseekV32, 11, false, false, true), make_mla_mixer,
       false, false},
      {"MLA kimi NoPE, q_proj, output gate", mla(Family::KimiLinear, 0, true, false, false), make_mla_mixer, true,
       false},
      {"MLA dayzero NoPE + gate + DSA", mla(Family::Dayzero, 11, true, true, false), make_mla_mixer, false, false},
      {"GQA qwen3_next gated, biases", dzt::gqa_cfg(), make_gqa_mixer, true, false},
  };
  {  // DSA + YaRN with the cache / index quantisation options (per-row rounds, batched)
    ModelConfig c = mla(Family::DeepseekV32, 11, false, true, true);
    c.kv_cache_fp8 = true;
    c.index_mxfp8 = true;
    cases.push_back({"MLA deepseek_v32 DSA + YaRN, kv fp8, index mxfp8", c, make_mla_mixer, false, false});
  }
  {  // kv_lora_rank 4: 2R = 8 < nope + vd = 12, the absorbed form even for a whole prefill
    ModelConfig c = mla(Family::DeepseekV32, 11, true, true, false);
    c.kv_lora_rank = 4;
    cases.push_back({"MLA deepseek_v32 DSA, R = 4 (absorbed)", c, make_mla_mixer, false, true});
    c.layers[0].has_indexer = false;
    cases.push_back({"MLA deepseek_v32 dense, R = 4 (absorbed)", c, make_mla_mixer, false, true});
  }
  {  // plain GQA: no output gate, plain RMSNorm weights, full rotary
    ModelConfig c = dzt::gqa_cfg();
    c.family = Family::Dayzero;
    c.attn_output_gate = false;
    c.norm_zero_centered = false;
    c.rope.partial_rotary_factor = 1.f;
    cases.push_back({"GQA dayzero ungated, full rope", c, make_gqa_mixer, false, false});
  }

  const std::vector<int64_t> cu = {0, 1, 8, 38, 40};  // documents of 1, 7, 30, 2 tokens
  const int64_t N = int64_t(cu.size()) - 1;
  uint32_t seed = 300;
  for (const Case& c : cases) {
    INFO(c.name);
    CountingBackend cb;
    auto m = build(c.cfg, c.make, ++seed, c.biases, cb);
    const int64_t D = m->hidden();
    const auto x = dzt::rand_x(cu.back(), D, seed);
    std::vector<std::unique_ptr<MixerState>> s1, s2;
    for (int64_t b = 0; b < N; ++b) s1.push_back(m->make_state()), s2.push_back(m->make_state());
    Run one, packed;
    cb.reset();
    run(*m, x, cu, false, s1, one);
    const int64_t lin_one = cb.linear_calls;
    cb.reset();
    run(*m, x, cu, true, s2, packed);
    CHECK(packed.out == one.out);
    for (int64_t b = 0; b < N; ++b) {
      INFO("document " << b);
      CHECK(packed.st[size_t(b)].pos == cu[size_t(b) + 1] - cu[size_t(b)]);
      CHECK(packed.st[size_t(b)] == one.st[size_t(b)]);
    }
    const bool dsa = c.cfg.layers[0].has_indexer;
    if (dsa) CHECK(packed.st[2].topk.size() == size_t(30 * 5));  // 5 of up to 30 keys per row
    // Batched: every projection once for all documents (the per-document run: once per document;
    // the DSA indexer scores per document), the attention in one varlen call unless the form is
    // the absorbed one or a selection (per document).
    INFO("linear calls: packed " << cb.linear_calls << ", per document " << lin_one);
    if (!dsa) CHECK(cb.linear_calls * N == lin_one);
    CHECK(cb.linear_calls < lin_one);
    CHECK(cb.rope_calls == (dsa ? N : 0));  // varlen, but for the indexer's queries (scored per document)
    if (!c.absorbed && !dsa) {
      CHECK(cb.attention_calls == 1);
      CHECK(cb.varlen_attention_calls == 1);
    }
    if (!c.absorbed && dsa) CHECK(cb.varlen_attention_calls == 1);  // the backend attends per document
    if (c.absorbed) CHECK(cb.attention_calls == N);

    {  // a batch of one document (how the job runs a whole document): forward() itself
      const std::vector<int64_t> cu1 = {0, 30};
      const std::vector<float> x1(x.begin() + 8 * D, x.begin() + 38 * D);
      std::vector<std::unique_ptr<MixerState>> a1, b1;
      a1.push_back(m->make_state()), b1.push_back(m->make_state());
      Run r1, p1;
      run(*m, x1, cu1, false, a1, r1);
      cb.reset();
      run(*m, x1, cu1, true, b1, p1);
      CHECK(cb.varlen_rope_calls + cb.varlen_attention_calls == 0);
      CHECK(p1.out == r1.out);
      CHECK(p1.out == std::vector<float>(one.out.begin() + 8 * D, one.out.begin() + 38 * D));
      CHECK(p1.st[0] == r1.st[0]);
    }
    // One more token per document (states with history: a decode step, batched), then a packed
    // continuation of 3 / 1 / 2 / 4 tokens (per document): equal to the same steps per document.
    for (const std::vector<int64_t>& cu2 : {std::vector<int64_t>{0, 1, 2, 3, 4}, std::vector<int64_t>{0, 3, 4, 6, 10}}) {
      const auto x2 = dzt::rand_x(cu2.back(), D, seed + uint32_t(cu2.back()));
      Run a, b2;
      cb.reset();
      run(*m, x2, cu2, false, s1, a);
      const int64_t lin_a = cb.linear_calls;
      cb.reset();
      run(*m, x2, cu2, true, s2, b2);
      CHECK(b2.out == a.out);
      // A decode step (one token per document) projects all documents at once (the DSA indexer's
      // keys and Top-K stay per document)
      if (cu2.back() == N) {
        INFO("decode step linear calls: packed " << cb.linear_calls << ", per document " << lin_a);
        if (!dsa) CHECK(cb.linear_calls * N == lin_a);
        CHECK(cb.linear_calls < lin_a);
      }
      for (int64_t b = 0; b < N; ++b) CHECK(b2.st[size_t(b)] == a.st[size_t(b)]);
    }
  }
}

TEST_CASE("attn packed: the cpu backend's varlen attention and RoPE equal per-sequence calls, empty sequences too",
          "[unit]") {
  Backend& be = cpu_backend();
  const std::vector<int64_t> cu = {0, 3, 3, 10, 11, 30};  // 3, 0, 7, 1, 19 rows
  const int64_t T = cu.back(), N = int64_t(cu.size()) - 1, Hq = 4, Hkv = 2, Dk = 12, Dv = 8, K = 4;
  const auto q = dzt::rand_x(T, Hq * Dk, 1), k = dzt::rand_x(T, Hkv * Dk, 2), v = dzt::rand_x(T, Hkv * Dv, 3);
  std::vector<int32_t> sel(size_t(T * K));
  for (int64_t b = 0; b < N; ++b)
    for (int64_t t = cu[size_t(b)]; t < cu[size_t(b) + 1]; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int64_t p = t - cu[size_t(b)];  // the query's position in its document
        sel[size_t(t * K + j)] = j <= p ? int32_t((p * 5 + j * 3) % (p + 1)) : -1;
      }
  for (bool sparse : {false, true}) {
    INFO((sparse ? "DSA selection" : "dense causal"));
    auto args = [&](const std::vector<int64_t>& offsets) {
      AttnArgs a;
      a.q = be.upload(q.data(), {T, Hq * Dk}, DType::F32);
      a.k = be.upload(k.data(), {T, Hkv * Dk}, DType::F32);
      a.v = be.upload(v.data(), {T, Hkv * Dv}, DType::F32);
      a.out = be.zeros({T, Hq * Dv}, DType::F32);
      if (sparse) a.sel = be.upload_i32(sel.data(), {T, K});
      a.Hq = Hq, a.Hkv = Hkv, a.Dk = Dk, a.Dv = Dv, a.scale = 0.3f;
      a.cu = offsets;
      return a;
    };
    AttnArgs packed = args(cu), one = args({});
    be.attention(packed);
    for (int64_t b = 0; b < N; ++b) {
      AttnArgs s = one;
      s.cu = cu;
      be.attention(s.sequence(b));  // one sequence, offsets cleared
    }
    CHECK(be.to_host(packed.out) == be.to_host(one.out));
    AttnArgs bad = args({0, 3, 2, 30});
    CHECK_THROWS_WITH(be.attention(bad), Catch::Contains("decrease"));
    bad.cu = {0, 3, 29};
    CHECK_THROWS_WITH(be.attention(bad), Catch::Contains("varlen offsets"));
  }
  RopeConfig rc;
  rc.theta = 50.f;
  rc.style = RopeStyle::Interleaved;
  const Rope rope(rc, 6);
  DTensor a = be.upload(q.data(), {T, Hq * Dk}, DType::F32), b = be.upload(q.data(), {T, Hq * Dk}, DType::F32);
  be.rope_varlen(rope, a, Hq, Dk, 4, cu);
  for (int64_t s = 0; s < N; ++s) be.rope(rope, b.slab(cu[size_t(s)], cu[size_t(s) + 1]), Hq, Dk, 4, 0);
  CHECK(be.to_host(a) == be.to_host(b));
  CHECK(be.to_host(a) != q);
}
