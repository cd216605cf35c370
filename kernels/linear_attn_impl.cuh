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

}  // namespace dz::cuda::la
