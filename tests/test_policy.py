"""The adaptive speculation policy: its choices under given costs, and exactness/reproducibility in the engine."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import torch

from helpers import OracleDrafter
from specdiff import HFVerifier, SamplingParams, SpecConfig, SpeculativeDecoder, build_small_drafter, generate_plain
from specdiff.core import rounds as R
from specdiff.core.policy import PLAIN, SpeculationCosts, SpeculationPolicy, calibration_sizes

# A CPU-like profile: a plain step 50 ms, each extra trie node 1 ms, a drafter call 10 ms.
COSTS = SpeculationCosts.affine(draft_s=0.010, base_s=0.049, per_node_s=0.001)
# Speculation nearly free: the policy should speculate whenever the drafter is any good.
CHEAP = SpeculationCosts.affine(draft_s=0.001, base_s=0.049, per_node_s=0.0001)


def run(policy: SpeculationPolicy, steps: int, accept) -> list[tuple[int, int]]:
    """Drive the policy; ``accept(gamma, k)`` gives each speculative round's accepted count."""
    choices = []
    for _ in range(steps):
        g, k = policy.choose()
        choices.append((g, k))
        if (g, k) != PLAIN:
            policy.observe(g, k, accept(g, k), g * k)
    return choices


def test_useless_drafter_goes_plain_and_probes_rarely():
    policy = SpeculationPolicy.from_spec(SpecConfig(), COSTS)
    choices = run(policy, 400, lambda g, k: 0)
    spec_rounds = [c for c in choices if c != PLAIN]
    assert choices[-50:].count(PLAIN) >= 49
    assert len(spec_rounds) <= 8, spec_rounds  # a few exploratory rounds and a few (doubling-spaced) probes
    first_plain = choices.index(PLAIN)
    assert first_plain <= 4
    assert {c for c in choices[first_plain:] if c != PLAIN} == {policy.probe}  # once plain, only cheap probes
    probes = [i for i, c in enumerate(choices) if i > first_plain and c == policy.probe]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert all(b > a for a, b in zip(gaps, gaps[1:])), probes  # failed probes get rarer


def test_good_drafter_speculates_with_long_windows():
    policy = SpeculationPolicy.from_spec(SpecConfig(), COSTS)
    choices = run(policy, 100, lambda g, k: g)  # everything accepted
    assert PLAIN not in choices[5:]
    assert choices[-1][0] == 8  # the whole window pays when everything is accepted
    assert min(policy.alphas()[choices[-1][1]]) > 0.9


def test_plain_detects_a_drafter_that_becomes_good():
    policy = SpeculationPolicy.from_spec(SpecConfig(), COSTS)
    assert run(policy, 100, lambda g, k: 0)[-1] == PLAIN
    later = run(policy, 400, lambda g, k: g)
    assert later[-20:].count(PLAIN) == 0


@pytest.mark.parametrize("prior_weight, plain_next", [(1.0, True), (None, False)])  # None: the default
def test_one_failed_first_round_does_not_send_a_drafter_plain(prior_weight, plain_next):
    # The first round of a decode is often at the answer's hardest token: with the prior weighing as one round, a
    # single miss made every position's estimate 0.25 and the policy went plain (and its probes spaced out); the
    # default weight (3 rounds) keeps speculating, and the drafter's next rounds decide.
    weight = {} if prior_weight is None else {"prior_weight": prior_weight}
    policy = SpeculationPolicy.from_spec(SpecConfig(), COSTS, **weight)
    g, k = policy.choose()
    policy.observe(g, k, 0, g * k)
    assert (policy.choose() == PLAIN) == plain_next
    if not plain_next:
        assert run(policy, 30, lambda g, k: g)[-1][0] == 8  # it was a good drafter after all


def test_no_observation_and_expensive_drafter_means_plain():
    slow = SpeculationCosts.affine(draft_s=1.0, base_s=0.049, per_node_s=0.001)
    assert SpeculationPolicy.from_spec(SpecConfig(), slow).choose() == PLAIN


def test_explicit_values_bound_the_menu():
    policy = SpeculationPolicy.from_spec(SpecConfig(gamma=4), COSTS)  # gamma fixed: K adapts, never plain
    assert {g for g, _ in run(policy, 50, lambda g, k: 0)} == {4}
    policy = SpeculationPolicy.from_spec(SpecConfig(num_candidates=2), CHEAP)
    assert {k for _, k in run(policy, 50, lambda g, k: g) if k} == {2}
    policy = SpeculationPolicy.from_spec(SpecConfig(acceptance="speculative"), CHEAP)  # exact only for K=1
    assert {k for _, k in run(policy, 50, lambda g, k: g // 2)} <= {0, 1}
    policy = SpeculationPolicy.from_spec(SpecConfig(max_gamma=3, max_candidates=2), CHEAP)
    assert max(g for g, _ in run(policy, 50, lambda g, k: g)) == 3 and policy.ks == [1, 2]


def test_a_round_with_more_candidates_teaches_the_smaller_ks():
    # A light prior (one round's weight): the assertions are about what the rounds teach.
    policy = SpeculationPolicy(COSTS, gammas=range(1, 5), ks=[1, 2, 4], allow_plain=True, prior_weight=1.0)
    candidates = torch.tensor([[1, 2, 3, 4], [1, 5, 6, 7], [8, 9, 9, 9], [8, 9, 9, 8]])
    # T=0: row 0 (the argmax window) keeps 1 token, row 1 all 4, rows 2-3 none.
    streaks = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    for _ in range(20):
        policy.observe(4, 4, 4, 11, candidates=candidates, streak_probs=streaks)
    alphas = policy.alphas()
    assert alphas[1][0] > 0.9 and alphas[1][1] < 0.1  # K=1 would have kept row 0 alone: 1 token
    assert min(alphas[2]) > 0.9 and min(alphas[4]) > 0.9  # K=2 and K=4 keep row 1
    assert policy._share[1] == pytest.approx((1 + 20 * 4 / 4) / 21)  # K=1's trie: row 0 alone, 4 nodes
    assert policy._share[4] == pytest.approx((1 + 20 * 12 / 16) / 21)  # 12 nodes: rows share (1,) and (8, 9, 9)


def test_the_copied_candidate_counts_for_every_k_it_would_have_joined():
    policy = SpeculationPolicy(COSTS, gammas=range(1, 4), ks=[1, 2], allow_plain=True)
    candidates = torch.tensor([[1, 2, 3], [4, 5, 6], [1, 2, 7]])  # the last row is the copy
    streaks = torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 1, 1]])
    for _ in range(20):
        policy.observe(3, 2, 3, 6, candidates=candidates, streak_probs=streaks, lookup=True)
    assert min(policy.alphas()[1]) > 0.9  # K=1 plus the copy would have kept the copy, 3 tokens
    assert policy._share[1] == pytest.approx((1 + 20 * 4 / 3) / 21)  # rows 0 and 2 share (1, 2)


def test_greedy_rounds_report_each_rows_chance_of_keeping_its_tokens(verifier_model):
    verifier = HFVerifier(verifier_model)
    session = verifier.start([3, 17, 9, 41])
    plain = generate_plain(verifier, [3, 17, 9, 41], max_new_tokens=3).tokens
    wrong = [(t + 1) % verifier.vocab_size for t in plain]
    draft = R.Draft(torch.tensor([[plain[0], plain[1], wrong[2]], [plain[0], wrong[1], wrong[2]]]))
    out = R.verify(session, draft, SamplingParams(), SpecConfig(gamma=3, num_candidates=2), torch.Generator())
    assert out.streak_probs.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]  # T=0: p is one-hot
    assert out.num_accepted == 2
    served = pickle.loads(pickle.dumps(out))  # what a verifier replica returns to the router
    assert served == replace(out, streak_probs=served.streak_probs) and torch.equal(served.streak_probs,
                                                                                   out.streak_probs)
    assert len(pickle.dumps(out)) < 400


@pytest.mark.parametrize("min_gain, expected", [(1.1, PLAIN), (1.0, (1, 1))])
def test_speculation_must_beat_plain_by_a_margin(min_gain, expected):
    # One drafted token accepted 28% of the time: (1 + 0.28) tokens per 61 ms against 1 per 50 ms, 1.05x plain.
    policy = SpeculationPolicy(COSTS, gammas=[1], ks=[1], allow_plain=True, min_gain=min_gain, prior_weight=1.0)
    for _ in range(100):
        policy.observe(1, 1, 0, 1, candidates=torch.tensor([[5]]), streak_probs=torch.tensor([[0.28]]))
    assert policy.alphas()[1][0] == pytest.approx(0.28, abs=0.02)  # the prior still weighs a little
    assert policy.choose() == expected


def test_calibration_times_the_sizes_where_the_cost_curve_bends():
    assert calibration_sizes(8, 4) == [1, 2, 5, 9, 13, 33]
    assert calibration_sizes(1, 1) == [1, 2]


def test_config_accepts_none_and_checks_bounds():
    assert SpecConfig().adaptive and not SpecConfig(gamma=8, num_candidates=4).adaptive
    with pytest.raises(ValueError, match=r"max_gamma must be an integer >= 1, got 0"):
        SpecConfig(max_gamma=0)
    with pytest.raises(ValueError, match=r"max_candidates must be an integer >= 1, got 1.5"):
        SpecConfig(max_candidates=1.5)
    with pytest.raises(ValueError, match=r"verify_s must be"):
        SpeculationCosts(0.01, ((2, 0.1),))


PROMPTS = [[5], [3, 17, 9, 41], list(range(1, 40))]


@pytest.mark.parametrize("costs", [None, COSTS, CHEAP], ids=["calibrated", "cpu-like", "cheap"])
@pytest.mark.parametrize("drafter_name", ["random", "oracle"])
def test_adaptive_greedy_equals_plain(verifier_model, drafter_name, costs):
    drafter = (build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=2) if drafter_name == "random"
               else OracleDrafter(verifier_model, confidence=0.6))
    verifier = HFVerifier(verifier_model)
    decoder = SpeculativeDecoder(drafter, verifier, costs=costs)
    for prompt in PROMPTS:
        result = decoder.generate(prompt, max_new_tokens=30, seed=1)
        assert result.tokens == generate_plain(verifier, prompt, max_new_tokens=30).tokens
        assert result.stats.emitted >= 30
    assert decoder.costs is not None  # measured once, then kept
    if costs is None:
        assert result.stats.calibration_s == 0.0
    if drafter_name == "oracle" and costs is CHEAP:
        assert result.stats.rounds > 0 and result.stats.tau > 1.5  # the adaptive rounds are really exercised


def test_seeded_sampling_with_given_costs_is_reproducible(verifier_model):
    sampling = SamplingParams(temperature=1.0)
    runs = []
    for _ in range(2):
        decoder = SpeculativeDecoder(OracleDrafter(verifier_model, confidence=0.5), HFVerifier(verifier_model),
                                     costs=COSTS)
        result = decoder.generate(PROMPTS[1], max_new_tokens=40, sampling=sampling, seed=7)
        runs.append((result.tokens, result.stats.choices, result.stats.accepted_per_position))
    assert runs[0] == runs[1]
    assert runs[0][1]["plain"] < 40  # some speculative rounds ran, so their draws were reproduced too


def test_cost_model_is_kept_per_machine_and_model_shape(verifier_model, monkeypatch, tmp_path):
    from specdiff.core import policy
    calls = []
    real = policy.calibrate

    def counting(*args, **kwargs):
        calls.append(args[3:5])
        return real(*args, **kwargs, repeats=1)

    monkeypatch.setattr(policy, "calibrate", counting)
    drafter = build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=2)
    verifier = HFVerifier(verifier_model)

    def decode(**kwargs):
        decoder = SpeculativeDecoder(drafter, verifier, costs_cache=tmp_path, **kwargs)
        result = decoder.generate(PROMPTS[1], max_new_tokens=8, seed=0)
        assert result.tokens == generate_plain(verifier, PROMPTS[1], max_new_tokens=8).tokens
        return decoder

    first = decode()
    assert first.costs_measured is True and len(calls) == 1
    (kept,) = tmp_path.glob("costs-*.json")
    later = decode()  # a later process on this machine: read, not measured
    assert later.costs_measured is False and later.costs == first.costs and len(calls) == 1
    assert decode(recalibrate=True).costs_measured is True and len(calls) == 2
    kept.write_text('{"draft_s": 0.01}')  # damaged or from another layout: measured again, and mended
    assert decode().costs_measured is True and len(calls) == 3
    assert decode().costs_measured is False and len(calls) == 3
    # Another window or another drafter shape is another cost model.
    other = build_small_drafter(64, hidden_size=48, num_layers=1, num_heads=2)
    assert policy.costs_key(other, verifier, 8, 4) != policy.costs_key(drafter, verifier, 8, 4)
    assert policy.costs_key(drafter, verifier, 4, 4) != policy.costs_key(drafter, verifier, 8, 4)
    assert policy.costs_key(build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=2, seed=5), verifier,
                            8, 4) == policy.costs_key(drafter, verifier, 8, 4)  # weights' values do not matter


def test_an_unwritable_cost_folder_only_means_measuring_again(verifier_model, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the folder should be: nothing can be written under it
    decoder = SpeculativeDecoder(build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=2),
                                 HFVerifier(verifier_model), costs_cache=blocker / "costs")
    assert decoder.generate(PROMPTS[0], max_new_tokens=4, seed=0).stats.emitted >= 4
    assert decoder.costs_measured is True and not (blocker / "costs").exists()


def test_a_one_candidate_round_is_priced_without_the_draws():
    costs = SpeculationCosts(0.004, ((1, 0.033), (13, 0.044)), sample_s=0.004)
    assert costs.draft(1) == 0.004 and costs.draft(4) == 0.008
    assert SpeculationCosts.from_dict(costs.to_dict()) == costs
    assert SpeculationCosts.from_dict({"draft_s": 0.004, "verify_s": [[1, 0.033]]}).sample_s == 0.0
    with pytest.raises(ValueError, match="sample_s"):
        SpeculationCosts(0.004, ((1, 0.033),), sample_s=-1.0)
    policy = SpeculationPolicy(costs, gammas=[8], ks=[1, 2], allow_plain=False)
    rates = policy.rates()  # K=2 assumed no better than K=1 until its rounds show it: its draws make it dearer
    assert rates[(8, 1)] > rates[(8, 2)]
    assert rates[(8, 1)] == pytest.approx(sum(0.5 ** j for j in range(9)) / (0.004 + costs.verify(9)))
    # The one log line every tool prints the cost model with (policy_check, policy_replay).
    assert costs.describe() == ("plain step 33.0 ms, drafter 4.0 ms (+4.0 ms for K > 1 draws), verify 1 nodes 33.0 ms, "
                                "13 nodes 44.0 ms")


def test_calibration_times_the_argmax_window_and_the_draws_apart(verifier_model):
    # A served drafter whose drawn candidates cost 20 ms more than its argmax window (what tempering and drawing
    # over a large vocabulary cost): the K=1 price must not include them.
    import time as _time

    from specdiff.core.policy import calibrate

    class Served:
        vocab_size = 64

        def __init__(self):
            self.ks = []

        def draft(self, prefix, spec, seed, features=None):
            self.ks.append(spec.num_candidates)
            _time.sleep(0.001 if spec.num_candidates == 1 else 0.021)
            return R.Draft(torch.arange(spec.num_candidates * spec.gamma).view(spec.num_candidates, spec.gamma) % 64)

    drafter = Served()
    costs = calibrate(drafter, HFVerifier(verifier_model), [3, 17, 9, 41], 4, 4, repeats=3)
    assert sorted(set(drafter.ks)) == [1, 4]
    assert costs.draft_s < 0.015 and 0.01 < costs.sample_s < 0.05


def test_probes_under_load_are_spaced_by_the_batch():
    """A probe in a batch step of n sessions delays all n: each session then probes n times less often, so the
    batch keeps to the probe budget; alone, as before."""
    from specdiff.core.policy import Load

    def probes(load):
        policy = SpeculationPolicy.from_spec(SpecConfig(), COSTS)
        choices = []
        for _ in range(600):
            g, k = policy.choose(load)
            choices.append((g, k))
            if (g, k) != PLAIN:
                policy.observe(g, k, 0, g * k)
        first_plain = choices.index(PLAIN)
        return [i for i, c in enumerate(choices) if i > first_plain and c != PLAIN]

    alone, busy = probes(None), probes(Load(sessions=15, rows=15, expected=15.0))
    assert len(alone) >= 3 and 0 < len(busy) < len(alone)
    assert busy[0] - 0 >= 16 * (alone[0] - 0) // 2  # the first probe comes about 16 times later
