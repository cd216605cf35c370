// What a module needs to know about tensor and context parallelism (DESIGN.md §4).
//
// TP: a module built with TpShard{rank, size, comm} loads only its shard (heads of KDA/GDN/MLA/
// GQA, FFN width or experts, vocabulary rows of the LM head) and all-reduces after its output
// projection, so every TP rank ends with the full [T, D] output.
// CP: Mixer::forward_cp runs the prefill of a whole document laid out by a SeqLayout over the CP
// group, exchanging what the algorithm needs (linear-attention transitions and conv halos;
// latent KV and indexer keys), and leaves the full-document state on every CP rank for decode.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "backend/device_comm.hpp"
#include "core/error.hpp"
#include "dist/comm.hpp"
#include "dist/seq_layout.hpp"

namespace dz {

// Expert parallelism (--ep E, docs/expert_parallel.md): the E ranks of `ep` CP members x the TP
// group hold the routed experts whole, E / n_experts each, rank (m, t) the block m * tp + t. Rows
// are the same on a TP group's ranks, so each computes its own experts on them; across the CP
// members rows differ under forward_cp (the pairs for another member's experts go there by
// all-to-all over `peers`, and the results come back) and are the same otherwise (decode, packed
// batches: the members' partial sums are added over `peers`).
struct EpShard {
  int size = 1;                       // E (1: no expert parallelism, experts width-sharded over TP)
  int member = 0, members = 1;        // this rank's CP member in the EP group, E / tp of them
  const Collectives* peers = nullptr; // the members' ranks of this TP index, in member order
  const DeviceComm* dev = nullptr;    // peers on the backend's buffers (the job makes it); null: the
                                      // backend's transport over peers (Backend::alltoall_rows)
};

struct TpShard {
  int rank = 0, size = 1;
  const Collectives* comm = nullptr;  // the TP group; nullptr when size == 1
  const DeviceComm* dev = nullptr;    // the TP group on the backend's buffers (the job makes it)
  EpShard ep;                         // expert parallelism (only MoE reads it)

  // [begin, end) of n items for this rank; n must divide by size (what = name for the error).
  std::pair<int64_t, int64_t> range(int64_t n, const char* what) const {
    DZ_CHECK(n % size == 0, what, " (", n, ") is not divisible by --tp ", size);
    const int64_t k = n / size;
    return {rank * k, rank * k + k};
  }
  // Uneven split (vocabulary): the first n % size ranks get one more.
  std::pair<int64_t, int64_t> range_uneven(int64_t n) const {
    const int64_t q = n / size, r = n % size;
    const int64_t b = rank * q + (rank < r ? rank : r);
    return {b, b + q + (rank < r ? 1 : 0)};
  }
  void allreduce_sum(float* x, int64_t n) const {
    if (size > 1) comm->allreduce_sum(x, n);
  }
  // Sum of a module's partial output over the TP group: through `dev` when the job made one
  // (NCCL or staged MPI), else MPI on `comm` through the backend (modules built by tests and tools).
  void allreduce(Backend& be, const DTensor& t) const {
    if (size <= 1) return;
    if (dev)
      dev->allreduce_sum(t);
    else
      be.allreduce_sum(comm, t);
  }
};

// Per-rank work accounting for the balance report: FLOPs by kind ("indexer", "attention",
// "linear_attention", ...) and wall time by stage ("la_stage1", "la_merge", "la_stage2",
// "kv_gather", "mixer_kda", "ffn_moe", "lm_head", ...). Counted with the same formulas whatever
// the layout. With `device` set, a timer waits for the device at both ends, so a stage's seconds
// are its GPU time (not the time to issue its kernels); the job sets it only when a report is
// asked for (the waits cost a little).
struct WorkStats {
  std::map<std::string, double> flops;
  std::map<std::string, double> seconds;
  std::map<std::string, int64_t> counts;  // decode_steps, decode_graph_captures, decode_graph_replays
  Backend* device = nullptr;
  void add_flops(const std::string& k, double v) { flops[k] += v; }
  struct Timer {
    WorkStats* w;
    std::string k;
    std::chrono::steady_clock::time_point t0;
    Timer(WorkStats* ws, std::string key) : w(ws), k(std::move(key)) {
      if (w && w->device) w->device->sync();
      t0 = std::chrono::steady_clock::now();
    }
    ~Timer() {
      if (!w) return;
      if (w->device) w->device->sync();
      w->seconds[k] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
  };
  // auto t = stats.time("la_stage1");  (null-safe through CpCtx::time)
  Timer time(const std::string& k) { return Timer(this, k); }
};

struct CpCtx {
  const Collectives* cp = nullptr;  // the CP group (size 1 for the intra-rank segmented scan)
  const SeqLayout* lay = nullptr;
  WorkStats* stats = nullptr;    // may be null
  // The CP group on the backend's buffers (the job makes it: NCCL between distinct GPUs); null:
  // the backend's own transport over `cp` (Backend::allgather_rows), as MPI's DeviceComm does.
  const DeviceComm* dev = nullptr;
  void flops(const std::string& k, double v) const {
    if (stats) stats->add_flops(k, v);
  }
  WorkStats::Timer time(const std::string& k) const { return WorkStats::Timer(stats, k); }
};

class Backend;
// Every CP rank's rows [rows_of[rank], W] in rank order: [Σ rows_of, W] on `be` (ctx.dev when
// set, else be.allgather_rows over ctx.cp).
DTensor cp_allgather_rows(Backend& be, const CpCtx& ctx, const DTensor& mine, const std::vector<int64_t>& rows_of);
// The local rows mine [lay.local_rows(), W] of every CP rank (each rank's segments in layout order)
// gathered into sequence order: [lay.length, W] on `be`.
DTensor cp_gather_seq(Backend& be, const CpCtx& ctx, const DTensor& mine);
// Both started, not finished (Backend::allgather_rows_start): the mixers compute what does not
// need the other ranks' rows (the queries' projections, a segment that starts the document) before
// wait(). Every CP rank starts the same exchanges in the same order.
std::unique_ptr<PendingRows> cp_allgather_rows_start(Backend& be, const CpCtx& ctx, const DTensor& mine,
                                                     const std::vector<int64_t>& rows_of);
std::unique_ptr<PendingRows> cp_gather_seq_start(Backend& be, const CpCtx& ctx, const DTensor& mine);

}  // namespace dz
