"""The decodes behind tests/test_lossless.py, importable by worker processes.

The statistical tests run 6000 seeded decodes per case; each seed's decode is independent, so the seeds are split
over a few spawned processes (one per core). Every process builds the same models from fixed seeds, so a count
does not depend on how the seeds were split.
"""

from __future__ import annotations

from collections import Counter

import torch

from helpers import FixedDrafter, tiny_llama
from specdiff import HFVerifier, SamplingParams, SpecConfig, SpeculativeDecoder, build_tree, greedy_accept
from specdiff.models.feature_drafter import build_feature_drafter
from specdiff.core.sampling import target_probs
from specdiff.core.selection import sample_candidates

V = 8
PROMPT = [1, 2, 3]

_built: dict[str, object] = {}


def init_worker() -> None:
    torch.set_num_threads(1)  # one process per core


def model():
    if "model" not in _built:
        _built["model"] = tiny_llama(V, seed=1, init_std=0.3, layers=1)
    return _built["model"]


def drafter(kind: str):
    """``fixed``: marginals peaked on tokens the verifier does not favour (acceptance is partial, so the selection
    rule matters); ``feature``: conditioned on the verifier's hidden states (random weights: it disagrees too)."""
    if kind not in _built:
        if kind == "fixed":
            g = torch.Generator().manual_seed(7)
            _built[kind] = FixedDrafter((torch.randn(4, V, generator=g) * 2.0).softmax(-1))
        elif kind == "feature":
            _built[kind] = build_feature_drafter(model(), num_layers=1, seed=3, init_from_verifier=False)
        else:
            raise ValueError(f"unknown drafter kind {kind!r}")
    return _built[kind]


def verifier_for(kind: str) -> HFVerifier:
    return HFVerifier(model(), tap_layers=getattr(drafter(kind), "tap_layers", None))


def biased_generate(kind: str, sampling: SamplingParams, spec: SpecConfig, seed: int) -> list[int]:
    """The known-wrong rule: run greedy acceptance (with coins) on every candidate, keep the longest."""
    gen = torch.Generator().manual_seed(seed)
    d = drafter(kind)
    session = verifier_for(kind).start(PROMPT)
    if getattr(d, "needs_features", False):
        marginals = d.propose(session.tokens, spec.gamma, session.features)
    else:
        marginals = d.propose(session.tokens, spec.gamma)
    candidates, _ = sample_candidates(marginals, spec.num_candidates, spec.draft_temperature, gen)
    tree = build_tree(session.tokens[-1], candidates)
    probs = target_probs(session.score(tree), sampling)
    verdicts = []
    for row in range(tree.candidates.shape[0]):
        path_probs = probs[torch.cat([torch.zeros(1, dtype=torch.long), tree.paths[row]])]
        verdicts.append(greedy_accept(tree.candidates[row], path_probs, gen))
    best = max(range(len(verdicts)), key=lambda r: verdicts[r].num_accepted)
    return verdicts[best].emitted(tree.candidates[best].tolist())


def count(rule: str, kind: str, sampling: SamplingParams, spec: SpecConfig, seeds: range) -> Counter:
    """The first two tokens of one decode per seed, counted. ``rule``: ``engine`` (SpeculativeDecoder) or
    ``biased`` (the negative control)."""
    if rule == "engine":
        decoder = SpeculativeDecoder(drafter(kind), verifier_for(kind))

        def generate(seed):
            return decoder.generate(PROMPT, max_new_tokens=3, sampling=sampling, spec=spec, seed=seed).tokens
    elif rule == "biased":
        def generate(seed):
            return biased_generate(kind, sampling, spec, seed)
    else:
        raise ValueError(f"unknown rule {rule!r}")
    return Counter(tuple(generate(seed)[:2]) for seed in seeds)
