// Softmax attention core (CPU reference). One query row at a time: gather its key list (causal
// range or the valid part of its selection), score, softmax, weighted sum. Every reduction runs in
// a fixed order, so results do not depend on how a sequence was split into forward calls.
#include "ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "core/parallel.hpp"

namespace dz {

namespace {

// Keys query t (absolute position last) attends: 0..last, or the valid, first-seen entries of its
// selection row. stamp[s] == t marks s as already taken for this query.
void gather_keys(int64_t t, int64_t last, const int32_t* sel, int64_t n_sel, std::vector<int64_t>& stamp,
                 std::vector<int64_t>& keys) {
  keys.clear();
  if (!sel) {
    for (int64_t s = 0; s <= last; ++s) keys.push_back(s);
    return;
  }
  const int32_t* row = sel + t * n_sel;
  for (int64_t j = 0; j < n_sel; ++j) {
    int64_t s = row[j];
    if (s < 0 || s > last || stamp[size_t(s)] == t) continue;
    stamp[size_t(s)] = t;
    keys.push_back(s);
  }
}

// p[i] <- softmax(p[i]) in place over n entries; max-subtracted.
void softmax_inplace(float* p, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, p[i]);
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(p[i] - m);
    sum += p[i];
  }
  float inv = 1.f / sum;
  for (int64_t i = 0; i < n; ++i) p[i] *= inv;
}

void check_common(int64_t T, int64_t pos0, int64_t S, const int32_t* sel, int64_t n_sel, const char* who) {
  DZ_CHECK(T >= 0 && pos0 >= 0 && pos0 + T <= S, who, ": queries at ", pos0, "..", pos0 + T - 1,
           " need a cache of at least ", pos0 + T, " rows, got ", S);
  DZ_CHECK(!sel || n_sel >= 0, who, ": negative selection width ", n_sel);
}

}  // namespace

void causal_attention(const float* q, const float* k, const float* v, float* out, int64_t T, int64_t pos0,
                      int64_t S, int64_t Hq, int64_t Hkv, int64_t Dk, int64_t Dv, float scale,
                      const int32_t* sel, int64_t n_sel) {
  check_common(T, pos0, S, sel, n_sel, "causal_attention");
  DZ_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0, "causal_attention: ", Hq, " query heads not a multiple of ", Hkv,
           " kv heads");
  const int64_t group = Hq / Hkv;
  std::vector<int64_t> stamp(sel ? size_t(S) : 0, -1);
  std::vector<int64_t> keys;
  std::vector<float> p;  // [n_keys]
  keys.reserve(size_t(S));
  for (int64_t t = 0; t < T; ++t) {
    gather_keys(t, pos0 + t, sel, n_sel, stamp, keys);
    const int64_t n = int64_t(keys.size());
    p.resize(size_t(n));
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / group;
      const float* qv = q + (t * Hq + h) * Dk;  // [Dk]
      float* o = out + (t * Hq + h) * Dv;       // [Dv]
      std::fill(o, o + Dv, 0.f);
      if (n == 0) continue;
      for (int64_t i = 0; i < n; ++i) p[size_t(i)] = scale * dot(qv, k + (keys[size_t(i)] * Hkv + kh) * Dk, Dk);
      softmax_inplace(p.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float w = p[size_t(i)];
        const float* vv = v + (keys[size_t(i)] * Hkv + kh) * Dv;  // [Dv]
        for (int64_t d = 0; d < Dv; ++d) o[d] += w * vv[d];
      }
    }
  }
}

void mla_attention_absorbed(const float* q, const float* latent, const float* k_pe, const float* wkv_b,
                            float* out, int64_t T, int64_t pos0, int64_t S, int64_t H, int64_t nope, int64_t rope,
                            int64_t R, int64_t vd, float scale, const int32_t* sel, int64_t n_sel) {
  check_common(T, pos0, S, sel, n_sel, "mla_attention_absorbed");
  DZ_CHECK(H > 0 && R > 0 && nope >= 0 && rope >= 0 && vd > 0, "mla_attention_absorbed: bad dims");
  const int64_t Dq = nope + rope;
  std::vector<int64_t> stamp(sel ? size_t(S) : 0, -1);
  std::vector<int64_t> keys;
  std::vector<float> p, q_lat(static_cast<size_t>(R)), o_lat(static_cast<size_t>(R));
  keys.reserve(size_t(S));
  for (int64_t t = 0; t < T; ++t) {
    gather_keys(t, pos0 + t, sel, n_sel, stamp, keys);
    const int64_t n = int64_t(keys.size());
    p.resize(size_t(n));
    for (int64_t h = 0; h < H; ++h) {
      const float* qn = q + (t * H + h) * Dq;         // [nope]
      const float* qp = qn + nope;                    // [rope]
      const float* wk = wkv_b + h * (nope + vd) * R;  // W_uk[h] [nope, R]
      const float* wv = wk + nope * R;                // W_uv[h] [vd, R]
      float* o = out + (t * H + h) * vd;
      std::fill(o, o + vd, 0.f);
      if (n == 0) continue;
      // q_lat = W_uk[h]^T q_nope  [R]
      std::fill(q_lat.begin(), q_lat.end(), 0.f);
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t r = 0; r < R; ++r) q_lat[size_t(r)] += qn[d] * wk[d * R + r];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s = keys[size_t(i)];
        float sc = dot(q_lat.data(), latent + s * R, R);
        if (rope) sc += dot(qp, k_pe + s * rope, rope);
        p[size_t(i)] = scale * sc;
      }
      softmax_inplace(p.data(), n);
      std::fill(o_lat.begin(), o_lat.end(), 0.f);
      for (int64_t i = 0; i < n; ++i) {
        const float w = p[size_t(i)];
        const float* c = latent + keys[size_t(i)] * R;
        for (int64_t r = 0; r < R; ++r) o_lat[size_t(r)] += w * c[r];
      }
      for (int64_t d = 0; d < vd; ++d) o[d] = dot(wv + d * R, o_lat.data(), R);
    }
  }
}

void dsv4_attention(const float* q, const float* raw, const float* comp, int64_t n_comp, const int32_t* sel, int64_t K,
                    const float* sink, float* out, int64_t T, int64_t pos0, int64_t H, int64_t D, int64_t W, int64_t m,
                    float scale) {
  DZ_CHECK(W > 0 && (sel || m > 0 || n_comp == 0), "dsv4_attention: window ", W, ", compress rate ", m);
  parallel_for(T * H, [&](int64_t i0, int64_t i1) {
    std::vector<const float*> keys;
    std::vector<float> lg;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / H, h = i % H, s = pos0 + t;
      keys.clear();
      for (int64_t j = std::max<int64_t>(0, s - W + 1); j <= s; ++j) keys.push_back(raw + j * D);
      if (sel) {
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = sel[t * K + j];
          if (e < 0) continue;
          DZ_CHECK(e < n_comp, "dsv4_attention: selected entry ", e, " of ", n_comp);
          keys.push_back(comp + int64_t(e) * D);
        }
      } else if (comp) {
        const int64_t nv = std::min<int64_t>((s + 1) / m, n_comp);
        for (int64_t e = 0; e < nv; ++e) keys.push_back(comp + e * D);
      }
      const float* qh = q + (t * H + h) * D;
      lg.resize(keys.size());
      float mx = sink ? sink[h] : -INFINITY;
      for (size_t j = 0; j < keys.size(); ++j) mx = std::max(mx, lg[j] = scale * dot(qh, keys[j], D));
      float z = sink ? std::exp(sink[h] - mx) : 0.f;
      for (size_t j = 0; j < keys.size(); ++j) z += (lg[j] = std::exp(lg[j] - mx));
      float* o = out + (t * H + h) * D;
      std::fill(o, o + D, 0.f);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float p = lg[j] / z;
        for (int64_t d = 0; d < D; ++d) o[d] += p * keys[j][d];
      }
    }
  });
}

}  // namespace dz
