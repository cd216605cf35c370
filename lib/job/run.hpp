// The batch job: `dayzero run`. Validates everything before any work (model, input, output),
// deals documents to data-parallel ranks longest-first through a shared counter, computes each
// document's result in the chosen mode and has rank 0 write it durably, then writes a report.
#pragma once
#include <cstdint>
#include <string>

namespace dz {

struct RunOptions {
  std::string model, input, output, report;
  int cp = 1, tp = 1;
  int ep = 1;  // expert parallelism: ranks sharing the routed experts (a multiple of tp dividing cp * tp)
  std::string mode = "logprobs";
  int64_t topk = 5;
  int64_t max_new_tokens = 32;
  double temperature = 0.0;  // 0: greedy
  uint64_t seed = 0;
  std::string backend = "cpu";
  std::string kv_cache = "bf16";
  std::string index_quant = "none";
  int segments = 1;  // linear-attention segments per zigzag segment (intra-rank parallel scan)
  int64_t max_batch_tokens = 0;  // > 0: prefill a document in forwards of at most this many tokens
  bool dummy_weights = false;  // config.json alone, deterministic random weights (benchmarks, planning)
  bool eager_decode = false;   // generate: no CUDA graphs (every decode op issued one by one)
  std::string speculative;     // generate: "" (one token a step) | "ngram" | "oracle" | "mtp" (DESIGN §11)
  std::string oracle_drafts;   // --speculative oracle: a previous generate run's output
  int64_t draft_tokens = 4;    // speculative: draft tokens per step, at most
  // speculative: per-token | replay (how recurrent states undo drafts; per-token measured faster
  // on the H200 for K <= 4 and equal to plain decoding's rounding: docs/speculative.md)
  std::string spec_restore = "per-token";
  bool resume = false;
  bool overwrite = false;
  double progress_seconds = 30.0;  // rank 0 prints a progress line this often
  double stop_grace = 20.0;        // after SIGTERM, seconds before rank 0 exits regardless
};

// Exit code of a run stopped by SIGTERM/SIGINT (128 + 15): the output stays OUT.part, resumable.
constexpr int kExitStopped = 143;

// Thrown when validation before any work fails on some rank; every rank throws it with the same
// message, so main() can print it once and exit non-zero without MPI_Abort.
struct PreflightError {
  std::string message;
};

// Runs the job on MPI_COMM_WORLD. Returns the process exit code.
int run_job(const RunOptions& opt);

}  // namespace dz
