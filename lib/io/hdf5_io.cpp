// HDF5 input and output (see hdf5_io.hpp for the crash-safety design, docs/formats.md for the
// layouts). Every failure becomes a one-line dz::Error naming the file (and dataset).
#include "io/hdf5_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/error.hpp"
#include "io/h5handle.hpp"

namespace dz {

using h5::Handle;

const char* to_string(OutputMode m) {
  switch (m) {
    case OutputMode::Logprobs: return "logprobs";
    case OutputMode::TopK: return "topk";
    case OutputMode::LastLogits: return "last-logits";
    case OutputMode::Generate: return "generate";
  }
  return "?";
}

OutputMode parse_output_mode(const std::string& s) {
  for (OutputMode m : {OutputMode::Logprobs, OutputMode::TopK, OutputMode::LastLogits, OutputMode::Generate})
    if (s == to_string(m)) return m;
  fail(str("unknown output mode '", s, "' (expected logprobs, topk, last-logits or generate)"));
}

namespace {

// ---------------------------------------------------------------- small helpers

bool path_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string dir_of(const std::string& p) {
  size_t k = p.find_last_of('/');
  if (k == std::string::npos) return ".";
  return k == 0 ? "/" : p.substr(0, k);
}

// Makes a rename in `dir` durable. Some file systems refuse fsync on directories: ignored.
void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void fsync_path(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  DZ_CHECK(fd >= 0, "cannot open ", p, " to sync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  DZ_CHECK(rc == 0, "cannot sync ", p, ": ", std::strerror(err));
}

// Type conversion exception handler: a value that does not fit the memory type aborts the read
// instead of being clamped silently.
H5T_conv_ret_t abort_out_of_range(H5T_conv_except_t e, hid_t, hid_t, void*, void*, void*) {
  return (e == H5T_CONV_EXCEPT_RANGE_HI || e == H5T_CONV_EXCEPT_RANGE_LOW) ? H5T_CONV_ABORT
                                                                           : H5T_CONV_UNHANDLED;
}

Handle strict_transfer() {
  Handle dxpl(H5Pcreate(H5P_DATASET_XFER));
  DZ_CHECK(dxpl && H5Pset_type_conv_cb(dxpl.get(), abort_out_of_range, nullptr) >= 0,
           "HDF5: cannot create a transfer property list");
  return dxpl;
}

// Reads or writes the box [start, start + count) of `dset` from/to a packed buffer. A box with no
// elements is a no-op (HDF5 rejects empty selections on some versions).
bool transfer(bool write, hid_t dset, hid_t memtype, const std::vector<hsize_t>& start,
              const std::vector<hsize_t>& count, void* buf, hid_t dxpl = H5P_DEFAULT) {
  hsize_t n = 1;
  for (hsize_t c : count) n *= c;
  if (n == 0) return true;
  Handle fspace(H5Dget_space(dset));
  if (!fspace) return false;
  if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
    return false;
  Handle mspace(H5Screate_simple(int(count.size()), count.data(), nullptr));
  if (!mspace) return false;
  herr_t rc = write ? H5Dwrite(dset, memtype, mspace.get(), fspace.get(), dxpl, buf)
                    : H5Dread(dset, memtype, mspace.get(), fspace.get(), dxpl, buf);
  return rc >= 0;
}

// ---------------------------------------------------------------- attributes

void write_str_attr(hid_t loc, const std::string& file, const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Handle space(H5Screate(H5S_SCALAR));
  Handle attr(H5Acreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* p = value.c_str();
  DZ_CHECK(attr && H5Awrite(attr.get(), type.get(), &p) >= 0, file, ": cannot write attribute ", name);
}

void write_i64_attr(hid_t loc, const std::string& file, const std::string& name, int64_t value) {
  Handle attr;
  if (H5Aexists(loc, name.c_str()) > 0) {
    attr = Handle(H5Aopen(loc, name.c_str(), H5P_DEFAULT));  // in-place update (e.g. "complete")
  } else {
    Handle space(H5Screate(H5S_SCALAR));
    attr = Handle(H5Acreate2(loc, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  }
  DZ_CHECK(attr && H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) >= 0, file, ": cannot write attribute ", name);
}

bool has_attr(hid_t loc, const std::string& name) { return H5Aexists(loc, name.c_str()) > 0; }

// Reads a string attribute, fixed or variable length.
std::string read_str_attr(hid_t loc, const std::string& file, const std::string& name) {
  Handle attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT));
  DZ_CHECK(attr, file, ": missing attribute ", name);
  Handle ftype(H5Aget_type(attr.get()));
  DZ_CHECK(H5Tget_class(ftype.get()) == H5T_STRING, file, ": attribute ", name, " is not a string");
  Handle mtype(H5Tcopy(H5T_C_S1));
  H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get()));  // HDF5 does not convert between ASCII and UTF-8
  if (H5Tis_variable_str(ftype.get()) > 0) {
    H5Tset_size(mtype.get(), H5T_VARIABLE);
    char* p = nullptr;
    DZ_CHECK(H5Aread(attr.get(), mtype.get(), &p) >= 0, file, ": cannot read attribute ", name);
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(ftype.get());
  std::string s(n + 1, '\0');
  H5Tset_size(mtype.get(), n + 1);
  DZ_CHECK(H5Aread(attr.get(), mtype.get(), &s[0]) >= 0, file, ": cannot read attribute ", name);
  return s.substr(0, std::strlen(s.c_str()));
}

int64_t read_i64_attr(hid_t loc, const std::string& file, const std::string& name) {
  Handle attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT));
  DZ_CHECK(attr, file, ": missing attribute ", name);
  int64_t v = 0;
  DZ_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &v) >= 0, file, ": cannot read attribute ", name, " as an integer");
  return v;
}

// ---------------------------------------------------------------- input datasets

// Opens /name and checks it is a 1-D integer dataset.
Handle open_int_1d(hid_t file, const std::string& path, const char* name) {
  DZ_CHECK(H5Lexists(file, name, H5P_DEFAULT) > 0, path, ": missing dataset /", name);
  Handle d(H5Dopen2(file, name, H5P_DEFAULT));
  DZ_CHECK(d, path, ": /", name, " is not a dataset");
  Handle type(H5Dget_type(d.get()));
  std::vector<hsize_t> dims = h5::dims_of(d.get());
  if (H5Tget_class(type.get()) != H5T_INTEGER || dims.size() != 1)
    fail(str(path, ": /", name, " must be a 1-D integer dataset (got ", h5::type_name(type.get()), " ",
             dims.empty() ? std::string("scalar") : str(dims.size(), "-D"), ")"));
  return d;
}

// PATH opened read-only, with the one-line errors a user's path gets (missing, not HDF5).
Handle open_readonly(const std::string& path) {
  h5::init();
  int fd = ::open(path.c_str(), O_RDONLY);
  DZ_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  ::close(fd);
  Handle fapl = h5::file_access();
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  DZ_CHECK(file, path, ": not an HDF5 file or cannot be opened");
  return file;
}

}  // namespace

// ================================================================ InputFile

InputFile::InputFile(const std::string& path) : path_(path) {
  Handle file = open_readonly(path);
  Handle tokens = open_int_1d(file.get(), path, "tokens");
  Handle offsets = open_int_1d(file.get(), path, "offsets");
  n_tokens_ = int64_t(h5::dims_of(tokens.get())[0]);
  const hsize_t n_off = h5::dims_of(offsets.get())[0];
  DZ_CHECK(n_off >= 1, path, ": /offsets is empty (it needs n_docs + 1 entries)");
  // Documents are never empty, so n_docs <= n_tokens; checked before /offsets is read whole, so a
  // corrupt dataspace (found by tests/fuzz) cannot make us allocate 2^58 entries.
  DZ_CHECK(n_off - 1 <= h5::dims_of(tokens.get())[0], path, ": /offsets has ", n_off, " entries (", n_off - 1,
           " documents) but /tokens only ", n_tokens_, " tokens: some document would be empty");
  offsets_.resize(n_off);
  Handle dxpl = strict_transfer();
  DZ_CHECK(transfer(false, offsets.get(), H5T_NATIVE_INT64, {0}, {n_off}, offsets_.data(), dxpl.get()), path,
           ": cannot read /offsets (values outside the int64 range?)");
  // optional per-document arrays: /score_from (the first position whose log-prob counts) and
  // /bytes (the documents' byte counts, for bits per byte)
  const hsize_t nd = n_off - 1;
  for (auto [name, dst] : {std::pair<const char*, std::vector<int64_t>*>{"score_from", &score_from_},
                           std::pair<const char*, std::vector<int64_t>*>{"bytes", &bytes_}}) {
    if (H5Lexists(file.get(), name, H5P_DEFAULT) <= 0) continue;
    Handle d = open_int_1d(file.get(), path, name);
    DZ_CHECK(h5::dims_of(d.get())[0] == nd, path, ": /", name, " has ", h5::dims_of(d.get())[0], " entries for ", nd,
             " documents");
    dst->resize(nd);
    DZ_CHECK(transfer(false, d.get(), H5T_NATIVE_INT64, {0}, {nd}, dst->data(), dxpl.get()), path, ": cannot read /",
             name, " (values outside the int64 range?)");
  }
  file_ = file.release();
  tokens_ = tokens.release();
}

std::vector<std::vector<int32_t>> read_generated(const std::string& path) {
  Handle file = open_readonly(path);
  DZ_CHECK(H5Lexists(file.get(), "generated", H5P_DEFAULT) > 0 && H5Lexists(file.get(), "generated_offsets", H5P_DEFAULT) > 0,
           path, ": not a finished generate-mode output (no /generated and /generated_offsets)");
  Handle gen = open_int_1d(file.get(), path, "generated");
  Handle off = open_int_1d(file.get(), path, "generated_offsets");
  const hsize_t n = h5::dims_of(gen.get())[0], n_off = h5::dims_of(off.get())[0];
  DZ_CHECK(n_off >= 1 && n_off - 1 <= (hsize_t(1) << 31), path, ": /generated_offsets has ", n_off, " entries");
  std::vector<int64_t> o(n_off);
  std::vector<int32_t> g(n);
  Handle dxpl = strict_transfer();
  DZ_CHECK(transfer(false, off.get(), H5T_NATIVE_INT64, {0}, {n_off}, o.data(), dxpl.get()), path,
           ": cannot read /generated_offsets");
  if (n) DZ_CHECK(transfer(false, gen.get(), H5T_NATIVE_INT32, {0}, {n}, g.data(), dxpl.get()), path, ": cannot read /generated");
  DZ_CHECK(o[0] == 0 && o.back() == int64_t(n), path, ": /generated_offsets run from ", o[0], " to ", o.back(), ", not 0 to ",
           n);
  std::vector<std::vector<int32_t>> out(n_off - 1);
  for (size_t i = 0; i + 1 < n_off; ++i) {
    DZ_CHECK(o[i + 1] >= o[i], path, ": /generated_offsets decrease at document ", i);
    out[i].assign(g.begin() + o[i], g.begin() + o[i + 1]);
  }
  return out;
}

InputFile::~InputFile() {
  if (tokens_ >= 0) Handle::close_id(tokens_);
  if (file_ >= 0) Handle::close_id(file_);
}

// FNV-1a 64 over the token values, folded in as validate() scans them (the same pass).
static uint64_t fnv1a_update(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

void InputFile::validate(int64_t vocab, int64_t chunk_tokens) const {
  DZ_CHECK(vocab > 0 && chunk_tokens > 0, "InputFile::validate: vocab and chunk_tokens must be positive");
  const std::vector<int64_t>& o = offsets_;
  DZ_CHECK(o[0] == 0, path_, ": /offsets[0] must be 0 (got ", o[0], ")");
  for (size_t i = 0; i + 1 < o.size(); ++i) {
    DZ_CHECK(o[i + 1] != o[i], path_, ": document ", i, " is empty (offsets[", i, "] == offsets[", i + 1,
             "] == ", o[i], ")");
    DZ_CHECK(o[i + 1] > o[i], path_, ": /offsets must increase: offsets[", i, "] = ", o[i], " > offsets[",
             i + 1, "] = ", o[i + 1]);
  }
  DZ_CHECK(o.back() == n_tokens_, path_, ": offsets end at ", o.back(), " but /tokens has ", n_tokens_,
           " entries");
  for (size_t i = 0; i < score_from_.size(); ++i) {
    const int64_t L = o[i + 1] - o[i], s = score_from_[i];
    DZ_CHECK(s >= 1 && s <= L, path_, ": /score_from[", i, "] = ", s, " is outside 1..", L,
             " (document ", i, " has ", L, " tokens; position 0 has no log-prob, ", L, " scores none)");
  }
  for (size_t i = 0; i < bytes_.size(); ++i)
    DZ_CHECK(bytes_[i] >= 0, path_, ": /bytes[", i, "] = ", bytes_[i], " is negative");
  Handle dxpl = strict_transfer();
  token_hash_ = 0xcbf29ce484222325ull;
  std::vector<int32_t> buf;  // [chunk]
  for (int64_t s = 0; s < n_tokens_; s += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, n_tokens_ - s);
    buf.resize(size_t(n));
    DZ_CHECK(transfer(false, tokens_, H5T_NATIVE_INT32, {hsize_t(s)}, {hsize_t(n)}, buf.data(), dxpl.get()),
             path_, ": cannot read /tokens[", s, ":", s + n, "] (values outside the int32 range?)");
    token_hash_ = fnv1a_update(token_hash_, buf.data(), size_t(n) * sizeof(int32_t));
    for (int64_t j = 0; j < n; ++j) {
      const int32_t v = buf[size_t(j)];
      if (v >= 0 && v < vocab) continue;
      const int64_t p = s + j;
      const int64_t d = int64_t(std::upper_bound(o.begin(), o.end(), p) - o.begin()) - 1;
      const std::string where = str(path_, ": document ", d, ", position ", p - o[size_t(d)], ": token id ", v);
      fail(v < 0 ? where + " is negative" : str(where, " >= vocab size ", vocab));
    }
  }
  validated_ = true;
}

std::vector<int32_t> InputFile::read_doc(int64_t i) const {
  DZ_CHECK(i >= 0 && i < n_docs(), path_, ": document ", i, " out of range (", n_docs(), " documents)");
  const int64_t b = offsets_[size_t(i)], e = offsets_[size_t(i) + 1];
  DZ_CHECK(0 <= b && b <= e && e <= n_tokens_, path_, ": document ", i, " has invalid offsets [", b, ", ", e,
           ") (validate the file first)");
  std::vector<int32_t> out(size_t(e - b));
  Handle dxpl = strict_transfer();
  DZ_CHECK(transfer(false, tokens_, H5T_NATIVE_INT32, {hsize_t(b)}, {hsize_t(e - b)}, out.data(), dxpl.get()),
           path_, ": cannot read document ", i, " from /tokens");
  return out;
}

namespace {

// Creates a dataset of the given file type and final shape. Non-empty datasets are contiguous
// with their space allocated at creation (later writes touch raw data only). `zero_fill` writes
// zeros at allocation (small bookkeeping datasets); payloads are not filled, so the file is
// extended sparsely (unwritten regions read as zeros on POSIX file systems, and /done says which
// regions are meaningful). Empty datasets get the default (late) allocation.
Handle create_dataset(hid_t loc, const std::string& file, const std::string& name, hid_t ftype,
                      const std::vector<hsize_t>& dims, bool zero_fill) {
  hsize_t n = 1;
  for (hsize_t d : dims) n *= d;
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_obj_track_times(dcpl.get(), false);  // no timestamps: resumed and straight runs match
  if (n > 0) {
    H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
    const uint64_t zero = 0;  // 8 zero bytes: a zero of every file type used here
    H5Pset_fill_value(dcpl.get(), ftype, &zero);
    H5Pset_fill_time(dcpl.get(), zero_fill ? H5D_FILL_TIME_ALLOC : H5D_FILL_TIME_NEVER);
  }
  Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  Handle d(H5Dcreate2(loc, name.c_str(), ftype, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  DZ_CHECK(d, file, ": cannot create dataset /", name, " of shape ", h5::shape_str(dims));
  return d;
}

}  // namespace

void write_input_file(const std::string& path, const std::vector<int32_t>& tokens,
                      const std::vector<int64_t>& offsets, const std::vector<int64_t>& score_from,
                      const std::vector<int64_t>& bytes, const std::vector<std::string>& doc_ids,
                      const std::map<std::string, std::string>& attrs) {
  h5::init();
  Handle fapl = h5::file_access();
  Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  DZ_CHECK(file, "cannot create ", path, ": ", path_exists(dir_of(path)) ? "HDF5 refused" : "no such directory");
  Handle t = create_dataset(file.get(), path, "tokens", H5T_STD_I32LE, {tokens.size()}, false);
  Handle o = create_dataset(file.get(), path, "offsets", H5T_STD_I64LE, {offsets.size()}, false);
  DZ_CHECK(transfer(true, t.get(), H5T_NATIVE_INT32, {0}, {tokens.size()}, const_cast<int32_t*>(tokens.data())) &&
               transfer(true, o.get(), H5T_NATIVE_INT64, {0}, {offsets.size()}, const_cast<int64_t*>(offsets.data())),
           path, ": cannot write /tokens and /offsets");
  for (auto [name, v] : {std::pair<const char*, const std::vector<int64_t>*>{"score_from", &score_from},
                         std::pair<const char*, const std::vector<int64_t>*>{"bytes", &bytes}}) {
    if (v->empty()) continue;
    Handle d = create_dataset(file.get(), path, name, H5T_STD_I64LE, {v->size()}, false);
    DZ_CHECK(transfer(true, d.get(), H5T_NATIVE_INT64, {0}, {v->size()}, const_cast<int64_t*>(v->data())), path,
             ": cannot write /", name);
  }
  if (!doc_ids.empty()) {  // variable-length UTF-8 strings
    DZ_CHECK(doc_ids.size() + 1 == offsets.size(), path, ": ", doc_ids.size(), " document ids for ", offsets.size() - 1,
             " documents");
    Handle st(H5Tcopy(H5T_C_S1));
    H5Tset_size(st.get(), H5T_VARIABLE);
    H5Tset_cset(st.get(), H5T_CSET_UTF8);
    const hsize_t n = doc_ids.size();
    Handle space(H5Screate_simple(1, &n, nullptr));
    Handle d(H5Dcreate2(file.get(), "doc_ids", st.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    std::vector<const char*> p;
    for (const auto& x : doc_ids) p.push_back(x.c_str());
    DZ_CHECK(d && H5Dwrite(d.get(), st.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()) >= 0, path,
             ": cannot write /doc_ids");
  }
  for (const auto& kv : attrs) write_str_attr(file.get(), path, kv.first, kv.second);
  DZ_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, path, ": cannot flush");
}

// ================================================================ OutputFile

namespace {

const char* const kFormat = "dayzero-output";
const int64_t kFormatVersion = 1;
// Root attributes written by this module; identity/info keys may not use these names.
const std::set<std::string> kReserved = {"format", "format_version", "output_mode", "n_docs", "output_topk",
                                         "output_max_new_tokens", "output_vocab", "identity_keys", "complete"};

struct DsetLayout {
  std::string name;  // path below "/"
  hid_t ftype;       // file type
  std::vector<hsize_t> dims;
  bool zero_fill;
};

// Row offsets of the per-token modes: logprobs rows are L_i - 1, topk rows are L_i.
std::vector<int64_t> row_offsets(const OutputSpec& s) {
  std::vector<int64_t> off(s.doc_lengths.size() + 1, 0);
  const int64_t minus = s.mode == OutputMode::Logprobs ? 1 : 0;
  for (size_t i = 0; i < s.doc_lengths.size(); ++i) off[i + 1] = off[i] + s.doc_lengths[i] - minus;
  return off;
}

// The datasets of PATH.part (final = false) or of a finished PATH (final = true; only generate
// mode differs, and there /generated's length is only known from the file: `gen_total`).
std::vector<DsetLayout> layout(const OutputSpec& s, bool final, hsize_t gen_total = 0) {
  const hsize_t n = s.doc_lengths.size();
  std::vector<DsetLayout> l;
  const hsize_t rows = hsize_t(row_offsets(s).back());
  switch (s.mode) {
    case OutputMode::Logprobs:
      l.push_back({"logprobs", H5T_IEEE_F32LE, {rows}, false});
      l.push_back({"offsets", H5T_STD_I64LE, {n + 1}, true});
      break;
    case OutputMode::TopK:
      l.push_back({"topk_ids", H5T_STD_I32LE, {rows, hsize_t(s.topk)}, false});
      l.push_back({"topk_logprobs", H5T_IEEE_F32LE, {rows, hsize_t(s.topk)}, false});
      l.push_back({"offsets", H5T_STD_I64LE, {n + 1}, true});
      break;
    case OutputMode::LastLogits: l.push_back({"last_logits", H5T_IEEE_F32LE, {n, hsize_t(s.vocab)}, false}); break;
    case OutputMode::Generate:
      if (final) {
        l.push_back({"generated", H5T_STD_I32LE, {gen_total}, false});
        l.push_back({"generated_offsets", H5T_STD_I64LE, {n + 1}, true});
      } else {
        l.push_back({"generated_slots", H5T_STD_I32LE, {n, hsize_t(s.max_new_tokens)}, false});
        l.push_back({"generated_len", H5T_STD_I64LE, {n}, true});
      }
      break;
  }
  l.push_back({"done", H5T_STD_U8LE, {n}, true});
  l.push_back({"stats/seconds", H5T_IEEE_F64LE, {n}, true});
  l.push_back({"stats/tokens", H5T_STD_I64LE, {n}, true});
  l.push_back({"stats/rank", H5T_STD_I32LE, {n}, true});
  if (s.mode == OutputMode::Logprobs) {  // the scores of each document (DocStats)
    l.push_back({"stats/score_from", H5T_STD_I64LE, {n}, true});
    l.push_back({"stats/scored", H5T_STD_I64LE, {n}, true});
    l.push_back({"stats/nll", H5T_IEEE_F64LE, {n}, true});
    l.push_back({"stats/perplexity", H5T_IEEE_F64LE, {n}, true});
    l.push_back({"stats/is_greedy", H5T_STD_U8LE, {n}, true});
    l.push_back({"stats/bytes", H5T_STD_I64LE, {n}, true});
  }
  return l;
}

void check_spec(const OutputSpec& s) {
  for (size_t i = 0; i < s.doc_lengths.size(); ++i)
    DZ_CHECK(s.doc_lengths[i] >= 1, "output spec: document ", i, " has length ", s.doc_lengths[i]);
  DZ_CHECK(s.mode != OutputMode::TopK || s.topk >= 1, "output spec: topk mode needs K >= 1");
  DZ_CHECK(s.mode != OutputMode::LastLogits || s.vocab >= 1, "output spec: last-logits mode needs vocab >= 1");
  DZ_CHECK(s.mode != OutputMode::Generate || s.max_new_tokens >= 1, "output spec: generate mode needs max_new_tokens >= 1");
  for (const auto* m : {&s.identity, &s.info})
    for (const auto& kv : *m) {
      DZ_CHECK(!kv.first.empty() && kv.first.find(',') == std::string::npos && !kReserved.count(kv.first),
               "output spec: attribute name '", kv.first, "' is reserved or invalid");
    }
  for (const auto& kv : s.identity)
    DZ_CHECK(!s.info.count(kv.first), "output spec: '", kv.first, "' is both an identity and an info attribute");
}

// Structural root attributes as (name, value) for the integer ones.
std::vector<std::pair<std::string, int64_t>> int_attrs(const OutputSpec& s) {
  return {{"format_version", kFormatVersion},
          {"n_docs", int64_t(s.doc_lengths.size())},
          {"output_topk", s.mode == OutputMode::TopK ? s.topk : 0},
          {"output_max_new_tokens", s.mode == OutputMode::Generate ? s.max_new_tokens : 0},
          {"output_vocab", s.mode == OutputMode::LastLogits ? s.vocab : 0}};
}

std::string identity_keys(const OutputSpec& s) {
  std::string k;
  for (const auto& kv : s.identity) k += (k.empty() ? "" : ",") + kv.first;
  return k;
}

}  // namespace

struct OutputFile::Impl {
  std::string path;  // final PATH
  std::string part;  // PATH.part
  std::string name;  // the file open now (for messages)
  OutputSpec spec;
  std::vector<int64_t> row_off;  // logprobs/topk row offsets [n_docs + 1]
  Handle file;
  std::map<std::string, Handle> dsets;
  bool sync = false;  // the sec2 driver gives us a descriptor to fsync

  hid_t ds(const std::string& n) const { return dsets.at(n).get(); }

  void close() {
    dsets.clear();
    file.reset();
  }

  // Checks a write_* call and returns the state to write with.
  static Impl& begin(OutputFile& f, OutputMode mode, int64_t i) {
    Impl& m = *f.impl_;
    DZ_CHECK(!f.finished_, m.name, " is complete; nothing more can be written");
    DZ_CHECK(m.file, m.name, " is closed (a failed finalize?)");
    DZ_CHECK(m.spec.mode == mode, m.name, ": cannot write ", to_string(mode), " results to a ",
             to_string(m.spec.mode), " output");
    DZ_CHECK(i >= 0 && i < int64_t(f.done_.size()), m.name, ": document ", i, " out of range (", f.done_.size(),
             " documents)");
    DZ_CHECK(!f.done_[size_t(i)], m.name, ": document ", i, " is already done");
    return m;
  }

  // Common tail of every write: stats, flush, then the done flag, flush.
  static void commit(OutputFile& f, int64_t i, const DocStats& st) {
    Impl& m = *f.impl_;
    const std::vector<hsize_t> at = {hsize_t(i)}, one = {1};
    m.write("stats/seconds", H5T_NATIVE_DOUBLE, at, one, &st.seconds);
    m.write("stats/tokens", H5T_NATIVE_INT64, at, one, &st.tokens);
    m.write("stats/rank", H5T_NATIVE_INT32, at, one, &st.rank);
    if (m.spec.mode == OutputMode::Logprobs) {
      const double ppl = perplexity_of(st.nll, st.scored);
      m.write("stats/score_from", H5T_NATIVE_INT64, at, one, &st.score_from);
      m.write("stats/scored", H5T_NATIVE_INT64, at, one, &st.scored);
      m.write("stats/nll", H5T_NATIVE_DOUBLE, at, one, &st.nll);
      m.write("stats/perplexity", H5T_NATIVE_DOUBLE, at, one, &ppl);
      m.write("stats/is_greedy", H5T_NATIVE_UINT8, at, one, &st.is_greedy);
      m.write("stats/bytes", H5T_NATIVE_INT64, at, one, &st.bytes);
    }
    m.flush();
    const uint8_t flag = 1;
    m.write("done", H5T_NATIVE_UINT8, at, one, &flag);
    m.flush();
    f.done_[size_t(i)] = 1;
  }

  void finalize_generate();

  void open_datasets(const std::vector<DsetLayout>& l) {
    for (const DsetLayout& d : l) {
      Handle h(H5Dopen2(file.get(), d.name.c_str(), H5P_DEFAULT));
      DZ_CHECK(h, name, ": missing dataset /", d.name, "; pass --overwrite to start over");
      dsets[d.name] = std::move(h);
    }
  }

  // Pushes everything HDF5 holds to the OS, then to the disk: a document's data must be durable
  // before its done flag is, and the flag before we move on.
  void flush() {
    DZ_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, name, ": cannot flush");
    if (!sync) return;
    void* h = nullptr;
    DZ_CHECK(H5Fget_vfd_handle(file.get(), H5P_DEFAULT, &h) >= 0 && h, name, ": cannot get the file descriptor");
    DZ_CHECK(::fsync(*static_cast<int*>(h)) == 0, name, ": cannot sync: ", std::strerror(errno));
  }

  void detect_sync() {
    Handle fapl(H5Fget_access_plist(file.get()));
    sync = fapl && H5Pget_driver(fapl.get()) == H5FD_SEC2;
  }

  void write(const std::string& d, hid_t memtype, const std::vector<hsize_t>& start,
             const std::vector<hsize_t>& count, const void* buf) {
    DZ_CHECK(transfer(true, ds(d), memtype, start, count, const_cast<void*>(buf)), name, ": cannot write /", d);
  }

  // Checks identity attributes and structure of an opened file against the spec.
  void check_matches(bool final) {
    const hid_t root = file.get();
    DZ_CHECK(has_attr(root, "format") && read_str_attr(root, name, "format") == kFormat, name,
             " is not a dayzero output file; pass --overwrite to replace it");
    std::set<std::string> file_keys;
    if (has_attr(root, "identity_keys")) {
      std::string k = read_str_attr(root, name, "identity_keys");
      for (size_t b = 0; b < k.size();) {
        size_t e = std::min(k.find(',', b), k.size());
        file_keys.insert(k.substr(b, e - b));
        b = e + 1;
      }
    }
    for (const auto& kv : spec.identity) {
      DZ_CHECK(file_keys.count(kv.first) && has_attr(root, kv.first), name, " has no identity attribute ", kv.first,
               "; this run has ", kv.first, "=", kv.second);
      const std::string v = read_str_attr(root, name, kv.first);
      DZ_CHECK(v == kv.second, name, " was written with ", kv.first, "=", v, "; this run has ", kv.first, "=",
               kv.second);
    }
    for (const std::string& k : file_keys)
      if (!spec.identity.count(k))
        fail(str(name, " was written with ", k, "=",
                 has_attr(root, k) ? read_str_attr(root, name, k) : std::string("?"), "; this run has no ", k));
    const std::string mode = has_attr(root, "output_mode") ? read_str_attr(root, name, "output_mode") : "?";
    DZ_CHECK(mode == to_string(spec.mode), name, " was written with output_mode=", mode,
             "; this run has output_mode=", to_string(spec.mode));
    for (const auto& kv : int_attrs(spec)) {
      const int64_t v = read_i64_attr(root, name, kv.first);
      DZ_CHECK(v == kv.second, name, " was written with ", kv.first, "=", v, "; this run has ", kv.first, "=",
               kv.second);
    }
    hsize_t gen_total = 0;
    if (final && spec.mode == OutputMode::Generate && H5Lexists(root, "generated", H5P_DEFAULT) > 0) {
      Handle g(H5Dopen2(root, "generated", H5P_DEFAULT));
      if (g && !h5::dims_of(g.get()).empty()) gen_total = h5::dims_of(g.get())[0];
    }
    const std::vector<DsetLayout> l = layout(spec, final, gen_total);
    DZ_CHECK(H5Lexists(root, "stats", H5P_DEFAULT) > 0, name, ": missing group /stats; pass --overwrite to start over");
    open_datasets(l);
    for (const DsetLayout& d : l) {
      Handle t(H5Dget_type(ds(d.name)));
      const std::vector<hsize_t> dims = h5::dims_of(ds(d.name));
      DZ_CHECK(H5Tequal(t.get(), d.ftype) > 0 && dims == d.dims, name, ": /", d.name, " is ",
               h5::type_name(t.get()), " ", h5::shape_str(dims), ", this run expects ", h5::type_name(d.ftype), " ",
               h5::shape_str(d.dims), " (a different input?)");
    }
    // Per-token modes: the row offsets must match this input's document lengths.
    if (spec.mode == OutputMode::Logprobs || spec.mode == OutputMode::TopK) {
      std::vector<int64_t> off(row_off.size());
      DZ_CHECK(transfer(false, ds("offsets"), H5T_NATIVE_INT64, {0}, {off.size()}, off.data()), name,
               ": cannot read /offsets");
      for (size_t i = 0; i < off.size(); ++i)
        DZ_CHECK(off[i] == row_off[i], name, ": /offsets[", i, "] = ", off[i], ", this input gives ", row_off[i],
                 " (a different input?)");
    }
  }
};

std::unique_ptr<OutputFile> OutputFile::create(const std::string& path, const OutputSpec& spec, bool overwrite) {
  h5::init();
  check_spec(spec);
  const std::string part = path + ".part";
  if (path_exists(part)) {
    DZ_CHECK(overwrite, part, " exists (an interrupted run); pass --resume to continue it or --overwrite to start over");
    DZ_CHECK(::unlink(part.c_str()) == 0, "cannot remove ", part, ": ", std::strerror(errno));
  }
  DZ_CHECK(overwrite || !path_exists(path), path,
           " exists; pass --resume to continue it or --overwrite to replace it");
  // The existing PATH (with --overwrite) stays untouched until finalize() renames over it.
  int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
  DZ_CHECK(fd >= 0, "cannot create ", part, ": ", std::strerror(errno));
  ::close(fd);

  std::unique_ptr<OutputFile> out(new OutputFile());
  out->impl_.reset(new Impl());
  Impl& m = *out->impl_;
  m.path = path;
  m.part = m.name = part;
  m.spec = spec;
  m.row_off = row_offsets(spec);
  try {
    Handle fapl = h5::file_access();
    m.file = Handle(H5Fcreate(part.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    DZ_CHECK(m.file, "cannot create ", part, ": HDF5 could not create the file");
    m.detect_sync();
    const hid_t root = m.file.get();
    write_str_attr(root, part, "format", kFormat);
    write_str_attr(root, part, "output_mode", to_string(spec.mode));
    for (const auto& kv : int_attrs(spec)) write_i64_attr(root, part, kv.first, kv.second);
    write_str_attr(root, part, "identity_keys", identity_keys(spec));
    write_i64_attr(root, part, "complete", 0);  // created now so finalize only rewrites its value
    for (const auto& kv : spec.identity) write_str_attr(root, part, kv.first, kv.second);
    for (const auto& kv : spec.info) write_str_attr(root, part, kv.first, kv.second);
    Handle gcpl(H5Pcreate(H5P_GROUP_CREATE));
    H5Pset_obj_track_times(gcpl.get(), false);
    Handle stats(H5Gcreate2(root, "stats", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
    DZ_CHECK(stats, part, ": cannot create group /stats");
    for (const DsetLayout& d : layout(spec, false))
      m.dsets[d.name] = create_dataset(root, part, d.name, d.ftype, d.dims, d.zero_fill);
    if (spec.mode == OutputMode::Logprobs || spec.mode == OutputMode::TopK)
      m.write("offsets", H5T_NATIVE_INT64, {0}, {m.row_off.size()}, m.row_off.data());
    m.flush();
  } catch (...) {
    out.reset();  // close before removing
    ::unlink(part.c_str());
    throw;
  }
  out->done_.assign(spec.doc_lengths.size(), 0);
  return out;
}

std::unique_ptr<OutputFile> OutputFile::resume(const std::string& path, const OutputSpec& spec) {
  h5::init();
  check_spec(spec);
  const std::string part = path + ".part";
  const bool final = !path_exists(part);
  if (final && !path_exists(path)) return create(path, spec, false);

  std::unique_ptr<OutputFile> out(new OutputFile());
  out->impl_.reset(new Impl());
  Impl& m = *out->impl_;
  m.path = path;
  m.part = part;
  m.name = final ? path : part;
  m.spec = spec;
  m.row_off = row_offsets(spec);
  Handle fapl = h5::file_access();
  m.file = Handle(H5Fopen(m.name.c_str(), final ? H5F_ACC_RDONLY : H5F_ACC_RDWR, fapl.get()));
  DZ_CHECK(m.file, m.name, ": not an HDF5 file or cannot be opened; pass --overwrite to start over");
  m.detect_sync();
  if (final) {
    const int64_t complete = has_attr(m.file.get(), "complete") ? read_i64_attr(m.file.get(), path, "complete") : 0;
    DZ_CHECK(complete == 1, path, " exists but is not a complete dayzero output; pass --overwrite to replace it");
  }
  m.check_matches(final);
  const size_t n = spec.doc_lengths.size();
  out->done_.assign(n, 0);
  DZ_CHECK(transfer(false, m.ds("done"), H5T_NATIVE_UINT8, {0}, {n}, out->done_.data()), m.name,
           ": cannot read /done");
  if (final) {
    for (size_t i = 0; i < n; ++i) DZ_CHECK(out->done_[i] == 1, path, ": complete but document ", i, " is not done");
    out->finished_ = true;
    m.close();  // nothing left to write
  }
  return out;
}

OutputFile::~OutputFile() = default;

void OutputFile::write_logprobs(int64_t i, const std::vector<float>& lp, const DocStats& st) {
  Impl& m = Impl::begin(*this, OutputMode::Logprobs, i);
  const int64_t want = m.row_off[size_t(i) + 1] - m.row_off[size_t(i)];
  DZ_CHECK(int64_t(lp.size()) == want, m.name, ": document ", i, ": got ", lp.size(),
           " logprobs, expected L - 1 = ", want);
  m.write("logprobs", H5T_NATIVE_FLOAT, {hsize_t(m.row_off[size_t(i)])}, {hsize_t(want)}, lp.data());
  Impl::commit(*this, i, st);
}

void OutputFile::write_topk(int64_t i, const std::vector<int32_t>& ids, const std::vector<float>& lps,
                            const DocStats& st) {
  Impl& m = Impl::begin(*this, OutputMode::TopK, i);
  const int64_t rows = m.row_off[size_t(i) + 1] - m.row_off[size_t(i)], k = m.spec.topk;
  DZ_CHECK(int64_t(ids.size()) == rows * k && int64_t(lps.size()) == rows * k, m.name, ": document ", i, ": got ",
           ids.size(), " ids and ", lps.size(), " logprobs, expected L * K = ", rows, " * ", k, " = ", rows * k);
  const std::vector<hsize_t> at = {hsize_t(m.row_off[size_t(i)]), 0}, count = {hsize_t(rows), hsize_t(k)};
  m.write("topk_ids", H5T_NATIVE_INT32, at, count, ids.data());
  m.write("topk_logprobs", H5T_NATIVE_FLOAT, at, count, lps.data());
  Impl::commit(*this, i, st);
}

void OutputFile::write_last_logits(int64_t i, const std::vector<float>& logits, const DocStats& st) {
  Impl& m = Impl::begin(*this, OutputMode::LastLogits, i);
  DZ_CHECK(int64_t(logits.size()) == m.spec.vocab, m.name, ": document ", i, ": got ", logits.size(),
           " logits, expected vocab = ", m.spec.vocab);
  m.write("last_logits", H5T_NATIVE_FLOAT, {hsize_t(i), 0}, {1, hsize_t(m.spec.vocab)}, logits.data());
  Impl::commit(*this, i, st);
}

void OutputFile::write_generated(int64_t i, const std::vector<int32_t>& ids, const DocStats& st) {
  Impl& m = Impl::begin(*this, OutputMode::Generate, i);
  DZ_CHECK(int64_t(ids.size()) <= m.spec.max_new_tokens, m.name, ": document ", i, ": got ", ids.size(),
           " generated tokens, more than max_new_tokens = ", m.spec.max_new_tokens);
  const int64_t len = int64_t(ids.size());
  m.write("generated_slots", H5T_NATIVE_INT32, {hsize_t(i), 0}, {1, hsize_t(len)}, ids.data());
  m.write("generated_len", H5T_NATIVE_INT64, {hsize_t(i)}, {1}, &len);
  Impl::commit(*this, i, st);
}

// Generate mode: the compact result is written anew into PATH.tmp (root attributes, /done and
// /stats copied from PATH.part; /generated and /generated_offsets built from the work datasets),
// which is renamed to PATH; PATH.part is removed last. PATH.part is never modified, so a crash
// at any point leaves it resumable (finalize simply runs again). Copying, rather than deleting
// the work datasets in place, keeps their space out of the final file.
void OutputFile::Impl::finalize_generate() {
  const size_t n = spec.doc_lengths.size();
  const int64_t width = spec.max_new_tokens;
  std::vector<int64_t> len(n), off(n + 1, 0);
  DZ_CHECK(transfer(false, ds("generated_len"), H5T_NATIVE_INT64, {0}, {n}, len.data()), name,
           ": cannot read /generated_len");
  for (size_t i = 0; i < n; ++i) {
    DZ_CHECK(len[i] >= 0 && len[i] <= width, name, ": /generated_len[", i, "] = ", len[i], " is invalid");
    off[i + 1] = off[i] + len[i];
  }
  const std::string tmp = path + ".tmp";
  {
    Handle fapl = h5::file_access();
    Handle out(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    DZ_CHECK(out, "cannot create ", tmp);
    // Root attributes: strings and integers are all this module writes.
    const hid_t root = file.get();
    std::vector<std::string> names;
    auto collect = [](hid_t, const char* an, const H5A_info_t*, void* v) -> herr_t {
      static_cast<std::vector<std::string>*>(v)->push_back(an);
      return 0;
    };
    DZ_CHECK(H5Aiterate2(root, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names) >= 0, name,
             ": cannot list attributes");
    for (const std::string& an : names) {
      Handle at(H5Aopen(root, an.c_str(), H5P_DEFAULT));
      Handle t(at ? H5Aget_type(at.get()) : H5I_INVALID_HID);
      if (t && H5Tget_class(t.get()) == H5T_STRING)
        write_str_attr(out.get(), tmp, an, read_str_attr(root, name, an));
      else
        write_i64_attr(out.get(), tmp, an, read_i64_attr(root, name, an));
    }
    for (const char* obj : {"done", "stats"})
      DZ_CHECK(H5Ocopy(root, obj, out.get(), obj, H5P_DEFAULT, H5P_DEFAULT) >= 0, tmp, ": cannot copy /", obj);
    Handle g = create_dataset(out.get(), tmp, "generated", H5T_STD_I32LE, {hsize_t(off[n])}, false);
    Handle go = create_dataset(out.get(), tmp, "generated_offsets", H5T_STD_I64LE, {n + 1}, true);
    DZ_CHECK(transfer(true, go.get(), H5T_NATIVE_INT64, {0}, {n + 1}, off.data()), tmp, ": cannot write /generated_offsets");
    std::vector<int32_t> row;  // [len_i]
    for (size_t i = 0; i < n; ++i) {
      row.resize(size_t(len[i]));
      DZ_CHECK(transfer(false, ds("generated_slots"), H5T_NATIVE_INT32, {i, 0}, {1, hsize_t(len[i])}, row.data()), name,
               ": cannot read /generated_slots row ", i);
      DZ_CHECK(transfer(true, g.get(), H5T_NATIVE_INT32, {hsize_t(off[i])}, {hsize_t(len[i])}, row.data()), tmp,
               ": cannot write /generated");
    }
    write_i64_attr(out.get(), tmp, "complete", 1);
    DZ_CHECK(H5Fflush(out.get(), H5F_SCOPE_GLOBAL) >= 0, tmp, ": cannot flush");
  }
  fsync_path(tmp);
  close();
  DZ_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  fsync_dir(dir_of(path));
  DZ_CHECK(::unlink(part.c_str()) == 0, "cannot remove ", part, ": ", std::strerror(errno));
  fsync_dir(dir_of(path));
}

void OutputFile::finalize() {
  if (finished_) return;
  Impl& m = *impl_;
  const size_t n = done_.size();
  const size_t missing = size_t(std::count(done_.begin(), done_.end(), uint8_t(0)));
  if (missing) {
    const size_t first = size_t(std::find(done_.begin(), done_.end(), uint8_t(0)) - done_.begin());
    fail(str(m.name, ": cannot finalize: ", missing, " of ", n, " documents not done (first: document ", first, ")"));
  }
  if (m.spec.mode == OutputMode::Generate) {
    m.finalize_generate();
  } else {
    write_i64_attr(m.file.get(), m.name, "complete", 1);  // in-place rewrite of an existing value
    m.flush();
    m.close();
    fsync_path(m.part);
    DZ_CHECK(std::rename(m.part.c_str(), m.path.c_str()) == 0, "cannot rename ", m.part, " to ", m.path, ": ",
             std::strerror(errno));
    fsync_dir(dir_of(m.path));
  }
  m.name = m.path;
  finished_ = true;
}

// ================================================================ scores (logprobs outputs)

double perplexity_of(double nll, int64_t scored) { return scored > 0 ? std::exp(nll / double(scored)) : std::nan(""); }
double ScoreTable::perplexity() const { return perplexity_of(nll, scored); }
double ScoreTable::bits_per_byte() const {
  return bytes > 0 ? nll / (std::log(2.0) * double(bytes)) : std::nan("");
}

ScoreTable read_scores(const std::string& path) {
  ScoreTable t;
  t.file = path_exists(path) ? path : path + ".part";
  DZ_CHECK(path_exists(t.file), path, ": no such output (nor ", path, ".part)");
  Handle file = open_readonly(t.file);
  const hid_t root = file.get();
  DZ_CHECK(has_attr(root, "format") && read_str_attr(root, t.file, "format") == kFormat, t.file,
           " is not a dayzero output file");
  const std::string mode = read_str_attr(root, t.file, "output_mode");
  DZ_CHECK(mode == to_string(OutputMode::Logprobs), t.file, " is a ", mode,
           "-mode output; scores (log-likelihoods, perplexities) come from --mode logprobs");
  t.complete = has_attr(root, "complete") && read_i64_attr(root, t.file, "complete") == 1;
  t.n_docs = read_i64_attr(root, t.file, "n_docs");
  DZ_CHECK(t.n_docs >= 0 && t.n_docs <= (int64_t(1) << 40), t.file, ": n_docs = ", t.n_docs);
  const hsize_t n = hsize_t(t.n_docs);
  Handle dxpl = strict_transfer();
  auto read = [&](const char* name, hid_t mtype, void* buf) {
    DZ_CHECK(H5Lexists(root, "stats", H5P_DEFAULT) > 0 && H5Lexists(root, name, H5P_DEFAULT) > 0, t.file,
             ": no /", name, " (written by an older dayzero? rerun with --overwrite)");
    Handle d(H5Dopen2(root, name, H5P_DEFAULT));
    DZ_CHECK(d && h5::dims_of(d.get()) == std::vector<hsize_t>{n}, t.file, ": /", name, " is not [", n, "]");
    DZ_CHECK(n == 0 || transfer(false, d.get(), mtype, {0}, {n}, buf, dxpl.get()), t.file, ": cannot read /", name);
  };
  std::vector<uint8_t> done(n), greedy(n);
  std::vector<int64_t> tokens(n), from(n), scored(n), bytes(n);
  std::vector<double> nll(n), ppl(n);
  read("done", H5T_NATIVE_UINT8, done.data());
  read("stats/tokens", H5T_NATIVE_INT64, tokens.data());
  read("stats/score_from", H5T_NATIVE_INT64, from.data());
  read("stats/scored", H5T_NATIVE_INT64, scored.data());
  read("stats/nll", H5T_NATIVE_DOUBLE, nll.data());
  read("stats/perplexity", H5T_NATIVE_DOUBLE, ppl.data());
  read("stats/is_greedy", H5T_NATIVE_UINT8, greedy.data());
  read("stats/bytes", H5T_NATIVE_INT64, bytes.data());
  bool all_bytes = true;
  int64_t total_bytes = 0;
  for (hsize_t i = 0; i < n; ++i) {
    if (!done[i]) continue;
    ScoreTable::Row r;
    r.doc = int64_t(i), r.tokens = tokens[i], r.score_from = from[i], r.scored = scored[i], r.bytes = bytes[i];
    r.nll = nll[i], r.perplexity = ppl[i], r.is_greedy = greedy[i] != 0;
    t.rows.push_back(r);
    t.scored += r.scored;
    t.nll += r.nll;
    all_bytes = all_bytes && r.bytes >= 0;
    total_bytes += std::max<int64_t>(r.bytes, 0);
  }
  t.bytes = all_bytes && !t.rows.empty() ? total_bytes : -1;
  return t;
}

}  // namespace dz
