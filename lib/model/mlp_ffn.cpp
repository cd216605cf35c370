// Dense gated FFN: out = down(act(gate(x), up(x))) (ops/glu.hpp: SwiGLU, its clamp, SiTU); TP shards the width I. Same tensor names in every family:
//   PREFIX mlp.gate_proj.weight [I, D], mlp.up_proj.weight [I, D], mlp.down_proj.weight [D, I]
#include "core/error.hpp"
#include "model/module.hpp"
#include "ops/moe.hpp"

namespace dz {

namespace {
class MlpFfn : public Ffn {
 public:
  MlpFfn(const Tensor& gate, const Tensor& up, const Tensor& down, int64_t D, const GluAct& act, const TpShard& tp,
         Backend& be)
      : be_(&be), D_(D), tp_(tp) {
    if (gate.empty()) return;  // dry run (inspect)
    w_.act = act;
    w_.gate = be.weight(gate);
    w_.up = be.weight(up);
    w_.down = be.weight(down);
  }
  // Under TP each rank holds a width slice: its partial output is all-reduced.
  void forward(const DTensor& x, const DTensor& out) const override {
    be_->swiglu_mlp(x, w_, out);
    tp_.allreduce(*be_, out);
  }
  int64_t hidden() const override { return D_; }
  bool graph_safe() const override { return tp_.size == 1; }

 private:
  Backend* be_;
  SwigluWeights w_;  // [I, D], [I, D], [D, I]
  int64_t D_;
  TpShard tp_;
};
}  // namespace

std::unique_ptr<Ffn> make_mlp_ffn(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                  const TpShard& tp, Backend& be) {
  const GluAct act = glu_of(cfg, layer);
  const int64_t D = cfg.hidden_size, I = cfg.intermediate_size;
  DZ_CHECK(D > 0 && I > 0, "layer ", layer, ": dense MLP needs hidden_size and intermediate_size > 0");
  // Published Kimi checkpoints keep a dense layer under `mlp.`; transformers 5.17's save_pretrained
  // writes it under `block_sparse_moe.` (the MoE layers' name). Either loads; never both.
  std::string p = prefix + "mlp.";
  const std::string alt = prefix + "block_sparse_moe.";
  if (cfg.model_type == "kimi_linear" && !ck.has(p + "gate_proj.weight") && ck.has(alt + "gate_proj.weight")) p = alt;
  Tensor g = ck.get(p + "gate_proj.weight", {I, D});
  Tensor u = ck.get(p + "up_proj.weight", {I, D});
  Tensor d = ck.get(p + "down_proj.weight", {D, I});
  if (tp.size > 1 && !ck.keeps_full()) {  // width shard: gate/up rows, down columns
    auto [i0, i1] = tp.range(I, "intermediate_size");
    g = slice_rows(g, i0, i1);
    u = slice_rows(u, i0, i1);
    d = slice_cols(d, i0, i1);
  }
  // generating mode keeps the full width: no shard, no all-reduce
  return std::make_unique<MlpFfn>(g, u, d, D, act, ck.keeps_full() ? TpShard{} : tp, be);
}

}  // namespace dz
