#include "job/fingerprint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <vector>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_io.hpp"

namespace dz {

static std::string hex(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

std::string model_fingerprint(const std::string& dir, bool dummy_weights) {
  std::ifstream f(dir + "/config.json", std::ios::binary);
  DZ_CHECK(f.good(), "cannot read ", dir, "/config.json");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  uint64_t h = fnv1a64(s.data(), s.size());
  if (dummy_weights) {
    const std::string tag = "dummy-weights seed 0";
    return hex(fnv1a64(tag.data(), tag.size(), h));
  }
  auto ck = Checkpoint::open(dir);
  std::vector<char> buf(256);
  for (const auto& n : ck->names()) {
    const TensorInfo& t = ck->info(n);
    std::string d = n + "|" + to_string(t.dtype) + "|" + shape_str(t.shape) + "|" + std::to_string(t.nbytes);
    h = fnv1a64(d.data(), d.size(), h);
    // Weight values: 4 samples of up to 256 bytes (start, 1/3, 2/3, end) of every tensor, so a
    // checkpoint with the same shapes but other weights (another seed, a fine-tune) differs,
    // without reading hundreds of GB.
    std::ifstream f(t.file, std::ios::binary);
    DZ_CHECK(f.good(), "cannot read ", t.file);
    const uint64_t len = std::min<uint64_t>(256, t.nbytes);
    for (uint64_t k = 0; k < 4 && len > 0; ++k) {
      const uint64_t off = t.offset + (k < 3 ? (t.nbytes - len) * k / 3 : t.nbytes - len);
      f.seekg(std::streamoff(off));
      f.read(buf.data(), std::streamsize(len));
      DZ_CHECK(f.good(), "cannot read tensor ", n, " in ", t.file);
      h = fnv1a64(buf.data(), size_t(len), h);
    }
  }
  return hex(h);
}

std::string input_fingerprint(const InputFile& in) {
  const auto& o = in.offsets();
  uint64_t h = fnv1a64(o.data(), o.size() * sizeof(int64_t));
  int64_t n = in.n_tokens();
  h = fnv1a64(&n, sizeof n, h);
  const uint64_t t = in.token_hash();  // every token value (hashed during validation)
  h = fnv1a64(&t, sizeof t, h);
  // the optional per-document arrays change the results (and the scores): in the fingerprint when
  // present, so an input without them keeps the fingerprint it always had
  if (!in.score_from().empty()) h = fnv1a64(in.score_from().data(), in.score_from().size() * sizeof(int64_t), h ^ 0x5c);
  if (!in.bytes().empty()) h = fnv1a64(in.bytes().data(), in.bytes().size() * sizeof(int64_t), h ^ 0xb7);
  return hex(h);
}

}  // namespace dz
