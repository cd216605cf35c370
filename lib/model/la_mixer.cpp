#include "model/la_mixer.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "ops/norm.hpp"
#include "ops/linear_attn.hpp"
#include "ops/short_conv.hpp"
#include "model/la_state.hpp"

namespace dz {

std::unique_ptr<MixerState> LinearAttnMixer::make_state() const {
  if (!pool_) pool_ = std::make_shared<LaPool>(*be_, Shape{HV_, K_, V_}, Shape{W_ - 1, conv_dim()}, be_->act_dtype());
  return std::make_unique<LaState>(pool_);
}

LaState& LinearAttnMixer::state_of(MixerState& base) const {
  auto* st = dynamic_cast<LaState*>(&base);
  DZ_CHECK(st && st->pool && st->pool == pool_, name_, " mixer: a state of another mixer (each layer's states live in "
           "its own pool)");
  return *st;
}

namespace {
// A verify forward's undo record (LinearAttnMixer::spec_begin).
struct LaSpec : SpecRecord {
  SpecRestore how = SpecRestore::Replay;
  int64_t pos0 = 0;
  DTensor S0, conv0;     // the state (Replay) and conv tail before the verify forward (copies)
  DTensor pre, f, beta;  // the verify rows' scan inputs (views of the forward's projections)
  DTensor states;        // PerToken: [T, HV, K, V] the state after each verify row
  bool noted = false;
};
LaSpec* la_spec(MixerState& st) { return dynamic_cast<LaSpec*>(st.spec.get()); }
}  // namespace

void LinearAttnMixer::spec_begin(MixerState& base, SpecRestore how, Copies* copies) const {
  LaState& st = state_of(base);
  auto r = std::make_unique<LaSpec>();
  r->how = how;
  r->pos0 = st.pos;
  const DTensor S = st.S(), c = st.conv();
  Copies now;
  Copies& cp = copies ? *copies : now;
  if (how == SpecRestore::Replay) {
    r->S0 = be_->alloc(S.shape, S.dtype);
    cp.push_back({S.reshaped({1, S.numel()}), 0, r->S0.reshaped({1, S.numel()}), 0, 1});
  }
  r->conv0 = be_->alloc(c.shape, c.dtype);
  if (c.numel()) cp.push_back({c, 0, r->conv0, 0, c.rows()});
  if (!now.empty()) be_->copy_rows_many(now);
  st.spec = std::move(r);
}

void LinearAttnMixer::note_spec(LaState& st, const Tok& tk, int64_t r0, int64_t r1) const {
  LaSpec* r = la_spec(st);
  if (!r) return;
  DZ_CHECK(!r->noted, name_, " mixer: two forwards over one state between spec_begin and spec_keep");
  r->pre = tk.pre.slab(r0, r1), r->f = tk.f.slab(r0, r1), r->beta = tk.beta.slab(r0, r1);
  r->noted = true;
}

void LinearAttnMixer::spec_keep(MixerState& base, int64_t keep, Copies* copies) const {
  LaState& st = state_of(base);
  LaSpec* r = la_spec(st);
  DZ_CHECK(r && r->noted, name_, " mixer: spec_keep without spec_begin and a verify forward");
  const int64_t T = r->pre.rows();
  DZ_CHECK(keep >= 1 && keep <= T && st.pos == r->pos0 + T, name_, " mixer: keep ", keep, " of a verify forward of ",
           T, " rows");
  if (keep < T) {
    const DTensor S = st.S(), c = st.conv();
    const int64_t n = S.numel(), P = c.rows();
    if (r->how == SpecRestore::PerToken) {  // the kept row's state; the tail from the inputs
      DZ_CHECK(r->states.numel() == T * n, name_, " mixer: per-token states of ", r->states.numel() / std::max<int64_t>(n, 1),
               " rows for a verify forward of ", T);
      Copies now;
      Copies& cp = copies ? *copies : now;  // (the copies hold the record's buffers past its reset)
      cp.push_back({r->states.reshaped({T, n}), keep - 1, S.reshaped({1, n}), 0, 1});
      // the last P inputs of [tail before; kept rows]: old tail rows keep .. P-1, then kept rows
      const int64_t old_rows = std::max<int64_t>(P - keep, 0);
      if (old_rows) cp.push_back({r->conv0, P - old_rows, c, 0, old_rows});
      if (P - old_rows) cp.push_back({r->pre, keep - (P - old_rows), c, old_rows, P - old_rows});
      if (!now.empty()) be_->copy_rows_many(now);
    } else {  // back to the snapshot, then the conv and the scan over the kept rows
      be_->copy_rows(r->S0.reshaped({1, n}), 0, S.reshaped({1, n}), 0, 1);
      if (P) be_->copy_rows(r->conv0, 0, c, 0, P);
      Tok tk;
      tk.pre = r->pre.slab(0, keep), tk.f = r->f.slab(0, keep), tk.beta = r->beta.slab(0, keep);
      LaScanArgs a = scan_args(tk, keep);
      be_->short_conv_split(tk.pre, conv_, c, {a.q, a.k, a.v});
      a.state = S;
      a.o = be_->act({keep, HV_ * V_});  // not needed: the verify forward gave the kept rows' outputs
      be_->la_scan(a);
    }
    st.pos = r->pos0 + keep;
  }
  st.spec.reset();
}

// o [T, HV*V] -> per-head RMSNorm * act(gate) -> output projection (partial under TP) -> all-reduce
void LinearAttnMixer::finish(DTensor& o, const DTensor& gate, const DTensor& out) const {
  DTensor oh = o.reshaped({o.numel() / V_, V_});
  be_->gated_rmsnorm(oh, gate, out_norm_, oh, eps_, act_);
  be_->linear(o, wo_, DTensor{}, out);
  tp_.allreduce(*be_, out);
}

// The scan's inputs for T rows: q, k, v [T, KD / KD / VD] allocated for the conv to write its
// [q | k | v] columns into (short_conv_split: no copies out of a [T, conv_dim()] output).
LaScanArgs LinearAttnMixer::scan_args(const Tok& tk, int64_t T) const {
  const int64_t KD = HK_ * K_, VD = HV_ * V_;
  LaScanArgs a;
  a.kda = per_channel_;
  a.HK = HK_, a.HV = HV_, a.K = K_, a.V = V_;
  a.scale = 1.f / std::sqrt(float(K_));
  a.q = be_->act({T, KD});
  a.k = be_->act({T, KD});
  a.v = be_->act({T, VD});
  a.beta = tk.beta;
  a.gate = LaGateArgs{tk.f, A_log_, dt_bias_, lower_bound_};
  return a;
}

void LinearAttnMixer::forward(const DTensor& x, MixerState& base, const DTensor& out) const {
  LaState& st = state_of(base);
  const int64_t T = x.rows(), VD = HV_ * V_;
  Tok tk = project(x);
  note_spec(st, tk, 0, T);
  LaScanArgs a = scan_args(tk, T);
  be_->short_conv_split(tk.pre, conv_, st.conv(), {a.q, a.k, a.v});
  a.state = st.S();
  a.o = be_->act({T, VD});
  scan(st, a);
  finish(a.o, tk.gate, out);
  st.pos += T;
}

void LinearAttnMixer::scan(LaState& st, const LaScanArgs& a) const {
  LaSpec* r = la_spec(st);
  if (r && r->how == SpecRestore::PerToken) {
    const int64_t T = a.v.rows();
    r->states = be_->alloc({T, HV_, K_, V_}, DType::F32);
    be_->la_scan_states(a, r->states);
  } else {
    be_->la_scan(a);
  }
}

void LinearAttnMixer::forward_packed(const DTensor& x, const std::vector<int64_t>& cu,
                                     const std::vector<MixerState*>& sts, const DTensor& out) const {
  const int64_t N = int64_t(cu.size()) - 1, T = x.rows(), VD = HV_ * V_, nS = HV_ * K_ * V_;
  DZ_CHECK(N >= 1 && int64_t(sts.size()) == N && cu.front() == 0 && cu.back() == T, name_,
           " forward_packed: ", N, " documents, ", sts.size(), " states, offsets to ", cu.back(), " of ", T, " rows");
  std::vector<LaState*> st(static_cast<size_t>(N));
  for (int64_t b = 0; b < N; ++b) st[size_t(b)] = &state_of(*sts[size_t(b)]);
  Tok tk = project(x);
  for (int64_t b = 0; b < N; ++b) note_spec(*st[size_t(b)], tk, cu[size_t(b)], cu[size_t(b) + 1]);
  LaScanArgs a = scan_args(tk, T);
  if (T == N) {  // one token per document (a batched decode step): the conv and the scan on the slots
    std::vector<int32_t> slots(static_cast<size_t>(N));
    for (int64_t b = 0; b < N; ++b) slots[size_t(b)] = st[size_t(b)]->slot;
    const DTensor c = be_->act({T, conv_dim()});
    be_->short_conv_slots(tk.pre, conv_, pool_->convs(), slots, c);
    const int64_t KD = HK_ * K_;
    be_->copy_cols(c, 0, a.q, 0, KD);
    be_->copy_cols(c, KD, a.k, 0, KD);
    be_->copy_cols(c, 2 * KD, a.v, 0, HV_ * V_);
    a.o = be_->act({T, VD});
    be_->la_decode_slots(a, pool_->states(), slots);
    for (LaState* s : st) s->pos += 1;
    finish(a.o, tk.gate, out);
    return;
  }
  for (int64_t b = 0; b < N; ++b) {
    const int64_t r0 = cu[size_t(b)], r1 = cu[size_t(b) + 1];
    be_->short_conv_split(tk.pre.slab(r0, r1), conv_, st[size_t(b)]->conv(),
                          {a.q.slab(r0, r1), a.k.slab(r0, r1), a.v.slab(r0, r1)});
  }
  bool per_token = false;
  for (LaState* x : st) {
    const LaSpec* r = la_spec(*x);
    per_token = per_token || (r && r->how == SpecRestore::PerToken);
  }
  if (per_token) {  // a verify forward keeping per-token states: every document on its slot, one call
    a.o = be_->act({T, VD});
    a.cu = cu;
    std::vector<int32_t> slots(static_cast<size_t>(N));
    const DTensor states = be_->alloc({T, HV_, K_, V_}, DType::F32);
    for (int64_t b = 0; b < N; ++b) {
      slots[size_t(b)] = st[size_t(b)]->slot;
      LaSpec* r = la_spec(*st[size_t(b)]);
      DZ_CHECK(r && r->how == SpecRestore::PerToken, name_, " mixer: a packed verify forward mixes restores");
      r->states = states.slab(cu[size_t(b)], cu[size_t(b) + 1]);
      st[size_t(b)]->pos += cu[size_t(b) + 1] - cu[size_t(b)];
    }
    be_->la_scan_states_slots(a, pool_->states(), slots, states);
    finish(a.o, tk.gate, out);
    return;
  }
  // The varlen chunked scan reads and writes the states [N, ...] in document order: gathered from
  // the slots and back.
  a.cu = cu;
  a.state = be_->alloc({N, HV_, K_, V_}, DType::F32);
  const DTensor flat = a.state.reshaped({N, nS});
  for (int64_t b = 0; b < N; ++b) be_->copy_rows(st[size_t(b)]->S().reshaped({1, nS}), 0, flat, b, 1);
  a.o = be_->act({T, VD});
  be_->la_scan(a);
  for (int64_t b = 0; b < N; ++b) {
    be_->copy_rows(flat, b, st[size_t(b)]->S().reshaped({1, nS}), 0, 1);
    st[size_t(b)]->pos += cu[size_t(b) + 1] - cu[size_t(b)];
  }
  finish(a.o, tk.gate, out);
}

// The two-stage scan of DESIGN §4 on the backend (docs/parallel_linear_attention.md): the conv
// halo and the transitions cross ranks on the backend's buffers (cp_allgather_rows: NCCL between
// distinct GPUs), everything else is ops.
void LinearAttnMixer::forward_cp(const DTensor& x, const CpCtx& ctx, MixerState& base, const DTensor& out) const {
  LaState& st = state_of(base);
  DZ_CHECK(ctx.cp && ctx.lay, name_, " forward_cp: CpCtx needs a CP communicator and a layout");
  DZ_CHECK(st.pos == 0, name_, " forward_cp: the state has already consumed ", st.pos, " tokens (needs a fresh one)");
  const SeqLayout& lay = *ctx.lay;
  const Collectives& comm = *ctx.cp;
  DZ_CHECK(lay.cp_size == comm.size() && lay.cp_rank == comm.rank(), name_, " forward_cp: layout for rank ",
           lay.cp_rank, " of ", lay.cp_size, " used on CP rank ", comm.rank(), " of ", comm.size());
  Backend& be = *be_;
  const int64_t R = lay.local_rows(), KD = HK_ * K_, VD = HV_ * V_, CD = conv_dim(), P = W_ - 1;
  const int64_t nA = HV_ * K_ * K_, nB = HV_ * K_ * V_;
  const std::vector<int> mine = lay.local_segments();
  std::vector<int64_t> off(mine.size() + 1, 0);  // local row offset of each local segment
  for (size_t i = 0; i < mine.size(); ++i) off[i + 1] = off[i] + lay.seg_len(mine[i]);
  auto args = [&](const Tok& tk, const DTensor& q, const DTensor& k, const DTensor& v, size_t i) {
    LaScanArgs a;
    a.kda = per_channel_;
    a.HK = HK_, a.HV = HV_, a.K = K_, a.V = V_;
    a.scale = 1.f / std::sqrt(float(K_));
    const int64_t r0 = off[i], r1 = off[i + 1];
    a.q = q.slab(r0, r1), a.k = k.slab(r0, r1), a.v = v.slab(r0, r1), a.beta = tk.beta.slab(r0, r1);
    a.gate = LaGateArgs{tk.f.slab(r0, r1), A_log_, dt_bias_, lower_bound_};
    return a;
  };

  // Stage 1: projections, the conv with its halo, the local segments' transitions from S = 0.
  Tok tk;
  DTensor q = be.act({R, KD}), k = be.act({R, KD}), v = be.act({R, VD});
  // This rank's non-empty segments' transitions, one row each in layout order: A [., HV·K·K], B [., HV·K·V].
  int64_t n_mine = 0;
  for (size_t i = 0; i < mine.size(); ++i) n_mine += off[i + 1] > off[i];
  DTensor A_mine = be.alloc({n_mine, nA}, DType::F32), B_mine = be.alloc({n_mine, nB}, DType::F32);
  {
    auto timer = ctx.time("la_stage1");
    tk = project(x);
    // Conv halo (ops/short_conv.hpp ConvHalo, here on the backend's buffers): every rank shares
    // the last min(W-1, n_j) pre-conv rows of each of its segments; a segment's conv state is the
    // W-1 inputs before it (zeros before the document).
    DTensor pre = tk.pre;
    if (pre.dtype != be.act_dtype()) {
      pre = be.act({R, CD});
      be.convert(tk.pre, pre);
    }
    std::vector<int64_t> rows_of(size_t(comm.size()), 0), tail_at(size_t(lay.n_seg()), 0);
    int64_t at = 0;
    for (int r = 0; r < comm.size(); ++r)
      for (int j : lay.segments_of(r)) {
        tail_at[size_t(j)] = at;  // rank order, each rank's segments in layout order: the gather's
        at += ConvHalo::tail_rows(lay, P, j);
        rows_of[size_t(r)] += ConvHalo::tail_rows(lay, P, j);
      }
    std::vector<Backend::RowCopy> pick;
    DTensor tails = be.act({rows_of[size_t(lay.cp_rank)], CD});
    for (size_t i = 0, t = 0; i < mine.size(); ++i) {
      const int64_t m = ConvHalo::tail_rows(lay, P, mine[i]);
      if (m > 0) pick.push_back({pre, off[i + 1] - m, tails, int64_t(t), m});
      t += size_t(m);
    }
    be.copy_rows_many(pick);
    const DTensor all_tails = cp_allgather_rows(be, ctx, tails, rows_of);
    auto halo_before = [&](int j) {  // ConvHalo::before on the gathered rows
      DTensor h = be.zeros({P, CD}, be.act_dtype());
      std::vector<Backend::RowCopy> mv;
      int64_t need = P;  // rows of h still to fill, from the bottom (row P-1) up
      for (int s = j - 1; s >= 0 && need > 0; --s) {
        const int64_t tr = ConvHalo::tail_rows(lay, P, s), m = std::min(need, tr);
        if (m > 0) mv.push_back({all_tails, tail_at[size_t(s)] + tr - m, h, need - m, m});
        need -= m;
      }
      be.copy_rows_many(mv);
      return h;
    };
    for (size_t i = 0; i < mine.size(); ++i) {
      const int64_t r0 = off[i], r1 = off[i + 1];
      if (r1 == r0) continue;
      DTensor hs = halo_before(mine[i]);
      be.short_conv_split(tk.pre.slab(r0, r1), conv_, hs, {q.slab(r0, r1), k.slab(r0, r1), v.slab(r0, r1)});
    }
    const DTensor last = halo_before(lay.n_seg());  // the document's last W-1 inputs: decode's conv state
    be.copy_rows(last, 0, st.conv(), 0, P);
    int64_t row = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
      const int64_t n = off[i + 1] - off[i];
      if (n > 0) {
        be.la_transition(args(tk, q, k, v, i), A_mine.slab(row, row + 1).reshaped({HV_, K_, K_}),
                         B_mine.slab(row, row + 1).reshaped({HV_, K_, V_}));
        ++row;
      }
      ctx.flops("linear_attention", la_chunked_flops(n, HV_, K_, V_, false));
    }
  }

  // Stage 2 of local segment i (its outputs) from its initial state.
  DTensor o = be.act({R, VD});
  auto stage2 = [&](size_t i, const DTensor& state) {
    LaScanArgs a = args(tk, q, k, v, i);
    a.state = state;
    a.o = o.slab(off[i], off[i + 1]);
    be.la_scan(a);
  };
  // The document's first non-empty segment starts from the zero state (S_init[0]): when it is this
  // rank's, its outputs run while the transitions travel.
  size_t early = mine.size();
  for (int j = 0; j < lay.n_seg(); ++j)
    if (lay.seg_len(j) > 0) {
      early = size_t(std::find(mine.begin(), mine.end(), j) - mine.begin());
      break;
    }

  // Merge: every rank gathers every non-empty segment's [A | B] and runs the ordered chain itself.
  DTensor S_init;  // [number of non-empty segments, HV, K, V]
  std::vector<int64_t> init_of(size_t(lay.n_seg()), -1);  // segment -> its row of S_init
  std::vector<int64_t> rows_of(size_t(comm.size()), 0), at(size_t(lay.n_seg()), -1);  // at: segment -> its row
  int64_t n_all = 0;  // non-empty segments
  std::unique_ptr<PendingRows> gather_A, gather_B;
  {
    auto timer = ctx.time("la_merge");
    // every rank's transitions (on the backend's buffers: cp_allgather_rows), rank by rank
    for (int r = 0; r < comm.size(); ++r)
      for (int j : lay.segments_of(r))
        if (lay.seg_len(j) > 0) at[size_t(j)] = n_all++, ++rows_of[size_t(r)];
    gather_A = cp_allgather_rows_start(be, ctx, A_mine, rows_of);
    gather_B = cp_allgather_rows_start(be, ctx, B_mine, rows_of);
  }
  if (early < mine.size()) {
    auto timer = ctx.time("la_stage2");
    stage2(early, be.zeros({HV_, K_, V_}, DType::F32));
  }
  {
    auto timer = ctx.time("la_merge");
    // moved into sequence order
    const DTensor A_all = gather_A->wait(), B_all = gather_B->wait();
    const int64_t n = n_all;
    DTensor A_seq = be.alloc({n, nA}, DType::F32), B_seq = be.alloc({n, nB}, DType::F32);
    std::vector<Backend::RowCopy> moves_A, moves_B;
    int64_t i = 0;
    for (int j = 0; j < lay.n_seg(); ++j)
      if (lay.seg_len(j) > 0) {
        init_of[size_t(j)] = i;
        moves_A.push_back({A_all, at[size_t(j)], A_seq, i, 1});
        moves_B.push_back({B_all, at[size_t(j)], B_seq, i, 1});
        ++i;
        ctx.flops("linear_attention", double(2 * HV_ * K_ * K_ * V_));
      }
    be.copy_rows_many(moves_A);
    be.copy_rows_many(moves_B);
    S_init = be.alloc({std::max<int64_t>(n, 1), HV_, K_, V_}, DType::F32);
    if (n > 0)
      be.la_merge(A_seq.reshaped({n, HV_, K_, K_}), B_seq.reshaped({n, HV_, K_, V_}), n, S_init, st.S());
    else
      be.fill_zero(st.S());
  }

  // Stage 2: the other local segments' outputs from their initial states.
  {
    auto timer = ctx.time("la_stage2");
    for (size_t i = 0; i < mine.size(); ++i) {
      const int64_t n = off[i + 1] - off[i];
      if (n > 0 && i != early) {
        DTensor state = be.alloc({HV_, K_, V_}, DType::F32);
        const int64_t row = init_of[size_t(mine[i])];
        be.copy_rows(S_init.reshaped({S_init.dim(0), nB}), row, state.reshaped({1, nB}), 0, 1);
        stage2(i, state);
      }
      ctx.flops("linear_attention", la_chunked_flops(n, HV_, K_, V_, true));
    }
    finish(o, tk.gate, out);
  }
  st.pos = lay.length;
}

}  // namespace dz
