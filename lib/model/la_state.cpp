// The linear-attention state pool (model/la_state.hpp) and the slot handle LaState.
#include "core/error.hpp"
#include "model/la_state.hpp"

namespace dz {

LaPool::LaPool(Backend& be, const Shape& state, const Shape& conv, DType conv_dtype)
    : be_(&be), sshape_(state), cshape_(conv), cdt_(conv_dtype) {
  DZ_CHECK(state.size() == 3 && conv.size() == 2, "LaPool: state ", shape_str(state), ", conv ", shape_str(conv));
}

void LaPool::grow() {
  const int64_t cap = capacity(), cap2 = cap == 0 ? 1 : 2 * cap;
  DTensor S2 = be_->alloc({cap2, sshape_[0], sshape_[1], sshape_[2]}, DType::F32);
  DTensor C2 = be_->alloc({cap2, cshape_[0], cshape_[1]}, cdt_);
  if (cap > 0) {
    const int64_t nS = numel(sshape_), nC = numel(cshape_);
    be_->copy_rows(S_.reshaped({cap, nS}), 0, S2.reshaped({cap2, nS}), 0, cap);
    if (nC > 0) be_->copy_rows(C_.reshaped({cap, nC}), 0, C2.reshaped({cap2, nC}), 0, cap);
  }
  S_ = std::move(S2);
  C_ = std::move(C2);
  used_.resize(size_t(cap2), false);
}

int32_t LaPool::acquire() {
  int32_t s = 0;
  while (s < capacity() && used_[size_t(s)]) ++s;
  if (s == capacity()) grow();
  used_[size_t(s)] = true;
  ++live_;
  be_->fill_zero(state(s));
  be_->fill_zero(conv(s));
  return s;
}

void LaPool::release(int32_t slot) {
  DZ_CHECK(slot >= 0 && slot < capacity() && used_[size_t(slot)], "LaPool: release of slot ", slot, " not in use");
  used_[size_t(slot)] = false;
  if (--live_ == 0) {  // the last state went: give the memory back
    S_ = DTensor{};
    C_ = DTensor{};
    used_.clear();
  }
}

DTensor LaPool::state(int32_t slot) const {
  DZ_CHECK(slot >= 0 && slot < capacity(), "LaPool: slot ", slot, " of ", capacity());
  return S_.slab(slot, slot + 1).reshaped(sshape_);
}

DTensor LaPool::conv(int32_t slot) const {
  DZ_CHECK(slot >= 0 && slot < capacity(), "LaPool: slot ", slot, " of ", capacity());
  return C_.slab(slot, slot + 1).reshaped(cshape_);
}

LaState::LaState(std::shared_ptr<LaPool> p) : pool(std::move(p)) {
  DZ_CHECK(pool, "LaState without a pool");
  slot = pool->acquire();
}

LaState::~LaState() {
  if (pool && slot >= 0) pool->release(slot);
}

std::unique_ptr<MixerState> LaState::clone() const {
  auto c = std::make_unique<LaState>(pool);  // may grow the pool: views are taken after
  c->pos = pos;
  Backend& be = pool->backend();
  const DTensor s = S(), d = c->S();
  be.copy_rows(s.reshaped({1, s.numel()}), 0, d.reshaped({1, d.numel()}), 0, 1);
  const DTensor cs = conv(), cd = c->conv();
  if (cs.numel()) be.copy_rows(cs, 0, cd, 0, cs.rows());
  return c;
}

}  // namespace dz
