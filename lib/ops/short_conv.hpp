// Short causal depthwise convolution + SiLU (the q/k/v "short conv" of KDA and Gated DeltaNet),
// CPU reference, fp32. Streams: the state carries the last W-1 inputs, so calling it chunk by
// chunk gives exactly (bit for bit) the same output as one call over the whole sequence.
#pragma once
#include <cstdint>

namespace dz {

// x [T, C]; w [C, W] (Hugging Face Conv1d weight [C, 1, W] with the middle dim dropped);
// bias [C] or nullptr; state [W-1, C] in/out, row 0 the oldest input (zeros at sequence start).
//   y[t, c] = silu(bias[c] + sum_{j<W} w[c, j] * x[t - (W-1) + j, c])
// where rows before t = 0 come from the state. This matches F.conv1d(padding=W-1)[..., :T]
// (w[c, W-1] multiplies the current token). y [T, C] must not alias x.
void short_conv_silu(const float* x, const float* w, const float* bias, int64_t T, int64_t C, int64_t W, float* state,
                     float* y);

}  // namespace dz
