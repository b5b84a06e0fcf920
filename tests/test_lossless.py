"""T > 0: the output follows the verifier's distribution exactly (statistical test), and a biased rule fails it.

Tiny vocabulary (8 tokens), a verifier with peaky random weights and a drafter that disagrees with it. We compare
the empirical joint distribution of the first two generated tokens over many seeded runs with the verifier's exact
joint distribution (chi-square). The negative control, "verify all K candidates with coins and keep the longest",
lets the coins choose the candidate and must fail the same test.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import pytest
from scipy.stats import chisquare

import lossless_cases as cases
from helpers import full_logprobs
from lossless_cases import PROMPT, V
from specdiff import SamplingParams, SpecConfig
from specdiff.core.sampling import target_probs

RUNS = 6000
PASS_P = 1e-3  # seeds are fixed, so each case passes or fails deterministically
WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


@pytest.fixture(scope="module")
def pool():
    """Worker processes (spawned: fresh interpreters, no forked thread pools) that run the seeded decodes."""
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn"),
                             initializer=cases.init_worker) as executor:
        yield executor


@pytest.fixture(scope="module")
def model():
    return cases.model()


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


def empirical(pool, rule: str, kind: str, sampling: SamplingParams, spec: SpecConfig, runs: int = RUNS) -> Counter:
    """Counts of the first two tokens over seeds 0..runs-1, the seeds split over the pool's processes."""
    step = -(-runs // (2 * WORKERS))
    futures = [pool.submit(cases.count, rule, kind, sampling, spec, range(a, min(a + step, runs)))
               for a in range(0, runs, step)]
    total = Counter()
    for f in futures:
        total.update(f.result())
    return total


CASES = [
    (0.7, 1, "greedy"),
    (0.7, 8, "greedy"),
    (1.0, 1, "greedy"),
    (1.0, 8, "greedy"),
    (1.0, 1, "speculative"),
]


@pytest.mark.parametrize("temperature,k,acceptance", CASES)
def test_output_follows_verifier_distribution(pool, model, temperature, k, acceptance):
    sampling = SamplingParams(temperature=temperature)
    spec = SpecConfig(gamma=2, num_candidates=k, draft_temperature=1.5, acceptance=acceptance)
    counts = empirical(pool, "engine", "fixed", sampling, spec)
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p > PASS_P, f"T={temperature} K={k} {acceptance}: chi-square p={p:.2e}"


def test_top_p_top_k_follow_verifier_distribution(pool, model):
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=5)
    spec = SpecConfig(gamma=2, num_candidates=4)
    counts = empirical(pool, "engine", "fixed", sampling, spec)
    joint = exact_joint(model, sampling)
    assert sum(c for cell, c in counts.items() if joint.get(cell, 0) == 0) == 0, "emitted a filtered-out token"
    assert chi_square_p(counts, joint, RUNS) > PASS_P


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_biased_keep_longest_rule_fails(pool, model, temperature):
    sampling = SamplingParams(temperature=temperature)
    spec = SpecConfig(gamma=2, num_candidates=8, draft_temperature=1.5)
    counts = empirical(pool, "biased", "fixed", sampling, spec)
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p < 1e-6, f"the biased rule should be detected, got chi-square p={p:.2e}"


@pytest.mark.parametrize("temperature,k", [(0.7, 4)])
def test_feature_drafter_output_follows_verifier_distribution(pool, model, temperature, k):
    sampling = SamplingParams(temperature=temperature)
    spec = SpecConfig(gamma=2, num_candidates=k, draft_temperature=1.5)
    counts = empirical(pool, "engine", "feature", sampling, spec)
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p > PASS_P, f"feature drafter T={temperature} K={k}: chi-square p={p:.2e}"


def test_feature_drafter_biased_keep_longest_rule_fails(pool, model):
    sampling = SamplingParams(temperature=1.0)
    spec = SpecConfig(gamma=2, num_candidates=8, draft_temperature=1.5)
    counts = empirical(pool, "biased", "feature", sampling, spec)
    p = chi_square_p(counts, exact_joint(model, sampling), RUNS)
    assert p < 1e-6, f"the biased rule should be detected with the feature drafter, got chi-square p={p:.2e}"
