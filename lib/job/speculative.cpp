#include "job/speculative.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/hash.hpp"

namespace dz {

NgramDrafter::NgramDrafter(const std::vector<int32_t>& prompt) {
  ctx_.reserve(prompt.size() + 256);
  for (int n = kMinN; n <= kMaxN; ++n) next_[n].reserve(prompt.size());
  for (int32_t t : prompt) push(t);
}

uint64_t NgramDrafter::hash(int64_t end, int n) const {
  uint64_t h = uint64_t(n);
  for (int64_t i = end - n; i < end; ++i) h = splitmix64(h ^ uint64_t(uint32_t(ctx_[size_t(i)])));
  return h;
}

bool NgramDrafter::same(int64_t a_end, int64_t b_end, int n) const {
  for (int i = 1; i <= n; ++i)
    if (ctx_[size_t(a_end - i)] != ctx_[size_t(b_end - i)]) return false;
  return true;
}

void NgramDrafter::push(int32_t token) {
  const int64_t i = int64_t(ctx_.size());  // the new token's index: the gram ending before it is followed by it
  ctx_.push_back(token);
  for (int n = kMinN; n <= kMaxN; ++n)
    if (i >= n) next_[n][hash(i, n)] = i;
}

std::vector<int32_t> NgramDrafter::draft(int64_t k) const {
  const int64_t L = int64_t(ctx_.size());
  for (int n = kMaxN; n >= kMinN && k > 0; --n) {
    if (L < n + 1) continue;  // a suffix and at least one token before it
    const auto it = next_[n].find(hash(L, n));
    if (it == next_[n].end()) continue;
    const int64_t p = it->second;  // ctx_[p - n, p) equals the suffix (p < L: the suffix itself has no follower)
    if (p >= L || !same(p, L, n)) continue;  // a hash collision, or the suffix itself
    const int64_t e = std::min(L, p + k);
    return std::vector<int32_t>(ctx_.begin() + p, ctx_.begin() + e);
  }
  return {};
}

int32_t accept_or_resample(const float* logits, int64_t V, double temperature, int32_t d, double u, double w,
                           bool* accepted) {
  DZ_CHECK(temperature > 0 && d >= 0 && d < V, "accept_or_resample: temperature ", temperature, ", draft ", d, " of ", V);
  double mx = logits[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(logits[i]));
  std::vector<double> p(static_cast<size_t>(V));
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += (p[size_t(i)] = std::exp((double(logits[i]) - mx) / temperature));
  const double pd = p[size_t(d)] / s;
  if (u < pd) {
    *accepted = true;
    return d;
  }
  *accepted = false;
  // the residual: p without d (min(p, q) removed from p, q all on d), renormalised
  const double rs = s - p[size_t(d)];
  if (!(rs > 0)) return d;  // p is all on d (then u < pd held unless rounding): nothing else to draw
  const double target = w * rs;
  double c = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < V; ++i) {
    if (i == d || p[size_t(i)] <= 0) continue;
    c += p[size_t(i)];
    last = i;
    if (target < c) return int32_t(i);
  }
  return int32_t(last);
}

double spec_uniform(uint64_t seed, int64_t doc, int64_t index, int which) {
  // a stream of its own (0x5bec...), apart from choose_token's (seed, doc, step) stream
  const uint64_t r = splitmix64(splitmix64(splitmix64(seed ^ 0x5bec0de5bec0de5bull) ^ uint64_t(doc)) ^
                                (uint64_t(index) * 4 + uint64_t(which)));
  return double(r >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace dz
