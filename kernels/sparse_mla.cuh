// MLA attention core on the GPU, in the absorbed form on the paged latent cache: the DSA
// selection (sparse) or dense causal. CPU reference: lib/ops/attention.hpp causal_attention with
// one KV head, keys [c, k_pe] and values c (which is what mla_attention_absorbed computes before
// applying W_uv).
//
//   for query i (sequence seq[i], position pos[i]) and head h:
//     logit(s) = scale * (q[i, h, :R] · c[s] + q[i, h, R:] · k_pe[s])   for s in the entries of i
//     out[i, h, :] = sum_s softmax(logit)(s) * c[s]                      [R]
//   q [nq, H, R + DR] bf16 (q_nope already multiplied by W_uk, rope part rotated).
//   Entries: sel [nq, K] int32 positions (any order), or, with sel == nullptr, the positions
//   0 .. K-1 in order (dense causal: K >= pos[i] + 1 gives query i all of 0 .. pos[i]; chunks of
//   entries past pos[i] are skipped). Entries that are -1 or > pos[i] are masked. Repeated
//   entries are NOT removed (the indexer never repeats a position). A query with no valid entry
//   gets zeros. out [nq, H, R] bf16; W_uv is applied afterwards as a GEMM.
// Keys come from the paged latent cache, BF16 or FP8 with per-128 tile scales (dequantized to
// BF16 in shared memory; the RoPE part is BF16 in both). Logits and the softmax are fp32
// (online, in chunks of 64 selected entries), P is rounded to BF16 for the P·V product.
// Supported sizes (sparse_mla_supports): (R, DR) = (512, 64) (DeepSeek V3.2) and (128, 64)
// (small presets), and (512, 0) on the BF16 cache (MLA without RoPE: GLM-5.3-Flash); any H.
// nq < 65536 per call. The rows of q and of a BF16 cache must be 16-byte aligned (any
// allocation; R + DR is a multiple of 8).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "paged_cache.cuh"

namespace dz::cuda {

// scratch (optional, fp32, sparse_mla_scratch_elems(nq, H, R, K) elements: what the call uses at
// most on the current GPU, 0 when it would not split): when the (query, 64-head block) grid is
// smaller than the GPU (small decode batches), the entries are split into up to 128 parts of
// whole 64-entry chunks computed by separate blocks (normalized partial outputs + log-sum-exp)
// and merged by a second kernel (split-KV / flash-decoding); parts x grid < 2 x SMs, so scratch
// stays under 2 x SMs x 64 x (R + 1) floats (35 MB at R = 512 on an H200). Without scratch (or
// with less), one block per (query, head block) covers all the entries (or fewer parts).
bool sparse_mla_supports(int32_t R, int32_t DR);
void sparse_mla(const __nv_bfloat16* q, const int32_t* sel, int32_t K, const int32_t* seq, const int32_t* pos,
                int64_t nq, int32_t H, const BlockTable& bt, const LatentCache& cache, float scale, __nv_bfloat16* out,
                cudaStream_t stream, float* scratch = nullptr, int64_t scratch_elems = 0);
int64_t sparse_mla_scratch_elems(int64_t nq, int32_t H, int32_t R, int32_t K);

}  // namespace dz::cuda
