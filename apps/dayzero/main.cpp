// dayzero: batch inference for hybrid linear/sparse-attention LLMs, launched with mpirun.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/comm.hpp"
#include "job/bench_e2e.hpp"
#include "job/bench_spec.hpp"
#include "job/run.hpp"
#include "job/tools.hpp"
#ifdef DAYZERO_HAVE_CUDA
#include "bench_dense_attn.cuh"
#include "bench_linear_attn.cuh"
#include "bench_sparse_attn.cuh"
#endif

int main(int argc, char** argv) {
  CLI::App app{"dayzero " DAYZERO_VERSION
               ": MPI batch inference (log-probs, top-k, last logits, generation) for hybrid LLMs "
               "(KDA / Gated DeltaNet, MLA + DSA indexer, Block AttnRes, MoE)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DAYZERO_VERSION);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "More logging");

  dz::RunOptions ro;
  auto* run = app.add_subcommand("run", "Run the batch job over an HDF5 input (under mpirun)");
  run->add_option("--model", ro.model, "Model directory (config.json + safetensors)")->required();
  run->add_option("--input", ro.input, "Input HDF5 (/tokens, /offsets)")->required();
  run->add_option("--output", ro.output, "Output HDF5")->required();
  run->add_option("--cp", ro.cp, "Context-parallel ranks per document")->capture_default_str();
  run->add_option("--tp", ro.tp, "Tensor-parallel ranks")->capture_default_str();
  run->add_option("--ep", ro.ep,
                  "Expert-parallel ranks: the routed experts are split whole over this many ranks (--tp times a "
                  "divisor of --cp; rows are sent to their experts' ranks by all-to-all) instead of width-sharded "
                  "over --tp (1)")
      ->capture_default_str();
  run->add_option("--max-batch-tokens", ro.max_batch_tokens,
                  "Tokens per forward: shorter documents are packed together into forwards of up to this many "
                  "tokens (varlen), a longer one is prefilled in chunks of this size (0: one whole document per "
                  "forward)")
      ->capture_default_str();
  run->add_flag("--dummy-weights", ro.dummy_weights,
               "Build the model from DIR/config.json alone with deterministic random weights (no safetensors: "
               "real shapes for benchmarks and planning)");
  run->add_option("--segments", ro.segments,
                  "Linear-attention segments per zigzag segment: the parallel-scan decomposition inside a rank")
      ->capture_default_str();
  run->add_option("--mode", ro.mode, "logprobs | topk | last-logits | generate")
      ->check(CLI::IsMember({"logprobs", "topk", "last-logits", "generate"}))
      ->capture_default_str();
  run->add_option("--topk", ro.topk, "K for --mode topk")->capture_default_str();
  run->add_option("--max-new-tokens", ro.max_new_tokens, "Tokens to generate per document")->capture_default_str();
  run->add_option("--temperature", ro.temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  run->add_option("--seed", ro.seed, "Sampling seed")->capture_default_str();
  run->add_option("--backend", ro.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  run->add_option("--kv-cache", ro.kv_cache, "bf16 | fp8")->check(CLI::IsMember({"bf16", "fp8"}))->capture_default_str();
  run->add_option("--index-quant", ro.index_quant, "none | mxfp8")
      ->check(CLI::IsMember({"none", "mxfp8"}))
      ->capture_default_str();
  run->add_flag("--eager-decode", ro.eager_decode,
                "Generate mode on the GPU: issue every decode op one by one instead of replaying CUDA graphs of the "
                "linear-attention, FFN and norm runs (the same results; for debugging and timing)");
  run->add_option("--speculative", ro.speculative,
                  "Generate mode: speculative decoding with drafts from n-gram matches in the document (ngram) or "
                  "the checkpoint's MTP layers (mtp), or what an earlier run generated (oracle, --oracle-drafts: the "
                  "ceiling of speculation, for measurements), verified in one forward; greedy output equals plain "
                  "decoding")
      ->check(CLI::IsMember({"ngram", "mtp", "oracle"}));
  run->add_option("--oracle-drafts", ro.oracle_drafts,
                  "--speculative oracle: the output of an earlier generate run over the same input");
  run->add_option("--draft-tokens", ro.draft_tokens, "Speculative decoding: draft tokens per step, at most")
      ->capture_default_str();
  run->add_option("--spec-restore", ro.spec_restore,
                  "Speculative decoding: how linear-attention states undo rejected drafts: per-token (default: the "
                  "state after every verified token kept) | replay (snapshot, then the scan again over the accepted "
                  "tokens)")
      ->check(CLI::IsMember({"replay", "per-token"}))
      ->capture_default_str();
  run->add_flag("--resume", ro.resume, "Continue OUT (or OUT.part), skipping documents already done");
  run->add_flag("--overwrite", ro.overwrite, "Replace an existing OUT when the new run completes");
  run->add_option("--report", ro.report, "Write a JSON report (documents, tokens, tokens/s, per-document times)");
  run->add_option("--progress-interval", ro.progress_seconds, "Seconds between progress lines")->capture_default_str();
  run->add_option("--stop-grace", ro.stop_grace,
                  "After SIGTERM/SIGINT: seconds to finish in-flight documents before exiting (code 143)")
      ->capture_default_str();

  dz::MakeModelOptions mo;
  auto* mm = app.add_subcommand("make-model", "Write a preset model with deterministic random weights (HF format)");
  mm->add_option("--preset", mo.preset, "Preset name (demo, hybrid-small) or a config.json path")->capture_default_str();
  mm->add_option("--out", mo.out, "Output directory")->required();
  mm->add_option("--seed", mo.seed, "Weight seed")->capture_default_str();
  mm->add_option("--dtype", mo.dtype, "f32 | bf16")->capture_default_str();
  mm->add_option("--shard-mb", mo.shard_mb, "Shard size in MiB (0: one file)")->capture_default_str();
  mm->add_flag("--overwrite", mo.overwrite, "Replace an existing model in --out");

  dz::MakeInputOptions io;
  auto* mi = app.add_subcommand("make-input", "Write an input HDF5: synthetic documents or from a token file");
  mi->add_option("--out", io.out, "Output HDF5")->required();
  mi->add_option("--docs", io.docs, "Number of synthetic documents")->capture_default_str();
  mi->add_option("--min-len", io.min_len, "Shortest synthetic document")->capture_default_str();
  mi->add_option("--max-len", io.max_len, "Longest synthetic document")->capture_default_str();
  mi->add_option("--vocab", io.vocab, "Vocabulary size for synthetic tokens");
  mi->add_option("--model", io.model, "Take the vocabulary size from this model directory");
  mi->add_option("--seed", io.seed, "Seed")->capture_default_str();
  mi->add_option("--tokens-file", io.tokens_file, "Text file: one document per line, whitespace-separated ids");
  mi->add_flag("--overwrite", io.overwrite, "Replace an existing file");
  mi->add_option("--text", io.text,
                 "Text documents: a directory of *.txt files, a .jsonl file (\"id\", \"text\" per line) or one text file");
  mi->add_option("--tokenizer", io.tokenizer, "Model directory (its tokenizer.json) or a tokenizer.json, for --text "
                                              "(python3 with the tokenizers package)");
  mi->add_flag("--add-special-tokens", io.add_special_tokens, "--text: let the tokenizer add its special tokens (BOS)");
  mi->add_option("--text-key", io.text_key, "--text .jsonl: the field holding the text")->capture_default_str();
  mi->add_option("--id-key", io.id_key, "--text .jsonl: the field holding the document id")->capture_default_str();
  mi->add_option("--score-last", io.score_last,
                 "Write /score_from so that only each document's last N tokens are scored (--mode logprobs)");

  std::string sum_path;
  bool sum_json = false;
  auto* sm = app.add_subcommand("summarize", "Per-document log-likelihoods and perplexities, and the corpus summary, "
                                             "of a logprobs-mode output (finished or partial)");
  sm->add_option("output", sum_path, "Output HDF5 (OUT.h5, or OUT.h5.part of an unfinished run)")->required();
  sm->add_flag("--json", sum_json, "Print JSON instead of a table");

  std::string inspect_dir;
  bool inspect_json = false;
  auto* ins = app.add_subcommand("inspect", "Structural diff of a checkpoint against what dayzero supports");
  ins->add_option("--model", inspect_dir, "Model directory")->required();
  ins->add_flag("--json", inspect_json, "Print JSON instead of a table");
  bool inspect_structural = false;
  ins->add_flag("--structural", inspect_structural,
                "Match tensor names, shapes and config keys against dayzero's modules even when the family has a "
                "parser (a family without one always gets this diff)");

  std::string plan_model = "hybrid-small";
  int64_t plan_len = 65536;
  int plan_cp = 4, plan_seg = 1;
  bool plan_json = false;
  auto* pl = app.add_subcommand("plan", "Per-rank work (zigzag CP vs a contiguous split) and memory (weights, state, activations) of one document");
  pl->add_option("--model", plan_model, "Model directory or preset name")->capture_default_str();
  pl->add_option("--length", plan_len, "Document length in tokens")->capture_default_str();
  pl->add_option("--cp", plan_cp, "Context-parallel ranks")->capture_default_str();
  pl->add_option("--segments", plan_seg, "Segments per zigzag segment")->capture_default_str();
  pl->add_flag("--json", plan_json, "Print JSON");
  dz::PlanMemoryOptions pmo;
  pl->add_option("--tp", pmo.tp, "Tensor-parallel ranks (memory per rank)")->capture_default_str();
  pl->add_option("--ep", pmo.ep, "Expert-parallel ranks (routed experts split whole, as for run)")->capture_default_str();
  pl->add_option("--backend", pmo.backend, "cpu | cuda (weight and activation dtypes)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  pl->add_option("--max-batch-tokens", pmo.max_batch_tokens, "Tokens per forward, as for run")->capture_default_str();
  pl->add_flag("--kv-cache-fp8", pmo.kv_fp8, "The MLA cache in FP8 (run --kv-cache fp8)");
  pl->add_option("--device-gib", pmo.device_gib, "Memory of one device (GiB)")->capture_default_str();

  std::string bench_which, bench_json;
  dz::BenchE2eOptions eo;
  bool bench_real_weights = false;
  auto* be = app.add_subcommand("bench", "Time the CUDA kernels or the whole job on this GPU and write a JSON report "
                                         "(docs/perf/)");
  be->add_option("which", bench_which,
                 "linear-attn | sparse-attn | dense-attn (kernels) | e2e (the job's prefill, DESIGN §7) | spec (speculative "
                 "decoding: verify and restore costs per draft length, speedups with oracle and n-gram drafts)")
      ->required()
      ->check(CLI::IsMember({"linear-attn", "sparse-attn", "dense-attn", "e2e", "spec"}));
  be->add_option("--json", bench_json, "Write the report here (commit from $DZ_COMMIT)");
  be->add_option("--model", eo.models, "e2e: model directories (config.json; built with --dummy-weights)");
  be->add_option("--tokens", eo.tokens, "e2e: document lengths")->delimiter(',')->capture_default_str();
  be->add_option("--modes", eo.modes, "e2e: output modes")
      ->delimiter(',')
      ->check(CLI::IsMember({"logprobs", "topk", "last-logits", "generate"}))
      ->capture_default_str();
  be->add_option("--repeats", eo.repeats, "e2e: timed runs after one warm-up (median)")->capture_default_str();
  be->add_option("--backend", eo.backend, "e2e: cpu | cuda")->capture_default_str();
  be->add_option("--max-batch-tokens", eo.max_batch_tokens, "e2e: prefill in forwards of this many tokens (0: whole)")
      ->capture_default_str();
  dz::BenchSpecOptions so;
  be->add_option("--batches", so.batch, "spec: documents decoded together (one measurement each)")
      ->delimiter(',')
      ->capture_default_str();
  be->add_option("--draft-tokens", so.draft_tokens, "spec: draft lengths K")->delimiter(',')->capture_default_str();
  be->add_option("--prompt-tokens", so.prompt_tokens, "spec: prompt length of each document")->capture_default_str();
  auto* new_tok = be->add_option("--new-tokens", eo.new_tokens,
                                 "e2e generate mode: tokens generated after the prefill (decode time per token "
                                 "reported); spec: tokens generated per document (default 64)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  be->add_flag("--eager-decode", eo.eager_decode, "e2e generate mode: decode without CUDA graphs");
  be->add_option("--batch", eo.batch, "e2e: documents of each length per forward (packed; generate mode decodes "
                                      "them together: decode_tok_s)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  be->add_flag("--real-weights", bench_real_weights, "e2e: load the checkpoint's weights instead of dummy ones");

  // Parse before MPI_Init so --help works without a launcher; MPI starts only for `run`.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  dz::log_state().verbose = verbose;

  if (run->parsed()) {
    dz::MpiRuntime mpi(&argc, &argv);
    try {
      return dz::run_job(ro);  // kExitStopped (143) after a clean stop on SIGTERM/SIGINT
    } catch (const dz::PreflightError& e) {
      if (dz::log_state().rank == 0) std::fprintf(stderr, "dayzero: error: %s\n", e.message.c_str());
      return 1;
    } catch (const std::exception& e) {
      dz::abort_all(e.what());
    }
  }
  try {
    if (mm->parsed()) dz::make_model(mo);
    if (mi->parsed()) dz::make_input(io);
    if (ins->parsed()) return dz::inspect(inspect_dir, inspect_json, inspect_structural);
    if (sm->parsed()) return dz::summarize(sum_path, sum_json);
    if (pl->parsed()) return dz::plan(plan_model, plan_len, plan_cp, plan_seg, plan_json, pmo);
    if (be->parsed() && bench_which == "spec") {
      so.models = eo.models;
      so.repeats = eo.repeats;
      so.backend = eo.backend;
      so.dummy_weights = !bench_real_weights;
      so.json = bench_json;
      if (new_tok->count()) so.new_tokens = eo.new_tokens;
      return dz::bench_spec(so);
    }
    if (be->parsed() && bench_which == "e2e") {
      eo.json = bench_json;
      eo.dummy_weights = !bench_real_weights;
      return dz::bench_e2e(eo);
    }
    if (be->parsed()) {
#ifdef DAYZERO_HAVE_CUDA
      if (bench_which == "linear-attn") return dz::cuda::bench_linear_attn(bench_json);
      if (bench_which == "dense-attn") return dz::cuda::bench_dense_attn(bench_json);
      return dz::cuda::bench_sparse_attn(bench_json);
#else
      dz::fail("bench: this dayzero was built without CUDA (configure with nvcc present or -DDAYZERO_CUDA=ON)");
#endif
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dayzero: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
