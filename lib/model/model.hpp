// The hybrid model on the CPU reference backend: embedding, a list of (mixer, FFN) layers with
// pre-norms and either the additive residual or Block AttnRes, the final norm and the LM head.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.hpp"
#include "core/tensor.hpp"
#include "io/checkpoint.hpp"
#include "model/module.hpp"

namespace dz {

class AttnRes;

class Model {
 public:
  // Loads DIR/config.json and the safetensors weights, strictly: any missing, unexpected or
  // mis-shaped tensor is an error naming it.
  static std::unique_ptr<Model> load(const std::string& dir);
  // Builds from any Checkpoint (a real one, or Checkpoint::random for make-model).
  static std::unique_ptr<Model> build(const ModelConfig& cfg, Checkpoint& ck);
  ~Model();

  const ModelConfig& config() const { return cfg_; }

  struct State {
    std::vector<std::unique_ptr<MixerState>> mixers;  // per layer
    int64_t pos = 0;                                  // tokens consumed
    State clone() const;
  };
  State make_state() const;

  // tokens [T] at absolute positions st.pos .. st.pos+T-1 -> final hidden states after the final
  // norm [T, D]. `tick` is called between layers (the job uses it to keep MPI progressing).
  // layer_hidden, when given, receives the residual stream after the embedding and after each
  // layer (num_layers + 1 tensors [T, D], as transformers' output_hidden_states before the final
  // norm).
  Tensor forward(const int32_t* tokens, int64_t T, State& st, const std::function<void()>& tick = {},
                 std::vector<Tensor>* layer_hidden = nullptr) const;
  // logits[rows, V] = hidden[rows, D] · lm_head^T
  void logits(const float* hidden, int64_t rows, float* out) const;

 private:
  Model() = default;
  ModelConfig cfg_;
  Tensor embed_;    // [V, D]
  Tensor lm_head_;  // [V, D] (empty when tied to embed_)
  Tensor final_norm_;
  struct Layer {
    Tensor attn_norm, ffn_norm;  // [D]
    std::unique_ptr<Mixer> mixer;
    std::unique_ptr<Ffn> ffn;
  };
  std::vector<Layer> layers_;
  std::unique_ptr<AttnRes> attn_res_;
};

// Marks the multi-token-prediction layers of DeepSeek checkpoints (num_nextn_predict_layers) as
// known, so strict loading accepts published checkpoints that carry them.
void skip_mtp_layers(const ModelConfig& cfg, Checkpoint& ck);

// log-softmax helpers over one row of logits (fp64 accumulation, deterministic).
// Returns log p(target).
double log_softmax_at(const float* logits, int64_t V, int64_t target);
// Fills out[V] with log-probabilities.
void log_softmax(const float* logits, int64_t V, float* out);

}  // namespace dz
