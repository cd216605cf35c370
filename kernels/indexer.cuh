// DSA lightning indexer on the GPU: scores straight from the paged key cache, ReLU, per-head
// weights, sum over heads, causal limit and Top-K, without the score matrix in device memory
// (prefill). CPU reference: lib/ops/indexer.hpp (indexer_scores + topk_positions).
//
//   score(i, s) = sum_h w[i, h] * relu(q[i, h] · k[seq_i, s]),   s <= pos_i
//   sel[i, :]   = the K positions with the highest scores, ascending, -1 padded when pos_i + 1 < K;
//                 ties go to the lower position, NaN ranks lowest (as topk_positions).
//
// q [nq, H, D] bf16 (for MXFP8 queries, pass mxfp8_dequantize_bf16's output: exact), w [nq, H] fp32
// (already scaled by H^-0.5 D^-0.5), seq/pos [nq] (query i belongs to sequence seq[i], sits at
// position pos[i] and sees keys 0..pos[i] of that sequence). The products q·k are exact in fp32
// (bf16 × bf16, or bf16 × dequantized MXFP8), summed by the tensor cores in fp32.
// Supported: D in {64, 128}, H <= 64.
//
// Two modes, chosen by indexer_topk:
//   fused (prefill): one block per query keeps its score row in shared memory and selects the
//     Top-K there (max_keys <= indexer_fused_max_keys());
//   split (decode, few queries or long contexts): blocks over (key range, query) write scores to
//     scratch [nq, max_keys] fp32, then one block per query selects from it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "paged_cache.cuh"

namespace dz::cuda {

int64_t indexer_fused_max_keys();

// Kernel variant, per call: query in shared memory with 16 warps per block, or in registers with
// 8 warps; Auto (default) picks per key format what measured faster. Other values: tests, bench.
enum class IndexerVariant { Auto, QInSmem, QInRegisters };

// max_keys: an upper bound of pos[i] + 1 over the queries. scratch: [nq, max_keys] fp32 or
// nullptr (then the fused mode must apply). force_split is for tests and benchmarks.
void indexer_topk(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq,
                  int32_t H, int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, int32_t K, int32_t* sel,
                  float* scratch, cudaStream_t stream, bool force_split = false,
                  IndexerVariant variant = IndexerVariant::Auto);

// The two halves of the split mode, also usable on their own (e.g. to keep the scores):
// scores [nq, max_keys] fp32 (row i valid up to pos[i]) and Top-K selection from such rows.
void indexer_scores(const __nv_bfloat16* q, const float* w, const int32_t* seq, const int32_t* pos, int64_t nq,
                    int32_t H, int64_t max_keys, const BlockTable& bt, const IndexKeyCache& kc, float* scores,
                    cudaStream_t stream, IndexerVariant variant = IndexerVariant::Auto);
void topk_from_scores(const float* scores, int64_t ld, const int32_t* pos, int64_t nq, int32_t K, int32_t* sel,
                      cudaStream_t stream);

}  // namespace dz::cuda
