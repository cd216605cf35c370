// `dayzero plan`'s memory side: per rank, the bytes a layout needs on its device before a job is
// queued -- weights (the TP shard in the backend's dtypes), per-document state (linear-attention
// states and conv tails, MLA latent / index-key and GQA K/V caches at their RowStore capacity), and
// the peak of one forward's activations (residual stream, the largest sub-layer's temporaries, the
// LM head's logits chunk). `dayzero bench e2e` prints the prediction beside the measured numbers;
// the GPU tests hold the prediction to them (weights within 2 %, peak not below the measured one).
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "config/model_config.hpp"

namespace dz {

struct MemoryQuery {
  int tp = 1;
  int ep = 1;                 // --ep: routed experts split whole over ep ranks (ep / tp CP members)
  int64_t doc_tokens = 0;     // the longest document (its state stays for the whole document)
  int64_t forward_tokens = 0; // rows of one forward: the document, or --max-batch-tokens (chunks, packing)
  int64_t docs = 1;           // documents whose state is alive at once (packed into one forward)
  bool cuda = true;           // bf16 weights / activations (else the fp32 CPU reference)
  bool kv_fp8 = false;
  // Weights the checkpoint stores in FP8 E4M3 with 128 x 128 block scales (NAME + NAME_scale_inv;
  // empty for BF16 / fp32 checkpoints and --dummy-weights): on the GPU the dense linear ones stay
  // FP8 (1 byte + the padded block scales), stacked experts go up in BF16.
  std::set<std::string> fp8_block;
};

// The FP8 block-scaled weights of the checkpoint in DIR (none when DIR holds no safetensors).
std::set<std::string> fp8_block_weights(const std::string& dir);

struct MemoryPlan {
  double weights = 0, state = 0, activations = 0, workspace = 0;
  int64_t fp8_weights = 0;  // weights counted in FP8 (MemoryQuery::fp8_block)
  std::map<std::string, double> detail;  // weights by kind, activations by sub-layer
  double total() const { return weights + state + activations + workspace; }
};

MemoryPlan plan_memory(const ModelConfig& cfg, const MemoryQuery& q);

}  // namespace dz
