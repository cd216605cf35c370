#include "job/fingerprint.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_io.hpp"

namespace dz {

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static std::string hex(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

std::string model_fingerprint(const std::string& dir) {
  std::ifstream f(dir + "/config.json", std::ios::binary);
  DZ_CHECK(f.good(), "cannot read ", dir, "/config.json");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  uint64_t h = fnv1a64(s.data(), s.size());
  auto ck = Checkpoint::open(dir);
  for (const auto& n : ck->names()) {
    const TensorInfo& t = ck->info(n);
    std::string d = n + "|" + to_string(t.dtype) + "|" + shape_str(t.shape) + "|" + std::to_string(t.nbytes);
    h = fnv1a64(d.data(), d.size(), h);
  }
  return hex(h);
}

std::string input_fingerprint(const InputFile& in) {
  const auto& o = in.offsets();
  uint64_t h = fnv1a64(o.data(), o.size() * sizeof(int64_t));
  int64_t n = in.n_tokens();
  h = fnv1a64(&n, sizeof n, h);
  return hex(h);
}

}  // namespace dz
