// The backend seam (DESIGN §10): one model, one job, two backends. The layer stack (Model::run),
// the modules and the job are written once against this interface; a backend owns its memory
// (device, dtypes) and implements the ops at fused-kernel granularity. The CPU backend
// (backend/cpu_backend.cpp) composes the fp32 reference ops of lib/ops and is the spec; the CUDA
// backend (backend/cuda_backend.cpp) calls kernels/.
//
// Dtypes: the residual stream, recurrent states, logits and every reduction are fp32 on both
// backends; activations between ops are act_dtype() (CPU F32, CUDA BF16); weights are uploaded
// once in weight_dtype() (CPU F32, CUDA BF16), small per-channel parameters (norm weights, gate
// constants, biases of the gates) stay F32 where an op says so.
//
// Every op takes and returns DTensors of this backend's device; shapes are checked. Ops never
// communicate: collectives run between ops (allreduce_sum below, the modules' CP exchanges).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtensor.hpp"
#include "core/dummy_values.hpp"
#include "dist/collectives.hpp"
#include "ops/glu.hpp"   // GluAct
#include "ops/norm.hpp"  // GateAct

namespace dz {

struct RouterConfig;
struct HcParams;
class Rope;

// Weights of a gated MLP (gate, up [I, D]; down [D, I]) or of E experts stacked ([E, I, D] and
// [E, D, I]), and its activation (ops/glu.hpp: SwiGLU, SwiGLU clamp, SiTU). Stacked experts may be
// kept in MXFP4 by a backend (DTensor::mx_scales; Backend::weight of an mxfp4 Tensor).
struct SwigluWeights {
  DTensor gate, up, down;
  GluAct act;
};

// The MoE block's weights: router [E, D] (F32: routing decisions are made in fp32 on both
// backends), correction bias [E] or undefined, experts stacked, optional shared expert and its
// sigmoid gate [1, D].
struct MoeWeights {
  DTensor router, bias;
  SwigluWeights experts;
  bool has_shared = false;
  SwigluWeights shared;
  DTensor shared_gate;
  // Per call (DeepSeek-V4 hash_moe): [T, top_k] I32 experts of each row, replacing the selection
  // (ops/moe.hpp moe_select's fixed); undefined: the router selects.
  DTensor fixed;
  // Per call, with `fixed`: [T, top_k] F32 weights of those experts; then no router runs (expert
  // parallelism: routed on another rank, or by Backend::moe_route before).
  DTensor fixed_wt;
  // Expert parallelism (--ep): the stacked experts are the global experts [e0, e0 + E_local)
  // (E_local = experts.gate.dim(0)); assignments to any other expert add nothing here.
  int64_t e0 = 0;
  // Per call (Kimi K3's latent MoE): the router's input [T, D] when the experts read another one
  // (x = the latent [T, L]); undefined: the router reads x. No shared expert with it (it would
  // read which one?): the latent MoE adds its shared experts itself.
  DTensor route_x;
};

// Gate of the linear-attention scan, from the raw projections (the kernels' LaGate):
//   KDA softplus  : g = -exp(A_log[h]) * softplus(f + dt_bias)          (lower_bound == 0)
//   KDA lower bnd : g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias))
//   GDN           : the softplus gate with one channel per head
struct LaGateArgs {
  DTensor f;        // KDA [T, HV*K]; GDN [T, HV]  (act dtype)
  DTensor A_log;    // [HV] F32
  DTensor dt_bias;  // KDA [HV*K]; GDN [HV] F32 (undefined: none)
  float lower_bound = 0.f;
};

struct LaScanArgs {
  bool kda = true;   // per-channel decay (KDA) or one scalar per value head (GDN)
  int64_t HK = 0, HV = 0, K = 0, V = 0;
  float scale = 1.f;
  DTensor q, k;      // [T, HK, K] raw (the op L2-normalises them)
  DTensor v;         // [T, HV, V]
  DTensor beta;      // [T, HV] logits (the op applies the sigmoid)
  LaGateArgs gate;
  DTensor state;     // [HV, K, V] F32, in/out; with cu: [N, HV, K, V], one state per sequence
  DTensor o;         // [T, HV, V] out
  // Varlen (a packed forward): N + 1 row offsets of N sequences, each scanned from its own state;
  // empty: one sequence of all rows.
  std::vector<int64_t> cu;
  int64_t sequences() const { return cu.empty() ? 1 : int64_t(cu.size()) - 1; }
  // Rows r0 .. r1 of the inputs and the output as one sequence (cu cleared; the state as it is).
  LaScanArgs rows(int64_t r0, int64_t r1) const {
    LaScanArgs s = *this;
    s.q = q.slab(r0, r1), s.k = k.slab(r0, r1), s.v = v.slab(r0, r1), s.beta = beta.slab(r0, r1);
    s.gate.f = gate.f.slab(r0, r1);
    s.o = o.slab(r0, r1);
    s.cu.clear();
    return s;
  }
  // Sequence b alone (rows cu[b] .. cu[b+1], its state).
  LaScanArgs sequence(int64_t b) const {
    if (cu.empty()) return *this;
    LaScanArgs s = rows(cu[size_t(b)], cu[size_t(b) + 1]);
    s.state = state.slab(b, b + 1).reshaped({HV, K, V});
    return s;
  }
};

// Softmax attention of T queries at positions pos0 .. pos0+T-1 over S >= pos0+T cached keys
// (ops/attention.hpp causal_attention): q [T, Hq, Dk], k [S, Hkv, Dk], v [S, Hkv, Dv], out
// [T, Hq, Dv]; sel [T, n_sel] I32 (undefined: dense causal).
struct AttnArgs {
  DTensor q, k, v, out, sel;
  int64_t pos0 = 0, Hq = 0, Hkv = 0, Dk = 0, Dv = 0;
  float scale = 1.f;
  // Varlen (a packed prefill): N + 1 row offsets (as LaScanArgs::cu) shared by q / out / sel and
  // k / v: sequence b's queries, rows cu[b] .. cu[b+1], attend its own key rows cu[b] .. cu[b+1]
  // causally from position 0 (pos0 must be 0; a selection holds positions within the sequence).
  // Equal to one call per sequence. Empty: one sequence.
  std::vector<int64_t> cu;
  int64_t sequences() const { return cu.empty() ? 1 : int64_t(cu.size()) - 1; }
  // Sequence b alone (its rows of q, k, v, out and sel).
  AttnArgs sequence(int64_t b) const {
    if (cu.empty()) return *this;
    AttnArgs s = *this;
    const int64_t r0 = cu[size_t(b)], r1 = cu[size_t(b) + 1];
    s.q = q.slab(r0, r1), s.k = k.slab(r0, r1), s.v = v.slab(r0, r1), s.out = out.slab(r0, r1);
    if (sel.defined() && sel.numel() > 0) s.sel = sel.slab(r0, r1);
    s.cu.clear();
    return s;
  }
  // Throws unless cu is a varlen description of q's T rows (and as many key rows) from pos0 = 0.
  void check_varlen(int64_t T, int64_t S) const {
    DZ_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == T && S == T && pos0 == 0, "attention: varlen offsets ",
             cu.size(), " ending at ", cu.empty() ? -1 : cu.back(), " for ", T, " query and ", S, " key rows, pos0 ",
             pos0);
    for (size_t b = 0; b + 1 < cu.size(); ++b)
      DZ_CHECK(cu[b] <= cu[b + 1], "attention: varlen offsets decrease at sequence ", b);
    DZ_CHECK(!(sel.defined() && sel.numel() > 0) || sel.rows() == T, "attention: selection ", shape_str(sel.shape),
             " for ", T, " queries");
  }
};

// Rows being all-gathered (Backend::allgather_rows_start, DeviceComm): wait() returns what
// allgather_rows returns, once. Destroying one never waited on completes the exchange.
class PendingRows {
 public:
  virtual ~PendingRows() = default;
  virtual DTensor wait() = 0;
};
// One already gathered (a transport that does not overlap, a group of one).
class ReadyRows final : public PendingRows {
 public:
  explicit ReadyRows(DTensor t) : t_(std::move(t)) {}
  DTensor wait() override { return t_; }

 private:
  DTensor t_;
};

// A captured run of ops (Backend::capture_end): replaying it runs the recorded kernels again on
// the same buffers, with the arguments they had when captured.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void launch() = 0;  // on the backend's stream, in order with the ops around it
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual DType act_dtype() const = 0;
  virtual DType weight_dtype() const = 0;

  // ---- memory ----
  virtual DTensor alloc(const Shape& s, DType dt) = 0;      // uninitialised
  DTensor zeros(const Shape& s, DType dt) {
    DTensor t = alloc(s, dt);
    fill_zero(t);
    return t;
  }
  DTensor act(const Shape& s) { return alloc(s, act_dtype()); }
  // Host fp32 -> a new tensor of dtype dt on this backend (rounded to nearest even for BF16).
  virtual DTensor upload(const float* src, const Shape& s, DType dt) = 0;
  DTensor upload(const Tensor& t, DType dt) { return upload(t.ptr(), t.shape, dt); }
  // A weight of a linear layer (linear / swiglu_mlp / the LM head): in weight_dtype(), or kept in
  // FP8 where the backend runs FP8 block-scaled GEMMs and t carries its block scales, or (stacked
  // routed experts [E, N, K], t.mxfp4) kept in MXFP4 where the backend's expert GEMMs read it.
  virtual DTensor weight(const Tensor& t) { return upload(t, weight_dtype()); }
  // FP8 block-scaled weights kept in FP8 so far (the others were uploaded in weight_dtype()).
  virtual int64_t fp8_weights_kept() const { return 0; }
  // MXFP4 expert stacks kept in MXFP4 so far.
  virtual int64_t mxfp4_weights_kept() const { return 0; }
  DTensor param(const Tensor& t) { return upload(t, DType::F32); }  // small fp32 parameters
  virtual DTensor upload_i32(const int32_t* src, const Shape& s) = 0;
  // To host: any float dtype widened to fp32; I32 as is.
  virtual void download(const DTensor& t, float* dst) = 0;
  virtual void download_i32(const DTensor& t, int32_t* dst) = 0;
  std::vector<float> to_host(const DTensor& t) {
    std::vector<float> v(size_t(t.numel()));
    if (!v.empty()) download(t, v.data());
    return v;
  }
  virtual void fill_zero(const DTensor& t) = 0;
  // dst[d0 + i, :] = src[s0 + i, :] for i < n (same dtype, same columns; matrices by rows()).
  virtual void copy_rows(const DTensor& src, int64_t s0, const DTensor& dst, int64_t d0, int64_t n) = 0;
  // Many copy_rows at once, none reading what another writes (the speculative restore's copies of
  // every document and layer: ~1,000 at B = 64, launch-bound one by one on the GPU). The CPU: in
  // order; CUDA: one launch over all of them.
  struct RowCopy {
    DTensor src;
    int64_t s0 = 0;
    DTensor dst;
    int64_t d0 = 0, n = 0;
  };
  virtual void copy_rows_many(const std::vector<RowCopy>& copies) {
    for (const RowCopy& c : copies) copy_rows(c.src, c.s0, c.dst, c.d0, c.n);
  }
  // dst[:, d0 + j] = src[:, s0 + j] for j < w (same dtype, same rows).
  virtual void copy_cols(const DTensor& src, int64_t s0, const DTensor& dst, int64_t d0, int64_t w) = 0;
  // Converting copy (any float dtypes, same numel).
  virtual void convert(const DTensor& src, const DTensor& dst) = 0;
  // --dummy-weights in place (core/dummy_values.hpp): t [R, C] (contiguous rows, F32 or BF16) =
  // dummy_value(key, (r0 + r) * ld + c0 + c, d): the [R, C] window at (r0, c0) of a virtual row-major
  // tensor with rows of ld elements (a TP slice of it is the same slice of the whole).
  virtual void fill_dummy(const DTensor& t, uint64_t key, const DummyDist& d, int64_t ld, int64_t r0, int64_t c0) = 0;
  // --dummy-weights of an MXFP4 expert stack (Kimi K3): what weight() returns for the stack [E, R, C]
  // whose expert e is the [R, C] window at (r0, c0) of a virtual [*, ld] tensor of key keys[e],
  // dummy values rounded to MXFP4 per 32 columns (core/dummy_values.hpp dummy_mx4_group; c0, C and
  // ld multiples of 32). This default decodes them on the host and calls weight(); the CUDA backend
  // writes the 4-bit codes in place.
  virtual DTensor dummy_mx4_experts(const std::vector<uint64_t>& keys, int64_t R, int64_t C, const DummyDist& d,
                                    int64_t ld, int64_t r0, int64_t c0);
  // Waits for every op issued so far (host timers, downloads the host reads).
  virtual void sync() = 0;

  // ---- collectives between ops: one place, so the transport is chosen here ----
  // In-place sum over `comm` (nullptr or size 1: nothing). Device tensors go through the
  // backend's transport (CPU: MPI on the buffer; CUDA: staged through pinned host memory).
  virtual void allreduce_sum(const Collectives* comm, const DTensor& t) = 0;
  // Every rank's rows [rows_of[rank], W] of `mine` (dtype and W the same on every rank), concatenated
  // in rank order into a new [Σ rows_of, W] tensor on this backend; rows_of (one count per rank) is
  // known to every rank. nullptr or a group of one: a copy of mine. Bytes are moved: exact in every
  // dtype (CPU: MPI on the buffer; CUDA: staged through host memory). allgather_rows_start(...)->wait().
  DTensor allgather_rows(const Collectives* comm, const DTensor& mine, const std::vector<int64_t>& rows_of);
  // allgather_rows started, not finished: this rank computes meanwhile and takes the rows with
  // wait(); `mine` must not change until then. Exchanges started on one group complete in the order
  // every rank started them. Checks the counts, serves nullptr and a group of one with a copy, and
  // otherwise starts the backend's exchange (start_allgather_rows).
  std::unique_ptr<PendingRows> allgather_rows_start(const Collectives* comm, const DTensor& mine,
                                                    const std::vector<int64_t>& rows_of);
  // The checks of allgather_rows (every backend and transport): returns the gathered row count.
  static int64_t check_gather_rows(int group_size, int rank, const DTensor& mine, const std::vector<int64_t>& rows_of);
  // send [Σ send_rows, W]: its first send_rows[0] rows go to rank 0, the next send_rows[1] to rank 1,
  // ...; returns the rows every rank sent here, in rank order, [Σ recv_rows, W] (recv_rows[r]: the
  // count rank r sends here, known to this rank). Bytes are moved: exact in every dtype. nullptr or a
  // group of one: a copy of send (send_rows == recv_rows). alltoall_rows_start(...)->wait().
  DTensor alltoall_rows(const Collectives* comm, const DTensor& send, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows);
  // alltoall_rows started, not finished (the expert-parallel dispatch, beside this rank's own
  // experts): wait() returns what alltoall_rows returns, once; send must not change until then.
  // Checks and serves groups of one as allgather_rows_start; otherwise start_alltoall_rows.
  std::unique_ptr<PendingRows> alltoall_rows_start(const Collectives* comm, const DTensor& send,
                                                   const std::vector<int64_t>& send_rows,
                                                   const std::vector<int64_t>& recv_rows);
  // The checks of alltoall_rows: returns the received row count.
  static int64_t check_alltoall_rows(int group_size, const DTensor& send, const std::vector<int64_t>& send_rows,
                                     const std::vector<int64_t>& recv_rows);
  // Byte counts of row counts (rank order) for the Collectives' exchanges.
  static std::vector<size_t> row_bytes_of(const std::vector<int64_t>& rows, size_t row_bytes);

 protected:
  // allgather_rows / alltoall_rows in a group of one (after their checks): a new [rows, W] copy of
  // src through copy_rows.
  DTensor copy_of_rows(const DTensor& src);
  // The started exchanges over a group of at least two, after the public forms' checks (`total`: the
  // rows this rank receives). CPU: MPI_Iallgatherv / MPI_Ialltoallv on the buffers; CUDA: the same on
  // host copies, the rows going up at wait().
  virtual std::unique_ptr<PendingRows> start_allgather_rows(const Collectives& comm, const DTensor& mine,
                                                            const std::vector<int64_t>& rows_of, int64_t total) = 0;
  virtual std::unique_ptr<PendingRows> start_alltoall_rows(const Collectives& comm, const DTensor& send,
                                                           const std::vector<int64_t>& send_rows,
                                                           const std::vector<int64_t>& recv_rows, int64_t total) = 0;

 public:
  // ---- ops ----
  // out [T, D] F32 = table[ids[t], :]; ids [T] I32 on this device (validated by the caller).
  virtual void embed(const DTensor& table, const DTensor& ids, const DTensor& out) = 0;
  // y [rows, D] = x / sqrt(mean(x^2) + eps) * (w | 1 + w)   (w undefined: no weight). x F32 or
  // act; y act or F32; y may be x.
  virtual void rmsnorm(const DTensor& x, const DTensor& w, const DTensor& y, float eps, bool zero_centered) = 0;
  // y = rmsnorm(x) * w * act(gate), rows of the last dim of w.
  virtual void gated_rmsnorm(const DTensor& x, const DTensor& gate, const DTensor& w, const DTensor& y, float eps,
                             GateAct act) = 0;
  // h += y  (h F32 or act, y any float dtype; same numel)
  virtual void add(const DTensor& h, const DTensor& y) = 0;
  // x *= sigmoid(g)  (same shape)
  virtual void mul_sigmoid(const DTensor& x, const DTensor& g) = 0;
  // y [T, out] = x [T, in] · W [out, in]^T (+ bias [out] F32). y act or F32. An FP8 block-scaled
  // W (CUDA) multiplies the activations quantised as DeepSeek's act_quant (E4M3, one fp32 scale
  // amax / 448 per 128 of a row: core/fp8 per-tile), on the FP8 tensor cores.
  virtual void linear(const DTensor& x, const DTensor& W, const DTensor& bias, const DTensor& y) = 0;
  // y [T, D] = down(silu(gate x) * up x)
  virtual void swiglu_mlp(const DTensor& x, const SwigluWeights& w, const DTensor& y) = 0;
  // Routed experts (+ shared expert) for T tokens: y [T, DX] (overwritten) from the experts' input
  // x [T, DX]; the router reads w.route_x [T, D] when defined, else x (DX = D).
  virtual void moe(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& y) = 0;
  // The routing alone: idx [T, top_k] I32 (ascending experts), wt [T, top_k] F32, as moe() routes
  // (w.route_x or x, w.fixed; expert parallelism routes once, then sends rows to the experts' owners).
  virtual void moe_route(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& idx,
                         const DTensor& wt) = 0;
  // Short causal depthwise conv + SiLU over one sequence: x, y [T, C]; w [C, W] act; state
  // [W-1, C] act, in/out (the last W-1 inputs).
  virtual void short_conv(const DTensor& x, const DTensor& w, const DTensor& state, const DTensor& y) = 0;
  // The same with y split by columns into ys (at most 3, widths summing to C; the linear-attention
  // mixers' q | k | v, written where the scan reads them). Default: short_conv into a temporary
  // [T, C], then copy_cols into each.
  virtual void short_conv_split(const DTensor& x, const DTensor& w, const DTensor& state,
                                const std::vector<DTensor>& ys);
  // Delta-rule scan of one sequence from a.state, advancing it (ops/linear_attn.hpp).
  virtual void la_scan(const LaScanArgs& a) = 0;
  // The scan of one sequence (a.cu empty) keeping the state after every row: states [T, HV, K, V]
  // F32, row t the state after row t (a.state ends as the last). Speculative decoding's per-token
  // restore (DESIGN §11). This default scans row by row (the decode path's kernel on a backend
  // that has one) and copies the state after each.
  virtual void la_scan_states(const LaScanArgs& a, const DTensor& states);
  // The same for N sequences of a packed forward whose states live in a pool: rows a.cu[b] ..
  // a.cu[b + 1] of a's inputs are sequence b, its state row slots[b] of pool [cap, HV, K, V] F32
  // (advanced in place; a.state unused); states [rows, HV, K, V] gets the state after every row.
  // This default is la_scan_states per sequence on its slot.
  virtual void la_scan_states_slots(const LaScanArgs& a, const DTensor& pool, const std::vector<int32_t>& slots,
                                    const DTensor& states);
  // One token of each of N sequences whose states live in a pool (model/la_state.hpp LaPool):
  // row b of a's q / k / v / beta / gate / o is sequence b, its state row slots[b] of states
  // [cap, HV, K, V] F32, advanced in place (a.state, a.cu unused). This default is la_scan per
  // sequence on the slot; a backend may run one kernel over the slots.
  virtual void la_decode_slots(const LaScanArgs& a, const DTensor& states, const std::vector<int32_t>& slots);
  // The short conv of one token of each of N sequences: x, y [N, C]; sequence b's tail is row
  // slots[b] of states [cap, W-1, C] (act), updated in place. Default: short_conv per sequence.
  virtual void short_conv_slots(const DTensor& x, const DTensor& w, const DTensor& states,
                                const std::vector<int32_t>& slots, const DTensor& y);
  // The segment's transition (ops/linear_attn.hpp LaTransition): S_end = A · S_begin + B, per value
  // head A [HV, K, K], B [HV, K, V] F32, from a's k, v, beta and gate (a.q, a.state, a.o unused).
  virtual void la_transition(const LaScanArgs& a, const DTensor& A, const DTensor& B) = 0;
  // Ordered merge of n transitions A [n, HV, K, K], B [n, HV, K, V]: S_init[0] = 0,
  // S_init[j+1] = A_j S_init[j] + B_j; S_final [HV, K, V] = the state after the last one.
  virtual void la_merge(const DTensor& A, const DTensor& B, int64_t n, const DTensor& S_init, const DTensor& S_final) = 0;
  // Rotate dims [offset, offset + rope.rot_dim()) of every head of x [T, H, head_stride] for
  // positions pos0 .. pos0+T-1.
  virtual void rope(const Rope& rope, const DTensor& x, int64_t H, int64_t head_stride, int64_t offset, int64_t pos0) = 0;
  // RoPE of a packed batch: rows cu[b] .. cu[b+1] of x are sequence b at positions 0, 1, .. (each
  // restarts at 0; cu as LaScanArgs::cu). Equal to rope() on each slab from pos0 = 0 (this
  // default); a backend may rotate every row in one pass.
  virtual void rope_varlen(const Rope& r, const DTensor& x, int64_t H, int64_t head_stride, int64_t offset,
                           const std::vector<int64_t>& cu) {
    for (size_t b = 0; b + 1 < cu.size(); ++b)
      if (cu[b + 1] > cu[b]) rope(r, x.slab(cu[b], cu[b + 1]), H, head_stride, offset, 0);
  }
  // RoPE of rows at their own positions: row t of x at pos[t] (a decode step of several
  // documents). Equal to rope() on each row (this default); a backend may rotate every row in one
  // pass.
  virtual void rope_rows(const Rope& r, const DTensor& x, int64_t H, int64_t head_stride, int64_t offset,
                         const std::vector<int64_t>& pos) {
    for (size_t t = 0; t < pos.size(); ++t) rope(r, x.slab(int64_t(t), int64_t(t) + 1), H, head_stride, offset, pos[t]);
  }
  // Dense causal or DSA-selected attention (AttnArgs), one sequence or varlen (a.cu).
  virtual void attention(const AttnArgs& a) = 0;
  // Per-head matrix products (the absorbed MLA's W_uk / W_uv, cuBLAS strided-batched on CUDA):
  // for h < H and every row t of x and y,
  //   y[t, h*y_hs .. +n) = x[t, h*x_hs .. +k) · M_h,     fp32 accumulation,
  // M_h = the [k, n] row-major block at W + w0 + h*w_hs (trans_w false), or the transpose of the
  // [n, k] row-major block there (trans_w true); W is a weight in weight_dtype() (never FP8),
  // offsets in elements of W's storage. x, y act dtype, contiguous rows (x.cols() >= H*x_hs
  // ... the last head's k columns fit; likewise y); y's other columns are left as they are.
  virtual void head_matmul(const DTensor& x, int64_t x_hs, int64_t k, const DTensor& W, int64_t w0, int64_t w_hs,
                           bool trans_w, const DTensor& y, int64_t y_hs, int64_t n, int64_t H) = 0;
  // MLA in the absorbed form on the latent cache (one KV head): queries q [T, H, R + DR] (q_nope
  // already multiplied by W_uk, then the rotated q_pe) at positions pos0 .. pos0+T-1; cache kv
  // [S, R + DR] = [c | k_pe] rows of the first S positions (S >= pos0 + T); keys = the whole
  // rows, values = their first R columns:
  //   out[t, h, :] = sum_s softmax_s(scale * q[t, h] · kv[s]) kv[s, :R]          out [T, H, R]
  // over the causal keys, or the DSA selection sel [T, n_sel] I32 as in AttnArgs (a mask on the
  // causal set). Equal to attention() with Hkv = 1, Dk = R + DR, Dv = R (the CPU reference).
  virtual void mla_latent_attention(const DTensor& q, const DTensor& kv, const DTensor& sel, int64_t pos0, int64_t H,
                                    int64_t R, int64_t DR, float scale, const DTensor& out) = 0;
  // Whether mla_latent_attention is one fused kernel for these dims here (cuda: kernels/sparse_mla),
  // rather than the generic attention() over the cache rows. The MLA mixer then takes the absorbed
  // form for DSA selections whatever the FLOP count (mla_mixer.cpp use_absorbed).
  virtual bool mla_latent_fused(int64_t R, int64_t DR) const {
    (void)R;
    (void)DR;
    return false;
  }
  // y = LayerNorm(x) * w + b per row of the last dim of w (torch LayerNorm, biased variance).
  virtual void layer_norm(const DTensor& x, const DTensor& w, const DTensor& b, const DTensor& y, float eps) = 0;
  // DSA lightning indexer Top-K (ops/indexer.hpp): q [T, H*D], w [T, H] F32 (weights_proj output,
  // multiplied by wscale here), keys [S, D] with S >= pos0 + T -> sel [T, K] I32 on this device:
  // per query the K best positions s <= pos0 + t, ascending, -1 padded; ties to the lower position.
  virtual void indexer_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& keys, int64_t pos0,
                            int64_t H, int64_t K, const DTensor& sel) = 0;
  // GLM-5.3-Flash's k-pool selection (ops/indexer.hpp kpool_select): cache [S, 2D] (key | gate per
  // token, S >= pos0 + T), ape [P, D] F32 -> sel [T, Kp·P + (tail ? P − 1 : 0)] I32.
  virtual void indexer_kpool_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& cache,
                                  const DTensor& ape, int64_t P, int64_t pos0, int64_t H, int64_t Kp, bool tail,
                                  const DTensor& sel) = 0;
  // In-place quantisation round trips of rows (last dim): what a cache in that format holds
  // (core/fp8.hpp): MXFP8 (the indexer's q and k), per-128-tile FP8 (the latent KV cache), BF16.
  enum class Round { Mxfp8, KvFp8, Bf16 };
  virtual void quant_round(const DTensor& x, Round kind) = 0;
  // ---- DeepSeek-V4 (ops/attention.hpp dsv4_attention, ops/indexer.hpp group_select) ----
  // out [S / P, D] act: per group p and channel c, Σ_j softmax_j(src[pP + j, D + c] + ape[j, c]) ·
  // src[pP + j, c] over its P rows; src [S, 2D] act = [value | gate] rows, ape [P, D] F32 (the
  // compressors' pooling; the k-pool indexer's pooled keys).
  virtual void pool_softmax(const DTensor& src, const DTensor& ape, int64_t P, const DTensor& out) = 0;
  // sel [T, K] I32: group_select of queries q [T, H·D] (act) at pos0 .. with weights w [T, H] F32
  // (times wscale) over keys [NG, D] (act), groups of P positions.
  virtual void group_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& keys, int64_t P,
                          int64_t pos0, int64_t H, int64_t K, const DTensor& sel) = 0;
  // DeepSeek-V4's attention: q [T, H·D] act at pos0 .., raw [>= pos0 + T, D] act (the window
  // rows), comp [NC, D] act (compressed entries; may be empty), sel [T, K] I32 (CSA) or undefined
  // (HCA: all closed entries, compress rate m; m == 0 and comp empty: the window alone), sinks [H]
  // F32, out [T, H·D] act.
  virtual void dsv4_attention(const DTensor& q, const DTensor& raw, const DTensor& comp, const DTensor& sel,
                              const DTensor& sinks, int64_t pos0, int64_t H, int64_t W, int64_t m, float scale,
                              const DTensor& out) = 0;
  // Block AttnRes depth mixture (model/attn_res.hpp): values = blocks[0 .. n) then partial, each
  // [T, D] F32; query [D] F32 (w_norm ⊙ w_proj); out [T, D] F32.
  virtual void attn_res_mix(const DTensor& blocks, int64_t n, const DTensor& partial, const DTensor& query, float eps,
                            const DTensor& out) = 0;
  // mHC hyper-connections (ops/hyper.hpp), streams x [T, N·D] F32:
  //   hc_pre: coeff [T, (2+N)N] F32 (pre | post | comb) and the sub-layer input in [T, D] F32, from
  //           fn [(2+N)N, N·D], base [(2+N)N], scale [3] (F32)
  //   hc_post: x <- post ⊗ y + combᵀ x with y [T, D] (act dtype)
  //   hc_expand: x = h [T, D] F32 in every stream;  hc_mean: out [T, D] F32 = the streams' mean
  virtual void hc_pre(const DTensor& x, const DTensor& fn, const DTensor& base, const DTensor& scale, const HcParams& p,
                      const DTensor& coeff, const DTensor& in) = 0;
  virtual void hc_post(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N) = 0;
  //   hc_post_pre: hc_post, then the next sub-layer's hc_pre from the new streams (its fn / base /
  //           scale) into coeff_next (which may be coeff) and its pre-norm: norm.out [T, D] (act
  //           dtype) = rmsnorm(in_next, norm.w, norm.eps, norm.zc). in_next [T, D] F32 is scratch: a
  //           backend that fuses the collapse with the norm may leave it unwritten. Default: hc_post,
  //           hc_pre, rmsnorm.
  struct HcNorm {
    DTensor w;  // [D] F32
    float eps = 0.f;
    bool zc = false;  // zero-centred: 1 + w
    DTensor out;
  };
  virtual void hc_post_pre(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N, const DTensor& fn,
                           const DTensor& base, const DTensor& scale, const HcParams& p, const DTensor& coeff_next,
                           const DTensor& in_next, const HcNorm& norm) {
    hc_post(x, coeff, y, N);
    hc_pre(x, fn, base, scale, p, coeff_next, in_next);
    rmsnorm(in_next, norm.w, norm.out, norm.eps, norm.zc);
  }
  virtual void hc_expand(const DTensor& h, int64_t N, const DTensor& x) = 0;
  virtual void hc_mean(const DTensor& x, int64_t N, const DTensor& out) = 0;
  // The first sub-layer, whose N streams are all the embedding h [T, D] F32 (the streams x [T, N·D]
  // are then never read, only written by its post):
  //   hc_pre_expand: hc_pre of the streams h, ..., h; x is scratch. Default: hc_expand into x, hc_pre.
  //   hc_post_pre_expand: hc_post_pre of the streams h, ..., h into x. Default: hc_expand, hc_post_pre.
  // The last sub-layer of a model with the mean head:
  //   hc_post_mean: out [T, D] F32 = the streams' mean after hc_post; x is left unspecified (it
  //           need not be written). Default: hc_post, hc_mean.
  virtual void hc_pre_expand(const DTensor& h, int64_t N, const DTensor& x, const DTensor& fn, const DTensor& base,
                             const DTensor& scale, const HcParams& p, const DTensor& coeff, const DTensor& in) {
    hc_expand(h, N, x);
    hc_pre(x, fn, base, scale, p, coeff, in);
  }
  virtual void hc_post_pre_expand(const DTensor& h, const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N,
                                  const DTensor& fn, const DTensor& base, const DTensor& scale, const HcParams& p,
                                  const DTensor& coeff_next, const DTensor& in_next, const HcNorm& norm) {
    hc_expand(h, N, x);
    hc_post_pre(x, coeff, y, N, fn, base, scale, p, coeff_next, in_next, norm);
  }
  virtual void hc_post_mean(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N, const DTensor& out) {
    hc_post(x, coeff, y, N);
    hc_mean(x, N, out);
  }

  // ---- LM head pieces (vocabulary shard of n columns, reductions in fp32/fp64) ----
  // parts [rows, 3] on the host, per row of logits [rows, n] F32: the row's max m, the sum of
  // exp(logit - m) (fp64 sum), and the logit of column target[r] - v0 when it lies in [0, n) (else
  // 0). Shards of a row merge as M = max m_r, S = sum s_r exp(m_r - M) (LmHead::chunk).
  virtual void lse_parts(const DTensor& logits, const std::vector<int32_t>& target, int64_t v0,
                         std::vector<double>& parts) = 0;
  // Per row the k largest logits, highest first, lower column first on ties: ids (column) and
  // values, returned on the host [rows, k].
  virtual void row_topk(const DTensor& logits, int64_t k, std::vector<int32_t>& ids, std::vector<float>& vals) = 0;
  // Rows of logits computed per LM-head chunk (memory of rows × n fp32 logits).
  virtual int64_t lm_rows_per_chunk(int64_t n) const = 0;

  // ---- graphs (decode: model/decode_runner.hpp is the one place that captures) ----
  // Between capture_begin and capture_end the ops issued are recorded, not run; capture_end
  // returns them as a graph. Nothing in between may upload, download or wait for the device (each
  // is refused), and memory allocated before the capture and released during it is released
  // after it. A backend without graphs (the CPU) refuses capture_begin.
  virtual bool supports_graphs() const { return false; }
  virtual void capture_begin();
  virtual std::unique_ptr<DeviceGraph> capture_end();
  // Ends an open capture without a graph (the error path); nothing when none is open.
  virtual void capture_abort() {}

  // ---- reporting ----
  virtual std::string describe() const = 0;   // "cpu" / "cuda:0 NVIDIA H200"
  virtual int device_index() const = 0;       // the GPU (-1: host)
  virtual void* native_stream() const = 0;    // the stream every op is issued on (CUDA), or nullptr
  virtual int64_t peak_memory_bytes() const = 0;  // device memory high-water mark (0: host backend)
  virtual int64_t memory_in_use_bytes() const = 0;  // device memory allocated now (0: host backend)
  virtual void reset_peak_memory() = 0;               // the high-water mark restarts from what is in use
  // Brackets what a profiler started with collection off records (CUDA: cudaProfilerStart/Stop,
  // for `ncu --profile-from-start off`); nothing on the host backend.
  virtual void profile(bool on) { (void)on; }

 protected:
  // The shape rules of head_matmul, the same on every backend (each adds its dtype rules).
  static void check_head_matmul(const DTensor& x, int64_t x_hs, int64_t k, const DTensor& W, int64_t w0, int64_t w_hs,
                                const DTensor& y, int64_t y_hs, int64_t n, int64_t H);
  // The shape and slot rules of la_decode_slots / short_conv_slots (slots inside the pool).
  static void check_la_slots(const LaScanArgs& a, const DTensor& states, const std::vector<int32_t>& slots);
  static void check_conv_slots(const DTensor& x, const DTensor& w, const DTensor& states,
                               const std::vector<int32_t>& slots, const DTensor& y);
  // The shape rules of moe_route's outputs idx (I32) and wt (F32) and of w.fixed, all [T, top_k].
  static void check_moe_route(const MoeWeights& w, int64_t T, int64_t k, const DTensor& idx, const DTensor& wt);
  // The rules of moe's expert-parallel inputs: the local experts inside the E, and w.fixed_wt (when
  // defined) beside w.fixed, both [T, top_k].
  static void check_moe_local(const MoeWeights& w, int64_t T, int64_t k, int64_t E);
  // The rules of short_conv_split: 1 to 3 output blocks of x's rows, widths summing to C.
  static void check_conv_split(const DTensor& x, const DTensor& w, const std::vector<DTensor>& ys);
  // The shape rules of mla_latent_attention; returns T, the number of queries.
  static int64_t check_mla_latent(const DTensor& q, const DTensor& kv, const DTensor& out, int64_t H, int64_t R,
                                  int64_t DR);
  // mla_latent_attention as its definition: attention() with one KV head (Dk = R + DR, Dv = R) over
  // a copy of the value columns. The CPU reference; on CUDA the path for sizes sparse_mla lacks.
  void mla_latent_attention_generic(const DTensor& q, const DTensor& kv, const DTensor& sel, int64_t pos0, int64_t H,
                                    int64_t R, int64_t DR, float scale, const DTensor& out);
};

std::unique_ptr<Backend> make_cpu_backend();
// A shared CPU backend (stateless: every call allocates its own memory), the default for modules
// built without a backend (tools, tests).
Backend& cpu_backend();
// The CUDA backend on the local GPU `device` (throws when dayzero was built without CUDA or the
// GPU cannot be used).
std::unique_ptr<Backend> make_cuda_backend(int device);
int cuda_device_count();  // 0 without CUDA or without a usable GPU

}  // namespace dz
