// `dayzero bench e2e`: the job's own prefill path (compute_document, as `dayzero run` runs it) on
// one rank, timed per document length and output mode, with the model built from config.json
// alone (--dummy-weights) or from a checkpoint. DESIGN §7's end-to-end numbers come from here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dz {

struct BenchE2eOptions {
  std::vector<std::string> models;         // model directories (config.json; weights unless dummy)
  std::vector<int64_t> tokens{8192, 32768};  // one random document of each length
  std::vector<std::string> modes{"last-logits", "logprobs"};
  int repeats = 3;                          // timed runs after one warm-up (median reported)
  std::string backend = "cuda";
  bool dummy_weights = true;
  int64_t max_batch_tokens = 0;             // as `run --max-batch-tokens` (chunked prefill)
  int64_t new_tokens = 1;                   // generate mode: tokens generated after the prefill
  int64_t batch = 1;                        // documents of T tokens per forward (packed; generate: decoded together)
  bool eager_decode = false;                // generate mode: decode without CUDA graphs
  std::string json;                         // report path (commit from $DZ_COMMIT)
};

// Prints one JSON line per measurement and writes them all to opt.json. Returns the exit code.
int bench_e2e(const BenchE2eOptions& opt);

}  // namespace dz
