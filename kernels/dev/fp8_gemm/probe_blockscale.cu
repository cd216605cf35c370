// Probe: which scale-tensor layouts and shapes cuBLASLt accepts for DeepSeek's FP8 recipe on sm_90
// (weights W [N, K] E4M3 with one fp32 scale per 128x128 block, activations X [M, K] E4M3 with one
// fp32 scale per 1x128 row block), judged against a host reference of the same quantised values.
// The cuBLAS documentation names the modes (BLK128x128_32F, VEC128_32F) but the layouts of their
// scale tensors are easiest settled by measurement; lib/backend/cuda uses what this prints.
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ilib kernels/dev/fp8_gemm/probe_blockscale.cu lib/core/fp8.cpp -lcublasLt -o /tmp/p
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <vector>

#include "core/fp8.hpp"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One matmul D [M, N] (row-major bf16) = X W^T with the given scale layouts; returns the status of
// the heuristic / matmul, the max relative error against ref in *err.
static int run(cublasLtHandle_t lt, int M, int N, int K, const std::vector<uint8_t>& xq, const std::vector<float>& xs_mk,
               const std::vector<uint8_t>& wq, const std::vector<float>& ws_nk, bool xs_m_major, bool ws_n_major,
               bool w_as_a, bool out_row, int pa, int pw, const std::vector<double>& ref, double* err, float* ms) {
  const int64_t kb = cdiv(K, 128), nb = cdiv(N, 128);
  // Activation scales: [M][kb] (kb contiguous) or [kb][M] (M contiguous).
  const int64_t ldx = cdiv(xs_m_major ? M : kb, pa) * pa, ldw = cdiv(ws_n_major ? nb : kb, pw) * pw;
  std::vector<float> xs(size_t((xs_m_major ? kb : M) * ldx), 0.f), ws(size_t((ws_n_major ? kb : nb) * ldw), 0.f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < kb; ++b) xs[size_t(xs_m_major ? b * ldx + m : m * ldx + b)] = xs_mk[size_t(m * kb + b)];
  for (int64_t n = 0; n < nb; ++n)
    for (int64_t b = 0; b < kb; ++b) ws[size_t(ws_n_major ? b * ldw + n : n * ldw + b)] = ws_nk[size_t(n * kb + b)];
  uint8_t *dx, *dw;
  float *dxs, *dws;
  __nv_bfloat16* dd;
  void* wsp;
  const size_t wsb = 32 << 20;
  CK(cudaMalloc(&dx, xq.size()));
  CK(cudaMalloc(&dw, wq.size()));
  CK(cudaMalloc(&dxs, xs.size() * 4));
  CK(cudaMalloc(&dws, ws.size() * 4));
  CK(cudaMalloc(&dd, size_t(M) * N * 2));
  CK(cudaMalloc(&wsp, wsb));
  CK(cudaMemcpy(dx, xq.data(), xq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, wq.data(), wq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dxs, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dws, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dd, 0xff, size_t(M) * N * 2));
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  // Both operands K-major (TN, the only FP8 form on Hopper). w_as_a: D = W X^T (column-major N x M
  // = Y [M, N] row-major); else D = X W^T (column-major M x N = Y^T, or Y itself with ORDER_ROW).
  cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof(tA));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof(tB));
  cublasLtMatmulMatrixScale_t wm = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, xm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, w_as_a ? &wm : &xm, sizeof(wm));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, w_as_a ? &xm : &wm, sizeof(wm));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_as_a ? &dws : &dxs, sizeof(dws));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, w_as_a ? &dxs : &dws, sizeof(dws));
  cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, w_as_a ? N : M, K);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, w_as_a ? M : N, K);
  if (w_as_a) {
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N);
  } else {
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, M, N, out_row ? N : M);
    if (out_row) {
      cublasLtOrder_t o = CUBLASLT_ORDER_ROW;
      cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_ORDER, &o, sizeof(o));
    }
  }
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
  cublasLtMatmulHeuristicResult_t h[4];
  int nres = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 4, h, &nres);
  int rc = 0;
  if (s != CUBLAS_STATUS_SUCCESS || nres == 0) {
    rc = s != CUBLAS_STATUS_SUCCESS ? int(s) : -1;
  } else {
    const float one = 1.f, zero = 0.f;
    s = cublasLtMatmul(lt, op, &one, w_as_a ? dw : dx, la, w_as_a ? dx : dw, lb, &zero, dd, lc, dd, lc, &h[0].algo, wsp, wsb, nullptr);
    if (s != CUBLAS_STATUS_SUCCESS) rc = 1000 + int(s);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    std::vector<uint16_t> d(size_t(M) * N);
    CK(cudaMemcpy(d.data(), dd, d.size() * 2, cudaMemcpyDeviceToHost));
    double e = 0, rmax = 0;
    for (size_t i = 0; i < d.size(); ++i) {
      uint32_t b = uint32_t(d[i]) << 16;
      float f;
      std::memcpy(&f, &b, 4);
      const size_t m = i / size_t(N), n = i % size_t(N);  // ref is [M, N]
      const size_t at = (w_as_a || out_row) ? i : n * size_t(M) + m;
      if (ref[i] != ref[i]) continue;  // unchecked entry
      uint32_t b2 = uint32_t(d[at]) << 16;
      std::memcpy(&f, &b2, 4);
      e = std::fmax(e, std::fabs(double(f) - ref[i]));
      rmax = std::fmax(rmax, std::fabs(ref[i]));
    }
    *err = std::isfinite(e) ? e / rmax : 1e30;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int it = 0; it < 10; ++it)
      cublasLtMatmul(lt, op, &one, w_as_a ? dw : dx, la, w_as_a ? dx : dw, lb, &zero, dd, lc, dd, lc, &h[0].algo, wsp, wsb, nullptr);
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    cudaEventElapsedTime(ms, e0, e1);
    *ms /= 10;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cudaFree(dx), cudaFree(dw), cudaFree(dxs), cudaFree(dws), cudaFree(dd), cudaFree(wsp);
  return rc;
}

int main(int argc, char** argv) {
  const int only = argc > 1 ? std::atoi(argv[1]) : -1;  // one form per process: a fault is sticky
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  std::printf("cublasLt version %zu\n", cublasLtGetVersion());
  struct Shape { int M, N, K; };
  const Shape shapes[] = {{64, 256, 384}, {64, 256, 512}, {5, 256, 512}, {8, 256, 512}, {1, 1536, 7168},
                          {4, 1536, 7168}, {64, 576, 512}, {64, 200, 512}, {64, 256, 200}, {300, 2048, 7168},
                          {8192, 2048, 7168}};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (const Shape& sh : shapes) {
    const int M = sh.M, N = sh.N, K = sh.K;
    const int64_t kb = cdiv(K, 128), nb = cdiv(N, 128);
    const bool big = int64_t(M) * N * K > (int64_t(1) << 32);
    std::vector<float> x(size_t(M) * K), w(size_t(N) * K);
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = 0.05f * nd(rng);
    // Activations: the per-tile rule of core/fp8 (amax / 448 per 128 of a row).
    std::vector<uint8_t> xq(x.size()), wq(w.size());
    std::vector<float> xs(size_t(M * kb)), ws(size_t(nb * kb));
    dz::kv_fp8_quantize(x.data(), M, K, xq.data(), xs.data());
    // Weights: one scale per 128 x 128 block (amax / 448), as DeepSeek's checkpoints.
    for (int64_t bn = 0; bn < nb; ++bn)
      for (int64_t bk = 0; bk < kb; ++bk) {
        float amax = 0;
        for (int64_t n = bn * 128; n < std::min<int64_t>(N, bn * 128 + 128); ++n)
          for (int64_t k = bk * 128; k < std::min<int64_t>(K, bk * 128 + 128); ++k) amax = std::fmax(amax, std::fabs(w[size_t(n * K + k)]));
        const float s = amax / 448.f;
        ws[size_t(bn * kb + bk)] = s;
        for (int64_t n = bn * 128; n < std::min<int64_t>(N, bn * 128 + 128); ++n)
          for (int64_t k = bk * 128; k < std::min<int64_t>(K, bk * 128 + 128); ++k)
            wq[size_t(n * K + k)] = dz::f32_to_e4m3(w[size_t(n * K + k)] / s);
      }
    std::vector<double> ref(size_t(M) * N, std::nan(""));
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
          if (big && (m % 97 || n % 13)) continue;  // a sample of the big product
          double acc = 0;
          for (int k = 0; k < K; ++k)
            acc += double(dz::e4m3_to_f32(xq[size_t(m * K + k)])) * xs[size_t(m * kb + k / 128)] *
                   double(dz::e4m3_to_f32(wq[size_t(n * K + k)])) * ws[size_t((n / 128) * kb + k / 128)];
          ref[size_t(m * N + n)] = acc;
        }
    // D = W X^T (column-major N x M: Y [M, N] row-major), act scales [kb][M] (M contiguous), weight
    // scales [nb][kb] (the checkpoint's order), leading dimensions padded to pa / pw.
    (void)only;
    for (int pa : {1, 4, 128})
      for (int pw : {1, 4}) {
        double err = -1;
        float ms = 0;
        const int rc = run(lt, M, N, K, xq, xs, wq, ws, true, false, true, false, pa, pw, ref, &err, &ms);
        std::printf("M=%d N=%d K=%d act ld pad %d, weight ld pad %d: status %d, max rel err %.3g, %.4f ms (%.0f TFLOP/s)\n",
                    M, N, K, pa, pw, rc, err, ms, ms > 0 ? 2.0 * M * N * K / (ms * 1e-3) / 1e12 : 0.0);
      }
  }
  cublasLtDestroy(lt);
  return 0;
}
