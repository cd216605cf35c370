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
};

}  // namespace dz
