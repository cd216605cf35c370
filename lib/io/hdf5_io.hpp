// HDF5 input and output of the batch job. The one place that talks to the HDF5 library.
//
// Input: /tokens int32 1-D (all documents concatenated), /offsets int64 [n_docs + 1]; optional
// /score_from int64 [n_docs] (logprobs mode: the first position whose log-prob counts, 1 .. L_i)
// and /bytes int64 [n_docs] (each document's byte count: bits per byte in the report).
// Documents are read by hyperslab; validation scans the tokens in bounded chunks.
//
// Output: written by one rank. The result is built in PATH.part, whose datasets are all created
// with their final, fixed size up front, so later writes touch only raw data (never metadata);
// a document's data is flushed before its /done flag is set and flushed again. When every
// document is done, PATH.part is finalised and renamed to PATH atomically. A crash therefore
// leaves either no PATH (and a resumable PATH.part) or a complete PATH.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <stdexcept>
#include <vector>

namespace dz {

enum class OutputMode { Logprobs, TopK, LastLogits, Generate };
const char* to_string(OutputMode m);
OutputMode parse_output_mode(const std::string& s);  // throws on unknown names

class InputFile {
 public:
  // Throws one-line errors: "IN.h5: not an HDF5 file", "IN.h5: missing dataset /tokens",
  // "IN.h5: /offsets must be int64 1-D", ...
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t n_docs() const { return int64_t(offsets_.size()) - 1; }
  int64_t n_tokens() const { return n_tokens_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  int64_t doc_length(int64_t i) const { return offsets_[size_t(i) + 1] - offsets_[size_t(i)]; }

  // offsets[0] == 0, strictly increasing (an empty document is an error naming it), last ==
  // n_tokens; every token id in [0, vocab) (error names the document and position). Reads the
  // tokens in chunks of at most chunk_tokens.
  void validate(int64_t vocab, int64_t chunk_tokens = 1 << 20) const;
  std::vector<int32_t> read_doc(int64_t i) const;  // one hyperslab
  // Empty when the file has none (every position from 1 counts / no byte counts).
  const std::vector<int64_t>& score_from() const { return score_from_; }
  const std::vector<int64_t>& bytes() const { return bytes_; }
  // FNV-1a 64 of every token value, computed by validate()'s scan (throws if not validated).
  uint64_t token_hash() const {
    if (!validated_) throw std::logic_error("InputFile::token_hash before validate");
    return token_hash_;
  }

 private:
  std::string path_;
  int64_t file_ = -1;    // hid_t
  int64_t tokens_ = -1;  // hid_t of /tokens
  int64_t n_tokens_ = 0;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> score_from_, bytes_;
  mutable uint64_t token_hash_ = 0;
  mutable bool validated_ = false;
};

// The generated tokens of a finished generate-mode output (/generated, /generated_offsets), per
// document; oracle drafts for speculative decoding (DESIGN §11) come from a plain run's output.
// Throws one-line errors naming the file for anything else.
std::vector<std::vector<int32_t>> read_generated(const std::string& path);

// Writes a synthetic or given token set as an input file (make-input, tests).
// doc_ids (optional): /doc_ids, one UTF-8 string per document; attrs: string attributes on the root
// (make-input --text: the tokenizer's path and sha256).
void write_input_file(const std::string& path, const std::vector<int32_t>& tokens, const std::vector<int64_t>& offsets,
                      const std::vector<int64_t>& score_from = {}, const std::vector<int64_t>& bytes = {},
                      const std::vector<std::string>& doc_ids = {},
                      const std::map<std::string, std::string>& attrs = {});

struct OutputSpec {
  OutputMode mode = OutputMode::Logprobs;
  int64_t topk = 0;            // topk mode: K
  int64_t max_new_tokens = 0;  // generate mode
  int64_t vocab = 0;           // last-logits mode: row width
  std::vector<int64_t> doc_lengths;  // input lengths L_i
  // Written as string attributes on the root group. `identity` must match exactly on --resume
  // (model fingerprint, input fingerprint, mode, K, sampling and precision options); `info` is
  // informational (paths, version, backend, host) and may differ.
  std::map<std::string, std::string> identity;
  std::map<std::string, std::string> info;
};

// exp(nll / scored): the perplexity of `scored` tokens of summed negative log-likelihood nll
// (NaN with nothing scored).
double perplexity_of(double nll, int64_t scored);

struct DocStats {
  double seconds = 0;  // wall time of the document on its rank
  int64_t tokens = 0;  // input tokens
  int32_t rank = -1;   // world rank that computed it
  // speculative generation: verify forwards, draft tokens proposed and accepted (report only)
  int64_t spec_steps = 0, spec_drafted = 0, spec_accepted = 0;
  // logprobs mode (/stats/ of the output): the first scored position, the scored tokens, their
  // summed negative log-likelihood (fp64), whether every one was the argmax, the byte count (-1:
  // none in the input)
  int64_t score_from = 1, scored = 0, bytes = -1;
  double nll = 0;
  uint8_t is_greedy = 0;
};

class OutputFile {
 public:
  // New output. Refuses (before touching anything) if PATH exists and overwrite is false, or if
  // PATH.part exists (a resumable run: use resume). The directory must be writable: checked by
  // creating PATH.part, with a one-line error otherwise.
  static std::unique_ptr<OutputFile> create(const std::string& path, const OutputSpec& spec, bool overwrite);
  // Reopen PATH.part (or a finished PATH) for --resume. Throws when the identity attributes differ
  // ("OUT.h5 was written with mode=topk; this run has mode=logprobs"), or when the layout differs.
  // When neither file exists, creates a new one (resume of a run that never started).
  static std::unique_ptr<OutputFile> resume(const std::string& path, const OutputSpec& spec);
  ~OutputFile();

  const std::vector<uint8_t>& done() const { return done_; }
  bool finished() const { return finished_; }  // opened a complete PATH: nothing left to do

  // Store document i's result (shape checked against the spec), flush, then set /done[i] = 1 and
  // flush. logprobs: L_i - 1 values; topk: L_i rows of K (ids, logprobs); last-logits: vocab
  // values; generate: at most max_new_tokens ids.
  void write_logprobs(int64_t i, const std::vector<float>& lp, const DocStats& st);
  void write_topk(int64_t i, const std::vector<int32_t>& ids, const std::vector<float>& lps, const DocStats& st);
  void write_last_logits(int64_t i, const std::vector<float>& logits, const DocStats& st);
  void write_generated(int64_t i, const std::vector<int32_t>& ids, const DocStats& st);

  // All documents done: write the final layout (generate: compact /generated +
  // /generated_offsets), close, rename PATH.part -> PATH. Throws if a document is not done.
  void finalize();

 private:
  OutputFile() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<uint8_t> done_;
  bool finished_ = false;
};

// The per-document scores of a logprobs-mode output (finished PATH, or the resumable PATH.part
// when PATH does not exist: the documents done so far), and the corpus summary over them.
struct ScoreTable {
  struct Row {
    int64_t doc = 0, tokens = 0, score_from = 1, scored = 0, bytes = -1;
    double nll = 0, perplexity = 0;
    bool is_greedy = false;
  };
  std::string file;        // the file read (PATH or PATH.part)
  bool complete = false;   // every document done and the file finalised
  int64_t n_docs = 0;
  std::vector<Row> rows;   // the documents done, in document order
  // corpus: token-weighted over the done documents
  int64_t scored = 0, bytes = -1;  // bytes: -1 unless every done document has a byte count
  double nll = 0;
  double perplexity() const;     // exp(nll / scored) (NaN with nothing scored)
  double bits_per_byte() const;  // nll / (ln 2 · bytes) (NaN without byte counts)
};
// Throws one-line errors naming the file: missing, not a dayzero output, not logprobs mode.
ScoreTable read_scores(const std::string& path);

}  // namespace dz
