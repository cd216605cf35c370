// Host loops over large buffers (weight generation, bf16 conversion at upload) spread over the
// node's cores: f(begin, end) on disjoint ranges of [0, n). Small n runs inline.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace dz {

template <class F>
void parallel_for(int64_t n, F&& f, int64_t min_chunk = int64_t(1) << 20) {
  const int64_t hw = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  const int64_t parts = std::min<int64_t>(hw, (n + min_chunk - 1) / min_chunk);
  if (parts <= 1) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
  std::vector<std::thread> th;
  th.reserve(size_t(parts - 1));
  const int64_t step = (n + parts - 1) / parts;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t b = p * step, e = std::min(n, b + step);
    if (b < e) th.emplace_back([&f, b, e] { f(b, e); });
  }
  f(int64_t(0), std::min(n, step));
  for (auto& t : th) t.join();
}

}  // namespace dz
