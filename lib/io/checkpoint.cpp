// safetensors reader (mmap, strict) / writer, and the generating mode used by make-model.
//
// File layout (safetensors): u64 little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data;
// offsets are relative to the first byte after the header.
#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/dummy_values.hpp"
#include "core/fp8.hpp"
#include "core/hash.hpp"
#include "core/parallel.hpp"

namespace dz {

using json = nlohmann::json;

namespace {

bool parse_dtype(const std::string& s, DType* d) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16}, {"F8_E4M3", DType::F8_E4M3},
      {"I32", DType::I32}, {"I64", DType::I64},   {"U8", DType::U8}};
  for (const auto& [n, v] : table)
    if (s == n) {
      *d = v;
      return true;
    }
  return false;
}

// fp8 e4m3fn (OCP "fn": no infinities, only S.1111.111 is NaN). Every value is exact in f32.
float f8e4m3_to_f32(uint8_t b) {
  const bool neg = b & 0x80;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  float v;
  if (exp == 15 && man == 7) return std::nanf("");
  if (exp == 0)
    v = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  else
    v = std::ldexp(float(8 + man), exp - 10);  // (1 + man/8) * 2^(exp-7)
  return neg ? -v : v;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string join(const std::string& dir, const std::string& f) {
  if (dir.empty()) return f;
  return dir.back() == '/' ? dir + f : dir + "/" + f;
}


// Uniform in (0, 1]: 53 random bits, never 0 (log in Box-Muller).
double uniform01(std::mt19937_64& g) { return (double(g() >> 11) + 1.0) * (1.0 / 9007199254740992.0); }

// Zeros / Ones / Const inits fill t and return true; the random kinds return false.
bool fill_constant(Tensor& t, const Init& init) {
  switch (init.kind) {
    case Init::Zeros: return true;  // Tensor(shape) is zero
    case Init::Ones: std::fill(t.data.begin(), t.data.end(), 1.f); return true;
    case Init::Const: std::fill(t.data.begin(), t.data.end(), init.a); return true;
    default: return false;
  }
}

// Deterministic values for NAME: same (seed, name, shape, init) -> same bits on every platform
// whose libm is correctly rounded for log/sqrt/cos/sin to within fp32 rounding.
Tensor generate(uint64_t seed, const std::string& name, const Shape& shape, const Init& init) {
  Tensor t(shape);
  if (fill_constant(t, init)) return t;
  std::mt19937_64 g(splitmix64(seed) ^ fnv1a64(name));
  if (init.kind == Init::Uniform) {
    for (auto& v : t.data) v = float(init.a + (double(init.b) - init.a) * (double(g() >> 11) / 9007199254740992.0));
    return t;
  }
  // Normal via Box-Muller, both outputs used (std::normal_distribution is not portable).
  const double two_pi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < t.data.size(); i += 2) {
    double r = std::sqrt(-2.0 * std::log(uniform01(g)));
    double th = two_pi * uniform01(g);
    t.data[i] = float(init.a * r * std::cos(th));
    if (i + 1 < t.data.size()) t.data[i + 1] = float(init.a * r * std::sin(th));
  }
  return t;
}

// --dummy-weights values (core/dummy_values.hpp), made in parallel: threads split the index range,
// so the result does not depend on their number.
Tensor generate_dummy(uint64_t key, const Shape& shape, const Init& init) {
  Tensor t(shape);
  if (fill_constant(t, init)) return t;
  float* out = t.ptr();
  const DummyDist dist{init.kind == Init::Uniform, init.a, init.b};
  parallel_for(int64_t(t.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = dummy_value(key, uint64_t(i), dist);
  });
  return t;
}

// Decodes n elements of dtype d at src (possibly unaligned) into f32.
void decode(DType d, const uint8_t* src, size_t n, float* out) {
  switch (d) {
    case DType::F32:
      if (n) std::memcpy(out, src, n * 4);  // out is null for an empty tensor
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    case DType::F8_E4M3:
      for (size_t i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(src[i]);
      break;
    case DType::I32:
      for (size_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, src + 4 * i, 4);
        out[i] = float(v);
      }
      break;
    case DType::I64:
      for (size_t i = 0; i < n; ++i) {
        int64_t v;
        std::memcpy(&v, src + 8 * i, 8);
        out[i] = float(v);
      }
      break;
    case DType::U8:
      for (size_t i = 0; i < n; ++i) out[i] = float(src[i]);
      break;
  }
}

constexpr int64_t kFp8Block = kFp8WeightBlock;  // DeepSeek fp8 checkpoints: one fp32 scale per 128x128 block

}  // namespace

// Read-only mapping of one safetensors file.
struct Checkpoint::Mapping {
  std::string path;
  const uint8_t* data = nullptr;
  size_t size = 0;

  explicit Mapping(const std::string& p) : path(p) {
    int fd = ::open(p.c_str(), O_RDONLY);
    DZ_CHECK(fd >= 0, "cannot open ", p, ": ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      fail(str("cannot stat ", p));
    }
    size = size_t(st.st_size);
    if (size > 0) {
      void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      ::close(fd);
      DZ_CHECK(m != MAP_FAILED, "cannot mmap ", p, ": ", std::strerror(errno));
      data = static_cast<const uint8_t*>(m);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (data) ::munmap(const_cast<uint8_t*>(data), size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

namespace {

// Parses one safetensors file's header and appends its tensors (offsets made absolute).
void parse_safetensors(const std::string& path, const uint8_t* data, size_t size,
                       std::map<std::string, TensorInfo>* out) {
  DZ_CHECK(size >= 8, "bad safetensors file ", path, ": ", size, " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  DZ_CHECK(n >= 2 && n <= size - 8, "bad safetensors file ", path, ": header length ", n, " does not fit in ",
           size, " bytes (truncated?)");
  json h;
  try {
    h = json::parse(reinterpret_cast<const char*>(data + 8), reinterpret_cast<const char*>(data + 8 + n));
  } catch (const json::exception& e) {
    fail(str("bad safetensors header in ", path, ": ", e.what()));
  }
  DZ_CHECK(h.is_object(), "bad safetensors header in ", path, ": not a JSON object");
  const uint64_t base = 8 + n, data_bytes = size - base;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const json& e = it.value();
    auto bad = [&](const std::string& why) {
      fail(str("bad safetensors header in ", path, ": tensor ", name, ": ", why));
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    TensorInfo ti;
    ti.name = name;
    ti.file = path;
    if (!e["dtype"].is_string()) bad("dtype is not a string");
    if (!parse_dtype(e["dtype"].get<std::string>(), &ti.dtype))
      bad(str("unsupported dtype ", e["dtype"].get<std::string>()));
    if (!e["shape"].is_array()) bad("shape is not an array");
    uint64_t elems = 1;  // as numel() multiplies, checked: int64 products and the byte count below must not overflow
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) bad("shape has a non-integer or negative entry");
      const uint64_t v = d.get<uint64_t>();
      if (v > uint64_t(INT64_MAX) || __builtin_mul_overflow(elems, v, &elems) || elems > uint64_t(INT64_MAX) / 8)
        bad(str("shape ", e["shape"].dump(), " is too large"));
      ti.shape.push_back(int64_t(v));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets must be two non-negative integers");
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en) bad("data_offsets decreasing");
    if (en > data_bytes)
      fail(str("truncated safetensors file ", path, ": tensor ", name, " ends at data byte ", en, " but only ",
               data_bytes, " data bytes are present"));
    ti.offset = base + b;
    ti.nbytes = en - b;
    if (ti.nbytes != uint64_t(numel(ti.shape)) * dtype_size(ti.dtype))
      bad(str("data_offsets span ", ti.nbytes, " bytes but ", to_string(ti.dtype), " ", shape_str(ti.shape),
              " needs ", uint64_t(numel(ti.shape)) * dtype_size(ti.dtype)));
    DZ_CHECK(!out->count(name), "tensor ", name, " appears twice: in ", out->at(name).file, " and ", path);
    (*out)[name] = std::move(ti);
  }
}

}  // namespace

Checkpoint::~Checkpoint() = default;

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  std::vector<std::string> files;
  const std::string index = join(dir, "model.safetensors.index.json");
  const std::string single = join(dir, "model.safetensors");
  json weight_map;
  if (file_exists(index)) {
    std::ifstream f(index);
    json j;
    try {
      j = json::parse(f);
    } catch (const json::exception& e) {
      fail(str("bad checkpoint index ", index, ": ", e.what()));
    }
    DZ_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "bad checkpoint index ",
             index, ": no \"weight_map\" object");
    weight_map = j["weight_map"];
    std::set<std::string> seen;
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      DZ_CHECK(it.value().is_string(), "bad checkpoint index ", index, ": weight_map[", it.key(),
               "] is not a file name");
      std::string shard = it.value().get<std::string>();
      if (seen.insert(shard).second) {
        DZ_CHECK(file_exists(join(dir, shard)), "missing shard ", join(dir, shard), " (listed in ", index,
                 " for tensor ", it.key(), ")");
        files.push_back(join(dir, shard));
      }
    }
  } else if (file_exists(single)) {
    files.push_back(single);
  } else if (file_exists(dir) && dir.size() > 12 && dir.compare(dir.size() - 12, 12, ".safetensors") == 0) {
    files.push_back(dir);  // a bare .safetensors file
  } else {
    fail(str("no model.safetensors or model.safetensors.index.json in ", dir));
  }
  for (const auto& p : files) {
    ck->maps_.push_back(std::make_unique<Mapping>(p));
    const Mapping& m = *ck->maps_.back();
    parse_safetensors(p, m.data, m.size, &ck->tensors_);
  }
  // Every tensor the index promises must be in the shard it names.
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    auto t = ck->tensors_.find(it.key());
    const std::string shard = join(dir, it.value().get<std::string>());
    DZ_CHECK(t != ck->tensors_.end() && t->second.file == shard, "tensor ", it.key(), " is listed in ", index,
             " under ", shard, " but is not in that file");
  }
  ck->pair_mxfp4();
  return ck;
}

// compressed-tensors MXFP4: X.weight_packed U8 [R, C/2] + X.weight_scale U8 [R, C/32] become one
// entry X.weight [R, C] (get() decodes it). A pair of any other shape or dtype (NVFP4's E4M3 scales
// per 16, say) is left as it is, so strict loading names its tensors as unexpected.
void Checkpoint::pair_mxfp4() {
  const std::string P = "_packed", S = "_scale";
  std::vector<std::string> packed;
  for (const auto& kv : tensors_)
    if (kv.first.size() > 13 && kv.first.compare(kv.first.size() - 13, 13, "weight_packed") == 0) packed.push_back(kv.first);
  for (const std::string& pn : packed) {
    const std::string base = pn.substr(0, pn.size() - P.size());  // X.weight
    auto pit = tensors_.find(pn), sit = tensors_.find(base + S);
    if (sit == tensors_.end()) continue;
    const TensorInfo &pi = pit->second, &si = sit->second;
    if (pi.dtype != DType::U8 || si.dtype != DType::U8 || pi.shape.size() != 2 || si.shape.size() != 2) continue;
    const int64_t R = pi.shape[0], C = 2 * pi.shape[1];
    if (si.shape[0] != R || C % 32 != 0 || si.shape[1] != C / 32) continue;
    DZ_CHECK(!tensors_.count(base), "checkpoint ", dir_, " holds ", base, " both plain and MXFP4-packed (", pn, ")");
    TensorInfo ti = pi;  // the packed bytes; the scales beside them
    ti.shape = {R, C};
    ti.mx_scale = std::make_shared<const TensorInfo>(si);
    tensors_.erase(sit);
    tensors_.erase(tensors_.find(pn));
    tensors_[base] = std::move(ti);
    ++mxfp4_tensors_;
  }
}

std::unique_ptr<Checkpoint> Checkpoint::random(uint64_t seed) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->generating_ = true;
  ck->seed_ = seed;
  ck->dir_ = str("<random seed ", seed, ">");
  return ck;
}

std::unique_ptr<Checkpoint> Checkpoint::dummy(uint64_t seed) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->generating_ = true;
  ck->keep_ = false;
  ck->seed_ = seed;
  ck->dir_ = str("<dummy weights, seed ", seed, ">");
  return ck;
}

uint64_t Checkpoint::dummy_key_of(const std::string& name) const { return splitmix64(seed_) ^ fnv1a64(name); }

uint64_t Checkpoint::dummy_key(const std::string& name, const Shape& shape) {
  DZ_CHECK(dummy(), "internal: dummy_key of ", name, " outside --dummy-weights");
  used_.insert(name);
  TensorInfo& ti = tensors_[name];
  ti.name = name;
  ti.shape = shape;
  ti.nbytes = uint64_t(numel(shape)) * 4;
  return dummy_key_of(name);
}

bool Checkpoint::has(const std::string& name) const {
  if (generating_) return keep_ ? generated_.count(name) > 0 : used_.count(name) > 0;
  return tensors_.count(name) > 0;
}

std::string Checkpoint::file_name(const std::string& name) const {
  if (auto it = tensors_.find(name); it != tensors_.end() && !it->second.name.empty()) return it->second.name;
  for (const auto& r : renamed_)  // the name this checkpoint would use for it
    if (name.rfind(r.second, 0) == 0) return r.first + name.substr(r.second.size());
  return name;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = tensors_.find(name);
  DZ_CHECK(it != tensors_.end(), "missing tensor ", file_name(name), " in ", dir_);
  return it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  for (const auto& kv : tensors_) r.push_back(kv.first);
  return r;
}

Tensor Checkpoint::get(const std::string& name, const Shape& shape, Init init) {
  if (generating_) {
    auto it = generated_.find(name);
    if (it != generated_.end()) {
      DZ_CHECK(it->second.shape == shape, "tensor ", name, ": expected shape ", shape_str(shape),
               ", checkpoint has ", shape_str(it->second.shape));
      return it->second;
    }
    if (!keep_) {  // --dummy-weights: regenerated (identically) if asked again
      used_.insert(name);
      TensorInfo& ti = tensors_[name];  // names and shapes stay (parameter counts), values do not
      ti.name = name;
      ti.shape = shape;
      ti.nbytes = uint64_t(numel(shape)) * 4;
      if (dry_run_) {
        Tensor t;
        t.shape = shape;
        return t;
      }
      return generate_dummy(dummy_key_of(name), shape, init);
    }
    Tensor t = generate(seed_, name, shape, init);
    TensorInfo ti;
    ti.name = name;
    ti.shape = shape;
    ti.nbytes = uint64_t(t.size()) * 4;
    tensors_[name] = ti;
    used_.insert(name);
    generated_[name] = t;
    return t;
  }
  auto it = tensors_.find(name);
  DZ_CHECK(it != tensors_.end(), "missing tensor ", file_name(name), " in ", dir_);
  const TensorInfo& ti = it->second;
  DZ_CHECK(ti.shape == shape, "tensor ", ti.name.empty() ? name : ti.name, ": expected shape ", shape_str(shape),
           ", checkpoint has ", shape_str(ti.shape));
  const std::string sname = name + "_scale_inv";  // DeepSeek fp8 block scales, see below
  auto sit = tensors_.find(sname);
  const bool block_scaled = ti.dtype == DType::F8_E4M3 && sit != tensors_.end();
  if (block_scaled)
    DZ_CHECK(shape.size() == 2, "tensor ", name, ": fp8 block scales need a 2-D weight, got ", shape_str(shape));
  Shape sshape;  // [ceil(R / 128), ceil(C / 128)]
  if (block_scaled) sshape = {(shape[0] + kFp8Block - 1) / kFp8Block, (shape[1] + kFp8Block - 1) / kFp8Block};
  if (dry_run_) {  // names and shapes only
    used_.insert(name);
    if (block_scaled) get(sname, sshape);
    Tensor t;
    t.shape = shape;
    return t;
  }
  auto mapping = [&](const std::string& file) {
    for (const auto& mp : maps_)
      if (mp->path == file) return mp.get();
    fail(str("internal: no mapping for ", file));
  };
  const Mapping* m = mapping(ti.file);
  Tensor t(shape);
  if (ti.mx_scale) {  // MXFP4: decoded exactly; a NaN scale (0xFF) is a broken checkpoint
    const TensorInfo& si = *ti.mx_scale;
    const uint8_t* sc = mapping(si.file)->data + si.offset;
    for (uint64_t i = 0; i < si.nbytes; ++i)
      DZ_CHECK(sc[i] != 0xFFu, "tensor ", si.name, ": E8M0 scale 0xFF (NaN) at element ", i, " in ", dir_);
    mxfp4_dequantize(m->data + ti.offset, sc, shape[0], shape[1], t.ptr());
    t.mxfp4 = true;
    used_.insert(name);
    return t;
  }
  decode(ti.dtype, m->data + ti.offset, size_t(t.size()), t.ptr());
  used_.insert(name);

  // DeepSeek fp8 weights: NAME_scale_inv holds one fp32 scale per 128x128 block (edge blocks partial).
  if (block_scaled) {
    const int64_t R = shape[0], C = shape[1];
    Tensor s = get(sname, sshape);  // checks the scale's shape, marks it used
    for (int64_t r = 0; r < R; ++r) {
      const float* srow = s.row(r / kFp8Block);
      float* w = t.row(r);  // [C]
      for (int64_t c = 0; c < C; ++c) w[c] *= srow[c / kFp8Block];
    }
    t.fp8_block_scales = std::make_shared<const Tensor>(std::move(s));  // a backend may keep FP8
    ++fp8_block_tensors_;
  }
  return t;
}

Tensor Checkpoint::get_optional(const std::string& name, const Shape& shape, Init init) {
  // Generating mode: optional tensors are never generated (make-model writes the minimal layout).
  if (!has(name)) return Tensor();
  return get(name, shape, init);
}

void Checkpoint::rename_prefix(const std::string& from, const std::string& to) {
  DZ_CHECK(!generating_, "internal: rename_prefix on a generated checkpoint");
  // A name already under TO that the renamed ones would sit beside (a text model named two ways);
  // other tensors under TO (model.visual.* beside language_model.model.*) stay as they are.
  auto text_part = [&](const std::string& n) {
    if (n.rfind(to, 0) != 0 || n.rfind(from, 0) == 0) return false;
    const std::string rest = n.substr(to.size());
    if (to == "model.") return rest.rfind("layers.", 0) == 0 || rest.rfind("embed_tokens.", 0) == 0 || rest.rfind("norm.", 0) == 0;
    return true;
  };
  std::map<std::string, TensorInfo> out;
  for (auto& kv : tensors_) {
    std::string n = kv.first;
    if (text_part(n))
      fail(str("checkpoint ", dir_, " holds ", kv.first, " beside the text model's tensors under ", from,
               ": its tensors are named two ways"));
    if (n.rfind(from, 0) == 0) n = to + n.substr(from.size());
    DZ_CHECK(!out.count(n), "checkpoint ", dir_, ": ", kv.first, " and ", out[n].name, " are the same tensor once ",
             from, " is read as ", to);
    out[n] = kv.second;  // TensorInfo::name keeps the file's name
  }
  tensors_ = std::move(out);
  renamed_.push_back({from, to});
}

int64_t Checkpoint::skip_prefix(const std::string& prefix) {
  int64_t n = 0;
  for (const auto& kv : tensors_)
    if (kv.first.rfind(prefix, 0) == 0 && used_.insert(kv.first).second) ++n;
  return n;
}

std::vector<std::string> Checkpoint::unused() const {
  std::vector<std::string> r;
  if (generating_) return r;
  for (const auto& kv : tensors_)
    if (!used_.count(kv.first)) r.push_back(kv.first);
  return r;
}

void Checkpoint::check_all_used() const {
  std::vector<std::string> unused = this->unused();
  if (unused.empty()) return;
  for (auto& n : unused) n = file_name(n);
  if (unused.size() == 1) fail(str("unexpected tensor ", unused[0], " in ", dir_));
  fail(str("unexpected tensor ", unused[0], " (and ", unused.size() - 1, " more) in ", dir_));
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

void mkdirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    struct stat st;
    if (::stat(cur.c_str(), &st) == 0) {
      DZ_CHECK(S_ISDIR(st.st_mode), "cannot create directory ", dir, ": ", cur, " is not a directory");
      continue;
    }
    DZ_CHECK(::mkdir(cur.c_str(), 0755) == 0 || errno == EEXIST, "cannot create directory ", cur, ": ",
             std::strerror(errno));
  }
}

std::string tmp_name(const std::string& path) { return str(path, ".tmp.", ::getpid()); }

void write_file_atomic(const std::string& path, const std::string& header, const std::vector<const Tensor*>& ts,
                       DType dtype) {
  const std::string tmp = tmp_name(path);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  DZ_CHECK(f, "cannot write ", tmp, ": ", std::strerror(errno));
  bool ok = true;
  uint64_t n = header.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, f) == 8;
  ok = ok && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  std::vector<uint16_t> buf;
  for (const Tensor* t : ts) {
    if (!ok) break;
    if (dtype == DType::F32) {
      ok = std::fwrite(t->ptr(), 4, t->data.size(), f) == t->data.size();
    } else {
      buf.resize(t->data.size());
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = f32_to_bf16(t->data[i]);
      ok = std::fwrite(buf.data(), 2, buf.size(), f) == buf.size();
    }
  }
  ok = (std::fflush(f) == 0) && ok;
  ok = (::fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail(str("error writing ", tmp));
  }
  DZ_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path, ": ",
           std::strerror(errno));
}

// Header JSON (keys sorted: nlohmann's object is a std::map), padded with spaces to a multiple of 8.
std::string make_header(const std::vector<std::pair<std::string, const Tensor*>>& ts, DType dtype) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const auto& [name, t] : ts) {
    const uint64_t nb = uint64_t(t->size()) * dtype_size(dtype);
    h[name] = {{"dtype", to_string(dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

}  // namespace

void write_safetensors(const std::string& dir, const std::map<std::string, Tensor>& tensors, DType dtype,
                       uint64_t shard_bytes) {
  DZ_CHECK(dtype == DType::F32 || dtype == DType::BF16, "write_safetensors: dtype ", to_string(dtype),
           " not supported (F32 or BF16)");
  for (const auto& [name, t] : tensors)
    DZ_CHECK(numel(t.shape) == t.size(), "write_safetensors: tensor ", name, " has shape ", shape_str(t.shape),
             " but ", t.size(), " values");
  mkdirs(dir);
  // Shards in name order; a shard closes before the tensor that would push it past shard_bytes.
  std::vector<std::vector<std::pair<std::string, const Tensor*>>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t nb = uint64_t(t.size()) * dtype_size(dtype);
    if (shard_bytes > 0 && !shards.back().empty() && cur + nb > shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().emplace_back(name, &t);
    cur += nb;
    total += nb;
  }
  const std::string index = join(dir, "model.safetensors.index.json");
  const std::string single = join(dir, "model.safetensors");
  if (shard_bytes == 0) {
    std::vector<const Tensor*> ts;
    for (const auto& p : shards[0]) ts.push_back(p.second);
    write_file_atomic(single, make_header(shards[0], dtype), ts, dtype);
    std::remove(index.c_str());  // a stale index would shadow the new file on open()
    return;
  }
  json wm = json::object();
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    std::vector<const Tensor*> ts;
    for (const auto& p : shards[i]) {
      ts.push_back(p.second);
      wm[p.first] = fname;
    }
    write_file_atomic(join(dir, fname), make_header(shards[i], dtype), ts, dtype);
  }
  json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  const std::string tmp = tmp_name(index);
  {
    std::ofstream f(tmp);
    f << idx.dump(2) << "\n";
    DZ_CHECK(f.good(), "error writing ", tmp);
  }
  DZ_CHECK(std::rename(tmp.c_str(), index.c_str()) == 0, "cannot rename ", tmp, " to ", index);
  std::remove(single.c_str());  // the index wins on open(); drop a stale single file for clarity
}

}  // namespace dz
