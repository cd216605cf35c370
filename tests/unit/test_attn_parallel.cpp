// Parallel paths of the softmax-attention mixers in one process (default Comm: a group of one):
// forward_cp over a document cut into S = 1, 2, 3 segments on one rank equals forward() over the
// whole document (outputs, DSA Top-K sets, caches, decode afterwards); the work counters follow
// their documented formulas; TP head shards, summed by hand, equal the unsharded mixer.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "model/module.hpp"
#include "attn_fixtures.hpp"
#include "ops/attention.hpp"
#include "model/attn_cache.hpp"

namespace fs = std::filesystem;
using namespace dz;

namespace {

using dzt::Factory;
using dzt::gqa_cfg;
using dzt::kPrefix;
using dzt::load;
using dzt::rand_x;
using dzt::write_weights;

struct Scratch {
  std::string path;
  explicit Scratch(const std::string& tag) {
    fs::path p = fs::temp_directory_path() / ("dz_attnpar_" + std::to_string(::getpid()) + "_" + tag);
    fs::remove_all(p);
    fs::create_directories(p);
    path = p.string();
  }
  ~Scratch() { fs::remove_all(path); }
};

// Documents of 2..130 rows: topk 4 is well below their lengths, so the selection really is sparse;
// YaRN over 64 original positions.
ModelConfig mla_cfg(Family f, int64_t q_lora, bool gate, bool indexer, bool yarn) {
  return dzt::mla_cfg(f, q_lora, gate, indexer, yarn, 4, 64);
}

struct Case {
  std::string name;
  ModelConfig cfg;
  Factory make;
};

std::vector<Case> cases() {
  return {
      {"deepseek dense MLA", mla_cfg(Family::DeepseekV32, 11, false, false, false), make_mla_mixer},
      {"deepseek YaRN + DSA", mla_cfg(Family::DeepseekV32, 11, false, true, true), make_mla_mixer},
      {"kimi NoPE, gate", mla_cfg(Family::KimiLinear, 0, true, false, false), make_mla_mixer},
      {"dayzero gate + DSA", mla_cfg(Family::Dayzero, 11, true, true, false), make_mla_mixer},
      {"qwen3_next gated GQA", gqa_cfg(), make_gqa_mixer},
  };
}


AttnCache& cache(MixerState& s) {
  auto* c = dynamic_cast<AttnCache*>(&s);
  REQUIRE(c);
  return *c;
}

}  // namespace

TEST_CASE("attn_parallel: forward_cp on one rank (1-3 segments) equals forward over the document", "[unit]") {
  Comm self;
  for (const Case& c : cases()) {
    Scratch dir("cp1");
    write_weights(c.cfg, c.make, 11, dir.path);
    auto m = load(c.cfg, c.make, dir.path, TpShard{});
    const int64_t D = c.cfg.hidden_size;
    const bool dsa = c.cfg.layers[0].has_indexer;
    for (int64_t L : {1, 2, 7, 19})
      for (int S : {1, 2, 3}) {
        INFO(c.name << " L=" << L << " segments=" << S);
        auto x = rand_x(L + 3, D, uint32_t(100 + L));  // L prefill rows + 3 decode rows
        // Serial reference: one forward over the document, then 3 decode steps.
        auto ref = m->make_state();
        std::vector<float> out_ref(size_t(L * D)), dec_ref(size_t(3 * D));
        m->forward(x.data(), L, *ref, out_ref.data());
        const std::vector<int32_t> topk_ref = cache(*ref).last_topk();
        // Context-parallel prefill over S segments of one rank.
        SeqLayout lay = SeqLayout::zigzag(L, 1, 0, S);
        WorkStats stats;
        CpCtx ctx{&self, &lay, &stats};
        auto st = m->make_state();
        std::vector<float> out(size_t(L * D)), dec(size_t(3 * D));
        m->forward_cp(x.data(), ctx, *st, out.data());
        // Every row goes through the same per-row arithmetic (fixed-order linalg, per-query
        // attention, the same RoPE position), so the results are bitwise equal, not just close.
        CHECK(out == out_ref);
        CHECK(st->pos == L);
        const AttnCache& a = cache(*st);
        const AttnCache& b = cache(*ref);
        CHECK(a.latent == b.latent);
        CHECK(a.index_k == b.index_k);
        CHECK(a.k == b.k);
        CHECK(a.v == b.v);
        if (dsa) {
          CHECK(a.topk_width == c.cfg.index_topk);
          CHECK(a.last_topk() == topk_ref);  // local rows == all rows in order (C = 1)
        }
        for (int i = 0; i < 3; ++i) {
          m->forward(x.data() + (L + i) * D, 1, *ref, dec_ref.data() + i * D);
          m->forward(x.data() + (L + i) * D, 1, *st, dec.data() + i * D);
        }
        CHECK(dec == dec_ref);
        if (dsa) CHECK(cache(*st).last_topk() == cache(*ref).last_topk());

        // Work counters, recomputed here from the documented formulas.
        double idx = 0, att = 0;
        for (int64_t p = 0; p < L; ++p) {
          if (dsa) idx += double(p + 1) * double(c.cfg.index_n_heads * c.cfg.index_head_dim) * 2;
          const double keys = dsa ? double(std::min<int64_t>(c.cfg.index_topk, p + 1)) : double(p + 1);
          const double per_key = c.cfg.num_kv_heads > 0
                                     ? double(c.cfg.num_heads * 2 * c.cfg.head_dim)
                                     : double(c.cfg.num_heads * (c.cfg.qk_nope_head_dim + c.cfg.qk_rope_head_dim +
                                                                 c.cfg.v_head_dim));
          att += keys * per_key * 2;
        }
        CHECK(stats.flops["attention"] == Approx(att).epsilon(1e-12));
        CHECK(stats.flops["indexer"] == Approx(idx).epsilon(1e-12));
        CHECK(stats.seconds.count("kv_gather") == 1);
        CHECK(stats.seconds.count("attention") == 1);
        CHECK(stats.seconds.count("indexer") == (dsa ? 1u : 0u));
      }
  }
}

TEST_CASE("attn_parallel: TP head shards summed by hand equal the unsharded mixer", "[unit]") {
  // With a group-of-one communicator the shard's all-reduce is the identity, so each shard returns
  // its partial o_proj sum; adding them is what the all-reduce does across ranks.
  Comm self;
  for (const Case& c : cases()) {
    Scratch dir("tp");
    write_weights(c.cfg, c.make, 23, dir.path);
    auto full = load(c.cfg, c.make, dir.path, TpShard{});
    const int64_t D = c.cfg.hidden_size, L = 13;
    const bool dsa = c.cfg.layers[0].has_indexer;
    auto x = rand_x(L + 2, D, 5);
    auto ref = full->make_state();
    std::vector<float> out_ref(size_t((L + 2) * D));
    full->forward(x.data(), L, *ref, out_ref.data());
    const std::vector<int32_t> topk_prefill = cache(*ref).last_topk();
    full->forward(x.data() + L * D, 2, *ref, out_ref.data() + L * D);
    for (int T : {2}) {
      INFO(c.name << " tp=" << T);
      std::vector<double> sum(out_ref.size(), 0.0);
      for (int r = 0; r < T; ++r) {
        auto shard = load(c.cfg, c.make, dir.path, TpShard{r, T, &self});
        // CP prefill (2 segments) then a 2-token forward: both paths go through the shard.
        SeqLayout lay = SeqLayout::zigzag(L, 1, 0, 2);
        CpCtx ctx{&self, &lay, nullptr};
        auto st = shard->make_state();
        std::vector<float> out(out_ref.size());
        shard->forward_cp(x.data(), ctx, *st, out.data());
        if (dsa) CHECK(cache(*st).last_topk() == topk_prefill);  // indexer replicated: identical sets
        shard->forward(x.data() + L * D, 2, *st, out.data() + L * D);
        if (dsa) CHECK(cache(*st).last_topk() == cache(*ref).last_topk());
        for (size_t i = 0; i < out.size(); ++i) sum[i] += out[i];
      }
      // TP changes only the order of the o_proj sum (per-shard partials, then across shards):
      // fp32 reassociation over H*vd = 28..48 O(1) terms (measured <= 4e-7; bound ~10x that).
      double worst = 0;
      for (size_t i = 0; i < sum.size(); ++i)
        worst = std::max(worst, std::abs(sum[i] - out_ref[i]) / (1.0 + std::abs(out_ref[i])));
      INFO("worst relative difference " << worst);
      CHECK(worst < 5e-6);
    }
  }
}

TEST_CASE("attn_parallel: indivisible head counts are rejected by name; make-model gets full tensors", "[unit]") {
  Comm self;
  ModelConfig g = gqa_cfg();
  Scratch dir("tpbad");
  write_weights(g, make_gqa_mixer, 3, dir.path);
  // 2 KV heads over 4 ranks: not divisible, named in the error.
  auto ck = Checkpoint::open(dir.path);
  CHECK_THROWS_WITH(make_gqa_mixer(g, 0, *ck, kPrefix, TpShard{1, 4, &self}),
                    Catch::Contains("num_key_value_heads (2) is not divisible by --tp 4"));
  ModelConfig m = mla_cfg(Family::DeepseekV32, 11, false, true, false);  // 4 heads
  Scratch dir2("tpbad2");
  write_weights(m, make_mla_mixer, 3, dir2.path);
  auto ck2 = Checkpoint::open(dir2.path);
  CHECK_THROWS_WITH(make_mla_mixer(m, 0, *ck2, kPrefix, TpShard{0, 3, &self}),
                    Catch::Contains("num_attention_heads") && Catch::Contains("not divisible by --tp 3"));
  // Generating mode (make-model) asks for the full tensors even when sharded.
  auto gen = Checkpoint::random(1);
  make_mla_mixer(m, 0, *gen, kPrefix, TpShard{1, 2, &self});
  CHECK(gen->generated().at(kPrefix + "self_attn.kv_b_proj.weight").shape == Shape{4 * (5 + 7), 9});
  CHECK(gen->generated().at(kPrefix + "self_attn.o_proj.weight").shape == Shape{19, 4 * 7});
}
