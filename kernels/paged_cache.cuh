// Paged caches (block tables) for the sparse-attention path: the MLA latent KV cache and the DSA
// indexer key cache. Both are pools of fixed-size pages; sequence b's token at position s lives
// in page block_table[b * max_pages + s / page_size], row s % page_size.
//
// Latent KV cache (one KV head, MLA): per token the latent c [R] and the RoPE key k_pe [DR].
//   BF16:  bf16 [pages, P, R + DR]              (c then k_pe)
//   FP8:   codes [pages, P, R] E4M3, scales [pages, P, R / 128] fp32 (per-tile, fp8.hpp),
//          rope [pages, P, DR] bf16 (the RoPE part is kept in BF16, DESIGN.md §5).
// Indexer key cache: k [D] per token.
//   BF16:  bf16 [pages, P, D];   MXFP8: codes [pages, P, D], scales [pages, P, D / 32] (E8M0).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

struct BlockTable {
  const int32_t* table = nullptr;  // [num_seqs, max_pages] page ids
  int32_t max_pages = 0;
  int32_t page_size = 0;  // tokens per page (P)
};

struct LatentCache {
  int32_t R = 512, DR = 64;
  bool fp8 = false;
  __nv_bfloat16* bf16 = nullptr;  // [pages, P, R + DR]      (!fp8)
  uint8_t* codes = nullptr;       // [pages, P, R]           (fp8)
  float* scales = nullptr;        // [pages, P, R / 128]     (fp8)
  __nv_bfloat16* rope = nullptr;  // [pages, P, DR]          (fp8)
};

struct IndexKeyCache {
  int32_t D = 128;
  bool mxfp8 = false;
  __nv_bfloat16* bf16 = nullptr;  // [pages, P, D]       (!mxfp8)
  uint8_t* codes = nullptr;       // [pages, P, D]       (mxfp8)
  uint8_t* scales = nullptr;      // [pages, P, D / 32]  (mxfp8)
};

// Fused store: quantize (when the cache is FP8) and write N new tokens, token i belonging to
// sequence seq[i] at position pos[i] (prefill: a run of positions; decode: one or a few per
// sequence). The pages must already be in the block table.
//   kv [N, R] latent (after kv_a_layernorm), kpe [N, DR] (after RoPE).  R % 128 == 0 for FP8.
void store_latent_kv(const __nv_bfloat16* kv, const __nv_bfloat16* kpe, const int32_t* seq, const int32_t* pos,
                     int64_t N, const BlockTable& bt, const LatentCache& cache, cudaStream_t stream);
//   k [N, D] indexer keys (after LayerNorm + RoPE).  D % 32 == 0.
void store_index_k(const __nv_bfloat16* k, const int32_t* seq, const int32_t* pos, int64_t N, const BlockTable& bt,
                   const IndexKeyCache& cache, cudaStream_t stream);

}  // namespace dz::cuda
