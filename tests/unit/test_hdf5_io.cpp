// HDF5 input/output: round trips (read back independently with the HDF5 C API), every input
// validation error, the output's create/resume/finalize rules and its crash safety.
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/h5handle.hpp"
#include "io/hdf5_io.hpp"

namespace fs = std::filesystem;
using dz::h5::Handle;

namespace {

// A fresh directory under /tmp, removed at the end of the test case.
struct TempDir {
  std::string dir;
  TempDir() {
    char tmpl[] = "/tmp/dz_h5_test_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string operator/(const std::string& f) const { return dir + "/" + f; }
};

// ---- independent readers (plain C API, no dayzero code)

struct Raw {
  std::vector<hsize_t> dims;
  std::vector<double> v;  // values converted to double (exact for everything we store)
};

Raw read_raw(const std::string& path, const std::string& name) {
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  REQUIRE(f);
  Handle d(H5Dopen2(f.get(), name.c_str(), H5P_DEFAULT));
  INFO("dataset " << name);
  REQUIRE(d);
  Raw r;
  Handle sp(H5Dget_space(d.get()));
  r.dims.resize(size_t(H5Sget_simple_extent_ndims(sp.get())));
  H5Sget_simple_extent_dims(sp.get(), r.dims.data(), nullptr);
  r.v.resize(size_t(H5Sget_simple_extent_npoints(sp.get())));
  if (!r.v.empty()) REQUIRE(H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, r.v.data()) >= 0);
  return r;
}

bool has_link(const std::string& path, const std::string& name) {
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  REQUIRE(f);
  return H5Lexists(f.get(), name.c_str(), H5P_DEFAULT) > 0;
}

std::string root_str_attr(const std::string& path, const std::string& name) {
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  Handle a(H5Aopen(f.get(), name.c_str(), H5P_DEFAULT));
  REQUIRE(a);
  Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  char* p = nullptr;
  REQUIRE(H5Aread(a.get(), t.get(), &p) >= 0);
  std::string s = p;
  H5free_memory(p);
  return s;
}

int64_t root_int_attr(const std::string& path, const std::string& name) {
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  Handle a(H5Aopen(f.get(), name.c_str(), H5P_DEFAULT));
  REQUIRE(a);
  int64_t v = -1;
  REQUIRE(H5Aread(a.get(), H5T_NATIVE_INT64, &v) >= 0);
  return v;
}

// Writes an arbitrary dataset (for malformed inputs).
template <class T>
void put(hid_t file, const char* name, hid_t ftype, hid_t mtype, const std::vector<hsize_t>& dims,
         const std::vector<T>& v) {
  Handle sp(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  Handle d(H5Dcreate2(file, name, ftype, sp.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  REQUIRE(d);
  if (!v.empty()) REQUIRE(H5Dwrite(d.get(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
}

Handle new_file(const std::string& path) {
  Handle f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  REQUIRE(f);
  return f;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ---- synthetic documents and per-document results (deterministic in the document index)

dz::OutputSpec make_spec(dz::OutputMode mode, std::vector<int64_t> lengths) {
  dz::OutputSpec s;
  s.mode = mode;
  s.topk = 3;
  s.max_new_tokens = 5;
  s.vocab = 7;
  s.doc_lengths = std::move(lengths);
  s.identity = {{"model", "abc123"}, {"input", "in-fp-9"}, {"mode", dz::to_string(mode)}};
  s.info = {{"host", "testhost"}, {"version", "0.1"}};
  return s;
}

std::vector<float> values(int64_t doc, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) v[size_t(j)] = -0.25f * float(doc + 1) - 0.001f * float(j);
  return v;
}
std::vector<int32_t> ids(int64_t doc, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) v[size_t(j)] = int32_t(1000 * doc + j);
  return v;
}
int64_t gen_len(int64_t doc, int64_t max_new) { return doc % (max_new + 1); }
dz::DocStats stats(int64_t doc) { return {0.5 * double(doc), 10 + doc, int32_t(doc % 3)}; }

// Writes document i's result in whatever mode the spec has.
void write_doc(dz::OutputFile& f, const dz::OutputSpec& s, int64_t i) {
  const int64_t L = s.doc_lengths[size_t(i)];
  switch (s.mode) {
    case dz::OutputMode::Logprobs: f.write_logprobs(i, values(i, L - 1), stats(i)); break;
    case dz::OutputMode::TopK: f.write_topk(i, ids(i, L * s.topk), values(i, L * s.topk), stats(i)); break;
    case dz::OutputMode::LastLogits: f.write_last_logits(i, values(i, s.vocab), stats(i)); break;
    case dz::OutputMode::Generate: f.write_generated(i, ids(i, gen_len(i, s.max_new_tokens)), stats(i)); break;
  }
}

// Checks a finished file against the spec and the synthetic results of every document.
void check_final(const std::string& path, const dz::OutputSpec& s) {
  const int64_t n = int64_t(s.doc_lengths.size());
  REQUIRE(fs::exists(path));
  REQUIRE_FALSE(fs::exists(path + ".part"));
  REQUIRE_FALSE(fs::exists(path + ".tmp"));
  CHECK(root_int_attr(path, "complete") == 1);
  CHECK(root_int_attr(path, "n_docs") == n);
  CHECK(root_str_attr(path, "output_mode") == dz::to_string(s.mode));
  for (const auto& kv : s.identity) CHECK(root_str_attr(path, kv.first) == kv.second);
  for (const auto& kv : s.info) CHECK(root_str_attr(path, kv.first) == kv.second);
  Raw done = read_raw(path, "done"), sec = read_raw(path, "stats/seconds"), tok = read_raw(path, "stats/tokens"),
      rank = read_raw(path, "stats/rank");
  REQUIRE(done.v.size() == size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    CHECK(done.v[size_t(i)] == 1);
    CHECK(sec.v[size_t(i)] == stats(i).seconds);
    CHECK(tok.v[size_t(i)] == double(stats(i).tokens));
    CHECK(rank.v[size_t(i)] == double(stats(i).rank));
  }
  // Expected payload, concatenated in document order (an independent layout computation).
  std::vector<double> want, want_ids, want_off = {0};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t L = s.doc_lengths[size_t(i)];
    const int64_t rows = s.mode == dz::OutputMode::Logprobs ? L - 1
                         : s.mode == dz::OutputMode::TopK   ? L
                         : s.mode == dz::OutputMode::Generate ? gen_len(i, s.max_new_tokens)
                                                               : 1;
    const int64_t width = s.mode == dz::OutputMode::TopK ? s.topk : s.mode == dz::OutputMode::LastLogits ? s.vocab : 1;
    for (float x : values(i, rows * width)) want.push_back(x);
    for (int32_t x : ids(i, rows * width)) want_ids.push_back(x);
    want_off.push_back(want_off.back() + double(rows));
  }
  switch (s.mode) {
    case dz::OutputMode::Logprobs:
      CHECK(read_raw(path, "logprobs").v == want);
      CHECK(read_raw(path, "offsets").v == want_off);
      break;
    case dz::OutputMode::TopK: {
      Raw r = read_raw(path, "topk_ids");
      CHECK(r.dims == std::vector<hsize_t>{hsize_t(want_off.back()), hsize_t(s.topk)});
      CHECK(r.v == want_ids);
      CHECK(read_raw(path, "topk_logprobs").v == want);
      CHECK(read_raw(path, "offsets").v == want_off);
      break;
    }
    case dz::OutputMode::LastLogits: {
      Raw r = read_raw(path, "last_logits");
      CHECK(r.dims == std::vector<hsize_t>{hsize_t(n), hsize_t(s.vocab)});
      CHECK(r.v == want);
      break;
    }
    case dz::OutputMode::Generate:
      CHECK(read_raw(path, "generated").v == want_ids);
      CHECK(read_raw(path, "generated_offsets").v == want_off);
      CHECK_FALSE(has_link(path, "generated_slots"));
      CHECK_FALSE(has_link(path, "generated_len"));
      break;
  }
}

const dz::OutputMode kModes[] = {dz::OutputMode::Logprobs, dz::OutputMode::TopK, dz::OutputMode::LastLogits,
                                 dz::OutputMode::Generate};

}  // namespace

// ================================================================ input

TEST_CASE("hdf5_io: output mode names", "[unit]") {
  for (dz::OutputMode m : kModes) CHECK(dz::parse_output_mode(dz::to_string(m)) == m);
  CHECK(std::string(dz::to_string(dz::OutputMode::LastLogits)) == "last-logits");
  CHECK_THROWS_WITH(dz::parse_output_mode("logits"),
                    "unknown output mode 'logits' (expected logprobs, topk, last-logits or generate)");
}

TEST_CASE("hdf5_io: input round trip and chunked validation", "[unit]") {
  TempDir t;
  std::mt19937 rng(7);
  const std::vector<int64_t> lengths = {1, 3, 7, 19, 65, 2};
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets = {0};
  for (int64_t L : lengths) {
    for (int64_t j = 0; j < L; ++j) tokens.push_back(int32_t(rng() % 32000));
    offsets.push_back(int64_t(tokens.size()));
  }
  const std::string in = t / "in.h5";
  dz::write_input_file(in, tokens, offsets);
  {
    dz::InputFile f(in);
    CHECK(f.path() == in);
    CHECK(f.n_docs() == 6);
    CHECK(f.n_tokens() == int64_t(tokens.size()));
    CHECK(f.offsets() == offsets);
    for (int64_t i = 0; i < f.n_docs(); ++i) {
      CHECK(f.doc_length(i) == lengths[size_t(i)]);
      std::vector<int32_t> want(tokens.begin() + offsets[size_t(i)], tokens.begin() + offsets[size_t(i) + 1]);
      CHECK(f.read_doc(i) == want);
    }
    for (int64_t chunk : {1, 7, 64, 1 << 20}) CHECK_NOTHROW(f.validate(32000, chunk));
    CHECK_THROWS_WITH(f.read_doc(6), in + ": document 6 out of range (6 documents)");
  }
  // Independent check of the on-disk types: int32 tokens, int64 offsets. (Opened after the
  // InputFile is closed: HDF5 refuses a second open with different file-locking settings.)
  Handle h(H5Fopen(in.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  Handle dt(H5Dopen2(h.get(), "tokens", H5P_DEFAULT)), dof(H5Dopen2(h.get(), "offsets", H5P_DEFAULT));
  Handle tt(H5Dget_type(dt.get())), to(H5Dget_type(dof.get()));
  CHECK(H5Tequal(tt.get(), H5T_STD_I32LE) > 0);
  CHECK(H5Tequal(to.get(), H5T_STD_I64LE) > 0);
}

TEST_CASE("hdf5_io: input validation errors", "[unit]") {
  TempDir t;
  const std::string in = t / "in.h5";
  // 4 documents of lengths 3, 7, 19, 1 (offsets 0 3 10 29 30).
  std::vector<int32_t> tokens(30, 5);
  const std::vector<int64_t> good = {0, 3, 10, 29, 30};
  auto check = [&](const std::vector<int32_t>& tk, const std::vector<int64_t>& off, const std::string& msg,
                   int64_t chunk = 7) {
    dz::write_input_file(in, tk, off);
    dz::InputFile f(in);
    CHECK_THROWS_WITH(f.validate(100, chunk), in + ": " + msg);
  };
  check(tokens, {1, 3, 10, 29, 30}, "/offsets[0] must be 0 (got 1)");
  check(tokens, {0, 3, 3, 29, 30}, "document 1 is empty (offsets[1] == offsets[2] == 3)");
  check(tokens, {0, 10, 3, 29, 30}, "/offsets must increase: offsets[1] = 10 > offsets[2] = 3");
  check(tokens, {0, 3, 10, 29, 31}, "offsets end at 31 but /tokens has 30 entries");
  check(std::vector<int32_t>(29, 5), good, "offsets end at 30 but /tokens has 29 entries");
  for (int64_t chunk : {1, 4, 7, 1 << 20}) {
    std::vector<int32_t> bad = tokens;
    bad[10 + 17] = 70000;  // document 2, position 17 (chunk boundaries fall elsewhere)
    check(bad, good, "document 2, position 17: token id 70000 >= vocab size 100", chunk);
    bad = tokens;
    bad[29] = -3;  // the very last token: document 3, position 0
    check(bad, good, "document 3, position 0: token id -3 is negative", chunk);
    bad = tokens;
    bad[0] = 100;  // first token, exactly vocab
    check(bad, good, "document 0, position 0: token id 100 >= vocab size 100", chunk);
  }
  // The first bad token in file order is reported.
  std::vector<int32_t> bad = tokens;
  bad[5] = 200;
  bad[4] = -1;
  check(bad, good, "document 1, position 1: token id -1 is negative");
  // A valid file with no documents at all is accepted.
  dz::write_input_file(in, {}, {0});
  dz::InputFile empty(in);
  CHECK(empty.n_docs() == 0);
  CHECK_NOTHROW(empty.validate(100));
}

TEST_CASE("hdf5_io: input structure errors", "[unit]") {
  TempDir t;
  const std::string in = t / "in.h5";
  const std::vector<int64_t> off = {0, 2};
  {
    Handle f = new_file(in);
    put(f.get(), "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, {2}, off);
  }
  CHECK_THROWS_WITH(dz::InputFile(in), in + ": missing dataset /tokens");
  {
    Handle f = new_file(in);
    put(f.get(), "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, {2}, std::vector<int32_t>{1, 2});
  }
  CHECK_THROWS_WITH(dz::InputFile(in), in + ": missing dataset /offsets");
  {
    Handle f = new_file(in);
    put(f.get(), "tokens", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {1, 2}, std::vector<double>{1, 2});
    put(f.get(), "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, {2}, off);
  }
  CHECK_THROWS_WITH(dz::InputFile(in), in + ": /tokens must be a 1-D integer dataset (got float64 2-D)");
  {
    Handle f = new_file(in);
    put(f.get(), "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, {2}, std::vector<int32_t>{1, 2});
    put(f.get(), "offsets", H5T_STD_I32LE, H5T_NATIVE_INT32, {2, 1}, std::vector<int32_t>{0, 2});
  }
  CHECK_THROWS_WITH(dz::InputFile(in), in + ": /offsets must be a 1-D integer dataset (got int32 2-D)");
  {
    Handle f = new_file(in);
    put(f.get(), "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, {2}, std::vector<int32_t>{1, 2});
    put(f.get(), "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, {0}, std::vector<int64_t>{});
  }
  CHECK_THROWS_WITH(dz::InputFile(in), in + ": /offsets is empty (it needs n_docs + 1 entries)");
  {
    Handle f = new_file(in);
    Handle g(H5Gcreate2(f.get(), "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    put(f.get(), "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, {2}, off);
  }
  CHECK_THROWS_WITH(dz::InputFile(in), in + ": /tokens is not a dataset");
  // Other integer types are accepted and converted: uint16 tokens, int32 offsets.
  {
    Handle f = new_file(in);
    put(f.get(), "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, {3}, std::vector<uint16_t>{65535, 1, 2});
    put(f.get(), "offsets", H5T_STD_I32LE, H5T_NATIVE_INT32, {3}, std::vector<int32_t>{0, 1, 3});
  }
  {
    dz::InputFile f(in);
    CHECK(f.offsets() == std::vector<int64_t>{0, 1, 3});
    CHECK(f.read_doc(0) == std::vector<int32_t>{65535});
    CHECK_NOTHROW(f.validate(65536));
  }
  // int64 tokens beyond the int32 range are refused, not clamped.
  {
    Handle f = new_file(in);
    put(f.get(), "tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, {3}, std::vector<int64_t>{1, int64_t(1) << 40, 2});
    put(f.get(), "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, {2}, std::vector<int64_t>{0, 3});
  }
  {
    dz::InputFile f(in);
    CHECK_THROWS_WITH(f.validate(100), in + ": cannot read /tokens[0:3] (values outside the int32 range?)");
    CHECK_THROWS_WITH(f.read_doc(0), in + ": cannot read document 0 from /tokens");
  }
}

TEST_CASE("hdf5_io: garbage, truncated and missing input files", "[unit]") {
  TempDir t;
  const std::string txt = t / "notes.h5", cut = t / "cut.h5", good = t / "good.h5";
  std::ofstream(txt) << "this is not an HDF5 file\n";
  CHECK_THROWS_WITH(dz::InputFile(txt), txt + ": not an HDF5 file or cannot be opened");
  dz::write_input_file(good, std::vector<int32_t>(5000, 1), {0, 2500, 5000});
  const std::string bytes = slurp(good);
  REQUIRE(bytes.size() > 20000);
  for (size_t keep : {bytes.size() / 2, size_t(100), size_t(0)}) {
    std::ofstream(cut, std::ios::binary).write(bytes.data(), std::streamsize(keep));
    INFO("kept " << keep << " bytes");
    CHECK_THROWS_WITH(dz::InputFile(cut), cut + ": not an HDF5 file or cannot be opened");
  }
  CHECK_THROWS_WITH(dz::InputFile(t / "nope.h5"), t / "nope.h5" + ": cannot open: No such file or directory");
}

// ================================================================ output

TEST_CASE("hdf5_io: output round trip in every mode", "[unit]") {
  for (dz::OutputMode mode : kModes) {
    DYNAMIC_SECTION(dz::to_string(mode)) {
      TempDir t;
      const std::string out = t / "out.h5";
      const dz::OutputSpec s = make_spec(mode, {1, 3, 7, 19, 2, 65, 4});
      auto f = dz::OutputFile::create(out, s, false);
      REQUIRE(fs::exists(out + ".part"));
      REQUIRE_FALSE(fs::exists(out));
      CHECK(f->done() == std::vector<uint8_t>(7, 0));
      CHECK_FALSE(f->finished());
      for (int64_t i : {3, 0, 6, 1, 5, 2, 4}) write_doc(*f, s, i);  // out of order, as ranks finish
      CHECK(f->done() == std::vector<uint8_t>(7, 1));
      f->finalize();
      CHECK(f->finished());
      CHECK_NOTHROW(f->finalize());  // idempotent
      check_final(out, s);
    }
  }
}

TEST_CASE("hdf5_io: zero-size outputs", "[unit]") {
  TempDir t;
  SECTION("logprobs where every document has length 1") {
    const dz::OutputSpec s = make_spec(dz::OutputMode::Logprobs, {1, 1, 1});
    auto f = dz::OutputFile::create(t / "a.h5", s, false);
    for (int64_t i = 0; i < 3; ++i) write_doc(*f, s, i);
    f->finalize();
    check_final(t / "a.h5", s);
    CHECK(read_raw(t / "a.h5", "logprobs").dims == std::vector<hsize_t>{0});
  }
  SECTION("generate where no document generated anything") {
    dz::OutputSpec s = make_spec(dz::OutputMode::Generate, {4, 2});
    auto f = dz::OutputFile::create(t / "g.h5", s, false);
    f->write_generated(0, {}, stats(0));
    f->write_generated(1, {}, stats(1));
    f->finalize();
    CHECK(read_raw(t / "g.h5", "generated").dims == std::vector<hsize_t>{0});
    CHECK(read_raw(t / "g.h5", "generated_offsets").v == std::vector<double>{0, 0, 0});
    CHECK(root_int_attr(t / "g.h5", "complete") == 1);
  }
  SECTION("no documents at all") {
    for (dz::OutputMode mode : kModes) {
      const dz::OutputSpec s = make_spec(mode, {});
      const std::string out = t / (std::string(dz::to_string(mode)) + ".h5");
      auto f = dz::OutputFile::create(out, s, false);
      f->finalize();
      check_final(out, s);
    }
  }
}

TEST_CASE("hdf5_io: resume after partial writes", "[unit]") {
  for (dz::OutputMode mode : kModes) {
    DYNAMIC_SECTION(dz::to_string(mode)) {
      TempDir t;
      const std::string out = t / "out.h5";
      const dz::OutputSpec s = make_spec(mode, {5, 1, 8, 3});
      {
        auto f = dz::OutputFile::create(out, s, false);
        write_doc(*f, s, 1);
        write_doc(*f, s, 3);
      }  // destroyed without finalize: an interrupted run
      REQUIRE(fs::exists(out + ".part"));
      REQUIRE_FALSE(fs::exists(out));
      CHECK_THROWS_WITH(dz::OutputFile::create(out, s, false),
                        out + ".part exists (an interrupted run); pass --resume to continue it or --overwrite to start over");
      {
        auto f = dz::OutputFile::resume(out, s);
        CHECK_FALSE(f->finished());
        CHECK(f->done() == std::vector<uint8_t>{0, 1, 0, 1});
        CHECK_THROWS_WITH(write_doc(*f, s, 3), out + ".part: document 3 is already done");
        CHECK_THROWS_WITH(f->finalize(),
                          out + ".part: cannot finalize: 2 of 4 documents not done (first: document 0)");
        write_doc(*f, s, 0);
        write_doc(*f, s, 2);
        f->finalize();
      }
      check_final(out, s);
      // Resuming a complete output: nothing to do, nothing written.
      const std::string before = slurp(out);
      auto g = dz::OutputFile::resume(out, s);
      CHECK(g->finished());
      CHECK(g->done() == std::vector<uint8_t>(4, 1));
      CHECK_NOTHROW(g->finalize());
      CHECK_THROWS_WITH(write_doc(*g, s, 0), out + " is complete; nothing more can be written");
      g.reset();
      CHECK(slurp(out) == before);
      CHECK_FALSE(fs::exists(out + ".part"));
    }
  }
}

TEST_CASE("hdf5_io: resume after a hard crash (child process exits without closing)", "[unit]") {
  for (dz::OutputMode mode : {dz::OutputMode::TopK, dz::OutputMode::Generate}) {
    TempDir t;
    const std::string out = t / "out.h5";
    const dz::OutputSpec s = make_spec(mode, {6, 2, 9, 4, 3});
    fflush(nullptr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: no destructors, no H5Fclose, like a killed rank (only what was flushed survives).
      try {
        auto f = dz::OutputFile::create(out, s, false);
        write_doc(*f, s, 4);
        write_doc(*f, s, 0);
        f.release();
      } catch (...) {
        _exit(3);
      }
      _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    auto f = dz::OutputFile::resume(out, s);
    CHECK(f->done() == std::vector<uint8_t>{1, 0, 0, 0, 1});
    for (int64_t i : {1, 2, 3}) write_doc(*f, s, i);
    f->finalize();
    check_final(out, s);
  }
}

TEST_CASE("hdf5_io: resume refuses a different run", "[unit]") {
  TempDir t;
  const std::string out = t / "out.h5", part = out + ".part";
  const dz::OutputSpec s = make_spec(dz::OutputMode::Logprobs, {4, 2, 3});
  dz::OutputFile::create(out, s, false).reset();
  dz::OutputSpec d = s;
  d.identity["model"] = "zzz";
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, d), part + " was written with model=abc123; this run has model=zzz");
  d = s;
  d.identity["seed"] = "4";
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, d), part + " has no identity attribute seed; this run has seed=4");
  d = s;
  d.identity.erase("input");
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, d), part + " was written with input=in-fp-9; this run has no input");
  d = s;
  d.info["host"] = "elsewhere";  // informational only
  CHECK_NOTHROW(dz::OutputFile::resume(out, d));
  // Identity kept but the structure differs (a caller that leaves the mode out of the identity).
  d = make_spec(dz::OutputMode::TopK, {4, 2, 3});
  d.identity = s.identity;
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, d),
                    part + " was written with output_mode=logprobs; this run has output_mode=topk");
  d = s;
  d.doc_lengths = {4, 2, 3, 1};
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, d), part + " was written with n_docs=3; this run has n_docs=4");
  d = s;
  d.doc_lengths = {2, 4, 3};  // same total, different documents
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, d), part + ": /offsets[1] = 3, this input gives 1 (a different input?)");
  d = s;
  d.doc_lengths = {4, 2, 4};
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, d),
                    part + ": /logprobs is float32 [6], this run expects float32 [7] (a different input?)");
  // A garbage .part and a foreign complete file.
  std::ofstream(part) << "garbage";
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, s),
                    part + ": not an HDF5 file or cannot be opened; pass --overwrite to start over");
  fs::remove(part);
  dz::write_input_file(out, {1}, {0, 1});
  CHECK_THROWS_WITH(dz::OutputFile::resume(out, s),
                    out + " exists but is not a complete dayzero output; pass --overwrite to replace it");
}

TEST_CASE("hdf5_io: exists, overwrite and .part rules", "[unit]") {
  TempDir t;
  const std::string out = t / "out.h5", part = out + ".part";
  const dz::OutputSpec s = make_spec(dz::OutputMode::LastLogits, {3, 1});
  // resume with neither file: a fresh output.
  {
    auto f = dz::OutputFile::resume(out, s);
    CHECK(f->done() == std::vector<uint8_t>{0, 0});
    write_doc(*f, s, 0);
    write_doc(*f, s, 1);
    f->finalize();
  }
  check_final(out, s);
  const std::string old = slurp(out);
  CHECK_THROWS_WITH(dz::OutputFile::create(out, s, false),
                    out + " exists; pass --resume to continue it or --overwrite to replace it");
  CHECK_FALSE(fs::exists(part));
  {
    // --overwrite: the old result stays in place until the new one is finalised.
    dz::OutputSpec s2 = s;
    s2.info["host"] = "second";
    auto f = dz::OutputFile::create(out, s2, true);
    write_doc(*f, s2, 1);
    CHECK(slurp(out) == old);
    f.reset();
    CHECK(slurp(out) == old);
    // An interrupted overwrite run: .part wins over the old PATH.
    CHECK_THROWS_WITH(dz::OutputFile::create(out, s2, false),
                      part + " exists (an interrupted run); pass --resume to continue it or --overwrite to start over");
    auto r = dz::OutputFile::resume(out, s2);
    CHECK(r->done() == std::vector<uint8_t>{0, 1});
    r.reset();
    // --overwrite again: the .part is replaced by a fresh one.
    auto g = dz::OutputFile::create(out, s2, true);
    CHECK(g->done() == std::vector<uint8_t>{0, 0});
    write_doc(*g, s2, 0);
    write_doc(*g, s2, 1);
    CHECK(slurp(out) == old);
    g->finalize();
    check_final(out, s2);
    CHECK(root_str_attr(out, "host") == "second");
  }
}

TEST_CASE("hdf5_io: unwritable output directory", "[unit]") {
  TempDir t;
  const dz::OutputSpec s = make_spec(dz::OutputMode::Logprobs, {3});
  if (geteuid() == 0) {
    // chmod does not stop root: use a directory that does not exist instead.
    const std::string out = t / "missing/out.h5";
    CHECK_THROWS_WITH(dz::OutputFile::create(out, s, false),
                      "cannot create " + out + ".part: No such file or directory");
  } else {
    const std::string dir = t / "ro";
    REQUIRE(mkdir(dir.c_str(), 0555) == 0);
    const std::string out = dir + "/out.h5";
    CHECK_THROWS_WITH(dz::OutputFile::create(out, s, false), "cannot create " + out + ".part: Permission denied");
    chmod(dir.c_str(), 0755);
  }
}

TEST_CASE("hdf5_io: a failed write leaves earlier documents intact", "[unit]") {
  TempDir t;
  const std::string out = t / "out.h5", part = out + ".part";
  const dz::OutputSpec s = make_spec(dz::OutputMode::TopK, {2, 5, 3, 1});
  {
    auto f = dz::OutputFile::create(out, s, false);
    write_doc(*f, s, 0);
    write_doc(*f, s, 1);
    // Wrong sizes, wrong mode, bad index: refused before anything is written.
    CHECK_THROWS_WITH(f->write_topk(2, ids(2, 8), values(2, 9), stats(2)),
                      part + ": document 2: got 8 ids and 9 logprobs, expected L * K = 3 * 3 = 9");
    CHECK_THROWS_WITH(f->write_logprobs(2, values(2, 2), stats(2)),
                      part + ": cannot write logprobs results to a topk output");
    CHECK_THROWS_WITH(f->write_topk(4, {}, {}, stats(2)), part + ": document 4 out of range (4 documents)");
    CHECK(f->done() == std::vector<uint8_t>{1, 1, 0, 0});
  }
  auto f = dz::OutputFile::resume(out, s);
  CHECK(f->done() == std::vector<uint8_t>{1, 1, 0, 0});
  write_doc(*f, s, 2);
  write_doc(*f, s, 3);
  f->finalize();
  check_final(out, s);  // documents 0 and 1 hold what was written before the failure

  // Size checks of the other modes.
  const std::string o2 = t / "o2.h5";
  dz::OutputSpec g = make_spec(dz::OutputMode::Generate, {2});
  auto fg = dz::OutputFile::create(o2, g, false);
  CHECK_THROWS_WITH(fg->write_generated(0, ids(0, 6), stats(0)),
                    o2 + ".part: document 0: got 6 generated tokens, more than max_new_tokens = 5");
  dz::OutputSpec l = make_spec(dz::OutputMode::LastLogits, {2});
  auto fl = dz::OutputFile::create(t / "o3.h5", l, false);
  CHECK_THROWS_WITH(fl->write_last_logits(0, values(0, 6), stats(0)),
                    t / "o3.h5" + ".part: document 0: got 6 logits, expected vocab = 7");
  dz::OutputSpec p = make_spec(dz::OutputMode::Logprobs, {4});
  auto fp = dz::OutputFile::create(t / "o4.h5", p, false);
  CHECK_THROWS_WITH(fp->write_logprobs(0, values(0, 4), stats(0)),
                    t / "o4.h5" + ".part: document 0: got 4 logprobs, expected L - 1 = 3");
}

TEST_CASE("hdf5_io: output spec checks", "[unit]") {
  TempDir t;
  dz::OutputSpec s = make_spec(dz::OutputMode::Logprobs, {3, 0});
  CHECK_THROWS_WITH(dz::OutputFile::create(t / "a.h5", s, false), "output spec: document 1 has length 0");
  s = make_spec(dz::OutputMode::Logprobs, {3});
  s.info["complete"] = "yes";
  CHECK_THROWS_WITH(dz::OutputFile::create(t / "a.h5", s, false),
                    "output spec: attribute name 'complete' is reserved or invalid");
  s = make_spec(dz::OutputMode::TopK, {3});
  s.topk = 0;
  CHECK_THROWS_WITH(dz::OutputFile::create(t / "a.h5", s, false), "output spec: topk mode needs K >= 1");
  CHECK_FALSE(fs::exists(t / "a.h5.part"));
}

TEST_CASE("hdf5_io: a resumed run gives the same file as a straight run", "[unit]") {
  // DESIGN §3: --resume "produces the same file as an uninterrupted run" -- byte for byte here,
  // since no timestamps are stored and every dataset is laid out at creation.
  for (dz::OutputMode mode : kModes) {
    DYNAMIC_SECTION(dz::to_string(mode)) {
      TempDir t;
      const dz::OutputSpec s = make_spec(mode, {3, 1, 7, 2, 5});
      {
        auto f = dz::OutputFile::create(t / "a.h5", s, false);
        for (int64_t i = 0; i < 5; ++i) write_doc(*f, s, i);
        f->finalize();
      }
      {
        auto f = dz::OutputFile::create(t / "b.h5", s, false);
        write_doc(*f, s, 4);
        write_doc(*f, s, 1);
      }
      for (int64_t i : {0, 3, 2}) {  // three more sessions
        auto f = dz::OutputFile::resume(t / "b.h5", s);
        write_doc(*f, s, i);
        if (i == 2) f->finalize();
      }
      CHECK(slurp(t / "a.h5") == slurp(t / "b.h5"));
    }
  }
}
