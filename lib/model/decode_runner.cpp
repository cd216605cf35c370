#include "model/decode_runner.hpp"

#include "core/error.hpp"

namespace dz {

DecodeRunner::DecodeRunner(const Model& m, bool graphs) : m_(m), graphs_(graphs) {
  DZ_CHECK(!graphs || m.backend().supports_graphs(), "decode graphs: the ", m.backend().name(),
           " backend has no graphs");
  // The runs of the stack: consecutive graph-safe sub-layers form one graph; the others run alone.
  const int64_t K = m.sublayers();
  for (int64_t k = 0; k < K;) {
    Run r;
    r.first = k;
    r.graph = graphs_ && m.graph_safe(k);
    ++k;
    if (r.graph)
      while (k < K && m.graph_safe(k)) ++k;
    r.last = k;
    runs_.push_back(std::move(r));
  }
}

DecodeRunner::~DecodeRunner() = default;

int64_t DecodeRunner::graph_runs() const {
  int64_t n = 0;
  for (const Run& r : runs_) n += r.graph;
  return n;
}

void DecodeRunner::reset(const std::vector<Model::State*>& states, std::vector<const void*> key) {
  for (Run& r : runs_) r.g.reset();
  warm_ = false;
  key_ = std::move(key);
  pass_ = m_.make_pass(int64_t(states.size()));
}

DTensor DecodeRunner::step(const int32_t* tokens, const std::vector<Model::State*>& states,
                           const std::function<void()>& tick) {
  const int64_t N = int64_t(states.size());
  DZ_CHECK(N >= 1, "decode step without documents");
  const size_t L = m_.layers_.size();
  for (const Model::State* st : states)
    DZ_CHECK(st && st->mixers.size() == L, "decode step: a state of ", st ? st->mixers.size() : 0, " layers for ", L);
  // What the graphs were captured on: the batch's graph-safe mixer states and their device buffers.
  std::vector<const void*> key;
  key.push_back(reinterpret_cast<const void*>(N));
  for (const Run& r : runs_)
    for (int64_t k = r.first; r.graph && k < r.last; ++k)
      if (k % 2 == 0)
        for (const Model::State* st : states) {
          const MixerState& ms = *st->mixers[size_t(k / 2)];
          key.push_back(&ms);
          for (const void* b : ms.device_buffers()) key.push_back(b);
        }
  if (key != key_) reset(states, std::move(key));

  m_.embed_into(tokens, pass_);
  std::vector<int64_t> cu(size_t(N) + 1);
  for (int64_t b = 0; b <= N; ++b) cu[size_t(b)] = b;
  const Model::MixFn mix = [&](size_t i, const Mixer& mx, const DTensor& x, const DTensor& out) {
    std::vector<MixerState*> ms(static_cast<size_t>(N));
    for (int64_t b = 0; b < N; ++b) ms[size_t(b)] = states[size_t(b)]->mixers[i].get();
    mx.forward_packed(x, cu, ms, out);
  };
  Backend& be = m_.backend();
  for (Run& r : runs_) {
    if (!r.graph || !warm_) {  // eager; the first step of a batch warms up (lazy module loads, GEMM plans)
      for (int64_t k = r.first; k < r.last; ++k) m_.sublayer(k, mix, pass_, nullptr);
    } else if (r.g) {
      r.g->launch();
      ++replays_;
      // The host side of what the graph did: each graph-safe mixer consumed one token per state
      // (Mixer::graph_safe_decode), the AttnRes stream counted its sites and blocks.
      for (int64_t k = r.first; k < r.last; ++k)
        if (k % 2 == 0)
          for (Model::State* st : states) st->mixers[size_t(k / 2)]->pos += 1;
      if (pass_.ar) pass_.ar->n_blocks = r.ar_blocks, pass_.ar->next_site = r.ar_site;
    } else {
      be.capture_begin();
      try {
        for (int64_t k = r.first; k < r.last; ++k) m_.sublayer(k, mix, pass_, nullptr);
        r.g = be.capture_end();
      } catch (...) {
        be.capture_abort();
        throw;
      }
      r.g->launch();  // the capture recorded the run without running it
      ++captures_;
      if (pass_.ar) r.ar_blocks = pass_.ar->n_blocks, r.ar_site = pass_.ar->next_site;
    }
    if (tick) tick();
  }
  warm_ = true;
  DTensor y = m_.finish(pass_);
  for (Model::State* st : states) st->pos += 1;
  return y;
}

}  // namespace dz
