// Internal to the linear-attention kernels: the launch arguments shared by the chunk kernels.
#pragma once
#include "linear_attn.cuh"

namespace dz::cuda::la {

constexpr int kBT = 32;  // chunk length of the GPU kernels (the CPU reference uses 64; same math)

struct ChunkArgs {
  LaPrefill p;
  bool write_o;  // compute outputs (false: only the state, as for transitions)
  bool trans_A;  // transition pass: S0 = I, v = 0 (requires V == K), so S_end = A
};

// Version 2 (register-tiled products), K = V in {64, 128}, bv in {32, 64, V}.
void launch_chunk_tiled(const ChunkArgs& a, int bv, cudaStream_t stream);

// Version 3: the key side of every chunk (gates, norms, pair products, the UT solve: W, U, Kd,
// q e^G, Aqk, e^G_last) computed in parallel over (chunk, head) into records, then the state
// recurrence streams the records (double-buffered async copies) and does only the products.
// Records: one per (chunk, value head), split_record_floats(K, V) floats each.
constexpr size_t split_record_floats(int K, int V) { return size_t(3) * K * kBT + kBT * kBT + size_t(kBT) * V + K; }
size_t split_max_chunks(int64_t T_total, int N);
// chunk_base [N + 1] (device, written here): first record chunk of each sequence of p.cu_seqlens.
void split_prepare(const LaPrefill& p, int64_t T_total, int32_t* chunk_base, float* records, cudaStream_t stream);
void split_recur(const ChunkArgs& a, int bv, const int32_t* chunk_base, const float* records, cudaStream_t stream);

// Version 4 (linear_attn_mma.cu): tensor cores, chunk 64, outputs in a parallel pass after the
// recurrence. Needs p.T_total and p.workspace of mma_workspace_bytes(...) bytes; bv in {32, 64, K}.
// Stages: prep (key side into records), recurrence (a.trans_A: S0 = I, v = 0; outputs stored for
// the output pass only with a.write_o and p.o), outputs. The parallel scan runs them separately.
size_t mma_workspace_bytes(int64_t T_total, int N, int HV, int K, int V);
constexpr unsigned kPrep = 1, kRecur = 2, kOutput = 4, kAllStages = 7;
void mma_prefill(const ChunkArgs& a, int bv, unsigned stages, cudaStream_t stream);

}  // namespace dz::cuda::la
