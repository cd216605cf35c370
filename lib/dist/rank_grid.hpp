// The rank -> (dp, cp, tp) layout of DESIGN.md §4, as a pure value: no MPI, testable for every
// rank. tp varies fastest: rank = (dp * C + cp) * T + tp.
#pragma once
#include <cstdint>

#include "core/error.hpp"

namespace dz {

struct RankGrid {
  int world = 1, dp = 1, cp = 1, tp = 1;  // group sizes
  int rank = 0;                           // world rank

  static RankGrid make(int world, int rank, int cp, int tp) {
    DZ_CHECK(cp >= 1 && tp >= 1, "--cp and --tp must be >= 1 (got cp=", cp, ", tp=", tp, ")");
    DZ_CHECK(world % (cp * tp) == 0, "the number of ranks (", world, ") is not divisible by cp*tp = ", cp, "*", tp,
             " = ", cp * tp);
    DZ_CHECK(rank >= 0 && rank < world, "rank ", rank, " outside world of ", world);
    RankGrid g;
    g.world = world;
    g.cp = cp;
    g.tp = tp;
    g.dp = world / (cp * tp);
    g.rank = rank;
    return g;
  }
  // --ep E: 1, or a whole TP group times a divisor of --cp (the run and the plan check it alike).
  static void check_ep(int cp, int tp, int ep) {
    DZ_CHECK(ep == 1 || (ep > 1 && tp >= 1 && ep % tp == 0 && cp % (ep / tp) == 0), "--ep ", ep, " must be --tp (", tp,
             ") times a divisor of --cp (", cp, "): expert-parallel groups are whole TP groups of consecutive CP ranks");
  }
  int tp_rank() const { return rank % tp; }
  int cp_rank() const { return (rank / tp) % cp; }
  int dp_rank() const { return rank / (tp * cp); }
  // World rank of the member (dp, cp, tp).
  int rank_of(int d, int c, int t) const { return (d * cp + c) * tp + t; }
};

}  // namespace dz
