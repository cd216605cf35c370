// The CPU backend: host fp32 tensors, every op composed of the reference ops in lib/ops, in the
// order the reference modules always used, so results are bit-identical to them (the goldens and
// the parallel-equality tests hold this backend to that).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/backend.hpp"
#include "core/parallel.hpp"
#include "core/bf16.hpp"
#include "core/linalg.hpp"
#include "core/fp8.hpp"
#include "ops/attention.hpp"
#include "ops/indexer.hpp"
#include "ops/linear_attn.hpp"
#include "ops/hyper.hpp"
#include "ops/moe.hpp"
#include "ops/norm.hpp"
#include "ops/rope.hpp"
#include "ops/short_conv.hpp"

namespace dz {

namespace {

const float* opt(const DTensor& t) { return t.defined() && t.numel() ? t.f32() : nullptr; }

void same_numel(const DTensor& a, const DTensor& b, const char* op) {
  DZ_CHECK(a.numel() == b.numel(), op, ": ", shape_str(a.shape), " vs ", shape_str(b.shape));
}

SwigluView view(const SwigluWeights& w, int64_t e = -1) {
  SwigluView v;
  if (e < 0) {
    v.inter = w.gate.dim(0);
    v.gate = w.gate.f32();
    v.up = w.up.f32();
    v.down = w.down.f32();
  } else {
    v.inter = w.gate.dim(1);
    const int64_t D = w.gate.dim(2);
    v.gate = w.gate.f32() + e * v.inter * D;
    v.up = w.up.f32() + e * v.inter * D;
    v.down = w.down.f32() + e * D * v.inter;
  }
  v.down_ld = v.inter;
  v.act = w.act;
  return v;
}

// An MPI exchange between tensors in flight (allgather_rows_start, alltoall_rows_start): holds the
// buffers until it completes (the request, declared last, is completed first when it is destroyed
// unwaited).
struct HeldRows final : PendingRows {
  DTensor in, out;
  std::unique_ptr<CommRequest> req;
  DTensor wait() override {
    req->wait();
    return out;
  }
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::Host; }
  DType act_dtype() const override { return DType::F32; }
  DType weight_dtype() const override { return DType::F32; }

  DTensor alloc(const Shape& s, DType dt) override {
    DZ_CHECK(dt == DType::F32 || dt == DType::I32, "cpu backend: tensors are F32 or I32, not ", to_string(dt));
    DTensor t;
    t.dtype = dt;
    t.shape = s;
    const size_t n = std::max<size_t>(t.bytes(), 1);
    t.mem = std::shared_ptr<void>(std::malloc(n), std::free);
    DZ_CHECK(t.mem, "cpu backend: out of memory allocating ", n, " bytes");
    t.data = t.mem.get();
    return t;
  }
  DTensor upload(const float* src, const Shape& s, DType) override {
    DTensor t = alloc(s, DType::F32);  // the reference keeps fp32 whatever is asked
    if (t.numel()) std::memcpy(t.data, src, t.bytes());
    return t;
  }
  DTensor upload_i32(const int32_t* src, const Shape& s) override {
    DTensor t = alloc(s, DType::I32);
    if (t.numel()) std::memcpy(t.data, src, t.bytes());
    return t;
  }
  void download(const DTensor& t, float* dst) override {
    if (t.numel()) std::memcpy(dst, t.f32(), t.bytes());
  }
  void download_i32(const DTensor& t, int32_t* dst) override {
    if (t.numel()) std::memcpy(dst, t.i32(), t.bytes());
  }
  void fill_zero(const DTensor& t) override {
    if (t.numel()) std::memset(t.data, 0, t.bytes());
  }
  void copy_rows(const DTensor& src, int64_t s0, const DTensor& dst, int64_t d0, int64_t n) override {
    DZ_CHECK(src.dtype == dst.dtype && src.cols() == dst.cols() && s0 >= 0 && d0 >= 0 && s0 + n <= src.rows() &&
                 d0 + n <= dst.rows(),
             "copy_rows: ", n, " rows from ", s0, " of ", shape_str(src.shape), " to ", d0, " of ", shape_str(dst.shape));
    const size_t w = size_t(src.cols()) * dtype_size(src.dtype);
    if (n > 0)
      std::memmove(static_cast<char*>(dst.data) + size_t(d0) * w, static_cast<const char*>(src.data) + size_t(s0) * w,
                   size_t(n) * w);
  }
  void copy_cols(const DTensor& src, int64_t s0, const DTensor& dst, int64_t d0, int64_t w) override {
    DZ_CHECK(src.dtype == dst.dtype && src.rows() == dst.rows() && s0 >= 0 && d0 >= 0 && s0 + w <= src.cols() &&
                 d0 + w <= dst.cols(),
             "copy_cols: ", w, " columns from ", s0, " of ", shape_str(src.shape), " to ", d0, " of ",
             shape_str(dst.shape));
    const size_t es = dtype_size(src.dtype);
    for (int64_t r = 0; r < src.rows(); ++r)
      std::memcpy(static_cast<char*>(dst.data) + size_t(r * dst.cols() + d0) * es,
                  static_cast<const char*>(src.data) + size_t(r * src.cols() + s0) * es, size_t(w) * es);
  }
  void convert(const DTensor& src, const DTensor& dst) override {
    same_numel(src, dst, "convert");
    if (src.data != dst.data && src.numel()) std::memcpy(dst.f32(), src.f32(), src.bytes());
  }
  void fill_dummy(const DTensor& t, uint64_t key, const DummyDist& d, int64_t ld, int64_t r0, int64_t c0) override {
    const int64_t R = t.rows(), C = t.cols();
    float* y = t.f32();
    parallel_for(R * C, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        y[i] = dummy_value(key, uint64_t((r0 + i / C) * ld + c0 + i % C), d);
    });
  }
  void sync() override {}

  void allreduce_sum(const Collectives* comm, const DTensor& t) override {
    if (comm && comm->size() > 1) comm->allreduce_sum(t.f32(), t.numel());
  }
  // MPI on the buffers themselves.
  std::unique_ptr<PendingRows> start_alltoall_rows(const Collectives& comm, const DTensor& send,
                                                   const std::vector<int64_t>& send_rows,
                                                   const std::vector<int64_t>& recv_rows, int64_t total) override {
    const size_t row = size_t(send.cols()) * dtype_size(send.dtype);
    auto p = std::make_unique<HeldRows>();
    p->in = send;
    p->out = alloc({total, send.cols()}, send.dtype);
    p->req = comm.ialltoallv_into(send.data, row_bytes_of(send_rows, row), p->out.data, row_bytes_of(recv_rows, row));
    return p;
  }
  std::unique_ptr<PendingRows> start_allgather_rows(const Collectives& comm, const DTensor& mine,
                                                    const std::vector<int64_t>& rows_of, int64_t total) override {
    const int64_t W = mine.cols();
    auto p = std::make_unique<HeldRows>();
    p->in = mine;
    p->out = alloc({total, W}, mine.dtype);
    p->req = comm.iallgatherv_into(mine.data, p->out.data, row_bytes_of(rows_of, size_t(W) * dtype_size(mine.dtype)));
    return p;
  }

  void embed(const DTensor& table, const DTensor& ids, const DTensor& out) override {
    const int64_t D = table.cols(), T = ids.numel();
    DZ_CHECK(out.rows() == T && out.cols() == D, "embed: out ", shape_str(out.shape), " for ", T, " ids of width ", D);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(out.f32() + t * D, table.f32() + int64_t(ids.i32()[t]) * D, size_t(D) * sizeof(float));
  }
  void rmsnorm(const DTensor& x, const DTensor& w, const DTensor& y, float eps, bool zc) override {
    same_numel(x, y, "rmsnorm");
    const int64_t D = w.defined() ? w.numel() : x.cols();
    dz::rmsnorm(x.f32(), opt(w), y.f32(), x.numel() / D, D, eps, zc);
  }
  void gated_rmsnorm(const DTensor& x, const DTensor& gate, const DTensor& w, const DTensor& y, float eps,
                     GateAct act) override {
    same_numel(x, y, "gated_rmsnorm");
    same_numel(x, gate, "gated_rmsnorm");
    const int64_t D = w.numel();
    dz::gated_rmsnorm(x.f32(), gate.f32(), w.f32(), y.f32(), x.numel() / D, D, eps, act);
  }
  void add(const DTensor& h, const DTensor& y) override {
    same_numel(h, y, "add");
    float* a = h.f32();
    const float* b = y.f32();
    for (int64_t j = 0; j < h.numel(); ++j) a[j] += b[j];
  }
  void mul_sigmoid(const DTensor& x, const DTensor& g) override {
    same_numel(x, g, "mul_sigmoid");
    float* a = x.f32();
    const float* b = g.f32();
    for (int64_t i = 0; i < x.numel(); ++i) a[i] *= sigmoid(b[i]);
  }
  void linear(const DTensor& x, const DTensor& W, const DTensor& bias, const DTensor& y) override {
    const int64_t in = W.dim(1), out = W.dim(0), T = x.numel() / in;
    DZ_CHECK(x.numel() == T * in && y.numel() == T * out, "linear: x ", shape_str(x.shape), " W ", shape_str(W.shape),
             " y ", shape_str(y.shape));
    if (T > 0) dz::linear(x.f32(), W.f32(), opt(bias), y.f32(), T, in, out);
  }
  void swiglu_mlp(const DTensor& x, const SwigluWeights& w, const DTensor& y) override {
    const int64_t D = w.gate.dim(1), T = x.numel() / D;
    dz::swiglu_mlp(view(w), x.f32(), y.f32(), T, D);
  }
  void moe_route(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& idx,
                 const DTensor& wt) override {
    const DTensor& rx = w.route_x.defined() ? w.route_x : x;  // the router's input
    const int64_t D = w.router.dim(1), T = rx.numel() / D, k = rc.top_k;
    check_moe_route(w, T, k, idx, wt);
    if (T > 0)
      dz::moe_route(rc, rx.f32(), w.router.f32(), opt(w.bias), T, D, static_cast<int32_t*>(idx.data), wt.f32(),
                    w.fixed.defined() ? static_cast<const int32_t*>(w.fixed.data) : nullptr);
  }
  void moe(const RouterConfig& rc, const MoeWeights& w, const DTensor& x, const DTensor& y) override {
    const int64_t k = rc.top_k, El = w.experts.gate.dim(0), E = rc.n_experts;
    const int64_t DX = w.experts.gate.dim(2);  // the experts' input width (the latent, or D)
    const int64_t T = x.numel() / DX, D = w.has_shared ? w.shared.gate.dim(1) : DX;
    DZ_CHECK(x.numel() == T * DX && y.numel() == T * DX, "moe: x ", shape_str(x.shape), " y ", shape_str(y.shape),
             " for rows of ", DX);
    DZ_CHECK(!(w.route_x.defined() && w.has_shared), "moe: a shared expert beside a separate router input");
    check_moe_local(w, T, k, E);
    std::vector<int32_t> idx(static_cast<size_t>(T * k));
    std::vector<float> wt(static_cast<size_t>(T * k));
    if (w.fixed_wt.defined()) {  // routed elsewhere: the experts and weights as given
      std::copy_n(static_cast<const int32_t*>(w.fixed.data), T * k, idx.data());
      std::copy_n(w.fixed_wt.f32(), T * k, wt.data());
    } else {
      moe_route(rc, w, x, host_view(idx.data(), {T, k}), host_view(wt.data(), {T, k}));
    }
    float* out = y.f32();
    std::fill(out, out + T * DX, 0.f);
    std::vector<SwigluView> ex(static_cast<size_t>(E));  // global ids; only the local ones are read
    for (int64_t e = 0; e < El; ++e) ex[size_t(w.e0 + e)] = view(w.experts, e);
    moe_experts_acc(ex, x.f32(), T, DX, idx.data(), wt.data(), k, w.e0, w.e0 + El, out);
    if (!w.has_shared) return;
    std::vector<float> sh(static_cast<size_t>(T * D));  // [T, D]
    dz::swiglu_mlp(view(w.shared), x.f32(), sh.data(), T, D);
    const float* g = opt(w.shared_gate);
    for (int64_t t = 0; t < T; ++t) {
      const float gv = g ? sigmoid(dot(x.f32() + t * D, g, D)) : 1.f;
      for (int64_t d = 0; d < D; ++d) out[t * D + d] += g ? gv * sh[size_t(t * D + d)] : sh[size_t(t * D + d)];
    }
  }
  void short_conv(const DTensor& x, const DTensor& w, const DTensor& state, const DTensor& y) override {
    const int64_t C = w.dim(0), W = w.dim(1), T = x.numel() / C;
    short_conv_silu(x.f32(), w.f32(), nullptr, T, C, W, state.f32(), y.f32());
  }
  // What the mixers computed before the scan: L2-normalised q (when asked) and k, sigmoid beta,
  // the log-decay from the raw gate input.
  struct ScanInputs {
    std::vector<float> q, k, beta, g;
  };
  static ScanInputs scan_inputs(const LaScanArgs& a, int64_t T, bool with_q) {
    ScanInputs in;
    if (with_q) {
      in.q.assign(a.q.f32(), a.q.f32() + T * a.HK * a.K);
      l2norm(in.q.data(), in.q.data(), T * a.HK, a.K, 1e-6f);
    }
    in.k.assign(a.k.f32(), a.k.f32() + T * a.HK * a.K);
    l2norm(in.k.data(), in.k.data(), T * a.HK, a.K, 1e-6f);
    in.beta.assign(a.beta.f32(), a.beta.f32() + T * a.HV);
    for (auto& b : in.beta) b = sigmoid(b);
    const int64_t GK = a.kda ? a.K : 1;
    in.g.resize(size_t(T * a.HV * GK));
    if (a.gate.lower_bound == 0.f)
      kda_gate_softplus(a.gate.f.f32(), a.gate.A_log.f32(), opt(a.gate.dt_bias), T, a.HV, GK, in.g.data());
    else
      kda_gate_lower_bound(a.gate.f.f32(), a.gate.A_log.f32(), opt(a.gate.dt_bias), a.gate.lower_bound, T, a.HV, GK,
                           in.g.data());
    return in;
  }
  void la_scan(const LaScanArgs& a) override {
    if (!a.cu.empty()) {  // varlen: each sequence on its own, as the reference does
      for (int64_t b = 0; b < a.sequences(); ++b) la_scan(a.sequence(b));
      return;
    }
    const int64_t T = a.v.numel() / (a.HV * a.V);
    const ScanInputs in = scan_inputs(a, T, true);
    auto* fn = T >= kLaChunk ? (a.kda ? kda_chunked : gdn_chunked) : nullptr;
    if (fn)
      fn(in.q.data(), in.k.data(), a.v.f32(), in.g.data(), in.beta.data(), T, a.HK, a.HV, a.K, a.V, a.scale,
         a.state.f32(), a.o.f32(), kLaChunk);
    else
      (a.kda ? kda_recurrent : gdn_recurrent)(in.q.data(), in.k.data(), a.v.f32(), in.g.data(), in.beta.data(), T,
                                              a.HK, a.HV, a.K, a.V, a.scale, a.state.f32(), a.o.f32());
  }
  void la_transition(const LaScanArgs& a, const DTensor& A, const DTensor& B) override {
    const int64_t T = a.v.numel() / (a.HV * a.V);
    const ScanInputs in = scan_inputs(a, T, false);
    const LaTransition tr = (a.kda ? kda_transition : gdn_transition)(in.k.data(), a.v.f32(), in.g.data(),
                                                                      in.beta.data(), T, a.HK, a.HV, a.K, a.V);
    std::copy(tr.A.begin(), tr.A.end(), A.f32());
    std::copy(tr.B.begin(), tr.B.end(), B.f32());
  }
  void la_merge(const DTensor& A, const DTensor& B, int64_t n, const DTensor& S_init, const DTensor& S_final) override {
    const int64_t HV = A.dim(1), K = A.dim(2), V = B.dim(3), nA = HV * K * K, nB = HV * K * V;
    LaTransition tr;
    tr.H = HV, tr.K = K, tr.V = V;
    std::vector<float> S(size_t(nB), 0.f);
    for (int64_t j = 0; j < n; ++j) {
      std::copy(S.begin(), S.end(), S_init.f32() + j * nB);
      tr.A.assign(A.f32() + j * nA, A.f32() + (j + 1) * nA);
      tr.B.assign(B.f32() + j * nB, B.f32() + (j + 1) * nB);
      la_transition_apply(tr, S_init.f32() + j * nB, S.data());
    }
    std::copy(S.begin(), S.end(), S_final.f32());
  }
  void rope(const Rope& r, const DTensor& x, int64_t H, int64_t hs, int64_t offset, int64_t pos0) override {
    const int64_t T = x.numel() / (H * hs);
    r.apply(x.f32(), T, H, hs, offset, pos0);
  }
  void attention(const AttnArgs& a) override {
    const int64_t T = a.q.numel() / (a.Hq * a.Dk), S = a.k.numel() / (a.Hkv * a.Dk);
    if (!a.cu.empty()) {  // varlen: each sequence on its own, exactly the one-sequence call
      a.check_varlen(T, S);
      for (int64_t b = 0; b < a.sequences(); ++b) attention(a.sequence(b));
      return;
    }
    if (T == 0) return;
    const bool sparse = a.sel.defined() && a.sel.numel() > 0;
    causal_attention(a.q.f32(), a.k.f32(), a.v.f32(), a.out.f32(), T, a.pos0, S, a.Hq, a.Hkv, a.Dk, a.Dv, a.scale,
                     sparse ? a.sel.i32() : nullptr, sparse ? a.sel.cols() : 0);
  }
  void head_matmul(const DTensor& x, int64_t x_hs, int64_t k, const DTensor& W, int64_t w0, int64_t w_hs, bool trans_w,
                   const DTensor& y, int64_t y_hs, int64_t n, int64_t H) override {
    check_head_matmul(x, x_hs, k, W, w0, w_hs, y, y_hs, n, H);
    DZ_CHECK(!W.block_scales, "head_matmul: W ", shape_str(W.shape), " is FP8 block-scaled (a weight_dtype() copy is needed)");
    const int64_t T = x.rows(), xc = x.cols(), yc = y.cols();
    const float *xs = x.f32(), *ws = W.f32();
    float* ys = y.f32();
    parallel_for(T * H, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i / H, h = i % H;
        const float* xr = xs + t * xc + h * x_hs;  // [k]
        const float* M = ws + w0 + h * w_hs;
        float* yr = ys + t * yc + h * y_hs;        // [n]
        if (trans_w) {
          for (int64_t j = 0; j < n; ++j) yr[j] = dot(xr, M + j * k, k);
        } else {
          std::fill(yr, yr + n, 0.f);
          for (int64_t r = 0; r < k; ++r)
            for (int64_t j = 0; j < n; ++j) yr[j] += xr[r] * M[r * n + j];
        }
      }
    }, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, k * n)));
  }
  void mla_latent_attention(const DTensor& q, const DTensor& kv, const DTensor& sel, int64_t pos0, int64_t H, int64_t R,
                            int64_t DR, float scale, const DTensor& out) override {
    mla_latent_attention_generic(q, kv, sel, pos0, H, R, DR, scale, out);
  }
  void layer_norm(const DTensor& x, const DTensor& w, const DTensor& b, const DTensor& y, float eps) override {
    same_numel(x, y, "layer_norm");
    const int64_t D = w.numel();
    dz::layer_norm(x.f32(), opt(w), opt(b), y.f32(), x.numel() / D, D, eps);
  }
  void indexer_kpool_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& cache, const DTensor& ape,
                          int64_t P, int64_t pos0, int64_t H, int64_t Kp, bool tail, const DTensor& sel) override {
    const int64_t T = w.rows(), D = cache.cols() / 2, S = cache.rows();
    std::vector<float> ws(w.f32(), w.f32() + T * H);
    for (float& v : ws) v *= wscale;
    std::vector<float> kp(static_cast<size_t>(std::max<int64_t>(S / P, 1) * D));
    kpool_pooled_keys(cache.f32(), ape.f32(), S, D, P, kp.data());
    kpool_select(q.f32(), ws.data(), kp.data(), T, pos0, S, H, D, P, Kp, tail, sel.i32());
  }
  void pool_softmax(const DTensor& src, const DTensor& ape, int64_t P, const DTensor& out) override {
    const int64_t D = src.cols() / 2, S = src.rows();
    DZ_CHECK(src.cols() == 2 * D && ape.numel() == P * D && out.numel() == (S / P) * D && S % P == 0,
             "pool_softmax: src ", shape_str(src.shape), ", ape ", shape_str(ape.shape), ", groups of ", P, " -> ",
             shape_str(out.shape));
    kpool_pooled_keys(src.f32(), ape.f32(), S, D, P, out.f32());
  }
  void group_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& keys, int64_t P, int64_t pos0,
                  int64_t H, int64_t K, const DTensor& sel) override {
    const int64_t T = w.rows(), D = keys.cols();
    DZ_CHECK(q.numel() == T * H * D && sel.numel() == T * K && sel.dtype == DType::I32, "group_topk: q ",
             shape_str(q.shape), ", keys ", shape_str(keys.shape), ", sel ", shape_str(sel.shape));
    std::vector<float> ws(w.f32(), w.f32() + T * H);
    for (float& v : ws) v *= wscale;
    group_select(q.f32(), ws.data(), keys.f32(), T, pos0, keys.rows(), H, D, P, K, sel.i32());
  }
  void dsv4_attention(const DTensor& q, const DTensor& raw, const DTensor& comp, const DTensor& sel,
                      const DTensor& sinks, int64_t pos0, int64_t H, int64_t W, int64_t m, float scale,
                      const DTensor& out) override {
    const int64_t D = raw.cols(), T = q.rows();
    const bool has_sel = sel.defined() && sel.numel() > 0;
    DZ_CHECK(q.numel() == T * H * D && out.numel() == T * H * D && raw.rows() >= pos0 + T &&
                 (!comp.defined() || comp.numel() == 0 || comp.cols() == D) && sinks.numel() == H &&
                 (!has_sel || sel.rows() == T),
             "dsv4_attention: q ", shape_str(q.shape), ", raw ", shape_str(raw.shape), ", comp ", shape_str(comp.shape),
             ", sel ", shape_str(sel.shape), ", ", H, " heads");
    const int64_t nc = comp.defined() ? comp.rows() : 0;
    dz::dsv4_attention(q.f32(), raw.f32(), nc ? comp.f32() : nullptr, nc, has_sel ? sel.i32() : nullptr,
                       has_sel ? sel.cols() : 0, sinks.f32(), out.f32(), T, pos0, H, D, W, m, scale);
  }
  void indexer_topk(const DTensor& q, const DTensor& w, float wscale, const DTensor& keys, int64_t pos0, int64_t H,
                    int64_t K, const DTensor& sel) override {
    const int64_t T = w.rows(), D = keys.cols(), S = keys.rows();
    std::vector<float> ws(w.f32(), w.f32() + T * H);
    for (float& v : ws) v *= wscale;
    // Score in blocks of query rows so prefill memory stays at rows × S.
    const int64_t block = 64;
    std::vector<float> scores;
    for (int64_t t0 = 0; t0 < T; t0 += block) {
      const int64_t n = std::min(block, T - t0);
      scores.resize(size_t(n * S));
      indexer_scores(q.f32() + t0 * H * D, ws.data() + t0 * H, keys.f32(), scores.data(), n, pos0 + t0, S, H, D);
      topk_positions(scores.data(), sel.i32() + t0 * K, n, pos0 + t0, S, K);
    }
  }
  void quant_round(const DTensor& x, Round kind) override {
    const int64_t n = x.cols(), rows = x.rows();
    if (kind == Round::Mxfp8) mxfp8_round(x.f32(), rows, n, x.f32());
    if (kind == Round::KvFp8) kv_fp8_round(x.f32(), rows, n, x.f32());
    if (kind == Round::Bf16) bf16_round(x.f32(), rows * n, x.f32());
  }
  void hc_pre(const DTensor& x, const DTensor& fn, const DTensor& base, const DTensor& scale, const HcParams& p,
              const DTensor& coeff, const DTensor& in) override {
    dz::hc_pre(x.f32(), fn.f32(), base.f32(), scale.f32(), p, x.rows(), in.cols(), coeff.f32(), in.f32());
  }
  void hc_post(const DTensor& x, const DTensor& coeff, const DTensor& y, int64_t N) override {
    dz::hc_post(x.f32(), coeff.f32(), y.f32(), N, y.rows(), y.cols());
  }
  void hc_expand(const DTensor& h, int64_t N, const DTensor& x) override {
    const int64_t T = h.rows(), D = h.cols();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) std::copy(h.f32() + t * D, h.f32() + (t + 1) * D, x.f32() + (t * N + n) * D);
  }
  void hc_mean(const DTensor& x, int64_t N, const DTensor& out) override {
    const int64_t T = out.rows(), D = out.cols();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        float s = 0.f;
        for (int64_t n = 0; n < N; ++n) s += x.f32()[(t * N + n) * D + d];
        out.f32()[t * D + d] = s / float(N);
      }
  }
  void attn_res_mix(const DTensor& blocks, int64_t n, const DTensor& partial, const DTensor& query, float eps,
                    const DTensor& out) override {
    const int64_t D = partial.cols(), T = partial.rows();
    dz::attn_res_mix(n ? blocks.f32() : nullptr, n, partial.f32(), query.f32(), T, D, eps, out.f32());
  }

  void lse_parts(const DTensor& lg, const std::vector<int32_t>& target, int64_t v0,
                 std::vector<double>& parts) override {
    const int64_t m = lg.rows(), n = lg.cols();
    parts.assign(size_t(3 * m), 0.0);
    for (int64_t i = 0; i < m; ++i) {
      const float* x = lg.f32() + i * n;
      float mx = -INFINITY;  // NaN never wins (as fmaxf on the GPU): it reaches the sum instead
      for (int64_t j = 0; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(double(x[j]) - mx);
      parts[size_t(3 * i)] = mx;
      parts[size_t(3 * i + 1)] = s;
      const int64_t t = int64_t(target[size_t(i)]) - v0;
      if (t >= 0 && t < n) parts[size_t(3 * i + 2)] = double(x[t]);
    }
  }
  void row_topk(const DTensor& lg, int64_t k, std::vector<int32_t>& ids, std::vector<float>& vals) override {
    const int64_t m = lg.rows(), n = lg.cols();
    k = std::min(k, n);
    ids.resize(size_t(m * k));
    vals.resize(size_t(m * k));
    std::vector<int32_t> idx(static_cast<size_t>(n));
    for (int64_t r = 0; r < m; ++r) {
      const float* x = lg.f32() + r * n;
      std::iota(idx.begin(), idx.end(), 0);
      // NaN ranks below every number (as in the CUDA kernel, where it never wins a comparison),
      // which also keeps the order strict and weak
      auto key = [&](int32_t a) { return std::isnan(x[a]) ? -std::numeric_limits<float>::infinity() : x[a]; };
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        const float ka = key(a), kb = key(b);
        return ka > kb || (ka == kb && a < b);
      });
      for (int64_t j = 0; j < k; ++j) {
        ids[size_t(r * k + j)] = idx[size_t(j)];
        vals[size_t(r * k + j)] = x[idx[size_t(j)]];
      }
    }
  }
  int64_t lm_rows_per_chunk(int64_t) const override { return 32; }
  std::string describe() const override { return "cpu"; }
  int device_index() const override { return -1; }
  void* native_stream() const override { return nullptr; }
  int64_t peak_memory_bytes() const override { return 0; }
  int64_t memory_in_use_bytes() const override { return 0; }
  void reset_peak_memory() override {}
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

Backend& cpu_backend() {
  static CpuBackend be;  // stateless: every call allocates its own memory
  return be;
}

#ifndef DAYZERO_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int) {
  fail("--backend cuda: this dayzero was built without CUDA (configure with nvcc on the PATH, DAYZERO_CUDA=ON)");
}
int cuda_device_count() { return 0; }
#endif

}  // namespace dz
