#include "dist/comm.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/log.hpp"

namespace dz {

Comm Comm::world() {
  Comm c;
  c.comm_ = MPI_COMM_WORLD;
  c.owned_ = false;
  MPI_CHECK(MPI_Comm_rank(c.comm_, &c.rank_));
  MPI_CHECK(MPI_Comm_size(c.comm_, &c.size_));
  return c;
}

Comm::Comm(Comm&& o) noexcept { *this = std::move(o); }

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = o.comm_;
    owned_ = o.owned_;
    rank_ = o.rank_;
    size_ = o.size_;
    o.comm_ = MPI_COMM_NULL;
    o.owned_ = false;
  }
  return *this;
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Comm Comm::split(int color, int key) const {
  if (comm_ == MPI_COMM_NULL) return Comm();
  Comm c;
  MPI_CHECK(MPI_Comm_split(comm_, color, key, &c.comm_));
  c.owned_ = true;
  MPI_CHECK(MPI_Comm_rank(c.comm_, &c.rank_));
  MPI_CHECK(MPI_Comm_size(c.comm_, &c.size_));
  return c;
}

Comm Comm::split_shared() const {
  if (comm_ == MPI_COMM_NULL) return Comm();
  Comm c;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &c.comm_));
  c.owned_ = true;
  MPI_CHECK(MPI_Comm_rank(c.comm_, &c.rank_));
  MPI_CHECK(MPI_Comm_size(c.comm_, &c.size_));
  return c;
}

void Comm::barrier() const {
  if (comm_ != MPI_COMM_NULL) MPI_CHECK(MPI_Barrier(comm_));
}

void Comm::bcast_bytes(void* data, size_t n, int root) const {
  if (size_ == 1) return;
  // MPI counts are int: send large buffers in pieces.
  char* p = static_cast<char*>(data);
  const size_t step = size_t(1) << 30;
  for (size_t off = 0; off < n; off += step) {
    size_t len = n - off < step ? n - off : step;
    MPI_CHECK(MPI_Bcast(p + off, int(len), MPI_BYTE, root, comm_));
  }
}

bool Comm::any(bool flag) const {
  if (size_ == 1) return flag;
  int in = flag ? 1 : 0, out = 0;
  MPI_CHECK(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm_));
  return out != 0;
}

int Comm::first_set(bool flag) const {
  if (size_ == 1) return flag ? 0 : -1;
  int in = flag ? rank_ : size_, out = size_;
  MPI_CHECK(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm_));
  return out == size_ ? -1 : out;
}

// MPI counts are int: reductions of very large buffers go in pieces.
template <class T>
static void allreduce_pieces(MPI_Comm comm, T* x, int64_t n, MPI_Datatype type, MPI_Op op) {
  const int64_t step = int64_t(1) << 28;
  for (int64_t off = 0; off < n; off += step) {
    int64_t len = n - off < step ? n - off : step;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x + off, int(len), type, op, comm));
  }
}

void Comm::allreduce_sum(float* x, int64_t n) const {
  if (size_ > 1 && n > 0) allreduce_pieces(comm_, x, n, MPI_FLOAT, MPI_SUM);
}
void Comm::allreduce_sum(double* x, int64_t n) const {
  if (size_ > 1 && n > 0) allreduce_pieces(comm_, x, n, MPI_DOUBLE, MPI_SUM);
}
void Comm::allreduce_max(float* x, int64_t n) const {
  if (size_ > 1 && n > 0) allreduce_pieces(comm_, x, n, MPI_FLOAT, MPI_MAX);
}
void Comm::allreduce_sum(int64_t* x, int64_t n) const {
  if (size_ > 1 && n > 0) allreduce_pieces(comm_, x, n, MPI_INT64_T, MPI_SUM);
}

namespace {
// MPI's int counts and displacements of byte blocks in rank order; returns their total (one call
// moves less than 2 GiB).
size_t byte_layout(const std::vector<size_t>& counts, std::vector<int>& cnt, std::vector<int>& disp) {
  cnt.assign(counts.size(), 0);
  disp.assign(counts.size(), 0);
  size_t off = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    DZ_CHECK(off + counts[i] < (size_t(1) << 31), "an exchange of more than ", off + counts[i],
             " bytes is too large for one MPI call");
    cnt[i] = int(counts[i]);
    disp[i] = int(off);
    off += counts[i];
  }
  return off;
}
}  // namespace

std::vector<char> Comm::allgatherv_bytes(const std::vector<char>& send) const {
  if (size_ == 1) return send;
  int64_t mine = int64_t(send.size());
  std::vector<int64_t> counts(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, comm_));
  std::vector<int> cnt, disp;
  const size_t total = byte_layout(std::vector<size_t>(counts.begin(), counts.end()), cnt, disp);
  std::vector<char> out(total);
  MPI_CHECK(MPI_Allgatherv(send.data(), int(mine), MPI_BYTE, out.data(), cnt.data(), disp.data(), MPI_BYTE, comm_));
  return out;
}

namespace {
// MPI_Iallgatherv / MPI_Ialltoallv in flight: the count and displacement arrays must stay valid
// until it completes.
class MpiRequest final : public CommRequest {
 public:
  MpiRequest(std::vector<int> cnt, std::vector<int> disp, std::vector<int> rcnt = {}, std::vector<int> rdisp = {})
      : cnt_(std::move(cnt)), disp_(std::move(disp)), rcnt_(std::move(rcnt)), rdisp_(std::move(rdisp)) {}
  ~MpiRequest() override {
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);  // no throw from a destructor
  }
  void wait() override {
    if (req_ != MPI_REQUEST_NULL) MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
  }
  std::vector<int> cnt_, disp_, rcnt_, rdisp_;  // rcnt_ / rdisp_: the receive side of an all-to-all
  MPI_Request req_ = MPI_REQUEST_NULL;
};
}  // namespace

std::unique_ptr<CommRequest> Comm::iallgatherv_into(const void* send, void* recv, const std::vector<size_t>& counts) const {
  if (size_ == 1) return Collectives::iallgatherv_into(send, recv, counts);
  DZ_CHECK(int(counts.size()) == size_, "iallgatherv: ", counts.size(), " counts for a group of ", size_);
  std::vector<int> cnt, disp;
  byte_layout(counts, cnt, disp);
  auto r = std::make_unique<MpiRequest>(std::move(cnt), std::move(disp));
  MPI_CHECK(MPI_Iallgatherv(send, r->cnt_[size_t(rank_)], MPI_BYTE, recv, r->cnt_.data(), r->disp_.data(), MPI_BYTE,
                            comm_, &r->req_));
  return r;
}

std::unique_ptr<CommRequest> Comm::ialltoallv_into(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                                   const std::vector<size_t>& recv_counts) const {
  if (size_ == 1) return Collectives::ialltoallv_into(send, send_counts, recv, recv_counts);
  DZ_CHECK(int(send_counts.size()) == size_ && int(recv_counts.size()) == size_, "ialltoallv: ", send_counts.size(),
           " / ", recv_counts.size(), " counts for a group of ", size_);
  // every sender's count for this rank against the count it expects (as alltoallv_bytes exchanges
  // them): a mismatch is the callers' error, refused here rather than left to MPI (which need not
  // notice a short message)
  const std::vector<int64_t> mine(send_counts.begin(), send_counts.end());
  std::vector<int64_t> sent(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Alltoall(mine.data(), 1, MPI_INT64_T, sent.data(), 1, MPI_INT64_T, comm_));
  for (int r = 0; r < size_; ++r)
    DZ_CHECK(size_t(sent[size_t(r)]) == recv_counts[size_t(r)], "ialltoallv: rank ", r, " sends ", sent[size_t(r)],
             " bytes where ", recv_counts[size_t(r)], " were expected");
  std::vector<int> sc, sd, rc, rd;
  byte_layout(send_counts, sc, sd);
  byte_layout(recv_counts, rc, rd);
  auto r = std::make_unique<MpiRequest>(std::move(sc), std::move(sd), std::move(rc), std::move(rd));
  MPI_CHECK(MPI_Ialltoallv(send, r->cnt_.data(), r->disp_.data(), MPI_BYTE, recv, r->rcnt_.data(), r->rdisp_.data(),
                           MPI_BYTE, comm_, &r->req_));
  return r;
}

std::vector<std::vector<char>> Comm::alltoallv_bytes(const std::vector<std::vector<char>>& send) const {
  DZ_CHECK(int(send.size()) == size_, "alltoallv: ", send.size(), " send buffers for a group of ", size_);
  if (size_ == 1) return send;
  std::vector<int64_t> scount(static_cast<size_t>(size_)), rcount(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) scount[size_t(i)] = int64_t(send[size_t(i)].size());
  MPI_CHECK(MPI_Alltoall(scount.data(), 1, MPI_INT64_T, rcount.data(), 1, MPI_INT64_T, comm_));
  int64_t stot = 0, rtot = 0;
  for (int i = 0; i < size_; ++i) stot += scount[size_t(i)], rtot += rcount[size_t(i)];
  DZ_CHECK(stot < (int64_t(1) << 31) && rtot < (int64_t(1) << 31), "alltoallv of ", std::max(stot, rtot),
           " bytes is too large for one MPI call");
  const size_t P = static_cast<size_t>(size_);
  std::vector<int> sc(P), sd(P), rc(P), rd(P);
  std::vector<char> sbuf(static_cast<size_t>(stot)), rbuf(static_cast<size_t>(rtot));
  int64_t so = 0, ro = 0;
  for (int i = 0; i < size_; ++i) {
    sc[size_t(i)] = int(scount[size_t(i)]), sd[size_t(i)] = int(so);
    rc[size_t(i)] = int(rcount[size_t(i)]), rd[size_t(i)] = int(ro);
    std::copy(send[size_t(i)].begin(), send[size_t(i)].end(), sbuf.begin() + so);
    so += scount[size_t(i)], ro += rcount[size_t(i)];
  }
  MPI_CHECK(MPI_Alltoallv(sbuf.data(), sc.data(), sd.data(), MPI_BYTE, rbuf.data(), rc.data(), rd.data(), MPI_BYTE,
                          comm_));
  std::vector<std::vector<char>> out(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i)
    out[size_t(i)].assign(rbuf.begin() + rd[size_t(i)], rbuf.begin() + rd[size_t(i)] + rc[size_t(i)]);
  return out;
}

SharedCounter::SharedCounter(const Comm& comm) {
  MPI_Aint size = comm.rank() == 0 ? MPI_Aint(sizeof(int64_t)) : 0;
  MPI_CHECK(MPI_Win_allocate(size, sizeof(int64_t), MPI_INFO_NULL, comm.raw(), &base_, &win_));
  if (comm.rank() == 0) {
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win_));
    *base_ = 0;
    MPI_CHECK(MPI_Win_unlock(0, win_));
  }
  comm.barrier();
}

SharedCounter::~SharedCounter() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (win_ != MPI_WIN_NULL && !finalized) MPI_Win_free(&win_);
}

int64_t SharedCounter::fetch_add(int64_t v) {
  int64_t old = 0;
  MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win_));
  MPI_CHECK(MPI_Fetch_and_op(&v, &old, MPI_INT64_T, 0, 0, MPI_SUM, win_));
  MPI_CHECK(MPI_Win_unlock(0, win_));
  return old;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  // Errors come back as codes so MPI_CHECK can turn them into dz::Error with a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  log_state().rank = rank;
  log_state().world = size;
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void abort_all(const std::string& msg, int code) {
  std::fprintf(stderr, "dayzero: error (rank %d): %s\n", log_state().rank, msg.c_str());
  std::fflush(stderr);
  int init = 0, finalized = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&finalized);
  if (init && !finalized && log_state().world > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace dz
