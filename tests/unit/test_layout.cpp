// Rank grid and zigzag layout: pure values, checked for every rank.
#include <catch2/catch.hpp>

#include <set>

#include "dist/rank_grid.hpp"
#include "dist/seq_layout.hpp"

TEST_CASE("layout: rank grid maps every rank to a unique (dp, cp, tp)", "[unit]") {
  for (int P : {1, 2, 4, 6, 8, 16})
    for (int C : {1, 2, 4})
      for (int T : {1, 2}) {
        if (P % (C * T)) {
          CHECK_THROWS_WITH(dz::RankGrid::make(P, 0, C, T), Catch::Contains("not divisible"));
          continue;
        }
        std::set<std::tuple<int, int, int>> seen;
        for (int r = 0; r < P; ++r) {
          auto g = dz::RankGrid::make(P, r, C, T);
          CHECK(g.tp_rank() == r % T);
          CHECK(g.cp_rank() == (r / T) % C);
          CHECK(g.dp_rank() == r / (T * C));
          CHECK(g.rank_of(g.dp_rank(), g.cp_rank(), g.tp_rank()) == r);
          seen.insert({g.dp_rank(), g.cp_rank(), g.tp_rank()});
        }
        CHECK(int(seen.size()) == P);
      }
}

TEST_CASE("layout: zigzag covers every position once, rank i holds segments i and 2C-1-i", "[unit]") {
  for (int64_t L : {1, 2, 3, 7, 8, 63, 64, 65, 1000})
    for (int C : {1, 2, 3, 4})
      for (int sub : {1, 2, 3}) {
        std::vector<int> hits(static_cast<size_t>(L), 0);
        for (int r = 0; r < C; ++r) {
          auto lay = dz::SeqLayout::zigzag(L, C, r, sub);
          CHECK(lay.n_seg() == (C > 1 ? 2 * C : 1) * sub);
          CHECK(lay.start.back() == L);
          for (int j = 0; j < lay.n_seg(); ++j) CHECK(lay.seg_len(j) >= 0);
          for (int64_t p : lay.local_positions()) hits[size_t(p)]++;
          if (C > 1)
            for (int j : lay.local_segments()) {
              int z = j / sub;
              CHECK((z == r || z == 2 * C - 1 - r));
            }
          CHECK(int64_t(lay.local_positions().size()) == lay.local_rows());
        }
        for (int h : hits) CHECK(h == 1);
      }
}
