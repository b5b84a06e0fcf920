"""specdiff.vllm.plugin without vLLM: the subclass it puts in place of vLLM's DFlashProposer, run over a stand-in base
class with vLLM's method names (tests/test_vllm_engine.py runs it inside vLLM). It splices a copied chain into a
request's draft where the request's tokens repeat, keeps the drafter's draft elsewhere and for partial prefills,
sets a replaced row's draft probabilities one-hot, and leaves everything alone when the export asks for no lookup."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdiff.core.lookup import lookup_or_draft
from specdiff.vllm.plugin import (_FIRST_PASS, _lookup_proposer, confidence_setting, cut_rows, full_copies, register,
                                  splice_rows, step_copies)

V = 100


class StandInDFlash:
    """vLLM's DFlashProposer as the plugin sees it: constructor, the two prepare hooks, propose (which drafts through
    ``_greedy_sample`` when the test gives it hidden states), and the first-pass methods the plugin calls alone."""

    def __init__(self, vllm_config, device, runner=None):
        self.draft_model_config = vllm_config.speculative_config.draft_model_config
        self.device = device
        self._last_draft_probs = None
        self.drafts, self.probs, self.logits = None, None, None
        self.calls = []
        self.model = SimpleNamespace(combine_hidden_states=lambda h: h + 1, compute_logits=lambda h: h)

    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch, discard_request_mask):
        return "next", "count"

    def prepare_next_token_ids_cpu(self, sampled_token_ids, requests, gpu_input_batch, num_scheduled_tokens):
        return "next"

    def _greedy_sample(self, hidden_states):
        return hidden_states.argmax(-1)

    def propose(self, **kwargs):
        self.calls.append("propose")
        self._last_draft_probs = None if self.probs is None else self.probs.clone()
        if self.logits is not None:  # [num_reqs, k, V]: drafts through the (possibly overridden) greedy sampler
            return self._greedy_sample(self.logits.flatten(0, 1)).view(self.logits.shape[:2])
        return self.drafts.clone()

    def set_inputs_first_pass(self, *, target_hidden_states, **kwargs):
        self.calls.append(("first pass", target_hidden_states.tolist()))
        return 7, "indices", "metadata"

    def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
        self.calls.append(("context K/V", num_tokens))
        return {}, num_tokens


def proposer(lookup: dict | None, confidence: float | None = None, async_scheduling: bool = False,
             base: type = StandInDFlash):
    dflash = {"mask_token_id": 0, **({"specdiff_prompt_lookup": lookup} if lookup else {}),
              **({"specdiff_min_draft_confidence": confidence} if confidence else {})}
    config = SimpleNamespace(speculative_config=SimpleNamespace(
        draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(dflash_config=dflash))),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))
    return _lookup_proposer(base)(config, "cpu")


def step(k: int = 4) -> dict:
    """The keyword arguments vLLM's runner passes to ``propose``."""
    return dict(num_speculative_tokens=k, target_token_ids=torch.tensor([1]), target_positions=torch.tensor([0]),
                target_hidden_states=torch.zeros(1, 2), next_token_ids=torch.tensor([1]),
                token_indices_to_sample=None, common_attn_metadata="cad", sampling_metadata=None)


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
    out = p.propose(**step())
    assert out.tolist() == [[8, 9, 5, 6], [11, 12, 13, 14], [21, 22, 23, 24]] and out.dtype == torch.int32
    probs = p._last_draft_probs
    assert torch.equal(probs[0], torch.nn.functional.one_hot(torch.tensor([8, 9, 5, 6]), V).float())
    assert torch.equal(probs[1:], p.probs[1:])
    # Histories are per step: the next propose without a prepare call splices nothing.
    assert p.propose(**step()).tolist() == p.drafts.tolist()


def test_cpu_batch_reads_the_tokens_vllm_already_wrote():
    p = proposer({"min_ngram": 2, "max_ngram": 4})
    p.prepare_next_token_ids_cpu([[7]], {}, batch([[5, 6, 7, 8, 9, 5, 6, 7, 3]]), {})
    p.drafts = torch.tensor([[1, 1, 1, 1]])
    assert p.propose(**step()).tolist() == [[1, 1, 1, 1]]  # no repeat of [.., 7, 3]
    p.prepare_next_token_ids_cpu([[7]], {}, batch([[5, 6, 7, 8, 9, 5, 6, 7, 3, 4, 5, 6]]), {})
    assert p.propose(**step()).tolist() == [[7, 3, 4, 5]]  # the latest [5, 6]: a full copy, no drafter pass
    assert p.calls[-1] == ("context K/V", 7)


def test_no_lookup_in_the_export_leaves_vllms_drafts():
    p = proposer(None)
    p.prepare_next_token_ids_padded(torch.tensor([[7]]), {}, batch([[5, 6, 7, 8, 5, 6]]), torch.tensor([False]))
    p.drafts = torch.tensor([[1, 1, 1, 1]])
    assert p.propose(**step()).tolist() == [[1, 1, 1, 1]] and p.calls == ["propose"]


def test_splice_rows_reports_every_row_with_a_copy():
    # Also where the drafter's window equals the copy: at T > 0 that row's proposal is the deterministic copy, and
    # keeping the drafter's probabilities for it would bias acceptance.
    copies = step_copies([[5, 6, 7, 8, 5, 6], None], 4, 2, 4)
    assert copies == [[7, 8, 5, 6], None]
    assert splice_rows([[7, 8, 5, 6], [1, 1, 1, 1]], copies) == {0: [7, 8, 5, 6]}
    assert splice_rows([[0, 0, 0, 0], [1, 1, 1, 1]], step_copies([[5, 6, 7, 8, 5, 6], [1, 2, 3]], 4, 2, 4)) == {
        0: [7, 8, 5, 6]}
    # A short copy is completed by the drafter's tokens, as lookup_or_draft does.
    history, draft = [5, 6, 7, 5, 6], [9, 9, 9, 9]
    assert splice_rows([draft], step_copies([history], 4, 2, 4)) == {0: lookup_or_draft(draft, history)} == {
        0: [7, 5, 6, 9]}


def test_a_copy_equal_to_the_drafters_sample_still_gets_one_hot_probabilities():
    p = proposer({"min_ngram": 2, "max_ngram": 4})
    ib = batch([[5, 6, 7, 8, 9, 5, 6], [1, 2, 3]])  # row 1 has no copy: the drafter runs
    p.prepare_next_token_ids_padded(torch.tensor([[-1], [-1]]), {}, ib, torch.tensor([False, False]))
    p.drafts = torch.tensor([[7, 8, 9, 5], [1, 1, 1, 1]])
    p.probs = torch.full((2, 4, V), 1 / V)
    assert p.propose(**step()).tolist() == [[7, 8, 9, 5], [1, 1, 1, 1]]
    assert torch.equal(p._last_draft_probs[0], torch.nn.functional.one_hot(torch.tensor([7, 8, 9, 5]), V).float())
    assert torch.equal(p._last_draft_probs[1], p.probs[1])


def test_every_request_copying_skips_the_drafters_query_pass():
    """Where every request of the step has a full-window copy, the drafter's window would be thrown away: only the
    context keys/values are written (vLLM's first pass), the query forward is skipped, the copies are the drafts."""
    p = proposer({"min_ngram": 2, "max_ngram": 4})
    ib = batch([[5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 4, 5, 1, 2]])
    p.prepare_next_token_ids_padded(torch.tensor([[-1], [-1]]), {}, ib, torch.tensor([False, False]))
    p._last_draft_probs = torch.ones(1)  # left over from an earlier step
    out = p.propose(**step())
    assert out.tolist() == [[7, 8, 9, 5], [3, 4, 5, 1]] and out.dtype == torch.int64
    assert p.calls == [("first pass", [[1.0, 1.0]]), ("context K/V", 7)]  # combined states; no "propose"
    assert p._last_draft_probs is None  # deterministic proposals
    # One request without a full copy: the drafter runs for the batch.
    p.calls.clear()
    p.prepare_next_token_ids_padded(torch.tensor([[-1], [-1]]), {}, batch([[5, 6, 7, 8, 9, 5, 6], [1, 2, 3]]),
                                    torch.tensor([False, False]))
    p.drafts = torch.tensor([[0, 0, 0, 0], [11, 12, 13, 14]])
    assert p.propose(**step()).tolist() == [[7, 8, 9, 5], [11, 12, 13, 14]] and p.calls == ["propose"]


def test_a_vllm_without_the_first_pass_steps_runs_the_drafter_every_step(caplog):
    class OlderDFlash(StandInDFlash):
        set_inputs_first_pass = None

    with caplog.at_level(logging.WARNING, logger="specdiff.vllm.plugin"):
        p = proposer({"min_ngram": 2, "max_ngram": 4}, base=OlderDFlash)
    assert "the drafter runs on every step" in caplog.text
    p.prepare_next_token_ids_padded(torch.tensor([[-1]]), {}, batch([[5, 6, 7, 8, 9, 5, 6]]), torch.tensor([False]))
    p.drafts = torch.tensor([[0, 0, 0, 0]])
    assert p.propose(**step()).tolist() == [[7, 8, 9, 5]] and p.calls == ["propose"]  # spliced, not skipped


def test_full_copies_needs_every_row_and_the_whole_window():
    rows = [[5, 6, 7, 5, 6], [1, 2, 3, 1, 2]]
    assert full_copies(step_copies(rows, 2, 2, 4), 2) == [[7, 5], [3, 1]]
    assert full_copies(step_copies(rows, 4, 2, 4), 4) is None  # 3 tokens follow the earlier [5, 6]
    assert full_copies(step_copies([[5, 6, 7, 5, 6], None], 1, 2, 4), 1) is None  # a partial prefill
    assert full_copies(step_copies([[1, 2, 3]], 1, 2, 4), 1) is None  # no earlier occurrence
    assert full_copies([], 4) is None and full_copies(step_copies([[5, 6, 5, 6]], 0, 2, 4), 0) is None


def test_cut_rows_keeps_the_drafts_while_the_running_confidence_holds():
    drafts = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    conf = [[0.9, 0.8, 0.3, 0.9], [0.2, 1.0, 1.0, 1.0], [0.1, 0.1, 0.1, 0.1]]
    # 0.9, 0.72, 0.216 < 0.5: two kept; 0.2 < 0.5: none; row 2 is a copied chain: whole.
    assert cut_rows(drafts, conf, {2}, 0.5) == [[1, 2], [], [9, 9, 9, 9]]
    assert cut_rows(drafts, conf, set(), 0.01) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]]


def test_confidence_cut_inside_propose_greedy_and_sampled():
    p = proposer({"min_ngram": 2, "max_ngram": 4}, confidence=0.5)
    # Greedy drafts: the plugin's _greedy_sample keeps the top-1 probabilities of vLLM's logits.
    logits = torch.full((2, 4, V), -30.0)
    logits[0, :, 3] = 5.0  # ~1, ~1, then a flat row (top probability 1/V): cut after 2
    logits[0, 2] = 0.0
    logits[1, :, 4] = 5.0
    p.logits = logits
    p.prepare_next_token_ids_padded(torch.tensor([[-1], [-1]]), {}, batch([[1, 2, 3], [5, 6, 7, 8, 9, 5, 6]]),
                                    torch.tensor([False, False]))
    assert p.propose(**step()) == [[3, 3], [7, 8, 9, 5]]  # row 1 is a copy: whole
    # Sampled drafts (T > 0): the cut reads each row's distribution (its top probability), not the sampled token's
    # probability, so the length does not depend on the draw: verification stays lossless.
    p.logits = None
    p.drafts = torch.tensor([[1, 2, 3, 4]])
    probs = torch.zeros(1, 4, V)
    probs[0, :, 0] = torch.tensor([0.9, 0.9, 0.2, 0.9])
    probs[0, :, 1:5] = ((1 - probs[0, :, 0]) / 4)[:, None]
    p.probs = probs
    p.prepare_next_token_ids_cpu([[1]], {}, batch([[1, 2, 3]]), {})
    assert p.propose(**step()) == [[1, 2]]
    # With async scheduling vLLM keeps drafts in a fixed layout: no cut.
    q = proposer(None, confidence=0.5, async_scheduling=True)
    q.drafts = torch.tensor([[1, 2, 3, 4]])
    assert q.propose(**step()).tolist() == [[1, 2, 3, 4]]


def test_confidence_setting_is_read_and_checked():
    assert confidence_setting(SimpleNamespace(dflash_config={"specdiff_min_draft_confidence": 0.3})) == 0.3
    assert confidence_setting(SimpleNamespace(dflash_config={})) is None
    assert confidence_setting(SimpleNamespace()) is None
    assert confidence_setting(SimpleNamespace(dflash_config={"specdiff_min_draft_confidence": 0})) is None  # off
    for bad in (1.5, -0.1, 1, "0.3", True, False):
        with pytest.raises(ValueError, match="specdiff_min_draft_confidence must be a probability"):
            confidence_setting(SimpleNamespace(dflash_config={"specdiff_min_draft_confidence": bad}))


def test_register_patches_vllms_runner_once_or_warns(caplog):
    try:
        from vllm.v1.worker import gpu_model_runner
    except ImportError:  # the main virtualenv: nothing to patch, and the log says so
        with caplog.at_level(logging.WARNING, logger="specdiff.vllm.plugin"):
            register()
        assert "without prompt lookup" in caplog.text
        return
    register()
    register()  # vLLM may call it more than once per process
    cls = gpu_model_runner.DFlashProposer
    assert cls._specdiff_lookup and cls.__mro__[1].__name__ == "DFlashProposer"
    # The vLLM steps the plugin calls or overrides: a vLLM that renames them fails here, not silently.
    base = cls.__mro__[1]
    assert all(callable(getattr(base, name, None)) for name in _FIRST_PASS + ("_greedy_sample",))


def test_one_search_per_request_per_step(monkeypatch):
    """The skip test and the splice read the same copies: each request's context is searched once a step."""
    import specdiff.vllm.plugin as plugin

    searched = []
    real = plugin.lookup_continuation
    monkeypatch.setattr(plugin, "lookup_continuation", lambda h, *a, **k: searched.append(list(h)) or real(h, *a, **k))
    p = proposer({"min_ngram": 2, "max_ngram": 4})
    ib = batch([[5, 6, 7, 8, 9, 5, 6], [1, 2, 3]])  # row 1 has no copy: the drafter runs, row 0 is spliced
    p.prepare_next_token_ids_padded(torch.tensor([[-1], [-1]]), {}, ib, torch.tensor([False, False]))
    p.drafts = torch.tensor([[0, 0, 0, 0], [11, 12, 13, 14]])
    assert p.propose(**step()).tolist() == [[7, 8, 9, 5], [11, 12, 13, 14]]
    assert searched == [[5, 6, 7, 8, 9, 5, 6], [1, 2, 3]]
