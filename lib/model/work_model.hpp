// FLOP counts of the position-dependent parts of a layer, in one place: the mixers add them to
// WorkStats as they run, and the balance report / tests use them to compare layouts without
// running a model. Multiply-adds count 2.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "config/model_config.hpp"
#include "dist/seq_layout.hpp"

namespace dz {

struct WorkModel {
  // DSA lightning indexer for queries at positions [p0, p0 + n): every query scores all visible
  // keys with every index head (dense causal: the part CP must balance).
  static double indexer(const ModelConfig& c, int64_t p0, int64_t n);
  // The same for layer l (DeepSeek-V4's CSA indexer scores the closed compressed entries).
  static double indexer(const ModelConfig& c, const LayerSpec& l, int64_t p0, int64_t n);
  // Softmax attention core for queries at [p0, p0 + n): QK^T and PV over the visible keys, or
  // over the Top-K selected ones when the layer has an indexer.
  static double attention(const ModelConfig& c, const LayerSpec& l, int64_t p0, int64_t n);
  // The CP / segmented delta-rule scan over n tokens: the transition pass and the output pass
  // (independent of position). document() adds the merge chain every rank walks.
  static double linear_attention(const ModelConfig& c, const LayerSpec& l, int64_t n);
  // Totals over all layers for the rows of `rank` in `lay`: keys "indexer", "attention",
  // "linear_attention", "total".
  static std::map<std::string, double> document(const ModelConfig& c, const SeqLayout& lay, int rank);
};

}  // namespace dz
