// The MPI communicator layer and the rank grid, on however many ranks mpirun gives.
#include <catch2/catch.hpp>

#include "dist/comm.hpp"
#include "dist/rank_grid.hpp"
#include "dist/seq_layout.hpp"

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
