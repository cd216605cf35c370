// Earlier fp32 versions of the chunked KDA / Gated DeltaNet prefill and parallel scan, kept out of
// the library as comparison versions for test_linear_attn.cu here (tested against the CPU
// reference and the production version 4; bench of v3 against v4). Inputs, outputs and math as
// la_chunk_prefill / la_parallel_prefill (kernels/linear_attn.cuh); chunk 32 (la::kBT), K = V =
// 64 or 128; p.value_block picks the column block (32, 64 or V; 0: about two CTAs per SM),
// p.fused_output is ignored. H200, T=65536 H=32 K=V=128, KDA: v1 108 ms, v2 60 ms, v3 24 ms
// (v4 6.3 ms).
#pragma once
#include <cstddef>
#include <cstdint>

#include "linear_attn.cuh"
#include "linear_attn_impl.cuh"

namespace dz::cuda::la_dev {

// Version 1 (linear_attn_fp32.cu): one CTA per (sequence, value head, column block), the state and
// the chunk's matrices in shared memory, SIMT products with broadcast operands.
void v1_chunk_prefill(const LaPrefill& p, cudaStream_t stream);
// Version 2: the register-tiled kernel of la_transitions (kernels/linear_attn_tiled.cu) run over
// the sequences with outputs.
void v2_chunk_prefill(const LaPrefill& p, cudaStream_t stream);
// Version 3 (linear_attn_split.cu): the key side of every chunk in parallel into fp32 records,
// then the recurrence streams them. Needs p.T_total and p.workspace of v3_workspace_bytes(...)
// bytes (no fallback).
size_t v3_workspace_bytes(int64_t T_total, int N, int HV, int K, int V);
void v3_chunk_prefill(const LaPrefill& p, cudaStream_t stream);

// Parallel scan of one sequence (p.N == 1), as la_parallel_prefill, with fp32 kernels. v2:
// la_transitions, la_merge, then v2 with outputs over the segments; v3: records once, then the
// transition, zero-state and output passes of its recurrence around la_merge. Workspace
// fp32_scan_workspace_bytes(...) bytes (one chunk or segments <= 1: the serial version, which for
// v3 needs p.workspace).
size_t fp32_scan_workspace_bytes(int64_t T, int segments, int HV, int K, int V);
void v2_parallel_prefill(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream);
void v3_parallel_prefill(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream);

}  // namespace dz::cuda::la_dev

namespace dz::cuda::la {

// Version 3's kernels (linear_attn_split.cu): the key side of every chunk (gates, norms, pair
// products, the UT solve: W, U, Kd, q e^G, Aqk, e^G_last) computed in parallel over (chunk, head)
// into records, then the state recurrence streams the records (double-buffered async copies) and
// does only the products. Records: one per (chunk, value head), split_record_floats(K, V) floats.
constexpr size_t split_record_floats(int K, int V) { return size_t(3) * K * kBT + kBT * kBT + size_t(kBT) * V + K; }
size_t split_max_chunks(int64_t T_total, int N);
// chunk_base [N + 1] (device, written here): first record chunk of each sequence of p.cu_seqlens.
void split_prepare(const LaPrefill& p, int64_t T_total, int32_t* chunk_base, float* records, cudaStream_t stream);
void split_recur(const ChunkArgs& a, int bv, const int32_t* chunk_base, const float* records, cudaStream_t stream);

}  // namespace dz::cuda::la
