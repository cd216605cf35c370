// Short causal depthwise convolution + SiLU (the q/k/v "short conv" of KDA and Gated DeltaNet),
// CPU reference, fp32. Streams: the state carries the last W-1 inputs, so calling it chunk by
// chunk gives exactly (bit for bit) the same output as one call over the whole sequence.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "dist/comm.hpp"
#include "dist/seq_layout.hpp"

namespace dz {

// x [T, C]; w [C, W] (Hugging Face Conv1d weight [C, 1, W] with the middle dim dropped);
// bias [C] or nullptr; state [W-1, C] in/out, row 0 the oldest input (zeros at sequence start).
//   y[t, c] = silu(bias[c] + sum_{j<W} w[c, j] * x[t - (W-1) + j, c])
// where rows before t = 0 come from the state. This matches F.conv1d(padding=W-1)[..., :T]
// (w[c, W-1] multiplies the current token). y [T, C] must not alias x.
void short_conv_silu(const float* x, const float* w, const float* bias, int64_t T, int64_t C, int64_t W, float* state,
                     float* y);

// The same conv over one document laid out by `lay` over the CP group `comm` (context parallelism).
// x [R, C], y [R, C]: this rank's rows (local segments ascending, R = lay.local_rows()). Each
// segment needs the W-1 inputs before it, which may lie in earlier segments of other ranks (or
// span several short or empty segments): every rank contributes the last min(W-1, n_j) rows of
// each of its segments to one allgatherv on `comm`, and a segment's conv state is the last W-1
// rows of the concatenated tails of all earlier segments (zeros before the document). Outputs
// are bit-identical to one short_conv_silu over the whole document. state [W-1, C] out: the last
// W-1 inputs of the whole document (what decode continues from), the same on every rank.
void short_conv_silu_cp(const float* x, const float* w, const float* bias, int64_t C, int64_t W,
                        const SeqLayout& lay, const Collectives& comm, float* state, float* y);

// The conv halo of a document laid out by `lay`: every rank contributes the last
// tail_rows(lay, P, j) input rows of each of its segments j (P = W-1), and `gathered` is their
// allgatherv over the group (rank order, each rank's segments ascending). before(j) is then the
// P inputs before segment j, zeros before the document; before(lay.n_seg()) the document's last
// P inputs (decode's conv state). Used by short_conv_silu_cp and the linear-attention mixers.
class ConvHalo {
 public:
  static int64_t tail_rows(const SeqLayout& lay, int64_t P, int j) { return std::min(P, lay.seg_len(j)); }
  ConvHalo(const SeqLayout& lay, int64_t P, int64_t C, std::vector<float> gathered);
  std::vector<float> before(int j) const;  // [P, C]

 private:
  const SeqLayout& lay_;
  int64_t P_, C_;
  std::vector<float> all_;
  std::vector<size_t> at_;  // segment -> offset of its tail in all_
};

}  // namespace dz
