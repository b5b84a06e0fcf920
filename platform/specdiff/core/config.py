"""Algorithm configuration: frozen dataclasses validated on construction.

Every error is a ``ValueError`` whose message names the field and the bad value, so a typo in a YAML file or an
HTTP request surfaces as ``gamma must be >= 1, got 0`` rather than as a shape error deep inside a forward pass.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Mapping


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    """How the verifier samples; defines the target distribution p exactly.

    Applied in Hugging Face's order: temperature, then top-k, then top-p. ``temperature=0`` is greedy decoding
    (p is one-hot on the argmax) and ignores top-k / top-p.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables the filter

    def __post_init__(self) -> None:
        _check(_is_real(self.temperature) and self.temperature >= 0, "temperature", self.temperature, "a number >= 0")
        _check(_is_real(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(_is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k, "an integer >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


Acceptance = Literal["greedy", "speculative"]


@dataclass(frozen=True)
class SpecConfig:
    """One speculative round: draft a window of ``gamma`` tokens, sample ``num_candidates`` (K) candidates at
    ``draft_temperature``, keep the best by expected accepted streak, verify it.

    ``gamma`` / ``num_candidates`` left at None (the default) are chosen round by round by the adaptive policy
    (``specdiff.core.policy``) within ``max_gamma`` / ``max_candidates``; with ``gamma`` None it may also take plain
    (verifier-only) steps when no speculation pays. An explicit integer is used as given, every round.

    ``acceptance``:
      - ``"greedy"``: accept x with probability p(x) (exact for any selection rule; the paper's choice).
      - ``"speculative"``: standard speculative sampling min(1, p/q); exact only for K=1, accepts more.
    """

    gamma: int | None = None  # None: adaptive
    num_candidates: int | None = None  # None: adaptive
    draft_temperature: float = 1.5
    draft_top_k: int = 0  # 0 disables the filter
    acceptance: Acceptance = "greedy"
    # Greedy acceptance: candidate 0 is the drafter's argmax window, the other K-1 are drawn at the draft
    # temperature (so K=1 drafts the argmax). Measured: sampled-only candidates at T_d=1.5 lost most of a trained
    # feature drafter's acceptance. Ignored (False) with acceptance="speculative", which needs drawn candidates.
    include_argmax: bool = True
    # Greedy acceptance: one more candidate copied from the context (``specdiff.core.lookup``: what followed the latest
    # earlier occurrence of the context's longest suffix n-gram, 1 to ``lookup_ngram`` tokens), padded with the
    # argmax window where the copy is shorter than gamma. Self-selection keeps it only when it scores higher.
    # Ignored with acceptance="speculative".
    prompt_lookup: bool = True
    lookup_ngram: int = 4
    max_gamma: int = 8  # bounds of the adaptive search
    max_candidates: int = 4

    def __post_init__(self) -> None:
        _check(self.gamma is None or (_is_int(self.gamma) and self.gamma >= 1), "gamma", self.gamma, "an integer >= 1")
        _check(
            self.num_candidates is None or (_is_int(self.num_candidates) and self.num_candidates >= 1),
            "num_candidates (K)",
            self.num_candidates,
            "an integer >= 1",
        )
        _check(_is_int(self.max_gamma) and self.max_gamma >= 1, "max_gamma", self.max_gamma, "an integer >= 1")
        _check(
            _is_int(self.max_candidates) and self.max_candidates >= 1,
            "max_candidates",
            self.max_candidates,
            "an integer >= 1",
        )
        _check(
            _is_real(self.draft_temperature) and self.draft_temperature >= 0,
            "draft_temperature",
            self.draft_temperature,
            "a number >= 0",
        )
        _check(_is_int(self.lookup_ngram) and self.lookup_ngram >= 1, "lookup_ngram", self.lookup_ngram,
               "an integer >= 1")
        _check(_is_int(self.draft_top_k) and self.draft_top_k >= 0, "draft_top_k", self.draft_top_k, "an integer >= 0")
        _check(self.acceptance in ("greedy", "speculative"), "acceptance", self.acceptance, "'greedy' or 'speculative'")
        if self.acceptance == "speculative" and self.num_candidates not in (None, 1):
            raise ValueError(
                f"acceptance='speculative' is exact only for a single candidate; got num_candidates (K)="
                f"{self.num_candidates}. Use acceptance='greedy' with self-selection."
            )

    @property
    def adaptive(self) -> bool:
        """True when the policy chooses gamma and/or K (either left at None)."""
        return self.gamma is None or self.num_candidates is None


@dataclass(frozen=True)
class DecodeOptions:
    """One decode request, in one object: how many tokens, how the verifier samples, the speculative round (ignored
    by plain decoding), where to stop, and the seed.

    Every entry point takes it (``SpeculativeDecoder.generate`` / ``stream``, ``generate_plain`` / ``stream_plain``)
    as ``options``, and its fields as keywords, which override the object's (``DecodeOptions.merge``):

    >>> opts = DecodeOptions(max_new_tokens=64, sampling=SamplingParams(temperature=0.7), seed=0)
    >>> decoder.generate(prompt, opts)                    # same as decoder.generate(prompt, max_new_tokens=64, ...)
    >>> generate_plain(verifier, prompt, opts, seed=1)    # the same request with another seed
    """

    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    spec: SpecConfig = field(default_factory=SpecConfig)
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None  # None: drawn from the OS (unless the caller hands in a torch.Generator)

    def __post_init__(self) -> None:
        _check(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens,
               "an integer >= 1")
        _check(isinstance(self.sampling, SamplingParams), "sampling", self.sampling, "a SamplingParams")
        _check(isinstance(self.spec, SpecConfig), "spec", self.spec, "a SpecConfig")
        _check(self.seed is None or _is_int(self.seed), "seed", self.seed, "None or an integer")
        _check(not isinstance(self.stop_token_ids, (str, bytes)), "stop_token_ids", self.stop_token_ids,
               "a sequence of token ids")
        try:
            ids = tuple(operator.index(t) for t in self.stop_token_ids)  # ints (numpy / torch integers too)
        except TypeError:
            raise ValueError(f"stop_token_ids must be a sequence of token ids, got {self.stop_token_ids!r}") from None
        _check(not isinstance(self.stop_strings, (str, bytes)) and all(isinstance(t, str) and t for t in
               self.stop_strings), "stop_strings", self.stop_strings, "a sequence of non-empty strings")
        object.__setattr__(self, "stop_token_ids", ids)  # frozen: lists in, tuples kept
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))

    @classmethod
    def merge(cls, options: DecodeOptions | None = None, overrides: Mapping[str, Any] | None = None) -> DecodeOptions:
        """``options`` (or the defaults) with ``overrides`` (field name -> value) applied; an unknown name is a
        TypeError naming it."""
        base = options if options is not None else cls()
        if not isinstance(base, cls):
            raise TypeError(f"options must be a DecodeOptions, got {type(base).__name__}")
        if not overrides:
            return base
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown decode option(s) {unknown}; DecodeOptions has {[f.name for f in fields(cls)]}")
        return replace(base, **overrides)


@dataclass(frozen=True)
class DrafterConfig:
    """How a masked-diffusion model is run as a drafter.

    ``mask_token_id`` may lie outside the verifier's vocabulary (an appended token): marginals are always cut to
    ``vocab_size`` and the mask token, if inside it, gets probability 0.
    """

    mask_token_id: int
    vocab_size: int  # size of the verifier-visible vocabulary the marginals cover
    denoising_steps: int = 1
    shifted_logits: bool = False  # DiffuCoder/Dream, DiffuLLaMA: position i is predicted from the output at i-1
    max_context: int | None = None  # left-truncate prefixes longer than this (bounds drafter cost)
    force_bidirectional: bool = True  # pass an all-visible 4D mask (turns a causal HF architecture bidirectional)
    # Block attention (with force_bidirectional): prefix tokens attend causally, window tokens attend to the whole
    # prefix and to each other. The prefix then reads exactly as in an AR model (inherited layers keep their
    # meaning) and its keys/values can be cached across rounds; the window is still drafted in one pass.
    causal_prefix: bool = False

    def __post_init__(self) -> None:
        _check(_is_int(self.mask_token_id) and self.mask_token_id >= 0, "mask_token_id", self.mask_token_id, "an integer >= 0")
        _check(_is_int(self.vocab_size) and self.vocab_size >= 2, "vocab_size", self.vocab_size, "an integer >= 2")
        _check(
            _is_int(self.denoising_steps) and self.denoising_steps >= 1,
            "denoising_steps",
            self.denoising_steps,
            "an integer >= 1",
        )
        _check(
            self.max_context is None or (_is_int(self.max_context) and self.max_context >= 1),
            "max_context",
            self.max_context,
            "None or an integer >= 1",
        )
