// MPI communicators: the MPI implementation of Collectives (dist/collectives.hpp), plus what
// only the host side needs (splitting, agreement flags, the shared work counter). Communicators
// are RAII values passed explicitly: no global communicator cache.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "dist/collectives.hpp"

#define MPI_CHECK(call)                                                          \
  do {                                                                           \
    int _rc = (call);                                                            \
    if (_rc != MPI_SUCCESS) {                                                    \
      char _buf[MPI_MAX_ERROR_STRING];                                           \
      int _len = 0;                                                              \
      MPI_Error_string(_rc, _buf, &_len);                                        \
      ::dz::fail(::dz::str(#call, " failed: ", std::string(_buf, size_t(_len)))); \
    }                                                                            \
  } while (0)

namespace dz {

class Comm : public Collectives {
 public:
  // A default-constructed Comm is a group of one that needs no MPI: every collective is the
  // identity. It serves single-process use (the intra-rank segmented scan, unit tests).
  Comm() = default;
  static Comm world();  // MPI_COMM_WORLD (not owned)
  Comm(Comm&& o) noexcept;
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() override;

  MPI_Comm raw() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Comm split(int color, int key) const;
  // The ranks of this communicator on the same node (MPI_Comm_split_type SHARED): its rank is
  // the local rank, which picks the local GPU.
  Comm split_shared() const;
  void barrier() const override;
  void bcast_bytes(void* data, size_t n, int root) const override;
  // Logical OR of a flag over the communicator.
  bool any(bool flag) const;
  // Lowest rank whose flag is set, or -1.
  int first_set(bool flag) const;
  void allreduce_sum(float* x, int64_t n) const override;
  void allreduce_sum(double* x, int64_t n) const override;
  void allreduce_sum(int64_t* x, int64_t n) const override;
  void allreduce_max(float* x, int64_t n) const override;
  std::vector<char> allgatherv_bytes(const std::vector<char>& send) const override;
  std::unique_ptr<CommRequest> iallgatherv_into(const void* send, void* recv,
                                                const std::vector<size_t>& counts) const override;
  std::vector<std::vector<char>> alltoallv_bytes(const std::vector<std::vector<char>>& send) const override;
  std::unique_ptr<CommRequest> ialltoallv_into(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                               const std::vector<size_t>& recv_counts) const override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
};

// A shared counter living on rank 0 of a communicator (MPI one-sided, passive target):
// fetch_add is how ranks take the next document without a coordinator loop.
class SharedCounter {
 public:
  explicit SharedCounter(const Comm& comm);
  ~SharedCounter();
  SharedCounter(const SharedCounter&) = delete;
  SharedCounter& operator=(const SharedCounter&) = delete;
  int64_t fetch_add(int64_t v);

 private:
  MPI_Win win_ = MPI_WIN_NULL;
  int64_t* base_ = nullptr;
};

// Initialises MPI for the process lifetime; finalises on destruction.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
};

// Top-level failure after work started: print and abort every rank, so none is left waiting.
[[noreturn]] void abort_all(const std::string& msg, int code = 1);

}  // namespace dz
