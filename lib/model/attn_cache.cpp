#include "model/attn_cache.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace dz {

DTensor RowStore::view(int64_t r0, int64_t r1) const {
  DZ_CHECK(r0 >= 0 && r0 <= r1 && r1 <= n, "RowStore: rows [", r0, ", ", r1, ") of ", n);
  if (!buf.defined()) {
    DTensor e;
    e.dtype = dtype;
    e.device = be ? be->device() : Device::Host;
    e.shape = {r1 - r0, width};
    return e;
  }
  return buf.slab(r0, r1);
}

DTensor RowStore::append(int64_t k) {
  DZ_CHECK(be, "RowStore used before init");
  const int64_t cap = buf.defined() ? buf.dim(0) : 0;
  if (n + k > cap) {
    // capacities in whole pages of 64 rows: a RowStore doubles as a paged cache with an identity
    // block table (the CUDA indexer reads its key rows that way)
    const int64_t nc = (std::max<int64_t>({n + k, 2 * cap, 64}) + 63) / 64 * 64;
    DTensor nb = be->alloc({nc, width}, dtype);
    if (n > 0) be->copy_rows(buf, 0, nb, 0, n);
    buf = nb;
  }
  n += k;
  return buf.slab(n - k, n);
}

std::vector<float> RowStore::host() const {
  if (n == 0) return {};
  return be->to_host(all());
}

RowStore RowStore::deep_copy() const {
  RowStore c;
  c.be = be;
  c.width = width;
  c.dtype = dtype;
  if (be && n > 0) {
    DTensor dst = c.append(n);
    be->copy_rows(all(), 0, dst, 0, n);
  }
  return c;
}

std::vector<int32_t> AttnCache::last_topk() const {
  std::vector<int32_t> v;
  for (const DTensor& s : last_sel) {
    const size_t n = v.size();
    v.resize(n + size_t(s.numel()));
    if (s.numel()) sel_be->download_i32(s, v.data() + n);
  }
  return v;
}

std::vector<AttnCache*> packed_caches(const std::vector<int64_t>& cu, const std::vector<MixerState*>& sts, int64_t rows,
                                      const char* who, bool* fresh) {
  const int64_t N = int64_t(cu.size()) - 1;
  DZ_CHECK(N >= 1 && int64_t(sts.size()) == N && cu.front() == 0 && cu.back() == rows, who, " forward_packed: ", N,
           " documents, ", sts.size(), " states, offsets to ", cu.empty() ? -1 : cu.back(), " of ", rows, " rows");
  std::vector<AttnCache*> st(static_cast<size_t>(N));
  *fresh = true;
  for (int64_t b = 0; b < N; ++b) {
    DZ_CHECK(cu[size_t(b)] <= cu[size_t(b) + 1], who, " forward_packed: offsets decrease at document ", b);
    AttnCache* c = dynamic_cast<AttnCache*>(sts[size_t(b)]);
    DZ_CHECK(c, who, " mixer: state of document ", b, " is not an attention cache");
    if (c->pos == 0) {
      DZ_CHECK(c->latent.rows() == 0 && c->index_k.rows() == 0 && c->k.rows() == 0 && c->v.rows() == 0, who,
               " mixer: document ", b, " at position 0 has a non-empty cache");
    } else {
      *fresh = false;
    }
    st[size_t(b)] = c;
  }
  return st;
}

std::unique_ptr<MixerState> AttnCache::clone() const {
  auto c = std::make_unique<AttnCache>();
  c->pos = pos;
  c->latent = latent.deep_copy();
  c->index_k = index_k.deep_copy();
  c->k = k.deep_copy();
  c->v = v.deep_copy();
  c->last_sel = last_sel;  // never written after the call that made them
  c->sel_be = sel_be;
  c->topk_width = topk_width;
  return c;
}

}  // namespace dz
