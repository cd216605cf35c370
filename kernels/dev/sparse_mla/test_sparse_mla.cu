// Standalone test + bench of sparse_mla (kernels/sparse_mla.cuh: the wgmma kernel for prefill on the
// BF16 cache with R = 512, the mma.sync kernel for split-KV decode):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib
//        kernels/dev/sparse_mla/test_sparse_mla.cu kernels/sparse_mla.cu kernels/sparse_mla_wgmma.cu -o /tmp/smla
//   /tmp/smla && /tmp/smla --bench
// Test: a paged BF16 latent cache (pages shuffled), random bf16 q and cache rows in [-1, 1), per
// query a selection of distinct positions <= its own with -1 and future entries mixed in (masked),
// or the dense causal mode; reference = an fp64 loop over the same bf16 values. Every output
// element is checked. Tolerance: |values| <= 1, so |out| <= 1; the output is rounded to bf16
// (<= 2^-9 relative) and P to bf16 for P V (<= 2^-9 relative per term): max abs error <= 8e-3
// (2x the worst case) and NMSE <= 1e-5 (output rounding alone is ~1.3e-6). Calls that would split
// the entries (fewer query blocks than multiprocessors) take the mma.sync kernel: the test's
// large cases use enough queries not to.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench_util.cuh"
#include "common.cuh"
#include "core/bf16.hpp"
#include "dev/host_util.hpp"
#include "sparse_mla.cuh"

using namespace dz::cuda;

namespace {


struct Case {
  int DR, H, K, nq, nseq;
  bool dense;
};

// Returns the number of failures.
int run_case(const Case& c, bool check, bool bench) {
  // bench: one sequence of nq tokens, query i at position i (a prefill); test: random lengths
  const int R = 512, DK = R + c.DR, P = 64;
  std::mt19937 rng(uint32_t(1000 + c.DR + c.H + c.K + c.nq));
  // sequences: lengths, the queries spread over them (positions < length)
  std::vector<int> len(static_cast<size_t>(c.nseq));
  for (auto& l : len)
    l = bench ? c.nq
              : int(std::uniform_int_distribution<int>(c.dense ? 100 : c.K / 2 + 1, c.dense ? 700 : 2 * c.K + 64)(rng));
  int max_pages = 0;
  for (int l : len) max_pages = std::max(max_pages, (l + P - 1) / P);
  const int pages = c.nseq * max_pages;
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int i = 0; i < pages; ++i) table[size_t(i)] = i;
  std::shuffle(table.begin(), table.end(), rng);  // page ids out of order
  std::vector<uint16_t> cache(size_t(pages) * P * DK), q(size_t(c.nq) * c.H * DK);
  uint64_t st = 0x9E3779B97F4A7C15ull ^ rng();  // xorshift: GBs of bench inputs in seconds
  auto u = [&] {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    return float(st >> 40) * (2.f / 16777216.f) - 1.f;
  };
  for (auto& x : cache) x = dz::f32_to_bf16(u());
  for (auto& x : q) x = dz::f32_to_bf16(u());
  std::vector<int32_t> seq(size_t(c.nq)), pos(size_t(c.nq)), sel(c.dense ? 0 : size_t(c.nq) * c.K);
  for (int i = 0; i < c.nq; ++i) {
    seq[size_t(i)] = i % c.nseq;
    pos[size_t(i)] = bench ? i : std::uniform_int_distribution<int>(0, len[size_t(seq[size_t(i)])] - 1)(rng);
    if (c.dense) continue;
    // K entries: distinct positions <= pos (as many as exist), then -1 / future positions
    std::vector<int32_t> cand(size_t(pos[size_t(i)]) + 1);
    for (size_t j = 0; j < cand.size(); ++j) cand[j] = int32_t(j);
    std::shuffle(cand.begin(), cand.end(), rng);
    for (int k = 0; k < c.K; ++k) {
      int32_t v = k < int(cand.size()) ? cand[size_t(k)] : -1;
      if (k % 97 == 5) v = -1;                          // holes
      if (k % 89 == 7) v = pos[size_t(i)] + 1 + k % 3;  // future entries: masked
      sel[size_t(i) * c.K + k] = v;
    }
  }
  const int K = c.dense ? *std::max_element(pos.begin(), pos.end()) + 1 : c.K;
  const float scale = 1.f / std::sqrt(float(DK));

  uint16_t *dq, *dc, *dout;
  int32_t *dsel = nullptr, *dseq, *dpos, *dtab;
  const size_t no = size_t(c.nq) * c.H * R;
  CUDA_CHECK(cudaMalloc(&dq, q.size() * 2));
  CUDA_CHECK(cudaMalloc(&dc, cache.size() * 2));
  CUDA_CHECK(cudaMalloc(&dout, no * 2));
  CUDA_CHECK(cudaMalloc(&dseq, seq.size() * 4));
  CUDA_CHECK(cudaMalloc(&dpos, pos.size() * 4));
  CUDA_CHECK(cudaMalloc(&dtab, table.size() * 4));
  if (!c.dense) CUDA_CHECK(cudaMalloc(&dsel, sel.size() * 4));
  CUDA_CHECK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dc, cache.data(), cache.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dseq, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dtab, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  if (!c.dense) CUDA_CHECK(cudaMemcpy(dsel, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dout, 0xff, no * 2));
  BlockTable bt;
  bt.table = dtab, bt.max_pages = max_pages, bt.page_size = P;
  LatentCache lc;
  lc.R = R, lc.DR = c.DR, lc.fp8 = false, lc.bf16 = reinterpret_cast<__nv_bfloat16*>(dc);
  auto call = [&] {
    sparse_mla(reinterpret_cast<const __nv_bfloat16*>(dq), dsel, K, dseq, dpos, c.nq, c.H, bt, lc, scale,
               reinterpret_cast<__nv_bfloat16*>(dout), 0);
  };
  call();
  CUDA_CHECK(cudaDeviceSynchronize());
  // DZ_SMLA_DUMP=file: every case's output appended (two builds' files compared bitwise with cmp)
  if (const char* f = std::getenv("DZ_SMLA_DUMP")) {
    std::vector<uint16_t> o(no);
    CUDA_CHECK(cudaMemcpy(o.data(), dout, no * 2, cudaMemcpyDeviceToHost));
    FILE* fp = std::fopen(f, "ab");
    if (!fp || std::fwrite(o.data(), 2, no, fp) != no) {
      std::fprintf(stderr, "DZ_SMLA_DUMP: cannot write %s\n", f);
      std::exit(2);
    }
    std::fclose(fp);
  }
  const char* mode = c.dense ? "dense" : "sel";
  if (bench) {
    const double ms = median_ms(call, 5, 1);
    // valid entries ~ min(K, pos + 1): count them for the FLOPs (2 (DK + R) per head and entry)
    double ent = 0;
    for (int i = 0; i < c.nq; ++i) ent += std::min<double>(K, pos[size_t(i)] + 1);
    const double flops = 2.0 * c.H * (DK + R) * ent;
    std::printf("bench %s DR %2d H %3d K %5d nq %5d: %8.3f ms  %6.1f TFLOP/s (valid entries)\n", mode, c.DR, c.H, c.K,
                c.nq, ms, flops / ms * 1e-9);
  }
  int fails = 0;
  if (check) {
    std::vector<uint16_t> out(no);
    CUDA_CHECK(cudaMemcpy(out.data(), dout, no * 2, cudaMemcpyDeviceToHost));
    // bench: spot checks of 16 queries; test: all
    const int nchk = bench ? 16 : c.nq;
    std::vector<double> err(static_cast<size_t>(nchk)), se(err), sr(err);
    dz::dev::parallel_each(nchk, [&](int64_t ii) {
      const int i = bench ? int(ii * (c.nq / nchk)) : int(ii);
      const int p = pos[size_t(i)], s = seq[size_t(i)];
      std::vector<double> lg, acc(static_cast<size_t>(R));
      std::vector<const uint16_t*> rows;
      for (int k = 0; k < K; ++k) {
        const int idx = c.dense ? k : sel[size_t(i) * c.K + k];
        if (idx < 0 || idx > p) continue;
        const int64_t slot = int64_t(table[size_t(s) * max_pages + idx / P]) * P + idx % P;
        rows.push_back(cache.data() + slot * DK);
      }
      double e = 0, s2 = 0, r2 = 0;
      for (int h = 0; h < c.H; ++h) {
        const uint16_t* qh = q.data() + (size_t(i) * c.H + h) * DK;
        lg.assign(rows.size(), 0.0);
        double mx = -INFINITY;
        for (size_t j = 0; j < rows.size(); ++j) {
          double d = 0;
          for (int x = 0; x < DK; ++x) d += double(dz::bf16_to_f32(qh[x])) * dz::bf16_to_f32(rows[j][x]);
          lg[j] = d * scale;
          mx = std::max(mx, lg[j]);
        }
        double den = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (size_t j = 0; j < rows.size(); ++j) {
          const double w = std::exp(lg[j] - mx);
          den += w;
          for (int x = 0; x < R; ++x) acc[size_t(x)] += w * dz::bf16_to_f32(rows[j][x]);
        }
        for (int x = 0; x < R; ++x) {
          const double ref = rows.empty() ? 0.0 : acc[size_t(x)] / den;
          const double got = dz::bf16_to_f32(out[(size_t(i) * c.H + h) * R + x]);
          const double d = std::isfinite(got) ? std::fabs(got - ref) : 1e30;
          e = std::max(e, d);
          s2 += (got - ref) * (got - ref);
          r2 += ref * ref;
        }
      }
      err[size_t(ii)] = e, se[size_t(ii)] = s2, sr[size_t(ii)] = r2;
    });
    double e = 0, s2 = 0, r2 = 0;
    for (int i = 0; i < nchk; ++i) e = std::max(e, err[size_t(i)]), s2 += se[size_t(i)], r2 += sr[size_t(i)];
    const double nmse = r2 > 0 ? s2 / r2 : s2;
    const bool ok = e <= 8e-3 && nmse <= 1e-5;
    fails += !ok;
    std::printf("%s %s DR %2d H %3d K %5d nq %5d seqs %d: max abs %.3g nmse %.3g %s\n", bench ? "  spot" : "case",
                mode, c.DR, c.H, c.K, c.nq, c.nseq, e, nmse, ok ? "ok" : "FAIL");
  }
  cudaFree(dq), cudaFree(dc), cudaFree(dout), cudaFree(dseq), cudaFree(dpos), cudaFree(dtab);
  if (dsel) cudaFree(dsel);
  return fails;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines out before an abort
  const bool bench = argc > 1 && !std::strcmp(argv[1], "--bench");
  const bool nocheck = argc > 2 && !std::strcmp(argv[2], "--nocheck");
  int fails = 0;
  if (!bench) {
    // nq >= 160 with H <= 64 keeps the call unsplit (the wgmma kernel); nq = 4: the mma.sync
    // kernel's split path, through the same dispatch
    const Case cases[] = {
        {0, 64, 512, 160, 3, false},  {64, 64, 512, 160, 3, false}, {0, 16, 300, 200, 2, false},
        {64, 128, 200, 96, 4, false}, {0, 64, 0, 160, 2, true},    {64, 20, 0, 170, 3, true},
        {0, 64, 130, 4, 1, false},
    };
    for (const Case& c : cases) fails += run_case(c, true, false);
    std::printf("%d failures\n", fails);
  } else {
    // GLM-5.3-Flash's DSA layer (64 heads, latent 512 without RoPE, Top-2048) and DeepSeek-V3.2's
    // (128 heads in two blocks, 512 + 64), 8192 queries over one 8192-token sequence
    const Case cases[] = {{0, 64, 2048, 8192, 1, false}, {64, 128, 2048, 8192, 1, false}};
    for (const Case& c : cases) fails += run_case(c, !nocheck, true);
  }
  return fails ? 1 : 0;
}
