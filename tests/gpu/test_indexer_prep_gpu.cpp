// GPU decode preprocessing of the DSA indexer (kernels/indexer_prep.cuh) vs the CPU reference
// (lib/ops: linear, layer_norm, Rope NeoX, mxfp8_round), serial vs three-stream, and a CUDA graph.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common.cuh"
#include "gpu_fixtures.hpp"
#include "core/bf16.hpp"
#include "core/fp8.hpp"
#include "core/linalg.hpp"
#include "indexer_prep.cuh"
#include "ops/indexer.hpp"
#include "ops/rope.hpp"
#include "paged_cache.cuh"

namespace {

using dz::cuda::IndexerPrepMode;

using namespace dz::gputest;

// bf16-rounded normal values (the GPU gets exactly these, the CPU reference the same numbers in fp32)
std::vector<float> randn_bf16(size_t n, float sd, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = dz::round_bf16(nd(rng));
  return x;
}
template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

struct Dims {
  const char* name;
  int64_t hidden, q_lora;
  int32_t H, D, rope;
};

// Host inputs and CPU reference of one case.
struct Problem {
  Dims d;
  int64_t B;
  float theta = 10000.f;
  std::vector<float> x, qr, wq_b, wk, wp, lnw, lnb;  // bf16-rounded (lnw/lnb plain fp32)
  std::vector<int32_t> seq, pos;
  std::vector<float> q_ref, k_ref, w_ref;  // fp32 reference (before any MXFP8 rounding)

  Problem(const Dims& dims, int64_t b, uint32_t seed) : d(dims), B(b) {
    std::mt19937 rng(seed);
    const int64_t HD = int64_t(d.H) * d.D;
    x = randn_bf16(size_t(B * d.hidden), 1.f, rng);
    qr = randn_bf16(size_t(B * d.q_lora), 1.f, rng);
    // weights ~ 1/sqrt(fan_in): projections come out O(1)
    wq_b = randn_bf16(size_t(HD * d.q_lora), 1.f / std::sqrt(float(d.q_lora)), rng);
    wk = randn_bf16(size_t(d.D * d.hidden), 1.f / std::sqrt(float(d.hidden)), rng);
    wp = randn_bf16(size_t(d.H * d.hidden), 1.f / std::sqrt(float(d.hidden)), rng);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int i = 0; i < d.D; ++i) {
      lnw.push_back(1.f + 0.2f * nd(rng));
      lnb.push_back(0.2f * nd(rng));
    }
    // distinct sequences in shuffled order, positions spread up to 5000 (large rope angles)
    seq.resize(size_t(B));
    std::iota(seq.begin(), seq.end(), 0);
    std::shuffle(seq.begin(), seq.end(), rng);
    std::uniform_int_distribution<int32_t> up(0, 5000);
    for (int64_t i = 0; i < B; ++i) pos.push_back(i == 0 ? 0 : up(rng));  // position 0 included

    // CPU reference, token by token (each token has its own position)
    dz::RopeConfig rc;
    rc.theta = theta;
    rc.style = dz::RopeStyle::NeoX;
    dz::Rope rope(rc, d.rope);
    q_ref.resize(size_t(B * HD));
    k_ref.resize(size_t(B * d.D));
    w_ref.resize(size_t(B * d.H));
    const float wscale = float(1.0 / std::sqrt(double(d.H)) / std::sqrt(double(d.D)));
    for (int64_t t = 0; t < B; ++t) {
      float* qt = q_ref.data() + t * HD;
      float* kt = k_ref.data() + t * d.D;
      dz::linear(qr.data() + t * d.q_lora, wq_b.data(), nullptr, qt, 1, d.q_lora, HD);
      rope.apply(qt, 1, d.H, d.D, 0, pos[size_t(t)]);
      dz::linear(x.data() + t * d.hidden, wk.data(), nullptr, kt, 1, d.hidden, d.D);
      dz::layer_norm(kt, lnw.data(), lnb.data(), kt, 1, d.D, 1e-6f);
      rope.apply(kt, 1, 1, d.D, 0, pos[size_t(t)]);
      dz::linear(x.data() + t * d.hidden, wp.data(), nullptr, w_ref.data() + t * d.H, 1, d.hidden, d.H);
      for (int h = 0; h < d.H; ++h) w_ref[size_t(t * d.H + h)] *= wscale;
    }
  }
};

// Device side of one problem: weights, inputs, a paged key cache (one page per token, pages
// shuffled, P = 16), outputs.
struct DevProblem {
  static constexpr int P = 16;
  const Problem& pr;
  bool mx;
  Dev<__nv_bfloat16> x, qr, wq_b, wk, wp;
  Dev<float> lnw, lnb;
  Dev<int32_t> seq, pos, table;
  int32_t max_pages;
  std::vector<int64_t> slot;  // cache row of token t
  Dev<__nv_bfloat16> kbf;     // [B pages, P, D]       (!mx)
  Dev<uint8_t> kcodes, kscales;  // [B pages, P, D], [B pages, P, D / 32]   (mx)
  Dev<__nv_bfloat16> q;
  Dev<float> w;

  static std::vector<int32_t> make_table(const Problem& pr, int32_t max_pages, std::vector<int64_t>& slot) {
    std::vector<int32_t> t(size_t(pr.B * max_pages), -1), pages(size_t(pr.B));
    std::iota(pages.begin(), pages.end(), 0);
    std::mt19937 rng(5);
    std::shuffle(pages.begin(), pages.end(), rng);
    for (int64_t i = 0; i < pr.B; ++i) {
      const int32_t s = pr.seq[size_t(i)], p = pr.pos[size_t(i)];
      t[size_t(int64_t(s) * max_pages + p / P)] = pages[size_t(i)];
      slot.push_back(int64_t(pages[size_t(i)]) * P + p % P);
    }
    return t;
  }

  DevProblem(const Problem& p, bool mxfp8)
      : pr(p),
        mx(mxfp8),
        x(to_bf16(p.x)),
        qr(to_bf16(p.qr)),
        wq_b(to_bf16(p.wq_b)),
        wk(to_bf16(p.wk)),
        wp(to_bf16(p.wp)),
        lnw(p.lnw),
        lnb(p.lnb),
        seq(p.seq),
        pos(p.pos),
        table(size_t(p.B) * (5000 / P + 1)),
        max_pages(5000 / P + 1),
        kbf(mxfp8 ? 0 : size_t(p.B) * P * p.d.D),
        kcodes(mxfp8 ? size_t(p.B) * P * p.d.D : 0),
        kscales(mxfp8 ? size_t(p.B) * P * p.d.D / 32 : 0),
        q(size_t(p.B) * p.d.H * p.d.D),
        w(size_t(p.B) * p.d.H) {
    table.up(make_table(p, max_pages, slot));
    CUDA_CHECK(cudaDeviceSynchronize());  // uploads done before any stream uses them
  }
  dz::cuda::IndexerPrepWeights weights() const { return {wq_b.p, wk.p, wp.p, lnw.p, lnb.p}; }
  dz::cuda::BlockTable bt() const { return {table.p, max_pages, P}; }
  dz::cuda::IndexKeyCache cache() const {
    dz::cuda::IndexKeyCache c;
    c.D = pr.d.D;
    c.mxfp8 = mx;
    c.bf16 = kbf.p;
    c.codes = kcodes.p;
    c.scales = kscales.p;
    return c;
  }
  void clear_outputs() {
    kbf.zero();
    kcodes.zero();
    kscales.zero();
    q.zero();
    w.zero();
    CUDA_CHECK(cudaDeviceSynchronize());  // memsets run on the legacy stream
  }
  void run(dz::cuda::IndexerPrep* ctx, IndexerPrepMode mode, cudaStream_t s) {
    dz::cuda::indexer_prep(ctx, weights(), x.p, qr.p, seq.p, pos.p, pr.B, bt(), cache(), q.p, w.p, mode, s);
  }
  // Everything the call wrote, as bytes, for bitwise comparisons.
  struct Out {
    std::vector<__nv_bfloat16> q, kbf;
    std::vector<float> w;
    std::vector<uint8_t> codes, scales;
    bool operator==(const Out& o) const {
      return same_bytes(q, o.q) && same_bytes(w, o.w) && same_bytes(kbf, o.kbf) && same_bytes(codes, o.codes) &&
             same_bytes(scales, o.scales);
    }
  };
  Out out() const { return {q.down(), kbf.down(), w.down(), kcodes.down(), kscales.down()}; }
};

dz::cuda::IndexerPrepDims prep_dims(const Dims& d, int64_t max_tokens) {
  dz::cuda::IndexerPrepDims pd;
  pd.hidden = d.hidden;
  pd.q_lora = d.q_lora;
  pd.H = d.H;
  pd.D = d.D;
  pd.rope = d.rope;
  pd.rope_theta = 10000.f;
  pd.max_tokens = max_tokens;
  return pd;
}

// Max of |g - r| / tol over the elements (<= 1 passes) and the max |g - r|.
struct Err {
  double ratio = 0, abs = 0;
  void add(double g, double r, double tol) {
    const double e = std::fabs(g - r);
    if (std::isnan(e)) {  // a NaN must fail, not vanish in std::max
      abs = ratio = std::numeric_limits<double>::infinity();
      return;
    }
    abs = std::max(abs, e);
    ratio = std::max(ratio, e / tol);
  }
};
double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

const Dims kSmall{"small", 256, 96, 8, 64, 32};
const Dims kV32{"deepseek-v3.2", 7168, 1536, 64, 128, 64};

}  // namespace

// Tolerances (GPU vs fp32 CPU on the same bf16-rounded inputs):
//  - bf16 GEMM inputs give exact products; the GEMMs accumulate in fp32 in another order than
//    dz::linear (and tensor cores may truncate): allowance 1e-4 * max|ref| of the tensor (the
//    expected accumulation error is ~1e-5 of it at K = 7168).
//  - q and k are rounded once to bf16 after RoPE (<= 2^-8 |v|, 8 significant bits): + 2^-7 |ref|,
//    one bf16 ulp, so the rounding alone uses at most about half the tolerance.
//  - MXFP8 (q and keys): GPU quantizes the bf16 value, CPU the fp32 value, so one E4M3 step may
//    differ: + 2^-3 max(|g|, |r|) (3 mantissa bits) + 2^-8 * amax of the 32-group (subnormal codes,
//    a group scale that moved by one power of two).
//  - w: fp32 out, accumulation only: 1e-4 * max|w_ref|.
// Exact checks: serial == three-stream bitwise (q, w, every cache byte); with MXFP8, q equals the
// CPU mxfp8_round of the bf16 q of the unquantized run and the stored codes/scales equal the CPU
// mxfp8_quantize of the bf16 keys stored by the unquantized run (the quantization is exact).
TEST_CASE("gpu indexer prep: q, w and stored keys vs the CPU reference; serial == three streams", "[gpu]") {
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  for (const Dims& d : {kSmall, kV32}) {
    for (int64_t B : {1, 3, 64}) {
      const Problem pr(d, B, uint32_t(17 + B + d.hidden));
      dz::cuda::IndexerPrep* ctx = dz::cuda::indexer_prep_create(prep_dims(d, 64));
      const int64_t G = d.D / 32;
      std::vector<float> q_bf16_run, k_bf16_run;  // GPU bf16 results of the unquantized run
      for (bool mx : {false, true}) {
        DevProblem dp(pr, mx);
        dp.run(ctx, IndexerPrepMode::Serial, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        const DevProblem::Out serial = dp.out();
        // three streams; B == 3 forks from the legacy default stream to cover that path too
        dp.clear_outputs();
        cudaStream_t caller = B == 3 ? nullptr : s;
        dp.run(ctx, IndexerPrepMode::Streams, caller);
        CUDA_CHECK(cudaStreamSynchronize(caller));
        const DevProblem::Out streams = dp.out();
        INFO(d.name << " B " << B << (mx ? " mxfp8" : " bf16"));
        CHECK(serial == streams);

        // gather the stored keys of the B tokens
        std::vector<float> kg(size_t(B * d.D));
        std::vector<uint8_t> kcodes(size_t(B * d.D)), kscales(size_t(B * G));
        const std::vector<float> kall = from_bf16(serial.kbf);
        int64_t stray = 0;  // nonzero cache rows that no token owns (BF16 cache)
        for (int64_t t = 0; t < B; ++t) {
          const int64_t sl = dp.slot[size_t(t)];
          if (!mx) {
            std::copy_n(kall.begin() + sl * d.D, d.D, kg.begin() + t * d.D);
          } else {
            std::copy_n(serial.codes.begin() + sl * d.D, d.D, kcodes.begin() + t * d.D);
            std::copy_n(serial.scales.begin() + sl * G, G, kscales.begin() + t * G);
          }
        }
        if (!mx) {
          std::vector<char> owned(size_t(B) * DevProblem::P, 0);
          for (int64_t sl : dp.slot) owned[size_t(sl)] = 1;
          for (size_t r = 0; r < owned.size(); ++r)
            if (!owned[r])
              for (int i = 0; i < d.D; ++i) stray += kall[r * size_t(d.D) + size_t(i)] != 0.f;
        } else {
          dz::mxfp8_dequantize(kcodes.data(), kscales.data(), B, d.D, kg.data());
        }
        CHECK(stray == 0);
        const std::vector<float> qg = from_bf16(serial.q);

        // references after the optional MXFP8 rounding (per token and head / per key)
        std::vector<float> q_ref = pr.q_ref, k_ref = pr.k_ref;
        if (mx) {
          dz::mxfp8_round(q_ref.data(), B * d.H, d.D, q_ref.data());
          dz::mxfp8_round(k_ref.data(), B, d.D, k_ref.data());
        }
        // q, k: per-element tolerance (see above); group amax of the reference for the MXFP8 term
        auto check = [&](const std::vector<float>& g, const std::vector<float>& r, const std::vector<float>& r_unq,
                         const char* what) {
          const double m = max_abs(r_unq);
          Err e;
          for (size_t i = 0; i < g.size(); ++i) {
            double tol = std::ldexp(1.0, -7) * std::fabs(r[i]) + 1e-4 * m;
            if (mx) {
              const size_t g0 = i / 32 * 32;
              double amax = 0;
              for (size_t j = g0; j < g0 + 32; ++j) amax = std::max(amax, double(std::fabs(r_unq[j])));
              tol += 0.125 * std::max(std::fabs(g[i]), std::fabs(r[i])) + std::ldexp(amax, -8);
            }
            e.add(g[i], r[i], tol);
          }
          std::printf("indexer prep %-13s B=%-2lld %-5s %s: max |gpu - cpu| %.3g (max|ref| %.3g), max err/tol %.3f\n",
                      d.name, (long long)B, mx ? "mxfp8" : "bf16", what, e.abs, m, e.ratio);
          CHECK(e.ratio <= 1.0);
        };
        check(qg, q_ref, pr.q_ref, "q");
        check(kg, k_ref, pr.k_ref, "k");
        {
          const double m = max_abs(pr.w_ref);
          Err e;
          for (size_t i = 0; i < serial.w.size(); ++i) e.add(serial.w[i], pr.w_ref[i], 1e-4 * m);
          std::printf("indexer prep %-13s B=%-2lld %-5s w: max |gpu - cpu| %.3g (max|ref| %.3g), max err/tol %.3f\n",
                      d.name, (long long)B, mx ? "mxfp8" : "bf16", e.abs, m, e.ratio);
          CHECK(e.ratio <= 1.0);
        }

        // exactness of the MXFP8 step against the unquantized run's bf16 values
        if (!mx) {
          q_bf16_run = qg;
          k_bf16_run = kg;
        } else {
          std::vector<float> q_exp(q_bf16_run.size());
          dz::mxfp8_round(q_bf16_run.data(), B * d.H, d.D, q_exp.data());
          std::vector<uint8_t> c_exp(kcodes.size()), s_exp(kscales.size());
          dz::mxfp8_quantize(k_bf16_run.data(), B, d.D, c_exp.data(), s_exp.data());
          int64_t bad = 0;
          for (size_t i = 0; i < q_exp.size(); ++i) bad += dz::f32_bits(q_exp[i]) != dz::f32_bits(qg[i]);
          for (size_t i = 0; i < c_exp.size(); ++i) bad += c_exp[i] != kcodes[i];
          for (size_t i = 0; i < s_exp.size(); ++i) bad += s_exp[i] != kscales[i];
          CHECK(bad == 0);
        }
      }
      dz::cuda::indexer_prep_destroy(ctx);
    }
  }
  CUDA_CHECK(cudaStreamDestroy(s));
}

// The three-stream call captured in a CUDA graph (fork/join events become graph edges): replays
// give the eager call's bytes, and a second replay after clearing the outputs gives them again.
TEST_CASE("gpu indexer prep: three-stream call inside a CUDA graph equals the eager call", "[gpu]") {
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  for (bool mx : {false, true}) {
    const Problem pr(kV32, 3, 99);
    dz::cuda::IndexerPrep* ctx = dz::cuda::indexer_prep_create(prep_dims(kV32, 3));
    DevProblem dp(pr, mx);
    dp.run(ctx, IndexerPrepMode::Streams, s);  // eager (also loads the kernels before capture)
    CUDA_CHECK(cudaStreamSynchronize(s));
    const DevProblem::Out eager = dp.out();
    dp.clear_outputs();
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    dp.run(ctx, IndexerPrepMode::Streams, s);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    size_t nodes = 0;
    CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    INFO((mx ? "mxfp8" : "bf16") << ", graph nodes " << nodes);
    // capture only records: the outputs must still be zero
    CUDA_CHECK(cudaStreamSynchronize(s));
    const DevProblem::Out none = dp.out();
    CHECK(std::all_of(none.w.begin(), none.w.end(), [](float v) { return v == 0.f; }));
    for (int rep = 0; rep < 2; ++rep) {
      dp.clear_outputs();
      CUDA_CHECK(cudaGraphLaunch(ge, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      CHECK(dp.out() == eager);
    }
    std::printf("indexer prep graph (%s): %zu nodes, replays equal the eager call\n", mx ? "mxfp8" : "bf16", nodes);
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
    dz::cuda::indexer_prep_destroy(ctx);
  }
  CUDA_CHECK(cudaStreamDestroy(s));
}
