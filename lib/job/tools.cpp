#include "job/tools.hpp"
#include "job/plan_memory.hpp"

#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <map>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/model_config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/rank_grid.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_io.hpp"
#include "model/model.hpp"

namespace dz {

static bool exists(const std::string& p) {
  struct stat s;
  return ::stat(p.c_str(), &s) == 0;
}

static std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DZ_CHECK(f.good(), "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void make_model(const MakeModelOptions& o) {
  DZ_CHECK(!o.out.empty(), "make-model: --out is required");
  std::string text;
  auto it = presets().find(o.preset);
  if (it != presets().end()) {
    text = it->second;
  } else {
    DZ_CHECK(exists(o.preset), "make-model: '", o.preset, "' is neither a preset (",
             [] {
               std::string s;
               for (auto& kv : presets()) s += (s.empty() ? "" : ", ") + kv.first;
               return s;
             }(),
             ") nor a config.json file");
    text = read_text(o.preset);
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(str("make-model: ", o.preset, ": invalid JSON: ", e.what()));
  }
  DZ_CHECK(o.dtype == "f32" || o.dtype == "bf16", "make-model: --dtype must be f32 or bf16 (got ", o.dtype, ")");
  if (exists(o.out + "/config.json"))
    DZ_CHECK(o.overwrite, "make-model: ", o.out, " already holds a model; pass --overwrite to replace it");
  ModelConfig cfg = ModelConfig::from_json(j);
  cfg.load_mtp = cfg.mtp_layers > 0;  // the MTP layer the config declares is written too (--speculative mtp)
  auto ck = Checkpoint::random(o.seed);
  auto model = Model::build(cfg, *ck);  // asks for every tensor: that is the list we write
  ::mkdir(o.out.c_str(), 0755);
  DZ_CHECK(exists(o.out), "make-model: cannot create directory ", o.out);
  write_safetensors(o.out, ck->generated(), o.dtype == "bf16" ? DType::BF16 : DType::F32,
                    uint64_t(o.shard_mb) << 20);
  {
    std::string tmp = o.out + "/config.json.tmp";
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    DZ_CHECK(f.good(), "make-model: cannot write ", tmp);
    f.close();
    DZ_CHECK(std::rename(tmp.c_str(), (o.out + "/config.json").c_str()) == 0, "make-model: cannot write config.json");
  }
  int64_t params = 0;
  for (auto& kv : ck->generated()) params += kv.second.size();
  log_root(str("make-model: wrote ", o.out, " (", cfg.model_type, ", ", cfg.num_layers, " layers, ", params,
               " parameters, ", ck->generated().size(), " tensors, ", o.dtype, ")"));
}

namespace {

// 'x' for a POSIX shell, whatever x holds.
std::string shell_quote(const std::string& x) {
  std::string q = "'";
  for (char c : x) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// make-input --text: runs the tokenizer helper and reads its JSON lines (a header, then a document a line).
void read_text_documents(const MakeInputOptions& o, std::vector<int32_t>& tokens, std::vector<int64_t>& offsets,
                         std::vector<int64_t>& bytes, std::vector<std::string>& ids,
                         std::map<std::string, std::string>& attrs) {
  const char* env = std::getenv("DAYZERO_TOKENIZE_HELPER");
  const std::string helper = env && *env ? env : std::string(DAYZERO_SCRIPTS_DIR) + "/dz_tokenize.py";
  DZ_CHECK(exists(helper), "make-input --text: the tokenizer helper ", helper, " is missing (DAYZERO_TOKENIZE_HELPER)");
  std::string cmd = "python3 " + shell_quote(helper) + " --tokenizer " + shell_quote(o.tokenizer) + " --text " +
                    shell_quote(o.text) + " --text-key " + shell_quote(o.text_key) + " --id-key " + shell_quote(o.id_key);
  if (o.add_special_tokens) cmd += " --add-special-tokens";
  FILE* p = ::popen(cmd.c_str(), "r");
  DZ_CHECK(p, "make-input --text: cannot run ", helper);
  std::string line;
  int64_t n = 0;
  char buf[1 << 16];
  bool header = false;
  auto take = [&](const std::string& l) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(l);
    } catch (const std::exception& e) {
      fail(str("make-input --text: the tokenizer helper printed a line that is not JSON: ", l.substr(0, 120)));
    }
    if (!header) {
      header = true;
      attrs["tokenizer"] = j.at("tokenizer").get<std::string>();
      attrs["tokenizer_sha256"] = j.at("sha256").get<std::string>();
      attrs["tokenizer_add_special_tokens"] = j.at("add_special_tokens").get<bool>() ? "true" : "false";
      return;
    }
    const std::string id = j.at("id").get<std::string>();
    const auto& v = j.at("ids");
    DZ_CHECK(!v.empty(), "make-input --text: document ", id, " (", o.text, ") has no tokens: remove it or give it text");
    for (const auto& t : v) {
      const int64_t x = t.get<int64_t>();
      DZ_CHECK(x >= 0 && x <= 2147483647LL, "make-input --text: document ", id, ": token id ", x, " out of range");
      tokens.push_back(int32_t(x));
    }
    offsets.push_back(int64_t(tokens.size()));
    bytes.push_back(j.at("bytes").get<int64_t>());
    ids.push_back(id);
    ++n;
  };
  while (std::fgets(buf, sizeof buf, p)) {
    line += buf;
    if (line.empty() || line.back() != '\n') continue;  // a longer line: keep reading
    line.pop_back();
    if (!line.empty()) take(line);
    line.clear();
  }
  if (!line.empty()) take(line);
  const int rc = ::pclose(p);
  DZ_CHECK(rc == 0, "make-input --text: the tokenizer helper failed (", helper, ", ",
           WIFEXITED(rc) ? str("exit status ", WEXITSTATUS(rc)) : str("wait status ", rc), "): its message is above");
  DZ_CHECK(header && n > 0, "make-input --text: ", o.text, " holds no document");
}

}  // namespace

void make_input(const MakeInputOptions& o) {
  DZ_CHECK(!o.out.empty(), "make-input: --out is required");
  if (exists(o.out)) DZ_CHECK(o.overwrite, "make-input: ", o.out, " exists; pass --overwrite to replace it");
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0}, bytes;
  std::vector<std::string> ids;
  std::map<std::string, std::string> attrs;
  DZ_CHECK(o.text.empty() == o.tokenizer.empty(), "make-input: --text and --tokenizer go together");
  DZ_CHECK(o.text.empty() || o.tokens_file.empty(), "make-input: --text or --tokens-file, not both");
  if (!o.text.empty()) {
    read_text_documents(o, tokens, offsets, bytes, ids, attrs);
  } else if (!o.tokens_file.empty()) {
    std::ifstream f(o.tokens_file);
    DZ_CHECK(f.good(), "make-input: cannot read ", o.tokens_file);
    std::string line;
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      std::istringstream ls(line);
      long long v;
      int64_t n = 0;
      while (ls >> v) {
        DZ_CHECK(v >= 0 && v <= 2147483647LL, "make-input: ", o.tokens_file, ":", lineno, ": token id ", v,
                 " out of range");
        tokens.push_back(int32_t(v));
        ++n;
      }
      DZ_CHECK(ls.eof(), "make-input: ", o.tokens_file, ":", lineno, ": not a whitespace-separated list of ids");
      if (n > 0) offsets.push_back(int64_t(tokens.size()));
    }
    DZ_CHECK(offsets.size() > 1, "make-input: ", o.tokens_file, " holds no document");
  } else {
    int64_t vocab = o.vocab;
    if (!o.model.empty()) vocab = ModelConfig::from_file(o.model + "/config.json").vocab_size;
    DZ_CHECK(vocab > 0, "make-input: give --vocab or --model");
    DZ_CHECK(o.docs >= 1, "make-input: --docs must be >= 1");
    DZ_CHECK(o.min_len >= 1 && o.max_len >= o.min_len, "make-input: need 1 <= --min-len <= --max-len");
    std::mt19937_64 rng(o.seed);
    for (int64_t d = 0; d < o.docs; ++d) {
      int64_t L = o.min_len + int64_t(rng() % uint64_t(o.max_len - o.min_len + 1));
      for (int64_t t = 0; t < L; ++t) tokens.push_back(int32_t(rng() % uint64_t(vocab)));
      offsets.push_back(int64_t(tokens.size()));
    }
  }
  std::vector<int64_t> score_from;
  DZ_CHECK(o.score_last >= 0, "make-input: --score-last must be >= 0 (got ", o.score_last, ")");
  if (o.score_last > 0)  // each document's last N tokens count (its whole length when shorter)
    for (size_t d = 0; d + 1 < offsets.size(); ++d)
      score_from.push_back(std::max<int64_t>(1, offsets[d + 1] - offsets[d] - o.score_last));
  if (!o.model.empty() && !o.text.empty()) {  // ids the model cannot embed: refused here, naming the document
    const int64_t V = ModelConfig::from_file(o.model + "/config.json").vocab_size;
    for (size_t d = 0; d + 1 < offsets.size(); ++d)
      for (int64_t t = offsets[d]; t < offsets[d + 1]; ++t)
        DZ_CHECK(tokens[size_t(t)] < V, "make-input: document ", ids[d], ": token id ", tokens[size_t(t)],
                 " >= the vocabulary of ", o.model, " (", V, "): is ", o.tokenizer, " this model's tokenizer?");
  }
  write_input_file(o.out, tokens, offsets, score_from, bytes, ids, attrs);
  log_root(str("make-input: wrote ", o.out, " (", offsets.size() - 1, " documents, ", tokens.size(), " tokens",
               o.text.empty() ? "" : str(", tokenized by ", attrs["tokenizer"], " (sha256 ", attrs["tokenizer_sha256"].substr(0, 12), "...)"),
               o.score_last > 0 ? str(", /score_from: the last ", o.score_last, " of each") : "", ")"));
}

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json corpus_json(const ScoreTable& t) {
  return {{"documents", t.rows.size()}, {"scored_tokens", t.scored},
          {"nll", t.nll},               {"perplexity", finite_or_null(t.perplexity())},
          {"bytes", t.bytes},           {"bits_per_byte", finite_or_null(t.bits_per_byte())}};
}

int summarize(const std::string& path, bool json) {
  const ScoreTable t = read_scores(path);
  if (json) {
    nlohmann::json j, docs = nlohmann::json::array();
    j["file"] = t.file;
    j["complete"] = t.complete;
    j["documents_total"] = t.n_docs;
    j["documents_done"] = t.rows.size();
    for (const auto& r : t.rows)
      docs.push_back({{"doc", r.doc}, {"tokens", r.tokens}, {"score_from", r.score_from}, {"scored", r.scored},
                      {"nll", r.nll}, {"perplexity", finite_or_null(r.perplexity)}, {"is_greedy", r.is_greedy},
                      {"bytes", r.bytes}});
    j["per_document"] = docs;
    j["corpus"] = corpus_json(t);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: %zu of %lld documents done%s\n", t.file.c_str(), t.rows.size(), (long long)t.n_docs,
              t.complete ? " (complete)" : " (partial: a resumable run)");
  std::printf("%8s %10s %10s %10s %14s %12s %7s\n", "doc", "tokens", "from", "scored", "nll", "perplexity", "greedy");
  for (const auto& r : t.rows)
    std::printf("%8lld %10lld %10lld %10lld %14.6f %12.6g %7s\n", (long long)r.doc, (long long)r.tokens,
                (long long)r.score_from, (long long)r.scored, r.nll, r.perplexity, r.is_greedy ? "yes" : "no");
  std::printf("corpus: %lld tokens scored, nll %.6f, perplexity %.6g", (long long)t.scored, t.nll, t.perplexity());
  if (t.bytes >= 0)
    std::printf(", %lld bytes, %.6f bits per byte\n", (long long)t.bytes, t.bits_per_byte());
  else
    std::printf(" (no byte counts in the input: no bits per byte)\n");
  return 0;
}

}  // namespace dz

#include "model/work_model.hpp"

namespace dz {

int plan(const std::string& model, int64_t length, int cp, int segments, bool as_json, const PlanMemoryOptions& mo) {
  DZ_CHECK(length >= 1, "plan: --length must be >= 1");
  DZ_CHECK(cp >= 1 && segments >= 1, "plan: --cp and --segments must be >= 1");
  ModelConfig cfg;
  auto it = presets().find(model);
  if (it != presets().end())
    cfg = ModelConfig::from_json(nlohmann::json::parse(it->second));
  else
    cfg = ModelConfig::from_file(model + "/config.json");
  nlohmann::json out;
  out["model"] = model;
  out["length"] = length;
  out["cp"] = cp;
  out["segments"] = segments;
  for (const char* kind : {"zigzag", "contiguous"}) {
    nlohmann::json ranks = nlohmann::json::array();
    double mx = 0, sum = 0;
    for (int r = 0; r < cp; ++r) {
      SeqLayout lay = std::string(kind) == "zigzag" ? SeqLayout::zigzag(length, cp, r, segments)
                                                    : SeqLayout::contiguous(length, cp, r);
      auto w = WorkModel::document(cfg, lay, r);
      ranks.push_back({{"rank", r}, {"tokens", lay.local_rows()}, {"flops", w}});
      mx = std::max(mx, w["total"]);
      sum += w["total"];
    }
    out[kind] = {{"per_rank", ranks}, {"max_over_mean", mx / (sum / cp)}};
  }
  // Memory per rank (every CP rank keeps the whole document's state; TP splits weights and heads).
  MemoryQuery q;
  q.tp = mo.tp;
  RankGrid::check_ep(cp, mo.tp, mo.ep);
  DZ_CHECK(mo.ep == 1 || cfg.n_routed_experts % mo.ep == 0, "--ep ", mo.ep, " does not divide the ",
           cfg.n_routed_experts, " routed experts");
  q.ep = mo.ep;
  q.doc_tokens = length;
  const int64_t local = (length + cp - 1) / cp;
  // With --max-batch-tokens (serial prefill) a forward holds up to that many rows: chunks of a longer
  // document, or documents of this length packed together (their states alive at once).
  q.forward_tokens = mo.max_batch_tokens > 0 && cp == 1 ? mo.max_batch_tokens : local;
  q.docs = mo.max_batch_tokens > length && cp == 1 ? mo.max_batch_tokens / length : 1;
  q.cuda = mo.backend == "cuda";
  q.kv_fp8 = mo.kv_fp8;
  if (it == presets().end()) q.fp8_block = fp8_block_weights(model);
  const MemoryPlan mp = plan_memory(cfg, q);
  const double gib = double(int64_t(1) << 30);
  out["memory"] = {{"tp", mo.tp},
                   {"ep", mo.ep},
                   {"backend", mo.backend},
                   {"forward_tokens", q.forward_tokens},
                   {"weights_gib", mp.weights / gib},
                   {"state_gib", mp.state / gib},
                   {"activations_gib", mp.activations / gib},
                   {"workspace_gib", mp.workspace / gib},
                   {"fp8_block_weights", q.fp8_block.size()},
                   {"fp8_weights_kept", mp.fp8_weights},
                   {"total_gib", mp.total() / gib},
                   {"device_gib", mo.device_gib},
                   {"fits", mp.total() <= mo.device_gib * gib}};
  for (const auto& [k, v] : mp.detail) out["memory"]["detail_gib"][k] = v / gib;
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return mp.total() <= mo.device_gib * gib ? 0 : 3;
  }
  std::printf("%s, one document of %lld tokens over %d CP ranks (GFLOP per rank)\n", model.c_str(), (long long)length,
              cp);
  for (const char* kind : {"zigzag", "contiguous"}) {
    std::printf("%-10s %5s %10s %10s %10s %12s %10s\n", kind, "rank", "tokens", "indexer", "attention",
                "linear-attn", "total");
    for (auto& r : out[kind]["per_rank"])
      std::printf("%-10s %5d %10lld %10.2f %10.2f %12.2f %10.2f\n", "", r["rank"].get<int>(),
                  (long long)r["tokens"].get<int64_t>(), r["flops"]["indexer"].get<double>() / 1e9,
                  r["flops"]["attention"].get<double>() / 1e9, r["flops"]["linear_attention"].get<double>() / 1e9,
                  r["flops"]["total"].get<double>() / 1e9);
    std::printf("%-10s max/mean %.4f\n", "", out[kind]["max_over_mean"].get<double>());
  }
  const bool fits = mp.total() <= mo.device_gib * gib;
  std::printf("memory per rank (--tp %d --ep %d, %s, %lld tokens per forward): weights %.2f GiB, state %.2f GiB, "
              "activations %.2f GiB, workspace %.2f GiB = %.2f GiB of %.0f GiB: %s\n",
              mo.tp, mo.ep, mo.backend.c_str(), (long long)q.forward_tokens, mp.weights / gib, mp.state / gib,
              mp.activations / gib, mp.workspace / gib, mp.total() / gib, mo.device_gib,
              fits ? "fits" : "DOES NOT FIT (raise --tp, lower --max-batch-tokens, or add --cp)");
  if (mp.fp8_weights > 0)
    std::printf("weights: %lld of the checkpoint's %zu FP8 block-scaled tensors counted in FP8 (the dense linear "
                "ones; stacked experts go up in BF16)\n",
                (long long)mp.fp8_weights, q.fp8_block.size());
  return fits ? 0 : 3;
}

}  // namespace dz
