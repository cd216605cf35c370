// `dayzero bench sparse-attn`: times the sparse-attention kernels on the current GPU (CUDA events,
// median of repeats) and writes a JSON report (commit from $DZ_COMMIT, device, date, results).
#pragma once
#include <string>

namespace dz::cuda {

// Returns 0 on success. json_out: path of the report ("" prints it only).
int bench_sparse_attn(const std::string& json_out);

}  // namespace dz::cuda
