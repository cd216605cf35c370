// The mixers' default speculative-decoding undo (Mixer::spec_begin / spec_keep, DESIGN §11): the
// softmax-attention caches (MLA latent and DSA index keys, GQA K / V) keep one row per token, so
// undoing rejected rows is cutting them off. Recurrent mixers override (la_mixer.cpp,
// dsv4_mixer.cpp).
#include "core/error.hpp"
#include "model/attn_cache.hpp"
#include "model/module.hpp"

namespace dz {

namespace {
struct CacheMark : SpecRecord {
  int64_t pos0 = 0, latent = 0, index_k = 0, k = 0, v = 0;
};
}  // namespace

void Mixer::spec_begin(MixerState& st, SpecRestore, Copies*) const {
  auto* c = dynamic_cast<AttnCache*>(&st);
  DZ_CHECK(c, "speculative decoding: this mixer's state cannot undo a verify forward");
  auto m = std::make_unique<CacheMark>();
  m->pos0 = c->pos;
  m->latent = c->latent.rows(), m->index_k = c->index_k.rows(), m->k = c->k.rows(), m->v = c->v.rows();
  c->spec = std::move(m);
}

void Mixer::spec_keep(MixerState& st, int64_t keep, Copies*) const {
  auto* c = dynamic_cast<AttnCache*>(&st);
  auto* m = c ? dynamic_cast<CacheMark*>(c->spec.get()) : nullptr;
  DZ_CHECK(m, "speculative decoding: spec_keep without spec_begin on an attention cache");
  const int64_t T = c->pos - m->pos0;  // rows the verify forward appended
  DZ_CHECK(keep >= 1 && keep <= T, "speculative decoding: keep ", keep, " of a verify forward of ", T, " rows");
  // every store that grew by T rows in the verify forward keeps `keep` of them
  auto cut = [&](RowStore& r, int64_t n0) {
    if (r.rows() > n0) {
      DZ_CHECK(r.rows() == n0 + T, "speculative decoding: a cache grew by ", r.rows() - n0, " rows in a verify forward of ",
               T);
      r.truncate(n0 + keep);
    }
  };
  cut(c->latent, m->latent);
  cut(c->index_k, m->index_k);
  cut(c->k, m->k);
  cut(c->v, m->v);
  c->pos = m->pos0 + keep;
  c->spec.reset();
}

}  // namespace dz
