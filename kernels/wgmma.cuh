// Hopper warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors for the 128-byte
// swizzled tiles that TMA's SWIZZLE_128B (or the same XOR written by threads) lays out, the
// fences and waits; the products themselves are in wgmma_ops.cuh (generated).
//
// Tile layout the descriptors assume: rows of 128 bytes (64 bf16 of k), 16-byte chunk c of row r
// stored at chunk c ^ (r & 7), groups of 8 rows 1024 bytes apart, the tile 1024-byte aligned (the
// swizzle is a function of the address bits, so a k16 step inside the 128-byte row is a plain
// +32 bytes on the start address).
#pragma once
#include <cstdint>

#include "wgmma_ops.cuh"

namespace dz::cuda {

// Descriptor of a K-major, 128-byte-swizzled tile starting at shared address saddr (a row start).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t saddr) {
  uint64_t d = uint64_t((saddr & 0x3FFFFu) >> 4);  // start address / 16
  d |= uint64_t(1) << 16;                           // leading byte offset (unused for swizzled K-major)
  d |= uint64_t(1024 >> 4) << 32;                   // stride byte offset: 8 rows of 128 bytes
  d |= uint64_t(1) << 62;                           // 128-byte swizzle
  return d;
}
// Descriptor of an N-major (MN-major, "transposed B") 128-byte-swizzled operand: the tile is
// stored as column blocks of 64 n (128 bytes per k row), k rows 128 bytes apart, 8-row groups
// 1024 bytes apart (stride byte offset); lbo = the byte stride between the 64-wide column blocks
// (leading byte offset). saddr = the start of k row k0 in the first column block.
__device__ __forceinline__ uint64_t wgmma_desc_nmajor_sw128(uint32_t saddr, uint32_t lbo) {
  uint64_t d = uint64_t((saddr & 0x3FFFFu) >> 4);
  d |= uint64_t((lbo >> 4) & 0x3FFFu) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}
// A descriptor made once for a tile's base and offset within it by whole 16-byte units: the 14-bit
// start-address field (address / 16, shared memory < 256 KB) takes the offset without a carry, so
// an offset descriptor is one 32-bit add on the low word (built per use, the masks and 64-bit
// shifts were ~20 % of a recurrence step's instructions).
struct WgmmaDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ uint64_t at(uint32_t bytes) const {
    return (uint64_t(hi) << 32) | uint32_t(lo + (bytes >> 4));
  }
};
__device__ __forceinline__ WgmmaDesc wgmma_base_sw128(uint32_t saddr) {
  const uint64_t d = wgmma_desc_sw128(saddr);
  return {uint32_t(d), uint32_t(d >> 32)};
}
__device__ __forceinline__ WgmmaDesc wgmma_base_nmajor_sw128(uint32_t saddr, uint32_t lbo) {
  const uint64_t d = wgmma_desc_nmajor_sw128(saddr, lbo);
  return {uint32_t(d), uint32_t(d >> 32)};
}
// Descriptor advanced by `bytes` along the row (k16 step: 32 bytes = 2 descriptor units).
__device__ __forceinline__ uint64_t wgmma_desc_add(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across an issue or a wait.
template <int N>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Four 8x8 bf16 matrices from this warp's fragments (accumulators packed to bf16 pairs) to shared
// memory, transposed (sm_90 stmatrix): lane 8 m + i gives the address of stored row i of matrix m
// (= fragment column i), register m holds matrix m's fragment (row lane / 4, columns
// 2 (lane % 4) + {0, 1}, the lower column in the low half).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t saddr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(saddr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace dz::cuda
