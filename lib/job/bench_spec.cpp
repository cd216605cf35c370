#include "job/bench_spec.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "io/checkpoint.hpp"
#include "job/bench_report.hpp"
#include "job/doc_compute.hpp"
#include "model/decode_runner.hpp"
#include "model/model.hpp"
#include "model/mtp.hpp"

namespace dz {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string base_name(std::string d) {
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const size_t s = d.find_last_of('/');
  return s == std::string::npos ? d : d.substr(s + 1);
}

// One generate run of the documents through the job's path (compute_packed: one packed prefill,
// then the documents decoded together), its decode-phase timers.
struct GenRun {
  double decode_s = 0, verify_s = 0, restore_s = 0, draft_s = 0;
  int64_t steps = 0, generated = 0, drafted = 0, accepted = 0;
  std::vector<std::vector<int32_t>> ids;
};
// The fraction of generated tokens equal position by position (documents of other lengths: the
// shorter's positions).
double equal_fraction(const std::vector<std::vector<int32_t>>& a, const std::vector<std::vector<int32_t>>& b) {
  int64_t n = 0, same = 0;
  for (size_t d = 0; d < std::min(a.size(), b.size()); ++d)
    for (size_t i = 0; i < std::max(a[d].size(), b[d].size()); ++i, ++n)
      same += i < a[d].size() && i < b[d].size() && a[d][i] == b[d][i];
  return n ? double(same) / double(n) : 1.0;
}

GenRun generate_once(const Model& m, Backend& be, const std::vector<std::vector<int32_t>>& docs, const ModeParams& mp) {
  std::vector<int64_t> ids(docs.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i);
  WorkStats ws;
  ws.device = &be;
  be.sync();
  const std::vector<DocResult> res = compute_packed(m, ids, docs, mp, {}, &ws);
  GenRun g;
  g.decode_s = ws.seconds["decode"];
  g.verify_s = ws.seconds["spec_verify"];
  g.restore_s = ws.seconds["spec_restore"];
  g.draft_s = ws.seconds["spec_draft"];  // MTP drafts (and the MTP layer's catch-up over kept rows)
  g.steps = ws.counts["decode_steps"];
  for (const DocResult& r : res) {
    g.generated += int64_t(r.ids.size()) - 1;  // the first token comes from the prefill's logits
    g.drafted += r.stats.spec_drafted, g.accepted += r.stats.spec_accepted;
    g.ids.push_back(r.ids);
  }
  return g;
}

// Documents concatenated for one packed forward: tokens and row offsets.
struct Packed {
  std::vector<int32_t> all;
  std::vector<int64_t> cu{0};
  explicit Packed(const std::vector<std::vector<int32_t>>& docs) {
    for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end()), cu.push_back(int64_t(all.size()));
  }
};

// Fresh states (st, and their pointers sp) with the documents forwarded in one packed forward;
// returns the final hidden states.
DTensor prefill(const Model& m, const Packed& p, std::vector<Model::State>& st, std::vector<Model::State*>& sp,
                DTensor* mtp_in = nullptr) {
  const size_t B = p.cu.size() - 1;
  st.clear(), sp.clear();
  st.reserve(B);
  for (size_t d = 0; d < B; ++d) st.push_back(m.make_state());
  for (auto& s : st) sp.push_back(&s);
  return m.forward_packed(p.all.data(), p.cu, sp, {}, nullptr, mtp_in);
}

}  // namespace

int bench_spec(const BenchSpecOptions& opt) {
  DZ_CHECK(!opt.models.empty(), "bench spec: --model is required");
  DZ_CHECK(opt.repeats >= 1 && opt.prompt_tokens >= 8 && opt.new_tokens >= 2, "bench spec: --repeats >= 1, "
           "--prompt-tokens >= 8 and --new-tokens >= 2");
  for (int64_t b : opt.batch) DZ_CHECK(b >= 1, "bench spec: --batch values must be >= 1");
  for (int64_t k : opt.draft_tokens) DZ_CHECK(k >= 1 && k <= 64, "bench spec: --draft-tokens values in 1..64");
  std::unique_ptr<Backend> own;
  Backend* be = &cpu_backend();
  if (opt.backend == "cuda") {
    DZ_CHECK(cuda_device_count() > 0, "bench spec --backend cuda: no usable GPU");
    own = make_cuda_backend(0);
    be = own.get();
  } else {
    DZ_CHECK(opt.backend == "cpu", "bench spec: --backend must be cpu or cuda");
  }
  json results = json::array();
  for (const auto& dir : opt.models) {
    ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
    cfg.load_mtp = cfg.mtp_layers > 0 && mtp_supported(cfg);  // MTP drafts measured too
    std::unique_ptr<Checkpoint> ck = opt.dummy_weights ? Checkpoint::dummy(0) : Checkpoint::open(dir);
    std::unique_ptr<Model> model = Model::build(cfg, *ck, TpShard{}, *be);
    if (!opt.dummy_weights) {
      skip_mtp_layers(cfg, *ck);
      ck->check_all_used();
    }
    ck.reset();
    const int64_t V = cfg.vocab_size, P = opt.prompt_tokens;
    log_root(str("bench spec: ", base_name(dir), " on ", be->describe()));
    for (int64_t B : opt.batch) {
      // random prompts (oracle drafts, step costs) and repetitive ones (a 16-token block repeated:
      // n-gram drafts), fixed seeds
      std::mt19937_64 rng(uint64_t(B) * 7919 + 1);
      std::vector<std::vector<int32_t>> rnd(static_cast<size_t>(B)), rep(static_cast<size_t>(B));
      for (int64_t d = 0; d < B; ++d) {
        for (int64_t i = 0; i < P; ++i) rnd[size_t(d)].push_back(int32_t(rng() % uint64_t(V)));
        std::vector<int32_t> blk;
        for (int i = 0; i < 16; ++i) blk.push_back(int32_t(rng() % uint64_t(V)));
        for (int64_t i = 0; i < P; ++i) rep[size_t(d)].push_back(blk[size_t(i % 16)]);
      }
      json r;
      r["model"] = base_name(dir);
      r["layers"] = cfg.num_layers;
      r["batch"] = B;
      r["prompt_tokens"] = P;
      r["new_tokens"] = opt.new_tokens;
      try {
        ModeParams plain;
        plain.mode = OutputMode::Generate;
        plain.max_new_tokens = opt.new_tokens;
        generate_once(*model, *be, rnd, plain);  // warm-up (kernels, GEMM plans, graphs)
        // end to end, plain, the median of the repeats by decode time
        std::vector<GenRun> pr;
        for (int i = 0; i < opt.repeats; ++i) pr.push_back(generate_once(*model, *be, rnd, plain));
        std::sort(pr.begin(), pr.end(), [](const GenRun& a, const GenRun& b) { return a.decode_s < b.decode_s; });
        const GenRun base = pr[pr.size() / 2];
        const GenRun base_rep = generate_once(*model, *be, rep, plain);
        r["plain_decode_ms_per_step"] = base.steps ? base.decode_s * 1e3 / double(base.steps) : 0.0;
        r["plain_tok_s"] = base.decode_s > 0 ? double(base.generated) / base.decode_s : 0.0;
        r["plain_repetitive_tok_s"] = base_rep.decode_s > 0 ? double(base_rep.generated) / base_rep.decode_s : 0.0;
        auto oracle = std::make_shared<std::vector<std::vector<int32_t>>>(base.ids);
        json per_k = json::array();
        for (int64_t K : opt.draft_tokens) {
          json k;
          k["draft_tokens"] = K;
          if (model->has_mtp()) {  // the MTP drafts of one step for the B documents (K forwards of the layer)
            std::vector<Model::State> st;
            std::vector<Model::State*> sp;
            Packed pk(rnd);
            DTensor h;  // what the MTP layer reads of the prompt rows
            prefill(*model, pk, st, sp, &h);
            model->mtp_extend(pk.all.data(), pk.cu, h, sp);
            const std::vector<int64_t>& cu = pk.cu;
            std::vector<int64_t> one{0};
            DTensor last = be->act({B, h.cols()});  // a hidden row per document to re-arm the pending rows
            for (int64_t d = 0; d < B; ++d) be->copy_rows(h, cu[size_t(d) + 1] - 1, last, d, 1), one.push_back(d + 1);
            std::vector<double> td;
            for (int i = 0; i <= opt.repeats; ++i) {  // i = 0: warm-up
              std::vector<int32_t> cur(static_cast<size_t>(B));
              for (auto& c : cur) c = int32_t(rng() % uint64_t(V));
              be->sync();
              const auto t0 = Clock::now();
              model->mtp_draft(cur, sp, std::vector<int64_t>(size_t(B), K));
              be->sync();
              if (i > 0) td.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
              model->mtp_extend(cur.data(), one, last, sp);
            }
            k["mtp_draft_ms"] = median(td);
          }
          for (const SpecRestore how : {SpecRestore::Replay, SpecRestore::PerToken}) {
            const std::string hn = how == SpecRestore::Replay ? "replay" : "per_token";
            // the step on its own: states with the prompt, then repeats of (verify K+1 rows, keep K)
            std::vector<Model::State> st;
            std::vector<Model::State*> sp;
            prefill(*model, Packed(rnd), st, sp);
            std::vector<double> tv, tr;
            for (int i = 0; i <= opt.repeats; ++i) {  // i = 0: warm-up
              std::vector<int32_t> toks;
              std::vector<int64_t> cu{0};
              for (int64_t d = 0; d < B; ++d) {
                for (int64_t j = 0; j <= K; ++j) toks.push_back(int32_t(rng() % uint64_t(V)));
                cu.push_back(int64_t(toks.size()));
              }
              be->sync();
              const auto t0 = Clock::now();
              model->spec_begin(sp, how);
              const DTensor h = model->forward_packed(toks.data(), cu, sp);
              std::vector<int32_t> g(toks.size());
              model->greedy(h, g.data());
              be->sync();
              const auto t1 = Clock::now();
              model->spec_keep(sp, std::vector<int64_t>(size_t(B), K));  // one row undone
              be->sync();
              const auto t2 = Clock::now();
              if (i == 0) continue;
              tv.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
              tr.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
            }
            k[hn + "_verify_ms"] = median(tv);
            k[hn + "_restore_ms"] = median(tr);
            // end to end with oracle drafts (all right: the ceiling at this K)
            ModeParams mp = plain;
            mp.speculative = "oracle";
            mp.oracle = oracle;
            mp.draft_tokens = K;
            mp.spec_restore = how;
            // a speculative run against its plain one, and its rates. The CPU backend's greedy
            // speculative tokens equal plain decoding's exactly (else the bench stops); under bf16
            // the verify forward's kernels round otherwise than the decode step's, so where the
            // dummy weights leave near-ties the tokens may part: the fraction equal is recorded.
            auto record = [&](const std::string& kind, const GenRun& g, const GenRun& ref) {
              DZ_CHECK(g.ids == ref.ids || opt.backend != "cpu", "bench spec: ", kind,
                       " speculative output differs from plain decoding (", base_name(dir), ", B ", B, ", K ", K, ", ",
                       hn, ")");
              const std::string p = hn + "_" + kind + "_";
              k[p + "tokens_equal_plain"] = equal_fraction(g.ids, ref.ids);
              k[p + "tok_s"] = g.decode_s > 0 ? double(g.generated) / g.decode_s : 0.0;
              k[p + "speedup"] = g.decode_s > 0 ? ref.decode_s / g.decode_s : 0.0;
              k[p + "steps"] = g.steps;
              k[p + "acceptance"] = g.drafted ? double(g.accepted) / double(g.drafted) : 0.0;
              k[p + "tokens_per_step"] = g.steps ? double(g.generated) / double(g.steps) : 0.0;
              k[p + "verify_s"] = g.verify_s;
              k[p + "restore_s"] = g.restore_s;
              if (kind == "mtp") k[p + "draft_s"] = g.draft_s;
            };
            // Under bf16 the plain tokens may not be the speculative run's own (near-ties): the
            // oracle then becomes the previous run's output until a run reproduces its drafts (all
            // accepted: the ceiling), in at most 4 runs.
            GenRun og = generate_once(*model, *be, rnd, mp);
            int64_t rounds = 1;
            for (; og.ids != *mp.oracle && rounds < 4; ++rounds) {
              mp.oracle = std::make_shared<std::vector<std::vector<int32_t>>>(og.ids);
              og = generate_once(*model, *be, rnd, mp);
            }
            record("oracle", og, base);
            k[hn + "_oracle_rounds"] = rounds;
            // n-gram drafts on the repetitive documents
            mp.speculative = "ngram";
            mp.oracle = nullptr;
            record("ngram", generate_once(*model, *be, rep, mp), base_rep);
            if (model->has_mtp()) {  // the checkpoint's MTP layer (dummy weights: drafts at chance)
              mp.speculative = "mtp";
              record("mtp", generate_once(*model, *be, rnd, mp), base);
            }
          }
          per_k.push_back(k);
        }
        r["per_draft_tokens"] = per_k;
      } catch (const std::exception& e) {
        r["error"] = std::string(e.what()).substr(0, 300);
      }
      std::printf("%s\n", r.dump().c_str());
      std::fflush(stdout);
      results.push_back(r);
    }
  }
  if (!opt.json.empty()) {
    json j = bench_envelope(*be, opt.backend);
    j["weights"] = opt.dummy_weights ? "dummy (--dummy-weights)" : "checkpoint";
    j["method"] = str("B documents of ", opt.prompt_tokens, " random tokens (n-gram: a 16-token block repeated), ",
                      opt.new_tokens, " generated each through compute_packed (greedy); plain: median of ", opt.repeats,
                      " runs by decode time; step costs: median of ", opt.repeats, " verify forwards of K+1 rows per "
                      "document (snapshot included) and restores keeping K; oracle drafts: the plain run's tokens "
                      "(cuda: then the previous run's until a run reproduces them, *_oracle_rounds; "
                      "*_tokens_equal_plain: the fraction equal to plain decoding's under bf16); models "
                      "declaring an MTP layer: mtp_draft_ms (median of K-draft steps for the B documents) and the "
                      "end-to-end run with its drafts (with --dummy-weights they are at chance: the overhead)");
    j["results"] = results;
    write_bench_report(opt.json, j);
  }
  for (const auto& r : results)
    if (r.contains("error")) return 1;
  return 0;
}

}  // namespace dz
