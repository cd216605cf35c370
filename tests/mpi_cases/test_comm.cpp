// The MPI communicator layer and the rank grid, on however many ranks mpirun gives.
#include <catch2/catch.hpp>

#include "backend/backend.hpp"
#include "dist/comm.hpp"
#include "dist/rank_grid.hpp"
#include "dist/seq_layout.hpp"
#include "model/parallel.hpp"

namespace {
// Row counts per rank for the all-gather cases: 0 .. 3 rows, some ranks empty, varying with W.
std::vector<int64_t> ragged_rows(int P, int64_t W) {
  std::vector<int64_t> rows_of(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) rows_of[size_t(r)] = (r * 3 + W) % 4;
  return rows_of;
}
}  // namespace

TEST_CASE("comm: group split by the rank grid, collectives inside each group", "[mpi]") {
  dz::Comm world = dz::Comm::world();
  const int P = world.size();
  for (int C : {1, 2, 4})
    for (int T : {1, 2}) {
      if (P % (C * T)) continue;
      auto g = dz::RankGrid::make(P, world.rank(), C, T);
      // TP group: same dp and cp; CP group: same dp and tp.
      dz::Comm tp = world.split(g.dp_rank() * C + g.cp_rank(), g.tp_rank());
      dz::Comm cp = world.split(P + g.dp_rank() * T + g.tp_rank(), g.cp_rank());
      CHECK(tp.size() == T);
      CHECK(cp.size() == C);
      CHECK(tp.rank() == g.tp_rank());
      CHECK(cp.rank() == g.cp_rank());
      float v[2] = {float(world.rank()), 1.f};
      tp.allreduce_sum(v, 2);
      float expect = 0;
      for (int t = 0; t < T; ++t) expect += float(g.rank_of(g.dp_rank(), g.cp_rank(), t));
      CHECK(v[0] == expect);
      CHECK(v[1] == float(T));
      std::vector<int32_t> mine(size_t(cp.rank() + 1), cp.rank());  // rank r sends r+1 copies of r
      auto all = cp.allgatherv(mine);
      CHECK(all.size() == size_t(C * (C + 1) / 2));
      size_t k = 0;
      for (int r = 0; r < C; ++r)
        for (int j = 0; j <= r; ++j) CHECK(all[k++] == r);
    }
}

TEST_CASE("comm: a default Comm is a group of one without MPI", "[mpi]") {
  dz::Comm self;
  float x[3] = {1, 2, 3};
  self.allreduce_sum(x, 3);
  CHECK(x[2] == 3.f);
  CHECK(self.allgatherv(std::vector<float>{4.f}) == std::vector<float>{4.f});
  CHECK(self.first_set(true) == 0);
  CHECK(self.first_set(false) == -1);
}

// Backend::allgather_rows (the CP exchanges' transport on the backend's buffers) and cp_gather_seq
// over real MPI groups: rank r holds rows whose values name (rank, row, column), some ranks none.
TEST_CASE("comm: allgather_rows and cp_gather_seq move every rank's rows, in rank and in sequence order", "[mpi]") {
  dz::Comm world = dz::Comm::world();
  dz::Backend& be = dz::cpu_backend();
  const int P = world.size(), me = world.rank();
  for (int64_t W : {1, 5, 64}) {
    const std::vector<int64_t> rows_of = ragged_rows(P, W);
    const int64_t mine_n = rows_of[size_t(me)];
    std::vector<float> v(size_t(mine_n * W));
    for (int64_t i = 0; i < mine_n; ++i)
      for (int64_t c = 0; c < W; ++c) v[size_t(i * W + c)] = float(me * 10000 + i * 100 + c);
    const dz::DTensor t = be.upload(v.data(), {mine_n, W}, dz::DType::F32);
    const dz::DTensor all = be.allgather_rows(&world, t, rows_of);
    int64_t total = 0;
    for (int64_t n : rows_of) total += n;
    REQUIRE(all.rows() == total);
    REQUIRE(all.cols() == W);
    const std::vector<float> h = be.to_host(all);
    int64_t row = 0;
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < rows_of[size_t(r)]; ++i, ++row)
        for (int64_t c = 0; c < W; ++c) CHECK(h[size_t(row * W + c)] == float(r * 10000 + i * 100 + c));
    // a count that does not match what the rank holds is refused before anything moves
    std::vector<int64_t> wrong = rows_of;
    wrong[size_t(me)] += 1;
    CHECK_THROWS_WITH(be.allgather_rows(&world, t, wrong), Catch::Contains("its count says"));
  }
  // cp_gather_seq: the zigzag layout's local rows of every rank back in sequence order
  for (int64_t L : {1, 7, 40})
    for (int segs : {1, 2}) {
      const dz::SeqLayout lay = dz::SeqLayout::zigzag(L, P, me, segs);
      const std::vector<int64_t> pos = lay.local_positions();
      const int64_t W = 3;
      std::vector<float> v(pos.size() * size_t(W));
      for (size_t i = 0; i < pos.size(); ++i)
        for (int64_t c = 0; c < W; ++c) v[i * size_t(W) + size_t(c)] = float(pos[i] * 10 + c);
      const dz::CpCtx ctx{&world, &lay, nullptr};
      const std::vector<float> h =
          be.to_host(dz::cp_gather_seq(be, ctx, be.upload(v.data(), {int64_t(pos.size()), W}, dz::DType::F32)));
      REQUIRE(int64_t(h.size()) == L * W);
      for (int64_t s = 0; s < L; ++s)
        for (int64_t c = 0; c < W; ++c) CHECK(h[size_t(s * W + c)] == float(s * 10 + c));
    }
}

TEST_CASE("comm: allgather_rows_start leaves exchanges in flight that equal allgather_rows, waited in any order", "[mpi]") {
  dz::Comm world = dz::Comm::world();
  dz::Backend& be = dz::cpu_backend();
  const int P = world.size(), me = world.rank();
  for (int64_t W : {1, 5, 64}) {
    const std::vector<int64_t> rows_of = ragged_rows(P, W);
    const int64_t n = rows_of[size_t(me)];
    auto rows = [&](float base) {
      std::vector<float> v(size_t(n * W));
      for (int64_t i = 0; i < n * W; ++i) v[size_t(i)] = base + float(me * 10000 + i);
      return be.upload(v.data(), {n, W}, dz::DType::F32);
    };
    const dz::DTensor a = rows(0.f), b = rows(0.5f), c = rows(0.25f);
    const std::vector<float> want_a = be.to_host(be.allgather_rows(&world, a, rows_of));
    const std::vector<float> want_b = be.to_host(be.allgather_rows(&world, b, rows_of));
    auto pa = be.allgather_rows_start(&world, a, rows_of);
    auto pb = be.allgather_rows_start(&world, b, rows_of);
    {
      auto pc = be.allgather_rows_start(&world, c, rows_of);  // destroyed unwaited: it completes
    }
    // a blocking collective of the same group while two are in flight (every rank in this order)
    int64_t one = 1;
    world.allreduce_sum(&one, 1);
    CHECK(one == P);
    const std::vector<float> got_b = be.to_host(pb->wait()), got_a = be.to_host(pa->wait());
    CHECK(got_a == want_a);
    CHECK(got_b == want_b);
    CHECK(be.to_host(pa->wait()) == want_a);  // a second wait returns the same rows
  }
  // a group of one: the rows as they are, at once
  const dz::Comm solo;
  std::vector<float> v = {1.f, 2.f, 3.f, 4.f};
  const dz::DTensor t = be.upload(v.data(), {2, 2}, dz::DType::F32);
  CHECK(be.to_host(be.allgather_rows_start(&solo, t, {2})->wait()) == v);
  // cp_gather_seq_start: the same sequence order as cp_gather_seq
  for (int64_t L : {1, 7, 40}) {
    const dz::SeqLayout lay = dz::SeqLayout::zigzag(L, P, me, 2);
    const std::vector<int64_t> pos = lay.local_positions();
    std::vector<float> h(pos.size() * 2);
    for (size_t i = 0; i < pos.size(); ++i) h[2 * i] = float(pos[i]), h[2 * i + 1] = float(-pos[i]);
    const dz::CpCtx ctx{&world, &lay, nullptr};
    const dz::DTensor mine = be.upload(h.data(), {int64_t(pos.size()), 2}, dz::DType::F32);
    auto pending = dz::cp_gather_seq_start(be, ctx, mine);
    const std::vector<float> want = be.to_host(dz::cp_gather_seq(be, ctx, mine));  // a second exchange meanwhile
    CHECK(be.to_host(pending->wait()) == want);
    for (int64_t s = 0; s < L; ++s) CHECK(want[size_t(2 * s)] == float(s));
  }
}

// Backend::alltoall_rows (the expert-parallel dispatch): rank r sends (r + d) % 3 rows to rank d,
// each naming (sender, receiver, row, column); the counts to receive come from the senders' rule.
TEST_CASE("comm: alltoall_rows delivers each rank's rows for every other rank, in rank order", "[mpi]") {
  dz::Comm world = dz::Comm::world();
  dz::Backend& be = dz::cpu_backend();
  const int P = world.size(), me = world.rank();
  auto count = [](int from, int to) { return int64_t((from + to) % 3); };
  const int64_t W = 6;
  std::vector<int64_t> send_rows(static_cast<size_t>(P)), recv_rows(static_cast<size_t>(P));
  std::vector<float> v;
  for (int d = 0; d < P; ++d) {
    send_rows[size_t(d)] = count(me, d), recv_rows[size_t(d)] = count(d, me);
    for (int64_t i = 0; i < count(me, d); ++i)
      for (int64_t c = 0; c < W; ++c) v.push_back(float(me * 1000 + d * 100 + i * 10 + c));
  }
  const dz::DTensor t = be.upload(v.data(), {int64_t(v.size()) / W, W}, dz::DType::F32);
  const std::vector<float> h = be.to_host(be.alltoall_rows(&world, t, send_rows, recv_rows));
  size_t k = 0;
  for (int s = 0; s < P; ++s)
    for (int64_t i = 0; i < count(s, me); ++i)
      for (int64_t c = 0; c < W; ++c, ++k) {
        REQUIRE(k < h.size());
        CHECK(h[k] == float(s * 1000 + me * 100 + i * 10 + c));
      }
  CHECK(k == h.size());
  std::vector<int64_t> wrong = send_rows;
  wrong[0] += 1;  // more rows than the tensor holds: refused before anything moves
  CHECK_THROWS_WITH(be.alltoall_rows(&world, t, wrong, recv_rows), Catch::Contains("the counts say"));
}

// Backend::alltoall_rows_start (the EP dispatch beside this rank's own experts): two exchanges in
// flight at once, waited in the other order, equal the blocking alltoall_rows; one destroyed unwaited
// completes (the next collective on the group still matches across ranks); a group of one copies.
TEST_CASE("comm: alltoall_rows_start leaves exchanges in flight that equal alltoall_rows", "[mpi]") {
  dz::Comm world = dz::Comm::world();
  dz::Backend& be = dz::cpu_backend();
  const int P = world.size(), me = world.rank();
  auto count = [](int from, int to, int salt) { return int64_t((from + 2 * to + salt) % 4); };
  const int64_t W = 5;
  auto make = [&](int salt, std::vector<int64_t>& sr, std::vector<int64_t>& rr) {
    sr.assign(size_t(P), 0), rr.assign(size_t(P), 0);
    std::vector<float> v;
    for (int d = 0; d < P; ++d) {
      sr[size_t(d)] = count(me, d, salt), rr[size_t(d)] = count(d, me, salt);
      for (int64_t i = 0; i < sr[size_t(d)] * W; ++i) v.push_back(float(salt * 100000 + me * 1000 + d * 100 + i));
    }
    return be.upload(v.data(), {int64_t(v.size()) / W, W}, dz::DType::F32);
  };
  std::vector<int64_t> sa, ra, sb, rb, sc, rc;
  const dz::DTensor a = make(1, sa, ra), b = make(2, sb, rb), c = make(3, sc, rc);
  const std::vector<float> want_a = be.to_host(be.alltoall_rows(&world, a, sa, ra));
  const std::vector<float> want_b = be.to_host(be.alltoall_rows(&world, b, sb, rb));
  auto pa = be.alltoall_rows_start(&world, a, sa, ra);
  auto pb = be.alltoall_rows_start(&world, b, sb, rb);
  { auto pc = be.alltoall_rows_start(&world, c, sc, rc); }  // destroyed unwaited: it completes
  CHECK(be.to_host(pb->wait()) == want_b);
  CHECK(be.to_host(pa->wait()) == want_a);
  CHECK(be.to_host(pa->wait()) == want_a);  // a second wait returns the same rows
  const std::vector<float> again = be.to_host(be.alltoall_rows(&world, a, sa, ra));
  CHECK(again == want_a);
  dz::Comm solo = world.split(me, 0);
  std::vector<float> v = {1.f, 2.f, 3.f, 4.f};
  const dz::DTensor t = be.upload(v.data(), {2, 2}, dz::DType::F32);
  CHECK(be.to_host(be.alltoall_rows_start(&solo, t, {2}, {2})->wait()) == v);
  CHECK_THROWS_WITH(be.alltoall_rows_start(&world, a, std::vector<int64_t>(size_t(P), 99), ra),
                    Catch::Contains("the counts say"));
}
