// Timing of the linear-attention kernels at the DESIGN §7 shapes (H200 targets), for
// `dayzero bench linear-attn`: CUDA events, median of repeats, JSON with commit, device and date.
#pragma once
#include <string>

namespace dz::cuda {

// Runs the bench on the current device and writes `json_out`; returns 0 on success.
int bench_linear_attn(const std::string& json_out);

}  // namespace dz::cuda
