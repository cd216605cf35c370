// Device-side FP8 helpers shared by the quantization, cache-store and attention kernels. The rules
// (and the CPU emulation these must match bit for bit) are in lib/core/fp8.hpp.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dz::cuda::dev {

// Saturating round-to-nearest-even f32 -> E4M3 (cvt.rn.satfinite.e4m3x2.f32 on sm_89+).
// NaN inputs never reach this: groups holding NaN/Inf are handled by the callers.
__device__ __forceinline__ uint8_t e4m3_sat(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// 2^n as f32 for n in [-126, 127] (exact, built from the exponent bits).
__device__ __forceinline__ float pow2i(int n) { return __int_as_float((n + 127) << 23); }

// E8M0 value 2^(c - 127); 0xFF is NaN; c == 0 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0_value(uint8_t c) {
  if (c == 0xFFu) return __int_as_float(0x7fc00000);
  if (c == 0) return __int_as_float(0x00400000);
  return __int_as_float(int(c) << 23);
}

// Ceil E8M0 scale code: smallest e with 448 * 2^e >= amax. Written differently from the CPU
// loop (closed form): amax = f * 2^E, f in [0.5, 1); 448 = 0.875 * 2^9, so e = E - 9 when
// f <= 0.875, else E - 8. Clamped to [-127, 127]. amax == 0 -> 127, NaN/Inf -> 0xFF.
__device__ __forceinline__ uint8_t mx_scale_ceil(float amax) {
  if (!isfinite(amax)) return 0xFFu;
  if (amax == 0.f) return 127u;
  int E;
  const float f = frexpf(amax, &E);
  int e = f <= 0.875f ? E - 9 : E - 8;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return uint8_t(e + 127);
}

// Warp-wide max over lanes.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// One warp quantizes one MXFP8 group of m <= 32 elements (lane i holds element i).
// Returns this lane's code; *scale gets the group's E8M0 code (same in every lane).
__device__ __forceinline__ uint8_t warp_mx_quant(float x, bool in_range, uint8_t* scale) {
  const bool bad = in_range && !isfinite(x);
  const bool any_bad = __any_sync(0xffffffffu, bad);
  const float amax = warp_max(in_range ? fabsf(x) : 0.f);
  if (any_bad) {
    *scale = 0xFFu;
    return 0x7Fu;
  }
  const uint8_t s = mx_scale_ceil(amax);
  *scale = s;
  return e4m3_sat(__fmul_rn(x, pow2i(127 - int(s))));  // x * 2^-e, exact
}

// One warp quantizes one per-tile FP8 tile of m <= 128 elements; lane i holds elements
// i, i+32, i+64, i+96 (v[j], valid when ok[j]). scale = amax / 448 (IEEE division), 1 when 0.
__device__ __forceinline__ void warp_tile_quant(const float v[4], const bool ok[4], uint8_t code[4], float* scale) {
  bool bad = false;
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (ok[j]) {
      bad |= !isfinite(v[j]);
      amax = fmaxf(amax, fabsf(v[j]));
    }
  }
  const bool any_bad = __any_sync(0xffffffffu, bad);
  amax = warp_max(amax);
  if (any_bad) {
    *scale = __int_as_float(0x7fc00000);
#pragma unroll
    for (int j = 0; j < 4; ++j) code[j] = 0x7Fu;
    return;
  }
  float s = __fdiv_rn(amax, 448.f);
  if (s == 0.f) s = 1.f;
  *scale = s;
#pragma unroll
  for (int j = 0; j < 4; ++j) code[j] = e4m3_sat(__fdiv_rn(v[j], s));
}

// Two E4M3 codes (low byte first) -> float2, exact.
__device__ __forceinline__ float2 e4m3x2_to_f2(uint16_t two) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

}  // namespace dz::cuda::dev
