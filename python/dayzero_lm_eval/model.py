"""The lm-eval model "dayzero": every request of one harness call becomes one dayzero batch job.

- loglikelihood (context, continuation): the document is context + continuation tokens with the
  input's /score_from at the continuation; --mode logprobs gives its summed log-likelihood (the
  output's /stats/nll, negated) and is_greedy (/stats/is_greedy). Contexts of any length: nothing is
  truncated, the job's CP layout spreads long ones.
- loglikelihood_rolling (string,): [prefix token] + the string's tokens, every token scored once
  with the whole document before it (no windows).
- generate_until (context, gen_kwargs): --mode generate with max_gen_toks new tokens (greedy, or
  --temperature when do_sample / a temperature asks for it), decoded and cut at the first stop
  sequence of `until`.
Tokenization is the checkpoint's tokenizer.json (HF tokenizers), split as lm-eval's HF model does:
the whole text encoded once, the context's tokens a prefix of it.
"""
import json
import os
import shlex
import shutil
import subprocess
import tempfile

import h5py
import numpy as np
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model


def _bool(v):
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")


@register_model("dayzero")
class DayzeroLM(LM):
    def __init__(self, model, np=1, cp=1, tp=1, backend="cpu", launcher="mpirun", mpi_args="--oversubscribe",
                 dayzero=None, tokenizer=None, workdir=None, max_gen_toks=256, prefix_token_id=None,
                 add_special_tokens=False, extra_args="", keep_files=False, batch_size=None, max_batch_size=None,
                 device=None, **kwargs):
        super().__init__()
        self.model = str(model)
        if not os.path.isfile(os.path.join(self.model, "config.json")):
            raise ValueError(f"dayzero: {self.model} is not a model directory (no config.json)")
        self.np, self.cp, self.tp = int(np), int(cp), int(tp)
        if self.np % (self.cp * self.tp):
            raise ValueError(f"dayzero: np={self.np} is not a multiple of cp x tp = {self.cp * self.tp}")
        self.backend, self.launcher, self.mpi_args = str(backend), str(launcher), str(mpi_args or "")
        self.dayzero = str(dayzero or os.environ.get("DAYZERO_BIN") or shutil.which("dayzero") or "")
        if not self.dayzero or not os.path.exists(self.dayzero):
            raise ValueError("dayzero: no dayzero binary (model_args dayzero=PATH, $DAYZERO_BIN, or on PATH)")
        from tokenizers import Tokenizer

        tj = str(tokenizer or os.path.join(self.model, "tokenizer.json"))
        if not os.path.isfile(tj):
            raise ValueError(f"dayzero: {tj}: no tokenizer.json (model_args tokenizer=PATH)")
        self.tok = Tokenizer.from_file(tj)
        self.add_special = _bool(add_special_tokens)
        cfg = json.load(open(os.path.join(self.model, "config.json")))
        cfg = cfg.get("text_config") or cfg
        self.vocab = int(cfg["vocab_size"])
        self.eos = cfg.get("eos_token_id")
        self.eos = self.eos[0] if isinstance(self.eos, list) else self.eos
        bos = cfg.get("bos_token_id")
        # the token a rolling log-likelihood and an empty context start from (lm-eval: BOS, else EOS)
        self.prefix = int(prefix_token_id) if prefix_token_id is not None else int(bos if bos is not None else self.eos)
        self.max_gen_toks = int(max_gen_toks)
        self.extra = shlex.split(str(extra_args or "").replace(";", " "))
        self.workdir = workdir
        self.keep = _bool(keep_files)
        self.jobs = 0

    # ---- tokenization (as lm-eval's HF model) ----
    def _enc(self, s):
        return self.tok.encode(s, add_special_tokens=self.add_special).ids if s else []

    def _pair(self, context, continuation):
        n = len(context) - len(context.rstrip())  # trailing spaces of the context go with the continuation
        if n:
            continuation, context = context[-n:] + continuation, context[:-n]
        whole = self._enc(context + continuation)
        ctx = self._enc(context)
        if not ctx:
            return [self.prefix], self._enc(continuation)
        return ctx, whole[len(ctx):]

    # ---- the batch job ----
    def _job(self, docs, score_from=None, mode="logprobs", max_new=None, temperature=0.0):
        d = tempfile.mkdtemp(prefix="dayzero_lm_eval_", dir=self.workdir)
        inp, out = os.path.join(d, "in.h5"), os.path.join(d, "out.h5")
        for i, t in enumerate(docs):
            if not t:
                raise ValueError(f"dayzero: request {i} has no tokens")
            bad = [x for x in t if not 0 <= x < self.vocab]
            if bad:
                raise ValueError(f"dayzero: request {i}: token id {bad[0]} outside the model's vocabulary ({self.vocab})")
        with h5py.File(inp, "w") as f:
            f["tokens"] = np.array([x for t in docs for x in t], dtype=np.int32)
            f["offsets"] = np.cumsum([0] + [len(t) for t in docs]).astype(np.int64)
            if score_from is not None:
                f["score_from"] = np.array(score_from, dtype=np.int64)
        cmd = [self.dayzero, "run", "--model", self.model, "--input", inp, "--output", out, "--mode", mode,
               "--backend", self.backend, "--cp", str(self.cp), "--tp", str(self.tp)]
        if mode == "generate":
            cmd += ["--max-new-tokens", str(max_new)]
            if temperature > 0:
                cmd += ["--temperature", str(temperature)]
        cmd += self.extra
        if self.launcher == "mpirun":
            cmd = ["mpirun", "-np", str(self.np)] + shlex.split(self.mpi_args) + cmd
        elif self.launcher == "srun":
            cmd = ["srun", "-n", str(self.np)] + shlex.split(self.mpi_args) + cmd
        elif self.launcher != "none":
            raise ValueError(f"dayzero: launcher must be mpirun, srun or none (got {self.launcher})")
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.jobs += 1
        if r.returncode != 0:
            raise RuntimeError(f"dayzero job failed (exit {r.returncode}): {' '.join(cmd)}\n{r.stdout[-4000:]}")
        f = h5py.File(out, "r")
        return d, f

    def _done(self, d, f):
        f.close()
        if not self.keep:
            shutil.rmtree(d, ignore_errors=True)

    def _scores(self, kind, requests, docs, score_from):
        """One logprobs job; per request (log-likelihood, is_greedy), cached under `kind`."""
        d, f = self._job(docs, score_from)
        nll, greedy = f["stats/nll"][:], f["stats/is_greedy"][:]
        self._done(d, f)
        res = [(-float(nll[i]), bool(greedy[i])) for i in range(len(docs))]
        for req, r in zip(requests, res):
            self.cache_hook.add_partial(kind, req.args, r if kind == "loglikelihood" else r[0])
        return res

    # ---- the harness's requests ----
    def loglikelihood(self, requests, disable_tqdm=False):
        if not requests:
            return []
        docs, sf = [], []
        for req in requests:
            ctx, cont = self._pair(*req.args)
            if not cont:
                raise ValueError(f"dayzero: the continuation {req.args[1]!r} has no tokens")
            docs.append(ctx + cont)
            sf.append(len(ctx))
        return self._scores("loglikelihood", requests, docs, sf)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        if not requests:
            return []
        docs = [[self.prefix] + self._enc(req.args[0]) for req in requests]
        return [ll for ll, _ in self._scores("loglikelihood_rolling", requests, docs, [1] * len(docs))]

    def generate_until(self, requests, disable_tqdm=False):
        if not requests:
            return []
        out = [None] * len(requests)
        groups = {}  # (max_new, temperature) -> request indices: one job each
        stops = []
        for i, req in enumerate(requests):
            ctx, kw = req.args[0], dict(req.args[1] or {})
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
            temp = float(kw.pop("temperature", 0.0) or 0.0)
            if not _bool(kw.pop("do_sample", temp > 0)):
                temp = 0.0
            stops.append(until)
            groups.setdefault((max_new, temp), []).append(i)
        for (max_new, temp), idx in groups.items():
            docs = [self._enc(requests[i].args[0]) or [self.prefix] for i in idx]
            d, f = self._job(docs, mode="generate", max_new=max_new, temperature=temp)
            g, go = f["generated"][:], f["generated_offsets"][:]
            for j, i in enumerate(idx):
                text = self.tok.decode([int(x) for x in g[go[j]:go[j + 1]]], skip_special_tokens=True)
                cut = [text.find(s) for s in stops[i] if s and s in text]
                out[i] = text[:min(cut)] if cut else text
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
            self._done(d, f)
        return out
