#!/usr/bin/env python3
"""How far transformers' own bf16 run of each golden model drifts from its fp32 run, on the GPU.

This is the yardstick for dayzero's CUDA backend (DESIGN §10, tests/gpu/test_model_gpu.cpp): a
bf16 forward of the same weights cannot be expected to land closer to fp32 than the reference
implementation's own bf16 forward does. For each golden family the script loads
tests/golden/<family> with transformers (fp32, TF32 off, eager attention), scores the golden
documents (golden.h5's /tokens, /offsets, one document at a time, as make_golden.py), casts the
model to bf16, scores them again, and reports mean and max |log-prob(bf16) - log-prob(fp32)|; it
also reports |fp32 on this GPU - the committed CPU golden| as a sanity check.

  python3 tests/golden/bf16_drift.py --out bf16_drift.json [--families kimi_linear,qwen3_next]

Run on the GPU machine with transformers 5.23 (its torch fallbacks need neither fla nor
causal_conv1d, which are blocked here as in make_golden.py).
"""
import argparse
import json
import os
import sys

os.environ["USE_HUB_KERNELS"] = "0"
for _blocked in ("fla", "causal_conv1d"):
    sys.modules[_blocked] = None

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

HERE = os.path.dirname(os.path.abspath(__file__))


@torch.no_grad()
def score(model, tokens, offsets, device):
    out = []
    for d in range(len(offsets) - 1):
        ids = torch.from_numpy(tokens[offsets[d]:offsets[d + 1]].astype(np.int64))[None].to(device)
        logits = model(input_ids=ids, use_cache=False).logits[0].double()
        lsm = torch.log_softmax(logits, dim=-1)
        out.append(lsm[:-1].gather(1, ids[0, 1:, None])[:, 0].cpu().numpy())
    return np.concatenate(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="kimi_linear,qwen3_next,deepseek_v32")
    ap.add_argument("--merge", help="add the results to this JSON (existing families kept)")
    args = ap.parse_args()
    device = "cuda"
    res = {"transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0)}
    for fam in args.families.split(","):
        d = os.path.join(HERE, fam)
        with h5py.File(os.path.join(d, "golden.h5"), "r") as f:
            tokens, offsets, golden = f["/tokens"][:], f["/offsets"][:], f["/logprobs"][:]
        # the class that saved it (a multimodal wrapper is not an AutoModelForCausalLM)
        arch = json.load(open(os.path.join(d, "config.json")))["architectures"][0]
        model = getattr(transformers, arch).from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager").to(device).eval()
        lp32 = score(model, tokens, offsets, device)
        model = model.to(torch.bfloat16)
        lp16 = score(model, tokens, offsets, device)
        drift = np.abs(lp16 - lp32)
        res[fam] = {"n": int(drift.size), "mean_abs": float(drift.mean()), "max_abs": float(drift.max()),
                    "fp32_gpu_vs_cpu_golden_max_abs": float(np.abs(lp32 - golden).max())}
        print(fam, json.dumps(res[fam]), flush=True)
        del model
        torch.cuda.empty_cache()
    if args.merge:
        old = json.load(open(args.merge))
        old.update({k: v for k, v in res.items() if isinstance(v, dict)})
        old.setdefault("versions", {}).update({k: res[k] for k in ("transformers", "torch", "device")})
        res = old
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
