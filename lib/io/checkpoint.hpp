// Hugging Face checkpoint access: safetensors (single file, or sharded with
// model.safetensors.index.json), memory-mapped, converted to fp32 on request.
// Loading is strict: modules ask for every tensor by name and expected shape; whatever is left
// unasked at the end is an error too (check_all_used).
//
// The same interface has a generating mode (Checkpoint::random): `get` returns deterministic
// random values seeded by the tensor name, and records what was asked for, so `make-model` writes
// exactly the tensors the model loads, with no second list of names to keep in sync.
// Checkpoint::dummy (`--dummy-weights`) generates too but keeps nothing: values come from a
// counter-based hash of (seed, name, element index), made in parallel on the host's cores, so a
// 100 GB model's shapes load from config.json alone at memory speed.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "core/tensor.hpp"

namespace dz {


// How a generated (make-model) tensor is initialised. Ignored when reading a real checkpoint.
struct Init {
  enum Kind { Normal, Ones, Zeros, Uniform, Const } kind = Normal;
  float a = 0.02f;  // Normal: std; Uniform: low; Const: value
  float b = 0.f;    // Uniform: high
  static Init normal(float std) { return {Normal, std, 0.f}; }
  static Init ones() { return {Ones, 0.f, 0.f}; }
  static Init zeros() { return {Zeros, 0.f, 0.f}; }
  static Init uniform(float lo, float hi) { return {Uniform, lo, hi}; }
  static Init constant(float v) { return {Const, v, 0.f}; }
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::string file;      // shard path
  uint64_t offset = 0;   // byte offset of the data inside the mapped file
  uint64_t nbytes = 0;
  // An MXFP4 weight (compressed-tensors "mxfp4-pack-quantized"): the file holds X.weight_packed U8
  // [R, C/2] (this entry's file/offset; name is the file's X.weight_packed) and X.weight_scale U8
  // [R, C/32] (scale); the checkpoint lists the pair once, as X.weight of shape [R, C].
  std::shared_ptr<const TensorInfo> mx_scale;
};

class Checkpoint {
 public:
  // Opens DIR/model.safetensors or DIR/model.safetensors.index.json (+ shards). Throws with the
  // file name on any malformed header, out-of-range offset or truncated file.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);
  // Generating mode for make-model (see above).
  static std::unique_ptr<Checkpoint> random(uint64_t seed);
  // Generating mode for --dummy-weights (see above): nothing is kept after `get` returns.
  static std::unique_ptr<Checkpoint> dummy(uint64_t seed);
  ~Checkpoint();

  bool generating() const { return generating_; }
  // make-model's generating mode: whole tensors are asked for whatever the TP layout (they are written).
  bool keeps_full() const { return generating_ && keep_; }
  // FP8 block-scaled tensors loaded so far (their Tensors carry fp8_block_scales).
  int64_t fp8_block_tensors() const { return fp8_block_tensors_; }
  // MXFP4 weights in the file (X.weight_packed + X.weight_scale pairs, listed as X.weight).
  int64_t mxfp4_tensors() const { return mxfp4_tensors_; }
  // --dummy-weights: modules may generate large tensors in place on their backend
  // (Backend::fill_dummy) from dummy_key(NAME, shape), which also records NAME as asked for.
  bool dummy() const { return generating_ && !keep_; }
  uint64_t dummy_key(const std::string& name, const Shape& shape);
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws "missing tensor NAME"
  std::vector<std::string> names() const;

  // fp32 copy of NAME; throws "tensor NAME: expected shape [..], checkpoint has [..]" or
  // "missing tensor NAME (in DIR)". Marks NAME as used.
  Tensor get(const std::string& name, const Shape& shape, Init init = Init{});
  // Like get, but returns an empty tensor when NAME is absent (optional parameters such as biases).
  Tensor get_optional(const std::string& name, const Shape& shape, Init init = Init{});
  // Throws "unexpected tensor NAME (and k more)" if any tensor was never asked for.
  void check_all_used() const;
  // Reads the checkpoint's tensors named FROM + rest as TO + rest (a multimodal wrapper's text
  // model: "model.language_model." -> "model."). Messages about them name the file's names.
  void rename_prefix(const std::string& from, const std::string& to);
  // Marks every tensor under PREFIX as recognised and not loaded (a vision tower); returns how many.
  int64_t skip_prefix(const std::string& prefix);
  // Names never asked for (inspect attributes them to modules), read as dayzero's (rename_prefix).
  std::vector<std::string> unused() const;
  // dayzero's name -> the name the file uses for it (they differ after rename_prefix).
  std::string file_name(const std::string& name) const;
  // Dry run (inspect): get() checks names and shapes but returns tensors with the shape set and
  // no data, so a checkpoint of any size can be checked without its memory.
  void set_dry_run(bool on) { dry_run_ = on; }
  // Names asked for so far with their fp32 data (generating mode: what make-model writes).
  const std::map<std::string, Tensor>& generated() const { return generated_; }
  const std::string& dir() const { return dir_; }

 private:
  Checkpoint() = default;
  uint64_t dummy_key_of(const std::string& name) const;
  void pair_mxfp4();  // open(): X.weight_packed + X.weight_scale -> X.weight (TensorInfo::mx_scale)
  std::vector<std::pair<std::string, std::string>> renamed_;  // (file prefix, ours)
  struct Mapping;
  std::string dir_;
  bool generating_ = false;
  bool keep_ = true;  // generating: keep what was generated (make-model writes it)
  bool dry_run_ = false;
  uint64_t seed_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::unique_ptr<Mapping>> maps_;
  std::set<std::string> used_;
  std::map<std::string, Tensor> generated_;
  int64_t fp8_block_tensors_ = 0;
  int64_t mxfp4_tensors_ = 0;
};

// Writes tensors as safetensors (dtype F32 or BF16). shard_bytes > 0 splits into
// model-0000i-of-0000n.safetensors + model.safetensors.index.json. Writes to temp names and
// renames, so a crash never leaves a half-written checkpoint.
void write_safetensors(const std::string& dir, const std::map<std::string, Tensor>& tensors, DType dtype,
                       uint64_t shard_bytes = 0);

}  // namespace dz
