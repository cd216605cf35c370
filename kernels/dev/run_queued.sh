#!/bin/bash
# The queued kernel experiments in one device command (each builds with nvcc alone: no prefix
# needed), logs under $OUT/<name>/:
#   bash kernels/dev/run_queued.sh [smla] [smlaprof] [moe] [laprof] [laab] [conv] [hc] [idx]      (default: all)
#   smla:  production's sparse MLA (kernels/dev/sparse_mla/run.sh: tested against fp64, benched) and
#          the variant file SMLA_VARIANT (none queued) built in its place and run the same way,
#          outputs compared bitwise (a variant with other arithmetic differs: the fp64 tests
#          decide); kernels/dev/sparse_mla/compare.sh A/Bs several variants at once
#   smlaprof: kernels/dev/sparse_mla/profile.sh: ncu of production's sparse MLA (or SMLAPROF_VARIANT)
#          at GLM-5.3-Flash's DSA shape (pipes, shared-memory wavefronts, warp stall reasons)
#   moe:   kernels/dev/moe_gemm: production's expert GEMMs and the variant file MOE_VARIANT (none
#          queued): every loader's test grid vs fp64, with and without the 2-CTA clusters, bench vs
#          cuBLAS; then on the bench's measured (skewed) routing of GLM-5.3-Flash and Qwen3.5 at
#          T = 8192 (rows_*.txt)
#   laprof: kernels/dev/linear_attn/profile.sh: ncu of the KDA prep kernel (mma_prep_kernel) with its
#          stall samples per source line (the next step on KDA: docs/perf/README.md, eighth session)
#   laab:  kernels/dev/linear_attn/ab.sh with the patch file LA_PATCH (none queued; the last two ran in
#          the twenty-second session, docs/cuda_linear_attention.md): production's prefill
#          and the patched one in the dev harness, each tested against the CPU reference, benched
#          twice alternately
#   conv:  kernels/dev/short_conv/run.sh: short-conv prefill variants (more bytes in flight: deeper
#          register prefetch, cp.async row blocks in shared memory) bitwise against production, then
#          timed at GLM-5.3-Flash's q|k|v shape (production: ~1.75 TB/s, 0.46 ms a call at 482a8d3)
#   hc:    kernels/dev/hyper/run.sh: production's hc_post_coeff (its projection on tensor cores as
#          3xTF32 since 2026-12-05: 0.381 ms a call, 7 a forward) and the variant file HC_VARIANT
#          (none queued), each against the CPU reference, then timed at GLM-5.3-Flash's shape
#   idx:   kernels/dev/indexer/run.sh: production's wgmma indexer scores (kernels/indexer_wgmma.cu,
#          since 2026-12-06) tested against fp64 with both Top-Ks, then benched beside the mma.sync
#          indexer of kernels/indexer.cu
# (Lost and gone: the up GEMM with the activation in its epilogue and hc_post_coeff double-buffered
# by cp.async, docs/perf/experiments_2026-12-03e.txt; the SwiGLU GEMM on the swap-AB kernel,
# docs/perf/experiments_2026-12-04.txt.)
O=${OUT:-/tmp/exp}
parts=${*:-smla smlaprof moe laprof conv hc idx}
for p in $parts; do
  mkdir -p "$O/$p"
  t0=$(date +%s)
  case $p in
    smla) OUT=$O/smla timeout 400 bash kernels/dev/sparse_mla/run.sh $SMLA_VARIANT ;;
    smlaprof) OUT=$O/smlaprof timeout 300 bash kernels/dev/sparse_mla/profile.sh $SMLAPROF_VARIANT ;;
    moe)
      OUT=$O/moe timeout 380 bash kernels/dev/moe_gemm/run_device.sh $MOE_VARIANT
      for b in mg mg_other; do
        [ -x /tmp/$b ] || continue
        DZ_BENCH_ROWS=kernels/dev/moe_gemm/rows_glm5_3_flash_dummy_T8192.txt timeout 40 /tmp/$b --bench GLM 2>&1 |
          grep -E "rows per|grouped_gemm_tc|swiglu|clusters|spot" | sed "s/^/$b: /"
        DZ_BENCH_ROWS=kernels/dev/moe_gemm/rows_qwen3_5_dummy_T8192.txt timeout 40 /tmp/$b --bench "Qwen3.5-35B-A3B T=8192" 2>&1 |
          grep -E "rows per|grouped_gemm_tc|swiglu|clusters|spot" | sed "s/^/$b: /"
      done | tee $O/moe/bench_rows.txt ;;
    laprof) OUT=$O/laprof timeout 420 bash kernels/dev/linear_attn/profile.sh ;;
    laab) OUT=$O/laab timeout 480 bash kernels/dev/linear_attn/ab.sh ${LA_PATCH:?LA_PATCH: a patch of kernels/linear_attn_mma.cu} ;;
    conv) OUT=$O/conv timeout 200 bash kernels/dev/short_conv/run.sh ;;
    idx) OUT=$O/idx timeout 330 bash kernels/dev/indexer/run.sh ;;
    hc) OUT=$O/hc timeout 400 bash kernels/dev/hyper/run.sh $HC_VARIANT ;;
    *) echo "unknown part $p" ;;
  esac
  echo "== $p: rc $? in $(($(date +%s) - t0)) s"
done
