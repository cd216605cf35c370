#include "model/module.hpp"

namespace dz {

// Every mixer overrides this; the base exists only so a mixer under development links.
void Mixer::forward_cp(const float*, const CpCtx&, MixerState&, float*) const {
  fail("this token mixer has no context-parallel prefill");
}

}  // namespace dz
