// What one document produces in each output mode, computed on one rank from the model.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  // Generate mode: decode steps replay CUDA graphs where the backend has them
  // (model/decode_runner.hpp); false (--eager-decode): every step issues its ops one by one.
  bool decode_graphs = true;
  // Generate mode: speculative decoding (DESIGN §11; job/speculative.hpp): "ngram" drafts up to
  // draft_tokens tokens a step from the document itself, "oracle" from a previous run's output,
  // and verifies them in one forward; "" decodes one token a step. spec_restore: how the recurrent states undo rejected drafts.
  std::string speculative;
  int64_t draft_tokens = 4;
  SpecRestore spec_restore = SpecRestore::PerToken;
  // "oracle": each document's drafts are what a previous run generated for it ([doc] -> tokens)
  std::shared_ptr<const std::vector<std::vector<int32_t>>> oracle;
  // Logprobs mode: per input document the first position whose log-prob counts (the input's
  // /score_from; null: 1, every position). Rows before it get no LM-head work and are NaN.
  std::shared_ptr<const std::vector<int64_t>> score_from;
};

// Logprobs mode: the first row of document `doc` whose log-prob is computed (row j predicts token j + 1).
inline int64_t first_scored_row(const ModeParams& p, int64_t doc) {
  return p.score_from ? (*p.score_from)[size_t(doc)] - 1 : 0;
}

struct DocResult {
  int64_t doc = -1;
  DocStats stats;
  std::vector<int32_t> ids;   // topk ids [L, K] / generated tokens
  std::vector<float> values;  // logprobs [L-1] / topk logprobs [L, K] / last logits [V]
};

// Logprobs mode: a document's scores (stats.score_from, scored, nll, is_greedy) from its log-probs
// r.values [L - 1], rows before j0 set to NaN (not computed), and greedy[j] for the rows j >= j0.
void finish_scores(DocResult& r, int64_t j0, const std::vector<uint8_t>& greedy);

// How a document is spread: over the CP group (zigzag, 2C segments) and/or into `segments`
// pieces per zigzag segment (the intra-rank parallel scan). cp == nullptr or size 1 with
// segments == 1 is the plain serial prefill.
struct DocParallel {
  const Collectives* cp = nullptr;
  const DeviceComm* cp_dev = nullptr;  // cp on the backend's buffers (CpCtx::dev); null: the backend's transport
  int segments = 1;
  WorkStats* stats = nullptr;
};

// Computes document `doc` (all its tokens given, on every rank of the group) in the chosen mode;
// every CP and TP rank returns the same result. `tick` is called between layers.
DocResult compute_document(const Model& model, int64_t doc, const std::vector<int32_t>& tokens, const ModeParams& p,
                           const std::function<void()>& tick, const DocParallel& par = DocParallel{});

// Documents docs[b] (tokens[b], each non-empty, shorter than any chunk) packed into one forward
// (Model::forward_packed) on one rank, then each one's result in the chosen mode: equal to
// compute_document of each (the LM head sees the packed rows at once). Each result's seconds are the
// batch's wall time shared out by tokens.
std::vector<DocResult> compute_packed(const Model& model, const std::vector<int64_t>& docs,
                                      const std::vector<std::vector<int32_t>>& tokens, const ModeParams& p,
                                      const std::function<void()>& tick, WorkStats* stats = nullptr);

// Groups the work list (in its order) into forwards: consecutive documents are packed while their
// total stays within max_tokens; a document of max_tokens or more is a batch of its own (prefilled in
// chunks). max_tokens <= 0: one document per batch.
std::vector<std::vector<int64_t>> pack_batches(const std::vector<int64_t>& todo, const std::vector<int64_t>& lengths,
                                               int64_t max_tokens);

// Token choice for generation: greedy (temperature 0, lowest id on ties) or sampling from
// softmax(logits / temperature) with a generator seeded by (seed, doc, step), so the result does
// not depend on which rank computes the document.
int32_t choose_token(const float* logits, int64_t V, double temperature, uint64_t seed, int64_t doc, int64_t step);

// Byte (de)serialisation of a DocResult for sending to the writer rank.
std::vector<char> pack(const DocResult& r);
DocResult unpack(const std::vector<char>& b);

}  // namespace dz
