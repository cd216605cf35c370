// Routed MoE FFN with optional shared expert(s), written once on the backend seam.
//   out = sum_k w_k * expert_k(x) + [sigmoid(x · g)] * shared(x)
// Kimi K3's latent MoE (routed_expert_hidden_size L): the routed experts run on the latent
//   u = sum_k w_k * expert_k(down · x)  [T, L],   out = up · RMSNorm(u) + shared(x)
// (the router and the shared experts read x; experts are [I, L] / [L, I]), tensors
// block_sparse_moe.routed_expert_down_proj.weight [L, D], routed_expert_up_proj.weight [D, L],
// routed_expert_norm.weight [L] (latent_moe_use_norm). Experts use the model's gate activation
// (ops/glu.hpp: SiLU, its clamp, K3's SiTU); routed experts may be MXFP4 in the file
// (experts.{e}.w1.weight_packed + weight_scale: Checkpoint decodes them; a backend may keep them).
// Routing: ops/moe.hpp. The family's published tensor names, under PREFIX (e.g. "model.layers.3."):
//   kimi_linear, dayzero : block_sparse_moe.gate.weight [E, D], block_sparse_moe.gate.e_score_correction_bias [E],
//                          block_sparse_moe.experts.{e}.w1|w3|w2.weight (gate [I, D] | up [I, D] | down [D, I]),
//                          block_sparse_moe.shared_experts.gate_proj|up_proj|down_proj.weight
//   deepseek_v32         : mlp.gate.weight, mlp.gate.e_score_correction_bias,
//                          mlp.experts.{e}.gate_proj|up_proj|down_proj.weight, mlp.shared_experts.*_proj.weight
//   qwen3_next           : mlp.gate.weight, mlp.experts.{e}.*_proj.weight, mlp.shared_expert.*_proj.weight,
//                          mlp.shared_expert_gate.weight [1, D]
// A real checkpoint may instead hold the transformers v5 layout: BASE.experts.gate_up_proj [E, 2I, D]
// (gate rows first, then up) and BASE.experts.down_proj [E, D, I], and BASE may be "mlp." for a kimi
// model. The layout is picked by which names exist; generating mode writes the published layout.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <tuple>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "model/module.hpp"
#include "ops/moe.hpp"

namespace dz {

namespace {

enum class ExpertLayout { PerExpertW, PerExpertProj, Fused };

struct MoeNames {
  std::string base;    // "block_sparse_moe.", "mlp." or "ffn." (after PREFIX)
  ExpertLayout layout = ExpertLayout::PerExpertProj;
  std::string shared;  // "shared_experts." or "shared_expert."
  bool shared_w = false;  // the shared expert as w1 / w3 / w2 (DeepSeek-V4) instead of *_proj
  std::string bias;    // full name of the correction bias
};

MoeNames published_names(Family f) {
  MoeNames n;
  switch (f) {
    case Family::KimiLinear:
    case Family::Dayzero:
      n.base = "block_sparse_moe.";
      n.layout = ExpertLayout::PerExpertW;
      n.shared = "shared_experts.";
      break;
    case Family::DeepseekV32:
    case Family::Glm5Next:  // GLM-5.3-Flash publishes DeepSeek's names
      n.base = "mlp.";
      n.shared = "shared_experts.";
      break;
    case Family::Qwen3Next:
      n.base = "mlp.";
      n.shared = "shared_expert.";
      break;
    case Family::DeepseekV4:  // DeepSeek's own names: ffn.gate.{weight,bias,tid2eid}, w1 / w3 / w2
      n.base = "ffn.";
      n.layout = ExpertLayout::PerExpertW;
      n.shared = "shared_experts.";
      n.shared_w = true;
      break;
  }
  return n;
}

MoeNames find_names(const ModelConfig& cfg, int layer, const Checkpoint& ck, const std::string& prefix) {
  MoeNames n = published_names(cfg.family);
  n.bias = prefix + n.base + (cfg.family == Family::DeepseekV4 ? "gate.bias" : "gate.e_score_correction_bias");
  if (ck.generating()) return n;

  const std::string other = n.base == "mlp." ? "block_sparse_moe." : "mlp.";
  if (!ck.has(prefix + n.base + "gate.weight")) {
    DZ_CHECK(ck.has(prefix + other + "gate.weight"), "layer ", layer, ": missing MoE router tensor ", prefix, n.base,
             "gate.weight (nor ", prefix, other, "gate.weight) in ", ck.dir());
    n.base = other;
  }
  const std::string P = prefix + n.base;
  if (ck.has(P + "experts.gate_up_proj"))
    n.layout = ExpertLayout::Fused;
  else if (ck.has(P + "experts.0.w1.weight"))
    n.layout = ExpertLayout::PerExpertW;
  else if (ck.has(P + "experts.0.gate_proj.weight"))
    n.layout = ExpertLayout::PerExpertProj;
  else
    fail(str("layer ", layer, ": no routed expert tensors under ", P, "experts. (looked for experts.gate_up_proj, ",
             "experts.0.w1.weight, experts.0.gate_proj.weight) in ", ck.dir()));
  n.shared_w = false;
  if (ck.has(P + "shared_experts.gate_proj.weight"))
    n.shared = "shared_experts.";
  else if (ck.has(P + "shared_expert.gate_proj.weight"))
    n.shared = "shared_expert.";
  else if (ck.has(P + "shared_experts.w1.weight"))
    n.shared = "shared_experts.", n.shared_w = true;
  n.bias = P + "gate.e_score_correction_bias";
  if (!ck.has(n.bias) && ck.has(P + "e_score_correction_bias")) n.bias = P + "e_score_correction_bias";
  if (!ck.has(n.bias) && ck.has(P + "gate.bias")) n.bias = P + "gate.bias";  // DeepSeek-V4's published name
  return n;
}

class MoeFfn : public Ffn {
 public:
  void forward(const DTensor& x, const DTensor& out) const override {
    DZ_CHECK(tid2eid_.empty(), "MoE: a hash-routed layer needs its token ids (forward_tokens)");
    run(x, DTensor{}, out, false);
  }
  // Hash routing (DeepSeek-V4 hash_moe): row t takes the experts tid2eid[tokens[t]].
  void forward_tokens(const DTensor& x, const int32_t* tokens, const DTensor& out) const override {
    run(x, hash_ids(x.rows(), tokens), out, false);
  }
  void forward_cp_rows(const DTensor& x, const int32_t* tokens, const DTensor& out) const override {
    run(x, hash_ids(x.rows(), tokens), out, true);
  }
  DTensor hash_ids(int64_t T, const int32_t* tokens) const {
    if (tid2eid_.empty() || T == 0) return DTensor{};
    const int64_t k = rc_.top_k;
    DZ_CHECK(tokens, "MoE: a hash-routed layer needs its token ids");
    std::vector<int32_t> ids(static_cast<size_t>(T * k));
    for (int64_t t = 0; t < T; ++t) {
      DZ_CHECK(tokens[t] >= 0 && tokens[t] < int64_t(tid2eid_.size()) / k, "MoE hash routing: token id ", tokens[t],
               " outside gate.tid2eid's ", int64_t(tid2eid_.size()) / k, " rows");
      std::copy_n(tid2eid_.data() + int64_t(tokens[t]) * k, k, ids.data() + t * k);
    }
    return be_->upload_i32(ids.data(), {T, k});
  }
  // fixed: hash routing's experts [T, top_k] or undefined; cp_rows: inside forward_cp.
  void run(const DTensor& x, const DTensor& fixed, const DTensor& out, bool cp_rows) const {
    if (L_ > 0) {
      DZ_CHECK(!fixed.defined(), "MoE: hash routing with a latent MoE");
      return forward_latent(x, out, cp_rows);
    }
    MoeWeights w = w_;
    w.fixed = fixed;
    routed(w, x, out, cp_rows);
    tp_.allreduce(*be_, out);  // width shards (or expert shards): partial sums of every expert
  }
  // out = this rank's share of the routed (+ shared) sum of xe's rows, which the layer's TP
  // all-reduce completes. Without expert parallelism: every expert's width shard. With it
  // (EpShard): this rank's experts on its rows, plus, when the CP members' rows differ, the results
  // of its rows' pairs for the experts of the other members' ranks of this TP index (all-to-all out
  // and back); when they are the same rows, the members' sums added over `peers`.
  void routed(MoeWeights w, const DTensor& xe, const DTensor& out, bool cp_rows) const {
    Backend& be = *be_;
    const EpShard& ep = tp_.ep;
    if (ep.members == 1 || !cp_rows) {
      if (ep.members > 1 && ep.member != 0) w.has_shared = false;  // the members' sum adds it once
      be.moe(rc_, w, xe, out);
      if (ep.members > 1) be.allreduce_sum(ep.peers, out);
      return;
    }
    const int64_t T = xe.rows(), k = rc_.top_k, DX = DX_, per = rc_.n_experts / ep.size;
    DTensor idx = be.alloc({T, k}, DType::I32), wt = be.alloc({T, k}, DType::F32);
    if (T > 0) be.moe_route(rc_, w, xe, idx, wt);
    w.fixed = idx, w.fixed_wt = wt;
    // The pairs (row, expert) whose expert another member's rank of this TP index holds: their
    // expert ids and weights through the host (8 bytes a pair), their rows on the backend's buffers,
    // started before this rank's own experts run so that the dispatch travels beside them.
    std::vector<int32_t> ids(static_cast<size_t>(T * k));
    std::vector<float> wts(static_cast<size_t>(T * k));
    if (T > 0) be.download_i32(idx, ids.data()), be.download(wt, wts.data());
    const size_t M = size_t(ep.members);
    std::vector<std::vector<char>> meta(M);          // per member: (expert, weight) of each pair sent
    std::vector<std::vector<int64_t>> rows_to(M);    // which local row each pair sent there was
    for (int64_t a = 0; a < T * k; ++a) {
      const int owner = ids[size_t(a)] / int(per), m = owner / tp_.size;
      if (owner % tp_.size != tp_.rank || m == ep.member) continue;  // computed where the row is already
      std::vector<char>& b = meta[size_t(m)];
      const size_t o = b.size();
      b.resize(o + 8);
      std::memcpy(&b[o], &ids[size_t(a)], 4);
      std::memcpy(&b[o + 4], &wts[size_t(a)], 4);
      rows_to[size_t(m)].push_back(a / k);
    }
    const std::vector<std::vector<char>> got = ep.peers->alltoallv_bytes(meta);
    std::vector<int64_t> send_rows(M), recv_rows(M);
    std::vector<Backend::RowCopy> pick;  // the rows to send, member by member
    int64_t ns = 0, n = 0;
    for (size_t m = 0; m < M; ++m) {
      send_rows[m] = int64_t(rows_to[m].size());
      recv_rows[m] = int64_t(got[m].size() / 8);
      n += recv_rows[m];
      for (int64_t r : rows_to[m]) pick.push_back({xe, r, DTensor{}, ns++, 1});
    }
    DTensor xa = xe;  // the rows as the experts take them (act)
    if (xe.dtype != be.act_dtype()) {
      xa = be.act({T, DX});
      be.convert(xe, xa);
    }
    DTensor xs = be.act({ns, DX});
    for (Backend::RowCopy& c : pick) c.src = xa, c.dst = xs;
    be.copy_rows_many(pick);
    std::unique_ptr<PendingRows> dispatch = exchange_start(xs, send_rows, recv_rows);
    be.moe(rc_, w, xe, out);  // this rank's experts (+ its shared-expert shard) on its rows
    const DTensor rx = dispatch->wait();  // [n, DX] the pairs for this rank's experts
    // Their pairs for this rank's experts, weighted here (top_k 1 per record).
    DTensor yr = be.act({n, DX});
    if (n > 0) {
      std::vector<int32_t> rid(static_cast<size_t>(n));
      std::vector<float> rw(static_cast<size_t>(n));
      int64_t i = 0;
      for (const auto& g : got)
        for (size_t o = 0; o < g.size(); o += 8, ++i) {
          std::memcpy(&rid[size_t(i)], &g[o], 4);
          std::memcpy(&rw[size_t(i)], &g[o + 4], 4);
        }
      MoeWeights wr = w_;
      wr.has_shared = false;
      wr.route_x = DTensor{};
      wr.fixed = be.upload_i32(rid.data(), {n, 1});
      wr.fixed_wt = be.upload(rw.data(), {n, 1}, DType::F32);
      RouterConfig r1 = rc_;
      r1.top_k = 1;
      be.moe(r1, wr, rx, yr);
    }
    const DTensor back = exchange_start(yr, recv_rows, send_rows)->wait();  // [ns, DX]: the results of the pairs sent
    // out += the other members' results, summed per row in fp32 in member order, then pair order:
    // round j adds each row's j-th result (rows with fewer add zeros, which changes no sum).
    std::vector<std::vector<int64_t>> of_row(static_cast<size_t>(T));
    int64_t at = 0;
    for (size_t m = 0; m < M; ++m)
      for (int64_t r : rows_to[m]) of_row[size_t(r)].push_back(at++);
    size_t rounds = 0;
    for (const auto& v : of_row) rounds = std::max(rounds, v.size());
    if (rounds == 0) return;
    DTensor acc = be.zeros({T, DX}, DType::F32), g = be.act({T, DX});
    for (size_t j = 0; j < rounds; ++j) {
      be.fill_zero(g);
      std::vector<Backend::RowCopy> put;
      for (int64_t t = 0; t < T; ++t)
        if (of_row[size_t(t)].size() > j) put.push_back({back, of_row[size_t(t)][j], g, t, 1});
      be.copy_rows_many(put);
      be.add(acc, g);
    }
    be.add(out, acc);
  }
  // Backend::alltoall_rows_start over the EP peers (their DeviceComm when the job made one): send
  // must stay unchanged until wait().
  std::unique_ptr<PendingRows> exchange_start(const DTensor& send, const std::vector<int64_t>& send_rows,
                                              const std::vector<int64_t>& recv_rows) const {
    const EpShard& ep = tp_.ep;
    if (ep.dev) return ep.dev->alltoall_rows_start(send, send_rows, recv_rows);
    return be_->alltoall_rows_start(ep.peers, send, send_rows, recv_rows);
  }
  // The latent MoE. Under TP the experts' width shards give partial sums of u, all-reduced before
  // the norm (it needs the whole of u); up then takes this rank's latent columns [l0, l1), so
  // its product is a partial sum of the output that the one all-reduce of the layer completes
  // together with the width-sharded shared experts.
  void forward_latent(const DTensor& x, const DTensor& out, bool cp_rows) const {
    Backend& be = *be_;
    const int64_t T = x.rows();
    DTensor xl = be.act({T, L_}), u = be.act({T, L_});
    be.linear(x, lat_down_, DTensor{}, xl);
    MoeWeights w = w_;
    w.route_x = x;
    w.has_shared = false;
    routed(w, xl, u, cp_rows);
    tp_.allreduce(be, u);
    if (lat_norm_.defined()) be.rmsnorm(u, lat_norm_, u, lat_eps_, false);
    if (l1_ - l0_ == L_) {
      be.linear(u, lat_up_, DTensor{}, out);
    } else {
      DTensor us = be.act({T, l1_ - l0_});
      be.copy_cols(u, l0_, us, 0, l1_ - l0_);
      be.linear(us, lat_up_, DTensor{}, out);
    }
    if (w_.has_shared) {
      DTensor sh = be.act({T, D_});
      be.swiglu_mlp(x, w_.shared, sh);
      be.add(out, sh);
    }
    tp_.allreduce(be, out);
  }
  bool needs_tokens() const override { return !tid2eid_.empty(); }
  int64_t hidden() const override { return D_; }
  bool graph_safe() const override { return tp_.size == 1 && tp_.ep.size == 1 && tid2eid_.empty(); }
  std::vector<int32_t> tid2eid_;  // [vocab, top_k] (hash_moe), else empty

  // Uploads the (sharded) host views: experts stacked [E, I, DX] / [E, DX, I] (DX: the experts'
  // input, D or the latent); mx: every one of them is MXFP4 (the backend may keep it so).
  void upload_experts(const std::vector<SwigluView>& ex, bool mx) {
    const int64_t E = int64_t(ex.size()), I = ex[0].inter, D = DX_;
    Tensor g({E, I, D}), u({E, I, D}), d({E, D, I});
    g.mxfp4 = u.mxfp4 = d.mxfp4 = mx;
    for (int64_t e = 0; e < E; ++e) {
      const SwigluView& v = ex[size_t(e)];
      std::copy(v.gate, v.gate + I * D, g.ptr() + e * I * D);
      std::copy(v.up, v.up + I * D, u.ptr() + e * I * D);
      for (int64_t r = 0; r < D; ++r) std::copy(v.down + r * v.down_ld, v.down + r * v.down_ld + I, d.ptr() + (e * D + r) * I);
    }
    w_.experts = {be_->weight(g), be_->weight(u), be_->weight(d), GluAct{}};  // act: set by make_moe_ffn
  }
  // --dummy-weights: the routed experts' shards generated in place on the backend (the bulk of a
  // MoE model: no host copy of them ever exists), equal to the same slices of the host-made tensors.
  // keys[e]: gate, up, down of expert e (Checkpoint::dummy_key).
  void dummy_experts(const std::vector<std::array<uint64_t, 3>>& keys, int64_t I, const TpShard& tp, bool mx) {
    const int64_t D = DX_, E = int64_t(keys.size());
    auto [i0, i1] = tp.range(I, "moe_intermediate_size");
    const int64_t n = i1 - i0;
    const DummyDist dist{false, Init{}.a, 0.f};  // the experts' Init: Normal(0.02)
    if (mx && D % 32 == 0 && I % 32 == 0 && i0 % 32 == 0 && n % 32 == 0) {
      // MXFP4 (a quantization_config declares it): the dummy values rounded to MXFP4, as a 4-bit stack
      std::vector<uint64_t> kg(static_cast<size_t>(E)), ku(static_cast<size_t>(E)), kd(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) kg[size_t(e)] = keys[size_t(e)][0], ku[size_t(e)] = keys[size_t(e)][1], kd[size_t(e)] = keys[size_t(e)][2];
      w_.experts = {be_->dummy_mx4_experts(kg, n, D, dist, D, i0, 0), be_->dummy_mx4_experts(ku, n, D, dist, D, i0, 0),
                    be_->dummy_mx4_experts(kd, D, n, dist, I, 0, i0), GluAct{}};
      return;
    }
    DTensor g = be_->alloc({E, n, D}, be_->weight_dtype()), u = be_->alloc({E, n, D}, be_->weight_dtype()),
            d = be_->alloc({E, D, n}, be_->weight_dtype());
    for (int64_t e = 0; e < E; ++e) {
      be_->fill_dummy(g.slab(e, e + 1).reshaped({n, D}), keys[size_t(e)][0], dist, D, i0, 0);
      be_->fill_dummy(u.slab(e, e + 1).reshaped({n, D}), keys[size_t(e)][1], dist, D, i0, 0);
      be_->fill_dummy(d.slab(e, e + 1).reshaped({D, n}), keys[size_t(e)][2], dist, I, 0, i0);
    }
    w_.experts = {g, u, d, GluAct{}};
  }
  void upload_rest(const SwigluView* shared, const Tensor& router, const Tensor& bias, const Tensor& shared_gate) {
    const int64_t D = D_;
    w_.router = be_->param(router);
    if (!bias.empty()) w_.bias = be_->param(bias);
    if (shared) {
      const int64_t S = shared->inter;
      Tensor sg({S, D}), su({S, D}), sd({D, S});
      std::copy(shared->gate, shared->gate + S * D, sg.ptr());
      std::copy(shared->up, shared->up + S * D, su.ptr());
      for (int64_t r = 0; r < D; ++r)
        std::copy(shared->down + r * shared->down_ld, shared->down + r * shared->down_ld + S, sd.ptr() + r * S);
      w_.has_shared = true;
      w_.shared = {be_->weight(sg), be_->weight(su), be_->weight(sd), GluAct{}};
      if (!shared_gate.empty()) w_.shared_gate = be_->param(shared_gate);
    }
  }

  Backend* be_ = nullptr;
  RouterConfig rc_;
  int64_t D_ = 0;   // hidden size
  int64_t DX_ = 0;  // the routed experts' input: D, or the latent L
  TpShard tp_;
  MoeWeights w_;
  // latent MoE (L_ > 0): down [L, D] (replicated), norm [L] F32 (or none), up [D, l1 - l0] (this
  // rank's latent columns)
  int64_t L_ = 0, l0_ = 0, l1_ = 0;
  float lat_eps_ = 1e-6f;
  DTensor lat_down_, lat_norm_, lat_up_;
};

SwigluView view_of(const Tensor& g, const Tensor& u, const Tensor& d) {
  SwigluView v;
  v.gate = g.ptr();
  v.up = u.ptr();
  v.down = d.ptr();
  v.inter = g.dim(0);
  v.down_ld = v.inter;
  return v;
}

}  // namespace

// TP: every routed expert and the shared expert are width-sharded (rows of gate/up, columns of
// down); the router is replicated. Width sharding keeps the work per rank equal whatever the
// routing (expert sharding would follow the router's load imbalance); one all-reduce per layer.
static void shard_width(std::vector<SwigluView>& views, std::vector<Tensor>& store, int64_t D, const TpShard& tp) {
  for (SwigluView& v : views) {
    auto [i0, i1] = tp.range(v.inter, "moe_intermediate_size");
    const int64_t n = i1 - i0;
    Tensor g({n, D}), u({n, D}), d({D, n});
    std::copy(v.gate + i0 * D, v.gate + i1 * D, g.ptr());
    std::copy(v.up + i0 * D, v.up + i1 * D, u.ptr());
    for (int64_t r = 0; r < D; ++r) std::copy(v.down + r * v.down_ld + i0, v.down + r * v.down_ld + i1, d.ptr() + r * n);
    store.push_back(std::move(g));
    store.push_back(std::move(u));
    store.push_back(std::move(d));
    const size_t o = store.size() - 3;
    v = SwigluView{store[o].ptr(), store[o + 1].ptr(), store[o + 2].ptr(), n, n, GluAct{}};
  }
}

std::unique_ptr<Ffn> make_moe_ffn(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                  const TpShard& tp, Backend& be) {
  const GluAct act = glu_of(cfg, layer);
  const int64_t D = cfg.hidden_size, E = cfg.n_routed_experts, I = cfg.moe_intermediate_size;
  const int64_t L = cfg.moe_latent_size, DX = L > 0 ? L : D;  // the routed experts' input width
  DZ_CHECK(D > 0 && E > 0 && I > 0, "layer ", layer, ": MoE needs hidden_size, n_routed_experts and ",
           "moe_intermediate_size > 0");
  auto m = std::make_unique<MoeFfn>();
  m->be_ = &be;
  m->D_ = D;
  m->DX_ = DX;
  RouterConfig& rc = m->rc_;
  rc.n_experts = E;
  rc.top_k = cfg.num_experts_per_tok;
  rc.score_func = cfg.score_func;
  rc.norm_topk_prob = cfg.norm_topk_prob;
  rc.routed_scaling_factor = cfg.routed_scaling_factor;
  rc.n_group = std::max<int64_t>(cfg.n_group, 1);
  rc.topk_group = std::max<int64_t>(cfg.topk_group, 1);
  // DeepSeek's inference code scores groups by their best expert when there is no correction bias
  // and by the sum of the best two otherwise; transformers and Kimi always have the bias.
  rc.group_score = cfg.router_correction_bias ? GroupScore::Top2Sum : GroupScore::Max;
  try {
    rc.validate();
  } catch (const Error& e) {
    fail(str("layer ", layer, ": ", e.what()));
  }

  const MoeNames n = find_names(cfg, layer, ck, prefix);
  const std::string P = prefix + n.base;
  const Tensor router = ck.get(P + "gate.weight", {E, D});
  Tensor bias, shared_gate;
  // (module tests build an FFN from a config without a layer list)
  const bool hash = layer >= 0 && size_t(layer) < cfg.layers.size() && cfg.layers[size_t(layer)].hash_moe;
  if (hash) {  // a fixed token -> experts table, ids as stored (I64)
    const int64_t V = cfg.vocab_size, k = cfg.num_experts_per_tok;
    const Tensor t = ck.get(P + "gate.tid2eid", {V, k}, Init::uniform(0.f, float(E) - 0.5f));
    m->tid2eid_.resize(size_t(V * k));
    for (int64_t i = 0; i < V * k && !t.empty(); ++i) {
      const float v = std::floor(t.ptr()[i]);
      DZ_CHECK(v >= 0.f && v < float(E), "layer ", layer, ": ", P, "gate.tid2eid holds expert ", t.ptr()[i], " (0..",
               E - 1, ")");
      m->tid2eid_[size_t(i)] = int32_t(v);
    }
    if (t.empty()) m->tid2eid_.assign(size_t(V * k), 0);  // a dry run: shapes only
  }
  // (a hash-routed layer selects nothing: no correction bias)
  if (cfg.router_correction_bias && !hash)
    bias = ck.get(n.bias, {E}, Init::uniform(-0.05f, 0.05f));

  // Expert parallelism: this rank's experts [e0, e0 + El), whole; otherwise all, width-sharded.
  const EpShard ep = ck.keeps_full() ? EpShard{} : tp.ep;
  int64_t e0 = 0, El = E;
  if (ep.size > 1) {
    DZ_CHECK(E % ep.size == 0, "layer ", layer, ": n_routed_experts (", E, ") is not divisible by --ep ", ep.size);
    El = E / ep.size;
    e0 = int64_t(ep.member * tp.size + tp.rank) * El;
  }
  std::vector<SwigluView> experts(static_cast<size_t>(El));
  std::vector<Tensor> owned;
  owned.reserve(size_t(3 * E + 3));  // views point into these tensors: no reallocation
  std::vector<std::array<uint64_t, 3>> dummy_keys;  // --dummy-weights: per expert gate, up, down
  bool experts_mx = false;  // every routed expert loaded from MXFP4 (per-expert files only)
  SwigluView shared;
  bool has_shared = false;
  if (n.layout == ExpertLayout::Fused) {
    owned.push_back(ck.get(P + "experts.gate_up_proj", {E, 2 * I, DX}));
    owned.push_back(ck.get(P + "experts.down_proj", {E, DX, I}));
    const float* gu = owned[0].ptr();
    const float* dn = owned[1].ptr();
    for (int64_t e = e0; e < e0 + El; ++e) {
      SwigluView& v = experts[size_t(e - e0)];
      v.gate = gu + e * 2 * I * DX;  // rows [0, I) of expert e: gate
      v.up = v.gate + I * DX;        // rows [I, 2I): up
      v.down = dn + e * DX * I;
      v.inter = I;
      v.down_ld = I;
    }
  } else if (ck.dummy()) {  // named here (a dry run stops before the upload), generated in place below
    const bool w = n.layout == ExpertLayout::PerExpertW;
    for (int64_t e = e0; e < e0 + El; ++e) {
      const std::string q = P + "experts." + std::to_string(e) + ".";
      dummy_keys.push_back({ck.dummy_key(q + (w ? "w1.weight" : "gate_proj.weight"), {I, DX}),
                            ck.dummy_key(q + (w ? "w3.weight" : "up_proj.weight"), {I, DX}),
                            ck.dummy_key(q + (w ? "w2.weight" : "down_proj.weight"), {DX, I})});
    }
  } else {
    const bool w = n.layout == ExpertLayout::PerExpertW;
    experts_mx = true;  // (generated tensors are never MXFP4)
    for (int64_t e = 0; e < E; ++e)  // expert parallelism: the other ranks' experts, known and not read
      if ((e < e0 || e >= e0 + El) && !ck.generating()) ck.skip_prefix(P + "experts." + std::to_string(e) + ".");
    for (int64_t e = e0; e < e0 + El; ++e) {
      const std::string q = P + "experts." + std::to_string(e) + ".";
      owned.push_back(ck.get(q + (w ? "w1.weight" : "gate_proj.weight"), {I, DX}));
      owned.push_back(ck.get(q + (w ? "w3.weight" : "up_proj.weight"), {I, DX}));
      owned.push_back(ck.get(q + (w ? "w2.weight" : "down_proj.weight"), {DX, I}));
      const size_t o = owned.size() - 3;
      experts[size_t(e - e0)] = view_of(owned[o], owned[o + 1], owned[o + 2]);
      experts_mx &= owned[o].mxfp4 && owned[o + 1].mxfp4 && owned[o + 2].mxfp4;
    }
  }

  const int64_t S = cfg.shared_intermediate_size > 0 ? cfg.shared_intermediate_size
                                                      : cfg.n_shared_experts * cfg.moe_intermediate_size;
  if (S > 0) {
    const std::string q = P + n.shared;
    owned.push_back(ck.get(q + (n.shared_w ? "w1.weight" : "gate_proj.weight"), {S, D}));
    owned.push_back(ck.get(q + (n.shared_w ? "w3.weight" : "up_proj.weight"), {S, D}));
    owned.push_back(ck.get(q + (n.shared_w ? "w2.weight" : "down_proj.weight"), {D, S}));
    const size_t o = owned.size() - 3;
    shared = view_of(owned[o], owned[o + 1], owned[o + 2]);
    has_shared = true;
    if (cfg.shared_expert_gate) shared_gate = ck.get(P + "shared_expert_gate.weight", {1, D});
  } else {
    DZ_CHECK(!cfg.shared_expert_gate, "layer ", layer, ": shared_expert_gate set without a shared expert");
  }
  m->tp_ = ck.keeps_full() ? TpShard{} : tp;  // make-model keeps full widths
  if (tp.size > 1 && !ck.keeps_full()) {
    std::vector<Tensor> sharded;
    sharded.reserve(size_t(3 * E + 3));
    if (ep.size == 1) {  // (expert parallelism keeps its experts whole)
      if (!ck.dummy()) shard_width(experts, sharded, DX, tp);
      // the down projections' columns [i0, i1): whole MXFP4 groups only, else they are BF16 values
      auto [i0, i1] = tp.range(I, "moe_intermediate_size");
      experts_mx &= i0 % 32 == 0 && (i1 - i0) % 32 == 0;
    } else if (n.layout == ExpertLayout::Fused) {  // own this rank's experts, not views of the whole stack
      for (SwigluView& v : experts) {
        Tensor g({I, DX}), u({I, DX}), d({DX, I});
        std::copy(v.gate, v.gate + I * DX, g.ptr());
        std::copy(v.up, v.up + I * DX, u.ptr());
        std::copy(v.down, v.down + DX * I, d.ptr());
        sharded.push_back(std::move(g)), sharded.push_back(std::move(u)), sharded.push_back(std::move(d));
        v = view_of(sharded[sharded.size() - 3], sharded[sharded.size() - 2], sharded[sharded.size() - 1]);
      }
    } else {
      sharded = std::move(owned);  // (the per-expert tensors of this rank's experts only)
      owned.clear();
    }
    if (has_shared) {
      std::vector<SwigluView> one{shared};
      shard_width(one, sharded, D, tp);
      shared = one[0];
    }
    owned = std::move(sharded);  // the full weights are released; views point into the shards
  }
  // Latent MoE: down and the norm replicated, up's latent columns sharded under TP.
  Tensor lat_down, lat_norm, lat_up;
  if (L > 0) {
    DZ_CHECK(!hash, "layer ", layer, ": a hash-routed layer with a latent MoE");
    lat_down = ck.get(P + "routed_expert_down_proj.weight", {L, D});
    if (cfg.moe_latent_norm) lat_norm = ck.get(P + "routed_expert_norm.weight", {L}, Init::ones());
    lat_up = ck.get(P + "routed_expert_up_proj.weight", {D, L});
    m->L_ = L, m->l0_ = 0, m->l1_ = L;
    if (tp.size > 1 && !ck.keeps_full()) {
      std::tie(m->l0_, m->l1_) = tp.range(L, "routed_expert_hidden_size");
      lat_up = slice_cols(lat_up, m->l0_, m->l1_);
    }
    m->lat_eps_ = cfg.rms_norm_eps;
  }
  if (router.empty()) return m;  // dry run (inspect): names and shapes only
  if (ck.dummy())
    m->dummy_experts(dummy_keys, I, ep.size > 1 ? TpShard{} : tp, cfg.weights_mxfp4);
  else
    m->upload_experts(experts, experts_mx);
  m->upload_rest(has_shared ? &shared : nullptr, router, bias, shared_gate);
  m->w_.e0 = e0;
  m->w_.experts.act = m->w_.shared.act = act;  // SiLU, GLM-5.3-Flash's clamp, K3's SiTU
  if (L > 0) {
    m->lat_down_ = be.weight(lat_down);
    if (!lat_norm.empty()) m->lat_norm_ = be.param(lat_norm);
    m->lat_up_ = be.weight(lat_up);
  }
  return m;
}

}  // namespace dz
