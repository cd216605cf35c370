// Softmax attention over a KV cache (CPU reference, fp32): the core shared by MLA (dense or DSA
// sparse) and gated GQA. The caches those mixers keep are model/attn_cache.hpp.
#pragma once
#include <cstdint>

namespace dz {

// Causal softmax attention for T queries at absolute positions pos0 .. pos0+T-1.
//   q   [T, Hq, Dk]     k [S, Hkv, Dk]     v [S, Hkv, Dv]     out [T, Hq, Dv]     (S >= pos0 + T)
// Query head h reads kv head h / (Hq / Hkv) (GQA grouping; Hq % Hkv == 0).
// Dense (sel == nullptr): query t attends keys 0 .. pos0+t inclusive.
// Sparse: sel [T, n_sel] lists key positions per query (the DSA Top-K set). Entries that are -1,
// outside 0 .. pos0+t, or repeated are ignored, i.e. a selection acts as a mask on the causal set
// (transformers folds the Top-K set into the causal mask the same way). Keys are visited in the
// order given, so a selection sorted by position with every visible key gives exactly the dense
// result. A query with no valid key gets zeros.
// p = softmax(scale * q·k) over the attended keys (max-subtracted, fp32, fixed order).
void causal_attention(const float* q, const float* k, const float* v, float* out, int64_t T, int64_t pos0,
                      int64_t S, int64_t Hq, int64_t Hkv, int64_t Dk, int64_t Dv, float scale,
                      const int32_t* sel = nullptr, int64_t n_sel = 0);

// MLA in the absorbed form, straight on the latent cache (mathematically equal to materialising
// per-head k = [W_uk c, k_pe] and v = W_uv c and calling causal_attention):
//   score(t, s) = (W_uk[h]^T q_nope[t,h]) · c[s] + q_pe[t,h] · k_pe[s]
//   out[t, h]   = W_uv[h] · sum_s p(t, s) c[s]
//   q      [T, H, nope + rope] (rope part already rotated)    latent [S, R]    k_pe [S, rope]
//   wkv_b  [H * (nope + vd), R] (kv_b_proj, HF layout)        out    [T, H, vd]
// sel / n_sel as in causal_attention.
void mla_attention_absorbed(const float* q, const float* latent, const float* k_pe, const float* wkv_b,
                            float* out, int64_t T, int64_t pos0, int64_t S, int64_t H, int64_t nope, int64_t rope,
                            int64_t R, int64_t vd, float scale, const int32_t* sel = nullptr, int64_t n_sel = 0);

// DeepSeek-V4's shared-KV attention (one row per key, used as key and value), per query t at
// position s = pos0 + t and head h:
//   keys = raw rows max(0, s - W + 1) .. s   (the sliding window, raw [>= pos0 + T, D])
//        ∪ compressed rows comp[e] for e in sel[t, :] (>= 0; CSA: the indexer's choice) or, with
//          sel == nullptr, every e < (s + 1) / m (HCA: the entries whose window has closed)
//   out[t, h] = Σ_j p_j key_j,  p = softmax over {scale · q[t, h] · key_j} ∪ {sink[h]}
// (the sink takes probability mass and adds no value). q, out [T, H, D]; sel [T, K].
void dsv4_attention(const float* q, const float* raw, const float* comp, int64_t n_comp, const int32_t* sel, int64_t K,
                    const float* sink, float* out, int64_t T, int64_t pos0, int64_t H, int64_t D, int64_t W, int64_t m,
                    float scale);

}  // namespace dz
