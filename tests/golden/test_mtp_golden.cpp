// The MTP layer (model/mtp.hpp) against the fp64 NumPy reference (tests/golden/make_mtp.py with
// numpy_ref.deepseek_mtp / qwen3_next_mtp / deepseek_v4_mtp): each golden model with random MTP weights beside it,
// its documents prefilled, then the MTP layer over every row (Model::mtp_extend), the logits
// compared with the reference's.
#include <catch2/catch.hpp>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "h5_read.hpp"
#include "model/model.hpp"
#include "mtp_fixture.hpp"

TEST_CASE("MTP golden: the MTP layer's logits equal the fp64 NumPy reference", "[golden]") {
  // Tolerance 2e-4 absolute on logits of magnitude <= 11: the fp32 model and MTP layer against
  // fp64 (the goldens' log-probs sit at ~1e-5 from fp64 for these families, the chunked GDN of the
  // Qwen ones at ~1e-4); a wrong formula (norms swapped, [hidden; emb] order, the pre-norm hidden,
  // position 1 instead of 0, position 0's embedding not zeroed) moves them by >= 0.1.
  const std::string ref = std::string(DZ_SOURCE_DIR) + "/tests/golden/mtp/mtp_ref.h5";
  hid_t f = H5Fopen(ref.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  for (const std::string fam : {"deepseek_v32", "glm_moe_dsa", "qwen3_next", "qwen3_5_moe_text", "deepseek_v4"}) {
    INFO(fam);
    auto model = dz::Model::load(dzt::golden_with_mtp(fam, DZ_BINARY_DIR), dz::TpShard{}, false, false, dz::cpu_backend(), false, true);
    REQUIRE(model->has_mtp());
    const int64_t V = model->config().vocab_size;
    const auto tokens = dzt::read_ds<int32_t>(f, "/" + fam + "/tokens", H5T_NATIVE_INT32);
    const auto offsets = dzt::read_ds<int64_t>(f, "/" + fam + "/offsets", H5T_NATIVE_INT64);
    const auto want = dzt::read_ds<float>(f, "/" + fam + "/logits", H5T_NATIVE_FLOAT);
    double worst = 0;
    int64_t row = 0;
    for (size_t d = 0; d + 1 < offsets.size(); ++d) {
      const int64_t o = offsets[d], T = offsets[d + 1] - o;
      auto st = model->make_state();
      dz::DTensor in, out;  // in: what the MTP layer reads (DeepSeek-V4: the streams before the head)
      model->forward(&tokens[size_t(o)], T, st, {}, nullptr, nullptr, &in);
      model->mtp_extend(&tokens[size_t(o)], {0, T}, in, {&st}, &out);
      REQUIRE(out.rows() == T - 1);
      std::vector<float> lg(static_cast<size_t>((T - 1) * V));
      model->logits(out, lg.data());
      for (int64_t i = 0; i < (T - 1) * V; ++i)
        worst = std::max(worst, std::fabs(double(lg[size_t(i)]) - want[size_t(row * V + i)]));
      row += T - 1;
    }
    REQUIRE(size_t(row * V) == want.size());
    WARN(fam << ": MTP logits max |diff| vs fp64 " << worst);
    CHECK(worst < 2e-4);
  }
  H5Fclose(f);
}
