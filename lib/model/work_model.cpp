#include "model/work_model.hpp"

#include <algorithm>

#include "ops/linear_attn.hpp"

namespace dz {

// sum_{p = p0}^{p0 + n - 1} (p + 1)
static double causal_keys(int64_t p0, int64_t n) {
  return double(n) * double(p0) + double(n) * double(n + 1) / 2.0;
}

// sum_{p = p0}^{p0 + n - 1} floor((p + 1) / m): the entries of rate m closed by position p
static double closed_entries(int64_t p0, int64_t n, int64_t m) {
  double s = 0;
  for (int64_t p = p0; p < p0 + n; ++p) s += double((p + 1) / m);
  return s;
}

double WorkModel::indexer(const ModelConfig& c, int64_t p0, int64_t n) {
  return 2.0 * double(c.index_n_heads) * double(c.index_head_dim) * causal_keys(p0, n);
}

double WorkModel::indexer(const ModelConfig& c, const LayerSpec& l, int64_t p0, int64_t n) {
  // DeepSeek-V4's CSA indexer scores the closed compressed entries, not every position
  if (l.mixer == MixerKind::DSV4) return 2.0 * double(c.index_n_heads) * double(c.index_head_dim) * closed_entries(p0, n, l.compress_rate);
  return indexer(c, p0, n);
}

double WorkModel::attention(const ModelConfig& c, const LayerSpec& l, int64_t p0, int64_t n) {
  if (l.mixer == MixerKind::DSV4) {  // the window rows plus the selected (CSA) or all closed (HCA) entries
    double keys = 0;
    for (int64_t p = p0; p < p0 + n; ++p) {
      const int64_t e = l.compress_rate > 0 ? (p + 1) / l.compress_rate : 0;
      keys += double(std::min<int64_t>(c.sliding_window, p + 1) + (l.has_indexer ? std::min<int64_t>(c.index_topk, e) : e));
    }
    return 2.0 * double(c.num_heads) * keys * double(2 * c.head_dim);  // shared KV rows: dk = dv = head_dim
  }
  double keys;
  if (l.has_indexer && c.index_topk > 0) {
    // min(K, p + 1) keys per query
    const int64_t K = c.index_topk;
    const int64_t dense_end = std::min(p0 + n, std::max(p0, K));  // queries p < K see p + 1 keys
    keys = causal_keys(p0, dense_end - p0) + double(p0 + n - dense_end) * double(K);
  } else {
    keys = causal_keys(p0, n);
  }
  double dqk, dv, heads = double(c.num_heads);
  if (l.mixer == MixerKind::GQA) {
    dqk = dv = double(c.head_dim);
  } else {  // MLA as the CPU reference runs it: per-head keys (nope + rope) and values
    dqk = double(c.qk_nope_head_dim + c.qk_rope_head_dim);
    dv = double(c.v_head_dim);
  }
  return 2.0 * heads * keys * (dqk + dv);
}

double WorkModel::linear_attention(const ModelConfig& c, const LayerSpec& l, int64_t n) {
  // the two chunked passes of the CP / segmented scan (transition, then outputs): the same count
  // the KDA/GDN mixers charge at run time (ops/linear_attn.hpp)
  const int64_t hv = l.mixer == MixerKind::GDN ? c.la_num_v_heads : c.la_num_k_heads;
  return la_segment_flops(n, hv, c.la_head_k_dim, c.la_head_v_dim);
}

std::map<std::string, double> WorkModel::document(const ModelConfig& c, const SeqLayout& lay, int rank) {
  std::map<std::string, double> w{{"indexer", 0}, {"attention", 0}, {"linear_attention", 0}};
  // every rank walks the whole chain of segment transitions: 2·HV·K²·V per non-empty segment
  int64_t nonempty = 0;
  for (int j = 0; j < lay.n_seg(); ++j) nonempty += lay.seg_len(j) > 0;
  for (const LayerSpec& l : c.layers)
    if (l.mixer == MixerKind::KDA || l.mixer == MixerKind::GDN) {
      const int64_t hv = l.mixer == MixerKind::GDN ? c.la_num_v_heads : c.la_num_k_heads;
      w["linear_attention"] += double(nonempty) * 2.0 * double(hv * c.la_head_k_dim * c.la_head_k_dim * c.la_head_v_dim);
    }
  for (int j : lay.segments_of(rank)) {
    const int64_t p0 = lay.seg_begin(j), n = lay.seg_len(j);
    for (const LayerSpec& l : c.layers) {
      if (l.mixer == MixerKind::KDA || l.mixer == MixerKind::GDN) {
        w["linear_attention"] += linear_attention(c, l, n);
      } else {
        if (l.has_indexer && !l.shared_indexer) w["indexer"] += indexer(c, l, p0, n);
        w["attention"] += attention(c, l, p0, n);
      }
    }
  }
  w["total"] = w["indexer"] + w["attention"] + w["linear_attention"];
  return w;
}

}  // namespace dz
