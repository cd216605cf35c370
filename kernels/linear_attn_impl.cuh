// Internal to the linear-attention kernels: the launch arguments shared by the chunk kernels.
#pragma once
#include "linear_attn.cuh"

namespace dz::cuda::la {

constexpr int kBT = 32;     // chunk length of the fp32 kernels (the CPU reference uses 64; same math)
constexpr int kMmaBT = 64;  // chunk length of the tensor-core kernels (version 4)

struct ChunkArgs {
  LaPrefill p;
  bool write_o;  // compute outputs (false: only the state, as for transitions)
  bool trans_A;  // transition pass: S0 = I, v = 0 (requires V == K), so S_end = A
  int64_t rows = 0;  // token rows of p.q / p.k (0: p.T_total); the pipelined prefill's segments: the whole's
};

// State columns per CTA: p.value_block, else from the CTA count of whole state rows `ctas`. fp32
// kernels (v4 false): enough CTAs to fill the GPU (about two per SM), else whole rows of S (no
// recomputation of the key side), at least 32; v4: about half as many CTAs as SMs, at least 16
// (its K = 64 recurrence; K = 128 ignores it).
int pick_bv(const LaPrefill& p, int ctas, int V, bool v4);

// The register-tiled fp32 chunk kernel (linear_attn_tiled.cu), K = V in {64, 128}, bv in {32, 64,
// V}: the segment transitions (la_transitions). With a.write_o it is also the fp32 prefill
// "version 2" that kernels/dev/linear_attn/ compares against.
void launch_chunk_tiled(const ChunkArgs& a, int bv, cudaStream_t stream);

// Version 4 (linear_attn_mma.cu): tensor cores, chunk kMmaBT, outputs inside the recurrence or in
// a parallel pass after it. Needs p.T_total and p.workspace of mma_workspace_bytes(...) bytes; bv
// in {16, 32, 64, K}. Stages: prep (key side into records), recurrence (a.trans_A: S0 = I, v = 0;
// outputs stored for the output pass only with a.write_o and p.o), outputs. The parallel scan
// runs them separately.
size_t mma_workspace_bytes(int64_t T_total, int N, int HV, int K, int V);
constexpr unsigned kPrep = 1, kRecur = 2, kOutput = 4, kAllStages = 7;
void mma_prefill(const ChunkArgs& a, int bv, unsigned stages, cudaStream_t stream);

}  // namespace dz::cuda::la
