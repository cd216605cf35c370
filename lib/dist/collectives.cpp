#include "dist/collectives.hpp"

#include "core/error.hpp"

namespace dz {

namespace {
struct DoneRequest final : CommRequest {
  void wait() override {}
};
}  // namespace

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
