#include "job/bench_e2e.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "io/checkpoint.hpp"
#include "job/bench_report.hpp"
#include "job/doc_compute.hpp"
#include "job/plan_memory.hpp"
#include "model/model.hpp"

namespace dz {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kPeakBf16 = 989e12;  // H200 dense bf16 tensor-core peak (the anchor's MFU basis)

// The anchor's parameter counts (shared/anchors/e2e_transformers.py active_params): every
// tensor, less embedding and LM head, less the routed experts' inactive share.
struct ParamCount {
  double total = 0, active_nonembed = 0;
};
ParamCount count_params(const Checkpoint& ck, const ModelConfig& cfg) {
  double tot = 0, emb = 0, exp = 0;
  for (const auto& n : ck.names()) {
    const double k = double(numel(ck.info(n).shape));
    tot += k;
    if (n.find("embed_tokens") != std::string::npos || n.find("lm_head") != std::string::npos)
      emb += k;
    else if (n.find(".experts.") != std::string::npos && n.find("shared") == std::string::npos)
      exp += k;
  }
  ParamCount p;
  p.total = tot;
  const double E = double(std::max<int64_t>(cfg.n_routed_experts, 1));
  p.active_nonembed = tot - emb - exp * (1.0 - double(cfg.num_experts_per_tok) / E);
  return p;
}

// Causal attention FLOPs of one document (DESIGN §7): T^2 * H * (d_qk + d_v) per full-attention
// layer (QK^T and PV, 2 FLOPs per MAC, half the square); the DSA layers attend index_topk keys.
double attention_flops(const ModelConfig& cfg, int64_t T) {
  double f = 0;
  for (const auto& ls : cfg.layers) {
    if (ls.mixer == MixerKind::MLA) {
      const double dqk = double(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), dv = double(cfg.v_head_dim);
      const double keys = ls.has_indexer ? double(std::min<int64_t>(cfg.index_topk, T)) * double(T)
                                         : double(T) * double(T) / 2.0;
      f += 2.0 * keys * double(cfg.num_heads) * (dqk + dv);
    } else if (ls.mixer == MixerKind::GQA) {
      f += 2.0 * double(T) * double(T) / 2.0 * double(cfg.num_heads) * 2.0 * double(cfg.head_dim);
    }
  }
  return f;
}

std::string basename_of(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const size_t s = d.find_last_of('/');
  return s == std::string::npos ? d : d.substr(s + 1);
}

}  // namespace

int bench_e2e(const BenchE2eOptions& opt) {
  DZ_CHECK(!opt.models.empty(), "bench e2e: --model is required");
  DZ_CHECK(opt.repeats >= 1, "bench e2e: --repeats must be >= 1");
  DZ_CHECK(opt.backend == "cpu" || opt.backend == "cuda", "bench e2e: --backend must be cpu or cuda");
  for (int64_t T : opt.tokens) DZ_CHECK(T >= 2, "bench e2e: --tokens must be >= 2 (got ", T, ")");
  DZ_CHECK(opt.batch >= 1, "bench e2e: --batch must be >= 1 (got ", opt.batch, ")");
  std::vector<OutputMode> modes;
  for (const auto& m : opt.modes) modes.push_back(parse_output_mode(m));
  std::unique_ptr<Backend> own;
  Backend* be = &cpu_backend();
  if (opt.backend == "cuda") {
    DZ_CHECK(cuda_device_count() > 0, "bench e2e --backend cuda: no usable GPU");
    own = make_cuda_backend(0);
    be = own.get();
  }
  json results = json::array();
  for (const auto& dir : opt.models) {
    ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
    const auto t0 = Clock::now();
    std::unique_ptr<Checkpoint> ck = opt.dummy_weights ? Checkpoint::dummy(0) : Checkpoint::open(dir);
    std::unique_ptr<Model> model = Model::build(cfg, *ck, TpShard{}, *be);
    if (!opt.dummy_weights) {
      skip_mtp_layers(cfg, *ck);
      ck->check_all_used();
    }
    be->sync();
    const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const ParamCount pc = count_params(*ck, cfg);
    const int64_t weight_bytes = be->memory_in_use_bytes();
    ck.reset();
    log_root(str("bench e2e: ", basename_of(dir), " loaded in ", load_s, " s (", pc.total / 1e9, " B params, ",
                 weight_bytes / double(1 << 30), " GiB on ", be->describe(), ")"));
    for (int64_t T : opt.tokens) {
      // --batch random documents (fixed seeds; the first is the one-document run's), token ids
      // below the vocabulary.
      const int64_t NB = opt.batch;
      std::vector<std::vector<int32_t>> docs_tokens(static_cast<size_t>(NB));
      std::vector<int64_t> doc_ids(static_cast<size_t>(NB));
      for (int64_t d = 0; d < NB; ++d) {
        doc_ids[size_t(d)] = d;
        std::vector<int32_t>& tokens = docs_tokens[size_t(d)];
        tokens.resize(static_cast<size_t>(T));
        uint64_t x = 0x2545F4914F6CDD1Dull ^ uint64_t(T) ^ (uint64_t(d) << 40);
        for (auto& t : tokens) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          t = int32_t(x % uint64_t(cfg.vocab_size));
        }
      }
      const std::vector<int32_t>& tokens = docs_tokens[0];
      MemoryQuery q;  // what `dayzero plan` predicts for these runs (held to the measurements)
      q.doc_tokens = T;
      q.docs = NB;
      q.forward_tokens = NB > 1 ? NB * T : opt.max_batch_tokens > 0 ? std::min(T, opt.max_batch_tokens) : T;
      q.cuda = opt.backend == "cuda";
      const MemoryPlan mpl = plan_memory(cfg, q);
      for (OutputMode mode : modes) {
        ModeParams mp;
        mp.mode = mode;
        mp.chunk_tokens = opt.max_batch_tokens;
        mp.max_new_tokens = opt.new_tokens;
        mp.decode_graphs = !opt.eager_decode;
        json r;
        r["model"] = basename_of(dir);
        r["layers"] = cfg.num_layers;
        r["T"] = T;
        r["mode"] = to_string(mode);
        r["max_batch_tokens"] = opt.max_batch_tokens;
        r["batch"] = NB;
        try {
          be->reset_peak_memory();
          std::vector<double> ms, decode_ms;  // decode: per generated token after the first
          for (int rep = 0; rep <= opt.repeats; ++rep) {  // rep 0: warm-up
            WorkStats ws;
            ws.device = be;
            DocParallel par;  // stage timers (which sync the device) only where decode is timed
            if (mode == OutputMode::Generate) par.stats = &ws;
            be->sync();
            const bool prof = rep == opt.repeats;  // the last timed run (ncu --profile-from-start off)
            if (prof) be->profile(true);
            const auto ts = Clock::now();
            // One document: the job's per-document path; several: one packed forward of all of
            // them (as `run --max-batch-tokens` packs them), decoded together in generate mode.
            DocResult res = NB == 1 ? compute_document(*model, 0, tokens, mp, {}, par)
                                    : compute_packed(*model, doc_ids, docs_tokens, mp, {}, par.stats)[0];
            be->sync();
            const double el = std::chrono::duration<double, std::milli>(Clock::now() - ts).count();
            if (prof) be->profile(false);
            if (rep == 0) continue;
            ms.push_back(el);
            const int64_t steps = int64_t(res.ids.size()) - 1;  // forwards of one token each
            if (mode == OutputMode::Generate && steps > 0) decode_ms.push_back(ws.seconds["decode"] * 1e3 / double(steps));
          }
          std::sort(ms.begin(), ms.end());
          const double med = ms[ms.size() / 2];
          if (!decode_ms.empty()) {
            std::sort(decode_ms.begin(), decode_ms.end());
            r["new_tokens"] = opt.new_tokens;
            r["decode_ms_per_token"] = decode_ms[decode_ms.size() / 2];  // per step (NB tokens)
            r["decode_tok_s"] = double(NB) / decode_ms[decode_ms.size() / 2] * 1e3;
            r["decode_graphs"] = mp.decode_graphs && be->supports_graphs();
          }
          const double dense = 2.0 * pc.active_nonembed * double(NB * T), attn = double(NB) * attention_flops(cfg, T);
          r["ms"] = med;
          r["ms_all"] = ms;
          r["tok_s"] = double(NB * T) / med * 1e3;
          r["mfu_dense"] = dense / (med * 1e-3) / kPeakBf16;
          r["mfu_with_attention"] = (dense + attn) / (med * 1e-3) / kPeakBf16;
          r["params"] = pc.total;
          r["active_nonembed"] = pc.active_nonembed;
          r["weight_gib"] = weight_bytes / double(1 << 30);
          r["peak_gib"] = be->peak_memory_bytes() / double(1 << 30);
          r["plan_weight_gib"] = mpl.weights / double(1 << 30);
          r["plan_peak_gib"] = mpl.total() / double(1 << 30);
          r["load_s"] = load_s;
        } catch (const std::exception& e) {
          r["error"] = std::string(e.what()).substr(0, 300);
        }
        std::printf("%s\n", r.dump().c_str());
        std::fflush(stdout);
        results.push_back(r);
      }
    }
  }
  if (!opt.json.empty()) {
    json j = bench_envelope(*be, opt.backend);
    j["weights"] = opt.dummy_weights ? str("dummy ", to_string(be->weight_dtype()),
                                           be->mxfp4_weights_kept() ? " (routed experts MXFP4 where declared)" : "",
                                           " (--dummy-weights)")
                                     : std::string("checkpoint");
    j["method"] = str("one random document per T, compute_document (the job's path), median of ", opt.repeats,
                      " after one warm-up; mfu_dense = 2 x active non-embedding params x T / 989 TFLOP/s");
    j["results"] = results;
    write_bench_report(opt.json, j);
  }
  for (const auto& r : results)
    if (r.contains("error")) return 1;
  return 0;
}

}  // namespace dz
