// Collectives on a backend's buffers (DESIGN §10), one object per group, created once by the job
// and passed explicitly (TpShard::dev). Two transports:
//   - MPI: on the host buffers of the CPU backend, or device buffers staged through pinned host
//     memory (Backend::allreduce_sum) — what ranks sharing a GPU need (NCCL refuses two ranks of
//     one communicator on one GPU: "Duplicate GPU detected");
//   - NCCL: device buffers on the backend's stream, when every rank of the group has its own GPU.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "dist/comm.hpp"

namespace dz {

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual void allreduce_sum(const DTensor& t) const = 0;
  // Backend::allgather_rows over this group: every rank's [rows_of[rank], W] rows in rank order,
  // a new tensor on the backend (the CP exchanges of the KV / index-key caches and the linear-attention
  // transitions). Bytes are moved: exact in every dtype.
  virtual DTensor allgather_rows(const DTensor& mine, const std::vector<int64_t>& rows_of) const = 0;
  // The same started, not finished (Backend::allgather_rows_start's contract): MPI through the
  // backend's, NCCL on the communicator's own stream; this base gathers at once.
  virtual std::unique_ptr<PendingRows> allgather_rows_start(const DTensor& mine,
                                                            const std::vector<int64_t>& rows_of) const {
    return std::make_unique<ReadyRows>(allgather_rows(mine, rows_of));
  }
  // Backend::alltoall_rows over this group (the expert-parallel dispatch and return of rows).
  virtual DTensor alltoall_rows(const DTensor& send, const std::vector<int64_t>& send_rows,
                                const std::vector<int64_t>& recv_rows) const = 0;
  // The same started, not finished (Backend::alltoall_rows_start's contract): MPI through the
  // backend's, NCCL on the communicator's own stream; this base exchanges at once.
  virtual std::unique_ptr<PendingRows> alltoall_rows_start(const DTensor& send, const std::vector<int64_t>& send_rows,
                                                           const std::vector<int64_t>& recv_rows) const {
    return std::make_unique<ReadyRows>(alltoall_rows(send, send_rows, recv_rows));
  }
  virtual std::string kind() const = 0;  // "mpi", "mpi (staged)", "nccl"
};

// Which transport a group can use, from each member's (host name, GPU index) in rank order:
// NCCL when the backend is CUDA, NCCL is built in and no two members share a GPU; else MPI.
enum class Transport { Mpi, Nccl };
Transport choose_transport(bool cuda, bool nccl_built, const std::vector<std::pair<std::string, int>>& members);

// The group's communicator on `be` (collective over `group`: every member must call it).
std::unique_ptr<DeviceComm> make_device_comm(Backend& be, const Comm& group);

bool nccl_built();
// NCCL communicator over the ranks of `group` on the CUDA backend `be` (collective).
std::unique_ptr<DeviceComm> make_nccl_comm(Backend& be, const Comm& group);

}  // namespace dz
