// MLA (dense, DSA, NoPE) and GQA mixers under context × tensor parallelism on however many ranks
// mpirun gives: for every (C, T) dividing the world, a TP-sharded mixer runs forward_cp over a
// zigzag layout and must match the unsharded mixer's single-rank forward(), computed on every
// rank, row by row; DSA Top-K sets must be identical; decode must continue from the CP state.
// Every rank runs the same loops (they depend only on the world size), so the collectives match;
// CHECK, not REQUIRE, between collectives.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dist/comm.hpp"
#include "dist/rank_grid.hpp"
#include "dist/seq_layout.hpp"
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
using dzt::rand_x;

// Weights: O(1)-scaled random values (peaky softmax, so mistakes show), the same on every rank
// (seeded), written by each rank to its own scratch directory.
struct Weights {
  std::string dir;
  Weights(const ModelConfig& cfg, const Factory& make, uint32_t seed, int rank) {
    dir = (fs::temp_directory_path() / ("dz_attncptp_" + std::to_string(::getpid()) + "_" + std::to_string(rank)))
              .string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    dzt::write_weights(cfg, make, seed, dir);
  }
  ~Weights() { fs::remove_all(dir); }
  std::unique_ptr<Mixer> load(const ModelConfig& cfg, const Factory& make, const TpShard& tp) const {
    return dzt::load(cfg, make, dir, tp);
  }
};

// topk 7: sparse for most queries of the 67- and 130-token documents; YaRN over 32 positions.
ModelConfig mla_cfg(Family f, int64_t q_lora, bool gate, bool indexer, bool yarn) {
  return dzt::mla_cfg(f, q_lora, gate, indexer, yarn, 7, 32);
}


const AttnCache& cache(const MixerState& s) { return dynamic_cast<const AttnCache&>(s); }

// The serial reference for one document: prefill of L rows, then 2 decode steps.
struct Serial {
  std::vector<float> out, dec;      // [L, D], [2, D]
  std::vector<int32_t> topk, topk_dec;  // [L, K], [1, K] (last decode step)
  std::unique_ptr<MixerState> st;   // after the prefill
};

}  // namespace

TEST_CASE("attn_cp_tp: forward_cp of TP-sharded MLA / GQA equals the serial mixer, every (C, T)", "[mpi]") {
  Comm world = Comm::world();
  const int P = world.size();
  struct Case {
    const char* name;
    ModelConfig cfg;
    Factory make;
  };
  const std::vector<Case> cases = {
      {"deepseek YaRN + DSA", mla_cfg(Family::DeepseekV32, 11, false, true, true), make_mla_mixer},
      {"dayzero gate + DSA", mla_cfg(Family::Dayzero, 11, true, true, false), make_mla_mixer},
      {"kimi NoPE dense, gate", mla_cfg(Family::KimiLinear, 0, true, false, false), make_mla_mixer},
      {"qwen3_next gated GQA", gqa_cfg(), make_gqa_mixer},
  };
  double worst_tp1 = 0, worst_tp2 = 0;
  for (const Case& c : cases) {
    Weights w(c.cfg, c.make, 1234, world.rank());
    auto full = w.load(c.cfg, c.make, TpShard{});
    const int64_t D = c.cfg.hidden_size;
    const bool dsa = c.cfg.layers[0].has_indexer;
    const int64_t K = dsa ? c.cfg.index_topk : 0;

    std::map<int64_t, Serial> serial;  // by document length
    auto reference = [&](int64_t L, const std::vector<float>& x) -> const Serial& {
      auto it = serial.find(L);
      if (it != serial.end()) return it->second;
      Serial s;
      s.st = full->make_state();
      s.out.resize(size_t(L * D));
      full->forward(x.data(), L, *s.st, s.out.data());
      s.topk = cache(*s.st).last_topk();
      auto st = s.st->clone();
      s.dec.resize(size_t(2 * D));
      for (int i = 0; i < 2; ++i) full->forward(x.data() + (L + i) * D, 1, *st, s.dec.data() + i * D);
      s.topk_dec = cache(*st).last_topk();
      return serial.emplace(L, std::move(s)).first->second;
    };

    for (int C : {1, 2, 4})
      for (int T : {1, 2}) {
        if (P % (C * T)) continue;
        auto g = RankGrid::make(P, world.rank(), C, T);
        Comm tp = world.split(g.dp_rank() * C + g.cp_rank(), g.tp_rank());
        Comm cp = world.split(P + g.dp_rank() * T + g.tp_rank(), g.cp_rank());
        auto shard = w.load(c.cfg, c.make, TpShard{g.tp_rank(), T, &tp});
        const std::set<int64_t> lengths = {1, 2 * C - 1, 2 * C + 1, 67, 130};
        for (int64_t L : lengths)
          for (int sub : {1, 2}) {
            INFO(c.name << ": C=" << C << " T=" << T << " L=" << L << " sub=" << sub << " world rank "
                        << world.rank());
            const auto x = rand_x(L + 2, D, uint32_t(7 * L + 1));  // same on every rank
            const Serial& ref = reference(L, x);
            SeqLayout lay = SeqLayout::zigzag(L, C, g.cp_rank(), sub);
            const std::vector<int64_t> pos = lay.local_positions();
            const int64_t R = int64_t(pos.size());
            std::vector<float> xl(size_t(R * D)), out(size_t(R * D)), dec(size_t(2 * D));
            for (int64_t r = 0; r < R; ++r)
              std::copy(x.begin() + pos[size_t(r)] * D, x.begin() + (pos[size_t(r)] + 1) * D, xl.begin() + r * D);
            WorkStats stats;
            CpCtx ctx{&cp, &lay, &stats};
            auto st = shard->make_state();
            shard->forward_cp(xl.data(), ctx, *st, out.data());

            // Outputs: with T = 1 every row runs the serial per-row arithmetic (bitwise equal);
            // T = 2 reorders only the o_proj sum (two partials of H/2 heads, then the all-reduce):
            // fp32 reassociation over 28..48 O(1) terms, measured 5.3e-7, bound 5e-6.
            double worst = 0;
            for (int64_t r = 0; r < R; ++r)
              for (int64_t d = 0; d < D; ++d) {
                const double a = out[size_t(r * D + d)], b = ref.out[size_t(pos[size_t(r)] * D + d)];
                worst = std::max(worst, std::abs(a - b) / (1.0 + std::abs(b)));
              }
            if (T == 1) CHECK(worst == 0.0);
            CHECK(worst < 5e-6);
            (T == 1 ? worst_tp1 : worst_tp2) = std::max(T == 1 ? worst_tp1 : worst_tp2, worst);

            // Top-K sets of the local queries: identical to the serial run's rows (the indexer is
            // replicated over TP and sees bitwise-identical keys and queries under CP).
            const AttnCache& a = cache(*st);
            if (dsa) {
              CHECK(a.topk_width == K);
              const std::vector<int32_t> sel = a.last_topk();
              bool same = int64_t(sel.size()) == R * K;
              for (int64_t r = 0; same && r < R; ++r)
                same = std::equal(sel.begin() + r * K, sel.begin() + (r + 1) * K,
                                  ref.topk.begin() + pos[size_t(r)] * K);
              CHECK(same);
            }
            // The full-document cache on every rank (MLA latent is replicated over TP, so equal).
            CHECK(st->pos == L);
            if (c.cfg.num_kv_heads == 0) {
              CHECK(a.latent == cache(*ref.st).latent);
              CHECK(a.index_k == cache(*ref.st).index_k);
            } else {  // GQA: this rank's KV heads of the serial cache
              const int64_t kvw = c.cfg.num_kv_heads * c.cfg.head_dim, w0 = g.tp_rank() * kvw / T, wl = kvw / T;
              std::vector<float> k_ref, v_ref;
              for (int64_t s = 0; s < L; ++s) {
                const auto rk = cache(*ref.st).k.host();
                const auto rv = cache(*ref.st).v.host();
                k_ref.insert(k_ref.end(), rk.begin() + s * kvw + w0, rk.begin() + s * kvw + w0 + wl);
                v_ref.insert(v_ref.end(), rv.begin() + s * kvw + w0, rv.begin() + s * kvw + w0 + wl);
              }
              CHECK(a.k == k_ref);
              CHECK(a.v == v_ref);
            }

            // Decode continues from the CP state (all TP ranks take part: the all-reduce).
            for (int i = 0; i < 2; ++i) shard->forward(x.data() + (L + i) * D, 1, *st, dec.data() + i * D);
            double wd = 0;
            for (size_t i = 0; i < dec.size(); ++i)
              wd = std::max(wd, std::abs(double(dec[i]) - ref.dec[i]) / (1.0 + std::abs(double(ref.dec[i]))));
            if (T == 1) CHECK(wd == 0.0);
            CHECK(wd < 5e-6);
            if (dsa) CHECK(cache(*st).last_topk() == ref.topk_dec);

            // The sharded mixer's plain forward() over the whole document (TP without CP; long
            // enough calls split the indexer's query rows over TP there too).
            if (sub == 1) {
              auto st1 = shard->make_state();
              std::vector<float> o1(size_t(L * D));
              shard->forward(x.data(), L, *st1, o1.data());
              double w1 = 0;
              for (size_t i = 0; i < o1.size(); ++i)
                w1 = std::max(w1, std::abs(double(o1[i]) - ref.out[i]) / (1.0 + std::abs(double(ref.out[i]))));
              if (T == 1) CHECK(w1 == 0.0);
              CHECK(w1 < 5e-6);
              if (dsa) CHECK(cache(*st1).last_topk() == ref.topk);
            }

            // Work accounting: attention summed over the CP group is the whole document's count for
            // this rank's heads; the indexer's query rows may also be split over TP (long segments),
            // so it is summed over both groups.
            double f[2] = {stats.flops["indexer"], stats.flops["attention"]};
            tp.allreduce_sum(f, 1);
            cp.allreduce_sum(f, 2);
            const double per_key = c.cfg.num_kv_heads > 0
                                       ? double(c.cfg.num_heads / T * 2 * c.cfg.head_dim)
                                       : double(c.cfg.num_heads / T *
                                                (c.cfg.qk_nope_head_dim + c.cfg.qk_rope_head_dim + c.cfg.v_head_dim));
            double idx = 0, att = 0;
            for (int j = 0; j < lay.n_seg(); ++j) {
              // Segments of >= 8 rows per TP rank are scored once over the TP group; shorter ones
              // by every TP rank (the documented rule of MlaMixer::select_topk).
              const double copies = lay.seg_len(j) >= 8 * T ? 1.0 : double(T);
              for (int64_t p = lay.seg_begin(j); p < lay.seg_begin(j) + lay.seg_len(j); ++p) {
                if (dsa) idx += copies * double(p + 1) * double(c.cfg.index_n_heads * c.cfg.index_head_dim) * 2;
                att += double(dsa ? std::min<int64_t>(K, p + 1) : p + 1) * per_key * 2;
              }
            }
            CHECK(f[0] == Approx(idx).epsilon(1e-12));
            CHECK(f[1] == Approx(att).epsilon(1e-12));
          }
      }
  }
  if (world.rank() == 0)
    WARN("attn_cp_tp on " << P << " ranks: worst relative difference vs serial, T=1: " << worst_tp1
                        << ", T=2: " << worst_tp2);
}
