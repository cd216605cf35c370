// Chunked KDA / Gated DeltaNet prefill (version 4, linear_attn_mma.cu), segment transitions
// (the register-tiled fp32 kernel, linear_attn_tiled.cu), ordered merge and the intra-GPU parallel
// scan. Math: lib/ops/linear_attn.cpp (chunked()), the oracle these kernels are tested against.
// Earlier fp32 versions 1-3 of the prefill: kernels/dev/linear_attn/ (with their test and bench).
// Measured on the H200 at T=65536 H=32 K=V=128 (docs/perf), KDA: v1 108 ms, v2 60 ms, v3 24 ms,
// v4 6.3 ms; v4 with the wgmma recurrence (K = 128) 4.97 ms on an H100 (6.09 with mma.sync there).
#include <cuda_pipeline.h>
#include <algorithm>

#include "common.cuh"
#include "linear_attn.cuh"
#include "linear_attn_common.cuh"
#include "linear_attn_impl.cuh"

namespace dz::cuda {

namespace la {

int pick_bv(const LaPrefill& p, int ctas, int V, bool v4) {
  if (p.value_block) return std::min(p.value_block, V);
  const int sms = sm_count();
  if (v4) {  // v4 recurrence (H200, T=64K): half the SMs busy is enough; down to 16 columns
    int bv = V;           // at H=4/8 (2.08 / 2.61 ms vs 2.46 / 2.91 at 32), 32 at H=32 (6.34 vs 7.49 at 16)
    while (bv > 16 && ctas * (V / bv) < sms / 2) bv /= 2;
    return bv;
  }
  for (int bv = V; bv > 32; bv /= 2)
    if (ctas * (V / bv) >= 2 * sms) return bv;
  return 32;
}

}  // namespace la

namespace {

using namespace la;

constexpr int NT = 256;  // threads per CTA

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// The segment transitions run on the register-tiled fp32 chunk kernel (linear_attn_tiled.cu) by
// design, whatever kernel the prefill uses: A and B in fp32 products, as the CPU LaTransition.
void run_transition(const ChunkArgs& a, int V, cudaStream_t stream) {
  DZ_CHECK(a.p.HK > 0 && a.p.HV % a.p.HK == 0, "linear attention CUDA: HV=", a.p.HV, " not a multiple of HK=", a.p.HK);
  if (a.p.N == 0 || a.p.HV == 0) return;
  DZ_CHECK(a.p.K == V && (V == 64 || V == 128), "linear attention CUDA: K=", a.p.K, " V=", V,
           " not supported (K = V = 64 or 128)");
  launch_chunk_tiled(a, pick_bv(a.p, a.p.HV * a.p.N, V, false), stream);
}

// Ordered merge, grid (HV, V / 32): each CTA carries 32 state columns through all segments,
// S_{s+1} = A_s S_s + B_s. A thread holds a 4-column tile of K / 32 rows (x = ty + 32 i) in registers,
// reads A's rows and S's columns as float4 (8 shared loads for 16 K / 32 FMAs, where one scalar
// load fed each FMA before), and segment s + 1's A is in flight (cp.async) while segment s is
// merged. The z order of each sum is the sequential one: results bitwise as before.
template <int K>
__global__ void __launch_bounds__(NT) merge_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                                   const float* __restrict__ h0, int S, int HV, int V,
                                                   float* __restrict__ S_init, float* __restrict__ ht) {
  constexpr int RT = K / 32, AS = K + 4;  // rows a thread; A's padded row (the 4 rows a warp reads
                                          // per float4 load fall in distinct banks)
  static_assert(NT == 256, "8 threads of 4 columns a row, 32 row groups");
  extern __shared__ __align__(16) float msmem[];
  float* Ab = msmem;               // [2][K][AS] A of segment s in buffer s & 1
  float* Sp = msmem + 2 * K * AS;  // [K][32] the state entering the segment
  const int h = blockIdx.x, y0 = blockIdx.y * 32, tid = threadIdx.x, ty = tid >> 3, yx = 4 * (tid & 7);
  auto load_a = [&](int s) {
    const float* src = A + (size_t(s) * HV + h) * K * K;
    float* dst = Ab + (s & 1) * K * AS;
    for (int e = tid; e < K * K / 4; e += NT) {
      const int x = e / (K / 4), z = 4 * (e % (K / 4));
      __pipeline_memcpy_async(dst + x * AS + z, src + x * K + z, 16);
    }
    __pipeline_commit();
  };
  if (S > 0) load_a(0);
  float4 st[RT];  // rows ty + 32 i, columns y0 + yx ..+3 of the state entering the segment
#pragma unroll
  for (int i = 0; i < RT; ++i)
    st[i] = h0 ? *reinterpret_cast<const float4*>(h0 + (size_t(h) * K + ty + 32 * i) * V + y0 + yx)
               : make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < S; ++s) {
    const size_t so = (size_t(s) * HV + h) * K;
#pragma unroll
    for (int i = 0; i < RT; ++i) {
      const int x = ty + 32 * i;
      *reinterpret_cast<float4*>(S_init + (so + x) * V + y0 + yx) = st[i];
      *reinterpret_cast<float4*>(Sp + x * 32 + yx) = st[i];
    }
    if (s + 1 < S) {  // its buffer was last read by segment s - 1, before the barrier that ended it
      load_a(s + 1);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();  // A_s and Sp complete
    const float* As = Ab + (s & 1) * K * AS;
    float acc[RT][4];
#pragma unroll
    for (int i = 0; i < RT; ++i) {
      const float4 b = *reinterpret_cast<const float4*>(B + (so + ty + 32 * i) * V + y0 + yx);
      acc[i][0] = b.x, acc[i][1] = b.y, acc[i][2] = b.z, acc[i][3] = b.w;
    }
    for (int z = 0; z < K; z += 4) {
      float a[RT][4], sv[4][4];
#pragma unroll
      for (int i = 0; i < RT; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(As + (ty + 32 * i) * AS + z);
        a[i][0] = v.x, a[i][1] = v.y, a[i][2] = v.z, a[i][3] = v.w;
      }
#pragma unroll
      for (int d = 0; d < 4; ++d) {
        const float4 v = *reinterpret_cast<const float4*>(Sp + (z + d) * 32 + yx);
        sv[d][0] = v.x, sv[d][1] = v.y, sv[d][2] = v.z, sv[d][3] = v.w;
      }
#pragma unroll
      for (int d = 0; d < 4; ++d)
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][c] += a[i][d] * sv[d][c];
    }
    __syncthreads();  // Sp and this A buffer read by all before they are rewritten
#pragma unroll
    for (int i = 0; i < RT; ++i) st[i] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
  }
  if (ht)
#pragma unroll
    for (int i = 0; i < RT; ++i)
      *reinterpret_cast<float4*>(ht + (size_t(h) * K + ty + 32 * i) * V + y0 + yx) = st[i];
}

// Segment boundaries of one sequence: seg_cu[s] = cu[0] + min(s L, T).
__global__ void segment_bounds_kernel(const int32_t* cu, int S, int L, int T, int32_t* seg_cu) {
  const int s = threadIdx.x + blockIdx.x * blockDim.x;
  if (s <= S) seg_cu[s] = cu[0] + min(s * L, T);
}

}  // namespace


namespace {

constexpr int kMaxPipe = 64;  // segments of the pipelined prefill, at most

// Chunks of the kernel in T rows.
int64_t chunks_of(int64_t T) { return (T + kMmaBT - 1) / kMmaBT; }

// Rows per segment of T rows in about S segments of whole chunks (the pipelined prefill, the
// parallel scan).
int64_t segment_rows(int64_t T, int S) { return (chunks_of(T) + S - 1) / S * kMmaBT; }

// The pipelined prefill's workspace for T rows in about S segments: the segment bounds, two
// states [HV, K, V] (fp32, in turn) and two segments' prefill workspaces (in turn).
struct PipeWs {
  int32_t* seg_cu;
  float* state[2];
  void* seg_ws[2];
  size_t bytes;
};
// base null: only the bytes (the pointers stay null).
PipeWs pipe_carve(void* base, int64_t T, int S, int HV, int K, int V) {
  PipeWs w;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* at = base ? static_cast<char*>(base) + off : nullptr;
    off += bytes;
    return at;
  };
  w.seg_cu = static_cast<int32_t*>(take(align256(size_t(kMaxPipe + 1) * 4)));
  for (auto& st : w.state) st = static_cast<float*>(take(align256(size_t(HV) * K * V * 4)));
  const size_t seg = align256(mma_workspace_bytes(segment_rows(T, S), 1, HV, K, V));
  for (auto& sw : w.seg_ws) sw = take(seg);
  w.bytes = off;
  return w;
}

// Segment s's prep on `stream`, its recurrence (and outputs) on side->stream after the prep and
// after segment s - 1's recurrence; the prep of segment s + 2 reuses segment s's workspace once
// that recurrence is done. Segment s starts from segment s - 1's final state (p.h0 for the first)
// and leaves its own (p.ht for the last): whole chunks on both sides of a boundary and the state in
// fp32, so the outputs and the final state are bitwise the one-pass prefill's.
void pipelined_prefill(const LaPrefill& p, int S_req, cudaStream_t stream) {
  const LaSide& sd = *p.side;
  DZ_CHECK(sd.made(), "la_chunk_prefill: a side stream needs its events (LaSide::create)");
  const int64_t T = p.T_total, L = segment_rows(T, S_req);
  const int S = int((T + L - 1) / L);
  const PipeWs w = pipe_carve(p.workspace, T, S_req, p.HV, p.K, p.V);
  segment_bounds_kernel<<<1, 1024, 0, stream>>>(p.cu_seqlens, S, int(L), int(T), w.seg_cu);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaEventRecord(sd.start(), stream));
  CUDA_CHECK(cudaStreamWaitEvent(sd.stream, sd.start(), 0));
  const int bv = pick_bv(p, p.HV, p.V, true);
  for (int s = 0; s < S; ++s) {
    const int b = s & 1;
    LaPrefill q = p;
    q.cu_seqlens = w.seg_cu + s;
    q.N = 1;
    q.T_total = std::min<int64_t>(L, T - int64_t(s) * L);
    q.workspace = w.seg_ws[b];
    q.h0 = s == 0 ? p.h0 : w.state[b ^ 1];
    q.ht = s == S - 1 ? p.ht : w.state[b];
    if (s >= 2) CUDA_CHECK(cudaStreamWaitEvent(stream, sd.recurred(b), 0));  // segment s - 2 read this workspace
    mma_prefill(ChunkArgs{q, false, false, T}, bv, kPrep, stream);
    CUDA_CHECK(cudaEventRecord(sd.prepped(b), stream));
    CUDA_CHECK(cudaStreamWaitEvent(sd.stream, sd.prepped(b), 0));
    mma_prefill(ChunkArgs{q, q.o != nullptr, false, T}, bv, kRecur | kOutput, sd.stream);
    CUDA_CHECK(cudaEventRecord(sd.recurred(b), sd.stream));
  }
  CUDA_CHECK(cudaEventRecord(sd.done(), sd.stream));
  CUDA_CHECK(cudaStreamWaitEvent(stream, sd.done(), 0));
}

// The automatic intra-GPU scan's segments for one sequence of T rows (1: none). The recurrence of
// the one-pass or pipelined prefill is one chain of T / 64 steps a (head, 64 state columns) CTA
// whatever the head count (KDA 1.39 / 1.47 ms at T = 65536 for H = 4 / 8, GDN 1.61 / 1.63, H100),
// while the scan's passes spread the chain over segments: KDA 0.85 / 1.37 ms there, GDN 0.61 / 0.89;
// at H = 32 the scan loses (KDA 5.1 ms against 3.9 pipelined) (docs/perf/README.md, thirtieth
// session). So: K = V = 128 (the wgmma passes, where measured), T >= 16384 and 16 HV <= SMs (HV <= 8
// on 132 SMs); floor(SMs / HV) segments: 2 HV S <= 2 SMs recurrence CTAs of one CTA an SM, at most
// two full waves in each pass (ceil gave 17 at H = 8: 272 CTAs, a third wave of 8).
int scan_rule(int64_t T, int N, int HV, int K, int V) {
  if (N != 1 || K != 128 || V != 128 || T < 16384 || HV <= 0) return 1;
  const int sms = sm_count();
  if (16 * HV > sms) return 1;
  return int(std::min<int64_t>({int64_t(kMaxPipe), int64_t(sms / HV), chunks_of(T)}));
}

}  // namespace

int la_scan_segments(const LaPrefill& p) {
  return p.scan_segments == 1 ? 1 : scan_rule(p.T_total, p.N, p.HV, p.K, p.V);
}

int la_pipeline_segments(const LaPrefill& p) {
  if (!p.side || p.N != 1 || p.pipeline_segments == 1) return 1;
  if (la_scan_segments(p) > 1) return 1;  // la_chunk_prefill takes the scan first
  if (p.pipeline_segments > 1)
    return int(std::min<int64_t>({int64_t(p.pipeline_segments), int64_t(kMaxPipe), chunks_of(p.T_total)}));
  const int rec_ctas = p.K == 128 ? 2 * p.HV : p.HV * (p.V / pick_bv(p, p.HV, p.V, true));
  if (p.T_total < 16384 || 2 * rec_ctas > sm_count()) return 1;
  return int(std::min<int64_t>(8, p.T_total / 8192));
}

void la_chunk_prefill(const LaPrefill& p, cudaStream_t stream) {
  DZ_CHECK(p.HK > 0 && p.HV % p.HK == 0, "linear attention CUDA: HV=", p.HV, " not a multiple of HK=", p.HK);
  if (p.N == 0 || p.HV == 0) return;
  DZ_CHECK(p.workspace, "linear attention CUDA: the chunked prefill needs a workspace (la_prefill_workspace_bytes)");
  DZ_CHECK(p.pipeline_segments >= 0, "linear attention CUDA: pipeline_segments ", p.pipeline_segments);
  DZ_CHECK(p.scan_segments == 0 || p.scan_segments == 1, "linear attention CUDA: scan_segments ", p.scan_segments,
           " (0 automatic, 1 off)");
  const int G = la_scan_segments(p);
  if (G > 1) return la_parallel_prefill(p, p.T_total, G, p.workspace, stream);
  const int S = la_pipeline_segments(p);
  if (S > 1) return pipelined_prefill(p, S, stream);
  mma_prefill(ChunkArgs{p, p.o != nullptr, false}, pick_bv(p, p.HV * p.N, p.V, true), kAllStages, stream);
}

// One sequence of more than one chunk: also enough for the pipelined form, whose largest need is
// two segments of about T / 2 (and two states), and for the automatic scan.
size_t la_prefill_workspace_bytes(int64_t T_total, int N, int HV, int K, int V) {
  const size_t one = mma_workspace_bytes(T_total, N, HV, K, V);
  if (N != 1 || T_total <= kMmaBT) return one;
  const int G = scan_rule(T_total, N, HV, K, V);
  return std::max({one, pipe_carve(nullptr, T_total, 2, HV, K, V).bytes,
                   G > 1 ? la_scan_workspace_bytes(T_total, G, HV, K, V) : size_t(0)});
}

void la_transitions(const LaPrefill& p, const int32_t* seg_cu, int S, float* A, float* B, cudaStream_t stream) {
  LaPrefill q = p;
  q.cu_seqlens = seg_cu;
  q.N = S;
  q.h0 = nullptr;
  q.o = nullptr;
  q.ht = A;
  run_transition(ChunkArgs{q, false, true}, p.K, stream);  // A: the state is [K, K]
  q.ht = B;
  run_transition(ChunkArgs{q, false, false}, p.V, stream);
}

void la_merge(const float* A, const float* B, const float* h0, int S, int HV, int K, int V, float* S_init, float* ht,
              cudaStream_t stream) {
  if (S == 0 || HV == 0) return;
  DZ_CHECK(V % 32 == 0, "la_merge: V=", V, " not a multiple of 32");
  for (const void* q : {static_cast<const void*>(A), static_cast<const void*>(B), static_cast<const void*>(h0),
                        static_cast<const void*>(S_init), static_cast<const void*>(ht)})
    DZ_CHECK(reinterpret_cast<uintptr_t>(q) % 16 == 0, "la_merge: a state or transition pointer is not 16-byte aligned");
  const dim3 grid(unsigned(HV), unsigned(V / 32));
  const size_t smem = size_t(K) * (2 * (K + 4) + 32) * sizeof(float);  // merge_kernel's Ab and Sp
  if (K == 64) {
    merge_kernel<64><<<grid, NT, smem, stream>>>(A, B, h0, S, HV, V, S_init, ht);
  } else if (K == 128) {
    CUDA_CHECK(cudaFuncSetAttribute(merge_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    merge_kernel<128><<<grid, NT, smem, stream>>>(A, B, h0, S, HV, V, S_init, ht);
  } else {
    fail(str("la_merge: K=", K, " not supported (64 or 128)"));
  }
  CUDA_CHECK_LAUNCH();
}

size_t la_scan_workspace_bytes(int64_t T, int segments, int HV, int K, int V) {
  const size_t s = size_t(std::max(segments, 1));
  return align256((s + 1) * 4) + align256(s * HV * K * K * 4) + 2 * align256(s * HV * K * V * 4) +
         mma_workspace_bytes(T, int(s), HV, K, V);
}

void la_parallel_prefill(const LaPrefill& p, int64_t T, int segments, void* workspace, cudaStream_t stream) {
  DZ_CHECK(p.N == 1, "la_parallel_prefill: one sequence expected, got N=", p.N);
  if (segments <= 1 || chunks_of(T) <= 1) {  // segments of whole chunks: one pass (not the scan again)
    LaPrefill q = p;
    q.scan_segments = 1;
    return la_chunk_prefill(q, stream);
  }
  const int L = int(segment_rows(T, segments));
  const int S = int((T + L - 1) / L);
  char* ws = static_cast<char*>(workspace);
  auto* seg_cu = reinterpret_cast<int32_t*>(ws);
  ws += align256(size_t(segments + 1) * 4);
  auto* A = reinterpret_cast<float*>(ws);
  ws += align256(size_t(segments) * p.HV * p.K * p.K * 4);
  auto* B = reinterpret_cast<float*>(ws);
  ws += align256(size_t(segments) * p.HV * p.K * p.V * 4);
  auto* S_init = reinterpret_cast<float*>(ws);
  ws += align256(size_t(segments) * p.HV * p.K * p.V * 4);
  segment_bounds_kernel<<<1, 1024, 0, stream>>>(p.cu_seqlens, S, L, int(T), seg_cu);
  CUDA_CHECK_LAUNCH();
  // Key side once (tensor cores); transitions, zero-state ends, merge, outputs.
  LaPrefill q = p;
  q.cu_seqlens = seg_cu, q.N = S, q.h0 = nullptr, q.o = nullptr, q.T_total = T, q.workspace = ws;
  mma_prefill(ChunkArgs{q, false, false}, 0, kPrep, stream);
  q.ht = A;
  mma_prefill(ChunkArgs{q, false, true}, pick_bv(p, p.HV * S, p.K, true), kRecur, stream);
  q.ht = B;
  mma_prefill(ChunkArgs{q, false, false}, pick_bv(p, p.HV * S, p.V, true), kRecur, stream);
  la_merge(A, B, p.h0, S, p.HV, p.K, p.V, S_init, p.ht, stream);
  if (!p.o) return;  // the final state (la_merge) was all
  q.h0 = S_init, q.ht = nullptr, q.o = p.o;
  mma_prefill(ChunkArgs{q, true, false}, pick_bv(p, p.HV * S, p.V, true), kRecur | kOutput, stream);
}

}  // namespace dz::cuda
