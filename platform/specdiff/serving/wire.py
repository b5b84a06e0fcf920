"""What travels between the replicas and the router besides token ids: tapped verifier features, compactly, and the
token-list sync of a verifier session (length + digest; the list itself only when a replica must rebuild).

A feature drafter reads the verifier's tapped hidden states of every committed token (``taps * H`` numbers per token,
1,728 for SmolLM2 with three taps). They travel as raw bytes in a 2-byte float (``float16`` by default: 3.4 KB per
token) with their first row's index, so a call carries only the rows its receiver lacks.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Sequence

import torch

WIRE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}  # numpy-able carriers


@dataclass(frozen=True)
class FeatureRows:
    """Rows ``start .. start + rows - 1`` of a session's features [n, width], as bytes in ``dtype``."""

    start: int
    rows: int
    width: int
    dtype: str
    data: bytes

    @classmethod
    def encode(cls, features: torch.Tensor, start: int, dtype: str = "float16") -> FeatureRows:
        """features [k, width] (any float dtype) -> rows ``start .. start + k - 1`` on the wire."""
        if dtype not in WIRE_DTYPES:
            raise ValueError(f"feature wire dtype must be one of {sorted(WIRE_DTYPES)}, got {dtype!r}")
        wire = WIRE_DTYPES[dtype]
        t = features.detach().to("cpu", wire).contiguous()
        if dtype == "float16" and not torch.isfinite(t).all() and torch.isfinite(features).all():
            raise ValueError("verifier features overflow float16 (|x| > 65504); serve with verifier.feature_dtype="
                             "bfloat16 or float32")
        return cls(int(start), int(t.shape[0]), int(t.shape[1]), dtype, t.view(_VIEW[wire]).numpy().tobytes())

    def decode(self) -> torch.Tensor:
        """-> [rows, width] in the wire dtype."""
        wire = WIRE_DTYPES[self.dtype]
        if not self.rows:
            return torch.zeros(0, self.width, dtype=wire)
        flat = torch.frombuffer(bytearray(self.data), dtype=_VIEW[wire])
        return flat.view(wire).view(self.rows, self.width)

    @property
    def stop(self) -> int:
        return self.start + self.rows

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class NeedFeatures:
    """A drafter replica's answer when it lacks rows before a call's ``start`` (a new replica, an evicted session):
    send again from ``have`` (0: from the first token)."""

    have: int


def token_digest(tokens: Sequence[int]) -> int:
    """A 64-bit digest of a token list: router and verifier replica compare it (with the length) to agree on a
    session's tokens without sending them."""
    return int.from_bytes(hashlib.blake2b(array("q", tokens).tobytes(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class TokenSync:
    """The router's view of a verifier session's tokens, sent with every call: its length and digest, plus the
    tokens themselves only when the replica must (re)build the session (the first call, or after ``NeedTokens``)."""

    n: int
    digest: int
    tokens: list[int] | None = None

    @classmethod
    def of(cls, tokens: Sequence[int], full: bool = False) -> TokenSync:
        return cls(len(tokens), token_digest(tokens), list(tokens) if full else None)


@dataclass(frozen=True)
class NeedTokens:
    """A verifier replica's answer when it does not hold the session at the router's state (new, restarted,
    evicted, or a retried call that already advanced it): send the full tokens."""


def room_needed(prompt_tokens: int, options, speculative: bool) -> int:
    """Tokens of cache a decode may hold (``options``: its ``DecodeOptions``): its prompt, every token it may emit
    and, speculating, the largest tree it may score before a commit drops the rejected nodes."""
    spec = options.spec
    tree = (spec.gamma or spec.max_gamma) * (spec.num_candidates or spec.max_candidates) if speculative else 0
    return prompt_tokens + options.max_new_tokens + tree + 1


def room_error(need: int, budget_tokens: int | None, budget_mb: float | None, token_bytes: int | None) -> str | None:
    """Why a decode needing ``need`` tokens of room can never run on a Decoder replica (None: it can)."""
    if budget_tokens is None or need <= budget_tokens:
        return None
    return (f"this request needs room for {need} tokens of KV cache (prompt, max_tokens and the speculation tree); "
            f"a Decoder replica holds at most {budget_tokens} tokens (verifier.kv_cache_budget_mb={budget_mb:g}, "
            f"{token_bytes} bytes a token)")
