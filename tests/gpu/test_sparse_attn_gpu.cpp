// GPU sparse-attention path vs the CPU reference (run on the GPU machine: ctest -L gpu):
// FP8 quantization (bit-identical), paged fused stores, the fused indexer + Top-K, sparse MLA.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common.cuh"
#include "gpu_fixtures.hpp"
#include "core/bf16.hpp"
#include "core/fp8.hpp"
#include "indexer.cuh"
#include "indexer_wgmma.cuh"
#include "ops/attention.hpp"
#include "ops/indexer.hpp"
#include "paged_cache.cuh"
#include "quant.cuh"
#include "sparse_mla.cuh"

namespace {

using namespace dz::gputest;

std::vector<float> round_bf16(std::vector<float> x) {
  for (float& v : x) v = dz::round_bf16(v);
  return x;
}

// Nasty test data: wide exponents, exact zeros and zero groups, huge values, subnormals,
// E4M3 rounding boundaries, and (when allowed) NaN / Inf.
std::vector<float> nasty(size_t n, std::mt19937& rng, bool nonfinite) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> kind(0, 19), ex(-30, 30);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const int k = kind(rng);
    if (k < 10) x[i] = nd(rng) * std::ldexp(1.f, ex(rng));
    else if (k < 12) x[i] = 0.f;
    else if (k == 12) x[i] = -0.f;
    else if (k == 13) x[i] = nd(rng) * 1e38f;
    else if (k == 14) x[i] = std::numeric_limits<float>::max() * (nd(rng) > 0 ? 1.f : -1.f);
    else if (k == 15) x[i] = nd(rng) * 1e-40f;  // subnormal
    else if (k == 16) x[i] = 448.f * std::ldexp(1.f, ex(rng)) * (1.f + 1.f / 16.f);  // a tie in E4M3
    else if (k == 17) x[i] = nonfinite ? std::numeric_limits<float>::infinity() : 1.f;
    else if (k == 18) x[i] = nonfinite ? std::numeric_limits<float>::quiet_NaN() : -2.f;
    else x[i] = nd(rng);
  }
  // a few all-zero 32-groups
  for (size_t g = 0; g + 32 <= n; g += 96) std::fill(x.begin() + g, x.begin() + g + 32, 0.f);
  return x;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("gpu sparse-attn: MXFP8 and per-tile FP8 quantization are bit-identical to the CPU emulation", "[gpu]") {
  std::mt19937 rng(11);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {3, 31}, {7, 33}, {19, 128}, {5, 129},
                                                           {2, 1000}, {65, 576}, {1, 4096}};
  int64_t n_checked = 0;
  for (auto [rows, n] : shapes) {
    for (int variant = 0; variant < 3; ++variant) {  // 0: fp32 finite, 1: fp32 with NaN/Inf, 2: bf16 input
      std::vector<float> x = nasty(size_t(rows * n), rng, variant == 1);
      if (variant == 2) x = round_bf16(x);
      const int64_t Gm = (n + 31) / 32, Gt = (n + 127) / 128;
      std::vector<uint8_t> c_mx(x.size()), s_mx(size_t(rows * Gm)), c_kv(x.size());
      std::vector<float> s_kv(size_t(rows * Gt));
      dz::mxfp8_quantize(x.data(), rows, n, c_mx.data(), s_mx.data());
      dz::kv_fp8_quantize(x.data(), rows, n, c_kv.data(), s_kv.data());
      Dev<uint8_t> dc(x.size()), ds(s_mx.size()), dck(x.size());
      Dev<float> dsk(s_kv.size());
      if (variant < 2) {
        Dev<float> dx(x);
        dz::cuda::mxfp8_quantize(dx.p, rows, n, dc.p, ds.p, nullptr);
        dz::cuda::kv_fp8_quantize(dx.p, rows, n, dck.p, dsk.p, nullptr);
      } else {
        Dev<__nv_bfloat16> dx(to_bf16(x));
        dz::cuda::mxfp8_quantize(dx.p, rows, n, dc.p, ds.p, nullptr);
        dz::cuda::kv_fp8_quantize(dx.p, rows, n, dck.p, dsk.p, nullptr);
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto g_c = dc.down(), g_s = ds.down(), g_ck = dck.down();
      const auto g_sk = dsk.down();
      int64_t bad = 0;
      for (size_t i = 0; i < x.size(); ++i) bad += g_c[i] != c_mx[i];
      for (size_t i = 0; i < s_mx.size(); ++i) bad += g_s[i] != s_mx[i];
      for (size_t i = 0; i < x.size(); ++i) bad += g_ck[i] != c_kv[i];
      for (size_t i = 0; i < s_kv.size(); ++i) bad += bits(g_sk[i]) != bits(s_kv[i]);
      INFO("rows " << rows << " n " << n << " variant " << variant);
      CHECK(bad == 0);
      n_checked += int64_t(x.size());
      // dequantization to bf16 is exact (compare with the CPU dequantization, bf16-rounded)
      if (variant == 0) {
        std::vector<float> y(x.size());
        dz::mxfp8_dequantize(c_mx.data(), s_mx.data(), rows, n, y.data());
        Dev<__nv_bfloat16> dy(x.size());
        dz::cuda::mxfp8_dequantize_bf16(dc.p, ds.p, rows, n, dy.p, nullptr);
        const auto gy = dy.down();
        int64_t bad_y = 0;
        for (size_t i = 0; i < y.size(); ++i)
          if (std::isfinite(y[i]) && std::fabs(y[i]) >= 1e-38f) bad_y += bf(gy[i]) != y[i];
        CHECK(bad_y == 0);
      }
    }
  }
  std::printf("quant: %lld elements bit-identical (MXFP8 codes+E8M0, per-tile FP8 codes+fp32 scales)\n",
              (long long)n_checked);
}

namespace {

// A paged layout for several sequences: pages handed out in a shuffled order.
struct Pages {
  int P = 16, max_pages = 0, num_pages = 0;
  std::vector<int32_t> table;  // [nseq, max_pages]
  Pages(const std::vector<int>& lens, int page, std::mt19937& rng) : P(page) {
    for (int L : lens) max_pages = std::max(max_pages, (L + P - 1) / P);
    for (int L : lens) num_pages += (L + P - 1) / P;
    std::vector<int32_t> ids(size_t(num_pages) + 3);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(lens.size() * size_t(max_pages), -1);
    size_t next = 0;
    for (size_t b = 0; b < lens.size(); ++b)
      for (int j = 0; j < (lens[b] + P - 1) / P; ++j) table[b * size_t(max_pages) + size_t(j)] = ids[next++];
    num_pages += 3;  // unused pages too
  }
  int64_t slot(int b, int s) const { return int64_t(table[size_t(b) * max_pages + size_t(s / P)]) * P + s % P; }
};

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

}  // namespace

TEST_CASE("gpu sparse-attn: fused paged stores quantize and place every token", "[gpu]") {
  std::mt19937 rng(5);
  const std::vector<int> lens = {1, 37, 300};
  Pages pg(lens, 16, rng);
  Dev<int32_t> dtab(pg.table);
  const dz::cuda::BlockTable bt{dtab.p, pg.max_pages, pg.P};
  for (int R : {512, 128}) {
    const int DR = 64, D = 128;
    int N = 0;
    std::vector<int32_t> seq, pos;
    for (size_t b = 0; b < lens.size(); ++b)
      for (int s = 0; s < lens[b]; ++s) {
        seq.push_back(int32_t(b));
        pos.push_back(s);
        ++N;
      }
    const auto kv = round_bf16(randn(size_t(N) * R, rng, 3.f)), kpe = round_bf16(randn(size_t(N) * DR, rng));
    const auto ik = round_bf16(randn(size_t(N) * D, rng));
    Dev<__nv_bfloat16> dkv(to_bf16(kv)), dkpe(to_bf16(kpe)), dik(to_bf16(ik));
    Dev<int32_t> dseq(seq), dpos(pos);
    const size_t rows = size_t(pg.num_pages) * pg.P;
    Dev<uint8_t> codes(rows * R), icodes(rows * D), iscales(rows * D / 32);
    Dev<float> scales(rows * R / 128);
    Dev<__nv_bfloat16> rope(rows * DR), lbf(rows * (R + DR)), ibf(rows * D);
    dz::cuda::LatentCache l8{R, DR, true, nullptr, codes.p, scales.p, rope.p}, l16{R, DR, false, lbf.p};
    dz::cuda::IndexKeyCache i8{D, true, nullptr, icodes.p, iscales.p}, i16{D, false, ibf.p};
    // decode-style: the last token of each sequence is stored in a second call
    dz::cuda::store_latent_kv(dkv.p, dkpe.p, dseq.p, dpos.p, N, bt, l8, nullptr);
    dz::cuda::store_latent_kv(dkv.p, dkpe.p, dseq.p, dpos.p, N, bt, l16, nullptr);
    dz::cuda::store_index_k(dik.p, dseq.p, dpos.p, N, bt, i8, nullptr);
    dz::cuda::store_index_k(dik.p, dseq.p, dpos.p, N, bt, i16, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto g_codes = codes.down(), g_ic = icodes.down(), g_is = iscales.down();
    const auto g_scales = scales.down();
    const auto g_rope = rope.down(), g_lbf = lbf.down(), g_ibf = ibf.down();
    int64_t bad = 0;
    std::vector<uint8_t> c(R), ic(D), is(D / 32);
    std::vector<float> s(R / 128);
    for (int i = 0; i < N; ++i) {
      const int64_t sl = pg.slot(seq[size_t(i)], pos[size_t(i)]);
      dz::kv_fp8_quantize(kv.data() + size_t(i) * R, 1, R, c.data(), s.data());
      dz::mxfp8_quantize(ik.data() + size_t(i) * D, 1, D, ic.data(), is.data());
      for (int j = 0; j < R; ++j) bad += g_codes[size_t(sl * R + j)] != c[size_t(j)];
      for (int j = 0; j < R / 128; ++j) bad += bits(g_scales[size_t(sl * (R / 128) + j)]) != bits(s[size_t(j)]);
      for (int j = 0; j < DR; ++j) bad += bf(g_rope[size_t(sl * DR + j)]) != kpe[size_t(i) * DR + j];
      for (int j = 0; j < R; ++j) bad += bf(g_lbf[size_t(sl * (R + DR) + j)]) != kv[size_t(i) * R + j];
      for (int j = 0; j < DR; ++j) bad += bf(g_lbf[size_t(sl * (R + DR) + R + j)]) != kpe[size_t(i) * DR + j];
      for (int j = 0; j < D; ++j) bad += g_ic[size_t(sl * D + j)] != ic[size_t(j)];
      for (int j = 0; j < D / 32; ++j) bad += g_is[size_t(sl * (D / 32) + j)] != is[size_t(j)];
      for (int j = 0; j < D; ++j) bad += bf(g_ibf[size_t(sl * D + j)]) != ik[size_t(i) * D + j];
    }
    INFO("R " << R);
    CHECK(bad == 0);
  }
}

namespace {

struct IndexerCase {
  int D, H, K, P;
  std::vector<int> lens;     // context length per sequence
  std::vector<int> n_query;  // queries per sequence (the last n_query positions)
  bool mx, split;
};

// Returns the fraction of rows whose Top-K set equals the reference's, after allowing swaps of
// near-ties; sets `unexplained` to the number of differing entries that are not near-ties.
void run_indexer_case(const IndexerCase& tc, std::mt19937& rng, double* overlap_unquant,
                      dz::cuda::IndexerVariant variant) {
  const int D = tc.D, H = tc.H, K = tc.K;
  const size_t nseq = tc.lens.size();
  Pages pg(tc.lens, tc.P, rng);
  // keys per sequence (bf16 values) and their cache form
  std::vector<std::vector<float>> keys(nseq), keys_used(nseq);
  std::vector<int32_t> kseq, kpos;
  std::vector<float> kall;
  for (size_t b = 0; b < nseq; ++b) {
    keys[b] = round_bf16(randn(size_t(tc.lens[b]) * D, rng));
    keys_used[b] = keys[b];
    if (tc.mx) dz::mxfp8_round(keys[b].data(), tc.lens[b], D, keys_used[b].data());
    for (int s = 0; s < tc.lens[b]; ++s) {
      kseq.push_back(int32_t(b));
      kpos.push_back(s);
    }
    kall.insert(kall.end(), keys[b].begin(), keys[b].end());
  }
  Dev<int32_t> dtab(pg.table), dkseq(kseq), dkpos(kpos);
  const dz::cuda::BlockTable bt{dtab.p, pg.max_pages, pg.P};
  const size_t rows = size_t(pg.num_pages) * pg.P;
  Dev<__nv_bfloat16> kbf(rows * D), dk(to_bf16(kall));
  Dev<uint8_t> kc(rows * D), ks(rows * D / 32);
  dz::cuda::IndexKeyCache cache{D, tc.mx, kbf.p, kc.p, ks.p};
  dz::cuda::store_index_k(dk.p, dkseq.p, dkpos.p, int64_t(kseq.size()), bt, cache, nullptr);
  // queries
  std::vector<int32_t> qseq, qpos;
  for (size_t b = 0; b < nseq; ++b)
    for (int j = 0; j < tc.n_query[b]; ++j) {
      qseq.push_back(int32_t(b));
      qpos.push_back(tc.lens[b] - tc.n_query[b] + j);
    }
  const int64_t nq = int64_t(qseq.size());
  const auto q = round_bf16(randn(size_t(nq) * H * D, rng));
  auto w = randn(size_t(nq) * H, rng);
  for (float& v : w) v *= float(1.0 / std::sqrt(double(H) * D));
  int64_t max_keys = 0;
  for (int L : tc.lens) max_keys = std::max<int64_t>(max_keys, L);
  Dev<__nv_bfloat16> dq(to_bf16(q));
  Dev<float> dw(w), scratch(size_t(nq * max_keys));
  Dev<int32_t> dqs(qseq), dqp(qpos), dsel(size_t(nq) * K);
  dz::cuda::indexer_topk(dq.p, dw.p, dqs.p, dqp.p, nq, H, max_keys, bt, cache, K, dsel.p,
                         tc.split ? scratch.p : nullptr, nullptr, tc.split, variant);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto sel = dsel.down();
  int64_t unexplained = 0, differing = 0, same_rows = 0;
  double overlap = 0;
  for (int64_t i = 0; i < nq; ++i) {
    const size_t b = size_t(qseq[size_t(i)]);
    const int p = qpos[size_t(i)], S = tc.lens[b];
    std::vector<float> sc(static_cast<size_t>(S));
    dz::indexer_scores(q.data() + i * H * D, w.data() + i * H, keys_used[b].data(), sc.data(), 1, p, S, H, D);
    std::vector<int32_t> ref(static_cast<size_t>(K));
    dz::topk_positions(sc.data(), ref.data(), 1, p, S, K);
    const int32_t* g = sel.data() + i * K;
    // ascending, -1 padded, in range
    bool well_formed = true;
    int nvalid = 0;
    for (int j = 0; j < K; ++j) {
      if (g[j] >= 0) {
        ++nvalid;
        well_formed &= g[j] <= p && (j == 0 || g[j] > g[j - 1]);
      } else {
        well_formed &= j >= std::min(K, p + 1);
      }
    }
    CHECK(well_formed);
    CHECK(nvalid == std::min(K, p + 1));
    std::set<int32_t> gs(g, g + K), rs(ref.begin(), ref.end());
    if (gs == rs) {
      ++same_rows;
      continue;
    }
    // K-th best reference score; a differing entry must be within the fp32 summation noise of it
    std::vector<float> vis(sc.begin(), sc.begin() + p + 1);
    std::nth_element(vis.begin(), vis.begin() + (K - 1), vis.end(), std::greater<float>());
    const float thr = vis[size_t(K - 1)];
    float amax = 0;
    for (float v : vis) amax = std::max(amax, std::fabs(v));
    const float tol = 1e-4f * amax + 1e-6f;  // tensor-core fp32 sums of exact products, other order
    for (int32_t x : gs)
      if (!rs.count(x)) {
        ++differing;
        unexplained += std::fabs(sc[size_t(x)] - thr) > tol;
      }
  }
  (void)overlap;
  std::printf("indexer D=%d H=%d K=%d P=%d mx=%d split=%d nq=%lld: identical rows %lld, near-tie swaps %lld, "
              "unexplained %lld\n",
              D, H, K, tc.P, int(tc.mx), int(tc.split), (long long)nq, (long long)same_rows,
              (long long)(differing - unexplained), (long long)unexplained);
  CHECK(unexplained == 0);
  // MXFP8: overlap of the GPU Top-K with the Top-K of unquantized scores
  if (tc.mx && overlap_unquant) {
    int64_t hit = 0, tot = 0;
    for (int64_t i = 0; i < nq; ++i) {
      const size_t b = size_t(qseq[size_t(i)]);
      const int p = qpos[size_t(i)], S = tc.lens[b];
      std::vector<float> sc(static_cast<size_t>(S));
      dz::indexer_scores(q.data() + i * H * D, w.data() + i * H, keys[b].data(), sc.data(), 1, p, S, H, D);
      std::vector<int32_t> ref(static_cast<size_t>(K));
      dz::topk_positions(sc.data(), ref.data(), 1, p, S, K);
      std::set<int32_t> rs(ref.begin(), ref.end());
      for (int j = 0; j < K; ++j)
        if (sel[size_t(i * K + j)] >= 0) {
          ++tot;
          hit += rs.count(sel[size_t(i * K + j)]);
        }
    }
    *overlap_unquant = tot ? double(hit) / double(tot) : 1.0;
  }
}

}  // namespace

TEST_CASE("gpu sparse-attn: fused indexer Top-K equals the CPU reference (ties aside)", "[gpu]") {
  std::mt19937 rng(7);
  std::vector<IndexerCase> cases = {
      // prefill (fused), contexts shorter than K, ragged pages
      {128, 64, 64, 16, {1, 50, 200}, {1, 50, 200}, false, false},
      {128, 64, 64, 16, {1, 50, 200}, {1, 50, 200}, true, false},
      {64, 16, 32, 64, {130, 7}, {130, 7}, false, false},
      {128, 5, 16, 16, {77}, {77}, true, false},
      // decode: one query per sequence and 2-4 per sequence (split mode)
      {128, 64, 256, 64, {3000, 100, 700}, {1, 1, 1}, false, true},
      {128, 64, 256, 64, {3000, 100, 700}, {4, 2, 3}, true, true},
      {64, 32, 128, 16, {1500, 9}, {2, 1}, true, true},
      // DeepSeek width on a longer context, both modes
      {128, 64, 2048, 64, {4500}, {40}, false, false},
      {128, 64, 2048, 64, {4500}, {3}, true, true},
  };
  // both kernel variants (query in shared memory / in registers)
  for (auto v : {dz::cuda::IndexerVariant::QInSmem, dz::cuda::IndexerVariant::QInRegisters}) {
    std::printf("indexer variant: Q in %s\n", v == dz::cuda::IndexerVariant::QInSmem ? "shared memory" : "registers");
    for (const auto& tc : cases) {
      double ov = -1;
      run_indexer_case(tc, rng, &ov, v);
      if (ov >= 0) std::printf("  MXFP8 Top-K overlap with unquantized scores: %.4f\n", ov);
    }
  }
}

namespace {

// dense: no selection, the entries are positions 0 .. K-1 (K >= every context: dense causal).
void run_mla_case(int R, int H, int K, bool fp8, const std::vector<int>& lens, const std::vector<int>& n_query,
                  std::mt19937& rng, bool split_kv = false, bool dense = false) {
  const int DR = 64, DK = R + DR;
  const size_t nseq = lens.size();
  Pages pg(lens, 64, rng);
  std::vector<std::vector<float>> lat(nseq), kpe(nseq);
  std::vector<float> lat_all, kpe_all;
  std::vector<int32_t> kseq, kpos;
  for (size_t b = 0; b < nseq; ++b) {
    lat[b] = round_bf16(randn(size_t(lens[b]) * R, rng));
    kpe[b] = round_bf16(randn(size_t(lens[b]) * DR, rng));
    lat_all.insert(lat_all.end(), lat[b].begin(), lat[b].end());
    kpe_all.insert(kpe_all.end(), kpe[b].begin(), kpe[b].end());
    for (int s = 0; s < lens[b]; ++s) {
      kseq.push_back(int32_t(b));
      kpos.push_back(s);
    }
  }
  Dev<int32_t> dtab(pg.table), dkseq(kseq), dkpos(kpos);
  const dz::cuda::BlockTable bt{dtab.p, pg.max_pages, pg.P};
  const size_t rows = size_t(pg.num_pages) * pg.P;
  Dev<__nv_bfloat16> dlat(to_bf16(lat_all)), dkpe(to_bf16(kpe_all)), lbf(rows * DK), rope(rows * DR);
  Dev<uint8_t> codes(rows * R);
  Dev<float> scales(rows * R / 128);
  dz::cuda::LatentCache cache{R, DR, fp8, lbf.p, codes.p, scales.p, rope.p};
  dz::cuda::store_latent_kv(dlat.p, dkpe.p, dkseq.p, dkpos.p, int64_t(kseq.size()), bt, cache, nullptr);
  // queries and their selections: distinct visible positions in random order, some -1 and some
  // positions past the query (both must be masked)
  std::vector<int32_t> qseq, qpos, sel;
  for (size_t b = 0; b < nseq; ++b)
    for (int j = 0; j < n_query[b]; ++j) {
      const int p = lens[b] - n_query[b] + j;
      qseq.push_back(int32_t(b));
      qpos.push_back(p);
      std::vector<int32_t> cand(size_t(lens[b]));
      std::iota(cand.begin(), cand.end(), 0);
      std::shuffle(cand.begin(), cand.end(), rng);
      for (int k = 0; k < K; ++k) {
        int32_t v = k < int(cand.size()) ? cand[size_t(k)] : -1;
        if (k % 13 == 5) v = -1;
        sel.push_back(v);
      }
    }
  const int64_t nq = int64_t(qseq.size());
  const auto q = round_bf16(randn(size_t(nq) * H * DK, rng));
  const float scale = 1.f / std::sqrt(float(DK));
  Dev<__nv_bfloat16> dq(to_bf16(q)), dout(size_t(nq) * H * R);
  Dev<int32_t> dqs(qseq), dqp(qpos), dsel(sel);
  const int64_t ns = split_kv ? dz::cuda::sparse_mla_scratch_elems(nq, H, R, K) : 0;
  Dev<float> scratch(size_t(std::max<int64_t>(ns, 1)));
  dz::cuda::sparse_mla(dq.p, dense ? nullptr : dsel.p, K, dqs.p, dqp.p, nq, H, bt, cache, scale, dout.p, nullptr,
                       split_kv ? scratch.p : nullptr, ns);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = dout.down();
  double max_err = 0, ref_max = 0, se = 0, sr = 0;
  for (int64_t i = 0; i < nq; ++i) {
    const size_t b = size_t(qseq[size_t(i)]);
    const int p = qpos[size_t(i)], S = lens[b];
    // CPU keys [S, 1, R + DR] = [latent (FP8-rounded when the cache is FP8), k_pe]; values = latent
    std::vector<float> lt = lat[b];
    if (fp8) dz::kv_fp8_round(lat[b].data(), S, R, lt.data());
    std::vector<float> k(size_t(S) * DK);
    for (int s = 0; s < S; ++s) {
      std::copy_n(lt.data() + size_t(s) * R, R, k.data() + size_t(s) * DK);
      std::copy_n(kpe[b].data() + size_t(s) * DR, DR, k.data() + size_t(s) * DK + R);
    }
    std::vector<float> ref(size_t(H) * R);
    dz::causal_attention(q.data() + i * H * DK, k.data(), lt.data(), ref.data(), 1, p, S, H, 1, DK, R, scale,
                         dense ? nullptr : sel.data() + i * K, dense ? 0 : K);
    for (size_t j = 0; j < ref.size(); ++j) {
      const double d = std::fabs(double(bf(out[size_t(i) * H * R + j])) - ref[j]);
      max_err = std::max(max_err, d);
      ref_max = std::max(ref_max, double(std::fabs(ref[j])));
      se += d * d;
      sr += double(ref[j]) * ref[j];
    }
  }
  const double rel_rms = std::sqrt(se / std::max(sr, 1e-30));
  const int64_t parts = ns > 0 ? ns / (nq * H * (R + 1)) : 1;
  std::printf("sparse_mla R=%d H=%d K=%d%s fp8=%d split_kv=%d (parts <= %lld) nq=%lld: max abs err %.3g (ref max %.3g), "
              "rel rms %.3g\n",
              R, H, K, dense ? " dense" : "", int(fp8), int(split_kv), (long long)parts, (long long)nq, max_err,
              ref_max, rel_rms);
  // Inputs are bf16 in both; the GPU rounds P and the output to bf16 (2^-9 relative each) and,
  // for FP8, the dequantized latent to bf16 (2^-9 relative): errors stay well under 1% of the
  // output scale; an indexing or masking bug gives O(1) errors.
  CHECK(max_err <= 1e-2 * std::max(ref_max, 0.1));
  CHECK(rel_rms <= 1e-2);
}

}  // namespace

TEST_CASE("gpu sparse-attn: sparse MLA equals the CPU reference within bf16 tolerance", "[gpu]") {
  std::mt19937 rng(9);
  for (bool fp8 : {false, true}) {
    run_mla_case(512, 128, 128, fp8, {300, 40}, {3, 2}, rng);   // 2 head blocks; context < K for seq 1
    run_mla_case(512, 16, 200, fp8, {150, 1000, 5}, {1, 4, 1}, rng);  // decode, 1-4 queries, K % 64 != 0
    run_mla_case(128, 70, 64, fp8, {90, 33}, {5, 2}, rng);      // small preset, H not a multiple of 64
  }
  run_mla_case(512, 128, 2048, true, {2500}, {2}, rng);         // full size
  // split-KV decode (small batches): partial outputs merged by log-sum-exp
  run_mla_case(512, 128, 2048, true, {3000}, {1}, rng, true);     // 32 parts of 64 entries
  run_mla_case(512, 16, 200, false, {150, 1000, 5}, {1, 4, 1}, rng, true);
  run_mla_case(128, 70, 300, true, {400, 20}, {2, 1}, rng, true);  // one query sees < K entries
  // dense causal mode (no selection: entries 0 .. K-1, cut at each query's position; the shorter
  // sequences see fewer than K), prefill-like and split-KV decode past the old 32-part cap
  for (bool fp8 : {false, true}) run_mla_case(512, 128, 300, fp8, {300, 40}, {3, 2}, rng, false, true);
  run_mla_case(128, 70, 400, false, {400, 20}, {2, 1}, rng, false, true);
  run_mla_case(512, 16, 5000, true, {5000}, {1}, rng, true, true);  // 79 parts of 64 entries
  run_mla_case(512, 128, 3000, false, {3000, 700}, {1, 1}, rng, true, true);
  run_mla_case(128, 70, 400, true, {400, 20}, {2, 1}, rng, true, true);
}

// The backend's blocked prefill indexer (indexer_topk_wgmma): with each block's Top-K on a second
// stream beside the next block's scores (two scratch blocks in turn, events between the streams),
// the selections equal the serial loop's bit for bit: the same kernels on the same data, so any
// difference is a race (a block's scores overwritten before its Top-K read them). Blocks of 509
// queries over 3000 keys: six blocks, so scratch blocks are reused (the wait on block i - 2). With
// the histogram Top-K (H 32, D 128) and with topk_from_scores (H 16, D 64); pos0 > 0 for one.
TEST_CASE("gpu sparse-attn: the indexer's Top-K on a second stream selects what the serial loop selects", "[gpu]") {
  std::mt19937 rng(11);
  struct Case {
    int H, D, K;
    int64_t pos0, T;
  };
  for (const Case c : {Case{32, 128, 512, 0, 3000}, Case{16, 64, 256, 700, 2300}}) {
    const int64_t S = c.pos0 + c.T, block = 509;
    const bool hist = dz::cuda::indexer_hist_takes(c.H, S);
    REQUIRE(hist == (c.H == 32));
    auto w = randn(size_t(c.T) * c.H, rng);
    for (float& v : w) v *= float(1.0 / std::sqrt(double(c.H) * c.D));
    std::vector<int32_t> pos(static_cast<size_t>(c.T));
    std::iota(pos.begin(), pos.end(), int32_t(c.pos0));
    Dev<__nv_bfloat16> dq(to_bf16(randn(size_t(c.T) * c.H * c.D, rng))), dk(to_bf16(randn(size_t(S) * c.D, rng)));
    Dev<float> dw(w), scratch(size_t(2 * block * S));
    Dev<uint32_t> dh(hist ? size_t(2 * block * 512) : 1);
    Dev<int32_t> dpos(pos), serial(size_t(c.T * c.K)), side_sel(size_t(c.T * c.K));
    cudaStream_t main_st;
    CUDA_CHECK(cudaStreamCreateWithFlags(&main_st, cudaStreamNonBlocking));
    dz::cuda::TopkSide side;
    side.create();
    uint32_t* hp = hist ? dh.p : nullptr;
    dz::cuda::indexer_topk_wgmma(dq.p, dw.p, dk.p, S, c.T, c.pos0, c.H, c.D, dpos.p, c.K, serial.p, block, scratch.p,
                                 hp, main_st);
    for (int rep = 0; rep < 3; ++rep) {  // a race need not show the first time
      CUDA_CHECK(cudaMemsetAsync(side_sel.p, 0xff, side_sel.n * 4, main_st));
      dz::cuda::indexer_topk_wgmma(dq.p, dw.p, dk.p, S, c.T, c.pos0, c.H, c.D, dpos.p, c.K, side_sel.p, block,
                                   scratch.p, hp, main_st, &side);
      CUDA_CHECK(cudaStreamSynchronize(main_st));  // only the main stream: the join must cover the side
      CHECK(side_sel.down() == serial.down());
    }
    // the serial selections are valid ones: ascending, inside the causal range, -1 only as padding
    const auto g = serial.down();
    bool ok = true;
    for (int64_t t = 0; t < c.T; ++t)
      for (int j = 0; j < c.K; ++j) {
        const int32_t v = g[size_t(t * c.K + j)];
        const bool valid = j < std::min<int64_t>(c.K, c.pos0 + t + 1);
        ok &= valid ? (v >= 0 && v <= c.pos0 + t && (j == 0 || v > g[size_t(t * c.K + j - 1)])) : v == -1;
      }
    CHECK(ok);
    cudaStreamDestroy(main_st);
  }
}

// topk_from_hist on score rows made to stress it, against the CPU backend's Top-K (topk_positions:
// higher first, ties to the lower position, NaN lowest, -0 == +0; positions ascending, -1 padded):
// many keys equal to the K-th best across every warp's span, NaN / -0 / negative scores, a threshold
// bin over the kernel's 12288 kept keys (its block_topk path), rows shorter than K, ragged lengths and
// a padded ld. The histograms are made on the host as indexer_scores_wgmma writes them (okey: the
// kernels' order key). Exact: the selections are integers.
TEST_CASE("gpu sparse-attn: topk_from_hist selects the host Top-K on rows with ties, NaN and a full bin", "[gpu]") {
  auto okey = [](float s) -> uint32_t {
    if (std::isnan(s)) return 0u;
    if (s == 0.f) s = 0.f;
    uint32_t u;
    std::memcpy(&u, &s, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  };
  std::mt19937 rng(23);
  for (const int K : {512, 2048}) {
    const int64_t nq = 12, ld = 30011;  // odd ld: rows not 16-byte aligned
    std::vector<float> sc(size_t(nq * ld), std::nanf(""));
    std::vector<int32_t> pos(static_cast<size_t>(nq));
    std::uniform_real_distribution<float> u01(0.f, 1.f);
    for (int64_t q = 0; q < nq; ++q) {
      const int64_t n = q == 0 ? K / 2 : q == 1 ? K : std::min<int64_t>(ld, 2000 + 2500 * q + int64_t(rng() % 97));
      pos[size_t(q)] = int32_t(n - 1);
      float* r = sc.data() + q * ld;
      for (int64_t i = 0; i < n; ++i) {
        const float x = u01(rng);
        switch (q % 5) {
          case 0: r[i] = x * 4.f - 1.f; break;                                     // plain
          case 1: r[i] = float(int(x * 6.f)) * 0.25f; break;                      // 6 values: ties everywhere
          case 2: r[i] = x < 0.1f ? std::nanf("") : x < 0.3f ? -0.f : x < 0.5f ? 0.f : x - 0.75f; break;
          case 3: r[i] = 1.0f + float(int(x * 3.f)) * 1e-7f; break;             // one bin, few distinct keys
          default: r[i] = x < 0.95f ? 1.5f : 2.f + x; break;                        // bin of ~all: block_topk
        }
      }
    }
    std::vector<uint32_t> hist(size_t(nq * 512), 0u);
    for (int64_t q = 0; q < nq; ++q)
      for (int64_t i = 0; i <= pos[size_t(q)]; ++i) {
        const uint32_t b = okey(sc[size_t(q * ld + i)]) >> 22;
        hist[size_t(q * 512 + b / 2)] += 1u << (16 * (b & 1));
      }
    Dev<float> dsc(sc);
    Dev<uint32_t> dh(hist);
    Dev<int32_t> dpos(pos), dsel(size_t(nq * K));
    dz::cuda::topk_from_hist(dsc.p, ld, dh.p, dpos.p, nq, K, dsel.p, nullptr);
    const auto got = dsel.down();
    for (int64_t q = 0; q < nq; ++q) {
      const int64_t n = pos[size_t(q)] + 1;
      std::vector<int32_t> want(static_cast<size_t>(K));
      dz::topk_positions(sc.data() + q * ld, want.data(), 1, n - 1, ld, K);  // the CPU backend's Top-K
      INFO("K " << K << ", row " << q << " of " << n << " keys");
      CHECK(std::equal(want.begin(), want.end(), got.begin() + q * K));
    }
  }
}
