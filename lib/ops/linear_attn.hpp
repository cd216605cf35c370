// Linear attention with a delta-rule state (CPU reference, fp32): KDA (per-channel decay, Kimi
// Linear / K3) and Gated DeltaNet (scalar decay, Qwen3-Next), each in a token-by-token recurrent
// form and a chunked (WY / UT-transform) form, plus the segment transition used by context
// parallelism. Semantics follow fla's naive_recurrent_kda / naive_recurrent_gated_delta_rule.
//
// ---- State layout (the one place it is written down) ----
// Per value head h the state is S_h [K, V], row-major (key channel major), stored for all heads
// as [HV, K, V] — the same layout as fla's [B, H, K, V] with B = 1. One step of token t:
//     S   = diag(exp(g_t)) S                      (KDA: per key channel; GDN: one scalar per head)
//     u   = beta_t * (v_t - S^T k_t)              [V]
//     S   = S + k_t u^T
//     o_t = S^T (scale * q_t)                     [V]
// i.e. o_t[j] = sum_i scale * q_t[i] * S[i][j]. Callers pass q and k already L2-normalised
// (fla's use_qk_l2norm_in_kernel is done by the mixer); `scale` multiplies q inside (Kimi and
// Qwen3-Next use 1/sqrt(K)).
//
// ---- Head grouping ----
// q, k have HK heads, v / g / beta / state / o have HV heads, HV a multiple of HK. Key head h
// serves value heads h*r .. h*r+r-1 (r = HV / HK), as torch repeat_interleave(r, dim=heads) does
// in qwen3_next and fla. KDA models have HK == HV, but the same grouping is accepted.
//
// Every function below takes `state` as in/out: on entry the initial state (zeros for a fresh
// sequence), on return the final state, so prefill-then-decode equals one long prefill.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace dz {

constexpr int64_t kLaChunk = 64;  // chunk length of the chunked forms (fla's BT)

// ---- KDA (per-channel decay) ----
// q, k [T, HK, K]; v [T, HV, V]; g [T, HV, K] log-decay (<= 0); beta [T, HV];
// state [HV, K, V] in/out; o [T, HV, V] (may be nullptr: only the state is advanced).
void kda_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                   int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o);
void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                 int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o,
                 int64_t chunk = kLaChunk);

// ---- Gated DeltaNet (scalar decay per value head) ----
// q, k [T, HK, K]; v [T, HV, V]; g [T, HV] log-decay (<= 0); beta [T, HV]; state [HV, K, V]; o [T, HV, V].
void gdn_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                   int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o);
void gdn_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
                 int64_t HK, int64_t HV, int64_t K, int64_t V, float scale, float* state, float* o,
                 int64_t chunk = kLaChunk);

// ---- Gates from raw projections ----
// Kimi Linear softplus gate (fla naive_kda_gate / fused_kda_gate without lower_bound):
//   g[t, h, d] = -exp(A_log[h]) * softplus(f[t, h*K + d] + dt_bias[h*K + d])
// f [T, H*K]; A_log [H]; dt_bias [H*K] (nullptr: no bias); g [T, H, K]. softplus as torch (threshold 20).
// With K = 1 this is also Gated DeltaNet's gate (qwen3_next: -exp(A_log) * softplus(a + dt_bias)).
void kda_gate_softplus(const float* f, const float* A_log, const float* dt_bias, int64_t T, int64_t H, int64_t K,
                       float* g);
// Lower-bound sigmoid gate (fla fused_kda_gate with lower_bound, Kimi K3):
//   g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias))   (A_log nullptr: exp(A_log) taken as 1)
// g lies in (lower_bound, 0), so one step never decays a channel by more than exp(lower_bound).
void kda_gate_lower_bound(const float* f, const float* A_log, const float* dt_bias, float lower_bound, int64_t T,
                          int64_t H, int64_t K, float* g);

// ---- Segment transitions (context parallelism) ----
// The state update is affine in the initial state, so a segment maps any S0 to
//     S_final = A · S0 + B        per value head, A [K, K], B [K, V]  (plain matrix product)
// A = M_T ... M_1 with M_t = (I - beta_t k_t k_t^T) diag(exp(g_t)); B = the final state from S0 = 0.
// Outputs are not needed for this, so q is not an argument.
struct LaTransition {
  int64_t H = 0, K = 0, V = 0;
  std::vector<float> A;  // [H, K, K]
  std::vector<float> B;  // [H, K, V]
};
LaTransition kda_transition(const float* k, const float* v, const float* g, const float* beta, int64_t T, int64_t HK,
                            int64_t HV, int64_t K, int64_t V);
LaTransition gdn_transition(const float* k, const float* v, const float* g, const float* beta, int64_t T, int64_t HK,
                            int64_t HV, int64_t K, int64_t V);
// S_final [H, K, V] = A · S0 + B. S_final may not alias S0.
void la_transition_apply(const LaTransition& tr, const float* S0, float* S_final);
// The transition of `first` followed by `second`: A = A2 A1, B = A2 B1 + B2.
LaTransition la_transition_merge(const LaTransition& first, const LaTransition& second);

// FLOPs (multiply and add counted separately, exp not counted) of the chunked form over T tokens
// for H value heads, chunks of `chunk`: per chunk of c tokens and head
//     c(c-1)(2K + V) + c(c+1)(K + V) + 6cKV + KV     with outputs (stage 2)
//     c(c-1)(3K + V) + 4cK(K+V) + K(K+V)              transition only (stage 1: width K+V, no q)
// (docs/parallel_linear_attention.md derives both).
double la_chunked_flops(int64_t T, int64_t H, int64_t K, int64_t V, bool outputs, int64_t chunk = kLaChunk);
// Stage 1 + stage 2 of one segment of n tokens: what a rank is charged per local segment.
inline double la_segment_flops(int64_t n, int64_t H, int64_t K, int64_t V) {
  return la_chunked_flops(n, H, K, V, false) + la_chunked_flops(n, H, K, V, true);
}

}  // namespace dz
