// The per-sequence caches of the softmax-attention mixers (MLA latent / DSA index keys, GQA K / V)
// on a backend, and the check of a packed forward's caches. Model state, above the backend (the
// attention math itself is ops/attention.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "ops/mixer_state.hpp"

namespace dz {

// Rows [n, width] appended on a backend (capacity doubling, so decode appends are amortised O(1)).
struct RowStore {
  Backend* be = nullptr;
  DTensor buf;  // [capacity, width]
  int64_t n = 0, width = 0;
  DType dtype = DType::F32;

  void init(Backend& b, int64_t w, DType dt) {
    be = &b;
    width = w;
    dtype = dt;
    n = 0;
    buf = DTensor{};
  }
  int64_t rows() const { return n; }
  // A view of rows [r0, r1).
  DTensor view(int64_t r0, int64_t r1) const;
  DTensor all() const { return view(0, n); }
  // Grows by k rows and returns the view to write them into.
  DTensor append(int64_t k);
  // Drops the rows from r on (r <= rows(); the capacity stays).
  void truncate(int64_t r) {
    DZ_CHECK(r >= 0 && r <= n, "RowStore: truncate to ", r, " of ", n, " rows");
    n = r;
  }
  std::vector<float> host() const;
  RowStore deep_copy() const;
  bool operator==(const RowStore& o) const { return host() == o.host(); }
  bool operator==(const std::vector<float>& o) const { return host() == o; }
};

// Per-sequence cache of a softmax-attention mixer. Grows by T rows per forward call; rows are
// token positions 0 .. pos-1, on the mixer's backend. Public so that the CP runtime can gather
// latent KV / indexer keys.
struct AttnCache : MixerState {
  // MLA: one row per token, [c | k_pe] (what the absorbed kernels read as the key, the first R
  // columns being the value): c [kv_lora_rank] after kv_a_layernorm, k_pe [qk_rope_head_dim]
  // after RoPE (raw when the family is NoPE).
  RowStore latent;   // [pos, kv_lora_rank + qk_rope_head_dim]
  RowStore index_k;  // [pos, index_head_dim] DSA indexer keys after LayerNorm + RoPE (host F32)
  // GQA
  RowStore k;  // [pos, Hkv * D] after k_norm + RoPE
  RowStore v;  // [pos, Hkv * D]
  // DSA: Top-K positions chosen in the last forward call, [T_last, topk_width], ascending, -1
  // padded (diagnostics and tests; not needed for the next call). Kept as the call's selection
  // tensors (in row order, on sel_be's device) and downloaded only when asked, so a decode step
  // does not wait for the GPU once per DSA layer.
  std::vector<DTensor> last_sel;
  Backend* sel_be = nullptr;
  std::vector<int32_t> last_topk() const;
  int64_t topk_width = 0;
  bool topk_sets(std::vector<int32_t>& sel, int64_t& width) const override {
    if (topk_width <= 0) return false;
    sel = last_topk();
    width = topk_width;
    return true;
  }

  std::unique_ptr<MixerState> clone() const override;
};

// The caches of a packed forward's documents (Mixer::forward_packed of an attention mixer): checks
// the offsets (N + 1 from 0 to rows, non-decreasing) and that every state is an AttnCache (`who`
// names the mixer); *fresh = every document at position 0 with empty caches (a packed prefill).
std::vector<AttnCache*> packed_caches(const std::vector<int64_t>& cu, const std::vector<MixerState*>& sts, int64_t rows,
                                      const char* who, bool* fresh);

}  // namespace dz
