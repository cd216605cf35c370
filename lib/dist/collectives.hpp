// The collectives the parallel algorithms use, as one interface: MPI implements it now (Comm, on
// host buffers, the CPU backend); the NCCL backend implements the same calls on device buffers.
// Modules only ever see a `const Collectives*` (TpShard::comm, CpCtx::cp).
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace dz {

// A nonblocking collective in flight (Collectives::iallgatherv_into): wait() completes it (again:
// nothing); destroying one never waited on waits. Its buffers must outlive it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() const = 0;
  virtual void bcast_bytes(void* data, size_t n, int root) const = 0;
  // In-place element-wise reductions (no-op on a group of one).
  virtual void allreduce_sum(float* x, int64_t n) const = 0;
  virtual void allreduce_sum(double* x, int64_t n) const = 0;
  virtual void allreduce_sum(int64_t* x, int64_t n) const = 0;
  virtual void allreduce_max(float* x, int64_t n) const = 0;
  // Every rank contributes `send` (its own length); returns the concatenation in rank order.
  virtual std::vector<char> allgatherv_bytes(const std::vector<char>& send) const = 0;
  // The same with every rank's byte count known to all (counts, rank order), started and not
  // finished: send (counts[rank()] bytes) lands in recv (their sum, rank order) by wait(), so the
  // caller can compute meanwhile. Requests of one group complete in the order every rank posted
  // them. This base runs allgatherv_bytes at once and returns a finished request; Comm posts
  // MPI_Iallgatherv.
  virtual std::unique_ptr<CommRequest> iallgatherv_into(const void* send, void* recv,
                                                        const std::vector<size_t>& counts) const;
  // send[r] goes to rank r (send.size() == size()); returns what each rank r sent to this one.
  virtual std::vector<std::vector<char>> alltoallv_bytes(const std::vector<std::vector<char>>& send) const = 0;
  // alltoallv between buffers with every byte count known to both sides, started and not finished:
  // the send_counts[r] bytes of send (rank order) go to rank r, the recv_counts[r] bytes from rank r
  // land in recv (rank order) by wait(), so the caller can compute meanwhile. This base runs
  // alltoallv_bytes at once (checking what arrives against recv_counts) and returns a finished
  // request; Comm posts MPI_Ialltoallv.
  virtual std::unique_ptr<CommRequest> ialltoallv_into(const void* send, const std::vector<size_t>& send_counts,
                                                       void* recv, const std::vector<size_t>& recv_counts) const;

  // Typed conveniences over the calls above.
  template <class T>
  std::vector<T> allgatherv(const std::vector<T>& send) const {
    std::vector<char> b(send.size() * sizeof(T));
    if (!send.empty()) std::memcpy(b.data(), send.data(), b.size());
    std::vector<char> r = allgatherv_bytes(b);
    std::vector<T> out(r.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), r.data(), r.size());
    return out;
  }
  template <class T>
  void bcast_vec(std::vector<T>& v, int root) const {
    uint64_t n = v.size();
    bcast_bytes(&n, sizeof n, root);
    v.resize(size_t(n));
    if (n) bcast_bytes(v.data(), n * sizeof(T), root);
  }
  void bcast_string(std::string& s, int root) const {
    uint64_t n = s.size();
    bcast_bytes(&n, sizeof n, root);
    s.resize(size_t(n));
    if (n) bcast_bytes(&s[0], size_t(n), root);
  }
};

}  // namespace dz
