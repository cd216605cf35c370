// The graph runner (DESIGN §10): batched decode steps through the layer stack, with every run of
// graph-safe sub-layers (the linear-attention mixers, the FFNs / MoE, their norms, residuals and
// AttnRes mixtures) captured once as a CUDA graph and replayed at the following steps. The
// attention mixers run eagerly between the graphs: their positions and cache lengths are kernel
// arguments that change at every step.
//
// A step issues exactly the ops of Model::forward_packed over one token per document, in the same
// order, so a replayed step equals an eager one bitwise. The first step of a batch runs eagerly
// (kernels load and GEMM plans are made outside any capture), the second captures, later ones
// replay. The graphs read and write fixed buffers: the runner's own pass buffers (residual
// stream, normed input, sub-layer output, AttnRes stream) and the documents' recurrent states in
// place. They are captured again when the batch changes (another document set, a document
// finished) or a state's buffers moved.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/model.hpp"

namespace dz {

class DecodeRunner {
 public:
  // graphs: capture and replay (the backend must support graphs); false: every step eagerly.
  DecodeRunner(const Model& m, bool graphs);
  ~DecodeRunner();
  DecodeRunner(const DecodeRunner&) = delete;
  DecodeRunner& operator=(const DecodeRunner&) = delete;

  // One token per document: tokens [N] (host), *states[b] document b's state after its tokens so
  // far (each advanced by one). Returns the final hidden states [N, D] (act dtype). `tick` runs
  // between the runs of the stack (MPI progress, as between layers of a forward).
  DTensor step(const int32_t* tokens, const std::vector<Model::State*>& states, const std::function<void()>& tick = {});

  bool graphs() const { return graphs_; }
  int64_t captures() const { return captures_; }  // graphs captured so far
  int64_t replays() const { return replays_; }    // graph launches that replayed an earlier capture
  int64_t graph_runs() const;                     // runs of the stack a step captures (0: all eager)

 private:
  // A maximal run of sub-layers [first, last) that is graph-safe (or one eager sub-layer).
  struct Run {
    int64_t first = 0, last = 0;
    bool graph = false;
    std::unique_ptr<DeviceGraph> g;
    int64_t ar_blocks = 0;  // the AttnRes stream's host fields after the run (restored on replay)
    int ar_site = 0;
  };
  void reset(const std::vector<Model::State*>& states, std::vector<const void*> key);

  const Model& m_;
  bool graphs_;
  std::vector<Run> runs_;
  std::vector<const void*> key_;  // the states and their device buffers the graphs were captured on
  Model::Pass pass_;
  bool warm_ = false;  // a step of this batch ran: the next one captures
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace dz
