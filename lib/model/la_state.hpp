// The per-sequence state of the linear-attention mixers (layout: ops/linear_attn.hpp), kept in a
// pool of slots per layer on the mixer's backend. Model state, above the backend.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "core/tensor.hpp"
#include "ops/mixer_state.hpp"

namespace dz {

// ---- Per-sequence state of a KDA / GDN mixer, in a pool of slots ----
// S [HV, K, V] F32 as above; conv [W-1, C] (act dtype) the short-convolution tail (see
// short_conv.hpp) over the channels [q | k | v] concatenated (KDA: C = H*K + H*K + H*V, GDN:
// 2*HK*K + HV*V), for the heads of this TP rank, on the mixer's backend.
//
// Every state of one layer lives in that layer's pool (DESIGN §10 state pools): slot s is row s of
// states [cap, HV, K, V] and of convs [cap, W-1, C], so a batched decode step runs one kernel over
// the batch's slots in place (Backend::la_decode_slots / short_conv_slots), with no copies. A new
// slot is zeroed; the lowest free one is taken; a full pool doubles (every slot copied: the base
// addresses move, so a decode graph captures again), and an empty one frees its memory.
class LaPool {
 public:
  LaPool(Backend& be, const Shape& state, const Shape& conv, DType conv_dtype);
  int32_t acquire();
  void release(int32_t slot);
  DTensor state(int32_t slot) const;  // [HV, K, V] view of the slot
  DTensor conv(int32_t slot) const;   // [W-1, C] view of the slot
  const DTensor& states() const { return S_; }  // [cap, HV, K, V]
  const DTensor& convs() const { return C_; }   // [cap, W-1, C]
  int32_t capacity() const { return int32_t(used_.size()); }
  int32_t live() const { return live_; }
  Backend& backend() const { return *be_; }

 private:
  void grow();
  Backend* be_;
  Shape sshape_, cshape_;
  DType cdt_;
  DTensor S_, C_;
  std::vector<bool> used_;
  int32_t live_ = 0;
};

// A sequence's slot in its layer's pool (released when the state goes). Public so that the
// context-parallel prefill can set the state after a document.
struct LaState : MixerState {
  explicit LaState(std::shared_ptr<LaPool> p);
  ~LaState() override;
  LaState(const LaState&) = delete;
  LaState& operator=(const LaState&) = delete;
  std::shared_ptr<LaPool> pool;
  int32_t slot = -1;
  DTensor S() const { return pool->state(slot); }
  DTensor conv() const { return pool->conv(slot); }
  std::unique_ptr<MixerState> clone() const override;  // a new slot of the same pool, same contents
  std::vector<const void*> device_buffers() const override {
    return {pool->states().data, pool->convs().data, reinterpret_cast<const void*>(intptr_t(slot))};
  }
};

}  // namespace dz
