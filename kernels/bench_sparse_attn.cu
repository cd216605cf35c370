// Benchmarks of the sparse-attention path (see bench_sparse_attn.cuh). Shapes follow DESIGN.md §7:
// indexer prefill T=32768, 64 heads x 128, top-2048; sparse MLA prefill h=128, d_qk 576, top-2048;
// sparse MLA decode with the FP8 KV cache; the indexer's decode preprocessing, serial vs three streams.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <vector>

#include "bench_sparse_attn.cuh"
#include "bench_util.cuh"
#include "common.cuh"
#include "indexer.cuh"
#include "indexer_wgmma.cuh"
#include "indexer_prep.cuh"
#include "paged_cache.cuh"
#include "sparse_mla.cuh"

namespace dz::cuda {

namespace {

__global__ void fill_bf16(__nv_bfloat16* x, size_t n, uint32_t seed, float sd) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (float(h & 0xFFFFFF) / 16777216.f - 0.5f) * 3.4641f;  // unit variance
    x[i] = __float2bfloat16(u * sd);
  }
}

void randomize(__nv_bfloat16* x, size_t n, uint32_t seed, float sd = 1.f) {
  fill_bf16<<<1024, 256>>>(x, n, seed, sd);
  CUDA_CHECK_LAUNCH();
}

// One sequence per query-batch layout helper: block table with identity pages.
struct Layout {
  int32_t* table = nullptr;
  BlockTable bt;
  int64_t rows = 0;
  Layout(int nseq, int len, int P) {
    const int mp = (len + P - 1) / P;
    std::vector<int32_t> t(size_t(nseq) * mp);
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(i);
    table = benchrand::alloc<int32_t>(t.size());
    CUDA_CHECK(cudaMemcpy(table, t.data(), t.size() * 4, cudaMemcpyHostToDevice));
    bt = BlockTable{table, mp, P};
    rows = int64_t(t.size()) * P;
  }
  ~Layout() { cudaFree(table); }
};

std::string bench_indexer(bool mx) {
  const int T = 32768, H = 64, D = 128, K = 2048, P = 64;
  Layout lay(1, T, P);
  auto* k = benchrand::alloc<__nv_bfloat16>(size_t(T) * D);
  auto* q = benchrand::alloc<__nv_bfloat16>(size_t(T) * H * D);
  auto* kbf = benchrand::alloc<__nv_bfloat16>(size_t(lay.rows) * D);
  auto* kc = benchrand::alloc<uint8_t>(size_t(lay.rows) * D);
  auto* ks = benchrand::alloc<uint8_t>(size_t(lay.rows) * D / 32);
  auto* w = benchrand::alloc<float>(size_t(T) * H);
  auto* sel = benchrand::alloc<int32_t>(size_t(T) * K);
  randomize(k, size_t(T) * D, 1);
  randomize(q, size_t(T) * H * D, 2);
  std::vector<float> hw(size_t(T) * H);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f / 90.5f);
  for (float& v : hw) v = nd(rng);
  CUDA_CHECK(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> hs(T, 0), hp(T);
  for (int i = 0; i < T; ++i) hp[size_t(i)] = i;
  auto* seq = benchrand::alloc<int32_t>(T);
  auto* pos = benchrand::alloc<int32_t>(T);
  CUDA_CHECK(cudaMemcpy(seq, hs.data(), T * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(pos, hp.data(), T * 4, cudaMemcpyHostToDevice));
  IndexKeyCache cache{D, mx, kbf, kc, ks};
  store_index_k(k, seq, pos, T, lay.bt, cache, nullptr);
  const double flop = 2.0 * H * D * (double(T) * (T + 1) / 2);
  const double ms_fused =
      median_ms([&] { indexer_topk(q, w, seq, pos, T, H, T, lay.bt, cache, K, sel, nullptr, nullptr); }, 5);
  auto* scores = benchrand::alloc<float>(size_t(T) * T);
  // BF16 keys: the backend's prefill path (CudaBackend::indexer_topk, kernels/indexer_wgmma.cuh's
  // indexer_topk_wgmma): the wgmma scores over the contiguous rows in query blocks, each block's
  // Top-K (from the score histograms for H 32 / 64 with rows < 65536 keys) on a second stream beside
  // the next block's scores, two blocks of 2^27 scratch floats in turn; and the same serially, one
  // block of 2^28 floats at a time (the backend before the overlap)
  double ms_wg = 0, ms_wg_serial = 0, ms_wg_sc = 0;
  const bool use_hist = !mx && indexer_hist_takes(H, T);
  if (!mx) {
    const int64_t half = std::max<int64_t>(1, (int64_t(1) << 27) / T), whole = std::min<int64_t>(T, 2 * half);
    uint32_t* hist = use_hist ? benchrand::alloc<uint32_t>(size_t(2 * half) * 512) : nullptr;
    TopkSide side;
    side.create();
    ms_wg = median_ms(
        [&] {
          indexer_topk_wgmma(q, w, k, T, T, 0, H, D, pos, K, sel, half, scores, hist, nullptr,
                             T > half ? &side : nullptr);
        },
        5);
    ms_wg_serial = median_ms(
        [&] { indexer_topk_wgmma(q, w, k, T, T, 0, H, D, pos, K, sel, whole, scores, hist, nullptr); }, 5);
    if (hist) CUDA_CHECK(cudaFree(hist));
    ms_wg_sc = median_ms([&] { indexer_scores_wgmma(q, w, k, T, 0, H, D, T, scores, T, nullptr); }, 3);
  }
  const double ms = mx ? ms_fused : ms_wg;
  std::printf("indexer prefill T=%d H=%d D=%d K=%d keys=%s: %.3f ms (%.1f TFLOP/s on the causal scores; %s)\n", T, H,
              D, K, mx ? "mxfp8" : "bf16", ms, flop / ms * 1e-9,
              mx ? "the fused kernel" : "wgmma scores + Top-K as the backend runs them");
  if (!mx)
    std::printf("  wgmma scores alone %.3f ms (%.1f TFLOP/s); the same blocks' Top-K serially after each block's "
                "scores %.3f ms; the fused paged kernel %.3f ms\n",
                ms_wg_sc, flop / ms_wg_sc * 1e-9, ms_wg_serial, ms_fused);
  // Both kernel variants explicitly (the default picks one per key format).
  double ms_var[2];
  for (int v = 0; v < 2; ++v) {
    const auto var = v == 0 ? IndexerVariant::QInSmem : IndexerVariant::QInRegisters;
    ms_var[v] = median_ms(
        [&] { indexer_topk(q, w, seq, pos, T, H, T, lay.bt, cache, K, sel, nullptr, nullptr, false, var); }, 3);
  }
  std::printf("  variants: Q in shared memory (16 warps) %.3f ms, Q in registers (8 warps) %.3f ms\n", ms_var[0],
              ms_var[1]);
  // Where the time goes: the split mode's two kernels timed apart (scores to memory, then Top-K).
  const double ms_sc = median_ms([&] { indexer_scores(q, w, seq, pos, T, H, T, lay.bt, cache, scores, nullptr); }, 3);
  const double ms_tk = median_ms([&] { topk_from_scores(scores, T, pos, T, K, sel, nullptr); }, 3);
  std::printf("  split mode: scores %.3f ms (%.1f TFLOP/s), Top-K from memory %.3f ms\n", ms_sc, flop / ms_sc * 1e-9,
              ms_tk);
  for (void* p : std::vector<void*>{k, q, kbf, kc, ks, w, sel, seq, pos, scores}) cudaFree(p);
  std::ostringstream os;
  os << "{\"op\": \"indexer_prefill\", \"T\": " << T << ", \"heads\": " << H << ", \"head_dim\": " << D
     << ", \"topk\": " << K << ", \"keys\": \"" << (mx ? "mxfp8" : "bf16") << "\", \"ms\": " << ms
     << ", \"path\": \"" << (mx ? "fused" : use_hist ? "wgmma scores + topk_from_hist" : "wgmma scores + topk_from_scores") << "\", \"fused_ms\": " << ms_fused
     << ", \"wgmma_scores_ms\": " << ms_wg_sc << ", \"serial_topk_ms\": " << ms_wg_serial
     << ", \"tflops_scores\": " << flop / ms * 1e-9 << ", \"split_scores_ms\": " << ms_sc
     << ", \"split_topk_ms\": " << ms_tk << ", \"variant_q_in_smem_ms\": " << ms_var[0] << ", \"variant_q_in_registers_ms\": " << ms_var[1]
     << ", \"target_ms\": 15}";
  return os.str();
}

std::string bench_mla(const char* name, int nseq, int q_per_seq, int ctx, bool fp8, int H, int reps,
                      bool split_kv = false) {
  const int R = 512, DR = 64, DK = R + DR, K = 2048, P = 64;
  const int64_t nq = int64_t(nseq) * q_per_seq;
  Layout lay(nseq, ctx, P);
  auto* lat = benchrand::alloc<__nv_bfloat16>(size_t(lay.rows) * R);
  auto* kpe = benchrand::alloc<__nv_bfloat16>(size_t(lay.rows) * DR);
  randomize(lat, size_t(lay.rows) * R, 4);
  randomize(kpe, size_t(lay.rows) * DR, 5);
  LatentCache cache{R, DR, fp8};
  if (fp8) {
    cache.codes = benchrand::alloc<uint8_t>(size_t(lay.rows) * R);
    cache.scales = benchrand::alloc<float>(size_t(lay.rows) * R / 128);
    cache.rope = benchrand::alloc<__nv_bfloat16>(size_t(lay.rows) * DR);
  } else {
    cache.bf16 = benchrand::alloc<__nv_bfloat16>(size_t(lay.rows) * DK);
  }
  {  // fill the cache through the store kernel (every page row, identity table)
    std::vector<int32_t> hs, hp;
    for (int b = 0; b < nseq; ++b)
      for (int s = 0; s < lay.bt.max_pages * P; ++s) {
        hs.push_back(b);
        hp.push_back(s);
      }
    auto* s = benchrand::alloc<int32_t>(hs.size());
    auto* p = benchrand::alloc<int32_t>(hp.size());
    CUDA_CHECK(cudaMemcpy(s, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p, hp.data(), hp.size() * 4, cudaMemcpyHostToDevice));
    store_latent_kv(lat, kpe, s, p, int64_t(hs.size()), lay.bt, cache, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaFree(s);
    cudaFree(p);
  }
  // queries at the end of each context; K distinct random visible positions each
  std::vector<int32_t> hs, hp, hsel;
  std::mt19937 rng(6);
  for (int b = 0; b < nseq; ++b)
    for (int j = 0; j < q_per_seq; ++j) {
      const int p = ctx - q_per_seq + j;
      hs.push_back(b);
      hp.push_back(p);
      std::vector<int32_t> c(size_t(p) + 1);
      for (size_t i = 0; i < c.size(); ++i) c[i] = int32_t(i);
      std::shuffle(c.begin(), c.end(), rng);
      c.resize(K);
      std::sort(c.begin(), c.end());
      hsel.insert(hsel.end(), c.begin(), c.end());
    }
  auto* seq = benchrand::alloc<int32_t>(hs.size());
  auto* pos = benchrand::alloc<int32_t>(hp.size());
  auto* sel = benchrand::alloc<int32_t>(hsel.size());
  CUDA_CHECK(cudaMemcpy(seq, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(pos, hp.data(), hp.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(sel, hsel.data(), hsel.size() * 4, cudaMemcpyHostToDevice));
  auto* q = benchrand::alloc<__nv_bfloat16>(size_t(nq) * H * DK);
  auto* out = benchrand::alloc<__nv_bfloat16>(size_t(nq) * H * R);
  randomize(q, size_t(nq) * H * DK, 7);
  const float scale = 1.f / 24.f;
  const int64_t ns = split_kv ? sparse_mla_scratch_elems(nq, H, R, K) : 0;
  float* scratch = split_kv ? benchrand::alloc<float>(size_t(ns)) : nullptr;
  const double ms = median_ms(
      [&] { sparse_mla(q, sel, K, seq, pos, nq, H, lay.bt, cache, scale, out, nullptr, scratch, ns); }, reps);
  cudaFree(scratch);
  const double flop = 2.0 * double(nq) * H * K * (DK + R);
  std::printf("sparse MLA %s: nq=%lld H=%d K=%d kv=%s: %.3f ms, %.1f TFLOP/s\n", name, (long long)nq, H, K,
              fp8 ? "fp8" : "bf16", ms, flop / ms * 1e-9);
  for (void* p : std::vector<void*>{lat, kpe, cache.codes, cache.scales, cache.rope, cache.bf16, seq, pos, sel, q, out})
    cudaFree(p);
  std::ostringstream os;
  os << "{\"op\": \"sparse_mla_" << name << "\", \"queries\": " << nq << ", \"seqs\": " << nseq
     << ", \"context\": " << ctx << ", \"split_kv\": " << (split_kv ? "true" : "false") << ", \"heads\": " << H << ", \"d_qk\": " << DK << ", \"d_v\": " << R
     << ", \"topk\": " << K << ", \"kv\": \"" << (fp8 ? "fp8" : "bf16") << "\", \"ms\": " << ms
     << ", \"tflops\": " << flop / ms * 1e-9 << ", \"target_tflops\": " << (std::string(name).rfind("prefill", 0) == 0 ? 450 : 300)
     << "}";
  return os.str();
}

// Indexer decode preprocessing at DeepSeek-V3.2 dims (hidden 7168, q_lora 1536, 64 heads x 128,
// rope 64, MXFP8 keys), B tokens one per sequence at position 4095: serial vs three streams, eager
// and replayed from a CUDA graph. The caller's stream is a blocking one so median_ms's events on
// the legacy stream bracket the whole call (side streams join it before they are recorded).
std::string bench_indexer_prep(int B, int reps) {
  const int64_t hidden = 7168, q_lora = 1536;
  const int H = 64, D = 128, rope = 64, ctx = 4096, P = 64;
  Layout lay(B, ctx, P);
  auto* x = benchrand::alloc<__nv_bfloat16>(size_t(B) * hidden);
  auto* qr = benchrand::alloc<__nv_bfloat16>(size_t(B) * q_lora);
  auto* wq_b = benchrand::alloc<__nv_bfloat16>(size_t(H) * D * q_lora);
  auto* wk = benchrand::alloc<__nv_bfloat16>(size_t(D) * hidden);
  auto* wp = benchrand::alloc<__nv_bfloat16>(size_t(H) * hidden);
  randomize(x, size_t(B) * hidden, 11);
  randomize(qr, size_t(B) * q_lora, 12);
  randomize(wq_b, size_t(H) * D * q_lora, 13, 0.025f);
  randomize(wk, size_t(D) * hidden, 14, 0.012f);
  randomize(wp, size_t(H) * hidden, 15, 0.012f);
  auto* lnw = benchrand::alloc<float>(D);
  auto* lnb = benchrand::alloc<float>(D);
  const std::vector<float> ones(D, 1.f), zeros(D, 0.f);
  CUDA_CHECK(cudaMemcpy(lnw, ones.data(), D * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(lnb, zeros.data(), D * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> hs(size_t(B), 0), hp(size_t(B), ctx - 1);
  for (int b = 0; b < B; ++b) hs[size_t(b)] = b;
  auto* seq = benchrand::alloc<int32_t>(size_t(B));
  auto* pos = benchrand::alloc<int32_t>(size_t(B));
  CUDA_CHECK(cudaMemcpy(seq, hs.data(), size_t(B) * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(pos, hp.data(), size_t(B) * 4, cudaMemcpyHostToDevice));
  IndexKeyCache cache{D, true, nullptr, benchrand::alloc<uint8_t>(size_t(lay.rows) * D), benchrand::alloc<uint8_t>(size_t(lay.rows) * D / 32)};
  auto* q = benchrand::alloc<__nv_bfloat16>(size_t(B) * H * D);
  auto* w = benchrand::alloc<float>(size_t(B) * H);
  IndexerPrepDims dims;
  dims.hidden = hidden;
  dims.q_lora = q_lora;
  dims.H = H;
  dims.D = D;
  dims.rope = rope;
  dims.max_tokens = B;
  IndexerPrep* prep = indexer_prep_create(dims);
  const IndexerPrepWeights wt{wq_b, wk, wp, lnw, lnb};
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  CUDA_CHECK(cudaDeviceSynchronize());
  auto call = [&](IndexerPrepMode m) { indexer_prep(prep, wt, x, qr, seq, pos, B, lay.bt, cache, q, w, m, s); };
  double ms[2][2];  // [eager, graph][serial, streams]
  for (int m = 0; m < 2; ++m) {
    const IndexerPrepMode mode = m == 0 ? IndexerPrepMode::Serial : IndexerPrepMode::Streams;
    ms[0][m] = median_ms([&] { call(mode); }, reps, 3);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    call(mode);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    ms[1][m] = median_ms([&] { CUDA_CHECK(cudaGraphLaunch(ge, s)); }, reps, 3);
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
  }
  indexer_prep_destroy(prep);
  CUDA_CHECK(cudaStreamDestroy(s));
  const double wbytes = 2.0 * (double(H) * D * q_lora + double(D) * hidden + double(H) * hidden);
  std::printf("indexer decode prep B=%d: eager serial %.4f / streams %.4f ms (%.2fx), graph serial %.4f / streams %.4f ms "
              "(%.2fx); weights %.1f MB\n",
              B, ms[0][0], ms[0][1], ms[0][0] / ms[0][1], ms[1][0], ms[1][1], ms[1][0] / ms[1][1], wbytes * 1e-6);
  for (void* p : std::vector<void*>{x, qr, wq_b, wk, wp, lnw, lnb, seq, pos, cache.codes, cache.scales, q, w})
    cudaFree(p);
  std::ostringstream os;
  os << "{\"op\": \"indexer_prep_decode\", \"tokens\": " << B << ", \"hidden\": " << hidden << ", \"q_lora\": " << q_lora
     << ", \"heads\": " << H << ", \"head_dim\": " << D << ", \"rope\": " << rope << ", \"keys\": \"mxfp8\""
     << ", \"serial_eager_ms\": " << ms[0][0] << ", \"streams_eager_ms\": " << ms[0][1]
     << ", \"serial_graph_ms\": " << ms[1][0] << ", \"streams_graph_ms\": " << ms[1][1]
     << ", \"ratio_serial_over_streams_eager\": " << ms[0][0] / ms[0][1]
     << ", \"ratio_serial_over_streams_graph\": " << ms[1][0] / ms[1][1]
     << ", \"weight_tb_s_streams_graph\": " << wbytes / ms[1][1] * 1e-9 << "}";
  return os.str();
}

}  // namespace

int bench_sparse_attn(const std::string& json_out) {
  std::vector<std::string> res;
  // DZ_BENCH_ONLY=<substring> runs only the cases whose name contains it (for profilers).
  const char* only = std::getenv("DZ_BENCH_ONLY");
  auto want = [&](const char* name) { return !only || std::string(name).find(only) != std::string::npos; };
  if (want("indexer_bf16")) res.push_back(bench_indexer(false));
  if (want("indexer_mxfp8")) res.push_back(bench_indexer(true));
  if (want("mla_prefill_bf16")) res.push_back(bench_mla("prefill", 1, 4096, 32768, false, 128, 5));
  if (want("mla_prefill_fp8")) res.push_back(bench_mla("prefill_fp8", 1, 4096, 32768, true, 128, 5));
  if (want("mla_decode_fp8")) res.push_back(bench_mla("decode", 128, 1, 16384, true, 128, 10));
  if (want("mla_decode_mtp2_fp8")) res.push_back(bench_mla("decode_mtp2", 128, 2, 16384, true, 128, 10));
  // small decode batches: one block per (query, 64 heads) vs split-KV
  if (want("mla_decode_small")) {
    for (int b : {1, 8, 32}) {
      res.push_back(bench_mla(b == 1 ? "decode_b1" : (b == 8 ? "decode_b8" : "decode_b32"), b, 1, 16384, true, 128, 20));
      res.push_back(bench_mla(b == 1 ? "decode_b1_splitkv" : (b == 8 ? "decode_b8_splitkv" : "decode_b32_splitkv"), b, 1,
                              16384, true, 128, 20, true));
    }
  }
  if (want("indexer_prep"))
    for (int b : {1, 32, 128}) res.push_back(bench_indexer_prep(b, 200));
  return write_bench_report("sparse-attn", res, json_out, true);
}

}  // namespace dz::cuda
