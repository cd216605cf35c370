// Mixture-of-experts building blocks (CPU reference, fp32): the router (softmax / sigmoid scores,
// selection-only correction bias, group-limited top-k, renormalisation, scaling) and SwiGLU
// experts, with the expert sum split by expert range or by width so tensor/expert parallel shards
// add up to the full result.
//
// Routing, per token (T rows of x [T, D]):
//   logits = x · W_gate^T                               [E]
//   s      = softmax(logits) | sigmoid(logits) | sqrt(softplus(logits))   (weights come from s)
//   c      = s + bias        (bias == nullptr: c = s)   (selection only)
//   groups : E split into n_group contiguous groups; group score = sum of the two largest c in the
//            group (Top2Sum: DeepSeek-V3 / V3.2 / Kimi) or the largest c (Max: DeepSeek's own code
//            when there is no bias); keep the topk_group best groups (n_group == 1: all experts)
//   pick   : the top_k largest c among experts of the kept groups
//   w      = s[picked];  norm_topk_prob: w /= (sum(w) + 1e-20);  w *= routed_scaling_factor
// Ties (equal c or equal group score) go to the lower index: selection is a stable sort by
// descending value, so results never depend on the reduction or thread layout.
// Picked experts are returned in ascending expert index; the expert sum runs in that order.
#pragma once
#include <cstdint>
#include <vector>

#include "config/model_config.hpp"
#include "ops/glu.hpp"

namespace dz {

enum class GroupScore { Top2Sum, Max };

struct RouterConfig {
  int64_t n_experts = 0;  // E
  int64_t top_k = 0;
  ScoreFunc score_func = ScoreFunc::Softmax;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.f;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  GroupScore group_score = GroupScore::Top2Sum;
  void validate() const;  // throws naming the inconsistent field
};

// Selection for one token from its logits [E]; bias [E] or nullptr. idx/w [top_k], idx ascending.
// fixed [top_k] (DeepSeek-V4's hash routing: the experts of the token id) replaces the selection:
// those experts (in ascending order), weighted by their scores as above.
void moe_select(const RouterConfig& rc, const float* logits, const float* bias, int32_t* idx, float* w,
                const int32_t* fixed = nullptr);

// Router for T tokens: x [T, D], W_gate [E, D], bias [E] or nullptr -> idx [T, top_k], w [T, top_k];
// fixed [T, top_k] or nullptr (moe_select).
void moe_route(const RouterConfig& rc, const float* x, const float* W_gate, const float* bias, int64_t T,
               int64_t D, int32_t* idx, float* w, const int32_t* fixed = nullptr);

// One gated MLP (or a width slice of one): y = down(act(gate·x, up·x)), act as ops/glu.hpp.
//   gate, up: [inter, D] row-major (rows of a wider matrix are fine: row stride is D)
//   down    : [D, inter] with row stride down_ld (>= inter; a column slice of a wider [D, I] matrix)
struct SwigluView {
  const float* gate = nullptr;
  const float* up = nullptr;
  const float* down = nullptr;
  int64_t inter = 0;
  int64_t down_ld = 0;
  GluAct act;  // SwiGLU, its clamp, or SiTU
  // Columns/rows [i0, i1) of this MLP's intermediate dimension: the TP width shard.
  SwigluView slice(int64_t i0, int64_t i1, int64_t D) const;
};

// y[T, D] = SwiGLU(x[T, D]) (overwrites y).
void swiglu_mlp(const SwigluView& m, const float* x, float* y, int64_t T, int64_t D);
// y[T, D] += SwiGLU(x[T, D])
void swiglu_mlp_acc(const SwigluView& m, const float* x, float* y, int64_t T, int64_t D);

// Routed-expert sum restricted to experts [e0, e1): for each token t,
//   out[t] += sum over j with e = idx[t, j] in [e0, e1), ascending e, of w[t, j] * expert_e(x[t]).
// experts[e] may be a width slice (SwigluView::slice) for width sharding. Summing the outputs of
// disjoint expert ranges (or of width slices) over shards gives the full routed sum up to fp32
// rounding of the final additions.
void moe_experts_acc(const std::vector<SwigluView>& experts, const float* x, int64_t T, int64_t D,
                     const int32_t* idx, const float* w, int64_t top_k, int64_t e0, int64_t e1, float* out);

}  // namespace dz
