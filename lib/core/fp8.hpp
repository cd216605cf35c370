// Bit-exact CPU emulation of the low-precision formats of DESIGN.md §5, so that CUDA kernels can
// later be compared with the CPU backend code for code.
//
// FP8 E4M3 ("fn" variant, OCP FP8 / torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa
// bits; no infinities; S.1111.111 (0x7F / 0xFF) is NaN; largest finite 448 (0x7E); smallest
// normal 2^-6; subnormals m * 2^-9, m = 1..7.
//   f32_to_e4m3: round to nearest, ties to even, SATURATING: every finite |x| > 448 and ±Inf give
//   ±448 (as __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and cvt.rn.satfinite.e4m3x2.f32).
//   NaN gives the canonical NaN 0x7F (the sign of a NaN is not kept). -0 gives 0x80.
//
// E8M0 (OCP MX v1.0 shared scale): 8-bit biased exponent, value 2^(e - 127), e = 0..254;
// 0xFF is NaN. There is no zero.
//
// MXFP8 (indexer Q and K): groups of 32 consecutive elements of a row share one E8M0 scale;
// element = e4m3(x / scale), saturating. The scale exponent:
//   MxScaleRounding::Ceil (default): the smallest e with 448 * 2^e >= amax, i.e.
//     e = ceil(log2(amax / 448)) in exact arithmetic. This is what DeepSeek-V3.2 (inference
//     kernel.py act_quant with scale_fmt "ue8m0": fast_round_scale) and DeepGEMM
//     (utils/math.py ceil_to_ue8m0(amax / 448)) do; it never saturates an element.
//   MxScaleRounding::OcpFloor: the OCP MX v1.0 recipe e = floor(log2(amax)) - 8 (emax of E4M3);
//     elements that land in (448, 512) saturate to ±448.
//   e is clamped to [-127, 127] (codes 0..254).
//   amax == 0 (all zeros): scale code 127 (2^0 = 1) and the elements keep their signed zero.
//   A NaN or ±Inf anywhere in a group: scale code 0xFF (NaN) and every element code 0x7F.
//   Tail: when the row length is not a multiple of 32 the last group holds the remaining
//   n % 32 elements and its scale comes from those alone (the same as zero padding to 32).
//   Differences from DeepGEMM's test helpers: no amax clamp to 1e-4 (tiny groups get a finer
//   scale), and the exponent is computed exactly (DeepSeek's amax * fp32(1/448) can round a
//   value 448 * 2^k up to the next exponent).
//
// Per-tile FP8 (sparse-attention KV cache, FlashMLA "V32_FP8" style): per row (token, head),
// per 128-element tile, one fp32 scale = amax / 448 (fp32 division, round to nearest even);
// element = e4m3(x / scale) (fp32 division, then saturating RNE). amax == 0: scale 1.0f and
// zero elements (no division by zero anywhere). A NaN or ±Inf in a tile: scale NaN, codes 0x7F.
// The last tile of a row may be shorter than 128 (scale from its own elements). The RoPE part of
// the KV cache is kept in BF16: bf16_round below (round to nearest even, NaN kept).
//
// MXFP4 (Kimi K3's routed experts: compressed-tensors "mxfp4-pack-quantized", OCP MX v1.0): FP4
// E2M1 elements (1 sign, 2 exponent, 1 mantissa: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives;
// nibble 8 is -0), groups of 32 consecutive elements of a row share one E8M0 scale. Packed two per
// byte, the even element in the LOW nibble: packed [rows, n / 2], scales [rows, n / 32], n a
// multiple of 32. Value = e2m1(nibble) * 2^(scale - 127): exact in f32 and in BF16 (one mantissa
// bit; 2^-128 at the smallest is a subnormal of both). A scale of 0xFF is NaN: a checkpoint that
// holds one is refused where it is loaded (a NaN weight is never what a publisher meant).
#pragma once
#include <cstdint>

namespace dz {

// ---- scalars ----
uint8_t f32_to_e4m3(float x);  // saturating RNE, see above
float e4m3_to_f32(uint8_t c);  // exact
inline bool e4m3_is_nan(uint8_t c) { return (c & 0x7Fu) == 0x7Fu; }

float e8m0_to_f32(uint8_t c);  // 2^(c - 127), exact (2^-127 is an f32 subnormal); 0xFF -> NaN

constexpr int64_t kMxGroup = 32;    // MXFP8 elements per shared scale
constexpr int64_t kKvTile = 128;    // per-tile FP8 elements per fp32 scale
constexpr float kE4m3Max = 448.f;

enum class MxScaleRounding { Ceil, OcpFloor };

// E8M0 scale code for a group with the given amax (>= 0; NaN/Inf give 0xFF; 0 gives 127).
uint8_t mx_scale_e8m0(float amax, MxScaleRounding r = MxScaleRounding::Ceil);

// ---- MXFP8 ----
// x [rows, n] -> codes [rows, n], scales [rows, ceil(n / 32)] (E8M0 codes).
void mxfp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, uint8_t* scales,
                    MxScaleRounding r = MxScaleRounding::Ceil);
// codes [rows, n], scales [rows, ceil(n / 32)] -> y [rows, n] = e4m3_to_f32(code) * 2^(scale - 127)
// (exact in f32 unless the product leaves the f32 range).
void mxfp8_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t n, float* y);
// quantize + dequantize: what a consumer of the MXFP8 tensor sees. y may alias x.
void mxfp8_round(const float* x, int64_t rows, int64_t n, float* y, MxScaleRounding r = MxScaleRounding::Ceil);

// ---- per-tile FP8 (KV cache) ----
// x [rows, n] -> codes [rows, n], scales [rows, ceil(n / 128)] (fp32).
void kv_fp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, float* scales);
// y [rows, n] = e4m3_to_f32(code) * scale (one fp32 multiply, RNE).
void kv_fp8_dequantize(const uint8_t* codes, const float* scales, int64_t rows, int64_t n, float* y);
// quantize + dequantize. y may alias x.
void kv_fp8_round(const float* x, int64_t rows, int64_t n, float* y);

// ---- FP8 block-scaled weights (DeepSeek checkpoints: one fp32 scale per 128 x 128 block) ----
// The E4M3 codes of w [R, C] dequantised with scales [ceil(R / 128), ceil(C / 128)] (core/tensor.hpp
// Tensor::fp8_block_scales): code = e4m3(w / scale). Exact: w = fp32(value * scale) has a relative
// rounding error <= 2^-24 and a code has 4 significant bits, so the division rounds back to the
// code. A zero (or non-finite) scale gives code 0 (or NaN codes), as the values it came from.
void fp8_block_codes(const float* w, int64_t R, int64_t C, const float* scales, uint8_t* codes);

// ---- BF16 storage emulation ----
// y[i] = bf16 value nearest to x[i] (ties to even), as f32. y may alias x.
void bf16_round(const float* x, int64_t n, float* y);

// ---- MXFP4 (E2M1 pairs + E8M0 per 32) ----
constexpr int64_t kMx4Group = 32;
float e2m1_to_f32(uint8_t nibble);  // low 4 bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, .., -6
// packed [rows, n / 2], scales [rows, n / 32] -> y [rows, n] (n % 32 == 0).
void mxfp4_dequantize(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t n, float* y);
// The inverse for values that ARE MXFP4 (a dequantised MXFP4 tensor, or a slice of one on 32-column
// groups): per group the smallest scale that fits its largest magnitude in 6, then each element's
// code. Any other scale of the group is a larger power of two (a decoded tensor does not say which
// one was stored), and the values are the same. Returns false, with the outputs unspecified, when
// some element is not a code times that scale (not an MXFP4 tensor).
bool mxfp4_encode_exact(const float* x, int64_t rows, int64_t n, uint8_t* packed, uint8_t* scales);

}  // namespace dz
