// The CP exchanges of forward_cp on the backend's buffers (model/parallel.hpp).
#include "backend/backend.hpp"
#include "model/parallel.hpp"

namespace dz {

DTensor cp_allgather_rows(Backend& be, const CpCtx& ctx, const DTensor& mine, const std::vector<int64_t>& rows_of) {
  DZ_CHECK(ctx.cp, "cp_allgather_rows: no CP group");
  if (ctx.dev) return ctx.dev->allgather_rows(mine, rows_of);
  return be.allgather_rows(ctx.cp, mine, rows_of);
}

DTensor cp_gather_seq(Backend& be, const CpCtx& ctx, const DTensor& mine) {
  DZ_CHECK(ctx.lay, "cp_gather_seq: no layout");
  const SeqLayout& lay = *ctx.lay;
  std::vector<int64_t> rows_of(size_t(lay.cp_size));
  for (int r = 0; r < lay.cp_size; ++r) rows_of[size_t(r)] = lay.rows_of(r);
  const DTensor all = cp_allgather_rows(be, ctx, mine, rows_of);  // grouped by rank, segments in layout order
  DTensor seq = be.alloc({lay.length, mine.cols()}, mine.dtype);
  std::vector<Backend::RowCopy> moves;
  int64_t at = 0;
  for (int r = 0; r < lay.cp_size; ++r)
    for (int j : lay.segments_of(r)) {
      const int64_t n = lay.seg_len(j);
      if (n > 0) moves.push_back({all, at, seq, lay.seg_begin(j), n});
      at += n;
    }
  DZ_CHECK(at == lay.length, "cp_gather_seq: the layout's segments hold ", at, " rows of a document of ", lay.length);
  be.copy_rows_many(moves);
  return seq;
}

}  // namespace dz
