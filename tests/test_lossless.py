"""T > 0: the output follows the verifier's distribution exactly (statistical test), and a biased rule fails it.

Tiny vocabulary (8 tokens), a verifier with peaky random weights and a drafter that disagrees with it. We compare
the empirical joint distribution of the first two generated tokens over many seeded runs with the verifier's exact
joint distribution (chi-square). The negative control, "verify all K candidates with coins and keep the longest",
lets the coins choose the candidate and must fail the same test.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from helpers import FixedDrafter, full_logprobs, tiny_llama
from specdiff import HFVerifier, SamplingParams, SpecConfig, SpeculativeDecoder, build_tree, greedy_accept
from specdiff.feature_drafter import build_feature_drafter
from specdiff.sampling import target_probs
from specdiff.selection import sample_candidates

V = 8
PROMPT = [1, 2, 3]
RUNS = 6000
PASS_P = 1e-3  # seeds are fixed, so each case passes or fails deterministically


@pytest.fixture(scope="module")
def model():
    return tiny_llama(V, seed=1, init_std=0.3, layers=1)


@pytest.fixture(scope="module")
def drafter():
    # Peaked on tokens the verifier does not favour: acceptance is partial, so the selection rule matters.
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, V, generator=g) * 2.0
    return FixedDrafter(logits.softmax(-1))


@pytest.fixture(scope="module")
def feature_drafter(model):
    # Conditioned on the verifier's hidden states (random weights: it disagrees with the verifier).
    return build_feature_drafter(model, num_layers=1, seed=3, init_from_verifier=False)


def verifier_for(model, drafter) -> HFVerifier:
    return HFVerifier(model, tap_layers=getattr(drafter, "tap_layers", None))


def exact_joint(model, sampling: SamplingParams) -> dict[tuple[int, int], float]:
    p1 = target_probs(full_logprobs(model, PROMPT)[-1], sampling)
    joint = {}
    for a in range(V):
        p2 = target_probs(full_logprobs(model, PROMPT + [a])[-1], sampling)
        for b in range(V):
            joint[(a, b)] = float(p1[a] * p2[b])
    return joint


def chi_square_p(counts: Counter, joint: dict, runs: int) -> float:
    observed, expected, rest_o, rest_e = [], [], 0.0, 0.0
    for cell, prob in joint.items():
        if prob * runs >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(prob * runs)
        else:  # pool rare cells so the chi-square approximation holds
            rest_o += counts.get(cell, 0)
            rest_e += prob * runs
    observed.append(rest_o + sum(c for k, c in counts.items() if k not in joint))
    expected.append(rest_e)
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


def empirical(generate, runs: int = RUNS) -> Counter:
    return Counter(tuple(generate(seed)[:2]) for seed in range(runs))


def biased_generate(model, drafter, sampling, spec, seed) -> list[int]:
    """The known-wrong rule: run greedy acceptance (with coins) on every candidate, keep the longest."""
    gen = torch.Generator().manual_seed(seed)
    session = verifier_for(model, drafter).start(PROMPT)
    if getattr(drafter, "needs_features", False):
        marginals = drafter.propose(session.tokens, spec.gamma, session.features)
    else:
        marginals = drafter.propose(session.tokens, spec.gamma)
    candidates, _ = sample_candidates(marginals, spec.num_candidates, spec.draft_temperature, gen)
    tree = build_tree(session.tokens[-1], candidates)
    probs = target_probs(session.score(tree), sampling)
    verdicts = []
    for row in range(tree.candidates.shape[0]):
        path_probs = probs[torch.cat([torch.zeros(1, dtype=torch.long), tree.paths[row]])]
        verdicts.append(greedy_accept(tree.candidates[row], path_probs, gen))
    best = max(range(len(verdicts)), key=lambda r: verdicts[r].num_accepted)
    return verdicts[best].emitted(tree.candidates[best].tolist())


CASES = [
    (0.7, 1, "greedy"),
    (0.7, 8, "greedy"),
    (1.0, 1, "greedy"),
    (1.0, 8, "greedy"),
    (1.0, 1, "speculative"),
]


@pytest.mark.parametrize("temperature,k,acceptance", CASES)
def test_output_follows_verifier_distribution(model, drafter, temperature, k, acceptance):
    sampling = SamplingParams(temperature=temperature)
    spec = SpecConfig(gamma=2, num_candidates=k, draft_temperature=1.5, acceptance=acceptance)
    decoder = SpeculativeDecoder(drafter, HFVerifier(model))
    counts = empirical(
        lambda seed: decoder.generate(PROMPT, max_new_tokens=3, sampling=sampling, spec=spec, seed=seed).tokens
    )
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p > PASS_P, f"T={temperature} K={k} {acceptance}: chi-square p={p:.2e}"


def test_top_p_top_k_follow_verifier_distribution(model, drafter):
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=5)
    spec = SpecConfig(gamma=2, num_candidates=4)
    decoder = SpeculativeDecoder(drafter, HFVerifier(model))
    counts = empirical(
        lambda seed: decoder.generate(PROMPT, max_new_tokens=3, sampling=sampling, spec=spec, seed=seed).tokens
    )
    joint = exact_joint(model, sampling)
    assert sum(c for cell, c in counts.items() if joint.get(cell, 0) == 0) == 0, "emitted a filtered-out token"
    assert chi_square_p(counts, joint, RUNS) > PASS_P


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_biased_keep_longest_rule_fails(model, drafter, temperature):
    sampling = SamplingParams(temperature=temperature)
    spec = SpecConfig(gamma=2, num_candidates=8, draft_temperature=1.5)
    counts = empirical(lambda seed: biased_generate(model, drafter, sampling, spec, seed))
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p < 1e-6, f"the biased rule should be detected, got chi-square p={p:.2e}"


@pytest.mark.parametrize("temperature,k", [(0.7, 4)])
def test_feature_drafter_output_follows_verifier_distribution(model, feature_drafter, temperature, k):
    sampling = SamplingParams(temperature=temperature)
    spec = SpecConfig(gamma=2, num_candidates=k, draft_temperature=1.5)
    decoder = SpeculativeDecoder(feature_drafter, verifier_for(model, feature_drafter))
    counts = empirical(
        lambda seed: decoder.generate(PROMPT, max_new_tokens=3, sampling=sampling, spec=spec, seed=seed).tokens
    )
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p > PASS_P, f"feature drafter T={temperature} K={k}: chi-square p={p:.2e}"


def test_feature_drafter_biased_keep_longest_rule_fails(model, feature_drafter):
    sampling = SamplingParams(temperature=1.0)
    spec = SpecConfig(gamma=2, num_candidates=8, draft_temperature=1.5)
    counts = empirical(lambda seed: biased_generate(model, feature_drafter, sampling, spec, seed))
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p < 1e-6, f"the biased rule should be detected with the feature drafter, got chi-square p={p:.2e}"
