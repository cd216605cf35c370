// The warp-level tensor-core and async-copy primitives the mma.sync kernels share (flash
// attention, sparse MLA, the DSA indexer, the MoE GEMMs, mHC, the linear-attention prep): ldmatrix,
// mma m16n8k16 bf16 -> fp32, 3xTF32 m16n8k8, cp.async 16-byte copies with zero fill, named
// barriers, bf16 packing. Inline PTX, sm_80 and later.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
constexpr float kLog2e = 1.4426950408889634f;  // e^x = 2^(x log2 e)
// 2^x by the SFU (the flash kernels' softmax takes exp2 of log2(e)-scaled logits); ex2(-inf) = 0.
// One instruction each, where __expf / __logf add a range test and two scalings for denormal
// results that do not matter here.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// log2 by the SFU, flushing denormals as ex2 does.
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c += a · b (one m16n8k16 tile, bf16 operands, fp32 accumulators)
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 16 bytes global -> shared; ok == false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t saddr, const void* g, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(g), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// Named barriers (id >= 1; 0 is __syncthreads') over n threads, whole warps: the producing warps
// arrive, the consuming ones wait; both order shared memory as a barrier does.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 3xTF32 (mma m16n8k8 tf32): v = hi + lo, hi with tf32's 11 significant bits; lo·hi + hi·lo + hi·hi
// keeps ~fp32's accuracy on tensor cores (hc_post_coeff's projection, the KDA / GDN prep's (I + L)^-1
// blocks). The split by Veltkamp's product at 2^13 + 1 (hi: v rounded to 11 bits, ties to even;
// v - hi exact, its top 11 bits are what the mma reads): 4 instructions, where cvt.rna.tf32.f32 has
// no SASS instruction on sm_90 (ptxas: an add under a finiteness test and a mask, ~5 where inlined,
// twice a split: 472 of the GDN prep's 2,744 instructions). _rn intrinsics: no FMA contraction,
// which would break the split. |v| > FLT_MAX / 8193 (and inf) give NaN (not finite values).
__device__ __forceinline__ void split_tf32(float v, uint32_t& hi, uint32_t& lo) {
  const float c = __fmul_rn(v, 8193.f);
  const float h = __fadd_rn(c, -__fadd_rn(c, -v));
  hi = __float_as_uint(h);
  lo = __float_as_uint(__fadd_rn(v, -h));
}
// d += a · b (one m16n8k8 tile, tf32 operands, fp32 accumulators)
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace dz::cuda
