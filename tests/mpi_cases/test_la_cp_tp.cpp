// KDA and Gated DeltaNet mixers under context × tensor parallelism on however many ranks mpirun
// gives: for every (C, T) with C in {1, 2, 4}, T in {1, 2} dividing the world, each rank builds its
// TP head shard, runs forward_cp on its zigzag rows (also cut into sub-segments) and compares them
// with the single-rank forward() of the full mixer, which every rank computes itself; then decode
// continues from the CP×TP state. Every rank makes the same collectives in the same order; CHECK,
// never REQUIRE, between collectives, so a failing rank does not leave the others waiting.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dist/comm.hpp"
#include "dist/rank_grid.hpp"
#include "dist/seq_layout.hpp"
#include "io/checkpoint.hpp"
#include "model/module.hpp"
#include "ops/linear_attn.hpp"

namespace {

struct LaCase {
  const char* name;
  dz::Family fam;
  dz::KdaGate gate;
};
const LaCase kLaCases[] = {{"kda softplus", dz::Family::KimiLinear, dz::KdaGate::Softplus},
                           {"kda lower-bound", dz::Family::Dayzero, dz::KdaGate::LowerBoundSigmoid},
                           {"gdn", dz::Family::Qwen3Next, dz::KdaGate::Softplus}};

// Tiny dims, head counts divisible by T = 2 (GDN: 2 key heads of 3 value heads each).
dz::ModelConfig la_cfg(const LaCase& c) {
  dz::ModelConfig cfg;
  cfg.family = c.fam;
  cfg.model_type = c.fam == dz::Family::Qwen3Next ? "qwen3_next" : "kimi_linear";
  cfg.hidden_size = 13;
  cfg.rms_norm_eps = 1e-5f;
  cfg.la_num_k_heads = 2;
  cfg.la_num_v_heads = c.fam == dz::Family::Qwen3Next ? 6 : 2;
  cfg.la_head_k_dim = 5;
  cfg.la_head_v_dim = c.fam == dz::Family::Qwen3Next ? 3 : 6;
  cfg.la_conv_kernel = 4;
  cfg.kda_gate = c.gate;
  cfg.kda_gate_lower_bound = -5.f;
  return cfg;
}

std::unique_ptr<dz::Mixer> la_make(const LaCase& c, const dz::ModelConfig& cfg, dz::Checkpoint& ck,
                                   const dz::TpShard& tp) {
  return c.fam == dz::Family::Qwen3Next ? dz::make_gdn_mixer(cfg, 0, ck, "model.layers.0.", tp)
                                        : dz::make_kda_mixer(cfg, 0, ck, "model.layers.0.", tp);
}

std::vector<float> la_x(int64_t T, int64_t D, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(T * D));
  for (auto& e : x) e = nd(rng);
  return x;
}

double la_maxabs(const float* a, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s = std::max(s, std::abs(double(a[i])));
  return s;
}
double la_maxdiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

}  // namespace

// Tolerance 2e-5 of the output's max magnitude: the merge regroups the recurrence's sums
// (transition A·S0 + B per segment) and TP splits the o_proj sum over ranks; both are fp32
// reassociations of contractive (norm <= 1) updates, observed ~1e-6 (docs/parallel_linear_attention.md).
TEST_CASE("la_cp_tp: KDA and GDN prefill under CP x TP equals one rank, decode continues", "[mpi]") {
  const dz::Comm world = dz::Comm::world();
  const int P = world.size();
  // Every rank writes the same generated weights to its own directory (no shared file system needed).
  char tmpl[] = "/tmp/dz_la_cp_tp_XXXXXX";
  const bool made = mkdtemp(tmpl) != nullptr;
  CHECK(made);
  const std::string dir = tmpl;
  double worst = 0;
  for (const auto& lc : kLaCases) {
    const dz::ModelConfig cfg = la_cfg(lc);
    const int64_t D = cfg.hidden_size;
    auto gen = dz::Checkpoint::random(77);
    auto full = la_make(lc, cfg, *gen, dz::TpShard{});
    const std::string sub = dir + "/" + std::to_string(int(lc.fam)) + std::to_string(int(lc.gate));
    dz::write_safetensors(sub, gen->generated(), dz::DType::F32);
    auto ck = dz::Checkpoint::open(sub);
    for (int C : {1, 2, 4})
      for (int T : {1, 2}) {
        if (P % (C * T)) continue;
        const auto g = dz::RankGrid::make(P, world.rank(), C, T);
        const dz::Comm tp = world.split(g.dp_rank() * C + g.cp_rank(), g.tp_rank());
        const dz::Comm cp = world.split(P + g.dp_rank() * T + g.tp_rank(), g.cp_rank());
        auto m = la_make(lc, cfg, *ck, dz::TpShard{g.tp_rank(), T, &tp});
        for (int64_t L : {int64_t(1), int64_t(2 * C - 1), int64_t(2 * C + 1), int64_t(67), int64_t(130)})
          for (int subseg : {1, 3}) {
            INFO(lc.name << " C=" << C << " T=" << T << " L=" << L << " sub=" << subseg << " rank=" << world.rank());
            const auto x = la_x(L + 3, D, uint32_t(L * 7 + 1));
            // single rank, full mixer: prefill then 3 decode steps
            std::vector<float> ref(size_t((L + 3) * D));
            auto st1 = full->make_state();
            full->forward(x.data(), L, *st1, ref.data());
            for (int64_t t = L; t < L + 3; ++t) full->forward(x.data() + t * D, 1, *st1, ref.data() + t * D);
            // CP x TP: my zigzag rows in, my rows out
            const dz::SeqLayout lay = dz::SeqLayout::zigzag(L, C, cp.rank(), subseg);
            const std::vector<int64_t> pos = lay.local_positions();
            std::vector<float> xl(pos.size() * size_t(D)), out(pos.size() * size_t(D));
            for (size_t i = 0; i < pos.size(); ++i)
              std::copy(x.begin() + pos[i] * D, x.begin() + (pos[i] + 1) * D, xl.begin() + int64_t(i) * D);
            dz::WorkStats ws;
            auto st2 = m->make_state();
            m->forward_cp(xl.data(), dz::CpCtx{&cp, &lay, &ws}, *st2, out.data());
            CHECK(st2->pos == L);
            // errors relative to the max magnitude of the single-rank prefill output
            const double scale = std::max(la_maxabs(ref.data(), size_t(L * D)), 1e-30);
            double e = 0;
            for (size_t i = 0; i < pos.size(); ++i)
              e = std::max(e, la_maxdiff(out.data() + int64_t(i) * D, ref.data() + pos[i] * D, size_t(D)) / scale);
            worst = std::max(worst, e);
            CHECK(e < 2e-5);
            // work: stage 1 + 2 of my segments (my heads) plus the whole chain, which every rank runs
            const int64_t Hl = cfg.la_num_v_heads / T, K = cfg.la_head_k_dim, V = cfg.la_head_v_dim;
            double expect = 0;
            for (int j = 0; j < lay.n_seg(); ++j) {
              if (lay.seg_len(j) == 0) continue;
              expect += 2.0 * double(Hl * K * K * V);
              if (lay.owner[size_t(j)] == cp.rank()) expect += dz::la_segment_flops(lay.seg_len(j), Hl, K, V);
            }
            CHECK(ws.flops["linear_attention"] == Approx(expect).epsilon(1e-12));
            // decode: every CP rank holds the whole-document state; TP ranks all-reduce
            std::vector<float> dec(size_t(3 * D));
            for (int64_t t = 0; t < 3; ++t) m->forward(x.data() + (L + t) * D, 1, *st2, dec.data() + t * D);
            const double ed = la_maxdiff(dec.data(), ref.data() + L * D, size_t(3 * D)) /
                              std::max(la_maxabs(ref.data() + L * D, size_t(3 * D)), 1e-30);
            worst = std::max(worst, ed);
            CHECK(ed < 2e-5);
          }
      }
  }
  float w = float(worst);
  world.allreduce_max(&w, 1);
  if (world.rank() == 0) WARN("la_cp_tp: worst CP x TP vs single-rank relative difference (all ranks) " << w);
  std::filesystem::remove_all(dir);
}
