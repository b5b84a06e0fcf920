"""Prompt lookup: a draft copied from the context itself (pure; tokens in, tokens out).

Code and templated answers repeat what came before them (a signature restated, a variable name, a line of a
worked example). The longest suffix n-gram of the context that occurred earlier predicts that what followed it
then follows it again (Saxena 2023, "prompt lookup decoding"; vLLM's ``ngram`` method). Here it is one more
candidate in the round's tree: self-selection keeps it only when the verifier scores it higher than the drafter's
candidates, and, like the argmax candidate, it is a function of the context alone (never of the acceptance
coins), so greedy acceptance stays exact.

Measured (held-out greedy SmolLM2 trajectories, every completion position, γ=8): its mean accepted streak alone is
1.55 tokens on code, 1.16 on math and 0.31 on chat, with n-grams of 1 to 4 tokens (2 to 4: 1.37 / 0.94 / 0.20).
"""

from __future__ import annotations

from typing import Sequence


LOOKUP_WINDOW = 2048  # the context tokens searched: the latest ones


def lookup_continuation(tokens: Sequence[int], gamma: int, *, max_ngram: int = 4, min_ngram: int = 1,
                        window: int = LOOKUP_WINDOW) -> list[int]:
    """Up to ``gamma`` tokens that followed the most recent earlier occurrence of the longest suffix n-gram of
    ``tokens`` (``max_ngram`` down to ``min_ngram`` tokens), searching the last ``window`` tokens; [] if none.

    The continuation is read from the context, so it may be shorter than ``gamma`` (a match near the end)."""
    if gamma < 1 or min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError(f"need gamma >= 1 and 1 <= min_ngram <= max_ngram, got gamma={gamma}, "
                         f"min_ngram={min_ngram}, max_ngram={max_ngram}")
    ctx = list(tokens[-window:])
    n_ctx = len(ctx)
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        suffix = ctx[n_ctx - n :]
        first = suffix[0]
        # Latest earlier occurrence first: it is the most likely to continue the same way.
        for i in range(n_ctx - n - 1, -1, -1):
            if ctx[i] == first and ctx[i : i + n] == suffix:
                return ctx[i + n : i + n + gamma]
    return []


def lookup_or_draft(draft: Sequence[int], tokens: Sequence[int], *, min_ngram: int = 2,
                    max_ngram: int = 4) -> list[int] | None:
    """One chain for an engine that verifies a single draft per step (vLLM): where the context has a suffix n-gram
    of ``min_ngram`` to ``max_ngram`` tokens that occurred before, the tokens that followed it then, completed to
    ``len(draft)`` with the drafter's own; else None (keep the drafter's ``draft``).

    Our engine scores both candidates in one tree pass and keeps the better; a chain verifier cannot, and the
    copy, where there is one, is the better bet on average. Measured (held-out greedy SmolLM2 trajectories, the
    default drafter, every position, window 4, n-grams 2 to 4): tokens per step code 1.49 -> 1.92, math 2.09 ->
    2.31, chat 1.23 -> 1.36 against the drafter alone (the copy alone: 1.40 / 1.38 / 1.14)."""
    if not draft:
        return None
    copied = lookup_continuation(tokens, len(draft), min_ngram=min_ngram, max_ngram=max_ngram)
    return spliced(copied, draft) if copied else None


def spliced(copied: Sequence[int], draft: Sequence[int]) -> list[int]:
    """The chain ``lookup_or_draft`` verifies: ``copied`` (at most ``len(draft)`` tokens), then the drafter's own
    tokens past it."""
    return list(copied) + list(draft[len(copied):])
