#include "job/doc_compute.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dz {

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int32_t choose_token(const float* logits, int64_t V, double temperature, uint64_t seed, int64_t doc, int64_t step) {
  if (temperature <= 0.0) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
  double mx = logits[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(logits[i]));
  std::vector<double> p(static_cast<size_t>(V));
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += (p[size_t(i)] = std::exp((double(logits[i]) - mx) / temperature));
  uint64_t r = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(doc)) ^ uint64_t(step));
  double u = double(r >> 11) * (1.0 / 9007199254740992.0) * s;  // uniform in [0, s)
  double c = 0;
  for (int64_t i = 0; i < V; ++i) {
    c += p[size_t(i)];
    if (u < c) return int32_t(i);
  }
  return int32_t(V - 1);
}

DocResult compute_document(const Model& model, int64_t doc, const std::vector<int32_t>& tokens, const ModeParams& p,
                           const std::function<void()>& tick) {
  auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& cfg = model.config();
  const int64_t L = int64_t(tokens.size()), V = cfg.vocab_size, D = cfg.hidden_size;
  DZ_CHECK(L > 0, "document ", doc, " is empty");
  DocResult r;
  r.doc = doc;
  r.stats.tokens = L;
  Model::State st = model.make_state();
  Tensor hidden = model.forward(tokens.data(), L, st, tick);  // [L, D]
  const int64_t B = 32;                                       // logits rows at a time: [B, V]
  std::vector<float> logits(size_t(B * V));
  switch (p.mode) {
    case OutputMode::Logprobs: {
      r.values.resize(size_t(L - 1));
      for (int64_t t0r = 0; t0r < L - 1; t0r += B) {
        int64_t n = std::min(B, L - 1 - t0r);
        model.logits(hidden.row(t0r), n, logits.data());
        for (int64_t j = 0; j < n; ++j)
          r.values[size_t(t0r + j)] = float(log_softmax_at(&logits[size_t(j * V)], V, tokens[size_t(t0r + j + 1)]));
      }
      break;
    }
    case OutputMode::TopK: {
      const int64_t K = p.topk;
      DZ_CHECK(K >= 1 && K <= V, "--topk ", K, " must be in [1, vocab size ", V, "]");
      r.ids.resize(size_t(L * K));
      r.values.resize(size_t(L * K));
      std::vector<float> lp(static_cast<size_t>(V));
      std::vector<int32_t> idx(static_cast<size_t>(V));
      for (int64_t t0r = 0; t0r < L; t0r += B) {
        int64_t n = std::min(B, L - t0r);
        model.logits(hidden.row(t0r), n, logits.data());
        for (int64_t j = 0; j < n; ++j) {
          log_softmax(&logits[size_t(j * V)], V, lp.data());
          std::iota(idx.begin(), idx.end(), 0);
          // highest log-prob first; lower id first on ties
          std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t a, int32_t b) {
            return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b);
          });
          for (int64_t k = 0; k < K; ++k) {
            r.ids[size_t((t0r + j) * K + k)] = idx[size_t(k)];
            r.values[size_t((t0r + j) * K + k)] = lp[size_t(idx[size_t(k)])];
          }
        }
      }
      break;
    }
    case OutputMode::LastLogits: {
      r.values.resize(size_t(V));
      model.logits(hidden.row(L - 1), 1, r.values.data());
      break;
    }
    case OutputMode::Generate: {
      std::vector<float> last(static_cast<size_t>(V));
      model.logits(hidden.row(L - 1), 1, last.data());
      for (int64_t s = 0; s < p.max_new_tokens; ++s) {
        int32_t tok = choose_token(last.data(), V, p.temperature, p.seed, doc, s);
        r.ids.push_back(tok);
        if (tok == cfg.eos_token_id || s + 1 == p.max_new_tokens) break;
        Tensor h = model.forward(&tok, 1, st, tick);
        model.logits(h.ptr(), 1, last.data());
      }
      break;
    }
  }
  (void)D;
  r.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

namespace {
struct Header {
  int64_t doc, tokens;
  double seconds;
  int32_t rank, pad;
  uint64_t n_ids, n_values;
};
}  // namespace

std::vector<char> pack(const DocResult& r) {
  Header h{r.doc, r.stats.tokens, r.stats.seconds, r.stats.rank, 0, r.ids.size(), r.values.size()};
  std::vector<char> b(sizeof h + r.ids.size() * 4 + r.values.size() * 4);
  std::memcpy(b.data(), &h, sizeof h);
  if (!r.ids.empty()) std::memcpy(b.data() + sizeof h, r.ids.data(), r.ids.size() * 4);
  if (!r.values.empty()) std::memcpy(b.data() + sizeof h + r.ids.size() * 4, r.values.data(), r.values.size() * 4);
  return b;
}

DocResult unpack(const std::vector<char>& b) {
  Header h;
  DZ_CHECK(b.size() >= sizeof h, "result message too short (", b.size(), " bytes)");
  std::memcpy(&h, b.data(), sizeof h);
  DZ_CHECK(b.size() == sizeof h + (h.n_ids + h.n_values) * 4, "result message of ", b.size(), " bytes is malformed");
  DocResult r;
  r.doc = h.doc;
  r.stats.tokens = h.tokens;
  r.stats.seconds = h.seconds;
  r.stats.rank = h.rank;
  r.ids.resize(size_t(h.n_ids));
  r.values.resize(size_t(h.n_values));
  if (h.n_ids) std::memcpy(r.ids.data(), b.data() + sizeof h, h.n_ids * 4);
  if (h.n_values) std::memcpy(r.values.data(), b.data() + sizeof h + h.n_ids * 4, h.n_values * 4);
  return r;
}

}  // namespace dz
