"""Bad input raises ValueError naming the field and the value."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import tiny_llama
from specdiff import (
    DecodeOptions,
    DrafterConfig,
    HFDiffusionDrafter,
    HFVerifier,
    SamplingParams,
    SpecConfig,
    SpeculativeDecoder,
    build_small_drafter,
    find_mask_token_id,
    generate_plain,
)


@pytest.fixture(scope="module")
def decoder(verifier_model):
    return SpeculativeDecoder(build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=2), HFVerifier(verifier_model))


@pytest.mark.parametrize(
    "make,pattern",
    [
        (lambda: SpecConfig(gamma=0), r"gamma must be an integer >= 1, got 0"),
        (lambda: SpecConfig(gamma=2.5), r"gamma must be an integer >= 1, got 2.5"),
        (lambda: SpecConfig(num_candidates=0), r"num_candidates \(K\) must be an integer >= 1, got 0"),
        (lambda: SpecConfig(draft_temperature=-1), r"draft_temperature must be a number >= 0, got -1"),
        (lambda: SpecConfig(acceptance="coin"), r"acceptance must be 'greedy' or 'speculative', got 'coin'"),
        (lambda: SpecConfig(num_candidates=4, acceptance="speculative"), r"num_candidates \(K\)=4"),
        (lambda: SamplingParams(temperature=-0.1), r"temperature must be a number >= 0, got -0.1"),
        (lambda: SamplingParams(temperature=float("nan")), r"temperature must be a number >= 0, got nan"),
        (lambda: SamplingParams(top_p=0), r"top_p must be in \(0, 1\], got 0"),
        (lambda: SamplingParams(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (lambda: SamplingParams(top_k=-3), r"top_k must be an integer >= 0, got -3"),
        (lambda: DrafterConfig(mask_token_id=-1, vocab_size=10), r"mask_token_id must be an integer >= 0, got -1"),
        (lambda: DrafterConfig(mask_token_id=1, vocab_size=10, denoising_steps=0), r"denoising_steps .* got 0"),
        (lambda: DecodeOptions(max_new_tokens=0), r"max_new_tokens must be an integer >= 1, got 0"),
        (lambda: DecodeOptions(stop_token_ids=[2, 1.5]), r"stop_token_ids must be a sequence of token ids"),
        (lambda: DecodeOptions(stop_token_ids="2"), r"stop_token_ids must be a sequence of token ids, got '2'"),
        (lambda: DecodeOptions(stop_strings="END"), r"stop_strings must be a sequence of non-empty strings"),
        (lambda: DecodeOptions(stop_strings=["END", ""]), r"stop_strings must be .*, got \['END', ''\]"),
        (lambda: DecodeOptions(seed=1.0), r"seed must be None or an integer, got 1.0"),
        (lambda: DecodeOptions(sampling={"temperature": 1}), r"sampling must be a SamplingParams"),
    ],
)
def test_config_errors_name_field_and_value(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()


def test_empty_prompt(decoder):
    with pytest.raises(ValueError, match="prompt must contain at least one token, got 0"):
        decoder.generate([], max_new_tokens=4)


def test_prompt_longer_than_context(verifier_model):
    decoder = SpeculativeDecoder(
        build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=2), HFVerifier(verifier_model, max_context=16)
    )
    with pytest.raises(ValueError, match="prompt has 17 tokens, more than the verifier's context of 16"):
        decoder.generate(list(range(1, 18)), max_new_tokens=4)
    assert len(decoder.generate(list(range(1, 17)), max_new_tokens=4).tokens) == 0  # exactly full: nothing to add


def test_prompt_token_out_of_vocabulary(decoder):
    with pytest.raises(ValueError, match=r"prompt token ids must lie in \[0, 64\), got 64"):
        decoder.generate([1, 64], max_new_tokens=4)


def test_max_new_tokens(decoder):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got 0"):
        decoder.generate([1, 2], max_new_tokens=0)


def test_stop_strings_without_tokenizer(decoder):
    with pytest.raises(ValueError, match=r"stop_strings=\['END'\] need a tokenizer"):
        decoder.generate([1, 2], stop_strings=["END"])


def test_vocabulary_mismatch(verifier_model):
    with pytest.raises(ValueError, match=re.escape("drafter vocab_size (32) must equal the verifier's vocab_size (64)")):
        SpeculativeDecoder(build_small_drafter(32, hidden_size=32, num_layers=1, num_heads=2), HFVerifier(verifier_model))


def test_missing_mask_token():
    model = tiny_llama(64)
    with pytest.raises(ValueError, match="mask_token_id is missing"):
        find_mask_token_id(model, tokenizer=None)
    with pytest.raises(ValueError, match=r"mask_token_id must index the drafter's embedding table \(64 rows\), got 64"):
        HFDiffusionDrafter(model, DrafterConfig(mask_token_id=64, vocab_size=64))


def test_stdlib_platform_not_shadowed():
    root = Path(__file__).resolve().parents[1]
    assert not (root / "platform" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-c", "import platform, specdiff; print(platform.system(), specdiff.__name__)"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "specdiff"


def test_unknown_decode_option_names_it(decoder):
    with pytest.raises(TypeError, match=r"unknown decode option\(s\) \['temprature'\]"):
        decoder.generate([1, 2], max_new_tokens=2, temprature=0.5)


def test_decode_options_object_equals_keywords(decoder):
    """One DecodeOptions object, its fields as keywords, or the object with keyword overrides: the same decode."""
    sampling, spec = SamplingParams(temperature=1.0), SpecConfig(gamma=3, num_candidates=2)
    opts = DecodeOptions(max_new_tokens=12, sampling=sampling, spec=spec, stop_token_ids=[63], seed=5)
    assert opts.stop_token_ids == (63,)
    by_object = decoder.generate([1, 2, 3], opts).tokens
    by_keywords = decoder.generate([1, 2, 3], max_new_tokens=12, sampling=sampling, spec=spec, stop_token_ids=[63],
                                   seed=5).tokens
    assert by_object == by_keywords and len(by_object) > 0
    other = DecodeOptions(max_new_tokens=12, sampling=sampling, spec=spec, stop_token_ids=[63], seed=6)
    assert decoder.generate([1, 2, 3], opts, seed=6).tokens == decoder.generate([1, 2, 3], other).tokens
    assert generate_plain(decoder.verifier, [1, 2, 3], opts).tokens == \
        generate_plain(decoder.verifier, [1, 2, 3], **{f: getattr(opts, f) for f in ("max_new_tokens", "sampling",
                                                                                     "stop_token_ids", "seed")}).tokens
