#!/usr/bin/env bash
# Packs what a GPU node without internet needs beside the tree (DESIGN §8) into .dev/ (ignored by
# git): the offline Debian prefix (xz: the tree plus the prefix unpacked exceeds the device tool's
# 64 MiB carry), the transformers 5.23 wheel and fla as source for the anchors, and the anchor
# script. On the node, `source scripts/device-unpack.sh` unpacks them and exports PREFIX, FLA, TF523
# and ANCHOR for scripts/gpu-tests.sh and scripts/bench-e2e-gpu.sh.
#   bash scripts/device-bundle.sh [FLA_GIT_DIR] [ANCHOR_PY]
# FLA_GIT_DIR: a git directory of flash-linear-attention (e.g. a bare mirror); its HEAD's fla/
# package is archived. ANCHOR_PY defaults to ../shared/anchors/e2e_transformers.py.
set -euo pipefail
cd "$(dirname "$0")/.."
FLA_GIT=${1:-}
ANCHOR=${2:-../shared/anchors/e2e_transformers.py}
mkdir -p .dev
[[ -d .prefix/usr ]] || bash scripts/offline-prefix.sh download "$PWD/.prefix"
tar cJf .dev/prefix.tar.xz .prefix
ls .dev/transformers-5.23.0-*.whl >/dev/null 2>&1 || pip download -q --no-deps transformers==5.23.0 -d .dev/
if [[ -n $FLA_GIT ]]; then
  # fla/ at the archive's top: unpacked into D, the package is D/fla and PYTHONPATH=D
  git -C "$FLA_GIT" archive HEAD fla | xz > .dev/fla.tar.xz
  git -C "$FLA_GIT" rev-parse --short HEAD > .dev/fla.commit
fi
[[ -f $ANCHOR ]] && cp "$ANCHOR" .dev/e2e_transformers.py
tree_mb=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
dev_mb=$(du -cb .dev | tail -1 | cut -f1)
echo "[device-bundle] .dev: $(ls .dev | tr '\n' ' ')"
echo "[device-bundle] tracked tree $((tree_mb >> 20)) MiB + .dev $((dev_mb >> 20)) MiB (carry limit 64 MiB): carry [\".dev\"]"
