// DeepSeek-V4 token mixer (docs/families.md §7; transformers 5.23 DeepseekV4Attention with its
// compressors and indexer). Per token, x = the layer's normed input:
//   qr = RMSNorm(wq_a x) (q_norm);  q = wq_b qr as [H, D], each head RMS-normalised (no weight),
//   RoPE (interleaved) on its trailing rd dims;  kv = RoPE(RMSNorm(wkv x)) [D]: one shared row,
//   used as key and value.
//   Compressed entries (CSA / HCA layers): per closed window of m tokens a per-channel softmax over
//   (gate + ape) pools the compressor's projections, then RMSNorm and RoPE at the window's first
//   position (CSA pools 2m slots: the previous window's first halves and its own second halves).
//   CSA's indexer runs the same compressor at index_head_dim and keeps each query's index_topk
//   best closed entries (Σ_h w_h relu(q_h · k_e)); HCA attends to every closed entry.
//   o = Σ p · row over the window rows (t - W, t] and the entries, with a per-head sink logit in
//   the softmax; the rope dims of o are rotated back (RoPE at -position); heads in o_groups groups
//   each projected by its rows of wo_a to o_lora_rank, then wo_b.
// State: every token's kv row (the window reads the last W; kept whole for now), the entries, and
// the compressor projections of the rows a later window still needs.
// Tensor parallelism: the attention is replicated on every rank (as transformers' TP plan keeps
// it: one shared KV head).
// Context parallelism (forward_cp): each rank projects its own rows (kv rows and q at their global
// positions, the compressors' per-token projections, which depend on the token alone); the rows
// [kv | compressor | indexer compressor] of every rank are all-gathered in the CP group and put in
// sequence order, so every rank pools the same entries from the same projections as one rank would
// (bitwise on the CPU) and holds the whole document's state for decode; then each rank selects
// (CSA) and attends for its own queries, whose window and visible entries are positional.
#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.hpp"
#include "model/attn_cache.hpp"
#include "model/module.hpp"
#include "model/work_model.hpp"
#include "ops/rope.hpp"

namespace dz {

namespace {

struct Dsv4State : MixerState {
  RowStore raw;           // [pos, D]: every token's key-value row (normed, rotated)
  RowStore comp, icomp;   // compressed entries [NC, D] and the indexer's [NC, Di]
  RowStore pend, ipend;   // compressor projections not yet pooled (Compressor::pending_start ..)
  DTensor last_sel;  // CSA: the indexer's entry ids of the last forward call [T, K] (on sel_be)
  Backend* sel_be = nullptr;
  bool topk_sets(std::vector<int32_t>& sel, int64_t& width) const override {
    if (!last_sel.defined()) return false;
    width = last_sel.cols();
    sel.assign(size_t(last_sel.numel()), -1);
    if (!sel.empty()) sel_be->download_i32(last_sel, sel.data());
    return true;
  }
  std::unique_ptr<MixerState> clone() const override {
    auto s = std::make_unique<Dsv4State>();
    s->pos = pos;
    s->raw = raw.deep_copy();
    s->comp = comp.deep_copy();
    s->icomp = icomp.deep_copy();
    s->pend = pend.deep_copy();
    s->ipend = ipend.deep_copy();
    s->last_sel = last_sel, s->sel_be = sel_be;  // never written after the call that made it
    return s;
  }
  // The state before a verify forward, without copying a row: every store only appends (rows past
  // n, into the same buffer or a grown copy) and the compressor's trim of pend makes a new store, so
  // rows [0, n) of each buffer stay as they were; undoing sets the stores back (O(1), where a clone
  // copied the whole window and every compressed entry of every layer at every step).
  std::unique_ptr<Dsv4State> snapshot() const {
    auto s = std::make_unique<Dsv4State>();
    s->pos = pos;
    s->raw = raw, s->comp = comp, s->icomp = icomp, s->pend = pend, s->ipend = ipend;
    s->last_sel = last_sel, s->sel_be = sel_be;
    return s;
  }
};

// A verify forward's undo record (Dsv4Mixer::spec_begin): the compressors' pending rows and pooled
// entries do not cut at a row, so undoing is the state before the verify forward (a snapshot of
// the stores' row counts) forwarded again over the kept rows (the recorded mixer input). Several
// forwards between spec_begin and spec_keep (the MTP layer's chained drafts) append their rows.
struct Dsv4Spec : SpecRecord {
  std::unique_ptr<MixerState> before;
  std::vector<DTensor> xs;  // each forward's input rows (copies)
  int64_t rows = 0;
};

// One compressor: rate m, entry width Dc; overlap (CSA): 2m slots per entry.
struct Compressor {
  int64_t m = 0, Dc = 0, rd = 0;
  bool overlap = false;
  float eps = 1e-6f;
  DTensor w;      // projection weight: rows [value | gate] (HCA) or [value_a | gate_a | value_b | gate_b] (CSA)
  DTensor ape2;   // CSA: [2m, Dc] = [ape[:, :Dc]; ape[:, Dc:]] (window w-1's slots, then window w's)
  DTensor ape1;   // [m, Dc]: HCA's ape; CSA's second halves (window 0 pools its own slots only)
  DTensor norm;   // [Dc]
  std::unique_ptr<Rope> rope;  // the compress RoPE strided by m: entry e sits at position e·m
  int64_t width() const { return (overlap ? 4 : 2) * Dc; }
  // First position of the rows a later window still reads, after nc entries: the last closed
  // window's (CSA pools it with the next) or the open window's (HCA).
  int64_t pending_start(int64_t nc) const { return overlap ? std::max<int64_t>(nc - 1, 0) * m : nc * m; }

  void load(Checkpoint& ck, const std::string& p, int64_t hid, int64_t rate, int64_t dc, bool ov, const RopeConfig& rc,
            int64_t rot, float e, Backend& be) {
    m = rate, Dc = dc, overlap = ov, rd = rot, eps = e;
    const int64_t cw = ov ? 2 : 1;
    const Tensor wkv = ck.get(p + "wkv.weight", {cw * Dc, hid}, Init::normal(0.02f));
    const Tensor wg = ck.get(p + "wgate.weight", {cw * Dc, hid}, Init::normal(0.02f));
    const Tensor ape = ck.get(p + "ape", {m, cw * Dc}, Init::normal(0.02f));
    const Tensor nw = ck.get(p + "norm.weight", {Dc}, Init::ones());
    rope = std::make_unique<Rope>(Rope(rc, rd).strided(m));
    if (wkv.empty()) return;  // dry run
    Tensor W({2 * cw * Dc, hid});
    auto put = [&](const Tensor& src, int64_t r0, int64_t dst) {
      std::copy_n(src.ptr() + r0 * hid, Dc * hid, W.ptr() + dst * Dc * hid);
    };
    if (ov) {  // [kv_a | gate_a | kv_b | gate_b]: the halves A (next window's) and B (own window's)
      put(wkv, 0, 0), put(wg, 0, 1), put(wkv, Dc, 2), put(wg, Dc, 3);
      Tensor a2({2 * m, Dc}), a1({m, Dc});
      for (int64_t j = 0; j < m; ++j)
        for (int64_t c = 0; c < Dc; ++c) {
          a2.ptr()[j * Dc + c] = ape.ptr()[j * 2 * Dc + c];
          a2.ptr()[(m + j) * Dc + c] = a1.ptr()[j * Dc + c] = ape.ptr()[j * 2 * Dc + Dc + c];
        }
      ape2 = be.param(a2);
      ape1 = be.param(a1);
    } else {
      put(wkv, 0, 0), put(wg, 0, 1);
      ape1 = be.param(ape);
    }
    w = be.weight(W);
    norm = be.param(nw);
  }

  // Appends proj [T, width()] (positions pos0 ..) to pend and the entries of the windows closed by
  // them to entries (entries nc .., [n, Dc], normed and rotated); drops the pending rows no later
  // window needs.
  void run(Backend& be, RowStore& pend, RowStore& entries, const DTensor& proj, int64_t pos0) const {
    DZ_CHECK(entries.width == Dc, "compressor: entries of width ", entries.width, ", not ", Dc);
    const int64_t nc = entries.rows();
    const int64_t T = proj.rows(), S = pos0 + T, closed = S / m, n = closed - nc, pend0 = pending_start(nc);
    DZ_CHECK(pend0 + pend.rows() == pos0, "compressor: pending rows end at ", pend0 + pend.rows(), ", not ", pos0);
    if (T > 0) be.copy_rows(proj, 0, pend.append(T), 0, T);
    if (n > 0) {
      const DTensor out = entries.append(n);  // pooled, normed and rotated in place
      const DTensor rows = pend.all();  // positions pend0 ..
      const int64_t W2 = 2 * Dc;
      if (!overlap) {
        be.pool_softmax(rows.slab(nc * m - pend0, closed * m - pend0), ape1, m, out);
      } else {
        int64_t e0 = 0;
        if (nc == 0) {  // window 0: its own second halves only
          DTensor b0 = be.act({m, W2});
          be.copy_cols(rows.slab(-pend0, m - pend0), W2, b0, 0, W2);
          be.pool_softmax(b0, ape1, m, out.slab(0, 1));
          e0 = 1;
        }
        const int64_t k = n - e0, wa = nc + e0;  // entries wa .. closed - 1 pool windows w - 1 and w
        if (k > 0) {
          DTensor a = be.act({k * m, W2}), b = be.act({k * m, W2}), slots = be.act({k, 4 * m * Dc});
          be.copy_cols(rows.slab((wa - 1) * m - pend0, (wa - 1 + k) * m - pend0), 0, a, 0, W2);
          be.copy_cols(rows.slab(wa * m - pend0, (wa + k) * m - pend0), W2, b, 0, W2);
          be.copy_cols(a.reshaped({k, m * W2}), 0, slots, 0, m * W2);
          be.copy_cols(b.reshaped({k, m * W2}), 0, slots, m * W2, m * W2);
          be.pool_softmax(slots.reshaped({k * 2 * m, W2}), ape2, 2 * m, out.slab(e0, n));
        }
      }
      be.rmsnorm(out, norm, out, eps, false);
      be.rope(*rope, out, 1, Dc, Dc - rd, nc);
    }
    const int64_t keep0 = pending_start(closed);
    if (keep0 > pend0) {
      RowStore kept;
      kept.init(be, pend.width, pend.dtype);
      const int64_t nk = pend0 + pend.rows() - keep0;
      if (nk > 0) be.copy_rows(pend.all(), keep0 - pend0, kept.append(nk), 0, nk);
      pend = std::move(kept);
    }
  }
};

class Dsv4Mixer : public Mixer {
 public:
  Dsv4Mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix, Backend& be)
      : be_(&be), cfg_(cfg), layer_(layer) {
    const LayerSpec& ls = cfg.layers[size_t(layer)];
    hid_ = cfg.hidden_size, H_ = cfg.num_heads, D_ = cfg.head_dim, QL_ = cfg.q_lora_rank, rd_ = cfg.qk_rope_head_dim;
    W_ = cfg.sliding_window, m_ = ls.compress_rate, indexed_ = ls.has_indexer;
    G_ = cfg.o_groups, R_ = cfg.o_lora_rank, eps_ = cfg.rms_norm_eps;
    Hi_ = cfg.index_n_heads, Di_ = cfg.index_head_dim, K_ = cfg.index_topk;
    DZ_CHECK(H_ > 0 && D_ > 0 && QL_ > 0 && rd_ > 0 && rd_ <= D_ && G_ > 0 && H_ % G_ == 0 && R_ > 0 && W_ > 0,
             prefix, ": bad DeepSeek-V4 attention dims (heads ", H_, ", head_dim ", D_, ", rope ", rd_, ", groups ", G_,
             ")");
    const std::string p = prefix + "attn.";
    const RopeConfig& rc = m_ > 0 ? cfg.rope_compress : cfg.rope;  // sliding layers: "main"
    rope_ = std::make_unique<Rope>(rc, rd_);
    rope_inv_ = std::make_unique<Rope>(rope_->inverse());
    const Tensor wq_a = ck.get(p + "wq_a.weight", {QL_, hid_}, Init::normal(0.02f));
    const Tensor q_norm = ck.get(p + "q_norm.weight", {QL_}, Init::ones());
    const Tensor wq_b = ck.get(p + "wq_b.weight", {H_ * D_, QL_}, Init::normal(0.02f));
    const Tensor wkv = ck.get(p + "wkv.weight", {D_, hid_}, Init::normal(0.02f));
    const Tensor kv_norm = ck.get(p + "norm.weight", {D_}, Init::ones());
    const Tensor wo_a = ck.get(p + "wo_a.weight", {G_ * R_, H_ * D_ / G_}, Init::normal(0.02f));
    const Tensor wo_b = ck.get(p + "wo_b.weight", {hid_, G_ * R_}, Init::normal(0.02f));
    const Tensor sinks = ck.get(p + "attn_sink", {H_}, Init::zeros());
    if (m_ > 0) comp_.load(ck, p + "compressor.", hid_, m_, D_, indexed_, cfg.rope_compress, rd_, eps_, be);
    Tensor iwq_b, iw;
    if (indexed_) {
      icomp_.load(ck, p + "indexer.compressor.", hid_, m_, Di_, true, cfg.rope_compress, rd_, eps_, be);
      iwq_b = ck.get(p + "indexer.wq_b.weight", {Hi_ * Di_, QL_}, Init::normal(0.02f));
      iw = ck.get(p + "indexer.weights_proj.weight", {Hi_, hid_}, Init::normal(0.02f));
    }
    if (wq_a.empty()) return;  // dry run (inspect): names and shapes only
    wq_a_ = be.weight(wq_a), q_norm_ = be.param(q_norm), wq_b_ = be.weight(wq_b);
    wkv_ = be.weight(wkv), kv_norm_ = be.param(kv_norm);
    wo_a_ = be.upload(wo_a, be.weight_dtype());  // head_matmul reads it per group (never FP8)
    wo_b_ = be.weight(wo_b);
    sinks_ = be.param(sinks);
    if (indexed_) iwq_b_ = be.weight(iwq_b), iw_ = be.weight(iw);
  }

  int64_t hidden() const override { return hid_; }
  std::unique_ptr<MixerState> make_state() const override {
    auto s = std::make_unique<Dsv4State>();
    s->raw.init(*be_, D_, be_->act_dtype());
    s->comp.init(*be_, D_, be_->act_dtype());
    s->icomp.init(*be_, Di_, be_->act_dtype());
    s->pend.init(*be_, comp_.width(), be_->act_dtype());
    s->ipend.init(*be_, icomp_.width(), be_->act_dtype());
    return s;
  }
  void spec_begin(MixerState& ms, SpecRestore, Copies*) const override {
    auto& st = static_cast<Dsv4State&>(ms);
    auto r = std::make_unique<Dsv4Spec>();
    r->before = st.snapshot();
    st.spec = std::move(r);
  }
  void spec_keep(MixerState& ms, int64_t keep, Copies*) const override {  // (its copies feed its re-forward)
    auto& st = static_cast<Dsv4State&>(ms);
    auto* r = dynamic_cast<Dsv4Spec*>(st.spec.get());
    DZ_CHECK(r && r->rows > 0, "DeepSeek-V4 mixer: spec_keep without spec_begin and a verify forward");
    const int64_t T = r->rows;
    DZ_CHECK(keep >= 1 && keep <= T && st.pos == r->before->pos + T, "DeepSeek-V4 mixer: keep ", keep,
             " of a verify forward of ", T, " rows");
    std::unique_ptr<SpecRecord> rec = std::move(st.spec);  // (r stays valid: owned by rec)
    if (keep < T) {
      auto& b = static_cast<Dsv4State&>(*r->before);
      st.pos = b.pos;
      st.raw = b.raw, st.comp = b.comp, st.icomp = b.icomp, st.pend = b.pend, st.ipend = b.ipend;
      st.last_sel = b.last_sel;
      DTensor x = be_->act({keep, hid_}), out = be_->act({keep, hid_});  // (outputs: from the verify forward)
      int64_t at = 0;
      for (const DTensor& xi : r->xs) {
        const int64_t n = std::min(xi.rows(), keep - at);
        if (n <= 0) break;
        be_->copy_rows(xi, 0, x, at, n);
        at += n;
      }
      forward(x, st, out);
    }
  }
  using Mixer::forward;
  void forward(const DTensor& x, MixerState& ms, const DTensor& out) const override {
    auto& st = static_cast<Dsv4State&>(ms);
    Backend& be = *be_;
    const int64_t T = x.rows(), pos0 = st.pos;
    if (auto* r = dynamic_cast<Dsv4Spec*>(st.spec.get())) {
      if (T) {
        DTensor c = be.act(x.shape);  // a copy: x is the model's pass buffer, the next layers write it
        be.copy_rows(x, 0, c, 0, T);
        r->xs.push_back(c);
        r->rows += T;
      }
    }
    if (T == 0) return;
    DTensor qr = be.act({T, QL_}), q = be.act({T, H_ * D_}), kv = be.act({T, D_});
    project(x, qr, q, kv);
    be.rope(*rope_, q, H_, D_, D_ - rd_, pos0);
    be.rope(*rope_, kv, 1, D_, D_ - rd_, pos0);
    be.copy_rows(kv, 0, st.raw.append(T), 0, T);

    DTensor sel;  // CSA: [T, K] entry ids
    if (m_ > 0) {
      DTensor pr = be.act({T, comp_.width()});
      be.linear(x, comp_.w, DTensor{}, pr);
      comp_.run(be, st.pend, st.comp, pr, pos0);
      if (indexed_) {
        DTensor ip = be.act({T, icomp_.width()});
        be.linear(x, icomp_.w, DTensor{}, ip);
        icomp_.run(be, st.ipend, st.icomp, ip, pos0);
        DTensor iq = be.act({T, Hi_ * Di_}), iw = be.alloc({T, Hi_}, DType::F32);
        be.linear(qr, iwq_b_, DTensor{}, iq);
        be.rope(*rope_, iq, Hi_, Di_, Di_ - rd_, pos0);
        be.linear(x, iw_, DTensor{}, iw);
        sel = select(iq, iw, st, pos0);
        st.last_sel = sel, st.sel_be = &be;
      }
    }
    DTensor o = be.act({T, H_ * D_});
    attend(q, st, sel, pos0, o);
    project_out(o, out);
    st.pos += T;
  }
  void forward_cp(const DTensor& x, const CpCtx& ctx, MixerState& ms, const DTensor& out) const override {
    auto& st = static_cast<Dsv4State&>(ms);
    DZ_CHECK(st.pos == 0 && st.raw.rows() == 0, "DeepSeek-V4 forward_cp: the state must be fresh (pos ", st.pos, ")");
    DZ_CHECK(ctx.cp && ctx.lay, "DeepSeek-V4 forward_cp: missing CP group or layout");
    const SeqLayout& lay = *ctx.lay;
    DZ_CHECK(lay.cp_size == ctx.cp->size() && lay.cp_rank == ctx.cp->rank(), "DeepSeek-V4 forward_cp: layout for rank ",
             lay.cp_rank, " of ", lay.cp_size, " used on rank ", ctx.cp->rank(), " of ", ctx.cp->size());
    Backend& be = *be_;
    const int64_t L = lay.length, Rl = lay.local_rows();
    const std::vector<int> segs = lay.local_segments();
    const int64_t cw = m_ > 0 ? comp_.width() : 0, icw = indexed_ ? icomp_.width() : 0, Wd = D_ + cw + icw;

    // 1. Local rows' kv at their global positions and the compressor projections, packed and their
    //    all-gather started (on the backend's buffers); then the queries (q, the indexer's q and
    //    weights) while the rows travel.
    DTensor qr = be.act({Rl, QL_}), q = be.act({Rl, H_ * D_}), pack = be.act({Rl, Wd});
    DTensor iq = indexed_ ? be.act({Rl, Hi_ * Di_}) : DTensor{}, iw = indexed_ ? be.alloc({Rl, Hi_}, DType::F32) : DTensor{};
    if (Rl > 0) {
      DTensor kv = be.act({Rl, D_});
      project_kv(x, kv);
      lay.each_local_segment([&](int64_t r, int64_t T, int64_t pos0) { be.rope(*rope_, kv.slab(r, r + T), 1, D_, D_ - rd_, pos0); });
      be.copy_cols(kv, 0, pack, 0, D_);
      if (m_ > 0) {
        DTensor pr = be.act({Rl, cw});
        be.linear(x, comp_.w, DTensor{}, pr);
        be.copy_cols(pr, 0, pack, D_, cw);
      }
      if (indexed_) {
        DTensor ip = be.act({Rl, icw});
        be.linear(x, icomp_.w, DTensor{}, ip);
        be.copy_cols(ip, 0, pack, D_ + cw, icw);
      }
    }
    std::unique_ptr<PendingRows> gather = cp_gather_seq_start(be, ctx, pack);
    if (Rl > 0) {
      project_q(x, qr, q);
      if (indexed_) {
        be.linear(qr, iwq_b_, DTensor{}, iq);
        be.linear(x, iw_, DTensor{}, iw);
      }
      lay.each_local_segment([&](int64_t r, int64_t T, int64_t pos0) {  // RoPE at the segment's positions
        be.rope(*rope_, q.slab(r, r + T), H_, D_, D_ - rd_, pos0);
        if (indexed_) be.rope(*rope_, iq.slab(r, r + T), Hi_, Di_, Di_ - rd_, pos0);
      });
    }
    // 2. Every rank's rows in sequence order: the raw rows and the pooled entries of the document.
    {
      auto tm = ctx.time("kv_gather");  // what is left of the exchange after the queries
      const DTensor full = gather->wait();  // [L, Wd]
      be.copy_cols(full, 0, st.raw.append(L), 0, D_);
      if (m_ > 0) {
        DTensor pr = be.act({L, cw});
        be.copy_cols(full, D_, pr, 0, cw);
        comp_.run(be, st.pend, st.comp, pr, 0);
      }
      if (indexed_) {
        DTensor ip = be.act({L, icw});
        be.copy_cols(full, D_ + cw, ip, 0, icw);
        icomp_.run(be, st.ipend, st.icomp, ip, 0);
      }
      st.pos = L;
    }
    // 3. Selection and attention for the local queries, segment by segment.
    DTensor o = be.act({Rl, H_ * D_});
    int64_t r = 0;
    for (int j : segs) {
      const int64_t T = lay.seg_len(j), pos0 = lay.seg_begin(j);
      if (T == 0) continue;
      auto tm = ctx.time("attention");
      const DTensor sel = indexed_ ? select(iq.slab(r, r + T), iw.slab(r, r + T), st, pos0) : DTensor{};
      attend(q.slab(r, r + T), st, sel, pos0, o.slab(r, r + T));
      ctx.flops("attention", WorkModel::attention(cfg_, cfg_.layers[size_t(layer_)], pos0, T));
      if (indexed_) ctx.flops("indexer", WorkModel::indexer(cfg_, cfg_.layers[size_t(layer_)], pos0, T));
      r += T;
    }
    st.last_sel = DTensor{};  // (the sets of a CP prefill are spread over the ranks)
    if (Rl > 0) project_out(o, out);
  }

 private:
  // The projections of rows x [T, hid] before RoPE: qr [T, QL] (normed; the indexer's queries read
  // it), q [T, H·D] (each head normed), kv [T, D] (normed).
  void project(const DTensor& x, const DTensor& qr, const DTensor& q, const DTensor& kv) const {
    project_q(x, qr, q);
    project_kv(x, kv);
  }
  // Its two halves (forward_cp runs the queries' while the kv rows travel).
  void project_q(const DTensor& x, const DTensor& qr, const DTensor& q) const {
    Backend& be = *be_;
    const int64_t T = x.rows();
    be.linear(x, wq_a_, DTensor{}, qr);
    be.rmsnorm(qr, q_norm_, qr, eps_, false);
    be.linear(qr, wq_b_, DTensor{}, q);
    be.rmsnorm(q.reshaped({T * H_, D_}), DTensor{}, q.reshaped({T * H_, D_}), eps_, false);
  }
  void project_kv(const DTensor& x, const DTensor& kv) const {
    be_->linear(x, wkv_, DTensor{}, kv);
    be_->rmsnorm(kv, kv_norm_, kv, eps_, false);
  }
  // CSA: the indexer's entry ids [T, K] I32 for the queries iq [T, Hi·Di], weights iw [T, Hi] at
  // positions pos0 .. (over the closed indexer entries of st).
  DTensor select(const DTensor& iq, const DTensor& iw, const Dsv4State& st, int64_t pos0) const {
    DTensor sel = be_->alloc({iq.rows(), K_}, DType::I32);
    be_->group_topk(iq, iw, float(1.0 / std::sqrt(double(Hi_) * double(Di_))), st.icomp.all(), m_, pos0, Hi_, K_, sel);
    return sel;
  }
  // o [T, H·D]: the queries q at positions pos0 .. over their window rows and entries (sel: the CSA
  // selection; undefined: every closed entry, or none), RoPE taken back out of the values.
  void attend(const DTensor& q, const Dsv4State& st, const DTensor& sel, int64_t pos0, const DTensor& o) const {
    be_->dsv4_attention(q, st.raw.all(), st.comp.all(), sel, sinks_, pos0, H_, W_, m_,
                        float(1.0 / std::sqrt(double(D_))), o);
    be_->rope(*rope_inv_, o, H_, D_, D_ - rd_, pos0);
  }
  // out [T, hid] = wo_b · (the grouped low-rank wo_a of o [T, H·D]).
  void project_out(const DTensor& o, const DTensor& out) const {
    const int64_t gw = H_ * D_ / G_;  // input width of one output group
    DTensor g = be_->act({o.rows(), G_ * R_});
    be_->head_matmul(o, gw, gw, wo_a_, 0, R_ * gw, true, g, R_, R_, G_);
    be_->linear(g, wo_b_, DTensor{}, out);
  }

  Backend* be_;
  ModelConfig cfg_;  // (the work model's counts under CP)
  int layer_ = 0;
  int64_t hid_ = 0, H_ = 0, D_ = 0, QL_ = 0, rd_ = 0, W_ = 0, m_ = 0, G_ = 0, R_ = 0, Hi_ = 0, Di_ = 0, K_ = 0;
  bool indexed_ = false;
  float eps_ = 1e-6f;
  std::unique_ptr<Rope> rope_, rope_inv_;
  DTensor wq_a_, q_norm_, wq_b_, wkv_, kv_norm_, wo_a_, wo_b_, sinks_, iwq_b_, iw_;
  Compressor comp_, icomp_;
};

}  // namespace

std::unique_ptr<Mixer> make_dsv4_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                       const TpShard& tp, Backend& be) {
  (void)tp;  // replicated on every TP rank (the output needs no all-reduce)
  return std::make_unique<Dsv4Mixer>(cfg, layer, ck, prefix, be);
}

}  // namespace dz
