"""lm-evaluation-harness adapter for dayzero (issue 15, README "Evaluation").

Importing this package registers the model "dayzero" with lm-eval. `dayzero-lm-eval` is lm-eval's
own command line with it registered (lm-eval 0.4 has no plugin entry point for models):

    dayzero-lm-eval --model dayzero --model_args model=DIR,np=8,cp=2,tp=4,backend=cuda --tasks ...

or, from Python, `lm_eval.simple_evaluate(model=DayzeroLM(model=DIR, ...), tasks=[...])`.
"""
from .model import DayzeroLM  # noqa: F401  (registers "dayzero")
