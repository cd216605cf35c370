#include "job/doc_compute.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "dist/seq_layout.hpp"
#include "job/speculative.hpp"
#include "model/decode_runner.hpp"

namespace dz {


int32_t choose_token(const float* logits, int64_t V, double temperature, uint64_t seed, int64_t doc, int64_t step) {
  if (temperature <= 0.0) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
  double mx = logits[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(logits[i]));
  std::vector<double> p(static_cast<size_t>(V));
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += (p[size_t(i)] = std::exp((double(logits[i]) - mx) / temperature));
  uint64_t r = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(doc)) ^ uint64_t(step));
  double u = double(r >> 11) * (1.0 / 9007199254740992.0) * s;  // uniform in [0, s)
  double c = 0;
  for (int64_t i = 0; i < V; ++i) {
    c += p[size_t(i)];
    if (u < c) return int32_t(i);
  }
  return int32_t(V - 1);
}

void finish_scores(DocResult& r, int64_t j0, const std::vector<uint8_t>& greedy) {
  const int64_t n = int64_t(r.values.size());  // L - 1
  j0 = std::min(std::max<int64_t>(j0, 0), n);
  DZ_CHECK(int64_t(greedy.size()) >= n, "finish_scores: ", greedy.size(), " greedy flags for ", n, " rows");
  double nll = 0;
  bool all = true;
  for (int64_t j = 0; j < j0; ++j) r.values[size_t(j)] = std::nanf("");
  for (int64_t j = j0; j < n; ++j) nll -= double(r.values[size_t(j)]), all = all && greedy[size_t(j)];
  r.stats.score_from = j0 + 1;
  r.stats.scored = n - j0;
  r.stats.nll = nll;
  r.stats.is_greedy = all;
}

namespace {

// Rows of a document spread over the CP group, each rank holding some positions: gathers the
// per-position values (width w each) into sequence order on every rank.
template <class T>
std::vector<T> gather_rows(const Collectives& cp, const std::vector<int64_t>& pos, const std::vector<T>& vals, int64_t w,
                           int64_t n_rows) {
  std::vector<int32_t> pi(pos.begin(), pos.end());
  std::vector<int32_t> all_pos = cp.allgatherv(pi);
  std::vector<T> all_vals = cp.allgatherv(vals);
  std::vector<T> out(static_cast<size_t>(n_rows * w));
  for (size_t i = 0; i < all_pos.size(); ++i) {
    const int64_t p = int64_t(all_pos[i]);
    std::copy(all_vals.begin() + int64_t(i) * w, all_vals.begin() + int64_t(i + 1) * w, out.begin() + p * w);
  }
  return out;
}

// The MTP layer's prompt rows after a context-parallel prefill: every CP rank runs them all (one
// layer, serially), on the model's hidden states gathered from the ranks that hold them, kMtpRows
// rows at a time, so the MTP state is the same on every rank.
void mtp_prefill_cp(const Model& model, const std::vector<int32_t>& tokens, const DTensor& hidden,
                    const std::vector<int64_t>& pos, const Collectives& cp, Model::State& st) {
  constexpr int64_t kMtpRows = 4096;
  Backend& be = model.backend();
  const int64_t L = int64_t(tokens.size()), D = hidden.cols();
  const int64_t R = int64_t(pos.size());
  for (int64_t c0 = 0; c0 < L; c0 += kMtpRows) {
    const int64_t n = std::min(kMtpRows, L - c0);
    std::vector<int64_t> mine;
    std::vector<float> vals;
    for (int64_t i = 0; i < R;) {  // one download per run of local rows at consecutive positions
      if (pos[size_t(i)] < c0 || pos[size_t(i)] >= c0 + n) {
        ++i;
        continue;
      }
      int64_t e = i + 1;
      while (e < R && pos[size_t(e)] == pos[size_t(e - 1)] + 1 && pos[size_t(e)] < c0 + n) ++e;
      for (int64_t j = i; j < e; ++j) mine.push_back(pos[size_t(j)] - c0);
      vals.resize(size_t(int64_t(mine.size()) * D));
      be.download(hidden.slab(i, e), vals.data() + (int64_t(mine.size()) - (e - i)) * D);
      i = e;
    }
    const std::vector<float> all = gather_rows(cp, mine, vals, D, n);
    const DTensor h = be.upload(all.data(), {n, D}, be.act_dtype());
    model.mtp_extend(tokens.data() + c0, {0, n}, h, {&st});
  }
}

}  // namespace

namespace {

// Greedy / sampled continuation of B documents (docs[b], state *st[b] after its prompt, lg [B, V]
// the logits of its last token; tokens appended to *ids[b]). Every document still generating gives
// one token to the same forward; each step chooses from the last logits, stops a document at EOS or
// the limit, else forwards its token, so every document's tokens equal its own decode. Greedy steps
// take the argmax on the backend (Model::greedy: the same choice as choose_token, but only the ids
// leave the device, not B x V logits); sampling downloads each row. A finished document stays in
// the step's batch (its rows are computed and dropped) until half the batch has finished: the
// decode graphs are captured again only when the batch shrinks, log2(B) times at most, not once per
// finished document.
// Speculative continuation (DESIGN §11, job/speculative.hpp) of the same documents: each step
// every live document forwards its current token and its draft (n-gram matches in its prompt and
// what it generated) in one packed verify forward; the drafts are accepted while each equals the
// model's choice at the row before (greedy: the argmax; sampling: rejection sampling, the residual
// on rejection) and the model's own choice at the first rejected row (or after the last draft)
// becomes the next current token; every layer then keeps the verified rows of the accepted prefix
// (Model::spec_keep). A document's token choices are those of plain decoding: greedy equal token
// for token, sampling equal in distribution (with no draft, the same draw as choose_token).
void spec_decode_batch(const Model& model, const std::vector<int64_t>& docs, const std::vector<Model::State*>& st,
                       const std::vector<float>& lg, const ModeParams& p, const std::function<void()>& tick,
                       const std::vector<std::vector<int32_t>*>& ids,
                       const std::vector<const std::vector<int32_t>*>& prompts, const std::vector<DocStats*>& dst,
                       WorkStats* stats) {
  const int64_t V = model.config().vocab_size;
  const size_t B = docs.size();
  const bool greedy = p.temperature <= 0.0;
  const bool mtp = p.speculative == "mtp";
  DZ_CHECK(p.speculative == "ngram" || (p.speculative == "oracle" && p.oracle) || (mtp && model.has_mtp()),
           "--speculative ", p.speculative, ": drafts are ngram, oracle (with a previous run's output) or mtp (with the "
           "model loaded with its MTP layer)");
  DZ_CHECK(p.draft_tokens >= 1, "--draft-tokens must be >= 1 (got ", p.draft_tokens, ")");
  DZ_CHECK(prompts.size() == B && dst.size() == B && ids.size() == B, "speculative decode: ", B, " documents, ",
           prompts.size(), " prompts, ", dst.size(), " stats");
  WorkStats::Timer timer(stats, "decode");
  std::vector<std::unique_ptr<Drafter>> dr;
  for (size_t b = 0; b < B; ++b) {
    if (mtp) {
      dr.push_back(nullptr);  // Model::mtp_draft
    } else if (p.speculative == "oracle") {
      DZ_CHECK(docs[b] >= 0 && docs[b] < int64_t(p.oracle->size()), "oracle drafts: no document ", docs[b]);
      dr.push_back(std::make_unique<OracleDrafter>((*p.oracle)[size_t(docs[b])]));
    } else {
      dr.push_back(std::make_unique<NgramDrafter>(*prompts[b]));
    }
  }
  std::vector<char> live(B, 1);
  std::vector<int32_t> cur(B, 0);  // the chosen token a live document forwards next
  auto emit = [&](size_t b, int32_t tok) {  // false: the document is finished
    ids[b]->push_back(tok);
    if (dr[b]) dr[b]->push(tok);
    if (tok == model.config().eos_token_id || int64_t(ids[b]->size()) >= p.max_new_tokens) live[b] = 0;
    return bool(live[b]);
  };
  for (size_t b = 0; b < B; ++b) {
    const int32_t tok = choose_token(lg.data() + int64_t(b) * V, V, p.temperature, p.seed, docs[b], 0);
    if (emit(b, tok)) cur[b] = tok;
  }
  std::vector<int32_t> row_ids;
  std::vector<float> row_lg;
  int64_t steps = 0, drafted = 0, accepted = 0;
  for (;;) {
    std::vector<size_t> act;
    std::vector<std::vector<int32_t>> drafts;
    std::vector<int32_t> toks;
    std::vector<int64_t> cu{0};
    std::vector<Model::State*> sp;
    std::vector<int32_t> mcur;
    std::vector<int64_t> mk;
    for (size_t b = 0; b < B; ++b) {
      if (!live[b]) continue;
      // at most the tokens still to generate, less the one the model adds after the drafts
      const int64_t room = p.max_new_tokens - int64_t(ids[b]->size()) - 1;
      sp.push_back(st[b]);
      act.push_back(b);
      if (mtp) {
        mcur.push_back(cur[b]), mk.push_back(std::min(p.draft_tokens, room));
        continue;
      }
      drafts.push_back(dr[b]->draft(std::min(p.draft_tokens, room)));
    }
    if (act.empty()) break;
    if (mtp) {
      WorkStats::Timer td(stats, "spec_draft");
      drafts = model.mtp_draft(mcur, sp, mk);
    }
    for (size_t i = 0; i < act.size(); ++i) {
      const size_t b = act[i];
      toks.push_back(cur[b]);
      toks.insert(toks.end(), drafts[i].begin(), drafts[i].end());
      cu.push_back(int64_t(toks.size()));
    }
    const int64_t rows = int64_t(toks.size());
    DTensor h, mtp_in;  // mtp_in: what the MTP layer reads of the verify rows (h, or V4's streams)
    {
      WorkStats::Timer tv(stats, "spec_verify");  // the snapshot, the verify forward, the row choices
      model.spec_begin(sp, p.spec_restore);
      h = model.forward_packed(toks.data(), cu, sp, tick, nullptr, mtp ? &mtp_in : nullptr);
      if (greedy) {
        row_ids.resize(size_t(rows));
        model.greedy(h, row_ids.data());
      } else {
        row_lg.resize(size_t(rows * V));
        model.logits(h, row_lg.data());
      }
    }
    ++steps;
    std::vector<int64_t> keep(act.size());
    for (size_t i = 0; i < act.size(); ++i) {
      const size_t b = act[i];
      const std::vector<int32_t>& d = drafts[i];
      const int64_t k = int64_t(d.size()), r0 = cu[i];
      int64_t a = 0;
      for (int64_t j = 0; j <= k; ++j) {
        const int64_t idx = int64_t(ids[b]->size());  // the generated tokens before this one
        const float* row = greedy ? nullptr : row_lg.data() + (r0 + j) * V;
        bool acc = false;
        int32_t tok;
        if (greedy) {
          tok = row_ids[size_t(r0 + j)];
          acc = j < k && tok == d[size_t(j)];
        } else if (j < k) {
          tok = accept_or_resample(row, V, p.temperature, d[size_t(j)], spec_uniform(p.seed, docs[b], idx, 0),
                                   spec_uniform(p.seed, docs[b], idx, 1), &acc);
        } else {
          tok = choose_token(row, V, p.temperature, p.seed, docs[b], idx);
        }
        a += acc;
        if (!emit(b, tok)) break;
        if (!acc) {  // the model's own token: forwarded next step
          cur[b] = tok;
          break;
        }
      }
      keep[i] = a + 1;  // the current token and the accepted drafts
      dst[b]->spec_steps += 1, dst[b]->spec_drafted += k, dst[b]->spec_accepted += a;
      drafted += k, accepted += a;
    }
    {
      WorkStats::Timer tr(stats, "spec_restore");
      model.spec_keep(sp, keep);
    }
    if (mtp) {  // the MTP layer takes the kept rows of documents still generating (their next token known)
      WorkStats::Timer td(stats, "spec_draft");
      std::vector<int32_t> mt;
      std::vector<int64_t> mcu{0};
      std::vector<Model::State*> ms;
      std::vector<std::pair<int64_t, int64_t>> runs;  // (verify row, count)
      for (size_t i = 0; i < act.size(); ++i) {
        if (!live[act[i]]) continue;
        mt.insert(mt.end(), toks.begin() + cu[i], toks.begin() + cu[i] + keep[i]);
        mcu.push_back(int64_t(mt.size()));
        ms.push_back(sp[i]);
        runs.push_back({cu[i], keep[i]});
      }
      if (!ms.empty()) {
        Backend& be = model.backend();
        DTensor hk = be.act({mcu.back(), mtp_in.cols()});
        for (size_t i = 0; i < runs.size(); ++i) be.copy_rows(mtp_in, runs[i].first, hk, mcu[i], runs[i].second);
        model.mtp_extend(mt.data(), mcu, hk, ms, nullptr, true);  // forwarded with the next first drafts
      }
    }
  }
  if (stats) {
    stats->counts["decode_steps"] += steps;
    stats->counts["spec_drafted"] += drafted;
    stats->counts["spec_accepted"] += accepted;
  }
}

void decode_batch(const Model& model, const std::vector<int64_t>& docs, const std::vector<Model::State*>& st,
                  std::vector<float>& lg, const ModeParams& p, const std::function<void()>& tick,
                  const std::vector<std::vector<int32_t>*>& ids, const std::vector<const std::vector<int32_t>*>& prompts,
                  const std::vector<DocStats*>& dst, WorkStats* stats) {
  if (!p.speculative.empty()) {
    spec_decode_batch(model, docs, st, lg, p, tick, ids, prompts, dst, stats);
    return;
  }
  const int64_t V = model.config().vocab_size;
  const size_t B = docs.size();
  const bool greedy = p.temperature <= 0.0;
  WorkStats::Timer timer(stats, "decode");
  DecodeRunner runner(model, p.decode_graphs && model.backend().supports_graphs());
  std::vector<size_t> batch(B);  // the documents of the step's forward
  for (size_t b = 0; b < B; ++b) batch[b] = b;
  std::vector<char> live(B, 1);
  std::vector<int32_t> last(B, 0);  // a finished document's filler token: its last one
  std::vector<int32_t> next(B, -1);  // greedy: the token the last step's logits chose per document
  std::vector<int32_t> step_ids;     // [batch]
  std::vector<float> step_lg;        // sampling: [batch, V], allocated once (the batch only shrinks)
  size_t n_live = B;
  int64_t steps = 0;
  for (int64_t s = 0; s < p.max_new_tokens && n_live > 0; ++s) {
    for (size_t b : batch) {
      if (!live[b]) continue;
      // the first token from the prompt's last logits (on the host); later greedy ones from the step
      const int32_t tok = greedy && s > 0 ? next[b]
                                          : choose_token(lg.data() + int64_t(b) * V, V, p.temperature, p.seed, docs[b], s);
      ids[b]->push_back(tok);
      last[b] = tok;
      if (tok == model.config().eos_token_id || s + 1 == p.max_new_tokens) live[b] = 0, --n_live;
    }
    if (n_live == 0) break;
    if (2 * n_live <= batch.size()) {
      std::vector<size_t> keep;
      for (size_t b : batch)
        if (live[b]) keep.push_back(b);
      batch = keep;
    }
    std::vector<int32_t> toks;
    std::vector<Model::State*> st1;
    for (size_t b : batch) {
      toks.push_back(last[b]);
      st1.push_back(st[b]);
    }
    const DTensor h = runner.step(toks.data(), st1, tick);
    ++steps;
    if (greedy) {
      step_ids.resize(batch.size());
      model.greedy(h, step_ids.data());
      for (size_t i = 0; i < batch.size(); ++i) next[batch[i]] = step_ids[i];
    } else {
      step_lg.resize(batch.size() * size_t(V));
      model.logits(h, step_lg.data());
      for (size_t i = 0; i < batch.size(); ++i)
        if (live[batch[i]])
          std::copy(step_lg.begin() + int64_t(i) * V, step_lg.begin() + int64_t(i + 1) * V,
                    lg.begin() + int64_t(batch[i]) * V);
    }
  }
  if (stats) {  // the report's decode counters (per rank)
    stats->counts["decode_steps"] += steps;
    stats->counts["decode_graph_captures"] += runner.captures();
    stats->counts["decode_graph_replays"] += runner.replays();
  }
}

// One document's continuation. Every CP rank holds the whole document's state after the prefill,
// so all of them decode the same tokens (TP collectives run inside each CP rank's TP group).
void generate(const Model& model, int64_t doc, const std::vector<int32_t>& prompt, const ModeParams& p,
              Model::State& st, std::vector<float>& last, const std::function<void()>& tick, DocResult& r,
              WorkStats* stats) {
  decode_batch(model, {doc}, {&st}, last, p, tick, {&r.ids}, {&prompt}, {&r.stats}, stats);
}

// The serial prefill in chunks of p.chunk_tokens: each chunk's rows go through the LM head as
// soon as they exist (log-probs need the next token, which the document gives), so neither the
// activations nor the logits ever cover more than one chunk.
DocResult chunked_document(const Model& model, int64_t doc, const std::vector<int32_t>& tokens, const ModeParams& p,
                           const std::function<void()>& tick, std::chrono::steady_clock::time_point t0,
                           WorkStats* stats) {
  const LmHead& head = model.head();
  const int64_t L = int64_t(tokens.size()), V = model.config().vocab_size, C = p.chunk_tokens;
  DocResult r;
  r.doc = doc;
  r.stats.tokens = L;
  Model::State st = model.make_state();
  const int64_t j0 = first_scored_row(p, doc);
  std::vector<uint8_t> greedy;
  if (p.mode == OutputMode::Logprobs) r.values.resize(size_t(L - 1)), greedy.resize(size_t(L - 1));
  if (p.mode == OutputMode::TopK) {
    DZ_CHECK(p.topk >= 1 && p.topk <= V, "--topk ", p.topk, " must be in [1, vocab size ", V, "]");
    r.ids.resize(size_t(L * p.topk));
    r.values.resize(size_t(L * p.topk));
  }
  std::vector<float> last(static_cast<size_t>(V));
  for (int64_t c0 = 0; c0 < L; c0 += C) {
    const int64_t n = std::min(C, L - c0);
    const bool mtp = p.mode == OutputMode::Generate && p.speculative == "mtp";
    DTensor mtp_in;
    const DTensor h = model.forward(tokens.data() + c0, n, st, tick, nullptr, stats, mtp ? &mtp_in : nullptr);
    if (mtp) model.mtp_extend(tokens.data() + c0, {0, n}, mtp_in, {&st});
    WorkStats::Timer timer(stats, "lm_head");
    switch (p.mode) {
      case OutputMode::Logprobs: {
        // the chunk's rows with a next token, from the first scored one
        const int64_t a = std::max(c0, j0), e = std::min(c0 + n, L - 1);
        if (e > a)
          head.logprobs(h.slab(a - c0, e - c0), tokens.data() + a + 1, r.values.data() + a, greedy.data() + a);
        break;
      }
      case OutputMode::TopK:
        head.topk(h, p.topk, r.ids.data() + c0 * p.topk, r.values.data() + c0 * p.topk);
        break;
      case OutputMode::LastLogits:
      case OutputMode::Generate:
        if (c0 + n == L) model.logits(h.slab(n - 1, n), last.data());
        break;
    }
  }
  if (p.mode == OutputMode::Logprobs) finish_scores(r, j0, greedy);
  if (p.mode == OutputMode::LastLogits) r.values = std::move(last);
  if (p.mode == OutputMode::Generate) generate(model, doc, tokens, p, st, last, tick, r, stats);
  r.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

DocResult compute_document(const Model& model, int64_t doc, const std::vector<int32_t>& tokens, const ModeParams& p,
                           const std::function<void()>& tick, const DocParallel& par) {
  auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& cfg = model.config();
  const LmHead& head = model.head();
  const int64_t L = int64_t(tokens.size()), V = cfg.vocab_size, D = cfg.hidden_size;
  DZ_CHECK(L > 0, "document ", doc, " is empty");

  // The serial prefill: in chunks, or the whole document as a batch of one (compute_packed).
  const Comm self;  // a group of one: the serial / segmented case
  const Collectives& cp = par.cp ? *par.cp : static_cast<const Collectives&>(self);
  if (cp.size() == 1 && par.segments == 1) {
    if (p.chunk_tokens > 0 && L > p.chunk_tokens) return chunked_document(model, doc, tokens, p, tick, t0, par.stats);
    return compute_packed(model, {doc}, {tokens}, p, tick, par.stats)[0];
  }

  // ---- the parallel prefill: this rank's rows of the zigzag layout ----
  DocResult r;
  r.doc = doc;
  r.stats.tokens = L;
  Model::State st = model.make_state();
  SeqLayout lay = SeqLayout::zigzag(L, cp.size(), cp.rank(), par.segments);
  std::vector<int64_t> pos = lay.local_positions();  // global position of each local row
  Backend& be = model.backend();
  std::vector<int32_t> local(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) local[i] = tokens[size_t(pos[i])];
  CpCtx ctx{&cp, &lay, par.stats, par.cp ? par.cp_dev : nullptr};
  const bool mtp = p.mode == OutputMode::Generate && p.speculative == "mtp";
  DTensor mtp_in;  // what the MTP layer reads of the local rows (hidden, or DeepSeek-V4's streams)
  const DTensor hidden = model.forward_cp(local.data(), ctx, st, tick, mtp ? &mtp_in : nullptr);  // [R, D]
  const int64_t R = int64_t(pos.size());
  // The rank holding position L-1 shares that row's hidden state (last-logits, generation).
  auto last_hidden = [&]() {
    std::vector<float> h(static_cast<size_t>(D));
    int owner = lay.owner[size_t(lay.n_seg() - 1)];
    for (int j = lay.n_seg() - 1; j >= 0; --j)
      if (lay.seg_len(j) > 0) {
        owner = lay.owner[size_t(j)];
        break;
      }
    if (cp.rank() == owner) be.download(hidden.slab(R - 1, R), h.data());
    cp.bcast_vec(h, owner);
    return be.upload(h.data(), {1, D}, be.act_dtype());
  };

  switch (p.mode) {
    case OutputMode::Logprobs: {
      const int64_t j0 = first_scored_row(p, doc);
      std::vector<int64_t> qpos;
      std::vector<int32_t> tgt;
      std::vector<int64_t> rows;
      for (int64_t i = 0; i < R; ++i)
        if (pos[size_t(i)] + 1 < L && pos[size_t(i)] >= j0) {
          qpos.push_back(pos[size_t(i)]);
          tgt.push_back(tokens[size_t(pos[size_t(i)] + 1)]);
          rows.push_back(i);
        }
      // Local rows are contiguous per segment: copy per maximal run of usable rows.
      std::vector<float> lp(qpos.size());
      std::vector<uint8_t> gf(qpos.size());
      DTensor h2 = be.act({int64_t(rows.size()), D});
      for (size_t k = 0; k < rows.size();) {
        size_t e = k + 1;
        while (e < rows.size() && rows[e] == rows[e - 1] + 1) ++e;
        be.copy_rows(hidden, rows[k], h2, int64_t(k), int64_t(e - k));
        k = e;
      }
      {
        WorkStats::Timer timer(par.stats, "lm_head");
        head.logprobs(h2, tgt.data(), lp.data(), gf.data());
      }
      r.values = gather_rows(cp, qpos, lp, 1, L - 1);
      finish_scores(r, j0, gather_rows(cp, qpos, gf, 1, L - 1));
      break;
    }
    case OutputMode::TopK: {
      const int64_t K = p.topk;
      DZ_CHECK(K >= 1 && K <= V, "--topk ", K, " must be in [1, vocab size ", V, "]");
      std::vector<int32_t> ids(static_cast<size_t>(R * K));
      std::vector<float> lps(static_cast<size_t>(R * K));
      {
        WorkStats::Timer timer(par.stats, "lm_head");
        head.topk(hidden, K, ids.data(), lps.data());
      }
      r.ids = gather_rows(cp, pos, ids, K, L);
      r.values = gather_rows(cp, pos, lps, K, L);
      break;
    }
    case OutputMode::LastLogits: {
      r.values.resize(static_cast<size_t>(V));
      model.logits(last_hidden(), r.values.data());
      break;
    }
    case OutputMode::Generate: {
      std::vector<float> last(static_cast<size_t>(V));
      model.logits(last_hidden(), last.data());
      if (mtp) mtp_prefill_cp(model, tokens, mtp_in, pos, cp, st);
      generate(model, doc, tokens, p, st, last, tick, r, par.stats);
      break;
    }
  }
  r.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<std::vector<int64_t>> pack_batches(const std::vector<int64_t>& todo, const std::vector<int64_t>& lengths,
                                               int64_t max_tokens) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> cur;
  int64_t cur_tokens = 0;
  for (int64_t d : todo) {
    const int64_t L = lengths[size_t(d)];
    if (max_tokens <= 0 || L >= max_tokens) {
      out.push_back({d});
      continue;
    }
    if (!cur.empty() && cur_tokens + L > max_tokens) {
      out.push_back(std::move(cur));
      cur.clear();
      cur_tokens = 0;
    }
    cur.push_back(d);
    cur_tokens += L;
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

std::vector<DocResult> compute_packed(const Model& model, const std::vector<int64_t>& docs,
                                      const std::vector<std::vector<int32_t>>& tokens, const ModeParams& p,
                                      const std::function<void()>& tick, WorkStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t B = docs.size();
  DZ_CHECK(B >= 1 && tokens.size() == B, "compute_packed: ", B, " documents, ", tokens.size(), " token lists");
  const int64_t V = model.config().vocab_size, D = model.config().hidden_size;
  const LmHead& head = model.head();
  Backend& be = model.backend();
  std::vector<int64_t> cu(B + 1, 0);
  std::vector<int32_t> all;
  for (size_t b = 0; b < B; ++b) {
    DZ_CHECK(!tokens[b].empty(), "document ", docs[b], " is empty");
    cu[b + 1] = cu[b] + int64_t(tokens[b].size());
    all.insert(all.end(), tokens[b].begin(), tokens[b].end());
  }
  std::vector<Model::State> states;
  for (size_t b = 0; b < B; ++b) states.push_back(model.make_state());
  std::vector<Model::State*> sp;
  for (auto& st : states) sp.push_back(&st);
  const bool mtp = p.mode == OutputMode::Generate && p.speculative == "mtp";
  DTensor mtp_in;
  const DTensor hidden = model.forward_packed(all.data(), cu, sp, tick, stats, mtp ? &mtp_in : nullptr);
  std::vector<DocResult> res(B);
  for (size_t b = 0; b < B; ++b) {
    res[b].doc = docs[b];
    res[b].stats.tokens = cu[b + 1] - cu[b];
  }
  switch (p.mode) {
    case OutputMode::Logprobs: {
      // Every scored row (a next token, from the document's first scored row), all documents in
      // one LM-head call.
      std::vector<int64_t> j0(B), so{0};  // so: offsets of each document's scored rows
      std::vector<int32_t> tgt;
      for (size_t b = 0; b < B; ++b) {
        const int64_t L = cu[b + 1] - cu[b];
        j0[b] = std::min(first_scored_row(p, docs[b]), L - 1);
        tgt.insert(tgt.end(), tokens[b].begin() + j0[b] + 1, tokens[b].end());
        so.push_back(int64_t(tgt.size()));
      }
      const int64_t n = so[B];
      std::vector<float> lp(static_cast<size_t>(n));
      std::vector<uint8_t> gf(static_cast<size_t>(n));
      if (n > 0) {
        DTensor h2 = be.act({n, D});
        for (size_t b = 0; b < B; ++b)
          if (so[b + 1] > so[b]) be.copy_rows(hidden, cu[b] + j0[b], h2, so[b], so[b + 1] - so[b]);
        WorkStats::Timer timer(stats, "lm_head");
        head.logprobs(h2, tgt.data(), lp.data(), gf.data());
      }
      for (size_t b = 0; b < B; ++b) {
        const int64_t L = cu[b + 1] - cu[b];
        res[b].values.assign(size_t(L - 1), 0.f);
        std::vector<uint8_t> g(size_t(L - 1), 0);
        std::copy(lp.begin() + so[b], lp.begin() + so[b + 1], res[b].values.begin() + j0[b]);
        std::copy(gf.begin() + so[b], gf.begin() + so[b + 1], g.begin() + j0[b]);
        finish_scores(res[b], j0[b], g);
      }
      break;
    }
    case OutputMode::TopK: {
      const int64_t K = p.topk;
      DZ_CHECK(K >= 1 && K <= V, "--topk ", K, " must be in [1, vocab size ", V, "]");
      std::vector<int32_t> ids(static_cast<size_t>(cu[B] * K));
      std::vector<float> lps(static_cast<size_t>(cu[B] * K));
      {
        WorkStats::Timer timer(stats, "lm_head");
        head.topk(hidden, K, ids.data(), lps.data());
      }
      for (size_t b = 0; b < B; ++b) {
        res[b].ids.assign(ids.begin() + cu[b] * K, ids.begin() + cu[b + 1] * K);
        res[b].values.assign(lps.begin() + cu[b] * K, lps.begin() + cu[b + 1] * K);
      }
      break;
    }
    case OutputMode::LastLogits:
    case OutputMode::Generate: {
      DTensor last_rows = be.act({int64_t(B), D});
      for (size_t b = 0; b < B; ++b) be.copy_rows(hidden, cu[b + 1] - 1, last_rows, int64_t(b), 1);
      std::vector<float> lg(static_cast<size_t>(int64_t(B) * V));
      {
        WorkStats::Timer timer(stats, "lm_head");
        model.logits(last_rows, lg.data());
      }
      if (p.mode == OutputMode::LastLogits) {
        if (B == 1) {  // no copy: the host's work after the device's last step is the forward's time too
          res[0].values = std::move(lg);
          break;
        }
        for (size_t b = 0; b < B; ++b) res[b].values.assign(lg.begin() + int64_t(b) * V, lg.begin() + int64_t(b + 1) * V);
        break;
      }
      std::vector<std::vector<int32_t>*> ids;
      for (auto& r : res) ids.push_back(&r.ids);
      std::vector<const std::vector<int32_t>*> prompts;
      std::vector<DocStats*> dst;
      for (size_t b = 0; b < B; ++b) prompts.push_back(&tokens[b]), dst.push_back(&res[b].stats);
      if (mtp) model.mtp_extend(all.data(), cu, mtp_in, sp);  // the prompts' MTP rows
      decode_batch(model, docs, sp, lg, p, tick, ids, prompts, dst, stats);  // sp: the states of the prefill
      break;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t b = 0; b < B; ++b) res[b].stats.seconds = secs * double(res[b].stats.tokens) / double(cu[B]);
  return res;
}

namespace {
struct Header {
  int64_t doc, tokens;
  double seconds;
  int32_t rank, is_greedy;
  int64_t spec_steps, spec_drafted, spec_accepted;
  int64_t score_from, scored, bytes;
  double nll;
  uint64_t n_ids, n_values;
};
}  // namespace

std::vector<char> pack(const DocResult& r) {
  Header h{r.doc,
           r.stats.tokens,
           r.stats.seconds,
           r.stats.rank,
           int32_t(r.stats.is_greedy),
           r.stats.spec_steps,
           r.stats.spec_drafted,
           r.stats.spec_accepted,
           r.stats.score_from,
           r.stats.scored,
           r.stats.bytes,
           r.stats.nll,
           r.ids.size(),
           r.values.size()};
  std::vector<char> b(sizeof h + r.ids.size() * 4 + r.values.size() * 4);
  std::memcpy(b.data(), &h, sizeof h);
  if (!r.ids.empty()) std::memcpy(b.data() + sizeof h, r.ids.data(), r.ids.size() * 4);
  if (!r.values.empty()) std::memcpy(b.data() + sizeof h + r.ids.size() * 4, r.values.data(), r.values.size() * 4);
  return b;
}

DocResult unpack(const std::vector<char>& b) {
  Header h;
  DZ_CHECK(b.size() >= sizeof h, "result message too short (", b.size(), " bytes)");
  std::memcpy(&h, b.data(), sizeof h);
  DZ_CHECK(b.size() == sizeof h + (h.n_ids + h.n_values) * 4, "result message of ", b.size(), " bytes is malformed");
  DocResult r;
  r.doc = h.doc;
  r.stats.tokens = h.tokens;
  r.stats.seconds = h.seconds;
  r.stats.rank = h.rank;
  r.stats.spec_steps = h.spec_steps, r.stats.spec_drafted = h.spec_drafted, r.stats.spec_accepted = h.spec_accepted;
  r.stats.score_from = h.score_from, r.stats.scored = h.scored, r.stats.bytes = h.bytes, r.stats.nll = h.nll;
  r.stats.is_greedy = uint8_t(h.is_greedy);
  r.ids.resize(size_t(h.n_ids));
  r.values.resize(size_t(h.n_values));
  if (h.n_ids) std::memcpy(r.ids.data(), b.data() + sizeof h, h.n_ids * 4);
  if (h.n_values) std::memcpy(r.values.data(), b.data() + sizeof h + h.n_ids * 4, h.n_values * 4);
  return r;
}

}  // namespace dz
