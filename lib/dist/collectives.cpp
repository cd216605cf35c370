#include "dist/collectives.hpp"

#include "core/error.hpp"

namespace dz {

namespace {
struct DoneRequest final : CommRequest {
  void wait() override {}
};
}  // namespace

std::unique_ptr<CommRequest> Collectives::ialltoallv_into(const void* send, const std::vector<size_t>& send_counts,
                                                          void* recv, const std::vector<size_t>& recv_counts) const {
  DZ_CHECK(int(send_counts.size()) == size() && int(recv_counts.size()) == size(), "ialltoallv: ", send_counts.size(),
           " / ", recv_counts.size(), " counts for a group of ", size());
  std::vector<std::vector<char>> parts(send_counts.size());
  const char* s = static_cast<const char*>(send);
  for (size_t r = 0; r < parts.size(); ++r) {
    parts[r].assign(s, s + send_counts[r]);
    s += send_counts[r];
  }
  const std::vector<std::vector<char>> got = alltoallv_bytes(parts);
  char* d = static_cast<char*>(recv);
  for (size_t r = 0; r < got.size(); ++r) {
    DZ_CHECK(got[r].size() == recv_counts[r], "ialltoallv: rank ", r, " sent ", got[r].size(), " bytes where ",
             recv_counts[r], " were expected");
    if (!got[r].empty()) std::memcpy(d, got[r].data(), got[r].size());
    d += got[r].size();
  }
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<CommRequest> Collectives::iallgatherv_into(const void* send, void* recv,
                                                           const std::vector<size_t>& counts) const {
  DZ_CHECK(int(counts.size()) == size(), "iallgatherv: ", counts.size(), " counts for a group of ", size());
  size_t total = 0;
  for (size_t c : counts) total += c;
  const char* s = static_cast<const char*>(send);
  const std::vector<char> all = allgatherv_bytes(std::vector<char>(s, s + counts[size_t(rank())]));
  DZ_CHECK(all.size() == total, "iallgatherv: ", all.size(), " bytes arrived where the counts say ", total,
           " (a rank's count differs from what it sent)");
  if (total) std::memcpy(recv, all.data(), total);
  return std::make_unique<DoneRequest>();
}

}  // namespace dz
