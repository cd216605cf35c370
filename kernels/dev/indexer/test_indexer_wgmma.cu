// Test + bench of the wgmma indexer scores (indexer_wgmma.cu) beside production's kernels/indexer.cu:
//   bash kernels/dev/indexer/run.sh            (on the GPU machine; builds, tests, benches)
// Test: random bf16 q [n, H, D] and keys [S, D] in [-1, 1), fp32 weights in [-1, 1); scores into a
// NaN-filled [n, ld] buffer; reference = fp64 over the same bf16 values. Every score s <= pos0 + i
// is checked against |gpu - ref| <= 2e-5 * sum_h |w_h| sum_x |q_hx k_x| + 1e-30 (bf16 x bf16
// products are exact in fp32; D products summed in fp32 by the tensor cores, then H weighted
// terms in fp32: at most ~ (D + H) 2^-24 = 1.1e-5 of that absolute sum at D = 128, H = 64, and
// typically ~100x less; the sum of |products|, not |q . k|, because the dot products cancel); every entry
// past the causal limit and every padding column must still be NaN (untouched). Then the
// selection: topk_from_scores over the new scores, each selected position's fp64 score >= the
// fp64 K-th best minus the same tolerance (ties and near-ties may swap), ascending, -1 padding.
// Bench (--bench): T = 32768, K = 2048, D = 128, H = 64 (DeepSeek-V3.2) and 32 (GLM-5), one
// sequence (query i at position i): production's indexer_topk (fused, as `dayzero bench
// sparse-attn`), production's split scores alone, the wgmma scores alone, and the wgmma scores +
// topk_from_scores in the backend's query blocks (scratch <= 2^28 floats).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench_util.cuh"
#include "common.cuh"
#include "core/bf16.hpp"
#include "dev/host_util.hpp"
#include "indexer_wgmma.cuh"
#include "indexer.cuh"

using namespace dz::cuda;

namespace {

// bf16 values in [-1, 1) into device memory (xorshift on the host: GBs in seconds)
void randomize(__nv_bfloat16* x, size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
  uint64_t st = 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
  for (auto& v : h) {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    v = dz::f32_to_bf16(float(st >> 40) * (2.f / 16777216.f) - 1.f);
  }
  CUDA_CHECK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
}

struct Case {
  int D, H, n, pos0, extra, K;
};

constexpr double kTol = 2e-5;  // of sum |terms| (the header says why)

int run_case(const Case& c) {
  const int64_t S = int64_t(c.pos0) + c.n + c.extra;
  // padded rows; a multiple of 4 for even n (topk_from_scores_smem's 16-byte loads), odd otherwise
  const int64_t ld = c.n % 2 == 0 ? (int64_t(c.pos0) + c.n + 8) / 4 * 4 : int64_t(c.pos0) + c.n + 5;
  std::mt19937 rng(uint32_t(77 + c.D + 3 * c.H + 7 * c.n + c.pos0));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> q(size_t(c.n) * c.H * c.D), k(size_t(S) * c.D);
  std::vector<float> w(size_t(c.n) * c.H);
  for (auto& x : q) x = dz::f32_to_bf16(u(rng));
  for (auto& x : k) x = dz::f32_to_bf16(u(rng));
  for (auto& x : w) x = u(rng);
  // fp64 reference and the tolerance scale (sum of |terms|)
  std::vector<double> ref(size_t(c.n) * S, 0.0), mag(size_t(c.n) * S, 0.0);
  dz::dev::parallel_each(c.n, [&](int64_t i) {
    for (int64_t s = 0; s <= c.pos0 + i; ++s) {
      double acc = 0, m = 0;
      for (int h = 0; h < c.H; ++h) {
        double d = 0, da = 0;
        const uint16_t* qr = q.data() + (size_t(i) * c.H + h) * c.D;
        const uint16_t* kr = k.data() + size_t(s) * c.D;
        for (int x = 0; x < c.D; ++x) {
          const double pr = double(dz::bf16_to_f32(qr[x])) * double(dz::bf16_to_f32(kr[x]));
          d += pr;
          da += std::fabs(pr);
        }
        const double wv = w[size_t(i) * c.H + h];
        acc += wv * std::max(d, 0.0);
        m += std::fabs(wv) * da;
      }
      ref[size_t(i) * S + s] = acc;
      mag[size_t(i) * S + s] = m;
    }
  });
  auto* dq = benchrand::alloc<__nv_bfloat16>(q.size());
  auto* dk = benchrand::alloc<__nv_bfloat16>(k.size());
  auto* dw = benchrand::alloc<float>(w.size());
  auto* dsc = benchrand::alloc<float>(size_t(c.n) * ld);
  auto* dpos = benchrand::alloc<int32_t>(size_t(c.n));
  auto* dsel = benchrand::alloc<int32_t>(size_t(c.n) * c.K);
  CUDA_CHECK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> pos(size_t(c.n));
  for (int i = 0; i < c.n; ++i) pos[size_t(i)] = c.pos0 + i;
  CUDA_CHECK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  std::vector<float> nanfill(size_t(c.n) * ld, std::nanf(""));
  CUDA_CHECK(cudaMemcpy(dsc, nanfill.data(), nanfill.size() * 4, cudaMemcpyHostToDevice));
  indexer_scores_wgmma(dq, dw, dk, c.n, c.pos0, c.H, c.D, S, dsc, ld, nullptr);
  topk_from_scores(dsc, ld, dpos, c.n, c.K, dsel, nullptr);
  auto* dsel2 = benchrand::alloc<int32_t>(size_t(c.n) * c.K);
  topk_from_scores_smem(dsc, ld, dpos, c.n, c.K, dsel2, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> sel2(size_t(c.n) * c.K), sel3;
  CUDA_CHECK(cudaMemcpy(sel2.data(), dsel2, sel2.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<float> got(size_t(c.n) * ld);
  std::vector<int32_t> sel(size_t(c.n) * c.K);
  CUDA_CHECK(cudaMemcpy(got.data(), dsc, got.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(sel.data(), dsel, sel.size() * 4, cudaMemcpyDeviceToHost));
  // the scores again with their histograms (H 32 / 64), then topk_from_hist: the same scores
  // (bitwise) and the same selections
  int64_t bad_hist = 0;
  if (indexer_hist_takes(c.H, ld)) {
    auto* dsc2 = benchrand::alloc<float>(size_t(c.n) * ld);
    auto* dh = benchrand::alloc<uint32_t>(size_t(c.n) * 512);
    CUDA_CHECK(cudaMemcpy(dsc2, nanfill.data(), nanfill.size() * 4, cudaMemcpyHostToDevice));
    indexer_scores_wgmma(dq, dw, dk, c.n, c.pos0, c.H, c.D, S, dsc2, ld, nullptr, dh);
    topk_from_hist(dsc2, ld, dh, dpos, c.n, c.K, dsel2, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got2(size_t(c.n) * ld);
    std::vector<uint32_t> hh(size_t(c.n) * 512);
    sel3.resize(size_t(c.n) * c.K);
    CUDA_CHECK(cudaMemcpy(got2.data(), dsc2, got2.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hh.data(), dh, hh.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(sel3.data(), dsel2, sel3.size() * 4, cudaMemcpyDeviceToHost));
    // histograms = the counts of the written scores' bins; scores bitwise (NaN padding included)
    for (int64_t i = 0; i < c.n && !bad_hist; ++i) {
      std::vector<uint32_t> cnt(1024, 0);
      for (int64_t s = 0; s <= c.pos0 + i; ++s) {
        const float v = got2[size_t(i) * ld + s];
        uint32_t u;
        std::memcpy(&u, &v, 4);
        const uint32_t key = std::isnan(v) ? 0u : (v == 0.f ? 0x80000000u : ((u & 0x80000000u) ? ~u : (u | 0x80000000u)));
        ++cnt[key >> 22];
      }
      for (int b = 0; b < 1024; ++b)
        if (((hh[size_t(i) * 512 + b / 2] >> (16 * (b & 1))) & 0xFFFFu) != cnt[size_t(b)]) {
          std::printf("  FAIL histogram i=%lld bin %d\n", (long long)i, b);
          ++bad_hist;
          break;
        }
    }
    if (std::memcmp(got2.data(), got.data(), got.size() * 4) != 0) {
      std::printf("  FAIL scores with histograms differ from the scores without\n");
      ++bad_hist;
    }
    if (sel3 != sel) {
      std::printf("  FAIL topk_from_hist differs from topk_from_scores\n");
      ++bad_hist;
    }
    cudaFree(dsc2);
    cudaFree(dh);
  }
  cudaFree(dsel2);
  int64_t bad = 0, bad_untouched = 0, bad_sel = 0;
  double worst = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t s = 0; s < ld; ++s) {
      const float g = got[size_t(i) * ld + s];
      if (s > c.pos0 + i) {
        bad_untouched += std::isnan(g) ? 0 : 1;
        continue;
      }
      const double r = ref[size_t(i) * S + s], tol = kTol * mag[size_t(i) * S + s] + 1e-30;
      const double e = std::fabs(double(g) - r);
      worst = std::max(worst, e / (tol / kTol));
      if (!(e <= tol)) {
        if (bad < 5)
          std::printf("  FAIL score i=%lld s=%lld: gpu %.9g ref %.9g (tol %.3g)\n", (long long)i, (long long)s, g, r,
                      tol);
        ++bad;
      }
    }
    // selection: valid and as good as the reference up to the tolerance
    const int64_t m = std::min<int64_t>(c.K, c.pos0 + i + 1);
    std::vector<double> row(ref.begin() + i * S, ref.begin() + i * S + c.pos0 + i + 1);
    std::vector<double> srt = row;
    std::nth_element(srt.begin(), srt.begin() + (m - 1), srt.end(), std::greater<double>());
    const double kth = srt[size_t(m - 1)];
    for (int64_t j = 0; j < c.K; ++j) {
      const int32_t p = sel[size_t(i) * c.K + j];
      bool ok = (j < m) == (p >= 0) && p <= c.pos0 + i && (j == 0 || j >= m || p > sel[size_t(i) * c.K + j - 1]);
      if (ok && p >= 0) ok = row[size_t(p)] >= kth - kTol * mag[size_t(i) * S + p] - 1e-30;
      if (!ok && bad_sel++ < 5)
        std::printf("  FAIL selection i=%lld j=%lld: position %d\n", (long long)i, (long long)j, p);
    }
  }
  // the same block_topk over the same scores: identical selections
  const int64_t bad_smem = std::equal(sel.begin(), sel.end(), sel2.begin()) ? 0 : 1;
  bad_sel += bad_smem + bad_hist;
  if (bad_smem) std::printf("  FAIL topk_from_scores_smem differs from topk_from_scores\n");
  std::printf("%s D=%d H=%d n=%d pos0=%d extra=%d K=%d: worst |err| / sum|terms| %.3g (tol %.0e); %lld bad scores, %lld "
              "entries past the limit written, %lld bad selections\n",
              bad || bad_untouched || bad_sel ? "FAIL" : "ok  ", c.D, c.H, c.n, c.pos0, c.extra, c.K, worst, kTol,
              (long long)bad, (long long)bad_untouched, (long long)bad_sel);
  for (void* p : std::vector<void*>{dq, dk, dw, dsc, dpos, dsel}) cudaFree(p);
  return bad || bad_untouched || bad_sel ? 1 : 0;
}

void bench(int H, int D, int T, int K) {
  auto* q = benchrand::alloc<__nv_bfloat16>(size_t(T) * H * D);
  auto* k = benchrand::alloc<__nv_bfloat16>(size_t(T) * D);
  auto* w = benchrand::alloc<float>(size_t(T) * H);
  randomize(q, size_t(T) * H * D, 1);
  randomize(k, size_t(T) * D, 2);
  std::vector<float> hw(size_t(T) * H);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f / 90.5f);
  for (float& v : hw) v = nd(rng);
  CUDA_CHECK(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
  // production's paged view of the same rows: pages of 64, identity table, one sequence
  const int P = 64, pages = (T + P - 1) / P;
  std::vector<int32_t> table(static_cast<size_t>(pages)), hs(static_cast<size_t>(T), 0), hp(static_cast<size_t>(T));
  for (int i = 0; i < pages; ++i) table[size_t(i)] = i;
  for (int i = 0; i < T; ++i) hp[size_t(i)] = i;
  auto* dt = benchrand::alloc<int32_t>(size_t(pages));
  auto* seq = benchrand::alloc<int32_t>(size_t(T));
  auto* pos = benchrand::alloc<int32_t>(size_t(T));
  CUDA_CHECK(cudaMemcpy(dt, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(seq, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(pos, hp.data(), hp.size() * 4, cudaMemcpyHostToDevice));
  BlockTable bt;
  bt.table = dt;
  bt.max_pages = pages;
  bt.page_size = P;
  IndexKeyCache kc{};
  kc.D = D;
  kc.bf16 = k;
  auto* sel = benchrand::alloc<int32_t>(size_t(T) * K);
  auto* sc = benchrand::alloc<float>(size_t(T) * T);
  const double flop = 2.0 * H * D * (double(T) * (T + 1) / 2);
  const double prod = median_ms([&] { indexer_topk(q, w, seq, pos, T, H, T, bt, kc, K, sel, nullptr, nullptr); }, 3);
  const double prod_sc = median_ms([&] { indexer_scores(q, w, seq, pos, T, H, T, bt, kc, sc, nullptr); }, 3);
  const double new_sc = median_ms([&] { indexer_scores_wgmma(q, w, k, T, 0, H, D, T, sc, T, nullptr); }, 5);
  const double tk = median_ms([&] { topk_from_scores(sc, T, pos, T, K, sel, nullptr); }, 3);
  const double tk_smem = median_ms([&] { topk_from_scores_smem(sc, T, pos, T, K, sel, nullptr); }, 3);
  // the backend's blocks: scratch [block, S] with block * S <= 2^28
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(1) << 28) / T));
  // hist null: topk_from_scores after each block's scores; else the scores' histograms and topk_from_hist
  auto in_blocks = [&](uint32_t* hist) {
    for (int64_t t0 = 0; t0 < T; t0 += block) {
      const int64_t n = std::min<int64_t>(block, T - t0);
      indexer_scores_wgmma(q + t0 * H * D, w + t0 * H, k, n, t0, H, D, T, sc, T, nullptr, hist);
      if (hist) topk_from_hist(sc, T, hist, pos + t0, n, K, sel + t0 * K, nullptr);
      else topk_from_scores(sc, T, pos + t0, n, K, sel + t0 * K, nullptr);
    }
  };
  const double both = median_ms([&] { in_blocks(nullptr); }, 3);
  // with the histograms (H 32 / 64): scores + histograms, then topk_from_hist, in the same blocks
  double both_hist = 0, tk_hist = 0, both_ovl = 0;
  const char* ovl_same = "-";
  if (indexer_hist_takes(H, T)) {
    auto* hist = benchrand::alloc<uint32_t>(size_t(T) * 512);
    indexer_scores_wgmma(q, w, k, T, 0, H, D, T, sc, T, nullptr, hist);
    tk_hist = median_ms([&] { topk_from_hist(sc, T, hist, pos, T, K, sel, nullptr); }, 3);
    both_hist = median_ms([&] { in_blocks(hist); }, 3);
    // The same blocks with each block's Top-K on a second stream beside the next block's scores
    // (two scratch blocks and histogram sets, events between them): does the memory-bound Top-K
    // hide under the tensor-core-bound scores? Blocking streams: median_ms's events on the legacy
    // stream then bracket both. The selections must be the serial loop's, bit for bit.
    if (2 * block <= T) {
      std::vector<int32_t> ref(size_t(T) * K), got(size_t(T) * K);
      CUDA_CHECK(cudaMemcpy(ref.data(), sel, ref.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemset(sel, 0xff, ref.size() * 4));
      cudaStream_t st[2];
      cudaEvent_t scored[2], freed[2];
      for (int i = 0; i < 2; ++i) {
        CUDA_CHECK(cudaStreamCreate(&st[i]));
        CUDA_CHECK(cudaEventCreateWithFlags(&scored[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&freed[i], cudaEventDisableTiming));
      }
      both_ovl = median_ms(
          [&] {
            int64_t i = 0;
            for (int64_t t0 = 0; t0 < T; t0 += block, ++i) {
              const int64_t n = std::min<int64_t>(block, T - t0), b = i & 1;
              float* scb = sc + b * block * T;  // [block, T] scratch b
              uint32_t* hb = hist + b * block * 512;
              if (i >= 2) CUDA_CHECK(cudaStreamWaitEvent(st[0], freed[b], 0));  // block i - 2's Top-K read it
              indexer_scores_wgmma(q + t0 * H * D, w + t0 * H, k, n, t0, H, D, T, scb, T, st[0], hb);
              CUDA_CHECK(cudaEventRecord(scored[b], st[0]));
              CUDA_CHECK(cudaStreamWaitEvent(st[1], scored[b], 0));
              topk_from_hist(scb, T, hb, pos + t0, n, K, sel + t0 * K, st[1]);
              CUDA_CHECK(cudaEventRecord(freed[b], st[1]));
            }
          },
          3);
      CUDA_CHECK(cudaMemcpy(got.data(), sel, got.size() * 4, cudaMemcpyDeviceToHost));
      ovl_same = ref == got ? "yes" : "NO";
      for (int i = 0; i < 2; ++i) {
        cudaStreamDestroy(st[i]);
        cudaEventDestroy(scored[i]);
        cudaEventDestroy(freed[i]);
      }
    }
    cudaFree(hist);
  }
  std::printf("  with histograms: Top-K from them %.3f ms; scores + histograms + Top-K in blocks %.3f ms (%.2fx "
              "production); the Top-K on a second stream beside the next block's scores %.3f ms (%.2fx production; "
              "selections equal to the serial loop's: %s)\n",
              tk_hist, both_hist, prod / both_hist, both_ovl, both_ovl > 0 ? prod / both_ovl : 0.0, ovl_same);
  std::printf("bench H=%d D=%d T=%d K=%d: production fused %.3f ms; production split scores %.3f ms (%.0f TFLOP/s); "
              "wgmma scores %.3f ms (%.0f TFLOP/s); Top-K from memory %.3f ms (row copied to shared memory first: %.3f "
              "ms); wgmma scores + Top-K in %lld-query blocks %.3f ms (%.2fx production)\n",
              H, D, T, K, prod, prod_sc, flop / prod_sc * 1e-9, new_sc, flop / new_sc * 1e-9, tk, tk_smem,
              (long long)block, both, prod / both);
  for (void* p : std::vector<void*>{q, k, w, dt, seq, pos, sel, sc}) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
    int dev = 0;
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("%s\n", prop.name);
    bench(64, 128, 32768, 2048);
    bench(32, 128, 32768, 2048);
    bench(64, 128, 8192, 2048);
    return 0;
  }
  const Case cases[] = {{128, 64, 1, 0, 0, 4},     {128, 64, 5, 3, 7, 4},      {128, 64, 300, 0, 0, 64},
                        {128, 64, 517, 1000, 13, 256}, {128, 32, 333, 64, 0, 32}, {128, 16, 129, 5, 0, 16},
                        {64, 64, 200, 17, 0, 32},  {64, 32, 1000, 0, 0, 128},  {64, 16, 77, 300, 1, 64},
                        {128, 64, 9, 0, 0, 2048}};
  int fails = 0;
  for (const Case& c : cases) fails += run_case(c);
  std::printf("%d of %zu cases failed\n", fails, sizeof(cases) / sizeof(cases[0]));
  return fails ? 1 : 0;
}
