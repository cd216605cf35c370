// The CP exchanges of forward_cp on the backend's buffers (model/parallel.hpp).
#include "backend/backend.hpp"
#include "model/parallel.hpp"

namespace dz {

std::unique_ptr<PendingRows> cp_allgather_rows_start(Backend& be, const CpCtx& ctx, const DTensor& mine,
                                                     const std::vector<int64_t>& rows_of) {
  DZ_CHECK(ctx.cp, "cp_allgather_rows: no CP group");
  if (ctx.dev) return ctx.dev->allgather_rows_start(mine, rows_of);
  return be.allgather_rows_start(ctx.cp, mine, rows_of);
}

DTensor cp_allgather_rows(Backend& be, const CpCtx& ctx, const DTensor& mine, const std::vector<int64_t>& rows_of) {
  return cp_allgather_rows_start(be, ctx, mine, rows_of)->wait();
}

namespace {
// The rows grouped by rank (each rank's segments in layout order) once they arrive, then moved
// into sequence order.
class PendingSeq final : public PendingRows {
 public:
  PendingSeq(Backend& be, const SeqLayout& lay, int64_t W, DType dt, std::unique_ptr<PendingRows> all)
      : be_(&be), lay_(&lay), W_(W), dt_(dt), all_(std::move(all)) {}
  DTensor wait() override {
    if (seq_.defined()) return seq_;
    const SeqLayout& lay = *lay_;
    const DTensor all = all_->wait();
    DTensor seq = be_->alloc({lay.length, W_}, dt_);
    std::vector<Backend::RowCopy> moves;
    int64_t at = 0;
    for (int r = 0; r < lay.cp_size; ++r)
      for (int j : lay.segments_of(r)) {
        const int64_t n = lay.seg_len(j);
        if (n > 0) moves.push_back({all, at, seq, lay.seg_begin(j), n});
        at += n;
      }
    DZ_CHECK(at == lay.length, "cp_gather_seq: the layout's segments hold ", at, " rows of a document of ", lay.length);
    be_->copy_rows_many(moves);
    return seq_ = seq;
  }

 private:
  Backend* be_;
  const SeqLayout* lay_;
  int64_t W_;
  DType dt_;
  std::unique_ptr<PendingRows> all_;
  DTensor seq_;
};
}  // namespace

std::unique_ptr<PendingRows> cp_gather_seq_start(Backend& be, const CpCtx& ctx, const DTensor& mine) {
  DZ_CHECK(ctx.lay, "cp_gather_seq: no layout");
  const SeqLayout& lay = *ctx.lay;
  std::vector<int64_t> rows_of(size_t(lay.cp_size));
  for (int r = 0; r < lay.cp_size; ++r) rows_of[size_t(r)] = lay.rows_of(r);
  return std::make_unique<PendingSeq>(be, lay, mine.cols(), mine.dtype, cp_allgather_rows_start(be, ctx, mine, rows_of));
}

DTensor cp_gather_seq(Backend& be, const CpCtx& ctx, const DTensor& mine) { return cp_gather_seq_start(be, ctx, mine)->wait(); }

}  // namespace dz
