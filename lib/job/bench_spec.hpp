// `dayzero bench spec`: speculative decoding (DESIGN §11) on one rank. Per model and batch size B
// (documents decoded together) and draft length K:
//   - the verify step (a forward of K + 1 rows per document from states with history, the
//     snapshot included) and the restore (Model::spec_keep of K of those rows) on their own, for
//     both restores of the recurrent states (replay, per-token), beside a plain decode step;
//   - end to end: generation with oracle drafts (what a plain greedy run generated: every draft
//     right, the ceiling of speculation at K) and with n-gram drafts on repetitive documents,
//     against plain decoding of the same documents (tokens per second, speedup).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dz {

struct BenchSpecOptions {
  std::vector<std::string> models;
  std::vector<int64_t> batch{1, 64};
  std::vector<int64_t> draft_tokens{1, 2, 4, 8};
  int64_t prompt_tokens = 512;  // each document's prompt
  int64_t new_tokens = 64;      // tokens generated per document
  int repeats = 3;              // timed repetitions of each step measurement (median)
  std::string backend = "cuda";
  bool dummy_weights = true;
  std::string json;
};

int bench_spec(const BenchSpecOptions& opt);

}  // namespace dz
