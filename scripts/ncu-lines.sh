#!/usr/bin/env bash
# Warp-stall samples per source line of one kernel, on this (CPU) machine, from the SASS page that
# `device-queue.sh ncu` brings back (NCU_SOURCE=<target>: ncu_source_<target>.csv in
# ncu_targets_raw.tar.xz):
#   bash scripts/ncu-lines.sh SOURCE.csv kernels/<file>.cu <mangled-name substring> [COMMIT] [N]
# builds kernels/<file>.cu as the project does (sm_90a, -O3 -DNDEBUG) plus -lineinfo, from COMMIT's
# sources when given (the profiled code; default: the working tree), and runs
# scripts/ncu_sass_lines.py over it. cuobjdump / nvdisasm: from PATH, else PyPI's
# nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels (fetched once into /tmp/nvd).
# Example (the GDN prep of a `gdn` source page): ... ncu_source_gdn.csv kernels/linear_attn_mma.cu
#   mma_prep_kernelILi128ELb0E c19e38d
set -euo pipefail
cd "$(dirname "$0")/.."
csv=${1:?SOURCE.csv} src=${2:?kernels/FILE.cu} kern=${3:?mangled-name substring} rev=${4:-} n=${5:-40}
if ! command -v nvdisasm >/dev/null || ! command -v cuobjdump >/dev/null; then
  if [[ ! -x /tmp/nvd/x/nvidia/cu13/bin/nvdisasm ]]; then
    python3 -m pip download -q --no-deps -d /tmp/nvd nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    mkdir -p /tmp/nvd/x
    for w in /tmp/nvd/*.whl; do python3 -m zipfile -e "$w" /tmp/nvd/x; done
    chmod +x /tmp/nvd/x/nvidia/cu13/bin/*
  fi
  export PATH=/tmp/nvd/x/nvidia/cu13/bin:$PATH
fi
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
root=.
if [[ -n $rev ]]; then  # the profiled commit's kernels/ and lib/ headers
  git archive "$rev" kernels lib | tar -x -C "$w"
  root=$w
fi
nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O3 -DNDEBUG -lineinfo -I"$root/kernels" -I"$root/lib" \
  -c "$root/$src" -o "$w/k.o" 2>/dev/null
(cd "$w" && cuobjdump -xelf all k.o >/dev/null)
cubin=$(ls "$w"/*.cubin | head -1)
python3 scripts/ncu_sass_lines.py "$csv" "$cubin" "$kern" "$n" ${rev:+--rev "$rev"}
