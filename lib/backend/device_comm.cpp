#include "backend/device_comm.hpp"

#include <unistd.h>

#include <set>

#include "core/error.hpp"

namespace dz {

namespace {

class MpiDeviceComm final : public DeviceComm {
 public:
  MpiDeviceComm(Backend& be, const Comm& c) : be_(&be), c_(&c) {}
  void allreduce_sum(const DTensor& t) const override { be_->allreduce_sum(c_, t); }
  DTensor allgather_rows(const DTensor& mine, const std::vector<int64_t>& rows_of) const override {
    return be_->allgather_rows(c_, mine, rows_of);
  }
  std::unique_ptr<PendingRows> allgather_rows_start(const DTensor& mine,
                                                    const std::vector<int64_t>& rows_of) const override {
    return be_->allgather_rows_start(c_, mine, rows_of);
  }
  DTensor alltoall_rows(const DTensor& send, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) const override {
    return be_->alltoall_rows(c_, send, send_rows, recv_rows);
  }
  std::unique_ptr<PendingRows> alltoall_rows_start(const DTensor& send, const std::vector<int64_t>& send_rows,
                                                   const std::vector<int64_t>& recv_rows) const override {
    return be_->alltoall_rows_start(c_, send, send_rows, recv_rows);
  }
  std::string kind() const override { return be_->device() == Device::Host ? "mpi" : "mpi (staged)"; }

 private:
  Backend* be_;
  const Comm* c_;
};

}  // namespace

Transport choose_transport(bool cuda, bool nccl, const std::vector<std::pair<std::string, int>>& members) {
  if (!cuda || !nccl) return Transport::Mpi;
  std::set<std::pair<std::string, int>> seen(members.begin(), members.end());
  return seen.size() == members.size() ? Transport::Nccl : Transport::Mpi;
}

std::unique_ptr<DeviceComm> make_device_comm(Backend& be, const Comm& group) {
  // every member's (host, GPU index), in rank order
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string me = str(host, "\t", be.device_index(), "\n");
  const std::vector<char> all = group.allgatherv_bytes(std::vector<char>(me.begin(), me.end()));
  std::vector<std::pair<std::string, int>> members;
  std::string cur;
  for (char ch : all) {
    if (ch != '\n') {
      cur += ch;
      continue;
    }
    const size_t tab = cur.find('\t');
    members.emplace_back(cur.substr(0, tab), std::stoi(cur.substr(tab + 1)));
    cur.clear();
  }
  const bool cuda = be.device() == Device::Cuda;
  if (choose_transport(cuda, nccl_built(), members) == Transport::Nccl) return make_nccl_comm(be, group);
  return std::make_unique<MpiDeviceComm>(be, group);
}

#ifndef DAYZERO_HAVE_NCCL
bool nccl_built() { return false; }
std::unique_ptr<DeviceComm> make_nccl_comm(Backend&, const Comm&) {
  fail("NCCL: this dayzero was built without NCCL (nccl.h / libnccl not found at configure time)");
}
#endif

}  // namespace dz
