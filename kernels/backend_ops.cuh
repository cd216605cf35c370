// The CUDA backend's own ops (lib/backend/cuda/cuda_backend.cpp): elementwise, norms, RoPE, dense
// attention, MoE routing + grouped expert GEMMs, Block AttnRes, LM-head reductions. Each has its CPU
// reference in lib/ops (named per function); tests/gpu/test_backend_ops_gpu.cpp holds them to it.
// Float tensors are fp32 or bf16 (Dt below); every reduction and every softmax is fp32 (fp64 for
// the LM head's sum of exponentials, as the CPU reference).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dummy_values.hpp"
#include "ops/glu.hpp"

namespace dz::cuda {

enum class Dt : int { F32 = 0, BF16 = 1 };

// dst = src, converting (n elements).
void convert(const void* src, Dt sdt, void* dst, Dt ddt, int64_t n, cudaStream_t s);
// out [3, n] bf16 = (hi, mid, lo) with w = hi + mid + lo exactly (fp32 w, 8 significant bits each;
// values under 2^-126 lose their lowest bits): an fp32 operand as three exact bf16 ones.
void split_bf16x3(const float* w, int64_t n, __nv_bfloat16* out, cudaStream_t s);
// out [R, k·C] = each row of x [R, C] repeated k times.
void repeat_cols(const __nv_bfloat16* x, int64_t R, int64_t C, int k, __nv_bfloat16* out, cudaStream_t s);
// Many independent device copies in one launch (Backend::copy_rows_many): descs [n] on the device;
// max_bytes: the largest copy (sizes the grid). 16-byte words where a copy's ends allow, else bytes.
struct CopyDesc {
  const void* src;
  void* dst;
  uint64_t bytes;
};
void copy_many(const CopyDesc* descs, int n, uint64_t max_bytes, cudaStream_t s);
// out [rows, 3D] bf16 = (lo | mid | hi) of each row of w [rows, D], the same exact split.
void split_bf16x3_rows(const float* w, int64_t rows, int64_t D, __nv_bfloat16* out, cudaStream_t s);
// --dummy-weights in place (core/dummy_values.hpp): y [R, C] = dummy_value(key, (r0 + r) * ld + c0 + c, d).
// --dummy-weights of MXFP4 expert stacks [E, R, C] (C % 32 == 0): packed [E, R, C/2], scales
// [E, R, C/32] of dummy_mx4_group over the [R, C] window at (r0, c0) of each key's [*, ld] tensor;
// keys [E] on the device.
void dummy_mx4(uint8_t* packed, uint8_t* scales, const uint64_t* keys, int64_t E, int64_t R, int64_t C, DummyDist d,
               int64_t ld, int64_t r0, int64_t c0, cudaStream_t s);
void fill_dummy(void* y, Dt dt, int64_t R, int64_t C, uint64_t key, DummyDist d, int64_t ld, int64_t r0, int64_t c0,
                cudaStream_t s);
// dst[0..n) = v[0..n), n <= kSmallI32: small index arrays (cu_seqlens, state slots) written on the
// stream from a kernel argument: no host sync, and capturable in a CUDA graph (no upload).
constexpr int kSmallI32 = 256;
struct SmallI32 {
  int32_t v[kSmallI32];
};
void set_i32(int32_t* dst, int n, SmallI32 v, cudaStream_t s);
// dst[i] = start + i for i < n (positions, identity block tables), on the stream, no host sync.
void iota_i32(int32_t* dst, int64_t n, int32_t start, cudaStream_t s);
// out [T, D] f32 = table[ids[t]] (table f32 or bf16). ops: Model::run's embedding.
void embed(const void* table, Dt tdt, const int32_t* ids, int64_t T, int64_t D, float* out, cudaStream_t s);
// y = x / sqrt(mean(x^2) + eps) * (w | 1 + w), rows × D (w f32 [D] or nullptr); y may be x. ops/norm rmsnorm.
void rmsnorm(const void* x, Dt xdt, const float* w, void* y, Dt ydt, int64_t rows, int64_t D, float eps, bool zc,
             cudaStream_t s);
// y = rmsnorm(x) * w * act(gate), act 0 SiLU / 1 sigmoid. ops/norm gated_rmsnorm.
void gated_rmsnorm(const void* x, Dt xdt, const void* gate, Dt gdt, const float* w, void* y, Dt ydt, int64_t rows,
                   int64_t D, float eps, int act, cudaStream_t s);
// h += y
void add(void* h, Dt hdt, const void* y, Dt ydt, int64_t n, cudaStream_t s);
// x *= sigmoid(g)
void mul_sigmoid(void* x, Dt xdt, const void* g, Dt gdt, int64_t n, cudaStream_t s);
// y[r, c] += bias[c] (rows × cols)
void add_bias(void* y, Dt ydt, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
// h[i] = act(g[i], u[i]) (bf16 in/out, fp32 math; ops/glu.hpp: SwiGLU, its clamp, SiTU)
void silu_mul(const __nv_bfloat16* g, const __nv_bfloat16* u, __nv_bfloat16* h, int64_t n, const GluAct& act,
              cudaStream_t s);

// RoPE (ops/rope Rope::apply): dims [offset, offset + 2*half) of every head of x [T, H, hs], positions
// pos0 + t; inv_freq [half] (host values, passed by value), interleaved pairs or NeoX halves.
struct RopeParams {
  int half = 0;
  bool interleaved = false;
  float cos_sin_mult = 1.f;
  float inv_freq[256];
};
void rope(void* x, Dt dt, int64_t T, int64_t H, int64_t hs, int64_t offset, int64_t pos0, const RopeParams& p,
          cudaStream_t s);
// The same over a packed batch: rows cu[b] .. cu[b+1] (cu on the device, n_seq + 1 offsets from 0,
// cu[n_seq] = T) at positions 0, 1, .. each; bitwise equal to rope() per sequence with pos0 = 0.
void rope_varlen(void* x, Dt dt, int64_t T, int64_t H, int64_t hs, int64_t offset, const int32_t* cu, int n_seq,
                 const RopeParams& p, cudaStream_t s);
// Row t at position pos[t] (device, T values): a decode step of several documents; bitwise equal
// to rope() per row.
void rope_rows(void* x, Dt dt, int64_t T, int64_t H, int64_t hs, int64_t offset, const int32_t* pos,
               const RopeParams& p, cudaStream_t s);

// Softmax attention (ops/attention causal_attention): q [T, Hq, Dk], k [S, Hkv, Dk], v [S, Hkv, Dv],
// out [T, Hq, Dv], all bf16; sel [T, n_sel] positions or nullptr (dense causal). Dk, Dv <= 512.
void attention(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
               int64_t T, int64_t pos0, int64_t S, int Hq, int Hkv, int Dk, int Dv, float scale, const int32_t* sel,
               int64_t n_sel, cudaStream_t s);

// Block AttnRes depth mixture (ops/norm attn_res_mix): blocks [n, T, D], partial [T, D], q [D], out
// [T, D], all f32.
void attn_res_mix(const float* blocks, int64_t n, const float* partial, const float* q, int64_t T, int64_t D,
                  float eps, float* out, cudaStream_t s);

// ---- MoE ----
struct RouteParams {
  int E = 0, top_k = 0, n_group = 1, topk_group = 1;
  int score = 0;  // 0 softmax, 1 sigmoid, 2 sqrt(softplus) (ops/moe moe_select)
  bool norm_topk_prob = true, top2sum = true;
  float scaling = 1.f;
};
// logits [T, E] f32, bias [E] or nullptr -> idx [T, top_k] ascending, w [T, top_k] (ops/moe moe_select).
// Non-finite selection scores set *bad = 1 (the caller reports them).
// fixed [T, top_k] or nullptr: hash routing (those experts, ascending, weighted by their scores).
void moe_select(const float* logits, const float* bias, int64_t T, const RouteParams& p, int32_t* idx, float* w,
                int32_t* bad, cudaStream_t s, const int32_t* fixed = nullptr);
// Dispatch by expert: counts [E], offsets [E + 1] (exclusive scan), perm [T*top_k] (assignment
// a = t*top_k + j listed expert by expert, in ascending a), pos_of [T*top_k] (where assignment a
// landed), tile_off [E + 1] (64-row tiles per expert, scanned). Workspace: counts/offsets/tile_off
// zeroed by the call.
void moe_dispatch(const int32_t* idx, int64_t T, int top_k, int E, int32_t* counts, int32_t* offsets,
                  int32_t* tile_off, int32_t* perm, int32_t* pos_of, cudaStream_t s);
// Expert parallelism: the global experts idx [n] of which this rank holds [e0, e0 + El) ->
// local ids (idx - e0), every other one (or a negative id) to the sink bucket El with weight 0.
void moe_local_experts(const int32_t* idx, const float* w, int64_t n, int e0, int El, int32_t* idx_l, float* w_l,
                       cudaStream_t s);
// xs [T*top_k, D] = x[perm[i] / top_k]
void gather_rows(const __nv_bfloat16* x, const int32_t* perm, int64_t n, int top_k, int64_t D, __nv_bfloat16* xs,
                 cudaStream_t s);
// The grouped expert GEMMs over these rows: moe_gemm.cuh (tensor cores).
// y[t, :] = sum_j w[t, j] * ys[pos_of[t*top_k + j], :] (j ascending), f32 math, y bf16.
void moe_combine(const __nv_bfloat16* ys, const int32_t* pos_of, const float* w, int64_t T, int top_k, int64_t D,
                 __nv_bfloat16* y, cudaStream_t s);
// y[t, :] += (gate ? sigmoid(x[t] · gate) : 1) * sh[t, :]   (x, sh, y bf16; gate f32 [D] or nullptr)
void shared_expert_add(const __nv_bfloat16* x, const float* gate, const __nv_bfloat16* sh, int64_t T, int64_t D,
                       __nv_bfloat16* y, cudaStream_t s);

// ---- DSA indexer pieces ----
// y = (x - mean) / sqrt(var + eps) * w + b per row (torch LayerNorm, biased variance). ops/indexer layer_norm.
void layer_norm(const void* x, Dt xdt, const float* w, const float* b, void* y, Dt ydt, int64_t rows, int64_t D,
                float eps, cudaStream_t s);
// x *= a (f32)
void scale(float* x, float a, int64_t n, cudaStream_t s);
// scores [T, ld] f32 (row t valid for s <= pos0 + t, later columns untouched) of any head dims
// (H * D <= 8192): score(t, s) = sum_h w[t, h] * relu(q[t, h] · k[s]). ops/indexer indexer_scores.
void indexer_scores_any(const __nv_bfloat16* q, const float* w, const __nv_bfloat16* k, int64_t T, int64_t pos0,
                        int H, int D, float* scores, int64_t ld, cudaStream_t s);
// The KV cache's per-128-tile FP8 (quant.cuh kv_fp8_quantize) back to bf16: y = bf16(code * scale).
void kv_fp8_dequantize_bf16(const uint8_t* codes, const float* scales, int64_t rows, int64_t n, __nv_bfloat16* y,
                            cudaStream_t s);

// ---- LM head (vocabulary shard of n columns; logits f32 [m, n]) ----
// out [m, 3] f64, per row in one pass: the max, sum exp(x - max) and x[target[r] - v0] when in
// range (else 0; target may be null)
void lse_parts(const float* logits, int64_t m, int64_t n, const int32_t* target, int64_t v0, double* out,
               cudaStream_t s);
// Per row the k largest (highest first, lower column on ties): ids, vals [m, k]. k <= 64.
void row_topk(const float* logits, int64_t m, int64_t n, int k, int32_t* ids, float* vals, cudaStream_t s);

}  // namespace dz::cuda
