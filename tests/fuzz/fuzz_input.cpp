// libFuzzer harness: the HDF5 input validation (dz::InputFile, lib/io/hdf5_io.cpp), as `dayzero
// run` does it before any work: open the file (HDF5 superblock, /tokens and /offsets must be
// 1-D integer datasets, /offsets read whole with range-checked conversion), validate(vocab)
// (offsets start at 0, strictly increase and end at the token count; every token id in
// [0, vocab), scanned in chunks), then read documents by hyperslab.
//
// Input: the bytes of the .h5 file, written to the scratch directory and opened by path (HDF5
// needs a real file). vocab and the scan's chunk size come from the file size, so one corpus
// exercises several chunkings: vocab = 1000 (the seeds' tokens are < 1000, some are not),
// chunk = 1 + size % 61 for odd sizes, else validate()'s default 2^20.
//
// Bounds kept by the harness (docs/fuzzing.md, "Findings"): a file may declare datasets far
// larger than it stores (unallocated storage reads as the fill value). validate() is skipped when
// /tokens declares more than 2^18 entries (the scan reads them all: a 2 KB file can declare 2^40
// tokens and keep validate() busy for hours; slow, not a crash), and allocations over 256 MiB are
// refused by the sanitizer's allocator (ASAN_OPTIONS max_allocation_size_mb=256 with
// allocator_may_return_null=1, set by tests/CMakeLists.txt and scripts/fuzz.sh) and operator new
// below turns that into std::bad_alloc, as in the real binary ("dayzero: error: std::bad_alloc"),
// instead of an out-of-memory kill.
//
// After every input the harness also checks that dayzero closed every HDF5 object it opened
// (H5Fget_obj_count over all files: files, datasets, groups, named datatypes, attributes): a
// leaked id keeps the file open, and LeakSanitizer cannot see it (libhdf5 keeps ids reachable).

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "fuzz_common.hpp"
#include "io/hdf5_io.hpp"

// operator new as libstdc++'s: std::bad_alloc when malloc fails. ASan's own operator new aborts
// the process instead ("allocator is out of memory"), even with allocator_may_return_null=1, so
// without this a file declaring an /offsets of 2^58 entries (tests/fuzz/findings/
// input/huge-offsets.h5) would stop the fuzzer at the finding it already reported. malloc stays
// ASan's (bounds, use-after-free and double-free checks are kept; new/delete mismatches are not
// told apart from malloc/free any more).
void* operator new(std::size_t n) {
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return std::malloc(n ? n : 1); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return std::malloc(n ? n : 1); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

void run(const std::string& path, size_t size) {
  try {
    dz::InputFile in(path);
    if (in.n_docs() < 0) __builtin_trap();  // /offsets has at least one entry (checked)
    if (in.n_tokens() > (int64_t(1) << 18)) return;
    const int64_t vocab = 1000, chunk = (size & 1) ? 1 + int64_t(size % 61) : int64_t(1) << 20;
    in.validate(vocab, chunk);
    const uint64_t h = in.token_hash();
    (void)h;
    const int64_t nd = in.n_docs();
    int64_t total = 0;
    for (int64_t i = 0; i < nd && i < 8; ++i) total += int64_t(in.read_doc(i).size());
    if (nd > 8) total += int64_t(in.read_doc(nd - 1).size());
    if (total > in.n_tokens()) __builtin_trap();
    try {
      (void)in.read_doc(nd);  // out of range: must throw
      __builtin_trap();
    } catch (const std::exception&) {
    }
  } catch (const std::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dzfuzz::init_once();
  dzfuzz::clear_files();
  const std::string path = dzfuzz::write_file("in.h5", data, size);
  run(path, size);
  // Every file, dataset, group, named datatype and attribute dayzero opened is closed again.
  const ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open_objects != 0) {
    std::fprintf(stderr, "dz fuzz: %zd HDF5 objects still open after the input\n", open_objects);
    __builtin_trap();
  }
  return 0;
}
