#include "ops/short_conv.hpp"

#include <algorithm>
#include <vector>

#include "core/error.hpp"
#include "core/linalg.hpp"

namespace dz {

void short_conv_silu(const float* x, const float* w, const float* bias, int64_t T, int64_t C, int64_t W, float* state,
                     float* y) {
  DZ_CHECK(W >= 1 && C >= 0 && T >= 0, "short_conv_silu: bad sizes T=", T, " C=", C, " W=", W);
  const int64_t P = W - 1;  // rows of history
  // Input row s in [-P, T): from the state for s < 0, else from x.
  auto in_row = [&](int64_t s) -> const float* { return s < 0 ? state + (P + s) * C : x + s * C; };
  for (int64_t t = 0; t < T; ++t) {
    float* yr = y + t * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = bias ? bias[c] : 0.f;
    // j ascending for every output element: the same order whatever the chunking.
    for (int64_t j = 0; j < W; ++j) {
      const float* xr = in_row(t - P + j);
      for (int64_t c = 0; c < C; ++c) yr[c] += w[c * W + j] * xr[c];
    }
    for (int64_t c = 0; c < C; ++c) yr[c] = silu(yr[c]);
  }
  if (P == 0) return;
  // New state: the last P rows of [state; x].
  std::vector<float> tail(size_t(P * C));
  for (int64_t r = 0; r < P; ++r) {
    const float* src = in_row(T - P + r);
    for (int64_t c = 0; c < C; ++c) tail[size_t(r * C + c)] = src[c];
  }
  for (int64_t i = 0; i < P * C; ++i) state[i] = tail[size_t(i)];
}

void short_conv_silu_cp(const float* x, const float* w, const float* bias, int64_t C, int64_t W,
                        const SeqLayout& lay, const Collectives& comm, float* state, float* y) {
  DZ_CHECK(W >= 1 && C >= 0, "short_conv_silu_cp: bad sizes C=", C, " W=", W);
  DZ_CHECK(lay.cp_size == comm.size() && lay.cp_rank == comm.rank(), "short_conv_silu_cp: layout for rank ",
           lay.cp_rank, " of ", lay.cp_size, " used on CP rank ", comm.rank(), " of ", comm.size());
  const int64_t P = W - 1;
  const std::vector<int> mine = lay.local_segments();
  // Tails of my segments, ascending: the last min(P, n_j) rows of each.
  std::vector<float> send;
  int64_t r0 = 0;
  for (int j : mine) {
    const int64_t n = lay.seg_len(j), m = ConvHalo::tail_rows(lay, P, j);
    send.insert(send.end(), x + (r0 + n - m) * C, x + (r0 + n) * C);
    r0 += n;
  }
  const ConvHalo halo(lay, P, C, comm.allgatherv(send));
  r0 = 0;
  for (int j : mine) {
    const int64_t n = lay.seg_len(j);
    std::vector<float> st = halo.before(j);
    short_conv_silu(x + r0 * C, w, bias, n, C, W, st.data(), y + r0 * C);
    r0 += n;
  }
  const std::vector<float> last = halo.before(lay.n_seg());
  std::copy(last.begin(), last.end(), state);
}

ConvHalo::ConvHalo(const SeqLayout& lay, int64_t P, int64_t C, std::vector<float> gathered)
    : lay_(lay), P_(P), C_(C), all_(std::move(gathered)), at_(size_t(lay.n_seg()), 0) {
  // Every segment's tail in sequence order (the gather is in rank order, segments ascending).
  size_t pos = 0;
  for (int r = 0; r < lay.cp_size; ++r)
    for (int j : lay.segments_of(r)) {
      at_[size_t(j)] = pos;
      pos += size_t(tail_rows(lay, P, j) * C);
    }
  DZ_CHECK(pos == all_.size(), "conv halo: gathered ", all_.size(), " floats, expected ", pos);
}

std::vector<float> ConvHalo::before(int j) const {
  std::vector<float> st(size_t(P_ * C_), 0.f);
  int64_t need = P_;  // rows of st still to fill, from the bottom (row P-1) up
  for (int s = j - 1; s >= 0 && need > 0; --s) {
    const int64_t m = std::min(need, tail_rows(lay_, P_, s));
    const float* src = all_.data() + at_[size_t(s)] + (tail_rows(lay_, P_, s) - m) * C_;  // its last m rows
    std::copy(src, src + m * C_, st.begin() + (need - m) * C_);
    need -= m;
  }
  return st;
}

}  // namespace dz
