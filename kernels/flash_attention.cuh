// Causal flash-attention forward for prefill on tensor cores (mma.sync m16n8k16 bf16, fp32
// accumulation), with GQA and varlen batches. The dense-path replacement of k_attention in
// backend_ops.cu (same semantics; see flash_attention.cu for the design).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

// Causal softmax attention over a varlen batch of B sequences (FlashAttention varlen semantics,
// bottom-right aligned): sequence b has queries q rows [cu_q[b], cu_q[b+1]) and keys / values rows
// [cu_k[b], cu_k[b+1]); with Lq = its query count and Lk its key count (Lk >= Lq), its query i sees
// its keys j <= i + (Lk - Lq). q [*, Hq, Dk], k [*, Hkv, Dk], v [*, Hkv, Dv], out [*, Hq, Dv], all bf16,
// rows contiguous (row stride Hq*Dk, Hkv*Dk, Hkv*Dv, Hq*Dv). Query head h reads KV head h / (Hq / Hkv).
// fp32 softmax and accumulation; out = bf16(sum_j p_j v_j / sum_j p_j), p_j = exp(scale*q.k_j - max).
// (P is rounded to bf16 as the operand of the P.V product; sum_j p_j is taken in fp32 before that.)
// A query that sees no key (only possible when Lk < Lq) gets zeros.
struct FlashAttnArgs {
  const __nv_bfloat16 *q, *k, *v;
  __nv_bfloat16* out;
  const int32_t *cu_q, *cu_k;  // device, [B + 1]
  int B = 0;
  int64_t max_q = 0;  // host-known upper bound of any Lq (grid size)
  // Host-known row counts of the q and of the k / v tensors (their extents, >= cu_q[B] / cu_k[B];
  // required, -1 = unset): the wgmma kernel's TMA maps are built over them.
  int64_t rows_q = -1, rows_k = -1;
  int Hq = 0, Hkv = 0, Dk = 0, Dv = 0;
  float scale = 1.f;
};

bool flash_attention_supports(int Dk, int Dv);  // true for every 1 <= Dk, Dv <= 256
// DZ_CHECKs unsupported dims, Hq % Hkv and scale > 0 (finite).
void flash_attention(const FlashAttnArgs& a, cudaStream_t s);

}  // namespace dz::cuda
