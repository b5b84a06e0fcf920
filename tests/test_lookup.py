"""Prompt lookup: the copied candidate, and that a round with it stays exact."""

import pytest
import torch

from specdiff.core.config import SpecConfig
from specdiff.core.lookup import lookup_continuation
from specdiff.core.rounds import Draft, with_lookup


def test_longest_suffix_ngram_latest_occurrence():
    # suffix [5, 6] occurred at 1 and at 6; the latest earlier one (6) is followed by 9, 5, 6
    tokens = [4, 5, 6, 7, 8, 1, 5, 6, 9, 5, 6]
    assert lookup_continuation(tokens, 3) == [9, 5, 6]
    assert lookup_continuation(tokens, 2, max_ngram=1) == [9, 5]  # 1-gram [6]: latest earlier 6 is at 7
    assert lookup_continuation([1, 2, 3, 4, 2, 3], 8) == [4, 2, 3]  # longer n-gram wins; copy ends at the context
    assert lookup_continuation([1, 2, 3], 4) == []  # no repeat
    assert lookup_continuation([1, 2, 3, 2], 4, min_ngram=2) == []
    assert lookup_continuation([7], 4) == []
    with pytest.raises(ValueError, match="gamma"):
        lookup_continuation([1, 1], 0)


def test_with_lookup_adds_one_padded_candidate():
    spec = SpecConfig(gamma=4, num_candidates=2)
    d = Draft(torch.tensor([[1, 2, 3, 4], [1, 2, 3, 5]]))
    out = with_lookup(d, [9, 8, 7, 9, 8], spec)  # [9, 8] -> 7, 9, 8; the 4th position from candidate 0
    assert out.candidates.tolist() == [[1, 2, 3, 4], [1, 2, 3, 5], [7, 9, 8, 4]]
    assert with_lookup(d, [1, 2, 3], spec) is d  # no match: unchanged
    assert with_lookup(d, [9, 8, 7, 9, 8], SpecConfig(gamma=4, prompt_lookup=False)) is d
    same = with_lookup(d, [1, 2, 3, 4, 0, 1], spec)  # the copy [2, 3, 4, 0]? no: suffix [1] -> 2, 3, 4, 0
    assert same.candidates.shape[0] == 3 and same.candidates[2].tolist() == [2, 3, 4, 0]
    dup = with_lookup(d, [0, 1, 2, 3, 4, 0], spec)  # copy [1, 2, 3, 4] is candidate 0 already
    assert dup is d


def test_a_decode_that_repeats_itself_keeps_the_copied_candidate_and_stays_exact():
    # A tiny random verifier decoded greedily falls into a loop; a drafter that always proposes a token the verifier
    # never emits accepts nothing, so every accepted token comes from the copied candidate.
    from helpers import FixedDrafter, tiny_llama

    from specdiff import HFVerifier, SamplingParams, SpeculativeDecoder, generate_plain

    model = tiny_llama(64, init_std=0.3, seed=1)
    verifier = HFVerifier(model)
    prompt = [3, 9, 27, 17, 51]
    plain = generate_plain(verifier, prompt, max_new_tokens=60, sampling=SamplingParams(temperature=0.0))
    never = next(t for t in range(64) if t not in plain.tokens)
    table = torch.full((4, 64), 1e-6)
    table[:, never] = 1.0
    decoder = SpeculativeDecoder(FixedDrafter(table / table.sum(-1, keepdim=True)), verifier)
    runs = {}
    for lookup in (True, False):
        spec = SpecConfig(gamma=4, num_candidates=1, prompt_lookup=lookup)
        runs[lookup] = decoder.generate(prompt, max_new_tokens=60, sampling=SamplingParams(temperature=0.0), spec=spec)
        assert runs[lookup].tokens == plain.tokens  # exact at T=0 either way
    with_lookup_stats, without = runs[True].stats, runs[False].stats
    assert without.accepted == 0 and without.lookup_rounds == 0
    assert 0 < with_lookup_stats.lookup_selected <= with_lookup_stats.lookup_rounds
    assert with_lookup_stats.accepted > 0 and with_lookup_stats.tau > without.tau
