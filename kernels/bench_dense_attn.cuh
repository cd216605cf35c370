// `dayzero bench dense-attn`: times the dense causal attention kernel of the prefill (flash_attention:
// the wgmma kernel where it applies) at DESIGN §7's shapes, CUDA events, median of repeats, and
// writes a JSON report; its anchor is torch SDPA's flash backend (docs/perf/kernel_anchors.py, both
// in one device command: scripts/bench-kernels-gpu.sh).
#pragma once
#include <string>

namespace dz::cuda {

// Returns 0 on success. json_out: path of the report ("" prints it only).
int bench_dense_attn(const std::string& json_out);

}  // namespace dz::cuda
