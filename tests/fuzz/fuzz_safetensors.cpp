// libFuzzer harness: the safetensors reader (dz::Checkpoint::open, lib/io/checkpoint.cpp): the
// 8-byte header length, the JSON header, dtypes / shapes / data_offsets against the file size,
// the sharded index (model.safetensors.index.json + shards), and get() of every tensor listed
// (decoding each dtype, FP8 block scales), as `dayzero run` and `inspect` do.
//
// Input layout (a whole checkpoint directory in one byte string):
//   byte 0, bits 0-1: 0 or 3 -> the rest is DIR/model.safetensors
//                     1      -> the rest is split at "\n--SHARD--\n": part 0 is
//                               DIR/model.safetensors.index.json, parts 1..n (n <= 8) are
//                               DIR/model-0000i-of-0000n.safetensors
//                     2      -> the rest is a bare file DIR/x.safetensors, opened by path
//   byte 0, bit 2: dry run (inspect): get() checks names and shapes only
//   byte 0, bit 3: also read the tensors through rename_prefix("model.language_model.", "model.")
// An index naming a file outside DIR ("..") is skipped, so the harness reads only its own files.
// Every dz::Error (std::exception) is an expected outcome; crashes and sanitizer reports are not.
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "io/checkpoint.hpp"

namespace {

const char kSep[] = "\n--SHARD--\n";

std::vector<std::pair<const uint8_t*, size_t>> split(const uint8_t* p, size_t n) {
  std::vector<std::pair<const uint8_t*, size_t>> parts;
  const size_t k = sizeof kSep - 1;
  size_t start = 0;
  for (size_t i = 0; i + k <= n;) {
    if (std::memcmp(p + i, kSep, k) == 0) {
      parts.push_back({p + start, i - start});
      i += k;
      start = i;
    } else {
      ++i;
    }
  }
  parts.push_back({p + start, n - start});
  return parts;
}

void read_all(dz::Checkpoint& ck) {
  for (const std::string& name : ck.names()) {
    try {
      const dz::TensorInfo& ti = ck.info(name);
      dz::Tensor t = ck.get(name, ti.shape);
      if (!t.data.empty() && t.data.size() != size_t(dz::numel(ti.shape))) __builtin_trap();
    } catch (const std::exception&) {
    }
  }
  try {
    (void)ck.get_optional("dz.fuzz.absent", {1});
  } catch (const std::exception&) {
  }
  (void)ck.skip_prefix("model.visual.");
  (void)ck.unused();
  try {
    ck.check_all_used();
  } catch (const std::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  dzfuzz::init_once();
  dzfuzz::clear_files();
  const uint8_t mode = data[0];
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  const std::string& dir = dzfuzz::scratch_dir();
  std::string open_path = dir;
  switch (mode & 3) {
    case 1: {
      auto parts = split(p, n);
      if (parts.size() < 2 || parts.size() > 9) return 0;
      const std::string idx(reinterpret_cast<const char*>(parts[0].first), parts[0].second);
      if (idx.find("..") != std::string::npos) return 0;  // stay inside DIR
      dzfuzz::write_file("model.safetensors.index.json", parts[0].first, parts[0].second);
      const size_t shards = parts.size() - 1;
      for (size_t i = 1; i < parts.size(); ++i) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, shards);
        dzfuzz::write_file(name, parts[i].first, parts[i].second);
      }
      break;
    }
    case 2: open_path = dzfuzz::write_file("x.safetensors", p, n); break;
    default: dzfuzz::write_file("model.safetensors", p, n); break;
  }
  try {
    std::unique_ptr<dz::Checkpoint> ck = dz::Checkpoint::open(open_path);
    ck->set_dry_run(mode & 4);
    if (mode & 8) {
      try {
        ck->rename_prefix("model.language_model.", "model.");
        (void)ck->file_name("model.layers.0.x");
      } catch (const std::exception&) {
      }
    }
    read_all(*ck);
  } catch (const std::exception&) {
  }
  return 0;
}
