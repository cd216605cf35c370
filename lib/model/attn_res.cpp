// Block Attention Residuals (CPU reference, fp32). Semantics and names: attn_res.hpp.
#include "model/attn_res.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "ops/norm.hpp"

namespace dz {

namespace {

const char* site_name(int which) { return which == 0 ? "self_attention" : "mlp"; }

}  // namespace

AttnRes::AttnRes(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix)
    : D_(cfg.hidden_size), L_(int(cfg.num_layers)), bs_(cfg.attn_res_block_size), eps_(cfg.rms_norm_eps) {
  DZ_CHECK(bs_ > 0, "AttnRes: attn_res_block_size must be positive, got ", bs_);
  DZ_CHECK(D_ > 0 && L_ > 0, "AttnRes: hidden_size ", D_, " and num_layers ", L_, " must be positive");
  const int sites = 2 * L_ + 1;
  query_.assign(size_t(sites) * size_t(D_), 0.f);
  for (int s = 0; s < sites; ++s) {
    // The score weights are applied as they are (never as 1 + w), whatever the model's other norms do.
    const std::string base = s == 2 * L_ ? prefix + "output_attn_res"
                                         : prefix + "layers." + std::to_string(s / 2) + "." + site_name(s % 2) + "_res";
    norm_w_.push_back(ck.get(base + "_norm.weight", {D_}, Init::ones()));
    proj_w_.push_back(ck.get(base + "_proj.weight", {1, D_}, Init::normal(0.02f)));
    const Tensor &n = norm_w_.back(), &p = proj_w_.back();
    if (n.size() != D_ || p.size() != D_) continue;  // dry run (inspect): shapes only, no data
    for (int64_t d = 0; d < D_; ++d) query_[size_t(s * D_ + d)] = n[d] * p[d];
  }
}

AttnRes::AttnRes(int64_t hidden, int num_layers, int64_t block_size, float eps, const Tensor& norm_w,
                 const Tensor& proj_w)
    : D_(hidden), L_(num_layers), bs_(block_size), eps_(eps) {
  DZ_CHECK(bs_ > 0, "AttnRes: block size must be positive, got ", bs_);
  DZ_CHECK(D_ > 0 && L_ > 0, "AttnRes: hidden ", D_, " and num_layers ", L_, " must be positive");
  const int sites = 2 * L_ + 1;
  const Shape want{sites, D_};
  DZ_CHECK(norm_w.shape == want, "AttnRes: norm weights ", shape_str(norm_w.shape), ", expected ", shape_str(want));
  DZ_CHECK(proj_w.shape == want, "AttnRes: proj weights ", shape_str(proj_w.shape), ", expected ", shape_str(want));
  query_.resize(size_t(sites) * size_t(D_));
  for (int s = 0; s < sites; ++s) {
    Tensor n({D_}), p({1, D_});
    std::memcpy(n.ptr(), norm_w.row(s), size_t(D_) * sizeof(float));
    std::memcpy(p.ptr(), proj_w.row(s), size_t(D_) * sizeof(float));
    for (int64_t d = 0; d < D_; ++d) query_[size_t(s * D_ + d)] = n[d] * p[d];
    norm_w_.push_back(std::move(n));
    proj_w_.push_back(std::move(p));
  }
}

void AttnRes::check_site(int next_site, int layer, int which, const char* what) const {
  DZ_CHECK(layer >= 0 && layer < L_ && (which == 0 || which == 1), "AttnRes::", what, ": bad site (layer ", layer,
           ", which ", which, ") for ", L_, " layers");
  DZ_CHECK(2 * layer + which == next_site, "AttnRes::", what, ": sub-layer (layer ", layer, ", which ", which,
           ") called out of order; expected (layer ", next_site / 2, ", which ", next_site % 2, ")");
}

// ---- the stream ----

void AttnRes::upload(Backend& be) {
  if (be.device() != Device::Host) dquery_ = be.upload(query_.data(), {2 * int64_t(L_) + 1, D_}, DType::F32);
}

AttnRes::Stream AttnRes::begin(Backend& be, const DTensor& embed) const {
  Stream s;
  if (be.device() == Device::Host) {
    s.query = host_view(const_cast<float*>(query_.data()), {2 * int64_t(L_) + 1, D_});
  } else {
    DZ_CHECK(dquery_.defined() && dquery_.device == be.device(), "AttnRes: pseudo-queries not uploaded to the ",
             be.name(), " backend");
    s.query = dquery_;
  }
  s.T = embed.rows();
  const int64_t n_max = (L_ + bs_ - 1) / bs_;  // layers l with l % bs == 0 close a block
  s.blocks = be.alloc({n_max, s.T, D_}, DType::F32);
  s.partial = be.alloc({s.T, D_}, DType::F32);
  be.copy_rows(embed, 0, s.partial, 0, s.T);  // b_0 stays "partial" until layer 0's mixer closes it
  return s;
}

void AttnRes::restart(Backend& be, Stream& s, const DTensor& embed) const {
  DZ_CHECK(s.partial.defined() && embed.rows() == s.T, "AttnRes::restart: a stream of ", s.T, " rows for ",
           embed.rows());
  s.n_blocks = 0;
  s.next_site = 0;
  be.copy_rows(embed, 0, s.partial, 0, s.T);
}

// out[t] = sum_i softmax_i(score_i) v_i over V = [blocks..., partial], per token t.
void AttnRes::mix(Backend& be, const Stream& s, int site, const DTensor& out) const {
  be.attn_res_mix(s.blocks.slab(0, s.n_blocks), s.n_blocks, s.partial, s.query.slab(site, site + 1).reshaped({D_}),
                  eps_, out);
}

void AttnRes::sublayer_input(Backend& be, const Stream& s, int layer, int which, const DTensor& out) const {
  check_site(s.next_site, layer, which, "sublayer_input");
  mix(be, s, 2 * layer + which, out);
}

void AttnRes::add_output(Backend& be, Stream& s, int layer, int which, const DTensor& f) const {
  check_site(s.next_site, layer, which, "add_output");
  if (which == 0 && layer % bs_ == 0) {
    // first layer of a block: the running sum becomes a closed block and f starts the next one
    DTensor b = s.blocks.slab(s.n_blocks, s.n_blocks + 1).reshaped({s.T, D_});
    be.copy_rows(s.partial, 0, b, 0, s.T);
    ++s.n_blocks;
    be.convert(f, s.partial);
  } else {
    be.add(s.partial, f);
  }
  ++s.next_site;
}

void AttnRes::final_output(Backend& be, const Stream& s, const DTensor& out) const {
  DZ_CHECK(s.next_site == 2 * L_, "AttnRes::final_output: called after ", s.next_site, " of ", 2 * L_,
           " sub-layers");
  mix(be, s, 2 * L_, out);
}

AttnRes::Stream AttnRes::begin(const float* embed, int64_t T) const {
  DZ_CHECK(T >= 0, "AttnRes::begin: negative token count ", T);
  return begin(cpu_backend(), host_view(const_cast<float*>(embed), {T, D_}));
}
void AttnRes::sublayer_input(const Stream& s, int layer, int which, float* out) const {
  sublayer_input(cpu_backend(), s, layer, which, host_view(out, {s.T, D_}));
}
void AttnRes::add_output(Stream& s, int layer, int which, const float* f) const {
  add_output(cpu_backend(), s, layer, which, host_view(const_cast<float*>(f), {s.T, D_}));
}
void AttnRes::final_output(const Stream& s, float* out) const { final_output(cpu_backend(), s, host_view(out, {s.T, D_})); }

}  // namespace dz
