"""Evaluate → register → promote: the held-out measurement of a drafter–verifier pair, handed to the registry.

The registry (``specdiff.registry``, MLflow only) records figures and compares them; it never loads a model or
imports the training package. What measures a pair is injected into it (``Registry(evaluator=...)``, a
``specdiff.registry.PairEvaluator``); ``HeldoutEvaluator`` is the one the platform uses, built from the training
package's evaluation pieces, and ``Registry`` here is the registry with it plugged in — the one jobs, the build and
re-alignment register and promote through.

    from specdiff.lifecycle.evaluate import Registry
    reg = Registry()                                    # MLFLOW_TRACKING_URI, else the embedded store
    drafter = reg.register_drafter("tiny", folder, verifier_version, spec)   # measured on spec, then registered
    ok, reason = reg.promote("tiny", drafter, spec)     # production pair re-measured if its figure is on another spec
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdiff.core.config import SamplingParams
from specdiff.distill.evaluate import alpha_plot, evaluate_drafter
from specdiff.distill.feature import evaluate_feature_drafter
from specdiff.distill.trajectories import load_verifier_model, sample_completions
from specdiff.distill.windows import heldout_prefixes
from specdiff.lineage.evaluation import EvalResult, HeldoutSpec, read_prompt_ids
from specdiff.models.drafter import load_drafter
from specdiff.models.feature_drafter import FeatureDrafter
from specdiff.models.hf import HFModel
from specdiff import registry


@torch.no_grad()
def evaluate_pair(drafter, verifier_model: torch.nn.Module, spec: HeldoutSpec) -> EvalResult:
    """``drafter`` (an ``HFDiffusionDrafter`` or a ``FeatureDrafter``) against ``verifier_model`` (a causal LM) on
    ``spec``: the verifier completes the spec's prompts (seeded), windows are cut at its offsets, and the drafter is
    scored on them (``distill.evaluate.evaluate_drafter`` / ``distill.feature.evaluate_feature_drafter``)."""
    sampling = SamplingParams(temperature=spec.temperature, top_p=spec.top_p)
    verifier = HFModel(verifier_model)
    prompts = read_prompt_ids(spec.prompts)
    completions, _, _ = sample_completions(verifier, prompts, spec.max_new_tokens, sampling, 0,
                                           torch.Generator().manual_seed(spec.seed))
    records = [{"prompt_ids": p, "completion_ids": c} for p, c in zip(prompts, completions.tolist())]
    prefixes = heldout_prefixes(records, spec.offsets)
    generator = torch.Generator().manual_seed(spec.seed)
    if isinstance(drafter, FeatureDrafter):
        return evaluate_feature_drafter(drafter, verifier, prefixes, spec.gamma, sampling, generator=generator)
    return evaluate_drafter(HFModel(drafter.model), drafter.config, verifier, prefixes, spec.gamma, sampling,
                            generator=generator)


class HeldoutEvaluator:
    """The registry's ``PairEvaluator``: loads both folders (the verifier in float32, so that a registry gives the
    same figures on every machine) and runs ``evaluate_pair``; draws α_j per position for the version's run."""

    def evaluate(self, drafter_dir: str | Path, verifier_dir: str | Path, spec: HeldoutSpec) -> EvalResult:
        verifier_model = load_verifier_model(verifier_dir)
        return evaluate_pair(load_drafter(drafter_dir, verifier=verifier_model), verifier_model, spec)

    def plot(self, result: EvalResult, path: str, label: str) -> str:
        return alpha_plot([(0, result)], path, label=label)


class Registry(registry.Registry):
    """``specdiff.registry.Registry`` measuring with ``HeldoutEvaluator`` unless another evaluator is given."""

    def __init__(self, uri: str | None = None, evaluator: registry.PairEvaluator | None = None):
        super().__init__(uri, evaluator=evaluator or HeldoutEvaluator())
