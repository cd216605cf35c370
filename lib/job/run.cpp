#include "job/run.hpp"
#include "job/tools.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <map>

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
constexpr int kTagBye = 7102;  // a DP group root leaves the work loop: [results it sent]

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

// Runs `step` on every rank; if it throws on any rank, every rank throws PreflightError carrying
// the message of the lowest failing rank (so one clear line is printed, no rank is left waiting).
template <class F>
void agree(const Comm& world, F&& step) {
  std::string err;
  try {
    step();
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

// World rank 0's side: writes results (its own group's and received ones), prints progress.
struct Writer {
  OutputFile* out = nullptr;
  OutputMode mode = OutputMode::Logprobs;
  int64_t expected = 0, received = 0;
  int64_t tokens_done = 0, tokens_total = 0;
  Clock::time_point start = Clock::now(), last_progress = Clock::now();
  double progress_seconds = 30;
  int64_t kill_after = 0;  // DAYZERO_FAULT_KILL_AFTER_DOCS
  const std::vector<int64_t>* bytes = nullptr;  // the input's /bytes (logprobs: bits per byte), or empty
  std::vector<DocResult> summary;  // stats only (values dropped), for the report
  std::map<int, int64_t> from;     // results received per source rank
  std::map<int, int64_t> bye;      // source rank -> results it says it sent

  void write(DocResult& r) {
    if (mode == OutputMode::Logprobs && bytes && !bytes->empty()) r.stats.bytes = (*bytes)[size_t(r.doc)];
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

  void receive_one(const Comm& world, MPI_Status s) {
    int n = 0;
    MPI_CHECK(MPI_Get_count(&s, MPI_BYTE, &n));
    std::vector<char> buf(static_cast<size_t>(n));
    MPI_CHECK(MPI_Recv(buf.data(), n, MPI_BYTE, s.MPI_SOURCE, s.MPI_TAG, world.raw(), MPI_STATUS_IGNORE));
    if (s.MPI_TAG == kTagBye) {
      int64_t sent = 0;
      std::memcpy(&sent, buf.data(), sizeof sent);
      bye[s.MPI_SOURCE] = sent;
      return;
    }
    DocResult r = unpack(buf);
    from[s.MPI_SOURCE]++;
    write(r);
  }
  // Receives whatever has arrived, without blocking.
  void drain(const Comm& world) {
    for (;;) {
      int flag = 0;
      MPI_Status s;
      MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world.raw(), &flag, &s));
      if (!flag) return;
      receive_one(world, s);
    }
  }
  bool all_in(int n_other_roots) const {
    if (int(bye.size()) < n_other_roots) return false;
    for (auto& kv : bye) {
      auto it = from.find(kv.first);
      if ((it == from.end() ? 0 : it->second) < kv.second) return false;
    }
    return true;
  }
  // Polls until every other DP root has said goodbye and all its results are in. Returns false
  // when a stop signal has been pending for longer than `grace` seconds first.
  bool wait_all(const Comm& world, int n_other_roots, double grace) {
    Clock::time_point seen{};
    for (;;) {
      drain(world);
      if (all_in(n_other_roots)) return true;
      if (g_signal) {
        if (seen == Clock::time_point{}) seen = Clock::now();
        if (std::chrono::duration<double>(Clock::now() - seen).count() > grace) return false;
      }
      ::usleep(2000);
    }
  }
};

// Other DP group roots: non-blocking sends whose buffers live until completion.
struct Sender {
  std::list<std::pair<MPI_Request, std::vector<char>>> inflight;
  int64_t sent = 0;
  void post(const Comm& world, std::vector<char> buf, int tag) {
    inflight.emplace_back(MPI_REQUEST_NULL, std::move(buf));
    auto& e = inflight.back();
    MPI_CHECK(MPI_Isend(e.second.data(), int(e.second.size()), MPI_BYTE, 0, tag, world.raw(), &e.first));
    reap();
  }
  void send(const Comm& world, const DocResult& r) {
    post(world, pack(r), kTagResult);
    ++sent;
  }
  void goodbye(const Comm& world) {
    std::vector<char> b(sizeof(int64_t));
    std::memcpy(b.data(), &sent, sizeof sent);
    post(world, std::move(b), kTagBye);
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
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);

  // ---- everything that can be wrong is found here, before any work ----
  RankGrid grid;
  ModeParams mp;
  agree(world, [&] {
    grid = RankGrid::make(world.size(), world.rank(), opt.cp, opt.tp);
    RankGrid::check_ep(opt.cp, opt.tp, opt.ep);
    DZ_CHECK(opt.segments >= 1, "--segments must be >= 1 (got ", opt.segments, ")");
    DZ_CHECK(opt.backend == "cpu" || opt.backend == "cuda", "--backend must be cpu or cuda (got ", opt.backend, ")");
    DZ_CHECK(opt.kv_cache == "bf16" || opt.kv_cache == "fp8", "--kv-cache must be bf16 or fp8 (got ", opt.kv_cache,
             ")");
    DZ_CHECK(opt.index_quant == "none" || opt.index_quant == "mxfp8", "--index-quant must be none or mxfp8 (got ",
             opt.index_quant, ")");
    mp.mode = parse_output_mode(opt.mode);
    mp.topk = opt.topk;
    mp.max_new_tokens = opt.max_new_tokens;
    mp.temperature = opt.temperature;
    mp.seed = opt.seed;
    DZ_CHECK(opt.max_batch_tokens >= 0, "--max-batch-tokens must be >= 0 (got ", opt.max_batch_tokens, ")");
    mp.chunk_tokens = opt.max_batch_tokens;
    mp.decode_graphs = !opt.eager_decode;
    DZ_CHECK(opt.speculative.empty() || mp.mode == OutputMode::Generate, "--speculative needs --mode generate (got ",
             opt.mode, ")");
    DZ_CHECK(opt.speculative.empty() || opt.speculative == "ngram" || opt.speculative == "oracle" ||
                 opt.speculative == "mtp",
             "--speculative must be ngram, oracle or mtp (got ", opt.speculative, ")");
    DZ_CHECK((opt.speculative == "oracle") == !opt.oracle_drafts.empty(),
             "--oracle-drafts goes with --speculative oracle, and --speculative oracle needs it");
    DZ_CHECK(opt.draft_tokens >= 1 && opt.draft_tokens <= 64, "--draft-tokens must be in 1..64 (got ",
             opt.draft_tokens, ")");
    DZ_CHECK(opt.spec_restore == "replay" || opt.spec_restore == "per-token",
             "--spec-restore must be replay or per-token (got ", opt.spec_restore, ")");
    mp.speculative = opt.speculative;
    mp.draft_tokens = opt.draft_tokens;
    mp.spec_restore = opt.spec_restore == "per-token" ? SpecRestore::PerToken : SpecRestore::Replay;
    DZ_CHECK(mp.mode != OutputMode::TopK || opt.topk >= 1, "--topk must be >= 1 (got ", opt.topk, ")");
    DZ_CHECK(mp.mode != OutputMode::Generate || opt.max_new_tokens >= 1, "--max-new-tokens must be >= 1 (got ",
             opt.max_new_tokens, ")");
    DZ_CHECK(opt.temperature >= 0, "--temperature must be >= 0 (got ", opt.temperature, ")");
    DZ_CHECK(!opt.output.empty(), "--output is required");
  });

  // Groups (DESIGN §4): TP = same (dp, cp); CP = same (dp, tp); DP group = same dp.
  const int C = grid.cp, T = grid.tp;
  Comm tp_comm = world.split(grid.dp_rank() * C + grid.cp_rank(), grid.tp_rank());
  Comm cp_comm = world.split(grid.dp_rank() * T + grid.tp_rank(), grid.cp_rank());
  Comm dp_group = world.split(grid.dp_rank(), grid.cp_rank() * T + grid.tp_rank());
  const bool group_root = grid.cp_rank() == 0 && grid.tp_rank() == 0;

  // The backend: the CPU reference (fp32; the FP8 KV cache and MXFP8 indexer options emulated
  // bit-exactly) or one GPU per rank, the local rank's (ranks beyond the node's GPU count share
  // them round-robin, which is how CP x TP is tested on one GPU).
  std::unique_ptr<Backend> own_backend;
  Backend* be = &cpu_backend();
  const Comm node = world.split_shared();
  agree(world, [&] {
    if (opt.backend != "cuda") return;
    const int n_gpu = cuda_device_count();
    DZ_CHECK(n_gpu > 0, "--backend cuda: no usable GPU on this node (rank ", world.rank(), ")");
    own_backend = make_cuda_backend(node.rank() % n_gpu);
    be = own_backend.get();
  });
  if (opt.backend == "cuda" && node.size() > cuda_device_count() && world.rank() == 0)
    log_root(str("note: ", node.size(), " ranks share ", cuda_device_count(), " GPU(s) on a node"));
  // The TP group's collectives on the backend's buffers: NCCL when its ranks have distinct GPUs.
  std::unique_ptr<DeviceComm> tp_dev;
  if (T > 1) agree(world, [&] { tp_dev = make_device_comm(*be, tp_comm); });
  if (T > 1) log_root(str("tensor parallelism over ", tp_dev->kind()));
  TpShard tp{grid.tp_rank(), T, T > 1 ? &tp_comm : nullptr, T > 1 ? tp_dev.get() : nullptr, EpShard{}};
  // The CP group's exchanges (KV / index-key caches, linear-attention transitions) likewise.
  std::unique_ptr<DeviceComm> cp_dev;
  if (C > 1) agree(world, [&] { cp_dev = make_device_comm(*be, cp_comm); });
  if (C > 1) log_root(str("context parallelism over ", cp_dev->kind()));
  // Expert parallelism (docs/expert_parallel.md): EP groups of opt.ep / T consecutive CP ranks; the
  // peers of a rank are its group's ranks of the same TP index.
  Comm ep_peers;  // (every rank has the same opt.ep: the split is collective only when it runs)
  std::unique_ptr<DeviceComm> ep_dev;
  if (opt.ep > 1) {
    const int M = opt.ep / T;  // CP members of an EP group
    ep_peers = world.split((grid.dp_rank() * (C / M) + grid.cp_rank() / M) * T + grid.tp_rank(), grid.cp_rank() % M);
    tp.ep.size = opt.ep;
    tp.ep.members = M;
    tp.ep.member = grid.cp_rank() % M;
    tp.ep.peers = &ep_peers;
    if (M > 1) agree(world, [&] { ep_dev = make_device_comm(*be, ep_peers); });  // the all-to-all's transport
    tp.ep.dev = ep_dev.get();
    log_root(str("expert parallelism over ", opt.ep, " ranks (", M, " CP x ", T, " TP)",
                 M > 1 ? str(", all-to-all over ", ep_dev->kind()) : std::string()));
  }
  // The input is checked against config.json before the weights load (minutes for a large model).
  std::unique_ptr<InputFile> input;
  agree(world, [&] {
    const ModelConfig c = ModelConfig::from_file(opt.model + "/config.json");
    DZ_CHECK(c.family != Family::DeepseekV4 || (opt.kv_cache == "bf16" && opt.index_quant == "none"),
             "--kv-cache ", opt.kv_cache, " --index-quant ", opt.index_quant, ": DeepSeek-V4's caches are kept in the "
             "activation dtype only for now (--kv-cache bf16 --index-quant none)");
    input = std::make_unique<InputFile>(opt.input);
    if (!opt.oracle_drafts.empty()) {  // every rank keeps every document's (small) oracle tokens
      auto o = std::make_shared<std::vector<std::vector<int32_t>>>(read_generated(opt.oracle_drafts));
      DZ_CHECK(int64_t(o->size()) == input->n_docs(), "--oracle-drafts ", opt.oracle_drafts, " has ", o->size(),
               " documents, the input ", input->n_docs());
      mp.oracle = std::move(o);
    }
    if (!input->score_from().empty()) {
      if (mp.mode == OutputMode::Logprobs)
        mp.score_from = std::make_shared<const std::vector<int64_t>>(input->score_from());
      else
        log_root(str(opt.input, ": /score_from applies to --mode logprobs; ignored in --mode ", opt.mode));
    }
    if (world.rank() != 0) return;
    input->validate(c.vocab_size);
    DZ_CHECK(mp.mode != OutputMode::TopK || opt.topk <= c.vocab_size, "--topk ", opt.topk,
             " is larger than the vocabulary (", c.vocab_size, ")");
  });
  std::unique_ptr<Model> model;
  const auto t_load = Clock::now();
  agree(world, [&] {
    model = Model::load(opt.model, tp, opt.kv_cache == "fp8", opt.index_quant == "mxfp8", *be, opt.dummy_weights,
                        opt.speculative == "mtp");
  });
  const double load_seconds = std::chrono::duration<double>(Clock::now() - t_load).count();
  const ModelConfig& cfg = model->config();
  if (opt.dummy_weights) log_root(str("dummy weights from ", opt.model, "/config.json (", load_seconds, " s)"));

  std::unique_ptr<OutputFile> output;
  std::vector<uint8_t> done;
  agree(world, [&] {
    if (world.rank() != 0) return;
    OutputSpec spec;
    spec.mode = mp.mode;
    spec.topk = mp.mode == OutputMode::TopK ? opt.topk : 0;
    spec.max_new_tokens = mp.mode == OutputMode::Generate ? opt.max_new_tokens : 0;
    spec.vocab = cfg.vocab_size;
    for (int64_t i = 0; i < input->n_docs(); ++i) spec.doc_lengths.push_back(input->doc_length(i));
    spec.identity["model_fingerprint"] = model_fingerprint(opt.model, opt.dummy_weights);
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
    if (opt.dummy_weights) spec.info["weights"] = "dummy (--dummy-weights: deterministic random from config.json)";
    spec.info["input"] = opt.input;
    spec.info["precision"] =
        opt.backend == "cuda"
            ? std::string("bf16 weights and activations, fp32 accumulation, residual stream, states and logits (cuda)")
            : str("fp32 (cpu reference)", opt.kv_cache == "fp8" ? ", KV cache FP8 E4M3 per 128-tile (emulated)" : "",
                  opt.index_quant == "mxfp8" ? ", indexer q/k MXFP8 (emulated)" : "");
    spec.info["world_size"] = std::to_string(world.size());
    spec.info["parallel"] = str("dp ", grid.dp, " x cp ", C, " x tp ", T, ", segments ", opt.segments);
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
  log_root(str("model ", opt.model, " (", cfg.model_type, ", ", cfg.num_layers, " layers), ", n_docs, " documents, ",
               input->n_tokens(), " tokens; ", todo.size(), " to do",
               opt.resume ? str(" (", n_docs - int64_t(todo.size()), " already done)") : std::string(), "; ",
               world.size(), " ranks (dp ", grid.dp, " x cp ", C, " x tp ", T, "), mode ", opt.mode));

  Writer writer;
  Sender sender;
  if (world.rank() == 0) {
    writer.out = output.get();
    writer.mode = mp.mode;
    writer.bytes = &input->bytes();
    writer.expected = int64_t(todo.size());
    writer.tokens_total = todo_tokens;
    writer.progress_seconds = opt.progress_seconds;
    if (const char* k = std::getenv("DAYZERO_FAULT_KILL_AFTER_DOCS")) writer.kill_after = std::atoll(k);
  }
  WorkStats stats;
  if (!opt.report.empty()) stats.device = be;  // stage seconds in the report are GPU time
  const DocParallel par{&cp_comm, cp_dev.get(), opt.segments, &stats};
  Clock::time_point stop_seen{};
  // Rank 0, a stop signal older than the grace period: every written document is already
  // durable, so close the .part cleanly and leave without waiting for busy ranks (mpirun ends them).
  auto leave_after_grace = [&] {
    output.reset();
    std::fprintf(stderr,
                 "dayzero: stopped by signal %d after the %.0f s grace period: %lld documents written this run; "
                 "rerun with --resume\n",
                 int(g_signal), opt.stop_grace, (long long)writer.received);
    std::fflush(stderr);
    std::_Exit(kExitStopped);
  };
  // Between layers: rank 0 keeps receiving and writing; other DP roots complete their sends.
  // After a stop signal and the grace period, rank 0 leaves regardless (see below).
  auto tick = [&] {
    if (world.rank() == 0) {
      writer.drain(world);
      if (g_signal) {
        if (stop_seen == Clock::time_point{}) stop_seen = Clock::now();
        if (std::chrono::duration<double>(Clock::now() - stop_seen).count() > opt.stop_grace) {
          leave_after_grace();
        }
      }
    } else if (group_root) {
      sender.reap();
    }
  };

  // Forwards: with --max-batch-tokens and a serial prefill (no CP / segments), consecutive short
  // documents of the work list are packed into one forward; every rank builds the same list.
  const bool packing = mp.chunk_tokens > 0 && C == 1 && opt.segments == 1;
  std::vector<int64_t> lengths(static_cast<size_t>(n_docs));
  for (int64_t i = 0; i < n_docs; ++i) lengths[size_t(i)] = input->doc_length(i);
  const std::vector<std::vector<int64_t>> batches = pack_batches(todo, lengths, packing ? mp.chunk_tokens : 0);
  if (packing && batches.size() < todo.size())
    log_root(str(todo.size(), " documents in ", batches.size(), " forwards of at most ", mp.chunk_tokens, " tokens"));

  std::vector<int64_t> my_docs;
  bool stopped = false;
  try {
    SharedCounter next(world);
    for (;;) {
      // The group root decides, for its whole group, the next document or the stop.
      int64_t k = -1;
      if (group_root) {
        if (g_signal) {
          k = -2;
        } else {
          k = next.fetch_add(1);
          if (k >= int64_t(batches.size())) k = -1;
        }
      }
      dp_group.bcast_bytes(&k, sizeof k, 0);
      if (k == -2) stopped = true;
      if (k < 0) break;
      const std::vector<int64_t>& batch = batches[size_t(k)];
      std::vector<DocResult> results;
      if (batch.size() == 1) {
        std::vector<int32_t> tokens = input->read_doc(batch[0]);
        results.push_back(compute_document(*model, batch[0], tokens, mp, tick, par));
      } else {
        std::vector<std::vector<int32_t>> tokens;
        for (int64_t d : batch) tokens.push_back(input->read_doc(d));
        results = compute_packed(*model, batch, tokens, mp, tick, par.stats);
      }
      for (DocResult& r : results) {
        r.stats.rank = world.rank();
        my_docs.push_back(r.doc);
        if (!group_root) continue;
        if (world.rank() == 0) {
          writer.write(r);
          writer.drain(world);
        } else {
          sender.send(world, r);
        }
      }
    }
    const int n_other_roots = grid.dp - 1;
    if (world.rank() == 0) {
      const bool all_in = writer.wait_all(world, n_other_roots, opt.stop_grace);
      writer.progress(true);
      if (!all_in) {
        // A group is still inside a document past the grace period: leave now (mpirun ends the
        // others); everything written is durable and the .part is closed cleanly.
        leave_after_grace();
      }
      if (writer.received == writer.expected) {
        output->finalize();
        stopped = false;
      } else {
        DZ_CHECK(stopped || g_signal, "internal: ", writer.expected - writer.received,
                 " documents neither written nor stopped");
        stopped = true;
      }
    } else if (group_root) {
      sender.goodbye(world);
      sender.wait_all();
    }
  } catch (const Error& e) {
    abort_all(e.what());
  }
  int any_stopped = world.any(stopped) ? 1 : 0;
  if (any_stopped) {
    if (world.rank() == 0) {
      output.reset();
      std::fprintf(stderr,
                   "dayzero: stopped by signal %d: %lld documents written this run, %lld remaining; rerun with "
                   "--resume\n",
                   int(g_signal ? g_signal : SIGTERM), (long long)writer.received,
                   (long long)(writer.expected - writer.received));
    }
    return kExitStopped;
  }

  // ---- per-rank work and stage times (balance report) ----
  std::vector<char> mine;
  {
    nlohmann::json j;
    j["rank"] = world.rank();
    j["dp"] = grid.dp_rank();
    j["cp"] = grid.cp_rank();
    j["tp"] = grid.tp_rank();
    j["documents"] = my_docs.size();
    j["flops"] = stats.flops;
    j["seconds"] = stats.seconds;
    j["counts"] = stats.counts;
    j["device"] = be->describe();
    j["peak_device_memory_bytes"] = be->peak_memory_bytes();
    std::string s = j.dump();
    mine.assign(s.begin(), s.end());
    mine.push_back('\n');
  }
  std::vector<char> all_ranks = world.allgatherv_bytes(mine);

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
      if (!opt.speculative.empty()) {
        j["speculative"] = opt.speculative;
        j["draft_tokens"] = opt.draft_tokens;
        j["spec_restore"] = opt.spec_restore;
      }
      j["backend"] = opt.backend;
      j["dummy_weights"] = opt.dummy_weights;
      j["load_seconds"] = load_seconds;
      j["world_size"] = world.size();
      j["dp"] = grid.dp;
      j["cp"] = C;
      j["tp"] = T;
      j["ep"] = opt.ep;
      j["segments"] = opt.segments;
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
      {
        nlohmann::json d = {{"doc", r->doc}, {"tokens", r->stats.tokens}, {"seconds", r->stats.seconds},
                            {"rank", r->stats.rank}};
        if (mp.mode == OutputMode::Logprobs) {  // the document's scores (also in the output's /stats/)
          const DocStats& s = r->stats;
          d["score_from"] = s.score_from;
          d["scored"] = s.scored;
          d["nll"] = s.nll;
          d["perplexity"] = finite_or_null(perplexity_of(s.nll, s.scored));
          d["is_greedy"] = bool(s.is_greedy);
        }
        if (!opt.speculative.empty()) {  // per verify step: drafts accepted, tokens generated
          const DocStats& s = r->stats;
          d["spec_steps"] = s.spec_steps;
          d["drafts_proposed"] = s.spec_drafted;
          d["drafts_accepted"] = s.spec_accepted;
          d["mean_accepted_length"] = s.spec_steps ? double(s.spec_accepted) / double(s.spec_steps) : 0.0;
          d["tokens_per_step"] = s.spec_steps ? double(s.spec_accepted + s.spec_steps) / double(s.spec_steps) : 0.0;
        }
        per.push_back(d);
      }
      j["per_document"] = per;
      if (mp.mode == OutputMode::Logprobs) {  // the corpus, over every document of the output file
        j["scores"] = corpus_json(read_scores(opt.output));
      }
      nlohmann::json ranks = nlohmann::json::array();
      std::string text(all_ranks.begin(), all_ranks.end());
      size_t a = 0;
      for (size_t b; (b = text.find('\n', a)) != std::string::npos; a = b + 1)
        ranks.push_back(nlohmann::json::parse(text.substr(a, b - a)));
      j["per_rank"] = ranks;
      std::string tmp = opt.report + ".tmp";
      {
        std::ofstream f(tmp);
        DZ_CHECK(f.good(), "cannot write report ", opt.report);
        f << j.dump(2) << "\n";
      }
      DZ_CHECK(std::rename(tmp.c_str(), opt.report.c_str()) == 0, "cannot write report ", opt.report);
    }
  }
  world.barrier();
  return 0;
}

}  // namespace dz
