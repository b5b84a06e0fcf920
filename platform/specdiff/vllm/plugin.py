"""vLLM plugin: the copied candidate beside our drafter inside vLLM's ``dflash`` method.

Our engine scores two candidates per round, the drafter's window and one copied from the context
(``specdiff.core.lookup``), and keeps the one the verifier prefers; on code the copy wins a quarter of the rounds. vLLM
verifies one chain per step, so here the choice is made before verification (``lookup.lookup_or_draft``): where the
context's suffix n-gram occurred before, the step's draft is what followed it then, else the drafter's. Measured
teacher-forced on held-out greedy trajectories (default drafter, window 4, n-grams 2 to 4): tokens per step code
1.49 -> 1.92, math 2.09 -> 2.31, chat 1.23 -> 1.36.

Exact: vLLM verifies every draft token as before. At T=0 acceptance keeps the draft's longest prefix that matches
greedy decoding, whatever proposed it. At T>0 a copied token is a deterministic proposal (probability 1), accepted
with probability p(x) and resampled from p without x otherwise, which is lossless; where vLLM sampled the drafter's
tokens with their probabilities (``draft_sample_method='probabilistic'``), every row with a copy gets one-hot
probabilities (also where the drafter's sample equals the copy: the proposal there is the copy).

Two savings on top (measured in docs/studies.md, vllm-lookup):

- Where every request of the step has a copy of the whole window, the drafter's window would be thrown away: only
  the first half of vLLM's drafter pass runs (the new context tokens' keys/values into the draft cache, which later
  steps read); the query forward and its sampling are skipped.
- ``dflash_config.specdiff_min_draft_confidence: c``: the drafter's window is verified only while the running
  product of its top-1 probabilities stays >= c (copies whole). The cut reads the drafter's distribution, not the
  probability of a sampled token, so the length never depends on the draw (lossless at T > 0). vLLM's scheduler
  takes variable-length drafts (as for n-gram) without async scheduling; with it the cut is off.

How it is switched on: ``specdiff.vllm.export`` writes ``dflash_config.specdiff_prompt_lookup: {min_ngram,
max_ngram}`` into the export's config.json (``--no-prompt-lookup`` leaves it out). vLLM loads this plugin in every
process through the entry point ``vllm.general_plugins`` (pyproject.toml; ``VLLM_PLUGINS`` filters plugins), and
``register`` rebinds ``DFlashProposer`` in vLLM's model runner (the CPU runner inherits it) to a subclass that
behaves as vLLM's own unless the drafter's config asks for lookup or the cut. Without this package installed the
keys are ignored and vLLM runs the drafter alone.

Cost: one n-gram search per request per step on the CPU (``lookup.lookup_continuation``, the last 2048 tokens),
and on a GPU a device-to-host copy of the step's sampled tokens.
"""

from __future__ import annotations

import logging
from typing import Any

from specdiff.vllm.export import CONFIDENCE_CONFIG_KEY as CONFIDENCE_KEY
from specdiff.vllm.export import LOOKUP_CONFIG_KEY as CONFIG_KEY
from specdiff.vllm.export import checked_confidence
from specdiff.core.lookup import LOOKUP_WINDOW, lookup_continuation, spliced

logger = logging.getLogger(__name__)


def lookup_settings(hf_config: Any) -> tuple[int, int] | None:
    """(min_ngram, max_ngram) from a draft model's config (``dflash_config[CONFIG_KEY]``), or None."""
    dflash = getattr(hf_config, "dflash_config", None) or {}
    value = dflash.get(CONFIG_KEY) if isinstance(dflash, dict) else None
    if not value:
        return None
    try:
        lo, hi = int(value["min_ngram"]), int(value["max_ngram"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"dflash_config.{CONFIG_KEY} must be {{min_ngram, max_ngram}}, got {value!r}") from e
    if not 1 <= lo <= hi:
        raise ValueError(f"dflash_config.{CONFIG_KEY} needs 1 <= min_ngram <= max_ngram, got {value!r}")
    return lo, hi


def confidence_setting(hf_config: Any) -> float | None:
    """``dflash_config[CONFIDENCE_KEY]`` of a draft model's config: the running top-1 probability below which the
    drafter's window is cut, or None."""
    dflash = getattr(hf_config, "dflash_config", None) or {}
    value = dflash.get(CONFIDENCE_KEY) if isinstance(dflash, dict) else None
    if value is None or (value == 0 and not isinstance(value, bool)):
        return None
    return checked_confidence(value, f"dflash_config.{CONFIDENCE_KEY}")


def step_copies(histories: list[list[int] | None], k: int, min_ngram: int,
                max_ngram: int) -> list[list[int] | None]:
    """Each row's copied continuation of up to ``k`` tokens (``specdiff.core.lookup``): None where its context has no
    earlier occurrence of its suffix n-gram, or where it has no history (a partial prefill). One search per row per
    step: the skip (``full_copies``) and the splice (``splice_rows``) both read this list."""
    if k < 1:
        return [None] * len(histories)
    return [(lookup_continuation(h, k, min_ngram=min_ngram, max_ngram=max_ngram) or None) if h else None
            for h in histories]


def full_copies(copies: list[list[int] | None], k: int) -> list[list[int]] | None:
    """``copies`` when every row has a copy of all ``k`` tokens, else None."""
    if k < 1 or not copies or any(c is None or len(c) < k for c in copies):
        return None
    return copies


def splice_rows(drafts: list[list[int]], copies: list[list[int] | None]) -> dict[int, list[int]]:
    """Row index -> the chain to verify, for the rows that have a copy (``step_copies`` of the drafts' width): the copy
    completed by the drafter's tokens (``lookup.spliced``, as ``lookup.lookup_or_draft``; possibly equal to the
    drafter's own draft)."""
    return {i: spliced(copy, draft) for i, (draft, copy) in enumerate(zip(drafts, copies)) if copy and draft}


def cut_rows(drafts: list[list[int]], confidence: list[list[float]], keep: set[int] | dict,
             min_confidence: float) -> list[list[int]]:
    """Each draft cut before the first position where the running product of the drafter's top-1 probabilities
    falls below ``min_confidence``; the rows in ``keep`` (copied chains) whole."""
    out = []
    for i, (draft, conf) in enumerate(zip(drafts, confidence)):
        if i not in keep:
            p, n = 1.0, 0
            for c in conf[: len(draft)]:
                p *= c
                if p < min_confidence:
                    break
                n += 1
            draft = draft[:n]
        out.append(draft)
    return out


_FIRST_PASS = ("set_inputs_first_pass", "build_model_inputs_first_pass")  # vLLM's dflash steps the skip runs


def _histories(input_batch, sampled=None, vocab_size: int = 0) -> list[list[int] | None]:
    """Each request's latest committed tokens (``input_batch`` rows; the lookup's window, not the whole context),
    plus this step's valid ``sampled`` tokens where the runner has not written them yet (vLLM's padded drafter batch
    proposes before its bookkeeping)."""
    rows = []
    extra = sampled.tolist() if sampled is not None else None
    for i in range(input_batch.num_reqs):
        n = int(input_batch.num_tokens_no_spec[i])
        tokens = input_batch.token_ids_cpu[i, max(0, n - LOOKUP_WINDOW) : n].tolist()
        if extra is not None:
            tokens += [t for t in extra[i] if 0 <= t < vocab_size]
        rows.append(tokens)
    return rows


def _lookup_proposer(base: type) -> type:
    """A subclass of vLLM's ``DFlashProposer`` that splices copied candidates into its drafts and cuts the drafter's
    unlikely tail."""

    class LookupDFlashProposer(base):
        _specdiff_lookup = True

        def __init__(self, vllm_config, device, runner=None):
            super().__init__(vllm_config, device, runner)
            hf_config = self.draft_model_config.hf_config
            self._lookup = lookup_settings(hf_config)
            self._min_confidence = confidence_setting(hf_config)
            scheduler = getattr(vllm_config, "scheduler_config", None)
            if self._min_confidence and getattr(scheduler, "async_scheduling", False):
                # Async scheduling keeps the drafts on the device in a fixed [num_reqs, k] layout.
                logger.info("specdiff: async scheduling keeps every draft whole (no confidence cut)")
                self._min_confidence = None
            # The skipped drafter pass calls two of vLLM's own steps; under another vLLM layout, no skip.
            self._skip = bool(self._lookup) and all(callable(getattr(self, name, None)) for name in _FIRST_PASS)
            if self._lookup and not self._skip:
                logger.warning("specdiff: this vLLM's DFlashProposer lacks %s; the drafter runs on every step",
                               " or ".join(_FIRST_PASS))
            self._pending: list[list[int] | None] | None = None
            self._confidence = None
            if self._lookup:
                logger.info("specdiff: prompt lookup beside the dflash drafter (n-grams %d to %d)", *self._lookup)
            if self._min_confidence:
                logger.info("specdiff: drafts cut where the drafter's confidence falls below %g",
                            self._min_confidence)

        def prepare_next_token_ids_cpu(self, sampled_token_ids, requests, gpu_input_batch, num_scheduled_tokens):
            if self._lookup:  # after vLLM's bookkeeping: the batch already holds this step's tokens
                self._pending = _histories(gpu_input_batch)
            return super().prepare_next_token_ids_cpu(sampled_token_ids, requests, gpu_input_batch,
                                                      num_scheduled_tokens)

        def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                          discard_request_mask):
            if self._lookup:
                self._pending = _histories(gpu_input_batch, sampled_token_ids.cpu(), gpu_input_batch.vocab_size)
                for i in discard_request_mask[: len(self._pending)].nonzero().flatten().tolist():
                    self._pending[i] = None  # a partial prefill: its draft is not used
            return super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch,
                                                         discard_request_mask)

        def _greedy_sample(self, hidden_states):
            """vLLM's argmax drafts, keeping each row's top-1 probability for the confidence cut."""
            if (not self._min_confidence or getattr(self, "use_local_argmax_reduction", False)
                    or getattr(self, "use_heterogeneous_vocab", False)):
                return super()._greedy_sample(hidden_states)
            logits = self.model.compute_logits(hidden_states)
            top, ids = logits.max(dim=-1)
            self._confidence = (top.float() - logits.float().logsumexp(dim=-1)).exp()
            return ids

        def propose(self, *args, **kwargs):
            self._confidence = None
            pending, self._pending = self._pending, None
            k = kwargs.get("num_speculative_tokens") or 0  # vLLM 0.32's runner passes keywords
            copies = step_copies(pending, k, *self._lookup) if self._lookup and pending and k else None
            full = full_copies(copies, k) if self._skip and copies is not None and not args else None
            if full is not None:
                # Every request verifies a copy this step and the drafter's window would be discarded: write the
                # new context tokens' keys/values into the draft cache (the part of the drafter pass later steps
                # read) and skip the query forward and its sampling.
                self._store_context_only(**kwargs)
                import torch

                return torch.tensor(full, dtype=torch.int64, device=self.device)
            drafts = super().propose(*args, **kwargs)  # [num_reqs, num_speculative_tokens]
            confidence, self._confidence = self._confidence, None
            if drafts.ndim != 2 or drafts.shape[1] == 0:
                return drafts
            rows = {}
            if self._lookup and pending:
                if copies is None or drafts.shape[1] != k:  # called positionally: the window's size is known now
                    copies = step_copies(pending, drafts.shape[1], *self._lookup)
                rows = splice_rows(drafts.tolist(), copies)
            probs = self._last_draft_probs  # [num_reqs, k, V] when vLLM sampled the drafts
            if rows:
                import torch

                index = torch.tensor(list(rows), device=drafts.device)
                chains = torch.tensor(list(rows.values()), device=drafts.device, dtype=drafts.dtype)
                drafts[index] = chains
                if probs is not None:
                    # Deterministic proposals wherever a copy exists, even where the drafter's sample equals it.
                    probs[index] = 0
                    probs[index.unsqueeze(1), torch.arange(chains.shape[1], device=drafts.device), chains.long()] = 1
            if not self._min_confidence:
                return drafts
            if probs is not None:  # the cut reads the distribution, never the sampled token: lossless at T > 0
                confidence = probs.amax(dim=-1)
            if confidence is None:
                return drafts
            return cut_rows(drafts.tolist(), confidence.view(drafts.shape).tolist(), rows, self._min_confidence)

        def _store_context_only(self, *, num_speculative_tokens, target_token_ids, target_positions,
                                target_hidden_states, next_token_ids, token_indices_to_sample, common_attn_metadata,
                                num_rejected_tokens_gpu=None, **_):
            """The first half of vLLM's ``propose`` for dflash: the context keys/values, no query forward."""
            self.num_speculative_tokens = num_speculative_tokens
            self._last_draft_probs = None  # the copies are deterministic proposals
            num_tokens, _, _ = self.set_inputs_first_pass(
                target_token_ids=target_token_ids, next_token_ids=next_token_ids, target_positions=target_positions,
                target_hidden_states=self.model.combine_hidden_states(target_hidden_states),
                token_indices_to_sample=token_indices_to_sample, cad=common_attn_metadata,
                num_rejected_tokens_gpu=num_rejected_tokens_gpu)
            self.build_model_inputs_first_pass(num_tokens, num_tokens, None)  # writes the context K/V

    LookupDFlashProposer.__name__ = LookupDFlashProposer.__qualname__ = "LookupDFlashProposer"
    return LookupDFlashProposer


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it once in each of its processes."""
    try:
        from vllm.v1.worker import gpu_model_runner
    except ImportError as e:  # another vLLM layout: leave vLLM as it is, and say so
        logger.warning("specdiff: vLLM's model runner not found (%s); dflash drafts run without prompt lookup", e)
        return
    base = getattr(gpu_model_runner, "DFlashProposer", None)
    if base is None:
        logger.warning("specdiff: this vLLM has no DFlashProposer; dflash drafts run without prompt lookup")
        return
    if not getattr(base, "_specdiff_lookup", False):
        gpu_model_runner.DFlashProposer = _lookup_proposer(base)
