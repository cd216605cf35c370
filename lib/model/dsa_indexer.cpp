#include "model/dsa_indexer.hpp"

#include <cmath>

#include "core/error.hpp"
#include "ops/indexer.hpp"

namespace dz {

DsaIndexer::DsaIndexer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, Backend& be)
    : be_(&be),
      hidden_(cfg.hidden_size),
      q_lora_(cfg.q_lora_rank),
      H_(cfg.index_n_heads),
      D_(cfg.index_head_dim),
      rope_dim_(cfg.qk_rope_head_dim),
      topk_(cfg.index_topk),
      mxfp8_(cfg.index_mxfp8) {
  DZ_CHECK(q_lora_ > 0, prefix, ": the DSA indexer reads the q latent, so q_lora_rank must be > 0");
  DZ_CHECK(H_ > 0 && D_ > 0 && topk_ > 0, prefix, ": index_n_heads, index_head_dim and index_topk must be > 0");
  DZ_CHECK(rope_dim_ >= 0 && rope_dim_ <= D_ && rope_dim_ % 2 == 0, prefix, ": qk_rope_head_dim ", rope_dim_,
           " must be even and fit index_head_dim ", D_);
  const Tensor wq_b = ck.get(prefix + "wq_b.weight", {H_ * D_, q_lora_}, Init::normal(0.02f));
  const Tensor wk = ck.get(prefix + "wk.weight", {D_, hidden_}, Init::normal(0.02f));
  const Tensor nw = ck.get(prefix + "k_norm.weight", {D_}, Init::ones());
  const Tensor nb = ck.get(prefix + "k_norm.bias", {D_}, Init::zeros());
  const Tensor wp = ck.get(prefix + "weights_proj.weight", {H_, hidden_}, Init::normal(0.02f));
  Tensor ape, gw;
  if (cfg.index_kpool > 0) {  // GLM-5.3-Flash: keys pooled in groups of P (ops/indexer.hpp kpool_select)
    P_ = cfg.index_kpool;
    tail_ = cfg.index_kpool_tail;
    DZ_CHECK(topk_ % P_ == 0, prefix, ": index_topk ", topk_, " is not a multiple of index_kpool ", P_);
    DZ_CHECK(rope_dim_ == 0, prefix, ": a k-pool indexer with RoPE is not supported (qk_rope_head_dim ", rope_dim_, ")");
    DZ_CHECK(!mxfp8_, prefix, ": --index-quant mxfp8 is not supported for a k-pool indexer");
    ape = ck.get(prefix + "index_kpool_compress_ape", {P_, D_}, Init::normal(0.02f));
    gw = ck.get(prefix + "index_kpool_compress_gate", {D_, hidden_}, Init::normal(0.02f));
  }
  if (rope_dim_ > 0) {
    RopeConfig rc = cfg.rope;
    rc.style = cfg.index_rope_style;  // deepseek_v32 rotates halves, GLM-5 adjacent pairs
    rope_ = std::make_unique<Rope>(rc, rope_dim_);
  }
  if (wk.empty()) return;  // dry run (inspect): names and shapes only
  wq_b_ = be.weight(wq_b);
  wk_ = be.weight(wk);
  k_norm_w_ = be.param(nw);
  k_norm_b_ = be.param(nb);
  weights_proj_ = be.weight(wp);
  if (P_ > 0) {
    ape_ = be.param(ape);
    gate_w_ = be.weight(gw);
  }
}

void DsaIndexer::key_rows(const DTensor& x, const DTensor& k) const {
  if (P_ > 0) {  // [LayerNorm(wk x) | x gateᵀ]
    const int64_t T = x.rows();
    DTensor kk = be_->act({T, D_}), g = be_->act({T, D_});
    be_->linear(x, wk_, DTensor{}, kk);
    be_->layer_norm(kk, k_norm_w_, k_norm_b_, kk, 1e-6f);
    be_->linear(x, gate_w_, DTensor{}, g);
    be_->copy_cols(kk, 0, k, 0, D_);
    be_->copy_cols(g, 0, k, D_, D_);
    return;
  }
  be_->linear(x, wk_, DTensor{}, k);
  be_->layer_norm(k, k_norm_w_, k_norm_b_, k, 1e-6f);
}
void DsaIndexer::key_round(const DTensor& k) const {
  if (mxfp8_) be_->quant_round(k, Backend::Round::Mxfp8);  // each key: D/32 groups with one E8M0 scale each
}

void DsaIndexer::keys(const DTensor& x, int64_t pos0, const DTensor& k) const {
  if (x.rows() == 0) return;
  key_rows(x, k);
  if (rope_) be_->rope(*rope_, k, 1, D_, 0, pos0);
  key_round(k);
}

void DsaIndexer::keys(const DTensor& x, const std::vector<int64_t>& cu, const DTensor& k) const {
  if (x.rows() == 0) return;
  key_rows(x, k);
  if (rope_) be_->rope_varlen(*rope_, k, 1, D_, 0, cu);
  key_round(k);
}

void DsaIndexer::keys_rows(const DTensor& x, const std::vector<int64_t>& pos, const DTensor& k) const {
  if (x.rows() == 0) return;
  key_rows(x, k);
  if (rope_) be_->rope_rows(*rope_, k, 1, D_, 0, pos);
  key_round(k);
}

void DsaIndexer::select(const DTensor& x, const DTensor& q_resid, int64_t pos0, const DTensor& index_k,
                        const DTensor& sel) const {
  const int64_t T = x.rows();
  if (T == 0) return;
  DTensor q = be_->act({T, H_ * D_});  // [T, H, D]
  be_->linear(q_resid, wq_b_, DTensor{}, q);
  if (rope_) be_->rope(*rope_, q, H_, D_, 0, pos0);
  if (mxfp8_) be_->quant_round(q.reshaped({T * H_, D_}), Backend::Round::Mxfp8);  // per token and head
  DTensor w = be_->alloc({T, H_}, DType::F32);  // [T, H]
  be_->linear(x, weights_proj_, DTensor{}, w);
  const float wscale = float(1.0 / std::sqrt(double(H_)) / std::sqrt(double(D_)));
  if (P_ > 0) {
    be_->indexer_kpool_topk(q, w, wscale, index_k.slab(0, pos0 + T), ape_, P_, pos0, H_, topk_ / P_, tail_, sel);
    return;
  }
  be_->indexer_topk(q, w, wscale, index_k.slab(0, pos0 + T), pos0, H_, topk_, sel);
}

}  // namespace dz
