#include "job/run.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <list>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/comm.hpp"
#include "dist/rank_grid.hpp"
#include "io/hdf5_io.hpp"
#include "job/doc_compute.hpp"
#include "job/fingerprint.hpp"
#include "model/model.hpp"

namespace dz {

namespace {

constexpr int kTagResult = 7101;

using Clock = std::chrono::steady_clock;

// Runs `step` on every rank; if it throws on any rank, every rank throws PreflightError carrying
// the message of the lowest failing rank (so one clear line is printed, no rank is left waiting).
template <class F>
void agree(const Comm& world, F&& step) {
  std::string err;
  try {
    step();
  } catch (const Error& e) {
    err = e.what();
  } catch (const std::exception& e) {
    err = e.what();
  }
  int bad = world.first_set(!err.empty());
  if (bad >= 0) {
    world.bcast_string(err, bad);
    throw PreflightError{err};
  }
}

std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--:--";
  long t = long(s + 0.5);
  char b[32];
  std::snprintf(b, sizeof b, "%02ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  return b;
}

// Rank 0's side: writes results (its own and received ones) and prints progress.
struct Writer {
  OutputFile* out = nullptr;
  OutputMode mode = OutputMode::Logprobs;
  int64_t expected = 0, received = 0;
  int64_t tokens_done = 0, tokens_total = 0;
  Clock::time_point start = Clock::now(), last_progress = Clock::now();
  double progress_seconds = 30;
  int64_t kill_after = 0;  // DAYZERO_FAULT_KILL_AFTER_DOCS
  std::vector<DocResult> summary;  // stats only (values dropped), for the report

  void write(DocResult& r) {
    switch (mode) {
      case OutputMode::Logprobs: out->write_logprobs(r.doc, r.values, r.stats); break;
      case OutputMode::TopK: out->write_topk(r.doc, r.ids, r.values, r.stats); break;
      case OutputMode::LastLogits: out->write_last_logits(r.doc, r.values, r.stats); break;
      case OutputMode::Generate: out->write_generated(r.doc, r.ids, r.stats); break;
    }
    ++received;
    tokens_done += r.stats.tokens;
    // Fault injection for the crash/resume tests: a real SIGKILL of the writer mid-run.
    if (kill_after > 0 && received == kill_after) ::raise(SIGKILL);
    r.ids.clear();
    r.values.clear();
    summary.push_back(std::move(r));
    progress(false);
  }

  void progress(bool force) {
    auto now = Clock::now();
    if (!force && std::chrono::duration<double>(now - last_progress).count() < progress_seconds) return;
    last_progress = now;
    double el = std::chrono::duration<double>(now - start).count();
    double rate = el > 0 ? double(tokens_done) / el : 0;
    double eta = rate > 0 ? double(tokens_total - tokens_done) / rate : -1;
    log_root(str("progress: ", received, "/", expected, " documents, ", tokens_done, "/", tokens_total,
                 " tokens, ", int64_t(rate), " tok/s, elapsed ", fmt_duration(el), ", ETA ", fmt_duration(eta)));
  }

  // Receives whatever results have arrived, without blocking.
  void drain(const Comm& world) {
    for (;;) {
      int flag = 0;
      MPI_Status s;
      MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kTagResult, world.raw(), &flag, &s));
      if (!flag) return;
      receive_one(world, s);
    }
  }
  void receive_one(const Comm& world, MPI_Status s) {
    int n = 0;
    MPI_CHECK(MPI_Get_count(&s, MPI_BYTE, &n));
    std::vector<char> buf(static_cast<size_t>(n));
    MPI_CHECK(MPI_Recv(buf.data(), n, MPI_BYTE, s.MPI_SOURCE, kTagResult, world.raw(), MPI_STATUS_IGNORE));
    DocResult r = unpack(buf);
    write(r);
  }
  void wait_all(const Comm& world) {
    while (received < expected) {
      MPI_Status s;
      MPI_CHECK(MPI_Probe(MPI_ANY_SOURCE, kTagResult, world.raw(), &s));
      receive_one(world, s);
    }
  }
};

// Other ranks' side: non-blocking sends whose buffers live until completion.
struct Sender {
  std::list<std::pair<MPI_Request, std::vector<char>>> inflight;
  void send(const Comm& world, const DocResult& r) {
    inflight.emplace_back(MPI_REQUEST_NULL, pack(r));
    auto& e = inflight.back();
    MPI_CHECK(MPI_Isend(e.second.data(), int(e.second.size()), MPI_BYTE, 0, kTagResult, world.raw(), &e.first));
    reap();
  }
  void reap() {
    for (auto it = inflight.begin(); it != inflight.end();) {
      int done = 0;
      MPI_CHECK(MPI_Test(&it->first, &done, MPI_STATUS_IGNORE));
      it = done ? inflight.erase(it) : std::next(it);
    }
  }
  void wait_all() {
    for (auto& e : inflight) MPI_CHECK(MPI_Wait(&e.first, MPI_STATUS_IGNORE));
    inflight.clear();
  }
};

}  // namespace

int run_job(const RunOptions& opt) {
  Comm world = Comm::world();
  const auto t_start = Clock::now();

  // ---- everything that can be wrong is found here, before any work ----
  RankGrid grid;
  ModeParams mp;
  agree(world, [&] {
    grid = RankGrid::make(world.size(), world.rank(), opt.cp, opt.tp);
    DZ_CHECK(opt.cp == 1 && opt.tp == 1, "--cp ", opt.cp, " --tp ", opt.tp,
             ": context and tensor parallelism are not available in this version; use --cp 1 --tp 1");
    DZ_CHECK(opt.backend == "cpu", "--backend ", opt.backend,
             ": only the cpu backend runs models in this version (the CUDA kernels are not wired into the job yet)");
    DZ_CHECK(opt.kv_cache == "bf16", "--kv-cache ", opt.kv_cache, ": only bf16 is available in this version");
    DZ_CHECK(opt.index_quant == "none", "--index-quant ", opt.index_quant, ": only none is available in this version");
    mp.mode = parse_output_mode(opt.mode);
    mp.topk = opt.topk;
    mp.max_new_tokens = opt.max_new_tokens;
    mp.temperature = opt.temperature;
    mp.seed = opt.seed;
    DZ_CHECK(mp.mode != OutputMode::TopK || opt.topk >= 1, "--topk must be >= 1 (got ", opt.topk, ")");
    DZ_CHECK(mp.mode != OutputMode::Generate || opt.max_new_tokens >= 1, "--max-new-tokens must be >= 1 (got ",
             opt.max_new_tokens, ")");
    DZ_CHECK(opt.temperature >= 0, "--temperature must be >= 0 (got ", opt.temperature, ")");
    DZ_CHECK(!opt.output.empty(), "--output is required");
  });

  std::unique_ptr<Model> model;
  agree(world, [&] { model = Model::load(opt.model); });
  const ModelConfig& cfg = model->config();

  std::unique_ptr<InputFile> input;
  std::unique_ptr<OutputFile> output;
  std::vector<uint8_t> done;
  agree(world, [&] {
    input = std::make_unique<InputFile>(opt.input);
    if (world.rank() != 0) return;
    input->validate(cfg.vocab_size);
    DZ_CHECK(mp.mode != OutputMode::TopK || opt.topk <= cfg.vocab_size, "--topk ", opt.topk,
             " is larger than the vocabulary (", cfg.vocab_size, ")");
    OutputSpec spec;
    spec.mode = mp.mode;
    spec.topk = mp.mode == OutputMode::TopK ? opt.topk : 0;
    spec.max_new_tokens = mp.mode == OutputMode::Generate ? opt.max_new_tokens : 0;
    spec.vocab = cfg.vocab_size;
    for (int64_t i = 0; i < input->n_docs(); ++i) spec.doc_lengths.push_back(input->doc_length(i));
    spec.identity["model_fingerprint"] = model_fingerprint(opt.model);
    spec.identity["model_type"] = cfg.model_type;
    spec.identity["input_fingerprint"] = input_fingerprint(*input);
    spec.identity["mode"] = to_string(mp.mode);
    spec.identity["topk"] = std::to_string(spec.topk);
    spec.identity["max_new_tokens"] = std::to_string(spec.max_new_tokens);
    spec.identity["temperature"] = str(opt.temperature);
    spec.identity["seed"] = std::to_string(opt.seed);
    spec.identity["backend"] = opt.backend;
    spec.identity["kv_cache"] = opt.kv_cache;
    spec.identity["index_quant"] = opt.index_quant;
    spec.info["dayzero_version"] = DAYZERO_VERSION;
    spec.info["model"] = opt.model;
    spec.info["input"] = opt.input;
    spec.info["precision"] = "fp32 (cpu reference)";
    spec.info["world_size"] = std::to_string(world.size());
    output = opt.resume ? OutputFile::resume(opt.output, spec) : OutputFile::create(opt.output, spec, opt.overwrite);
    done = output->done();
  });
  world.bcast_vec(done, 0);
  const int64_t n_docs = input->n_docs();

  // ---- the work list: documents not yet done, longest first (ties by index) ----
  std::vector<int64_t> todo;
  int64_t todo_tokens = 0;
  for (int64_t i = 0; i < n_docs; ++i)
    if (!done[size_t(i)]) {
      todo.push_back(i);
      todo_tokens += input->doc_length(i);
    }
  std::stable_sort(todo.begin(), todo.end(),
                   [&](int64_t a, int64_t b) { return input->doc_length(a) > input->doc_length(b); });
  if (world.rank() == 0) {
    log_root(str("model ", opt.model, " (", cfg.model_type, ", ", cfg.num_layers, " layers), ", n_docs,
                 " documents, ", input->n_tokens(), " tokens; ", todo.size(), " to do",
                 opt.resume ? str(" (", n_docs - int64_t(todo.size()), " already done)") : std::string(), "; ",
                 world.size(), " ranks (dp ", grid.dp, " x cp ", grid.cp, " x tp ", grid.tp, "), mode ", opt.mode));
  }

  Writer writer;
  Sender sender;
  if (world.rank() == 0) {
    writer.out = output.get();
    writer.mode = mp.mode;
    writer.expected = int64_t(todo.size());
    writer.tokens_total = todo_tokens;
    writer.progress_seconds = opt.progress_seconds;
    if (const char* k = std::getenv("DAYZERO_FAULT_KILL_AFTER_DOCS")) writer.kill_after = std::atoll(k);
  }
  // Between layers: rank 0 keeps receiving and writing; the others complete their sends.
  auto tick = [&] {
    if (world.rank() == 0)
      writer.drain(world);
    else
      sender.reap();
  };

  try {
    SharedCounter next(world);
    for (;;) {
      int64_t k = next.fetch_add(1);
      if (k >= int64_t(todo.size())) break;
      const int64_t d = todo[size_t(k)];
      std::vector<int32_t> tokens = input->read_doc(d);
      DocResult r = compute_document(*model, d, tokens, mp, tick);
      r.stats.rank = world.rank();
      if (world.rank() == 0) {
        writer.write(r);
        writer.drain(world);
      } else {
        sender.send(world, r);
      }
    }
    if (world.rank() == 0) {
      writer.wait_all(world);
      writer.progress(true);
      output->finalize();
    } else {
      sender.wait_all();
    }
  } catch (const Error& e) {
    abort_all(e.what());
  }
  world.barrier();

  if (world.rank() == 0) {
    double secs = std::chrono::duration<double>(Clock::now() - t_start).count();
    int64_t toks = 0;
    for (auto& r : writer.summary) toks += r.stats.tokens;
    log_root(str("done: ", writer.summary.size(), " documents, ", toks, " tokens in ", secs, " s -> ", opt.output));
    if (!opt.report.empty()) {
      nlohmann::json j;
      j["dayzero_version"] = DAYZERO_VERSION;
      j["model"] = opt.model;
      j["model_type"] = cfg.model_type;
      j["input"] = opt.input;
      j["output"] = opt.output;
      j["mode"] = opt.mode;
      j["backend"] = opt.backend;
      j["world_size"] = world.size();
      j["dp"] = grid.dp;
      j["cp"] = grid.cp;
      j["tp"] = grid.tp;
      j["documents_total"] = n_docs;
      j["documents"] = writer.summary.size();
      j["documents_skipped_done"] = n_docs - int64_t(todo.size());
      j["tokens"] = toks;
      j["seconds"] = secs;
      j["tokens_per_s"] = secs > 0 ? double(toks) / secs : 0.0;
      nlohmann::json per = nlohmann::json::array();
      std::vector<DocResult*> by_doc;
      for (auto& r : writer.summary) by_doc.push_back(&r);
      std::sort(by_doc.begin(), by_doc.end(), [](auto* a, auto* b) { return a->doc < b->doc; });
      for (auto* r : by_doc)
        per.push_back({{"doc", r->doc}, {"tokens", r->stats.tokens}, {"seconds", r->stats.seconds},
                       {"rank", r->stats.rank}});
      j["per_document"] = per;
      std::string tmp = opt.report + ".tmp";
      {
        std::ofstream f(tmp);
        DZ_CHECK(f.good(), "cannot write report ", opt.report);
        f << j.dump(2) << "\n";
      }
      DZ_CHECK(std::rename(tmp.c_str(), opt.report.c_str()) == 0, "cannot write report ", opt.report);
    }
  }
  return 0;
}

}  // namespace dz
