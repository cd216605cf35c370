// The base of every token mixer's per-sequence state (linear-attention state + conv tail, KV /
// latent caches): here, below the backend, so the states (model/attn_cache.hpp AttnCache,
// model/la_state.hpp LaState) and the modules' interfaces share it without a cycle.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace dz {

struct MixerState {
  virtual ~MixerState() = default;
  virtual std::unique_ptr<MixerState> clone() const = 0;  // snapshot (speculative decode, tests)
  int64_t pos = 0;                                        // tokens already consumed
  // The device buffers a captured decode step reads and writes in place (a replayed graph is valid
  // only while they stay where they were at capture).
  virtual std::vector<const void*> device_buffers() const { return {}; }
  // The sparse attention's choices in the last forward call ([T_last, width], ascending, -1
  // padded: DSA key positions, or DeepSeek-V4's compressed-entry ids); false for a mixer without.
  virtual bool topk_sets(std::vector<int32_t>& sel, int64_t& width) const {
    (void)sel;
    (void)width;
    return false;
  }
};

}  // namespace dz
