// DSA lightning-indexer scores on Hopper wgmma (the prefill path of CudaBackend::indexer_topk;
// test and bench beside kernels/indexer.cu: kernels/dev/indexer/run.sh):
//
//   scores[i, s] = sum_h w[i, h] * relu(q[i, h] · k[s]),   i < n, s <= pos0 + i
//
// for the prefill of one sequence whose key rows are contiguous (the backend's RowStore), written
// into scores [n, ld] fp32 (row i valid for s <= pos0 + i; the rest untouched), the split mode's
// scratch: topk_from_scores (kernels/indexer.cuh) selects from it. Same products as
// kernels/indexer.cu (bf16 x bf16 exact in fp32, fp32 sums on the tensor cores).
// q [n, H, D] bf16, w [n, H] fp32 (already scaled), keys [S, D] bf16 with S > pos0 + n - 1.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "side_stream.cuh"

namespace dz::cuda {

// D in {64, 128}, H in {16, 32, 64} (the query columns of one warpgroup, 256 / H queries x H
// heads, fill one m64n256 product), q / keys 16-byte aligned.
bool indexer_scores_wgmma_takes(int H, int D, const void* q, const void* keys);

// Whether the histograms (and so topk_from_hist) apply: H 32 / 64, rows of fewer than 65536 keys
// (16-bit bin counts).
inline bool indexer_hist_takes(int H, int64_t ld) { return (H == 32 || H == 64) && ld < 65536; }

// hist: null, or [n, 512] words that receive each query's histogram of its scores (1024 bins of
// the order key's top 10 bits, 16-bit counts two to a word; indexer_hist_takes(H, ld) only) for
// topk_from_hist.
void indexer_scores_wgmma(const __nv_bfloat16* q, const float* w, const __nv_bfloat16* keys, int64_t n, int64_t pos0,
                          int H, int D, int64_t S, float* scores, int64_t ld, cudaStream_t stream,
                          uint32_t* hist = nullptr);

// Top-K from the scores and the histograms indexer_scores_wgmma wrote: two passes over each row
// (the threshold bin's keys kept and each warp's higher keys counted, then the in-order writes)
// instead of block_topk's five.
void topk_from_hist(const float* scores, int64_t ld, const uint32_t* hist, const int32_t* pos, int64_t nq, int32_t K,
                    int32_t* sel, cudaStream_t stream);

// indexer_topk_wgmma's second stream (the caller joins it first: indexer_topk_wgmma's stream has
// waited for it when that returns): scored(b), block b's scores written to scratch b (on the caller's
// stream); freed(b), its Top-K done with scratch b (on the side stream).
struct TopkSide : SideStream<4> {
  cudaEvent_t scored(int b) const { return ev[b]; }
  cudaEvent_t freed(int b) const { return ev[2 + b]; }
};

// The prefill indexer over one sequence's contiguous key rows [S, D] (S >= pos0 + T) as the backend
// runs it: the wgmma scores of `block` queries at a time into scratch rows of ld = pos0 + T, then
// that block's Top-K (topk_from_hist from the scores' histograms where indexer_hist_takes(H, ld),
// hist [block, 512]; else topk_from_scores, hist null). pos [T]: the queries' positions.
// side null: all on `stream`, scratch [block, ld]. side given: each block's Top-K runs on
// side->stream beside the next block's scores, two scratch (and histogram) blocks in turn:
// scratch [2, block, ld], hist [2, block, 512]. Either way `stream` has waited for every Top-K
// when this returns, so what follows on it (the scratch's release included) comes after.
void indexer_topk_wgmma(const __nv_bfloat16* q, const float* w, const __nv_bfloat16* keys, int64_t S, int64_t T,
                        int64_t pos0, int H, int D, const int32_t* pos, int32_t K, int32_t* sel, int64_t block,
                        float* scratch, uint32_t* hist, cudaStream_t stream, const TopkSide* side = nullptr);

// Top-K of rows already in memory (as kernels/indexer.cuh's topk_from_scores), each row first
// copied into shared memory (16-byte loads) so that block_topk's five passes (three radix
// histograms, two compaction scans) read shared memory instead of L2. Rows of up to 51200 keys.
void topk_from_scores_smem(const float* scores, int64_t ld, const int32_t* pos, int64_t nq, int32_t K, int32_t* sel,
                           cudaStream_t stream);

}  // namespace dz::cuda
