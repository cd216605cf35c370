#!/usr/bin/env bash
# On the GPU node, from the repository root, after scripts/device-bundle.sh's .dev/ was carried:
#   source scripts/device-unpack.sh
# unpacks the prefix into .prefix, fla into /tmp/fla and the transformers 5.23 wheel into
# /tmp/tf523, checks that fla imports (transformers falls back to its slow PyTorch kernels, and the
# anchor silently measures those, when it does not), and exports PREFIX, FLA, TF523, ANCHOR.
tar xJf .dev/prefix.tar.xz
export PREFIX=$PWD/.prefix
if [[ -f .dev/fla.tar.xz ]]; then
  mkdir -p /tmp/fla && tar xJf .dev/fla.tar.xz -C /tmp/fla
  export FLA=/tmp/fla
  PYTHONPATH=$FLA python3 -c "import fla, fla.ops.kda, fla.ops.gated_delta_rule; print('[device-unpack] fla', fla.__version__)" ||
    echo "[device-unpack] fla does NOT import: anchors would measure transformers' PyTorch fallbacks"
fi
if ls .dev/transformers-5.23.0-*.whl >/dev/null 2>&1; then
  pip install -q --no-deps --target /tmp/tf523 .dev/transformers-5.23.0-*.whl >/dev/null 2>&1
  export TF523=/tmp/tf523
fi
[[ -f .dev/e2e_transformers.py ]] && export ANCHOR=$PWD/.dev/e2e_transformers.py
echo "[device-unpack] PREFIX=$PREFIX FLA=${FLA:-} TF523=${TF523:-} ANCHOR=${ANCHOR:-}"
