// How one document is laid out over the ranks of a context-parallel (CP) group: a pure value,
// testable without MPI (DESIGN.md §4).
//
// The document [0, L) is cut into n_seg contiguous segments in sequence order. Zigzag over C
// ranks: 2C segments, rank i owns segments i and 2C-1-i, so every rank holds one early (cheap
// causal history) and one late (expensive) segment. Each zigzag segment may be cut further into
// `sub` sub-segments (the intra-rank parallel scan of the linear-attention path); with C == 1 the
// document is simply cut into `sub` segments on one rank. Segments may be empty when L < n_seg.
//
// A rank's local rows are its segments' tokens, segments in ascending index, tokens in order.
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.hpp"

namespace dz {

struct SeqLayout {
  int64_t length = 0;          // L
  int cp_size = 1, cp_rank = 0;
  std::vector<int64_t> start;  // [n_seg + 1], start[0] = 0, start[n_seg] = L
  std::vector<int> owner;      // [n_seg]

  int n_seg() const { return int(owner.size()); }
  int64_t seg_begin(int j) const { return start[size_t(j)]; }
  int64_t seg_len(int j) const { return start[size_t(j) + 1] - start[size_t(j)]; }

  // Zigzag over C ranks (2C segments when C > 1, 1 when C == 1), each cut into `sub` pieces.
  // Segment lengths differ by at most one token (the first L % n_seg are longer).
  static SeqLayout zigzag(int64_t L, int C, int rank, int sub = 1) {
    DZ_CHECK(C >= 1 && sub >= 1 && rank >= 0 && rank < C, "bad layout C=", C, " sub=", sub, " rank=", rank);
    const int base = C > 1 ? 2 * C : 1;
    SeqLayout s = even(L, base * sub, C, rank);
    for (int j = 0; j < base * sub; ++j) {
      int z = j / sub;  // zigzag segment
      s.owner[size_t(j)] = C > 1 ? (z < C ? z : 2 * C - 1 - z) : 0;
    }
    return s;
  }
  // Contiguous split over C ranks (for comparison in balance reports): rank i owns segment i.
  static SeqLayout contiguous(int64_t L, int C, int rank) {
    SeqLayout s = even(L, C, C, rank);
    for (int j = 0; j < C; ++j) s.owner[size_t(j)] = j;
    return s;
  }

  // Segments owned by `rank` (default: this rank), ascending.
  std::vector<int> segments_of(int rank) const {
    std::vector<int> r;
    for (int j = 0; j < n_seg(); ++j)
      if (owner[size_t(j)] == rank) r.push_back(j);
    return r;
  }
  std::vector<int> local_segments() const { return segments_of(cp_rank); }
  int64_t rows_of(int rank) const {
    int64_t n = 0;
    for (int j : segments_of(rank)) n += seg_len(j);
    return n;
  }
  int64_t local_rows() const { return rows_of(cp_rank); }
  // Global position of each local row.
  std::vector<int64_t> positions_of(int rank) const {
    std::vector<int64_t> p;
    for (int j : segments_of(rank))
      for (int64_t t = start[size_t(j)]; t < start[size_t(j) + 1]; ++t) p.push_back(t);
    return p;
  }
  std::vector<int64_t> local_positions() const { return positions_of(cp_rank); }
  // f(r, T, pos0) for each non-empty local segment, ascending: its first local row r (the local
  // rows hold the segments one after another), its length T and its global start pos0.
  template <class F>
  void each_local_segment(F&& f) const {
    int64_t r = 0;
    for (int j : local_segments()) {
      const int64_t T = seg_len(j);
      if (T > 0) f(r, T, seg_begin(j));
      r += T;
    }
  }

 private:
  static SeqLayout even(int64_t L, int n, int C, int rank) {
    SeqLayout s;
    s.length = L;
    s.cp_size = C;
    s.cp_rank = rank;
    s.start.resize(size_t(n) + 1);
    s.owner.assign(size_t(n), 0);
    const int64_t q = L / n, r = L % n;
    s.start[0] = 0;
    for (int j = 0; j < n; ++j) s.start[size_t(j) + 1] = s.start[size_t(j)] + q + (j < r ? 1 : 0);
    return s;
  }
};

}  // namespace dz
