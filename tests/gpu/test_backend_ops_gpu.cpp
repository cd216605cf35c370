// Every backend op on the CUDA backend against the CPU backend (the reference), in the style of
// ggml's test-backend-ops: inputs rounded to bf16 first (both backends see the same values), a
// shape grid with odd sizes (1, 3, 7, 19, 733 rows), NaN/Inf checked before anything else, then the
// normalised MSE sum((gpu - cpu)^2) / sum(cpu^2) against a per-op tolerance:
//   - one bf16 rounding of the output (elementwise, norms, RoPE): the rounding alone gives NMSE
//     ~ 2^-18 / 3 ≈ 1.3e-6; allowed 1e-5;
//   - GEMM chains and attention (bf16 intermediates, fp32 accumulation in another order): 1e-4;
//   - the linear-attention scan (bf16 tensor-core operands inside the chunked kernel; states fp32):
//     5e-4; its fp32 state compared too (1e-4: the state never passes through bf16 activations);
//   - MoE: routing must pick the same experts (fp32 router on both; random inputs have no near
//     ties at fp32 resolution), then 1e-3 on the mixed output (bf16 hidden of every expert);
//   - LM-head reductions: exact ids for top-k, 1e-6 relative on max / sum of exponentials (fp32
//     logits from one GEMM);
//   - MLA on the latent cache (mla_latent_attention): max abs error <= 1% of max|cpu| and relative
//     RMS <= 1%, as tests/gpu/test_sparse_attn_gpu.cpp's sparse MLA (P and the output rounded to
//     bf16, 2^-9 relative each).
#include <catch2/catch.hpp>

#include <limits>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "ops/hyper.hpp"
#include "backend_compare.hpp"
#include "backend/device_comm.hpp"
#include "core/bf16.hpp"
#include "core/fp8.hpp"
#include "ops/attention.hpp"
#include "ops/moe.hpp"
#include "ops/rope.hpp"
#include "linear_attn.cuh"
#include "sparse_mla.cuh"
#include "model/attn_cache.hpp"
#include "model/parallel.hpp"

namespace {

using dz::Backend;
using dz::DTensor;
using dz::DType;
using dz::Shape;

struct Both {
  std::unique_ptr<Backend> cpu = dz::make_cpu_backend(), gpu = dz::make_cuda_backend(0);
};
Both& backends() {
  static Both b;  // one GPU context for the whole test binary
  return b;
}

using dz::gputest::nmse;
using dz::gputest::rnd;

// Runs f on both backends and checks the NMSE of what it returns.
template <class F>
double check(const char* op, const std::string& shape, double tol, F&& f) {
  Both& b = backends();
  const std::vector<float> ref = f(*b.cpu), got = f(*b.gpu);
  const double e = nmse(got, ref);
  std::printf("  %-16s %-34s nmse %.2e (tol %.0e)\n", op, shape.c_str(), e, tol);
  INFO(op << " " << shape << " nmse " << e);
  CHECK(e <= tol);
  return e;
}

const int64_t kRows[] = {1, 3, 7, 19, 733};

// Rounds rows of K (K % 32 == 0) to MXFP4 values: per 32 a power-of-two scale 2^(floor(log2 amax) - 2)
// (OCP MX) and the nearest E2M1 magnitude (ties to the smaller).
void mx4_round(std::vector<float>& v, int64_t K) {
  const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (size_t g0 = 0; g0 < v.size(); g0 += 32) {
    float amax = 0.f;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[g0 + j]));
    if (amax == 0.f) continue;
    const float sc = std::ldexp(1.f, int(std::floor(std::log2(amax))) - 2);
    for (size_t j = 0; j < 32; ++j) {
      const float q = std::fabs(v[g0 + j]) / sc;
      int best = 0;
      for (int m = 1; m < 8; ++m)
        if (std::fabs(q - mags[m]) < std::fabs(q - mags[best])) best = m;
      v[g0 + j] = std::copysign(mags[best] * sc, v[g0 + j]);
    }
  }
  (void)K;
}

}  // namespace

TEST_CASE("backend ops: elementwise, norms, linear, SwiGLU on cuda equal the cpu backend", "[gpu]") {
  std::printf("backend ops (cuda vs cpu), NMSE:\n");
  for (int64_t T : kRows)
    // 128, 2048: the norms' row shapes in the 2026 models; 2048, 4104: the hidden-size norm kernel (16-byte
    // loads, 4104 past the chunks it keeps in registers) and 8-wide adds; 1028 (D % 8 != 0): the others
    for (int64_t D : {16, 64, 128, 200, 1028, 2048, 4104}) {
      const std::string sh = "T=" + std::to_string(T) + " D=" + std::to_string(D);
      const auto x = rnd(size_t(T * D), 1), y = rnd(size_t(T * D), 2), w = rnd(size_t(D), 3, 0.5f);
      check("add", sh, 1e-5, [&](Backend& be) {
        DTensor h = be.upload(x.data(), {T, D}, DType::F32), a = be.upload(y.data(), {T, D}, be.act_dtype());
        be.add(h, a);
        return be.to_host(h);
      });
      check("mul_sigmoid", sh, 1e-5, [&](Backend& be) {
        DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), g = be.upload(y.data(), {T, D}, be.act_dtype());
        be.mul_sigmoid(a, g);
        return be.to_host(a);
      });
      for (bool zc : {false, true})
        check(zc ? "rmsnorm (1+w)" : "rmsnorm", sh, 1e-5, [&](Backend& be) {
          DTensor h = be.upload(x.data(), {T, D}, DType::F32), o = be.act({T, D});
          be.rmsnorm(h, be.param(dz::Tensor({D})), o, 1e-5f, zc);  // zeros: (1 + 0) or 0 weight
          DTensor wt = be.upload(w.data(), {D}, DType::F32);
          be.rmsnorm(h, wt, o, 1e-5f, zc);
          return be.to_host(o);
        });
      for (auto act : {dz::GateAct::SiLU, dz::GateAct::Sigmoid})
        check(act == dz::GateAct::SiLU ? "gated_rmsnorm silu" : "gated_rmsnorm sigm", sh, 1e-5, [&](Backend& be) {
          DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), g = be.upload(y.data(), {T, D}, be.act_dtype());
          DTensor wt = be.upload(w.data(), {D}, DType::F32), o = be.act({T, D});
          be.gated_rmsnorm(a, g, wt, o, 1e-6f, act);
          return be.to_host(o);
        });
      if (D == 128 || D >= 1028) continue;  // the norms only: the rest at D = 16, 64, 200
      for (int64_t N : {1, 37, 256}) {
        const auto W = rnd(size_t(N * D), 4, 0.1f), bias = rnd(size_t(N), 5);
        check("linear + bias", sh + " N=" + std::to_string(N), 1e-4, [&](Backend& be) {
          DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), Wt = be.upload(W.data(), {N, D}, be.weight_dtype());
          DTensor o = be.alloc({T, N}, DType::F32);
          be.linear(a, Wt, be.upload(bias.data(), {N}, DType::F32), o);
          return be.to_host(o);
        });
      }
      // bf16 output, and in-features not a multiple of 8 (D - 4)
      for (int64_t K : {D, D - 4}) {
        const int64_t N = 37;
        const auto xk = rnd(size_t(T * K), 10), W = rnd(size_t(N * K), 11, 0.1f);
        check("linear bf16 out", "T=" + std::to_string(T) + " K=" + std::to_string(K) + " N=37", 1e-4,
              [&](Backend& be) {
          DTensor a = be.upload(xk.data(), {T, K}, be.act_dtype()), Wt = be.upload(W.data(), {N, K}, be.weight_dtype());
          DTensor o = be.act({T, N});
          be.linear(a, Wt, DTensor{}, o);
          return be.to_host(o);
        });
      }
      const int64_t I = 48;
      const auto g = rnd(size_t(I * D), 6, 0.2f), u = rnd(size_t(I * D), 7, 0.2f), dn = rnd(size_t(D * I), 8, 0.2f);
      check("swiglu_mlp", sh, 1e-4, [&](Backend& be) {
        dz::SwigluWeights sw{be.upload(g.data(), {I, D}, be.weight_dtype()), be.upload(u.data(), {I, D}, be.weight_dtype()),
                             be.upload(dn.data(), {D, I}, be.weight_dtype())};
        DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), o = be.act({T, D});
        be.swiglu_mlp(a, sw, o);
        return be.to_host(o);
      });
      // the SwiGLU clamp (GLM-5.3-Flash swiglu_limit), at a limit the projections cross
      check("swiglu_mlp clamp", sh, 1e-4, [&](Backend& be) {
        dz::SwigluWeights sw{be.upload(g.data(), {I, D}, be.weight_dtype()), be.upload(u.data(), {I, D}, be.weight_dtype()),
                             be.upload(dn.data(), {D, I}, be.weight_dtype()), 0.05f};
        DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), o = be.act({T, D});
        be.swiglu_mlp(a, sw, o);
        return be.to_host(o);
      });
      // SiTU (Kimi K3), with betas the projections cross: both tanh bounds bite
      check("swiglu_mlp situ", sh, 1e-4, [&](Backend& be) {
        dz::SwigluWeights sw{be.upload(g.data(), {I, D}, be.weight_dtype()), be.upload(u.data(), {I, D}, be.weight_dtype()),
                             be.upload(dn.data(), {D, I}, be.weight_dtype()), dz::GluAct{0.f, 0.2f, 0.3f}};
        DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), o = be.act({T, D});
        be.swiglu_mlp(a, sw, o);
        return be.to_host(o);
      });
      // an odd width: T x 45 elements reach the activation pass's scalar tail (16-byte chunks before it)
      {
        const int64_t I5 = 45;
        const auto g5 = rnd(size_t(I5 * D), 12, 0.2f), u5 = rnd(size_t(I5 * D), 13, 0.2f),
                   d5 = rnd(size_t(D * I5), 14, 0.2f);
        check("swiglu_mlp odd width", sh, 1e-4, [&](Backend& be) {
          dz::SwigluWeights sw{be.upload(g5.data(), {I5, D}, be.weight_dtype()),
                               be.upload(u5.data(), {I5, D}, be.weight_dtype()),
                               be.upload(d5.data(), {D, I5}, be.weight_dtype())};
          DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), o = be.act({T, D});
          be.swiglu_mlp(a, sw, o);
          return be.to_host(o);
        });
      }
      // embedding rows
      const int64_t V = 50;
      const auto table = rnd(size_t(V * D), 9);
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 17 + 3) % V);
      check("embed", sh, 0.0, [&](Backend& be) {
        DTensor tb = be.upload(table.data(), {V, D}, be.weight_dtype()), o = be.alloc({T, D}, DType::F32);
        be.embed(tb, be.upload_i32(ids.data(), {T}), o);
        return be.to_host(o);
      });
    }
}

// FP8 block-scaled weights (DeepSeek checkpoints) stay FP8 on the GPU and multiply activations
// quantised as DeepSeek's act_quant (E4M3, one fp32 scale amax / 448 per 128 of a row). Two
// references on the CPU backend:
//   - the same quantised activations (core/fp8 per-tile round trip) times the dequantised weights
//     in fp32: only the output's bf16 rounding and the accumulation order differ: 1e-5;
//   - the CPU reference itself (fp32 activations): the activations' E4M3 rounding, a relative error
//     uniform in +-2^-4 (NMSE ~ 2^-8 / 3 = 1.3e-3 on every product), allowed 3e-3.
// A weight whose in-features are not a multiple of 128 goes up in BF16 (cuBLASLt's block-scaled
// GEMM needs whole K blocks), which the dtype shows.
TEST_CASE("backend ops: FP8 block-scaled linear on cuda equals the cpu backend on the same quantised activations",
          "[gpu]") {
  std::printf("FP8 block-scaled linear (cuda vs cpu), NMSE:\n");
  Both& b = backends();
  const int64_t kept0 = b.gpu->fp8_weights_kept();
  int64_t kept = 0;
  for (int64_t K : {128, 384, 1024})
    for (int64_t N : {64, 200, 576}) {
      // W: random, quantised per 128 x 128 block as a checkpoint would hold it, then dequantised.
      auto w = rnd(size_t(N * K), 11, 0.05f);
      const int64_t nb = (N + 127) / 128, kb = K / 128;
      auto sc = std::make_shared<dz::Tensor>(Shape{nb, kb});
      for (int64_t bn = 0; bn < nb; ++bn)
        for (int64_t bk = 0; bk < kb; ++bk) {
          float amax = 0;
          for (int64_t n = bn * 128; n < std::min(N, bn * 128 + 128); ++n)
            for (int64_t k = bk * 128; k < bk * 128 + 128; ++k) amax = std::max(amax, std::fabs(w[size_t(n * K + k)]));
          const float s = amax / 448.f;
          sc->row(bn)[bk] = s;
          for (int64_t n = bn * 128; n < std::min(N, bn * 128 + 128); ++n)
            for (int64_t k = bk * 128; k < bk * 128 + 128; ++k) {
              float& v = w[size_t(n * K + k)];
              v = dz::e4m3_to_f32(dz::f32_to_e4m3(v / s)) * s;
            }
        }
      dz::Tensor Wt({N, K});
      Wt.data = w;
      Wt.fp8_block_scales = sc;
      for (int64_t T : kRows) {
        const auto x = rnd(size_t(T * K), 12);
        std::vector<float> xq(x.size());
        dz::kv_fp8_round(x.data(), T, K, xq.data());  // what the GPU multiplies
        const auto bias = rnd(size_t(N), 13);
        for (DType out : {DType::BF16, DType::F32}) {
          const std::string sh = "T=" + std::to_string(T) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                 (out == DType::F32 ? " ->f32" : " ->bf16");
          bool in_fp8 = false;
          auto run = [&](Backend& be, const std::vector<float>& xin) {
            DTensor W = be.weight(Wt);
            if (&be == b.gpu.get()) {
              in_fp8 = W.dtype == DType::F8_E4M3;
              // cuBLASLt's kernels cover these (kernels/dev/fp8_gemm probe); smaller ones may go BF16
              if (K >= 384 && N >= 200) REQUIRE(in_fp8);
              kept += in_fp8;
            }
            // the CPU backend computes in F32 only; the GPU writes both output dtypes
            DTensor a = be.upload(xin.data(), {T, K}, be.act_dtype()),
                    o = be.alloc({T, N}, &be == b.gpu.get() ? out : DType::F32);
            be.linear(a, W, be.upload(bias.data(), {N}, DType::F32), o);
            return be.to_host(o);
          };
          const std::vector<float> got = run(*b.gpu, x), emul = run(*b.cpu, xq), ref = run(*b.cpu, x);
          const double e1 = nmse(got, emul), e2 = nmse(got, ref);
          if (!in_fp8) {  // uploaded in BF16: the plain linear's tolerance against the CPU
            std::printf("  %-34s weight in BF16 (no cuBLASLt FP8 kernel): vs cpu %.2e (tol 1e-04)\n", sh.c_str(), e2);
            CHECK(e2 <= 1e-4);
            continue;
          }
          std::printf("  %-34s vs quantised-activation cpu %.2e (tol 1e-05), vs cpu %.2e (tol 3e-03)\n", sh.c_str(),
                      e1, e2);
          INFO(sh << " nmse " << e1 << " / " << e2);
          CHECK(e1 <= 1e-5);
          CHECK(e2 <= 3e-3);
        }
      }
    }
  CHECK(b.gpu->fp8_weights_kept() - kept0 == kept);
  dz::Tensor odd({64, 200});  // in-features not a multiple of 128: BF16
  odd.fp8_block_scales = std::make_shared<dz::Tensor>(Shape{1, 2});
  CHECK(b.gpu->weight(odd).dtype == DType::BF16);
}

TEST_CASE("backend ops: copies, RoPE, attention and AttnRes on cuda equal the cpu backend", "[gpu]") {
  for (int64_t T : kRows) {
    const std::string sh = "T=" + std::to_string(T);
    const int64_t C = 40;
    const auto x = rnd(size_t(T * C), 11);
    check("copy_cols/rows", sh, 0.0, [&](Backend& be) {
      DTensor a = be.upload(x.data(), {T, C}, be.act_dtype()), o = be.zeros({T, 2 * C}, be.act_dtype());
      be.copy_cols(a, 3, o, 7, 29);
      be.copy_rows(a.reshaped({T, C}), 0, o.reshaped({2 * T, C}), T, T);
      return be.to_host(o);
    });
    // copy_rows_many (one launch on cuda): rows of 20 bytes at odd offsets (the byte path), of
    // 160 and 4096 bytes (16-byte words), several into one destination, a copy of 0 rows; exact.
    check("copy_rows_many", sh, 0.0, [&](Backend& be) {
      std::vector<float> out;
      std::vector<Backend::RowCopy> cs;
      std::vector<DTensor> dsts;
      for (int64_t w : {int64_t(5), C, int64_t(1024)}) {
        const auto xw = rnd(size_t(T * w), uint32_t(12 + w));
        DTensor a = be.upload(xw.data(), {T, w}, DType::F32), o = be.zeros({2 * T + 1, w}, DType::F32);
        cs.push_back({a, 0, o, 1, T});                 // all rows, one row down
        cs.push_back({a, T / 2, o, T + 1, T - T / 2});  // the second half again below
        cs.push_back({a, 0, o, 0, 0});
        dsts.push_back(o);
      }
      be.copy_rows_many(cs);
      for (const DTensor& o : dsts) {
        const auto h = be.to_host(o);
        out.insert(out.end(), h.begin(), h.end());
      }
      return out;
    });
    // RoPE: NeoX partial (offset) and interleaved with YaRN, at a late position
    for (bool inter : {false, true}) {
      dz::RopeConfig rc;
      rc.theta = 10000.f;
      rc.style = inter ? dz::RopeStyle::Interleaved : dz::RopeStyle::NeoX;
      if (inter) {
        rc.yarn = true;
        rc.yarn_factor = 40.f;
        rc.yarn_original_max_pos = 64;
        rc.yarn_mscale = 1.f;
        rc.yarn_mscale_all_dim = 1.f;
      }
      const int64_t H = 3, hs = 24, rot = 16, off = inter ? 8 : 0;
      const dz::Rope rope(rc, rot);
      const auto q = rnd(size_t(T * H * hs), 12);
      check(inter ? "rope interl. yarn" : "rope neox partial", sh, 1e-5, [&](Backend& be) {
        DTensor a = be.upload(q.data(), {T, H * hs}, be.act_dtype());
        be.rope(rope, a, H, hs, off, 1000);
        return be.to_host(a);
      });
    }
    // attention: GQA dense at pos0 > 0, MLA-like one KV head with a sparse selection
    for (int variant = 0; variant < 2; ++variant) {
      const int64_t pos0 = variant ? 5 : 11, S = pos0 + T, Hq = 4, Hkv = variant ? 4 : 2, Dk = variant ? 40 : 64,
                    Dv = variant ? 24 : 64;
      const auto q = rnd(size_t(T * Hq * Dk), 13), k = rnd(size_t(S * Hkv * Dk), 14), v = rnd(size_t(S * Hkv * Dv), 15);
      std::vector<int32_t> sel;
      const int64_t n_sel = 6;
      if (variant)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < n_sel; ++j) sel.push_back(j == 5 ? -1 : int32_t((t * 7 + j * 3) % (pos0 + t + 1)));
      // distinct positions per row (the indexer never repeats one)
      if (variant)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < n_sel; ++j)
            for (int64_t i = 0; i < j; ++i)
              if (sel[size_t(t * n_sel + j)] == sel[size_t(t * n_sel + i)]) sel[size_t(t * n_sel + j)] = -1;
      check(variant ? "attention sparse" : "attention gqa", sh, 1e-4, [&](Backend& be) {
        dz::AttnArgs a;
        a.q = be.upload(q.data(), {T, Hq * Dk}, be.act_dtype());
        a.k = be.upload(k.data(), {S, Hkv * Dk}, be.act_dtype());
        a.v = be.upload(v.data(), {S, Hkv * Dv}, be.act_dtype());
        a.out = be.act({T, Hq * Dv});
        if (variant) a.sel = be.upload_i32(sel.data(), {T, n_sel});
        a.pos0 = pos0, a.Hq = Hq, a.Hkv = Hkv, a.Dk = Dk, a.Dv = Dv, a.scale = 0.125f;
        be.attention(a);
        return be.to_host(a.out);
      });
    }
    // AttnRes: 0, 1 and 4 closed blocks
    for (int64_t n : {0, 1, 4}) {
      const int64_t D = 72;
      const auto blocks = rnd(size_t((n + 1) * T * D), 16), part = rnd(size_t(T * D), 17), qv = rnd(size_t(D), 18, 0.3f);
      check("attn_res_mix", sh + " n=" + std::to_string(n), 1e-5, [&](Backend& be) {
        DTensor bl = be.upload(blocks.data(), {n + 1, T, D}, DType::F32), p = be.upload(part.data(), {T, D}, DType::F32);
        DTensor o = be.alloc({T, D}, DType::F32);
        be.attn_res_mix(bl.slab(0, n), n, p, be.upload(qv.data(), {D}, DType::F32), 1e-6f, o);
        return be.to_host(o);
      });
    }
  }
}

// Varlen attention (AttnArgs::cu) and rope_varlen over packed sequences (an empty one among them):
// on cuda equal to one call per sequence bitwise -- the flash kernel's blocks each read one
// (sequence, head, query tile) and its own keys, with the same arithmetic whatever the batch; the
// RoPE kernel rotates every row by the same code, only the position comes from the offsets; the
// warp-per-query kernel (DSA selection, head dims over 256) runs per sequence either way -- and to
// the cpu backend within the attention's 1e-4 / RoPE's 1e-5 NMSE. Offsets of up to 8 values are
// written by a kernel, longer ones uploaded: both are covered.
TEST_CASE("backend ops: varlen attention and RoPE on cuda equal per-sequence calls bitwise and the cpu backend",
          "[gpu]") {
  Both& bk = backends();
  const std::vector<std::vector<int64_t>> lens = {{1, 7, 130}, {1, 0, 7, 130, 19, 300, 3, 5, 64, 2}};
  struct Dims {
    const char* name;
    int64_t Hq, Hkv, Dk, Dv;
    bool sparse;
  };
  const Dims dims[] = {
      {"gqa 4/2 x 64 (flash)", 4, 2, 64, 64, false},   {"mla 4 x 192/128 (flash)", 4, 4, 192, 128, false},
      {"3 x 40/24 (flash)", 3, 3, 40, 24, false},       {"2/1 x 9/7 (flash, scalar loads)", 2, 1, 9, 7, false},
      {"4 x 40/24 DSA (per sequence)", 4, 4, 40, 24, true}, {"2/1 x 288/32 (per sequence)", 2, 1, 288, 32, false},
      {"gqa 4/2 x 128 (flash, wgmma)", 4, 2, 128, 128, false}, {"gqa 4/1 x 256 (flash, wgmma)", 4, 1, 256, 256, false},
  };
  for (const auto& L : lens) {
    std::vector<int64_t> cu = {0};
    for (int64_t n : L) cu.push_back(cu.back() + n);
    const int64_t T = cu.back(), N = int64_t(L.size());
    const std::string sh = "N=" + std::to_string(N) + " T=" + std::to_string(T);
    for (const Dims& d : dims) {
      const int64_t n_sel = 6;
      const auto q = rnd(size_t(T * d.Hq * d.Dk), 21), k = rnd(size_t(T * d.Hkv * d.Dk), 22),
                 v = rnd(size_t(T * d.Hkv * d.Dv), 23);
      std::vector<int32_t> sel(size_t(T * n_sel), -1);  // distinct positions within each sequence
      for (int64_t b = 0; b < N; ++b)
        for (int64_t t = cu[size_t(b)]; t < cu[size_t(b) + 1]; ++t) {
          const int64_t p = t - cu[size_t(b)];
          for (int64_t j = 0; j < n_sel && j <= p; ++j) sel[size_t(t * n_sel + j)] = int32_t((p * 7 + j * (p + 1) / n_sel) % (p + 1));
          for (int64_t j = 0; j < n_sel; ++j)
            for (int64_t i = 0; i < j; ++i)
              if (sel[size_t(t * n_sel + j)] == sel[size_t(t * n_sel + i)]) sel[size_t(t * n_sel + j)] = -1;
        }
      // varlen: one call with the offsets; else one call per sequence on the same tensors
      auto run = [&](Backend& be, bool varlen) {
        dz::AttnArgs a;
        a.q = be.upload(q.data(), {T, d.Hq * d.Dk}, be.act_dtype());
        a.k = be.upload(k.data(), {T, d.Hkv * d.Dk}, be.act_dtype());
        a.v = be.upload(v.data(), {T, d.Hkv * d.Dv}, be.act_dtype());
        a.out = be.zeros({T, d.Hq * d.Dv}, be.act_dtype());
        if (d.sparse) a.sel = be.upload_i32(sel.data(), {T, n_sel});
        a.Hq = d.Hq, a.Hkv = d.Hkv, a.Dk = d.Dk, a.Dv = d.Dv, a.scale = 0.125f;
        a.cu = cu;
        if (varlen) {
          be.attention(a);
        } else {
          for (int64_t b = 0; b < N; ++b) be.attention(a.sequence(b));
        }
        return be.to_host(a.out);
      };
      const std::vector<float> gv = run(*bk.gpu, true), gs = run(*bk.gpu, false), cv = run(*bk.cpu, true);
      const double e = nmse(gv, cv);
      const bool same = gv == gs;
      std::printf("  %-34s %-16s varlen == per sequence (cuda): %s; vs cpu nmse %.2e (tol 1e-4)\n", d.name,
                  sh.c_str(), same ? "bitwise" : "DIFFERENT", e);
      INFO(d.name << " " << sh);
      CHECK(same);
      CHECK(e <= 1e-4);
    }
    for (bool inter : {false, true}) {
      dz::RopeConfig rc;
      rc.theta = 10000.f;
      rc.style = inter ? dz::RopeStyle::Interleaved : dz::RopeStyle::NeoX;
      const int64_t H = 3, hs = 24, rot = 16, off = inter ? 8 : 0;
      const dz::Rope rope(rc, rot);
      const auto x = rnd(size_t(T * H * hs), 24);
      auto run = [&](Backend& be, bool varlen) {
        DTensor a = be.upload(x.data(), {T, H * hs}, be.act_dtype());
        if (varlen) {
          be.rope_varlen(rope, a, H, hs, off, cu);
        } else {
          for (int64_t b = 0; b < N; ++b)
            if (cu[size_t(b) + 1] > cu[size_t(b)]) be.rope(rope, a.slab(cu[size_t(b)], cu[size_t(b) + 1]), H, hs, off, 0);
        }
        return be.to_host(a);
      };
      const std::vector<float> gv = run(*bk.gpu, true), gs = run(*bk.gpu, false), cv = run(*bk.cpu, true);
      const double e = nmse(gv, cv);
      std::printf("  %-34s %-16s varlen == per sequence (cuda): %s; vs cpu nmse %.2e (tol 1e-5)\n",
                  inter ? "rope_varlen interleaved" : "rope_varlen neox partial", sh.c_str(),
                  gv == gs ? "bitwise" : "DIFFERENT", e);
      CHECK(gv == gs);
      CHECK(e <= 1e-5);
      // rope_rows (a decode step: row t at its own position): one launch == rope() per row
      std::vector<int64_t> pos(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = (t * 37 + 5) % 1000;
      auto rows = [&](Backend& be, bool one) {
        DTensor a = be.upload(x.data(), {T, H * hs}, be.act_dtype());
        if (one)
          be.rope_rows(rope, a, H, hs, off, pos);
        else
          for (int64_t t = 0; t < T; ++t) be.rope(rope, a.slab(t, t + 1), H, hs, off, pos[size_t(t)]);
        return be.to_host(a);
      };
      const std::vector<float> gr = rows(*bk.gpu, true), gp = rows(*bk.gpu, false), cr = rows(*bk.cpu, true);
      const double er = nmse(gr, cr);
      std::printf("  %-34s %-16s rows == per row (cuda): %s; vs cpu nmse %.2e (tol 1e-5)\n",
                  inter ? "rope_rows interleaved" : "rope_rows neox partial", sh.c_str(),
                  gr == gp ? "bitwise" : "DIFFERENT", er);
      CHECK(gr == gp);
      CHECK(er <= 1e-5);
    }
  }
}

// head_matmul: y[t, h*y_hs ..+n) = x[t, h*x_hs ..+k) · M_h, M_h a block of W (or its transpose).
// One GEMM per head in fp32 (cuBLAS: its own order, maybe split-K) and one bf16 rounding of the
// output (~3e-6 NMSE): the linear's 1e-4. y starts random and is compared whole, so the columns
// between heads (the rope part of the absorbed queries) must be left as they were on both.
TEST_CASE("backend ops: head_matmul (per-head strided-batched products) on cuda equals the cpu backend", "[gpu]") {
  struct Case {
    std::string name;
    int64_t H, k, n, x_hs, xc, w0, w_hs, Wr, Wc, y_hs, yc;
    bool trans;
  };
  std::vector<Case> cases;
  // the absorbed MLA's two products on kv_b_proj W [H*(nope+vd), R] (rows of head h: its nope
  // rows W_uk[h] [nope, R], then its vd rows W_uv[h] [vd, R])
  const int64_t mla[][5] = {{128, 64, 512, 128, 32}, {16, 16, 32, 16, 4}};  // nope, rope, R, vd, H
  for (const auto& m : mla) {
    const int64_t nope = m[0], rope = m[1], R = m[2], vd = m[3], H = m[4], w = nope + vd;
    const std::string dims = "nope=" + std::to_string(nope) + " R=" + std::to_string(R) + " H=" + std::to_string(H);
    // q_abs[t, h, :R] = q_nope[t, h] · W_uk[h]      x = q [T, H*(nope+rope)], y = [T, H*(R+rope)]
    cases.push_back({"W_uk " + dims, H, nope, R, nope + rope, H * (nope + rope), 0, w * R, H * w, R, R + rope,
                     H * (R + rope), false});
    // o[t, h, :vd] = o_lat[t, h] · W_uv[h]^T      x = [T, H*R], y = [T, H*vd]
    cases.push_back({"W_uv " + dims, H, R, vd, R, H * R, nope * R, w * R, H * w, R, vd, H * vd, true});
  }
  // odd sizes, gaps between heads and after the last one, element offsets into W, n = 1
  for (bool tr : {false, true}) {
    cases.push_back({"odd", 3, 37, 19, 41, 3 * 41 + 2, 2, 37 * 19 + 5, 3, 37 * 19 + 5, 22, 3 * 22 + 1, tr});
    cases.push_back({"n=1", 5, 64, 1, 64, 5 * 64, 0, 64, 5, 64, 1, 5, tr});
  }
  for (const Case& c : cases)
    for (int64_t T : {1, 5, 300}) {
      const auto x = rnd(size_t(T * c.xc), 101), W = rnd(size_t(c.Wr * c.Wc), 102, 0.05f), y0 = rnd(size_t(T * c.yc), 103);
      const std::string sh = c.name + (c.trans ? " (W^T)" : "") + " T=" + std::to_string(T);
      check("head_matmul", sh, 1e-4, [&](Backend& be) {
        DTensor a = be.upload(x.data(), {T, c.xc}, be.act_dtype()), Wt = be.upload(W.data(), {c.Wr, c.Wc}, be.weight_dtype());
        DTensor y = be.upload(y0.data(), {T, c.yc}, be.act_dtype());
        be.head_matmul(a, c.x_hs, c.k, Wt, c.w0, c.w_hs, c.trans, y, c.y_hs, c.n, c.H);
        return be.to_host(y);
      });
    }
}

namespace {

// One mla_latent_attention case: T queries at pos0 = S - T over S cache rows; K = 0: dense
// causal, else a DSA-like selection [T, K] per query: distinct visible positions ascending, -1
// padded (some rows shorter, one row all -1 when T > 2: zeros). The cache is a RowStore as the
// model keeps it (pos0 rows appended, then T: capacities in whole pages of 64 rows).
void run_mla_latent(int64_t R, int64_t DR, int64_t H, int64_t S, int64_t T, int64_t K, bool host_sel = false) {
  Both& b = backends();
  const int64_t Dk = R + DR, pos0 = S - T;
  const float scale = 1.f / std::sqrt(float(Dk));
  const auto q = rnd(size_t(T * H * Dk), uint32_t(201 + S + H)), kv = rnd(size_t(S * Dk), uint32_t(202 + S + R));
  std::vector<int32_t> sel;
  if (K > 0) {
    std::mt19937 g(uint32_t(203 + T + K));
    std::vector<int32_t> cand;
    sel.assign(size_t(T * K), -1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos0 + t;
      if (T > 2 && t == 2) continue;                                    // nothing selected: zeros
      const int64_t m = std::min<int64_t>(p + 1, t % 3 == 1 ? K - K / 4 : K);  // some rows padded
      cand.resize(size_t(p + 1));
      std::iota(cand.begin(), cand.end(), 0);
      for (int64_t j = 0; j < m; ++j) {  // partial Fisher-Yates: m distinct positions
        std::uniform_int_distribution<int64_t> u(j, p);
        std::swap(cand[size_t(j)], cand[size_t(u(g))]);
      }
      std::sort(cand.begin(), cand.begin() + m);
      std::copy(cand.begin(), cand.begin() + m, sel.begin() + t * K);
    }
  }
  auto run = [&](Backend& be) {
    dz::RowStore cache;  // [c | k_pe] rows
    cache.init(be, Dk, be.act_dtype());
    const DTensor all = be.upload(kv.data(), {S, Dk}, be.act_dtype());
    if (pos0 > 0) be.copy_rows(all, 0, cache.append(pos0), 0, pos0);
    be.copy_rows(all, pos0, cache.append(T), 0, T);
    REQUIRE(cache.buf.dim(0) % 64 == 0);
    DTensor qt = be.upload(q.data(), {T, H * Dk}, be.act_dtype()), out = be.act({T, H * R}), st;
    if (K > 0 && host_sel && &be == b.gpu.get()) {  // a host selection: the cuda backend uploads it
      st.data = sel.data();
      st.dtype = DType::I32;
      st.device = dz::Device::Host;
      st.shape = {T, K};
    } else if (K > 0) {
      st = be.upload_i32(sel.data(), {T, K});
    }
    be.mla_latent_attention(qt, cache.all(), st, pos0, H, R, DR, scale, out);
    return be.to_host(out);
  };
  const std::vector<float> ref = run(*b.cpu), got = run(*b.gpu);
  REQUIRE(got.size() == ref.size());
  double max_err = 0, ref_max = 0, se = 0, sr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    max_err = std::max(max_err, d);
    ref_max = std::max(ref_max, double(std::fabs(ref[i])));
    se += d * d;
    sr += double(ref[i]) * ref[i];
  }
  const double rel_rms = std::sqrt(se / std::max(sr, 1e-30));
  const bool fast = dz::cuda::sparse_mla_supports(int32_t(R), int32_t(DR));
  const int64_t ns = fast ? dz::cuda::sparse_mla_scratch_elems(T, int32_t(H), int32_t(R), int32_t(K ? K : S)) : 0;
  const int64_t parts = ns > 0 ? ns / (T * H * (R + 1)) : 1;
  char what[160];
  std::snprintf(what, sizeof what, "R=%lld DR=%lld H=%lld S=%lld T=%lld pos0=%lld %s%s", (long long)R, (long long)DR,
                (long long)H, (long long)S, (long long)T, (long long)pos0, K ? "K=" : "dense",
                K ? (std::to_string(K) + (host_sel ? " (host sel)" : "")).c_str() : "");
  std::printf("  mla_latent_attn  %-52s %s (split-KV parts <= %lld): max abs err %.3g (ref max %.3g), rel rms %.3g\n",
              what, fast ? "sparse_mla" : "generic   ", (long long)parts, max_err, ref_max, rel_rms);
  INFO(what << " max abs err " << max_err << " ref max " << ref_max << " rel rms " << rel_rms);
  CHECK(max_err <= 1e-2 * std::max(ref_max, 0.1));
  CHECK(rel_rms <= 1e-2);
}

}  // namespace

// The absorbed MLA's attention on the latent cache: (512, 64), (128, 64) and (512, 0) run kernels/sparse_mla
// on the cache rows (dense causal or the selection; split-KV for T = 1 and small T), other sizes
// the generic attention op. Prefill (pos0 = 0, T = S), decode (T = 1 at S - 1) and a few queries
// at the end of the context (pos0 = S - T).
TEST_CASE("backend ops: mla_latent_attention on cuda equals the cpu backend", "[gpu]") {
  std::printf("mla_latent_attention (cuda vs cpu):\n");
  struct Shape3 {
    int64_t S, T;
  };
  const Shape3 kinds[] = {{160, 160}, {4099, 1}, {1000, 5}};  // prefill, decode, a few queries
  for (int64_t H : {16, 32, 64, 128})
    for (const Shape3& k : kinds)
      for (int64_t K : {int64_t(0), k.T == 160 ? int64_t(64) : int64_t(256)}) run_mla_latent(512, 64, H, k.S, k.T, K);
  for (const Shape3& k : kinds)
    for (int64_t K : {int64_t(0), int64_t(64)}) {
      run_mla_latent(128, 64, 20, k.S, k.T, K);
      run_mla_latent(512, 0, 64, k.S, k.T, K);  // MLA without RoPE (GLM-5.3-Flash)
      run_mla_latent(32, 16, 8, k.S, k.T, K);  // not a sparse_mla size: the generic attention op
    }
  // long decodes: split-KV over up to 128 parts (dense), the DeepSeek selection width, a host
  // selection
  run_mla_latent(512, 64, 16, 70001, 1, 0);
  run_mla_latent(512, 64, 128, 70001, 1, 0);
  run_mla_latent(512, 64, 128, 70001, 1, 2048);
  run_mla_latent(512, 64, 64, 70001, 3, 2048, true);
  run_mla_latent(128, 64, 20, 70001, 1, 0);
  run_mla_latent(512, 0, 64, 70001, 1, 0);
  run_mla_latent(512, 0, 64, 8192, 300, 2063);  // GLM-5.3-Flash's k-pool width (2048 + 15 tail)
  run_mla_latent(32, 16, 8, 70001, 1, 0);
}

TEST_CASE("backend ops: DSA indexer pieces (LayerNorm, quantisation round trips, Top-K) on cuda equal the cpu backend",
          "[gpu]") {
  Both& b = backends();
  for (int64_t T : kRows) {
    const std::string sh = "T=" + std::to_string(T);
    const int64_t D = 64;
    const auto x = rnd(size_t(T * D), 71), w = rnd(size_t(D), 72), bias = rnd(size_t(D), 73);
    check("layer_norm", sh, 1e-5, [&](Backend& be) {
      DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), o = be.act({T, D});
      be.layer_norm(a, be.upload(w.data(), {D}, DType::F32), be.upload(bias.data(), {D}, DType::F32), o, 1e-6f);
      return be.to_host(o);
    });
    // MXFP8 values fit bf16: the round trip is bit-exact on both. Per-tile FP8 values (code x fp32
    // scale) are rounded to bf16 once more on the GPU: one rounding, 1e-5.
    check("quant mxfp8", sh + " n=160", 0.0, [&](Backend& be) {
      const auto v = rnd(size_t(T * 160), 74, 3.f);
      DTensor a = be.upload(v.data(), {T, 160}, be.act_dtype());
      be.quant_round(a, Backend::Round::Mxfp8);
      return be.to_host(a);
    });
    check("quant kv fp8", sh + " n=300", 1e-5, [&](Backend& be) {
      const auto v = rnd(size_t(T * 300), 75, 3.f);
      DTensor a = be.upload(v.data(), {T, 300}, be.act_dtype());
      be.quant_round(a, Backend::Round::KvFp8);
      return be.to_host(a);
    });
  }
  // Top-K: the two backends score in a different order (fp32 sums), so a near-tie may swap one
  // position; sets are compared as sets: at least 99% of the selected positions agree, and every
  // row is a valid selection (ascending, -1 only as padding, inside the causal range).
  struct Case {
    int64_t H, D, K, pos0, T;
  };
  // D 64 / 128: H 16 / 32 / 64 the wgmma scorer (H 32 / 64 with the histogram Top-K while rows
  // have < 65536 keys: the last case is past that), other H the fused mma.sync indexer; the rest:
  // the plain scorer.
  const Case cases[] = {{16, 32, 8, 0, 300},    {2, 32, 16, 5, 733}, {4, 64, 256, 0, 1000},
                        {16, 64, 256, 0, 1000}, {64, 128, 64, 100, 19}, {8, 128, 32, 0, 1},
                        {16, 128, 32, 0, 1},    {32, 128, 2048, 0, 3000}, {32, 64, 128, 70000, 5}};
  for (const Case& c : cases) {
    const int64_t S = c.pos0 + c.T;
    const auto q = rnd(size_t(c.T * c.H * c.D), 81), k = rnd(size_t(S * c.D), 82), w = rnd(size_t(c.T * c.H), 83);
    std::vector<int32_t> sel[2];
    Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
    for (int i = 0; i < 2; ++i) {
      Backend& be = *bes[i];
      dz::RowStore keys;  // the cache the model keeps (pages of 64 rows for the fused kernel)
      keys.init(be, c.D, be.act_dtype());
      be.copy_rows(be.upload(k.data(), {S, c.D}, be.act_dtype()), 0, keys.append(S), 0, S);
      DTensor out = be.alloc({c.T, c.K}, DType::I32);
      be.indexer_topk(be.upload(q.data(), {c.T, c.H * c.D}, be.act_dtype()), be.upload(w.data(), {c.T, c.H}, DType::F32),
                      0.05f, keys.all(), c.pos0, c.H, c.K, out);
      sel[i].resize(size_t(c.T * c.K));
      be.download_i32(out, sel[i].data());
    }
    int64_t agree = 0, total = 0;
    for (int64_t t = 0; t < c.T; ++t) {
      const int32_t* g = sel[1].data() + t * c.K;
      const int32_t* r = sel[0].data() + t * c.K;
      const int64_t m = std::min<int64_t>(c.K, c.pos0 + t + 1);  // selected; -1 padding after them
      for (int64_t j = 0; j < c.K; ++j) {
        REQUIRE((j < m) == (g[j] >= 0));
        if (j > 0 && j < m) REQUIRE(g[j] > g[j - 1]);
        REQUIRE(g[j] <= c.pos0 + t);
        if (r[j] < 0) continue;
        ++total;
        agree += std::binary_search(g, g + m, r[j]) ? 1 : 0;
      }
    }
    const double frac = total ? double(agree) / double(total) : 1.0;
    std::printf("  indexer_topk     H=%lld D=%lld K=%lld T=%lld pos0=%lld: %.4f of the cpu selection\n", (long long)c.H,
                (long long)c.D, (long long)c.K, (long long)c.T, (long long)c.pos0, frac);
    CHECK(frac >= 0.99);
  }
}

// GLM-5.3-Flash's k-pool selection: the same group choices on both backends (sets compared as in
// indexer_topk: >= 99% of the selected positions agree; every row a valid selection: ascending,
// whole groups then the query's incomplete group, -1 only as padding).
TEST_CASE("backend ops: k-pool DSA selection on cuda equals the cpu backend", "[gpu]") {
  Both& b = backends();
  struct Case {
    int64_t H, D, P, Kp, pos0, T;
    bool tail;
  };
  const Case cases[] = {{16, 32, 4, 4, 0, 130, true}, {4, 64, 16, 8, 5, 733, true}, {32, 128, 16, 128, 0, 3000, true},
                        {8, 32, 4, 2, 40, 19, false}, {16, 32, 4, 4, 200, 1, true},
                        {4, 32, 4, 8, 3000, 17000, true}};  // 5000 groups: 3 query blocks of the GEMM scratch
  for (const Case& c : cases) {
    const int64_t S = c.pos0 + c.T, W = c.Kp * c.P + (c.tail ? c.P - 1 : 0);
    const auto q = rnd(size_t(c.T * c.H * c.D), 91), cache = rnd(size_t(S * 2 * c.D), 92),
               w = rnd(size_t(c.T * c.H), 93), ape = rnd(size_t(c.P * c.D), 94);
    std::vector<int32_t> sel[2];
    Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
    for (int i = 0; i < 2; ++i) {
      Backend& be = *bes[i];
      DTensor out = be.alloc({c.T, W}, DType::I32);
      be.indexer_kpool_topk(be.upload(q.data(), {c.T, c.H * c.D}, be.act_dtype()),
                            be.upload(w.data(), {c.T, c.H}, DType::F32), 0.05f,
                            be.upload(cache.data(), {S, 2 * c.D}, be.act_dtype()),
                            be.upload(ape.data(), {c.P, c.D}, DType::F32), c.P, c.pos0, c.H, c.Kp, c.tail, out);
      sel[i].resize(size_t(c.T * W));
      be.download_i32(out, sel[i].data());
    }
    int64_t agree = 0, total = 0;
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t s = c.pos0 + t, nvis = (s + 1) / c.P, m = std::min(nvis, c.Kp) * c.P + (c.tail ? (s + 1) % c.P : 0);
      const int32_t* g = sel[1].data() + t * W;
      const int32_t* r = sel[0].data() + t * W;
      for (int64_t j = 0; j < W; ++j) {
        REQUIRE((j < m) == (g[j] >= 0));
        if (j > 0 && j < m) REQUIRE(g[j] > g[j - 1]);
        REQUIRE(g[j] <= s);
        if (r[j] < 0) continue;
        ++total;
        agree += std::binary_search(g, g + m, r[j]) ? 1 : 0;
      }
    }
    const double frac = total ? double(agree) / double(total) : 1.0;
    std::printf("  indexer_kpool    H=%lld D=%lld P=%lld Kp=%lld T=%lld pos0=%lld: %.4f of the cpu selection\n",
                (long long)c.H, (long long)c.D, (long long)c.P, (long long)c.Kp, (long long)c.T, (long long)c.pos0, frac);
    CHECK(frac >= 0.99);
  }
}

// mHC: coefficients + collapse, the expand-and-mix, the start and the mean head, on both backends.
// DeepSeek-V4's pieces: the compressors' softmax pooling, the indexer's group Top-K over
// compressed entries (sets: >= 99% agree, as the other indexers), and the attention over the
// sliding window plus compressed entries with sinks (CSA: a selection; HCA: every closed entry;
// the window alone), at the golden's sizes and the published head of 512.
TEST_CASE("backend ops: DeepSeek-V4 pooling + group Top-K + attention on cuda equal the cpu backend", "[gpu]") {
  Both& b = backends();
  for (int64_t P : {4, 8, 128}) {
    const int64_t D = 64, S = P * 37;
    const auto src = rnd(size_t(S * 2 * D), 301), ape = rnd(size_t(P * D), 302);
    check("pool_softmax", "P=" + std::to_string(P) + " groups=37", 1e-4, [&](Backend& be) {
      DTensor o = be.act({S / P, D});
      be.pool_softmax(be.upload(src.data(), {S, 2 * D}, be.act_dtype()), be.upload(ape.data(), {P, D}, DType::F32), P, o);
      return be.to_host(o);
    });
  }
  struct G {
    int64_t H, D, P, K, pos0, T;
  };
  for (const G& c : {G{16, 16, 4, 4, 0, 130}, G{64, 128, 4, 512, 0, 4000}, G{8, 32, 4, 8, 900, 7}}) {
    const int64_t NG = (c.pos0 + c.T) / c.P;
    const auto q = rnd(size_t(c.T * c.H * c.D), 311), w = rnd(size_t(c.T * c.H), 312), k = rnd(size_t(NG * c.D), 313);
    std::vector<int32_t> sel[2];
    Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
    for (int i = 0; i < 2; ++i) {
      Backend& be = *bes[i];
      DTensor out = be.alloc({c.T, c.K}, DType::I32);
      be.group_topk(be.upload(q.data(), {c.T, c.H * c.D}, be.act_dtype()), be.upload(w.data(), {c.T, c.H}, DType::F32),
                    0.1f, be.upload(k.data(), {NG, c.D}, be.act_dtype()), c.P, c.pos0, c.H, c.K, out);
      sel[i].resize(size_t(c.T * c.K));
      be.download_i32(out, sel[i].data());
    }
    int64_t agree = 0, total = 0;
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t nvis = (c.pos0 + t + 1) / c.P, m = std::min(nvis, c.K);
      const int32_t* g = sel[1].data() + t * c.K;
      for (int64_t j = 0; j < c.K; ++j) {
        REQUIRE((j < m) == (g[j] >= 0));
        if (j > 0 && j < m) REQUIRE(g[j] > g[j - 1]);
        REQUIRE(g[j] < nvis);
        const int32_t r = sel[0][size_t(t * c.K + j)];
        if (r < 0) continue;
        ++total;
        agree += std::binary_search(g, g + m, r) ? 1 : 0;
      }
    }
    const double frac = total ? double(agree) / double(total) : 1.0;
    std::printf("  group_topk       H=%lld D=%lld P=%lld K=%lld T=%lld pos0=%lld: %.4f of the cpu selection\n",
                (long long)c.H, (long long)c.D, (long long)c.P, (long long)c.K, (long long)c.T, (long long)c.pos0, frac);
    CHECK(frac >= 0.99);
  }
  struct A {
    const char* name;
    int64_t H, D, W, m, K, pos0, T;  // K > 0: a CSA selection; K == 0 and m > 0: HCA; m == 0: window only
  };
  for (const A& c : {A{"CSA", 4, 32, 8, 4, 4, 0, 130}, A{"HCA", 4, 32, 8, 16, 0, 0, 130}, A{"window", 4, 32, 8, 0, 0, 0, 70},
                     A{"CSA decode", 64, 512, 128, 4, 512, 4095, 1}, A{"HCA 512", 16, 512, 128, 128, 0, 0, 1000},
                     A{"CSA chunk", 16, 512, 128, 4, 64, 300, 50}}) {
    const int64_t S = c.pos0 + c.T, NC = c.m > 0 ? S / c.m : 0;
    const auto q = rnd(size_t(c.T * c.H * c.D), 321), raw = rnd(size_t(S * c.D), 322), comp = rnd(size_t(NC * c.D), 323),
               sink = rnd(size_t(c.H), 324);
    std::vector<int32_t> sel;
    if (c.K > 0) {  // distinct closed entries per query, ascending, -1 padded
      std::mt19937 g(325);
      sel.assign(size_t(c.T * c.K), -1);
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t nv = (c.pos0 + t + 1) / c.m;
        std::vector<int32_t> e(static_cast<size_t>(nv));
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), g);
        e.resize(size_t(std::min(nv, c.K - (t % 3))));
        std::sort(e.begin(), e.end());
        std::copy(e.begin(), e.end(), sel.begin() + t * c.K);
      }
    }
    check("dsv4_attention", std::string(c.name) + " H=" + std::to_string(c.H) + " D=" + std::to_string(c.D) + " T=" +
                                std::to_string(c.T), 1e-4, [&](Backend& be) {
      DTensor o = be.act({c.T, c.H * c.D});
      be.dsv4_attention(be.upload(q.data(), {c.T, c.H * c.D}, be.act_dtype()), be.upload(raw.data(), {S, c.D}, be.act_dtype()),
                        NC ? be.upload(comp.data(), {NC, c.D}, be.act_dtype()) : DTensor{},
                        c.K ? be.upload_i32(sel.data(), {c.T, c.K}) : DTensor{}, be.upload(sink.data(), {c.H}, DType::F32),
                        c.pos0, c.H, c.W, c.m, float(1.0 / std::sqrt(double(c.D))), o);
      return be.to_host(o);
    });
  }
}

TEST_CASE("backend ops: mHC hyper-connections on cuda equal the cpu backend", "[gpu]") {
  // D = 96: 16-byte chunks, all in registers; 4608: past the kernel's register cache (4096 columns),
  // so the tail is read again; 4102: D % 4 != 0, the scalar kernels. hc_post_pre at N = 4 with
  // D = 256 / 4608 (D % 128 == 0) runs the fused post + projection + coefficients kernel (16-token
  // blocks: T = 733 ends inside one) and the collapse fused with the norm (4608: its tail collapsed
  // again), the other shapes hc_post + hc_pre + rmsnorm. The normed input is in the act dtype (bf16
  // on the GPU): its tolerance is bf16 rounding's (NMSE ~1e-6).
  for (int64_t D : {96, 256, 4608, 4102})
  for (int64_t N : {4, 1, 8})
    for (int64_t T : kRows) {
      if (D == 256 && N != 4) continue;
      if (D > 256 && (N != 4 || T > 19)) continue;
      const int64_t C = (2 + N) * N;
      const std::string sh = "N=" + std::to_string(N) + " T=" + std::to_string(T) + " D=" + std::to_string(D);
      const auto x = rnd(size_t(T * N * D), 101), fn = rnd(size_t(C * N * D), 102, 0.15f), base = rnd(size_t(C), 103, 0.3f),
                 scale = rnd(size_t(3), 104, 0.3f), y = rnd(size_t(T * D), 105);
      dz::HcParams hp;
      hp.N = N, hp.iters = 20, hp.eps_norm = 1e-5f, hp.eps_hc = 1e-6f;
      for (int part = 0; part < 3; ++part)
        check(part == 0 ? "hc_pre coeff" : part == 1 ? "hc_pre in" : "hc_post", sh, 1e-5, [&](Backend& be) {
          DTensor xs = be.upload(x.data(), {T, N * D}, DType::F32), coeff = be.alloc({T, C}, DType::F32),
                  in = be.alloc({T, D}, DType::F32);
          std::vector<float> sc(scale);
          for (float& v : sc) v += 1.f;
          be.hc_pre(xs, be.upload(fn.data(), {C, N * D}, DType::F32), be.upload(base.data(), {C}, DType::F32),
                    be.upload(sc.data(), {3}, DType::F32), hp, coeff, in);
          if (part == 0) return be.to_host(coeff);
          if (part == 1) return be.to_host(in);
          be.hc_post(xs, coeff, be.upload(y.data(), {T, D}, be.act_dtype()), N);
          return be.to_host(xs);
        });
      const auto fn2 = rnd(size_t(C * N * D), 106, 0.15f), base2 = rnd(size_t(C), 107, 0.3f);
      const auto nw = rnd(size_t(D), 108, 0.5f);
      for (int part = 0; part < 4; ++part)
        check(part == 0   ? "hc_post_pre streams"
              : part == 1 ? "hc_post_pre coeff"
              : part == 2 ? "hc_post_pre normed"
                          : "hc_post_pre normed zc",
              sh, 1e-5, [&](Backend& be) {
          DTensor xs = be.upload(x.data(), {T, N * D}, DType::F32), coeff = be.alloc({T, C}, DType::F32),
                  in = be.alloc({T, D}, DType::F32), normed = be.act({T, D});
          std::vector<float> sc(scale);
          for (float& v : sc) v += 1.f;
          const DTensor scd = be.upload(sc.data(), {3}, DType::F32);
          be.hc_pre(xs, be.upload(fn.data(), {C, N * D}, DType::F32), be.upload(base.data(), {C}, DType::F32), scd, hp,
                    coeff, in);
          // the sub-layer's output, then the next sub-layer's pre into the same coeff / in buffers
          be.hc_post_pre(xs, coeff, be.upload(y.data(), {T, D}, be.act_dtype()), N,
                         be.upload(fn2.data(), {C, N * D}, DType::F32), be.upload(base2.data(), {C}, DType::F32), scd,
                         hp, coeff, in, {be.upload(nw.data(), {D}, DType::F32), 1e-5f, part == 3, normed});
          return be.to_host(part == 0 ? xs : part == 1 ? coeff : normed);
        });
      check("hc_expand + hc_mean", sh, 1e-6, [&](Backend& be) {
        DTensor h = be.upload(y.data(), {T, D}, DType::F32), xs = be.alloc({T, N * D}, DType::F32),
                out = be.alloc({T, D}, DType::F32);
        be.hc_expand(h, N, xs);
        be.hc_mean(be.upload(x.data(), {T, N * D}, DType::F32), N, out);
        std::vector<float> a = be.to_host(xs), m = be.to_host(out);
        a.insert(a.end(), m.begin(), m.end());
        return a;
      });
      // The first sub-layer, every stream the embedding h (on cuda never expanded: the projection
      // through the summed fn blocks, the post reading h for each old stream), and the last with
      // the mean head (the streams' mean, the streams not written).
      const auto hv = rnd(size_t(T * D), 109);
      for (int part = 0; part < 5; ++part)
        check(part == 0   ? "hc_pre_expand coeff"
              : part == 1 ? "hc_pre_expand in"
              : part == 2 ? "hc_post_pre_expand streams"
              : part == 3 ? "hc_post_pre_expand coeff"
                          : "hc_post_pre_expand normed",
              sh, 1e-5, [&](Backend& be) {
          DTensor h = be.upload(hv.data(), {T, D}, DType::F32), xs = be.alloc({T, N * D}, DType::F32),
                  coeff = be.alloc({T, C}, DType::F32), in = be.alloc({T, D}, DType::F32), normed = be.act({T, D});
          std::vector<float> sc(scale);
          for (float& v : sc) v += 1.f;
          const DTensor scd = be.upload(sc.data(), {3}, DType::F32);
          be.hc_pre_expand(h, N, xs, be.upload(fn.data(), {C, N * D}, DType::F32), be.upload(base.data(), {C}, DType::F32),
                           scd, hp, coeff, in);
          if (part == 0) return be.to_host(coeff);
          if (part == 1) return be.to_host(in);
          be.hc_post_pre_expand(h, xs, coeff, be.upload(y.data(), {T, D}, be.act_dtype()), N,
                                be.upload(fn2.data(), {C, N * D}, DType::F32), be.upload(base2.data(), {C}, DType::F32),
                                scd, hp, coeff, in, {be.upload(nw.data(), {D}, DType::F32), 1e-5f, false, normed});
          return be.to_host(part == 2 ? xs : part == 3 ? coeff : normed);
        });
      check("hc_post_mean", sh, 1e-5, [&](Backend& be) {
        DTensor xs = be.upload(x.data(), {T, N * D}, DType::F32), coeff = be.alloc({T, C}, DType::F32),
                in = be.alloc({T, D}, DType::F32), out = be.alloc({T, D}, DType::F32);
        std::vector<float> sc(scale);
        for (float& v : sc) v += 1.f;
        be.hc_pre(xs, be.upload(fn.data(), {C, N * D}, DType::F32), be.upload(base.data(), {C}, DType::F32),
                  be.upload(sc.data(), {3}, DType::F32), hp, coeff, in);
        be.hc_post_mean(xs, coeff, be.upload(y.data(), {T, D}, be.act_dtype()), N, out);
        return be.to_host(out);
      });
      {  // on cuda bitwise the two calls it fuses
        Backend& be = *backends().gpu;
        DTensor x1 = be.upload(x.data(), {T, N * D}, DType::F32), x2 = be.upload(x.data(), {T, N * D}, DType::F32),
                coeff = be.alloc({T, C}, DType::F32), in = be.alloc({T, D}, DType::F32),
                o1 = be.alloc({T, D}, DType::F32), o2 = be.alloc({T, D}, DType::F32),
                ya = be.upload(y.data(), {T, D}, be.act_dtype());
        std::vector<float> sc(scale);
        for (float& v : sc) v += 1.f;
        be.hc_pre(x1, be.upload(fn.data(), {C, N * D}, DType::F32), be.upload(base.data(), {C}, DType::F32),
                  be.upload(sc.data(), {3}, DType::F32), hp, coeff, in);
        be.hc_post_mean(x1, coeff, ya, N, o1);
        be.hc_post(x2, coeff, ya, N);
        be.hc_mean(x2, N, o2);
        INFO("hc_post_mean vs hc_post + hc_mean on cuda, " << sh);
        CHECK(be.to_host(o1) == be.to_host(o2));
      }
    }
}

namespace {
struct LaCase {
  bool kda;
  int64_t HK, HV, K, V;
  float lb;
};
// Random scan inputs for T rows of case c (seeds from s0) and the scan's arguments on a backend
// (q / k / v / beta / gate uploaded; state and output left to the caller).
struct LaInputs {
  std::vector<float> q, k, v, b, f, A_log, dtb;
};
LaInputs la_inputs(const LaCase& c, int64_t T, uint32_t s0) {
  const int64_t KD = c.HK * c.K, VD = c.HV * c.V, GK = c.kda ? c.HV * c.K : c.HV;
  LaInputs in{rnd(size_t(T * KD), s0), rnd(size_t(T * KD), s0 + 1), rnd(size_t(T * VD), s0 + 2),
              rnd(size_t(T * c.HV), s0 + 3), rnd(size_t(T * GK), s0 + 4), std::vector<float>(size_t(c.HV)),
              std::vector<float>(size_t(GK))};
  for (int64_t h = 0; h < c.HV; ++h) in.A_log[size_t(h)] = 0.3f * float(h + 1);
  for (int64_t i = 0; i < GK; ++i) in.dtb[size_t(i)] = -2.f + 0.01f * float(i % 50);
  return in;
}
dz::LaScanArgs la_args(Backend& be, const LaCase& c, const LaInputs& in, int64_t T) {
  const int64_t KD = c.HK * c.K, VD = c.HV * c.V, GK = c.kda ? c.HV * c.K : c.HV;
  dz::LaScanArgs a;
  a.kda = c.kda;
  a.HK = c.HK, a.HV = c.HV, a.K = c.K, a.V = c.V;
  a.scale = 1.f / std::sqrt(float(c.K));
  a.q = be.upload(in.q.data(), {T, KD}, be.act_dtype());
  a.k = be.upload(in.k.data(), {T, KD}, be.act_dtype());
  a.v = be.upload(in.v.data(), {T, VD}, be.act_dtype());
  a.beta = be.upload(in.b.data(), {T, c.HV}, be.act_dtype());
  a.gate = dz::LaGateArgs{be.upload(in.f.data(), {T, GK}, be.act_dtype()), be.upload(in.A_log.data(), {c.HV}, DType::F32),
                          be.upload(in.dtb.data(), {GK}, DType::F32), c.lb};
  return a;
}
}  // namespace

TEST_CASE("backend ops: short conv and the linear-attention scan on cuda equal the cpu backend", "[gpu]") {
  using Case = LaCase;
  // K = V = 16 / 32: the token-by-token kernel; 64 / 128: the chunked (and, at T = 1, decode) kernels.
  const Case cases[] = {{true, 2, 2, 16, 16, 0.f}, {true, 2, 2, 32, 32, -5.f}, {false, 1, 2, 16, 16, 0.f},
                        {true, 2, 2, 64, 64, 0.f},  {true, 1, 1, 128, 128, -5.f}, {false, 2, 4, 128, 128, 0.f}};
  for (const Case& c : cases)
    for (int64_t T : {int64_t(1), int64_t(3), int64_t(19), int64_t(64), int64_t(200), int64_t(733)}) {
      const std::string sh = std::string(c.kda ? "KDA" : "GDN") + " K=" + std::to_string(c.K) + " HV=" +
                             std::to_string(c.HV) + " T=" + std::to_string(T) + (c.lb < 0 ? " lb" : "");
      const int64_t VD = c.HV * c.V;
      const LaInputs in = la_inputs(c, T, 21);
      const auto h0 = rnd(size_t(c.HV * c.K * c.V), 26, 0.1f);
      auto run = [&](Backend& be, bool want_state) {
        dz::LaScanArgs a = la_args(be, c, in, T);
        a.state = be.upload(h0.data(), {c.HV, c.K, c.V}, DType::F32);
        a.o = be.act({T, VD});
        be.la_scan(a);
        return be.to_host(want_state ? a.state : a.o);
      };
      check("la_scan output", sh, 5e-4, [&](Backend& be) { return run(be, false); });
      check("la_scan state", sh, 1e-4, [&](Backend& be) { return run(be, true); });
      // The scan keeping every row's state (speculative decoding's per-token restore): outputs and
      // the [T, HV, K, V] states, held to la_scan's tolerances (short verify lengths only).
      if (T <= 19) {
        auto run_states = [&](Backend& be, bool want_states) {
          dz::LaScanArgs a = la_args(be, c, in, T);
          a.state = be.upload(h0.data(), {c.HV, c.K, c.V}, DType::F32);
          a.o = be.act({T, VD});
          DTensor states = be.alloc({T, c.HV, c.K, c.V}, DType::F32);
          be.la_scan_states(a, states);
          return be.to_host(want_states ? states : a.o);
        };
        check("la_scan_states output", sh, 5e-4, [&](Backend& be) { return run_states(be, false); });
        check("la_scan_states states", sh, 1e-4, [&](Backend& be) { return run_states(be, true); });
      }
      // The segment's transition (A, B) and the merge of two copies of it (each backend merges its
      // own transition): fp32 state math, held to the state's 1e-4.
      if (T != 19) continue;
      auto trans = [&](Backend& be, int part) {
        dz::LaScanArgs a = la_args(be, c, in, T);
        a.q = a.k;
        DTensor A = be.alloc({c.HV, c.K, c.K}, DType::F32), B = be.alloc({c.HV, c.K, c.V}, DType::F32);
        be.la_transition(a, A, B);
        if (part < 2) return be.to_host(part == 0 ? A : B);
        // merge [A, B] twice: S_init[1] = B, S_final = A B + B
        DTensor A2 = be.alloc({2, c.HV, c.K, c.K}, DType::F32), B2 = be.alloc({2, c.HV, c.K, c.V}, DType::F32);
        for (int i = 0; i < 2; ++i) {
          be.copy_rows(A.reshaped({1, A.numel()}), 0, A2.reshaped({2, A.numel()}), i, 1);
          be.copy_rows(B.reshaped({1, B.numel()}), 0, B2.reshaped({2, B.numel()}), i, 1);
        }
        DTensor Si = be.alloc({2, c.HV, c.K, c.V}, DType::F32), Sf = be.alloc({c.HV, c.K, c.V}, DType::F32);
        be.la_merge(A2, B2, 2, Si, Sf);
        return be.to_host(Sf);
      };
      check("la_transition A", sh, 1e-4, [&](Backend& be) { return trans(be, 0); });
      check("la_transition B", sh, 1e-4, [&](Backend& be) { return trans(be, 1); });
      check("la_merge", sh, 1e-4, [&](Backend& be) { return trans(be, 2); });
    }
  // A packed verify forward keeping per-row states (la_scan_states_slots): documents of 1 to 9 rows
  // on scattered pool slots, outputs, per-row states and the slots after, la_scan's tolerances.
  for (const Case& c : cases) {
    const std::vector<int64_t> cu{0, 5, 6, 15, 18};
    const std::vector<int32_t> slots{3, 0, 5, 1};
    const int64_t N = 4, T = cu.back(), cap = 6, n = c.HV * c.K * c.V;
    const std::string sh = std::string(c.kda ? "KDA" : "GDN") + " K=" + std::to_string(c.K) + " states_slots T=" +
                           std::to_string(T);
    const LaInputs in = la_inputs(c, T, 61);
    const auto pool0 = rnd(size_t(cap * n), 66, 0.1f);
    auto run = [&](Backend& be, int part) {
      dz::LaScanArgs a = la_args(be, c, in, T);
      a.o = be.act({T, c.HV * c.V});
      a.cu = cu;
      DTensor pool = be.upload(pool0.data(), {cap, c.HV, c.K, c.V}, DType::F32);
      DTensor states = be.alloc({T, c.HV, c.K, c.V}, DType::F32);
      be.la_scan_states_slots(a, pool, slots, states);
      return be.to_host(part == 0 ? a.o : part == 1 ? states : pool);
    };
    (void)N;
    check("la_scan_states_slots output", sh, 5e-4, [&](Backend& be) { return run(be, 0); });
    check("la_scan_states_slots states", sh, 1e-4, [&](Backend& be) { return run(be, 1); });
    check("la_scan_states_slots pool", sh, 1e-4, [&](Backend& be) { return run(be, 2); });
  }
  // Varlen (a packed forward): N sequences, each from its own state [N, HV, K, V]; one token per
  // sequence is a batched decode step (the recurrent decode kernel over N slots), mixed lengths
  // the varlen chunked kernel. Same tolerances as one sequence.
  for (const Case& c : cases) {
    if (!dz::cuda::la_chunked_supports(int(c.K), int(c.V))) continue;  // small heads: per sequence
    for (const std::vector<int64_t>& cu : {std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7},
                                           std::vector<int64_t>{0, 1, 5, 6, 70, 71}}) {
      const int64_t N = int64_t(cu.size()) - 1, T = cu.back();
      const std::string sh = std::string(c.kda ? "KDA" : "GDN") + " K=" + std::to_string(c.K) + " varlen N=" +
                             std::to_string(N) + " T=" + std::to_string(T);
      const int64_t VD = c.HV * c.V;
      const LaInputs in = la_inputs(c, T, 51);
      const auto h0 = rnd(size_t(N * c.HV * c.K * c.V), 56, 0.1f);
      auto run = [&](Backend& be, bool want_state) {
        dz::LaScanArgs a = la_args(be, c, in, T);
        a.state = be.upload(h0.data(), {N, c.HV, c.K, c.V}, DType::F32);
        a.o = be.act({T, VD});
        a.cu = cu;
        be.la_scan(a);
        return be.to_host(want_state ? a.state : a.o);
      };
      check("la_scan output", sh, 5e-4, [&](Backend& be) { return run(be, false); });
      check("la_scan state", sh, 1e-4, [&](Backend& be) { return run(be, true); });
    }
  }
  // A decode step on pool slots (la_decode_slots, short_conv_slots): N = 5 sequences at slots
  // {6, 0, 3, 7, 2} of a pool of 8 (the others must stay as they were). Decode kernel for heads of
  // 64 / 128, per-sequence token-by-token kernel for small heads. Same tolerances as la_scan.
  for (const Case& c : cases) {
    const std::vector<int32_t> slots{6, 0, 3, 7, 2};
    const int64_t N = 5, cap = 8, VD = c.HV * c.V;
    const std::string sh = std::string(c.kda ? "KDA" : "GDN") + " K=" + std::to_string(c.K) + " slots N=5 of 8";
    const LaInputs in = la_inputs(c, N, 61);
    const auto pool = rnd(size_t(cap * c.HV * c.K * c.V), 66, 0.1f);
    auto run = [&](Backend& be, bool want_state) {
      dz::LaScanArgs a = la_args(be, c, in, N);
      DTensor states = be.upload(pool.data(), {cap, c.HV, c.K, c.V}, DType::F32);
      a.o = be.act({N, VD});
      be.la_decode_slots(a, states, slots);
      return be.to_host(want_state ? states : a.o);
    };
    check("la_decode_slots output", sh, 5e-4, [&](Backend& be) { return run(be, false); });
    check("la_decode_slots pool", sh, 1e-4, [&](Backend& be) { return run(be, true); });
  }
  for (int64_t C : {96, 100}) {
    const int64_t W = 4, N = 5, cap = 8;
    const std::vector<int32_t> slots{6, 0, 3, 7, 2};
    const auto x = rnd(size_t(N * C), 71), w = rnd(size_t(C * W), 72, 0.5f), s0 = rnd(size_t(cap * (W - 1) * C), 73);
    for (int part = 0; part < 2; ++part)
      check(part ? "short_conv_slots pool" : "short_conv_slots", "C=" + std::to_string(C) + " N=5 of 8", 1e-5,
            [&](Backend& be) {
        DTensor xt = be.upload(x.data(), {N, C}, be.act_dtype()), y = be.act({N, C});
        DTensor st = be.upload(s0.data(), {cap, W - 1, C}, be.act_dtype());
        be.short_conv_slots(xt, be.upload(w.data(), {C, W}, be.weight_dtype()), st, slots, y);
        return be.to_host(part ? st : y);
      });
  }
  // C = 96: the 8-channel vector kernel; C = 100: the scalar one (rows not 16-byte multiples).
  for (int64_t C : {96, 100})
  for (int64_t T : {1, 3, 19, 733}) {
    const int64_t W = 4;
    const auto x = rnd(size_t(T * C), 31), w = rnd(size_t(C * W), 32, 0.5f), s0 = rnd(size_t((W - 1) * C), 33);
    for (int part = 0; part < 2; ++part)
      check(part ? "short_conv state" : "short_conv", "C=" + std::to_string(C) + " T=" + std::to_string(T), 1e-5,
            [&](Backend& be) {
        DTensor xt = be.upload(x.data(), {T, C}, be.act_dtype()), y = be.act({T, C});
        DTensor st = be.upload(s0.data(), {W - 1, C}, be.act_dtype());
        be.short_conv(xt, be.upload(w.data(), {C, W}, be.weight_dtype()), st, y);
        return be.to_host(part ? st : y);
      });
  }
  // short_conv_split, the output written as column blocks (the mixers' q | k | v): on cuda one
  // kernel into the blocks, on cpu the conv then copies. Widths 32 | 32 | 64: the vector kernel;
  // 36 | 36 | 24 (not multiples of 8 channels) and a 100-wide single block: the scalar one.
  for (const std::vector<int64_t>& widths : {std::vector<int64_t>{32, 32, 64}, {36, 36, 24}, {100}})
  for (int64_t T : {3, 733}) {
    const int64_t W = 4;
    int64_t C = 0;
    std::string name = "widths";
    for (int64_t b : widths) C += b, name += " " + std::to_string(b);
    const auto x = rnd(size_t(T * C), 34), w = rnd(size_t(C * W), 35, 0.5f), s0 = rnd(size_t((W - 1) * C), 36);
    for (int part = 0; part < 2; ++part)
      check(part ? "short_conv_split state" : "short_conv_split", name + " T=" + std::to_string(T), 1e-5,
            [&](Backend& be) {
        DTensor xt = be.upload(x.data(), {T, C}, be.act_dtype());
        DTensor st = be.upload(s0.data(), {W - 1, C}, be.act_dtype());
        std::vector<DTensor> ys;
        for (int64_t b : widths) ys.push_back(be.act({T, b}));
        be.short_conv_split(xt, be.upload(w.data(), {C, W}, be.weight_dtype()), st, ys);
        if (part) return be.to_host(st);
        std::vector<float> all;
        for (const DTensor& y : ys) {
          const std::vector<float> h = be.to_host(y);
          all.insert(all.end(), h.begin(), h.end());
        }
        return all;
      });
  }
}

TEST_CASE("backend ops: MoE routing and grouped experts on cuda equal the cpu backend", "[gpu]") {
  struct Case {
    const char* name;
    int64_t E, k, groups, topk_group;
    dz::ScoreFunc f;
    bool bias, shared, shared_gate, renorm;
    int64_t D = 64, I = 40;  // D = 60, I = 36: rows not whole 16-byte chunks (the element loads)
    float limit = 0.f;       // SwiGLU clamp of the experts and the shared expert
    bool fixed = false;      // DeepSeek-V4 hash routing: the experts given per row
    float situ_beta = 0.f, situ_lb = 0.f;  // Kimi K3's SiTU experts
    bool mx4 = false;        // experts MXFP4 (kept 4-bit on the GPU: the decoding grouped GEMMs)
    int64_t latent = 0;      // > 0: the experts read a latent [T, latent], the router x [T, D] (route_x)
  };
  const Case cases[] = {{"softmax top-2", 8, 2, 1, 1, dz::ScoreFunc::Softmax, false, false, false, false},
                        {"sigmoid+bias groups", 16, 4, 4, 2, dz::ScoreFunc::Sigmoid, true, true, false, true},
                        {"qwen gated shared", 32, 8, 1, 1, dz::ScoreFunc::Softmax, false, true, true, true},
                        // more experts than the dispatch scan's block of 1024 threads: two chunks
                        {"1100 experts", 1100, 8, 1, 1, dz::ScoreFunc::Softmax, false, false, false, true},
                        // more experts than the TMA kernel's epilogue staging tiles fit beside (E > ~2000)
                        {"2100 experts", 2100, 8, 1, 1, dz::ScoreFunc::Softmax, false, false, false, true},
                        {"odd widths", 8, 2, 1, 1, dz::ScoreFunc::Softmax, false, true, false, true, 60, 36},
                        {"SwiGLU clamp", 16, 4, 1, 1, dz::ScoreFunc::Sigmoid, true, true, false, true, 64, 40, 0.05f},
                        // DeepSeek-V4: sqrt(softplus) scores, selected with the bias / taken from the hash table
                        {"sqrtsoftplus+bias", 16, 4, 1, 1, dz::ScoreFunc::SqrtSoftplus, true, true, false, true, 64, 40,
                         0.5f},
                        {"hash routed", 16, 4, 1, 1, dz::ScoreFunc::SqrtSoftplus, false, true, false, true, 64, 40, 0.5f,
                         true},
                        // Kimi K3: SiTU experts, MXFP4 weights (K = 96: a half-filled last 64-wide stage), the
                        // latent MoE's separate router input; and MXFP4 with SwiGLU at the plain kernel's widths
                        {"situ", 16, 4, 1, 1, dz::ScoreFunc::Sigmoid, true, true, false, true, 64, 40, 0.f, false, 0.4f,
                         0.6f},
                        {"mxfp4", 16, 4, 1, 1, dz::ScoreFunc::Sigmoid, true, false, false, true, 96, 160, 0.f, false, 0.f,
                         0.f, true},
                        {"k3 latent mxfp4 situ", 16, 4, 1, 1, dz::ScoreFunc::Sigmoid, true, false, false, true, 64, 64, 0.f,
                         false, 0.4f, 0.6f, true, 32},
                        {"mxfp4 300 experts", 300, 8, 1, 1, dz::ScoreFunc::Sigmoid, true, false, false, true, 32, 320, 0.f,
                         false, 0.f, 0.f, true}};
  // T = 1 and 3: a decode step's few rows per expert (mostly padding in the 64-row tiles).
  for (const Case& c : cases)
    for (int64_t T : kRows) {
      const int64_t D = c.D, I = c.I;
      dz::RouterConfig rc;
      rc.n_experts = c.E;
      rc.top_k = c.k;
      rc.score_func = c.f;
      rc.norm_topk_prob = c.renorm;
      rc.routed_scaling_factor = 2.5f;
      rc.n_group = c.groups;
      rc.topk_group = c.topk_group;
      const auto x = rnd(size_t(T * D), 41), router = rnd(size_t(c.E * D), 42, 0.5f), bias = rnd(size_t(c.E), 43, 0.1f);
      const int64_t DX = c.latent ? c.latent : D;  // the experts' input width
      auto g = rnd(size_t(c.E * I * DX), 44, 0.15f), u = rnd(size_t(c.E * I * DX), 45, 0.15f),
           dn = rnd(size_t(c.E * DX * I), 46, 0.15f);
      if (c.mx4)  // make them MXFP4 values (what a K3 checkpoint decodes to)
        for (auto* v : {&g, &u}) mx4_round(*v, DX);
      if (c.mx4) mx4_round(dn, I);
      const auto xl = rnd(size_t(T * DX), 51);
      const auto sg = rnd(size_t(I * D), 47, 0.15f), su = rnd(size_t(I * D), 48, 0.15f), sd = rnd(size_t(D * I), 49, 0.15f),
                 sgate = rnd(size_t(D), 50, 0.2f);
      check("moe", std::string(c.name) + " T=" + std::to_string(T), 1e-3, [&](Backend& be) {
        dz::MoeWeights w;
        w.router = be.upload(router.data(), {c.E, D}, DType::F32);
        if (c.bias) w.bias = be.upload(bias.data(), {c.E}, DType::F32);
        auto ex = [&](const std::vector<float>& v, Shape s) {
          dz::Tensor t(s);
          std::copy(v.begin(), v.end(), t.ptr());
          t.mxfp4 = c.mx4;
          return c.mx4 ? be.weight(t) : be.upload(t, be.weight_dtype());
        };
        w.experts = {ex(g, {c.E, I, DX}), ex(u, {c.E, I, DX}), ex(dn, {c.E, DX, I}),
                     dz::GluAct{c.limit, c.situ_beta, c.situ_lb}};
        if (c.mx4 && be.device() == dz::Device::Cuda) REQUIRE(w.experts.gate.mx_scales);  // kept 4-bit
        if (c.shared) {
          w.has_shared = true;
          w.shared = {be.upload(sg.data(), {I, D}, be.weight_dtype()), be.upload(su.data(), {I, D}, be.weight_dtype()),
                      be.upload(sd.data(), {D, I}, be.weight_dtype()), c.limit};
          if (c.shared_gate) w.shared_gate = be.upload(sgate.data(), {1, D}, DType::F32);
        }
        if (c.fixed) {  // k distinct experts per row, not in ascending order
          std::vector<int32_t> ids(size_t(T * c.k));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < c.k; ++j) ids[size_t(t * c.k + j)] = int32_t((t * 5 + (c.k - j) * 3) % c.E);
          w.fixed = be.upload_i32(ids.data(), {T, c.k});
        }
        DTensor a = be.upload(x.data(), {T, D}, be.act_dtype()), o = be.act({T, DX});
        if (c.latent) {
          w.route_x = a;
          a = be.upload(xl.data(), {T, DX}, be.act_dtype());
        }
        be.moe(rc, w, a, o);
        return be.to_host(o);
      });
    }
}

TEST_CASE("backend ops: a non-finite router score stops at the next host read, named, and the backend goes on",
          "[gpu]") {
  Backend& be = *backends().gpu;
  const int64_t D = 64, I = 40, E = 8, T = 5;
  dz::RouterConfig rc;
  rc.n_experts = E;
  rc.top_k = 2;
  rc.score_func = dz::ScoreFunc::Sigmoid;
  rc.n_group = 1;
  rc.topk_group = 1;
  const auto g = rnd(size_t(E * I * D), 44, 0.15f), u = rnd(size_t(E * I * D), 45, 0.15f),
             dn = rnd(size_t(E * D * I), 46, 0.15f), router = rnd(size_t(E * D), 42, 0.5f);
  dz::MoeWeights w;
  w.router = be.upload(router.data(), {E, D}, DType::F32);
  w.experts = {be.upload(g.data(), {E, I, D}, be.weight_dtype()), be.upload(u.data(), {E, I, D}, be.weight_dtype()),
               be.upload(dn.data(), {E, D, I}, be.weight_dtype())};
  auto x = rnd(size_t(T * D), 41);
  DTensor o = be.act({T, D});
  const DTensor good = be.upload(x.data(), {T, D}, be.act_dtype());
  x[size_t(3 * D + 7)] = std::numeric_limits<float>::quiet_NaN();  // token 3: NaN logits
  const DTensor bad = be.upload(x.data(), {T, D}, be.act_dtype());
  be.moe(rc, w, bad, o);  // no wait here: the flag is read at the next host wait
  CHECK_THROWS_WITH(be.sync(), Catch::Contains("moe router: a selection score is not finite"));
  be.moe(rc, w, good, o);
  CHECK_NOTHROW(be.sync());  // the flag was cleared
  const auto y = be.to_host(o);
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v); }));
}

TEST_CASE("backend ops: LM-head reductions on cuda equal the cpu backend", "[gpu]") {
  Both& b = backends();
  for (int64_t m : {1, 3, 19})
  for (int64_t n : {5003, 5004}) {  // the scalar and the 16-byte loads of the one-pass kernel
    auto lg = rnd(size_t(m * n), 61, 3.f);
    if (m == 19) {
      lg[size_t(5 * n + 77)] = std::nanf("");  // row 5: a NaN reaches the sum, not the max (a thread's first logit)
      lg[size_t(6 * n + 600)] = std::nanf("");  // row 6: the same further along
      for (int64_t j = 0; j < 700; ++j) lg[size_t(7 * n + j)] = -INFINITY;  // row 7: -inf first: each adds 0
      std::fill(lg.begin() + 8 * n, lg.begin() + 9 * n, -INFINITY);         // row 8: only -inf: sum NaN
    }
    std::vector<int32_t> tgt;
    for (int64_t i = 0; i < m; ++i) tgt.push_back(int32_t((i * 977 + 100) % (n + 40)) - 20);  // some outside the shard
    std::vector<double> parts[2];
    std::vector<int32_t> ids[2];
    std::vector<float> vals[2];
    Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
    for (int i = 0; i < 2; ++i) {
      Backend& be = *bes[i];
      DTensor l = be.upload(lg.data(), {m, n}, DType::F32);
      be.lse_parts(l, tgt, 20, parts[i]);
      be.row_topk(l, 10, ids[i], vals[i]);
    }
    // max and target logit exact; the sum: the GPU takes exp in fp32 (x - max <= 0: expf within
    // 2 ulp, so each term within ~2.4e-7 relative) and sums in fp64 in another order
    for (int64_t r = 0; r < m; ++r) {
      CHECK(parts[1][size_t(3 * r)] == parts[0][size_t(3 * r)]);
      if (m == 19 && r >= 5 && r <= 8) {  // the edge rows above
        CHECK(std::isnan(parts[0][size_t(3 * r + 1)]) == (r != 7));
        CHECK(std::isnan(parts[1][size_t(3 * r + 1)]) == (r != 7));
      }
      if (std::isnan(parts[0][size_t(3 * r + 1)])) {
        CHECK(std::isnan(parts[1][size_t(3 * r + 1)]));
      } else {
        CHECK(std::abs(parts[1][size_t(3 * r + 1)] / parts[0][size_t(3 * r + 1)] - 1) <= 3e-7);
      }
      CHECK(parts[1][size_t(3 * r + 2)] == parts[0][size_t(3 * r + 2)]);
    }
    CHECK(ids[1] == ids[0]);
    CHECK(vals[1] == vals[0]);
    std::printf("  lm-head m=%lld n=%lld: max, sum-exp, target logit and top-10 equal\n", (long long)m, (long long)n);
  }
  // Top-1 (greedy decoding, LmHead::greedy): ties go to the lower column, NaN never wins.
  const int64_t n = 5003;
  std::vector<float> lg = rnd(size_t(3 * n), 62, 3.f);
  lg[17] = lg[4000] = 100.f;                                             // row 0: a tie at the max
  for (int j = 0; j < 10; ++j) lg[size_t(n + j)] = std::nanf("");        // row 1: NaNs first
  lg[size_t(n + 2000)] = 50.f;
  std::fill(lg.begin() + 2 * n, lg.end(), -1.f);                         // row 2: all equal
  std::vector<int32_t> ids[2];
  std::vector<float> vals[2];
  Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
  for (int i = 0; i < 2; ++i) bes[i]->row_topk(bes[i]->upload(lg.data(), {3, n}, DType::F32), 1, ids[i], vals[i]);
  CHECK(ids[0] == std::vector<int32_t>{17, 2000, 0});
  CHECK(ids[1] == ids[0]);
  CHECK(vals[1] == vals[0]);
}

TEST_CASE("backend comms: NCCL at world size 1 and the staged MPI path keep a tensor as it is", "[gpu]") {
  Both& b = backends();
  const dz::Comm self;  // a group of one (no MPI needed)
  REQUIRE(dz::nccl_built());
  auto picked = dz::make_device_comm(*b.gpu, self);  // one member on its own GPU: NCCL
  CHECK(picked->kind() == "nccl");
  for (DType dt : {DType::F32, DType::BF16}) {
    const auto v = rnd(1000, 91);
    DTensor t = b.gpu->upload(v.data(), {10, 100}, dt);
    picked->allreduce_sum(t);
    CHECK(b.gpu->to_host(t) == v);  // bf16-rounded inputs: exact in both dtypes
    b.gpu->allreduce_sum(&self, t);  // the staged path on a group of one
    CHECK(b.gpu->to_host(t) == v);
  }
  std::printf("  nccl (world size 1) and staged mpi all-reduce: identity, f32 and bf16\n");
  // all-gather of rows (the CP exchanges): a group of one gets its own rows back, bytes as they were
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    const int64_t R = 7, W = 33;
    std::vector<int32_t> iv(size_t(R * W));
    for (size_t i = 0; i < iv.size(); ++i) iv[i] = int32_t(i * 2654435761u);
    const auto v = rnd(size_t(R * W), 92);
    DTensor t = dt == DType::I32 ? b.gpu->upload_i32(iv.data(), {R, W}) : b.gpu->upload(v.data(), {R, W}, dt);
    // 0, 1: NCCL and staged; 2: NCCL started on its own stream; 3, 4: two NCCL exchanges in flight,
    // waited in reverse order, with a third dropped unwaited between them
    auto p1 = picked->allgather_rows_start(t, {R});
    auto p2 = picked->allgather_rows_start(t, {R});
    picked->allgather_rows_start(t, {R});
    for (int path = 0; path < 5; ++path) {
      const DTensor g = path == 0   ? picked->allgather_rows(t, {R})
                        : path == 1 ? b.gpu->allgather_rows(&self, t, {R})
                        : path == 2 ? picked->allgather_rows_start(t, {R})->wait()
                        : path == 3 ? p2->wait()
                                    : p1->wait();
      REQUIRE(g.rows() == R);
      REQUIRE(g.cols() == W);
      REQUIRE(g.dtype == dt);
      if (dt == DType::I32) {
        std::vector<int32_t> h(size_t(R * W));
        b.gpu->download_i32(g, h.data());
        CHECK(h == iv);
      } else {
        CHECK(b.gpu->to_host(g) == v);
      }
    }
    CHECK_THROWS_WITH(picked->allgather_rows(t, {R + 1}), Catch::Contains("its count says"));
  }
  std::printf("  nccl (world size 1) and staged all-gather of rows, nccl also started on its stream: identity, f32, "
              "bf16 and i32\n");
  // all-to-all of rows (the expert-parallel dispatch): to itself, bytes as they were; 0 rows too
  for (int64_t R : {int64_t(0), int64_t(5)}) {
    const auto v = rnd(size_t(std::max<int64_t>(R, 1) * 40), 93);
    DTensor t = b.gpu->upload(v.data(), {R, 40}, DType::BF16);
    // 0, 1: NCCL and staged; 2: NCCL started on its own stream; 3, 4: two started, waited in
    // reverse order, a third dropped unwaited between them; 5: the staged path started
    auto p1 = picked->alltoall_rows_start(t, {R}, {R});
    auto p2 = picked->alltoall_rows_start(t, {R}, {R});
    picked->alltoall_rows_start(t, {R}, {R});
    for (int path = 0; path < 6; ++path) {
      const DTensor g = path == 0   ? picked->alltoall_rows(t, {R}, {R})
                        : path == 1 ? b.gpu->alltoall_rows(&self, t, {R}, {R})
                        : path == 2 ? picked->alltoall_rows_start(t, {R}, {R})->wait()
                        : path == 3 ? p2->wait()
                        : path == 4 ? p1->wait()
                                    : b.gpu->alltoall_rows_start(&self, t, {R}, {R})->wait();
      REQUIRE(g.rows() == R);
      if (R > 0) CHECK(b.gpu->to_host(g) == std::vector<float>(v.begin(), v.begin() + R * 40));
    }
    CHECK_THROWS_WITH(picked->alltoall_rows(t, {R + 1}, {R + 1}), Catch::Contains("the counts say"));
  }
  std::printf("  nccl (world size 1) and staged all-to-all of rows, both also started: identity, 0 and 5 rows\n");
}

// A group of one (the segments' moves are then in order): the composition on cuda; the reordering
// across ranks is tested on the CPU (mpi_cases "allgather_rows and cp_gather_seq") and by the CLI
// part's --cp 2 runs on cuda (scripts/gpu-tests.sh).
TEST_CASE("backend comms: cp_gather_seq on cuda puts every segment's rows back in sequence order", "[gpu]") {
  Both& b = backends();
  const dz::Comm self;
  for (int64_t L : {1, 19, 733})
    for (int segs : {1, 3, 8}) {
      const dz::SeqLayout lay = dz::SeqLayout::zigzag(L, 1, 0, segs);
      const std::vector<int64_t> pos = lay.local_positions();
      const int64_t W = 24;
      std::vector<float> v(pos.size() * size_t(W));
      for (size_t i = 0; i < pos.size(); ++i)
        for (int64_t c = 0; c < W; ++c) v[i * size_t(W) + size_t(c)] = float((pos[i] * 7 + c) % 256);  // integers < 256: bf16-exact
      const dz::CpCtx ctx{&self, &lay, nullptr};
      const DTensor t = b.gpu->upload(v.data(), {int64_t(pos.size()), W}, DType::BF16);
      const std::vector<float> h = b.gpu->to_host(dz::cp_gather_seq(*b.gpu, ctx, t));
      REQUIRE(int64_t(h.size()) == L * W);
      bool ok = true;
      for (int64_t s = 0; s < L; ++s)
        for (int64_t c = 0; c < W; ++c) ok = ok && h[size_t(s * W + c)] == float((s * 7 + c) % 256);
      CHECK(ok);
    }
  std::printf("  cp_gather_seq on cuda: L = 1, 19, 733 over 1, 3, 8 segments, in sequence order\n");
}
