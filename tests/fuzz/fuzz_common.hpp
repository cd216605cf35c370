// Shared helpers of the libFuzzer harnesses (tests/fuzz/, docs/fuzzing.md): a private scratch
// directory per process, where a harness writes the fuzz bytes as the files dayzero opens.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace dzfuzz {

// $DZ_FUZZ_TMP, else /dev/shm (tmpfs: HDF5 files are written and opened at every execution),
// else $TMPDIR, else /tmp; one mkdtemp directory per process (libFuzzer -jobs / -fork run
// several), removed at exit.
// The statics here are never destroyed (they are used by the atexit handler).
inline const std::string& scratch_dir() {
  static const std::string* dir = new std::string([] {
    std::vector<std::string> bases;
    if (const char* e = std::getenv("DZ_FUZZ_TMP")) bases.push_back(e);
    bases.push_back("/dev/shm");
    if (const char* e = std::getenv("TMPDIR")) bases.push_back(e);
    bases.push_back("/tmp");
    for (const std::string& b : bases) {
      std::string t = b + "/dz-fuzz-XXXXXX";
      if (::mkdtemp(&t[0])) return t;
    }
    std::fprintf(stderr, "dz fuzz: cannot create a scratch directory\n");
    std::abort();
  }());
  return *dir;
}

// Files written by the harness; removed before each execution and at exit.
inline std::vector<std::string>& written() {
  static std::vector<std::string>* w = new std::vector<std::string>;
  return *w;
}

inline void clear_files() {
  for (const std::string& p : written()) ::unlink(p.c_str());
  written().clear();
}

inline void at_exit() {
  clear_files();
  ::rmdir(scratch_dir().c_str());
}

// Writes DIR/name (name relative to the scratch directory; "sub/x" needs sub to exist).
inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string p = scratch_dir() + "/" + name;
  FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) {
    std::perror(p.c_str());
    std::abort();
  }
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
  written().push_back(p);
  return p;
}

inline void init_once() {
  static const bool done = [] {
    (void)scratch_dir();
    std::atexit(at_exit);
    return true;
  }();
  (void)done;
}

}  // namespace dzfuzz
