"""specdiff.vllm_plugin without vLLM: the subclass it puts in place of vLLM's DFlashProposer, run over a stand-in base
class with vLLM's method names (tests/test_vllm_engine.py runs it inside vLLM). It splices a copied chain into a
request's draft where the request's tokens repeat, keeps the drafter's draft elsewhere and for partial prefills,
sets a replaced row's draft probabilities one-hot, and leaves everything alone when the export asks for no lookup."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdiff.lookup import lookup_or_draft
from specdiff.vllm_plugin import _lookup_proposer, register, splice_rows

V = 100


class StandInDFlash:
    """vLLM's DFlashProposer as the plugin sees it: constructor, the two prepare hooks, propose."""

    def __init__(self, vllm_config, device, runner=None):
        self.draft_model_config = vllm_config.speculative_config.draft_model_config
        self._last_draft_probs = None
        self.drafts, self.probs = None, None

    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch, discard_request_mask):
        return "next", "count"

    def prepare_next_token_ids_cpu(self, sampled_token_ids, requests, gpu_input_batch, num_scheduled_tokens):
        return "next"

    def propose(self, **kwargs):
        self._last_draft_probs = None if self.probs is None else self.probs.clone()
        return self.drafts.clone()


def proposer(lookup: dict | None):
    dflash = {"mask_token_id": 0, **({"specdiff_prompt_lookup": lookup} if lookup else {})}
    config = SimpleNamespace(speculative_config=SimpleNamespace(
        draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(dflash_config=dflash))))
    return _lookup_proposer(StandInDFlash)(config, "cpu")


def batch(rows: list[list[int]]):
    ids = np.zeros((len(rows), 32), dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return SimpleNamespace(num_reqs=len(rows), num_tokens_no_spec=np.array([len(r) for r in rows]), token_ids_cpu=ids,
                           vocab_size=V)


def test_lookup_or_draft_copies_where_the_context_repeats():
    assert lookup_or_draft([9, 9, 9, 9], [5, 6, 7, 8, 5, 6]) == [7, 8, 5, 6]
    assert lookup_or_draft([9, 9, 9, 9], [1, 2, 1, 2]) == [1, 2, 9, 9]  # a short copy, completed by the drafter
    assert lookup_or_draft([9, 9, 9, 9], [1, 2, 3, 2]) is None  # a 1-gram repeat is below min_ngram=2
    assert lookup_or_draft([9, 9, 9, 9], [1, 2, 3, 2], min_ngram=1) == [3, 2, 9, 9]
    assert lookup_or_draft([], [1, 2, 1, 2]) is None


def test_padded_batch_splices_copies_and_one_hots_their_probabilities():
    p = proposer({"min_ngram": 2, "max_ngram": 4})
    # Row 0 repeats [5, 6, 7] once this step's sampled 7 is added; row 1 does not repeat; row 2 repeats but is a
    # partial prefill (discarded), whose draft vLLM does not use.
    ib = batch([[5, 6, 7, 8, 9, 5, 6], [1, 2, 3], [1, 2, 1, 2]])
    sampled = torch.tensor([[7, -1, -1], [4, -1, -1], [-1, -1, -1]])
    discard = torch.tensor([False, False, True, False])  # vLLM's mask is sized for its largest batch
    assert p.prepare_next_token_ids_padded(sampled, {}, ib, discard) == ("next", "count")
    p.drafts = torch.tensor([[1, 1, 1, 1], [11, 12, 13, 14], [21, 22, 23, 24]], dtype=torch.int32)
    p.probs = torch.softmax(torch.randn(3, 4, V, generator=torch.Generator().manual_seed(0)), -1)
    out = p.propose()
    assert out.tolist() == [[8, 9, 5, 6], [11, 12, 13, 14], [21, 22, 23, 24]] and out.dtype == torch.int32
    probs = p._last_draft_probs
    assert torch.equal(probs[0], torch.nn.functional.one_hot(torch.tensor([8, 9, 5, 6]), V).float())
    assert torch.equal(probs[1:], p.probs[1:])
    # Histories are per step: the next propose without a prepare call splices nothing.
    assert p.propose().tolist() == p.drafts.tolist()


def test_cpu_batch_reads_the_tokens_vllm_already_wrote():
    p = proposer({"min_ngram": 2, "max_ngram": 4})
    p.prepare_next_token_ids_cpu([[7]], {}, batch([[5, 6, 7, 8, 9, 5, 6, 7]]), {})
    p.drafts = torch.tensor([[1, 1, 1, 1]])
    assert p.propose().tolist() == [[8, 9, 5, 6]]


def test_no_lookup_in_the_export_leaves_vllms_drafts():
    p = proposer(None)
    p.prepare_next_token_ids_padded(torch.tensor([[7]]), {}, batch([[5, 6, 7, 8, 5, 6]]), torch.tensor([False]))
    p.drafts = torch.tensor([[1, 1, 1, 1]])
    assert p.propose().tolist() == [[1, 1, 1, 1]]


def test_splice_rows_reports_only_changed_rows():
    assert splice_rows([[7, 8, 5, 6], [1, 1]], [[5, 6, 7, 8, 5, 6], None], 2, 4) == {}  # the drafter had the copy
    assert splice_rows([[0, 0, 0, 0]], [[5, 6, 7, 8, 5, 6]], 2, 4) == {0: [7, 8, 5, 6]}


def test_register_patches_vllms_runner_once_or_warns(caplog):
    try:
        from vllm.v1.worker import gpu_model_runner
    except ImportError:  # the main virtualenv: nothing to patch, and the log says so
        with caplog.at_level(logging.WARNING, logger="specdiff.vllm_plugin"):
            register()
        assert "without prompt lookup" in caplog.text
        return
    register()
    register()  # vLLM may call it more than once per process
    cls = gpu_model_runner.DFlashProposer
    assert cls._specdiff_lookup and cls.__mro__[1].__name__ == "DFlashProposer"
