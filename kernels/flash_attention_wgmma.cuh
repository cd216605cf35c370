// The Hopper (wgmma) flash-attention kernel for Dk = Dv = 128 / 256 and Dk = 192, Dv = 128; flash_attention() (the
// public entry, flash_attention.cuh) routes to it. Internal to kernels/.
#pragma once
#include "flash_attention.cuh"

namespace dz::cuda {

// True when the wgmma kernel handles a: Dk = Dv in {128, 256} or Dk = 192 with Dv = 128, q / k / v 16-byte and out 4-byte
// aligned (row strides are multiples of 8 elements then).
bool flash_attention_wgmma_takes(const FlashAttnArgs& a);
// Requires flash_attention_wgmma_takes(a); heads, scale and empty batches checked by the caller.
void flash_attention_wgmma(const FlashAttnArgs& a, cudaStream_t s);

}  // namespace dz::cuda
