// Host helpers shared by the kernels/dev harnesses (their bf16 conversions are lib/core/bf16.hpp's).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace dz::dev {

// f(i) for every i < n on all cores, handed out `grain` indices at a time: the harnesses' fp64
// references cost unevenly per index (a causal row i costs ~i), so the work is taken on demand
// (lib/core/parallel.hpp splits a range into equal static parts instead).
template <class F>
void parallel_each(int64_t n, F&& f, int64_t grain = 1) {
  const int nt = int(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&] {
      for (;;) {
        const int64_t i0 = next.fetch_add(grain);
        if (i0 >= n) break;
        for (int64_t i = i0; i < std::min(n, i0 + grain); ++i) f(i);
      }
    });
  for (auto& t : th) t.join();
}

}  // namespace dz::dev
