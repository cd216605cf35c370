// The pieces of the Backend interface that every backend shares (backend.hpp).
#include "backend/backend.hpp"

#include "core/error.hpp"

namespace dz {

void Backend::check_head_matmul(const DTensor& x, int64_t x_hs, int64_t k, const DTensor& W, int64_t w0, int64_t w_hs,
                                const DTensor& y, int64_t y_hs, int64_t n, int64_t H) {
  const int64_t T = x.rows(), xc = x.cols(), yc = y.cols();
  DZ_CHECK(y.rows() == T && H >= 1 && k >= 0 && n >= 0 && (H - 1) * x_hs + k <= xc && (H - 1) * y_hs + n <= yc &&
               w0 >= 0 && w0 + (H - 1) * w_hs + k * n <= W.numel(),
           "head_matmul: ", H, " heads of [", k, "] -> [", n, "] over x ", shape_str(x.shape), " (head stride ", x_hs,
           "), y ", shape_str(y.shape), " (", y_hs, "), W ", shape_str(W.shape), " at ", w0, " (", w_hs, ")");
}

int64_t Backend::check_mla_latent(const DTensor& q, const DTensor& kv, const DTensor& out, int64_t H, int64_t R,
                                  int64_t DR) {
  const int64_t Dk = R + DR, T = q.numel() / (H * Dk);
  DZ_CHECK(kv.cols() == Dk && q.numel() == T * H * Dk && out.numel() == T * H * R, "mla_latent_attention: q ",
           shape_str(q.shape), ", cache ", shape_str(kv.shape), ", out ", shape_str(out.shape), " for ", H,
           " heads of [", R, " + ", DR, "]");
  return T;
}

void Backend::mla_latent_attention_generic(const DTensor& q, const DTensor& kv, const DTensor& sel, int64_t pos0,
                                           int64_t H, int64_t R, int64_t DR, float scale, const DTensor& out) {
  if (check_mla_latent(q, kv, out, H, R, DR) == 0) return;
  DTensor v = alloc({kv.rows(), R}, kv.dtype);  // the values: the latent columns of the cache rows
  copy_cols(kv, 0, v, 0, R);
  AttnArgs a;
  a.q = q;
  a.k = kv;
  a.v = v;
  a.out = out;
  a.sel = sel;
  a.pos0 = pos0;
  a.Hq = H;
  a.Hkv = 1;
  a.Dk = R + DR;
  a.Dv = R;
  a.scale = scale;
  attention(a);
}

void Backend::capture_begin() { fail(str("the ", name(), " backend has no graphs (capture_begin)")); }
std::unique_ptr<DeviceGraph> Backend::capture_end() { fail(str("the ", name(), " backend has no graphs (capture_end)")); }

}  // namespace dz
