// What one document produces in each output mode, computed on one rank from the model.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "io/hdf5_io.hpp"
#include "model/model.hpp"

namespace dz {

struct ModeParams {
  OutputMode mode = OutputMode::Logprobs;
  int64_t topk = 5;
  int64_t max_new_tokens = 32;
  double temperature = 0.0;
  uint64_t seed = 0;
  // Prefill a document in forwards of at most this many tokens (0: the whole document at once):
  // activations and LM-head work stay bounded by the chunk; the state carries across chunks.
  // Applies to the serial prefill (a CP prefill splits the document over the group already).
  int64_t chunk_tokens = 0;
};

struct DocResult {
  int64_t doc = -1;
  DocStats stats;
  std::vector<int32_t> ids;   // topk ids [L, K] / generated tokens
  std::vector<float> values;  // logprobs [L-1] / topk logprobs [L, K] / last logits [V]
};

// How a document is spread: over the CP group (zigzag, 2C segments) and/or into `segments`
// pieces per zigzag segment (the intra-rank parallel scan). cp == nullptr or size 1 with
// segments == 1 is the plain serial prefill.
struct DocParallel {
  const Collectives* cp = nullptr;
  int segments = 1;
  WorkStats* stats = nullptr;
};

// Computes document `doc` (all its tokens given, on every rank of the group) in the chosen mode;
// every CP and TP rank returns the same result. `tick` is called between layers.
DocResult compute_document(const Model& model, int64_t doc, const std::vector<int32_t>& tokens, const ModeParams& p,
                           const std::function<void()>& tick, const DocParallel& par = DocParallel{});

// Token choice for generation: greedy (temperature 0, lowest id on ties) or sampling from
// softmax(logits / temperature) with a generator seeded by (seed, doc, step), so the result does
// not depend on which rank computes the document.
int32_t choose_token(const float* logits, int64_t V, double temperature, uint64_t seed, int64_t doc, int64_t step);

// Byte (de)serialisation of a DocResult for sending to the writer rank.
std::vector<char> pack(const DocResult& r);
DocResult unpack(const std::vector<char>& b);

}  // namespace dz
