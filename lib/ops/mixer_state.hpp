// The base of every token mixer's per-sequence state (linear-attention state + conv tail, KV /
// latent caches): here, below the backend, so the states (model/attn_cache.hpp AttnCache,
// model/la_state.hpp LaState) and the modules' interfaces share it without a cycle.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace dz {

// What a mixer keeps to undo a speculative verify forward (DESIGN §11; Mixer::spec_begin).
struct SpecRecord {
  virtual ~SpecRecord() = default;
};

// How the recurrent mixers undo the rejected rows of a verify forward (attention caches just
// truncate): Replay restores the state snapshot taken before the verify forward and runs the scan
// again over the kept rows (their pre-conv projections and gate inputs, recorded by the verify
// forward); PerToken keeps the state after every verify row and takes the kept row's.
enum class SpecRestore { Replay, PerToken };

struct MixerState {
  virtual ~MixerState() = default;
  // Set between Mixer::spec_begin and spec_keep: the next forward over this state is a verify
  // forward, and the mixer records in it what undoing that forward needs.
  std::unique_ptr<SpecRecord> spec;
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
