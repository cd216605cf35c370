// Block Attention Residuals (CPU reference, fp32). Semantics and names: attn_res.hpp.
#include "model/attn_res.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/linalg.hpp"

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

AttnRes::Stream AttnRes::begin(const float* embed, int64_t T) const {
  DZ_CHECK(T >= 0, "AttnRes::begin: negative token count ", T);
  Stream s;
  s.T = T;
  s.partial.assign(embed, embed + T * D_);  // b_0 stays "partial" until layer 0's mixer closes it
  return s;
}

void AttnRes::check_site(const Stream& s, int layer, int which, const char* what) const {
  DZ_CHECK(layer >= 0 && layer < L_ && (which == 0 || which == 1), "AttnRes::", what, ": bad site (layer ", layer,
           ", which ", which, ") for ", L_, " layers");
  DZ_CHECK(2 * layer + which == s.next_site, "AttnRes::", what, ": sub-layer (layer ", layer, ", which ", which,
           ") called out of order; expected (layer ", s.next_site / 2, ", which ", s.next_site % 2, ")");
}

// out[t] = sum_i softmax_i(score_i) v_i over V = [blocks..., partial], per token t.
void AttnRes::mix(const Stream& s, int site, float* out) const {
  const int64_t D = D_, T = s.T, n = s.n_blocks + 1;
  const float* q = query_.data() + size_t(site) * size_t(D);  // [D] pseudo-query
  std::vector<const float*> v(static_cast<size_t>(n));
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < s.n_blocks; ++i) v[size_t(i)] = s.blocks.data() + (i * T + t) * D;
    v[size_t(n - 1)] = s.partial.data() + t * D;
    // score_i = q · (v_i / rms(v_i)); the RMS factor is folded in after the reduction
    float m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      const float ms = dot(v[size_t(i)], v[size_t(i)], D) / float(D);
      const float r = 1.f / std::sqrt(ms + eps_);
      w[size_t(i)] = r * dot(v[size_t(i)], q, D);
      m = std::max(m, w[size_t(i)]);
    }
    float z = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      w[size_t(i)] = std::exp(w[size_t(i)] - m);
      z += w[size_t(i)];
    }
    float* o = out + t * D;
    // first term assigned, not added to 0, so a single value passes through bit for bit (-0 included)
    const float a0 = w[0] / z;
    for (int64_t d = 0; d < D; ++d) o[d] = a0 * v[0][d];
    for (int64_t i = 1; i < n; ++i) {
      const float a = w[size_t(i)] / z;
      const float* vi = v[size_t(i)];
      for (int64_t d = 0; d < D; ++d) o[d] += a * vi[d];
    }
  }
}

void AttnRes::sublayer_input(const Stream& s, int layer, int which, float* out) const {
  check_site(s, layer, which, "sublayer_input");
  mix(s, 2 * layer + which, out);
}

void AttnRes::add_output(Stream& s, int layer, int which, const float* f) const {
  check_site(s, layer, which, "add_output");
  const size_t TD = size_t(s.T * D_);
  if (which == 0 && layer % bs_ == 0) {
    // first layer of a block: the running sum becomes a closed block and f starts the next one
    s.blocks.insert(s.blocks.end(), s.partial.begin(), s.partial.end());
    ++s.n_blocks;
    std::memcpy(s.partial.data(), f, TD * sizeof(float));
  } else {
    for (size_t j = 0; j < TD; ++j) s.partial[j] += f[j];
  }
  ++s.next_site;
}

void AttnRes::final_output(const Stream& s, float* out) const {
  DZ_CHECK(s.next_site == 2 * L_, "AttnRes::final_output: called after ", s.next_site, " of ", 2 * L_,
           " sub-layers");
  mix(s, 2 * L_, out);
}

}  // namespace dz
