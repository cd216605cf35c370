// DeepSeek-V3.2 DSA lightning indexer (CPU reference, fp32) and its Top-K selection. The indexer
// module of a layer (weights, run on a backend) is model/dsa_indexer.hpp.
//
// Follows transformers' deepseek_v32 (what the golden references are made with):
//   q_idx = wq_b(q_resid)                      [T, Hi, Di]   q_resid = q_a_layernorm(q_a_proj(x))
//   k_idx = LayerNorm(wk(x)) (weight + bias, eps 1e-6)   [T, Di]
//   RoPE (NeoX / rotate-half, NOT the interleaved form of the main MLA) on dims [0, rope) of both,
//   with the model's rope (YaRN included); dims [rope, Di) pass through.
//   w[t, h] = weights_proj(x)[t, h] * Hi^-0.5 * Di^-0.5
//   score(t, s) = sum_h w[t, h] * relu(q_idx[t, h] · k_idx[s]),   s <= t
// DeepSeek's own inference code also applies a Hadamard rotation to q and k (orthogonal, so the
// dot products are unchanged in exact arithmetic) and quantises both to FP8 with per-128 scales
// (its weights carry q's scale); neither is done here (the MXFP8 option emulates quantisation
// separately).
#pragma once
#include <cstdint>
#include <vector>


namespace dz {

// torch.nn.LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * w + b (biased variance).
// rows × D; y may alias x.
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t D, float eps);

// scores [T, S]: row t holds score(t, s) for s <= pos0 + t and -inf for later s.
//   q [T, H, D]    w [T, H] (already scaled)    k [S, D]
void indexer_scores(const float* q, const float* w, const float* k, float* scores, int64_t T, int64_t pos0,
                    int64_t S, int64_t H, int64_t D);

// Top-K per query row of scores [T, S] over the visible keys s <= pos0 + t.
// sel [T, K]: the chosen positions in ascending position order, -1 padded when fewer than K
// keys are visible (then every visible key is chosen). Ties are broken towards the lower position
// (torch.topk leaves tie order unspecified; with fp32 scores exact ties are rare except all-zero
// ReLU sums). NaN scores rank lowest.
void topk_positions(const float* scores, int32_t* sel, int64_t T, int64_t pos0, int64_t S, int64_t K);

// GLM-5.3-Flash's k-pool indexer (transformers 5.23 Glm5NextTextIndexer). The cache holds per
// token [k (LayerNorm(wk x)) | g (x · compress_gateᵀ)] [S, 2D]. Complete groups of P tokens from
// position 0 are the candidates: pooled key of group p, per channel c,
//   kp[p, c] = Σ_j softmax_j(g[pP + j, c] + ape[j, c]) · k[pP + j, c]        (j = 0..P-1)
// Query t (position s = pos0 + t) sees the groups that end at or before s ((s + 1) / P of them),
// scores them as indexer_scores does (w already scaled), keeps the best Kp (ties to the lower
// group), and attends to their tokens and, with `tail`, to the tokens of its own incomplete group
// (the last (s + 1) mod P positions). sel [T, Kp·P + (tail ? P − 1 : 0)]: ascending, −1 padded.
void kpool_pooled_keys(const float* cache, const float* ape, int64_t S, int64_t D, int64_t P, float* kp);
// Group Top-K (the k-pool selection's groups; DeepSeek-V4's indexer over compressed entries):
// query t at position s = pos0 + t sees groups g < (s + 1) / P of keys [NG, D] (a group closes
// with its last token) and scores them as Σ_h w[t, h] · relu(q[t, h] · keys[g]) -> sel [T, K]:
// its K best visible groups ascending (all of them while at most K are visible), -1 padded; ties
// to the lower group.
void group_select(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0, int64_t NG, int64_t H,
                  int64_t D, int64_t P, int64_t K, int32_t* sel);
void kpool_select(const float* q, const float* w, const float* kp, int64_t T, int64_t pos0, int64_t S, int64_t H,
                  int64_t D, int64_t P, int64_t Kp, bool tail, int32_t* sel);

}  // namespace dz
