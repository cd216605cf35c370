#include "ops/linear_attn.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "core/linalg.hpp"

namespace dz {
namespace {

// One core serves both ops: KDA has a decay per key channel (g [T, HV, K]), GDN one per head
// (g [T, HV]), which is the per-channel case with all channels equal.
struct Dims {
  int64_t T, HK, HV, K, V;
  bool per_channel;
  int64_t r() const { return HV / HK; }
  int64_t gk() const { return per_channel ? K : 1; }  // gate values per (t, head)
};

void check_dims(const Dims& d, const char* op) {
  DZ_CHECK(d.T >= 0 && d.HK > 0 && d.HV > 0 && d.K > 0 && d.V > 0, op, ": bad sizes T=", d.T, " HK=", d.HK,
           " HV=", d.HV, " K=", d.K, " V=", d.V);
  DZ_CHECK(d.HV % d.HK == 0, op, ": value heads ", d.HV, " not a multiple of key heads ", d.HK);
}

void recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, const Dims& d,
               float scale, float* state, float* o) {
  const int64_t K = d.K, V = d.V, HV = d.HV, HK = d.HK, GK = d.gk();
  std::vector<float> u(static_cast<size_t>(V)), qs(static_cast<size_t>(K));
  for (int64_t h = 0; h < HV; ++h) {
    const int64_t hk = h / d.r();
    float* S = state + h * K * V;  // [K, V]
    for (int64_t t = 0; t < d.T; ++t) {
      const float* kt = k + (t * HK + hk) * K;
      const float* vt = v + (t * HV + h) * V;
      const float* gt = g + (t * HV + h) * GK;
      for (int64_t i = 0; i < K; ++i) {
        const float a = std::exp(gt[d.per_channel ? i : 0]);
        for (int64_t j = 0; j < V; ++j) S[i * V + j] *= a;
      }
      // u = beta * (v - S^T k), reduced over i in ascending order
      for (int64_t j = 0; j < V; ++j) u[size_t(j)] = 0.f;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) u[size_t(j)] += kt[i] * S[i * V + j];
      const float b = beta[t * HV + h];
      for (int64_t j = 0; j < V; ++j) u[size_t(j)] = b * (vt[j] - u[size_t(j)]);
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) S[i * V + j] += kt[i] * u[size_t(j)];
      if (!o) continue;
      const float* qt = q + (t * HK + hk) * K;
      float* ot = o + (t * HV + h) * V;
      for (int64_t i = 0; i < K; ++i) qs[size_t(i)] = scale * qt[i];
      for (int64_t j = 0; j < V; ++j) ot[j] = 0.f;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) ot[j] += qs[size_t(i)] * S[i * V + j];
    }
  }
}

// Chunked form. Within a chunk of C tokens starting from state S0, with G_i the inclusive cumulative
// log-decay (per channel) and u'_i = beta_i (v_i - k_i^T D_i S_{i-1}) the rows written to the state:
//   (I + L) U' = diag(beta) V - diag(beta) (K ∘ exp(G)) S0,   L[i][j] = beta_i Σ_d k_i k_j exp(G_i - G_j), j < i
// so U' = u - w S0 with [u | w] solved by forward substitution (the UT transform), and
//   o_i   = Σ_d scale q_i exp(G_i) S0 + Σ_{j<=i} (Σ_d scale q_i k_j exp(G_i - G_j)) u'_j
//   S_end = exp(G_C) S0 + Σ_j (k_j ∘ exp(G_C - G_j)) u'_j^T.
// Decays are only ever taken as exp(G_i - G_j) with j <= i or exp(G_i): all <= 1, nothing overflows.
// G is accumulated in double: G_i - G_j of two fp32 sums of up to 64 log-decays loses |G| * 2^-24 to
// cancellation, and K3's lower-bound gate (steps down to -5 nats) makes |G| reach ~300 in a chunk:
// 2e-5 relative error in the late entries of L, 1.6e-4 in the golden's log-probs (kimi_k3).
void chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, const Dims& d,
             float scale, float* state, float* o, int64_t chunk) {
  DZ_CHECK(chunk > 0, "linear attention: chunk size ", chunk);
  const int64_t K = d.K, V = d.V, HV = d.HV, HK = d.HK, GK = d.gk(), T = d.T;
  const int64_t BT = chunk;
  std::vector<double> G(size_t(BT * GK));
  std::vector<float> L(size_t(BT * BT)), u(size_t(BT * V)), w(size_t(BT * K)), Un(size_t(BT * V)),
      ex(static_cast<size_t>(K));
  // Σ_d a[d] b[d] exp(Gi[d] - Gj[d]); one exp for a scalar gate
  auto decayed_dot = [&](const float* a, const float* b, const double* Gi, const double* Gj) {
    if (!d.per_channel) return std::exp(float(Gi[0] - Gj[0])) * dot(a, b, K);
    float s = 0.f;
    for (int64_t x = 0; x < K; ++x) s += a[x] * b[x] * std::exp(float(Gi[x] - Gj[x]));
    return s;
  };
  for (int64_t h = 0; h < HV; ++h) {
    const int64_t hk = h / d.r();
    float* S = state + h * K * V;
    for (int64_t c0 = 0; c0 < T; c0 += BT) {
      const int64_t C = std::min(BT, T - c0);
      auto K_ = [&](int64_t i) { return k + ((c0 + i) * HK + hk) * K; };
      auto Q_ = [&](int64_t i) { return q + ((c0 + i) * HK + hk) * K; };
      auto V_ = [&](int64_t i) { return v + ((c0 + i) * HV + h) * V; };
      auto Gi = [&](int64_t i) { return G.data() + i * GK; };
      auto gexp = [&](int64_t i, int64_t x) { return std::exp(float(Gi(i)[d.per_channel ? x : 0])); };
      for (int64_t i = 0; i < C; ++i)
        for (int64_t x = 0; x < GK; ++x)
          G[size_t(i * GK + x)] = double(g[((c0 + i) * HV + h) * GK + x]) + (i ? G[size_t((i - 1) * GK + x)] : 0.0);
      // UT transform: rows of [u | w] = (I + L)^-1 [diag(beta) V | diag(beta) (K ∘ exp(G))]
      for (int64_t i = 0; i < C; ++i) {
        const float bi = beta[(c0 + i) * HV + h];
        for (int64_t j = 0; j < i; ++j) L[size_t(i * BT + j)] = bi * decayed_dot(K_(i), K_(j), Gi(i), Gi(j));
        float* ui = u.data() + i * V;
        float* wi = w.data() + i * K;
        for (int64_t y = 0; y < V; ++y) ui[y] = bi * V_(i)[y];
        for (int64_t x = 0; x < K; ++x) wi[x] = bi * K_(i)[x] * gexp(i, x);
        for (int64_t j = 0; j < i; ++j) {
          const float l = L[size_t(i * BT + j)];
          for (int64_t y = 0; y < V; ++y) ui[y] -= l * u[size_t(j * V + y)];
          for (int64_t x = 0; x < K; ++x) wi[x] -= l * w[size_t(j * K + x)];
        }
      }
      // U' = u - w S0
      for (int64_t i = 0; i < C; ++i) {
        float* un = Un.data() + i * V;
        for (int64_t y = 0; y < V; ++y) un[y] = u[size_t(i * V + y)];
        for (int64_t x = 0; x < K; ++x) {
          const float wx = w[size_t(i * K + x)];
          for (int64_t y = 0; y < V; ++y) un[y] -= wx * S[x * V + y];
        }
      }
      if (o) {
        for (int64_t i = 0; i < C; ++i) {
          float* oi = o + ((c0 + i) * HV + h) * V;
          const float* qi = Q_(i);
          for (int64_t y = 0; y < V; ++y) oi[y] = 0.f;
          for (int64_t x = 0; x < K; ++x) {
            const float qx = scale * qi[x] * gexp(i, x);
            for (int64_t y = 0; y < V; ++y) oi[y] += qx * S[x * V + y];
          }
          for (int64_t j = 0; j <= i; ++j) {
            const float a = scale * decayed_dot(qi, K_(j), Gi(i), Gi(j));
            for (int64_t y = 0; y < V; ++y) oi[y] += a * Un[size_t(j * V + y)];
          }
        }
      }
      // S = exp(G_C) S + Σ_j (k_j ∘ exp(G_C - G_j)) u'_j^T
      const double* Gl = Gi(C - 1);
      for (int64_t x = 0; x < K; ++x) {
        const float a = std::exp(float(Gl[d.per_channel ? x : 0]));
        for (int64_t y = 0; y < V; ++y) S[x * V + y] *= a;
      }
      for (int64_t j = 0; j < C; ++j) {
        const float* kj = K_(j);
        for (int64_t x = 0; x < K; ++x) {
          const int64_t gx = d.per_channel ? x : 0;
          ex[size_t(x)] = kj[x] * std::exp(float(Gl[gx] - Gi(j)[gx]));
        }
        for (int64_t x = 0; x < K; ++x)
          for (int64_t y = 0; y < V; ++y) S[x * V + y] += ex[size_t(x)] * Un[size_t(j * V + y)];
      }
    }
  }
}

// Transition by running the chunked scan on an augmented state [K, K + V] = [A | B] from [I | 0]
// with values [0 | v]: the A columns receive no value term, so they evolve as M_t ... M_1.
LaTransition transition(const float* k, const float* v, const float* g, const float* beta, const Dims& d) {
  const int64_t K = d.K, V = d.V, HV = d.HV, W = K + V;
  std::vector<float> va(size_t(d.T * HV * W), 0.f), st(size_t(HV * K * W), 0.f);
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t h = 0; h < HV; ++h)
      for (int64_t y = 0; y < V; ++y) va[size_t((t * HV + h) * W + K + y)] = v[(t * HV + h) * V + y];
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t x = 0; x < K; ++x) st[size_t((h * K + x) * W + x)] = 1.f;
  Dims da = d;
  da.V = W;
  chunked(nullptr, k, va.data(), g, beta, da, 1.f, st.data(), nullptr, kLaChunk);
  LaTransition tr;
  tr.H = HV, tr.K = K, tr.V = V;
  tr.A.resize(size_t(HV * K * K));
  tr.B.resize(size_t(HV * K * V));
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t x = 0; x < K; ++x) {
      const float* row = st.data() + (h * K + x) * W;
      for (int64_t y = 0; y < K; ++y) tr.A[size_t((h * K + x) * K + y)] = row[y];
      for (int64_t y = 0; y < V; ++y) tr.B[size_t((h * K + x) * V + y)] = row[K + y];
    }
  return tr;
}

// S_final = A · S0 + B per head; A [H, K, K], B [H, K, V]; z ascending for every element.
void apply_raw(const float* A_all, const float* B_all, int64_t H, int64_t K, int64_t V, const float* S0,
               float* S_final) {
  for (int64_t h = 0; h < H; ++h) {
    const float* A = A_all + h * K * K;
    const float* s0 = S0 + h * K * V;
    float* sf = S_final + h * K * V;
    for (int64_t x = 0; x < K; ++x) {
      float* row = sf + x * V;
      for (int64_t y = 0; y < V; ++y) row[y] = B_all[(h * K + x) * V + y];
      for (int64_t z = 0; z < K; ++z) {
        const float a = A[x * K + z];
        for (int64_t y = 0; y < V; ++y) row[y] += a * s0[z * V + y];
      }
    }
  }
}


}  // namespace

double la_chunked_flops(int64_t T, int64_t H, int64_t K, int64_t V, bool outputs, int64_t chunk) {
  DZ_CHECK(chunk > 0 && T >= 0, "la_chunked_flops: T=", T, " chunk=", chunk);
  double f = 0;
  const double k = double(K), v = double(V);
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const double c = double(std::min(chunk, T - c0));
    if (outputs)
      f += c * (c - 1) * (2 * k + v) + c * (c + 1) * (k + v) + 6 * c * k * v + k * v;
    else
      f += c * (c - 1) * (3 * k + v) + 4 * c * k * (k + v) + k * (k + v);
  }
  return f * double(H);
}

void kda_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                   int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o) {
  const Dims d{T, HK, HV, K, V, true};
  check_dims(d, "kda_recurrent");
  recurrent(q, k, v, g, beta, d, scale, state, o);
}

void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                 int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o, int64_t chunk) {
  const Dims d{T, HK, HV, K, V, true};
  check_dims(d, "kda_chunked");
  chunked(q, k, v, g, beta, d, scale, state, o, chunk);
}

void gdn_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                   int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o) {
  const Dims d{T, HK, HV, K, V, false};
  check_dims(d, "gdn_recurrent");
  recurrent(q, k, v, g, beta, d, scale, state, o);
}

void gdn_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                 int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o, int64_t chunk) {
  const Dims d{T, HK, HV, K, V, false};
  check_dims(d, "gdn_chunked");
  chunked(q, k, v, g, beta, d, scale, state, o, chunk);
}

void kda_gate_softplus(const float* f, const float* A_log, const float* dt_bias, int64_t T, int64_t H, int64_t K,
                       float* g) {
  for (int64_t h = 0; h < H; ++h) {
    const float a = std::exp(A_log[h]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t x = 0; x < K; ++x) {
        const int64_t c = h * K + x;
        g[t * H * K + c] = -a * softplus(f[t * H * K + c] + (dt_bias ? dt_bias[c] : 0.f));
      }
  }
}

void kda_gate_lower_bound(const float* f, const float* A_log, const float* dt_bias, float lower_bound, int64_t T,
                          int64_t H, int64_t K, float* g) {
  for (int64_t h = 0; h < H; ++h) {
    const float a = A_log ? std::exp(A_log[h]) : 1.f;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t x = 0; x < K; ++x) {
        const int64_t c = h * K + x;
        g[t * H * K + c] = lower_bound * sigmoid(a * (f[t * H * K + c] + (dt_bias ? dt_bias[c] : 0.f)));
      }
  }
}

LaTransition kda_transition(const float* k, const float* v, const float* g, const float* beta, int64_t T, int64_t HK,
                            int64_t HV, int64_t K, int64_t V) {
  const Dims d{T, HK, HV, K, V, true};
  check_dims(d, "kda_transition");
  return transition(k, v, g, beta, d);
}

LaTransition gdn_transition(const float* k, const float* v, const float* g, const float* beta, int64_t T, int64_t HK,
                            int64_t HV, int64_t K, int64_t V) {
  const Dims d{T, HK, HV, K, V, false};
  check_dims(d, "gdn_transition");
  return transition(k, v, g, beta, d);
}

void la_transition_apply(const LaTransition& tr, const float* S0, float* S_final) {
  DZ_CHECK(tr.A.size() == size_t(tr.H * tr.K * tr.K) && tr.B.size() == size_t(tr.H * tr.K * tr.V),
           "la_transition_apply: transition storage does not match [", tr.H, ", ", tr.K, ", ", tr.V, "]");
  apply_raw(tr.A.data(), tr.B.data(), tr.H, tr.K, tr.V, S0, S_final);
}

LaTransition la_transition_merge(const LaTransition& first, const LaTransition& second) {
  DZ_CHECK(first.H == second.H && first.K == second.K && first.V == second.V,
           "la_transition_merge: transitions of different shapes [", first.H, ", ", first.K, ", ", first.V, "] and [",
           second.H, ", ", second.K, ", ", second.V, "]");
  const int64_t H = first.H, K = first.K, V = first.V;
  LaTransition r;
  r.H = H, r.K = K, r.V = V;
  r.A.assign(size_t(H * K * K), 0.f);
  // B = A2 B1 + B2
  r.B.resize(size_t(H * K * V));
  la_transition_apply(second, first.B.data(), r.B.data());
  for (int64_t h = 0; h < H; ++h) {
    const float* A1 = first.A.data() + h * K * K;
    const float* A2 = second.A.data() + h * K * K;
    float* A = r.A.data() + h * K * K;
    for (int64_t x = 0; x < K; ++x)
      for (int64_t z = 0; z < K; ++z) {
        const float a = A2[x * K + z];
        for (int64_t y = 0; y < K; ++y) A[x * K + y] += a * A1[z * K + y];
      }
  }
  return r;
}

}  // namespace dz
