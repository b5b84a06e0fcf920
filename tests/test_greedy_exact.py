"""T = 0: speculative decoding is token-for-token equal to the verifier's own greedy ``generate``."""

from __future__ import annotations

import pytest
import torch

from helpers import OracleDrafter
from specdiff import (
    HFVerifier,
    SpecConfig,
    SpeculativeDecoder,
    build_small_drafter,
    drafter_from_verifier,
    generate_plain,
)

PROMPTS = [[5], [3, 17, 9, 41], list(range(1, 40))]


def hf_greedy(model, prompt, max_new_tokens, eos=None):
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def drafters(verifier_model):
    return {
        "random": build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=2),
        "oracle": OracleDrafter(verifier_model, confidence=0.6),
        # block attention with the prefix cache: the drafter's own state must not leak between rounds or prompts
        "block": drafter_from_verifier(verifier_model, num_layers=1, causal_prefix=True),
    }


@pytest.mark.parametrize("gamma", [1, 4, 16])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("drafter_name", ["random", "oracle", "block"])
def test_equals_hf_greedy(verifier_model, drafters, gamma, k, drafter_name):
    decoder = SpeculativeDecoder(drafters[drafter_name], HFVerifier(verifier_model))
    for prompt in PROMPTS:
        expected = hf_greedy(verifier_model, prompt, 30)
        result = decoder.generate(prompt, max_new_tokens=30, spec=SpecConfig(gamma=gamma, num_candidates=k), seed=1)
        assert result.tokens == expected, f"prompt of {len(prompt)} tokens"
        assert result.finish_reason == "length"
        assert result.stats.emitted >= 30 and result.stats.verifier_calls <= 30


def test_oracle_drafter_accepts_long_windows(verifier_model, drafters):
    # Guards the test above: with a good drafter, windows are really accepted (so commit paths are exercised).
    decoder = SpeculativeDecoder(drafters["oracle"], HFVerifier(verifier_model))
    spec = SpecConfig(gamma=8, num_candidates=4, draft_temperature=1.0)
    result = decoder.generate(PROMPTS[1], max_new_tokens=40, spec=spec, seed=0)
    assert result.stats.tau > 2.5
    assert result.tokens == hf_greedy(verifier_model, PROMPTS[1], 40)


@pytest.mark.parametrize("k", [1, 8])
def test_eos_inside_window(verifier_model, drafters, k):
    prompt = PROMPTS[1]
    reference = hf_greedy(verifier_model, prompt, 30)
    eos = reference[9]  # appears mid-stream: generation must stop right there, inside a window
    expected = hf_greedy(verifier_model, prompt, 30, eos=eos)
    assert expected[-1] == eos and len(expected) <= 10
    decoder = SpeculativeDecoder(drafters["oracle"], HFVerifier(verifier_model))
    result = decoder.generate(
        prompt, max_new_tokens=30, spec=SpecConfig(gamma=16, num_candidates=k), stop_token_ids=[eos], seed=0
    )
    assert result.tokens == expected
    assert result.finish_reason == "stop"


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_max_new_tokens_mid_window(verifier_model, drafters, max_new_tokens):
    decoder = SpeculativeDecoder(drafters["oracle"], HFVerifier(verifier_model))
    result = decoder.generate(PROMPTS[1], max_new_tokens=max_new_tokens, spec=SpecConfig(gamma=4), seed=0)
    assert result.tokens == hf_greedy(verifier_model, PROMPTS[1], max_new_tokens)
    assert result.finish_reason == "length"


def test_plain_generate_equals_hf(verifier_model):
    for prompt in PROMPTS:
        assert generate_plain(HFVerifier(verifier_model), prompt, max_new_tokens=20).tokens == hf_greedy(
            verifier_model, prompt, 20
        )


def test_stream_yields_the_same_tokens(verifier_model, drafters):
    decoder = SpeculativeDecoder(drafters["oracle"], HFVerifier(verifier_model))
    chunks = list(decoder.stream(PROMPTS[1], max_new_tokens=25, spec=SpecConfig(gamma=4), seed=0))
    assert len(chunks) > 1 and all(chunks)
    assert sum(chunks, []) == hf_greedy(verifier_model, PROMPTS[1], 25)


def test_stops_at_verifier_context(verifier_model, drafters):
    verifier = HFVerifier(verifier_model, max_context=20)
    decoder = SpeculativeDecoder(drafters["oracle"], verifier)
    prompt = PROMPTS[1]
    result = decoder.generate(prompt, max_new_tokens=100, spec=SpecConfig(gamma=8), seed=0)
    assert len(prompt) + len(result.tokens) == 20
    assert result.finish_reason == "context"
    assert result.tokens == hf_greedy(verifier_model, prompt, 16)


def test_stop_strings_cut_the_output(verifier_model, drafters):
    decode = lambda ids: " ".join(f"t{i}" for i in ids)  # noqa: E731 - a toy detokenizer
    reference = hf_greedy(verifier_model, PROMPTS[1], 30)
    stop = f"t{reference[5]}"
    cut = next(i for i in range(1, 31) if stop in decode(reference[:i]))
    decoder = SpeculativeDecoder(drafters["oracle"], HFVerifier(verifier_model), decode=decode)
    result = decoder.generate(PROMPTS[1], max_new_tokens=30, stop_strings=[stop], spec=SpecConfig(gamma=8), seed=0)
    assert result.tokens == reference[:cut]
    assert result.finish_reason == "stop"
