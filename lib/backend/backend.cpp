// The pieces of the Backend interface that every backend shares (backend.hpp).
#include "backend/backend.hpp"

#include "core/error.hpp"
#include "core/fp8.hpp"
#include "core/parallel.hpp"

namespace dz {

void Backend::check_head_matmul(const DTensor& x, int64_t x_hs, int64_t k, const DTensor& W, int64_t w0, int64_t w_hs,
                                const DTensor& y, int64_t y_hs, int64_t n, int64_t H) {
  const int64_t T = x.rows(), xc = x.cols(), yc = y.cols();
  DZ_CHECK(y.rows() == T && H >= 1 && k >= 0 && n >= 0 && (H - 1) * x_hs + k <= xc && (H - 1) * y_hs + n <= yc &&
               w0 >= 0 && w0 + (H - 1) * w_hs + k * n <= W.numel(),
           "head_matmul: ", H, " heads of [", k, "] -> [", n, "] over x ", shape_str(x.shape), " (head stride ", x_hs,
           "), y ", shape_str(y.shape), " (", y_hs, "), W ", shape_str(W.shape), " at ", w0, " (", w_hs, ")");
}

int64_t Backend::check_mla_latent(const DTensor& q, const DTensor& kv, const DTensor& out, int64_t H, int64_t R,
                                  int64_t DR) {
  const int64_t Dk = R + DR, T = q.numel() / (H * Dk);
  DZ_CHECK(kv.cols() == Dk && q.numel() == T * H * Dk && out.numel() == T * H * R, "mla_latent_attention: q ",
           shape_str(q.shape), ", cache ", shape_str(kv.shape), ", out ", shape_str(out.shape), " for ", H,
           " heads of [", R, " + ", DR, "]");
  return T;
}

void Backend::mla_latent_attention_generic(const DTensor& q, const DTensor& kv, const DTensor& sel, int64_t pos0,
                                           int64_t H, int64_t R, int64_t DR, float scale, const DTensor& out) {
  if (check_mla_latent(q, kv, out, H, R, DR) == 0) return;
  DTensor v = alloc({kv.rows(), R}, kv.dtype);  // the values: the latent columns of the cache rows
  copy_cols(kv, 0, v, 0, R);
  AttnArgs a;
  a.q = q;
  a.k = kv;
  a.v = v;
  a.out = out;
  a.sel = sel;
  a.pos0 = pos0;
  a.Hq = H;
  a.Hkv = 1;
  a.Dk = R + DR;
  a.Dv = R;
  a.scale = scale;
  attention(a);
}

void Backend::check_la_slots(const LaScanArgs& a, const DTensor& states, const std::vector<int32_t>& slots) {
  const int64_t N = int64_t(slots.size());
  DZ_CHECK(states.shape.size() == 4 && states.dim(1) == a.HV && states.dim(2) == a.K && states.dim(3) == a.V &&
               states.dtype == DType::F32 && a.v.numel() == N * a.HV * a.V,
           "la_decode_slots: states ", shape_str(states.shape), ", ", N, " slots for ", shape_str(a.v.shape));
  for (int32_t s : slots)
    DZ_CHECK(s >= 0 && s < states.dim(0), "la_decode_slots: slot ", s, " outside the pool of ", states.dim(0));
}

void Backend::check_conv_slots(const DTensor& x, const DTensor& w, const DTensor& states,
                               const std::vector<int32_t>& slots, const DTensor& y) {
  const int64_t C = w.dim(0), W = w.dim(1), N = int64_t(slots.size());
  DZ_CHECK(states.shape.size() == 3 && states.dim(1) == W - 1 && states.dim(2) == C && x.numel() == N * C &&
               y.numel() == N * C,
           "short_conv_slots: x ", shape_str(x.shape), ", states ", shape_str(states.shape), " for conv weights ",
           shape_str(w.shape), ", ", N, " slots");
  for (int32_t s : slots)
    DZ_CHECK(s >= 0 && s < states.dim(0), "short_conv_slots: slot ", s, " outside the pool of ", states.dim(0));
}

void Backend::la_decode_slots(const LaScanArgs& a, const DTensor& states, const std::vector<int32_t>& slots) {
  check_la_slots(a, states, slots);
  for (int64_t b = 0; b < int64_t(slots.size()); ++b) {
    LaScanArgs s = a.rows(b, b + 1);
    s.state = states.slab(slots[size_t(b)], slots[size_t(b)] + 1).reshaped({a.HV, a.K, a.V});
    la_scan(s);
  }
}

void Backend::la_scan_states(const LaScanArgs& a, const DTensor& states) {
  DZ_CHECK(a.cu.empty(), "la_scan_states: one sequence at a time");
  const int64_t T = a.v.numel() / (a.HV * a.V), n = a.HV * a.K * a.V;
  DZ_CHECK(states.numel() == T * n && a.state.numel() == n, "la_scan_states: states ", shape_str(states.shape), " for ",
           T, " rows of state ", shape_str(a.state.shape));
  const DTensor flat = states.reshaped({T, n});
  for (int64_t t = 0; t < T; ++t) {
    la_scan(a.rows(t, t + 1));
    copy_rows(a.state.reshaped({1, n}), 0, flat, t, 1);
  }
}

void Backend::la_scan_states_slots(const LaScanArgs& a, const DTensor& pool, const std::vector<int32_t>& slots,
                                   const DTensor& states) {
  const int64_t N = int64_t(slots.size()), n = a.HV * a.K * a.V;
  DZ_CHECK(N >= 1 && a.sequences() == N && a.cu.back() == a.v.rows() && states.numel() == a.v.rows() * n &&
               pool.numel() % std::max<int64_t>(n, 1) == 0,
           "la_scan_states_slots: ", N, " slots, ", a.sequences(), " sequences, ", a.v.rows(), " rows, states ",
           shape_str(states.shape));
  const DTensor flat = states.reshaped({a.v.rows(), n});
  for (int64_t b = 0; b < N; ++b) {
    const int64_t r0 = a.cu[size_t(b)], r1 = a.cu[size_t(b) + 1];
    const int32_t s = slots[size_t(b)];
    DZ_CHECK(s >= 0 && s < pool.dim(0), "la_scan_states_slots: slot ", s, " outside the pool of ", pool.dim(0));
    if (r1 == r0) continue;
    LaScanArgs q = a.rows(r0, r1);
    q.state = pool.slab(s, s + 1).reshaped({a.HV, a.K, a.V});
    la_scan_states(q, flat.slab(r0, r1).reshaped({r1 - r0, a.HV, a.K, a.V}));
  }
}

DTensor Backend::allgather_rows(const Collectives* comm, const DTensor& mine, const std::vector<int64_t>& rows_of) {
  return allgather_rows_start(comm, mine, rows_of)->wait();
}

std::unique_ptr<PendingRows> Backend::allgather_rows_start(const Collectives* comm, const DTensor& mine,
                                                           const std::vector<int64_t>& rows_of) {
  const int n = comm ? comm->size() : 1;
  const int64_t total = check_gather_rows(n, n > 1 ? comm->rank() : 0, mine, rows_of);
  if (n == 1) return std::make_unique<ReadyRows>(copy_of_rows(mine));
  return start_allgather_rows(*comm, mine, rows_of, total);
}

int64_t Backend::check_gather_rows(int group_size, int rank, const DTensor& mine, const std::vector<int64_t>& rows_of) {
  DZ_CHECK(int64_t(rows_of.size()) == group_size && rank >= 0 && rank < group_size, "allgather_rows: ", rows_of.size(),
           " row counts for a group of ", group_size);
  DZ_CHECK(mine.defined() && mine.rows() == rows_of[size_t(rank)], "allgather_rows: rank ", rank, " holds ",
           shape_str(mine.shape), ", its count says ", rows_of[size_t(rank)], " rows");
  int64_t total = 0;
  for (int64_t n : rows_of) {
    DZ_CHECK(n >= 0, "allgather_rows: a negative row count");
    total += n;
  }
  return total;
}

DTensor Backend::alltoall_rows(const Collectives* comm, const DTensor& send, const std::vector<int64_t>& send_rows,
                               const std::vector<int64_t>& recv_rows) {
  return alltoall_rows_start(comm, send, send_rows, recv_rows)->wait();
}

std::unique_ptr<PendingRows> Backend::alltoall_rows_start(const Collectives* comm, const DTensor& send,
                                                          const std::vector<int64_t>& send_rows,
                                                          const std::vector<int64_t>& recv_rows) {
  const int n = comm ? comm->size() : 1;
  const int64_t total = check_alltoall_rows(n, send, send_rows, recv_rows);
  if (n > 1) return start_alltoall_rows(*comm, send, send_rows, recv_rows, total);
  DZ_CHECK(total == send.rows(), "alltoall_rows: a group of one receives what it sends");
  return std::make_unique<ReadyRows>(copy_of_rows(send));
}

DTensor Backend::copy_of_rows(const DTensor& src) {
  DTensor out = alloc({src.rows(), src.cols()}, src.dtype);
  copy_rows(src, 0, out, 0, src.rows());
  return out;
}

int64_t Backend::check_alltoall_rows(int group_size, const DTensor& send, const std::vector<int64_t>& send_rows,
                                     const std::vector<int64_t>& recv_rows) {
  DZ_CHECK(int64_t(send_rows.size()) == group_size && int64_t(recv_rows.size()) == group_size, "alltoall_rows: ",
           send_rows.size(), " / ", recv_rows.size(), " row counts for a group of ", group_size);
  int64_t ns = 0, nr = 0;
  for (int r = 0; r < group_size; ++r) {
    DZ_CHECK(send_rows[size_t(r)] >= 0 && recv_rows[size_t(r)] >= 0, "alltoall_rows: a negative row count");
    ns += send_rows[size_t(r)], nr += recv_rows[size_t(r)];
  }
  DZ_CHECK(send.defined() && send.rows() == ns, "alltoall_rows: ", shape_str(send.shape), " to send, the counts say ",
           ns, " rows");
  return nr;
}

std::vector<size_t> Backend::row_bytes_of(const std::vector<int64_t>& rows, size_t row_bytes) {
  std::vector<size_t> b(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) b[r] = size_t(rows[r]) * row_bytes;
  return b;
}

void Backend::check_moe_route(const MoeWeights& w, int64_t T, int64_t k, const DTensor& idx, const DTensor& wt) {
  DZ_CHECK(idx.dtype == DType::I32 && idx.numel() == T * k && wt.dtype == DType::F32 && wt.numel() == T * k,
           "moe_route: idx ", shape_str(idx.shape), " wt ", shape_str(wt.shape), " for ", T, " rows of ", k);
  DZ_CHECK(!w.fixed.defined() || (w.fixed.dtype == DType::I32 && w.fixed.numel() == T * k), "moe: fixed experts ",
           shape_str(w.fixed.shape), " for ", T, " rows of ", k);
}

void Backend::check_moe_local(const MoeWeights& w, int64_t T, int64_t k, int64_t E) {
  const int64_t El = w.experts.gate.dim(0);
  DZ_CHECK(w.e0 >= 0 && w.e0 + El <= E, "moe: local experts [", w.e0, ", ", w.e0 + El, ") outside the ", E, " experts");
  DZ_CHECK(!w.fixed_wt.defined() || (w.fixed.defined() && w.fixed.dtype == DType::I32 && w.fixed.numel() == T * k &&
                                     w.fixed_wt.dtype == DType::F32 && w.fixed_wt.numel() == T * k),
           "moe: fixed weights need fixed experts, both [", T, ", ", k, "] (got ", shape_str(w.fixed.shape), ", ",
           shape_str(w.fixed_wt.shape), ")");
}

void Backend::check_conv_split(const DTensor& x, const DTensor& w, const std::vector<DTensor>& ys) {
  const int64_t C = w.dim(0), T = C ? x.numel() / C : 0;
  DZ_CHECK(!ys.empty() && ys.size() <= 3, "short_conv_split: ", ys.size(), " output blocks (1 to 3)");
  int64_t sum = 0;
  for (const DTensor& y : ys) {
    DZ_CHECK(y.shape.size() == 2 && y.rows() == T, "short_conv_split: output block ", shape_str(y.shape), " for ", T,
             " rows");
    sum += y.cols();
  }
  DZ_CHECK(sum == C, "short_conv_split: output blocks ", sum, " columns wide for ", C, " channels");
}

void Backend::short_conv_split(const DTensor& x, const DTensor& w, const DTensor& state,
                               const std::vector<DTensor>& ys) {
  check_conv_split(x, w, ys);
  const int64_t C = w.dim(0), T = C ? x.numel() / C : 0;
  DTensor y = act({T, C});
  short_conv(x, w, state, y);
  int64_t c0 = 0;
  for (const DTensor& b : ys) {
    copy_cols(y, c0, b, 0, b.cols());
    c0 += b.cols();
  }
}

void Backend::short_conv_slots(const DTensor& x, const DTensor& w, const DTensor& states,
                               const std::vector<int32_t>& slots, const DTensor& y) {
  check_conv_slots(x, w, states, slots, y);
  for (size_t b = 0; b < slots.size(); ++b)
    short_conv(x.slab(int64_t(b), int64_t(b) + 1), w,
               states.slab(slots[b], slots[b] + 1).reshaped({states.dim(1), states.dim(2)}),
               y.slab(int64_t(b), int64_t(b) + 1));
}

DTensor Backend::dummy_mx4_experts(const std::vector<uint64_t>& keys, int64_t R, int64_t C, const DummyDist& d,
                                   int64_t ld, int64_t r0, int64_t c0) {
  DZ_CHECK(C % 32 == 0 && c0 % 32 == 0 && ld % 32 == 0, "dummy_mx4_experts: columns ", c0, " + ", C, " of ", ld,
           " are not whole groups of 32");
  const int64_t E = int64_t(keys.size());
  Tensor t({E, R, C});
  parallel_for(E * R, [&](int64_t i0, int64_t i1) {
    uint8_t codes[32], sc;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t e = i / R, r = i % R;
      for (int64_t g = 0; g < C / 32; ++g) {
        dummy_mx4_group(keys[size_t(e)], uint64_t((r0 + r) * ld + c0 + g * 32), d, codes, &sc);
        const float s = e8m0_to_f32(sc);
        for (int j = 0; j < 32; ++j) t.ptr()[i * C + g * 32 + j] = e2m1_to_f32(codes[j]) * s;
      }
    }
  });
  t.mxfp4 = true;
  return weight(t);
}

void Backend::capture_begin() { fail(str("the ", name(), " backend has no graphs (capture_begin)")); }
std::unique_ptr<DeviceGraph> Backend::capture_end() { fail(str("the ", name(), " backend has no graphs (capture_end)")); }

}  // namespace dz
