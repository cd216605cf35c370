// Linear attention with a delta-rule state on the GPU: KDA (per-channel decay) and Gated DeltaNet
// (scalar decay). CPU reference (the oracle): lib/ops/linear_attn.hpp, whose state layout is used
// here unchanged: per value head S [K, V] row-major, all heads [HV, K, V], fp32.
//
// Inputs are the raw projections (after the short conv), BF16; the kernels do what the CPU mixer
// does before calling kda_chunked / gdn_chunked:
//   q, k  <- x / sqrt(sum(x^2) + 1e-6)          (L2 norm per head row; q is then multiplied by scale)
//   beta  <- sigmoid(b)
//   g     <- -exp(A_log[h]) * softplus(f + dt_bias)              (lower_bound == 0)
//            lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)) (lower_bound < 0; KDA only)
// Head grouping as the CPU reference: key head h / (HV / HK) serves value head h.
// Sequences are packed ([T_total, ...] rows) and delimited by cu_seqlens [N + 1] (int32, device),
// cu_seqlens[0] = 0 and cu_seqlens[N] = T_total: GDN at K = 128 reads q / k by tensor maps of
// T_total rows (rows past them read as zeros).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "side_stream.cuh"

namespace dz::cuda {

using bf16 = __nv_bfloat16;

struct LaGate {
  const bf16* f = nullptr;        // KDA [T, HV*K]; GDN [T, HV]
  const float* A_log = nullptr;   // [HV]; nullptr: exp(A_log) = 1
  const float* dt_bias = nullptr; // KDA [HV*K]; GDN [HV]; nullptr: none
  float lower_bound = 0.f;        // 0: softplus gate; < 0: lower-bound sigmoid gate
};

// la_chunk_prefill's pipelined form's second stream (LaPrefill::side; the backend keeps one):
// start() and done() join it to the caller's stream at the call's ends; prepped(b), segment workspace
// b's prep done (caller's stream); recurred(b), the recurrence done with it (side stream). create(true)
// puts the stream at the greatest priority, measured by `bench linear-attn`'s *_pipelined_prio rows;
// the backend's is a default-priority one.
struct LaSide : SideStream<6> {
  cudaEvent_t start() const { return ev[0]; }
  cudaEvent_t done() const { return ev[1]; }
  cudaEvent_t prepped(int b) const { return ev[2 + b]; }
  cudaEvent_t recurred(int b) const { return ev[4 + b]; }
};

struct LaPrefill {
  bool kda = true;                // true: per-channel decay (KDA), false: scalar (GDN)
  const bf16* q = nullptr;        // [T, HK, K]
  const bf16* k = nullptr;        // [T, HK, K]
  const bf16* v = nullptr;        // [T, HV, V]
  const bf16* b = nullptr;        // [T, HV] beta logits
  LaGate gate;
  int HK = 0, HV = 0, K = 0, V = 0;  // K, V in {64, 128}
  float scale = 1.f;
  const int32_t* cu_seqlens = nullptr;  // [N + 1], device
  int N = 0;
  const float* h0 = nullptr;      // [N, HV, K, V] initial states, nullptr: zeros
  float* ht = nullptr;            // [N, HV, K, V] final states, nullptr: not written
  bf16* o = nullptr;              // [T, HV, V]
  // T_total = rows of all sequences, and a device workspace of
  // la_prefill_workspace_bytes(T_total, N, HV, K, V) bytes (required: no silent fallback).
  int64_t T_total = 0;
  void* workspace = nullptr;
  // Tuning, per call (no global state). value_block: state columns per CTA (16, 32, 64 or V; 0:
  // from the CTA count) at K = 64; K = 128 always takes 64 (one warpgroup's wgmma accumulators).
  // fused_output: outputs inside the recurrence (1) or in a pass after it (0); -1: inside, except
  // at K = 64 with fewer recurrence CTAs than half the SMs.
  int value_block = 0;
  int fused_output = -1;
  // Pipelined prefill of one sequence (N = 1; side given): the sequence in segments of whole chunks,
  // each segment's key side (prep) on the caller's stream beside the previous segment's recurrence
  // on side->stream, the state carried from segment to segment in fp32 (bitwise the one-pass
  // result). The recurrence's CTAs leave SMs idle that the next segment's prep takes.
  // pipeline_segments: 0 automatic (la_pipeline_segments), 1 off, n > 1 about n segments (<= 64).
  const LaSide* side = nullptr;
  int pipeline_segments = 0;
  // The intra-GPU parallel scan (la_parallel_prefill) in place of both, for one long sequence with
  // few heads (la_scan_segments): 0 automatic, 1 off. Not bitwise the one-pass result (the states
  // cross segments through fp32 transitions and the merge), within the same tolerances.
  int scan_segments = 0;
};
size_t la_prefill_workspace_bytes(int64_t T_total, int N, int HV, int K, int V);
// The segments la_chunk_prefill runs p in pipelined: 1 (one pass, or the scan where la_scan_segments
// takes p) unless p.side is given and N = 1; then p.pipeline_segments when set, else automatic:
// min(8, T / 8192) where T >= 16384 and the recurrence keeps at most half the SMs busy (its CTAs:
// 2 HV at K = 128, HV V / value block at 64).
int la_pipeline_segments(const LaPrefill& p);
// The segments of the intra-GPU scan la_chunk_prefill runs p as instead (1: none): with
// p.scan_segments = 0, N = 1, K = V = 128, T >= 16384 and 16 HV <= SMs, floor(SMs / HV) (<= 64, <=
// the chunks); the workspace (la_prefill_workspace_bytes) covers it.
int la_scan_segments(const LaPrefill& p);

// Chunked (WY / UT) prefill on tensor cores (linear_attn_mma.cu), chunk 64: the key side of all
// chunks in parallel, then one CTA per (sequence, value head, block of state columns) sequential
// over chunks (wgmma at K = 128, mma.sync at K = 64), the outputs inside that recurrence or in a
// parallel pass after it. K = V = 64 or 128. The tuning comes from p (see above). Earlier fp32
// versions: kernels/dev/linear_attn/.
void la_chunk_prefill(const LaPrefill& p, cudaStream_t stream);

// ---- Segment transitions and the ordered merge (DESIGN §4 stage 1 and 2) ----
// For the segments of one sequence given by seg_cu [S + 1] (device, int32, absolute rows):
// A [S, HV, K, K] and B [S, HV, K, V] with S_end = A · S_begin + B (see LaTransition).
// Uses p's inputs, sizes and value_block (32, 64 or V); p.cu_seqlens / N / h0 / ht / o / workspace
// are ignored (the register-tiled fp32 kernel, linear_attn_tiled.cu, computes them). K = V = 64
// or 128.
void la_transitions(const LaPrefill& p, const int32_t* seg_cu, int S, float* A, float* B, cudaStream_t stream);
// Ordered merge: S_init[0] = h0 (nullptr: zeros), S_init[s+1] = A_s S_init[s] + B_s; the state
// after the last segment goes to ht (nullptr: not written). S_init [S, HV, K, V].
void la_merge(const float* A, const float* B, const float* h0, int S, int HV, int K, int V, float* S_init, float* ht,
              cudaStream_t stream);

// Intra-GPU parallel scan for one long sequence (p.N == 1, T rows): split into `segments`
// segments of whole chunks, the key side of all chunks once, transitions of the segments in
// parallel (the tensor-core recurrence from S0 = I, v = 0 and from zero), merge, then the outputs
// of all segments in parallel. Workspace: la_scan_workspace_bytes(...) bytes of device memory
// (segments <= 1 or one chunk: la_chunk_prefill, with p.workspace).
size_t la_scan_workspace_bytes(int64_t T, int segments, int HV, int K, int V);
void la_parallel_prefill(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream);

// ---- Recurrent decode: one token (or a few, cu) per sequence against state slots ----
// q, k [B, HK, K]; v [B, HV, V]; b [B, HV]; gate.f [B, HV*K] (KDA) / [B, HV] (GDN);
// states [num_slots, HV, K, V] updated in place at slot[i] for sequence i; o [B, HV, V].
struct LaDecode {
  bool kda = true;
  const bf16 *q = nullptr, *k = nullptr, *v = nullptr, *b = nullptr;
  LaGate gate;
  int HK = 0, HV = 0, K = 0, V = 0;
  float scale = 1.f;
  int B = 0;
  const int32_t* slot = nullptr;  // [B], device
  float* states = nullptr;
  bf16* o = nullptr;
  int value_block = 0;  // state columns per CTA (32, 64 or V; 0: chosen from the CTA count)
  // Several tokens per sequence (a speculative verify forward, DESIGN §11): sequence b takes rows
  // cu[b] .. cu[b+1] of q / k / v / b / gate.f / o in order (device [B + 1]; nullptr: row b alone),
  // and states_out [rows, HV, K, V] (nullptr: not kept) gets the state after each row.
  const int32_t* cu = nullptr;
  float* states_out = nullptr;
};
void la_decode(const LaDecode& p, cudaStream_t stream);


}  // namespace dz::cuda

namespace dz::cuda {

// ---- Token-by-token recurrent scan of one sequence, any small head dims ----
// For head dims the chunked and decode kernels do not cover (K or V not 64 / 128; K <= 64,
// V <= 256, as in the tiny golden and demo models): one CTA per value head, one thread per state
// column, sequential over the T tokens. Same inputs and math as la_chunk_prefill with N = 1
// (raw q/k L2-normalised in the kernel, sigmoid beta, the gate); state [HV, K, V] fp32 in place.
bool la_chunked_supports(int K, int V);
void la_recurrent(const LaPrefill& p, int64_t T, float* state, cudaStream_t stream);

}  // namespace dz::cuda
