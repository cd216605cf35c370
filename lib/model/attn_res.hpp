// Block Attention Residuals (Kimi "Attention Residuals", Kimi K3; config field attn_res_block_size).
//
// Instead of the additive residual h <- h + f(h), every sub-layer (the token mixer and the FFN of
// each layer: 2 sites per layer) reads a softmax mixture over depth of the value set
//   V = [b_0, ..., b_{n-1}, p]
// where b_0 is the token embedding, b_k (k >= 1) is a closed block (the sum of the outputs of the
// sub-layers of block k) and p is the running partial sum of the current block:
//   score_i = (w_norm ⊙ w_proj) · RMSNorm(v_i)     RMSNorm without weight, eps = rms_norm_eps
//   alpha   = softmax_i(score)                     input = sum_i alpha_i v_i   (v_i NOT normed)
// w_norm [D] and w_proj [1, D] are the site's "*_res_norm.weight" and "*_res_proj.weight"; their
// product is the site's pseudo-query. Blocks are counted in LAYERS: at layer l with
// l % attn_res_block_size == 0 the running sum is closed (appended to the blocks) after the
// mixer's input has been read, and the mixer's output starts the new partial sum. So layer 0
// closes b_0 = embedding; layer 0's mixer reads V = [embedding] (its input is the embedding);
// the mixer at the first layer of a block reads the just-completed block as the last value.
// After the last layer, the model output is the same mixture with the output site's weights
// over [b_0 .. b_{n-1}, p] (p = the last, possibly partial, block), followed by the final norm.
// Semantics: Moonshot's K3 modeling_kimi_linear.py (_apply_attn_res, KimiDecoderLayer,
// _apply_output_attn_res) as reproduced by NVIDIA-NeMo/Automodel
// nemo_automodel/components/models/kimi_k3/model.py (_forward_attn_residual).
//
// AttnRes mixes across depth only, never across tokens: the same code serves prefill (T tokens)
// and decode (T = 1), and the per-token results do not depend on T.
//
// Tensor names (prefix "model."):
//   {prefix}layers.{l}.self_attention_res_norm.weight [D]     {prefix}layers.{l}.self_attention_res_proj.weight [1, D]
//   {prefix}layers.{l}.mlp_res_norm.weight [D]                {prefix}layers.{l}.mlp_res_proj.weight [1, D]
//   {prefix}output_attn_res_norm.weight [D]                   {prefix}output_attn_res_proj.weight [1, D]
// (layer 0's self_attention pair is loaded but never affects the output: its V has one element.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "config/model_config.hpp"
#include "core/tensor.hpp"
#include "io/checkpoint.hpp"

namespace dz {

class AttnRes {
 public:
  // Loads the 2 * num_layers + 1 site weights by their published names (generated models: norm
  // weights ones, projections normal(0.02), as nn.Linear under transformers' _init_weights; the
  // paper initialises pseudo-queries to zero, which would make every mixture a plain mean).
  AttnRes(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix = "model.");
  // Direct construction (tests, tools): norm_w, proj_w [2 * num_layers + 1, D]; row 2l + w is
  // site (layer l, which w), the last row the output site.
  AttnRes(int64_t hidden, int num_layers, int64_t block_size, float eps, const Tensor& norm_w, const Tensor& proj_w);

  // The depth state of one forward call over T tokens, on a backend: blocks [n_max, T, D] F32 (all
  // the blocks a forward closes; the first n_blocks are b_0 .. b_{n-1}), partial [T, D] F32 (the
  // running sum of the current block, starting as the embedding), the site queries on the same
  // backend.
  struct Stream {
    int64_t T = 0, n_blocks = 0;
    DTensor blocks, partial, query;
    int next_site = 0;  // 2 * layer + which of the next sub-layer (call order is checked)
  };
  // Uploads the pseudo-queries to `be` (once, before the first begin on a device backend; the CPU
  // backend reads them where they are).
  void upload(Backend& be);
  Stream begin(Backend& be, const DTensor& embed /*[T, D] F32*/) const;
  // begin() again on s's buffers (the same T): a decode graph keeps its addresses from step to step.
  void restart(Backend& be, Stream& s, const DTensor& embed) const;
  // out [T, D]: the input of sub-layer (layer, which), which = 0 mixer, 1 FFN (before its pre-norm).
  void sublayer_input(Backend& be, const Stream& s, int layer, int which, const DTensor& out) const;
  // Accumulates the sub-layer's output f [T, D]; closes the block at the mixer of a block's first layer.
  void add_output(Backend& be, Stream& s, int layer, int which, const DTensor& f) const;
  // out [T, D]: the output-site mixture after the last layer (the final norm is the caller's).
  void final_output(Backend& be, const Stream& s, const DTensor& out) const;

  // Host fp32 conveniences (the CPU backend: tests, tools).
  Stream begin(const float* embed /*[T, D]*/, int64_t T) const;
  void sublayer_input(const Stream& s, int layer, int which, float* out) const;
  void add_output(Stream& s, int layer, int which, const float* f) const;
  void final_output(const Stream& s, float* out) const;

  int64_t hidden() const { return D_; }
  int num_layers() const { return L_; }
  int64_t block_size() const { return bs_; }

 private:
  void check_site(int next_site, int layer, int which, const char* what) const;
  void mix(Backend& be, const Stream& s, int site, const DTensor& out) const;

  int64_t D_ = 0;
  int L_ = 0;
  int64_t bs_ = 0;
  float eps_ = 1e-6f;
  std::vector<Tensor> norm_w_, proj_w_;  // per site [D] (kept to report / re-save)
  std::vector<float> query_;             // [2L + 1, D] w_norm ⊙ w_proj per site
  DTensor dquery_;                       // the same on a device backend (upload)
};

}  // namespace dz
