// Decode-step preprocessing of the DSA lightning indexer on the GPU (issue 6, item 5): for B new
// tokens (one per sequence) it produces what indexer_topk (indexer.cuh) consumes. CPU reference:
// lib/model/dsa_indexer.cpp (DsaIndexer::keys / select).
//
//   q  = RoPE(wq_b · q_resid)                      [B, H, D] bf16   (MXFP8 cache: rounded to MXFP8)
//   k  = RoPE(LayerNorm(wk · x)) -> store_index_k  into the paged IndexKeyCache at (seq[b], pos[b])
//   w  = (weights_proj · x) * H^-0.5 * D^-0.5      [B, H] fp32
//
// Three independent chains; Streams mode runs them concurrently:
//   chain A (the caller's stream):  Q GEMM -> RoPE (+ MXFP8 round) of q
//   chain B (side stream 1):        K GEMM -> LayerNorm + RoPE -> quantize + store into the cache
//   chain C (side stream 2):        head-weight GEMM (the scale is the GEMM's alpha)
// forked from the caller's stream with an event and joined back into it with events before
// return, so the next kernel on the caller's stream (the fused indexer) sees all three. Chain A
// stays on the caller's stream because it is the longest (it reads the 64x128x1536 wq_b): a third
// side stream would only add one more fork/join pair. Serial mode runs the same kernels and cuBLAS
// calls (same handles, same workspaces) in order on the caller's stream, so both modes give
// bitwise identical results. Both modes are capturable in a CUDA graph (event fork/join).
//
// Numerics: GEMMs are cublasGemmEx with bf16 inputs, fp32 compute and fp32 outputs (no rounding
// between GEMM and LayerNorm/RoPE); q and k are rounded once to bf16 after RoPE (what the cache
// and indexer_topk take). With an MXFP8 key cache, q's bf16 values are quantized to MXFP8 and
// dequantized (exact) back to bf16 — the same as mxfp8_quantize(bf16) + mxfp8_dequantize_bf16,
// and the same treatment store_index_k gives the keys.
// RoPE: plain NeoX rope on dims [0, rope) with inv_freq[i] = theta^(-2i/rope) computed on the
// host in fp32 exactly as lib/ops/rope.cpp; angles pos * inv_freq in fp32, cos/sin in double
// rounded to fp32 (as the CPU). YaRN frequency scaling is NOT implemented here (DeepSeek-V3.2
// uses YaRN: before using this on that model, pass YaRN inv_freq and the cos/sin multiplier —
// not done yet).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "paged_cache.cuh"

namespace dz::cuda {

struct IndexerPrepDims {
  int64_t hidden = 0;      // model hidden size
  int64_t q_lora = 0;      // q_lora_rank
  int32_t H = 0;           // index_n_heads
  int32_t D = 0;           // index_head_dim, multiple of 32, <= 256
  int32_t rope = 0;        // rotated dims (even, <= D; 0 = no rope)
  float rope_theta = 10000.f;
  int64_t max_tokens = 0;  // largest B a call may pass (sizes the fp32 GEMM outputs)
};

// Device weights of one indexer layer (row-major, as in the checkpoint).
struct IndexerPrepWeights {
  const __nv_bfloat16* wq_b = nullptr;          // [H*D, q_lora]
  const __nv_bfloat16* wk = nullptr;            // [D, hidden]
  const __nv_bfloat16* weights_proj = nullptr;  // [H, hidden]
  const float* k_norm_w = nullptr;              // [D]
  const float* k_norm_b = nullptr;              // [D]
};

enum class IndexerPrepMode { Serial, Streams };

// Persistent state: two side streams, fork/join events, three cuBLAS handles (one per chain, each
// with its own workspace, so concurrent GEMMs never share one and serial == streams), fp32 GEMM
// outputs and the bf16 keys. Opaque; create once per device / layer shape, destroy at exit.
// Calls on one context must not overlap from several host threads (each call rebinds the
// handles' streams); a captured graph uses the context's buffers, so destroy it after the graph.
struct IndexerPrep;
IndexerPrep* indexer_prep_create(const IndexerPrepDims& dims);
void indexer_prep_destroy(IndexerPrep* p);

// One decode step for B <= max_tokens tokens: token b belongs to sequence seq[b] at position
// pos[b] (device int32 [B] each; the page for pos[b] must be in bt).
//   x [B, hidden] bf16, q_resid [B, q_lora] bf16  ->  q [B, H, D] bf16, w [B, H] fp32, and keys
//   stored into kc (kc.D == D; kc.mxfp8 also selects the MXFP8 rounding of q).
// Everything is ordered after prior work on `stream` and finished before later work on it.
void indexer_prep(IndexerPrep* p, const IndexerPrepWeights& wt, const __nv_bfloat16* x, const __nv_bfloat16* q_resid,
                  const int32_t* seq, const int32_t* pos, int64_t B, const BlockTable& bt, const IndexKeyCache& kc,
                  __nv_bfloat16* q, float* w, IndexerPrepMode mode, cudaStream_t stream);

}  // namespace dz::cuda
