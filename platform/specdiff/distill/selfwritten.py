"""Prompts the verifier writes itself (Magpie, arXiv 2406.08464): fed only its chat template up to the start of a
user turn, an instruct model writes a plausible user request. The teacher then answers them as it answers any
prompt. Seeds give disjoint sets: training requests are drawn with seed 0, with every request of the held-out batch
(seed 1) left out. The embedded verifier's are written once and shipped as package data (``write_packaged``,
``packaged``: ``python -m specdiff.distill.selfwritten OUT.json N``), since sampling them cost a first run minutes.

Pure torch over ``sample_completions``; the tokenizer is any with ``apply_chat_template``, ``encode`` and
``decode`` (``specdiff.models.tokenizer`` or transformers').
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

import torch

from specdiff.core.config import SamplingParams
from specdiff.models.hf import HFModel
from specdiff.distill.trajectories import sample_completions

_PROBE = "\x00user-turn\x00"
MAX_TOKENS = 48  # a request longer than this is cut off mid-way and dropped


def user_turn_header(tokenizer) -> list[int]:
    """The chat template's ids up to where a user message's text begins (system turn included, if it has one)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": _PROBE}], tokenize=False,
                                         add_generation_prompt=False)
    if _PROBE not in text:
        raise ValueError("the tokenizer's chat template does not place the user message verbatim: no user-turn "
                         "header to sample from")
    return list(tokenizer.encode(text[: text.index(_PROBE)], add_special_tokens=False))


def keep(text: str) -> bool:
    """A usable request: a few words of mostly plain text, not a loop of the same words."""
    words = text.split()
    if not 4 <= len(words) <= 80 or len(text) > 400:
        return False
    if sum(c.isascii() for c in text) < 0.97 * len(text) or "<|" in text or "http" in text:
        return False
    return len(set(words)) >= 0.6 * len(words)


def normalized(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def self_written_prompts(model: HFModel, tokenizer, n: int, seed: int, *, exclude: Iterable[str] = (),
                         batch_size: int = 64, temperature: float = 1.0, top_p: float = 0.95,
                         max_batches: int | None = None) -> list[str]:
    """Up to ``n`` distinct user requests sampled from ``model`` (seeded; those in ``exclude`` left out), in the
    order sampled. Stops after ``max_batches`` batches (default: enough for twice ``n``) even if fewer were kept."""
    header = user_turn_header(tokenizer)
    ends = (tokenizer.eos_token_id, _token_id(tokenizer, "<|im_end|>"), _token_id(tokenizer, "<|eot_id|>"))
    end_ids = {i for i in ends if i is not None}
    seen = {normalized(t) for t in exclude}
    generator = torch.Generator().manual_seed(seed)
    sampling = SamplingParams(temperature=temperature, top_p=top_p)
    out: list[str] = []
    batches = max_batches if max_batches is not None else max(2, -(-2 * n // batch_size))
    for _ in range(batches):
        completions, _, _ = sample_completions(model, [header] * batch_size, MAX_TOKENS, sampling, 0, generator)
        for row in completions.tolist():
            end = next((i for i, t in enumerate(row) if t in end_ids), None)
            if end is None:  # never finished its request
                continue
            text = tokenizer.decode(row[:end], skip_special_tokens=True).strip()
            key = normalized(text)
            if key in seen or not keep(text):
                continue
            seen.add(key)
            out.append(text)
            if len(out) == n:
                return out
    return out


def _token_id(tokenizer, token: str) -> int | None:
    """The id of a special token the vocabulary has as one piece, else None."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


DATA = Path(__file__).resolve().parent.parent / "data" / "self_written"


def packaged(verifier_name: str) -> dict | None:
    """The requests written once by an embedded verifier and shipped with the package (``{"train": [...],
    "heldout": [...], "sampling": {...}}``), or None for a verifier without a file: the build then samples its own."""
    path = DATA / f"{verifier_name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def write_packaged(model: HFModel, tokenizer, path: str | Path, n_train: int, *, train_seed: int = 0,
                   eval_seed: int = 1) -> dict:
    """Sample the held-out batch (``eval_seed``) and ``n_train`` training requests that avoid it, and write both."""
    heldout = self_written_prompts(model, tokenizer, 64, eval_seed, max_batches=1)
    train = self_written_prompts(model, tokenizer, n_train, train_seed, exclude=heldout)
    record = {"train": train, "heldout": heldout, "sampling": {
        "temperature": 1.0, "top_p": 0.95, "max_tokens": MAX_TOKENS, "train_seed": train_seed,
        "eval_seed": eval_seed, "dtype": str(model.dtype).removeprefix("torch.")}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    return record


def cached_heldout(folder, dtype_name: str, model_factory) -> list[str]:
    """The held-out self-written requests of a verifier without a packaged file (seed 1's first batch, as
    ``write_packaged`` draws them), kept in ``folder`` per dtype so every bench on this machine reads the same ones;
    ``model_factory()`` -> (HFModel, tokenizer) is called only when they are not there yet."""
    path = Path(folder) / f"chat-self-heldout-{dtype_name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    model, tokenizer = model_factory()
    heldout = self_written_prompts(model, tokenizer, 64, 1, max_batches=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(heldout, indent=1))
    return heldout


if __name__ == "__main__":  # python -m specdiff.distill.selfwritten OUT.json N [VERIFIER]: the packaged file
    import sys

    from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm

    out, n = sys.argv[1], int(sys.argv[2])
    lm, tok = load_causal_lm(sys.argv[3] if len(sys.argv) > 3 else DEFAULT_VERIFIER, "auto")
    rec = write_packaged(HFModel(lm), tok, out, n)
    print(f"{len(rec['train'])} training and {len(rec['heldout'])} held-out requests -> {out}")
