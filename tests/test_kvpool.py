"""Pooled KV caches (specdiff.models.kvpool): a batch step over sessions whose caches share one buffer attends per
group in one call, and computes what per-session caches compute; the pool grows, frees and reuses slots safely."""

from __future__ import annotations

import pytest
import torch

from test_llama import save_tiny

from specdiff.core.tree import build_tree, chain as chain_of
from specdiff.models.kvpool import KVPool, StepPlan
from specdiff.models.llama import Piece, load_llama
from specdiff.models.verifier import HFVerifier

PROMPTS = [[5, 9, 2, 7, 1], [3] * 11, [40, 41, 42], list(range(60, 100)), [7, 7, 8], [2, 30, 4, 50, 6, 70],
           list(range(1, 90))]


@pytest.fixture(scope="module")
def lean(tmp_path_factory):
    return load_llama(save_tiny(tmp_path_factory.mktemp("tiny")))


def _pooled_session(verifier, pool, prompt):
    """A verifier session whose cache lives in ``pool`` (prefilled there, as a batched session's)."""
    session = HFVerifier.start(verifier, prompt[:1])
    session.tokens = list(prompt)
    session.cache = pool.cache()
    if len(prompt) > 1:
        verifier.model.forward_ragged([Piece(torch.tensor(prompt[:-1]), session.cache, last=1)])
    return session


def _assert_same_cache(a, b):
    assert a.get_seq_length() == b.get_seq_length()
    for x, y in zip(a.layers, b.layers):
        torch.testing.assert_close(y.keys, x.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y.values, x.values, rtol=1e-5, atol=1e-5)


def test_steps_over_a_pool_equal_steps_over_separate_caches(lean, monkeypatch):
    """Rounds of mixed pieces (plain steps, chains, trees, a prefill that attends alone) over pooled caches: every
    session's log-probs and cache equal those over its own cache, round after round with commits, and the pooled
    steps did attend in groups."""
    verifier = HFVerifier(lean, tune_kernels=False)
    pool = KVPool(lean.config.num_hidden_layers, min_room=8)  # small room: the pool grows during the rounds
    plans = []
    real_plan = lean._plan
    monkeypatch.setattr(lean, "_plan", lambda *a: plans.append(real_plan(*a)) or plans[-1])
    separate = [verifier.start(p) for p in PROMPTS]
    pooled = [_pooled_session(verifier, pool, p) for p in PROMPTS]
    for s, p in zip(separate, pooled):
        _assert_same_cache(s.cache, p.cache)
    g = torch.Generator().manual_seed(0)
    for round_ in range(4):
        trees = []
        for i, s in enumerate(separate):
            kind = (i + round_) % 3
            if kind == 0:
                trees.append(chain_of(s.tokens[-1], []))
            elif kind == 1:
                trees.append(chain_of(s.tokens[-1], torch.randint(0, 200, (3,), generator=g).tolist()))
            else:
                trees.append(build_tree(s.tokens[-1], torch.randint(0, 200, (3, 4), generator=g)))
        want = [s.score(t) for s, t in zip(separate, trees)]
        pieces = []
        for p, t in zip(pooled, trees):
            mask, positions = p.tree_inputs(t)
            pieces.append(Piece(t.tokens, p.cache, position_ids=positions, mask=mask))
        if round_ == 2:  # a prefill of a new session joins the step: it attends alone
            extra = pool.cache()
            pieces.append(Piece(torch.arange(1, 80), extra, last=1))
        out = lean.forward_ragged(pieces)
        for p, t, w, o in zip(pooled, trees, want, out):
            torch.testing.assert_close(p.scored(t, *o), w, rtol=1e-5, atol=1e-5)
        for s, p, t, w in zip(separate, pooled, trees, want):
            path = [1, 2] if t.num_nodes > 4 else list(range(1, t.num_nodes))
            nxt = int(w[path[-1] if path else 0].argmax())
            s.commit(path, nxt)
            p.commit(path, nxt)
            _assert_same_cache(s.cache, p.cache)
    assert any(plan.groups for plan in plans)  # the batched attention ran, not only the per-piece path
    assert any(plan.alone for plan in plans)
    assert pool.room > 8 and pool.slots >= len(PROMPTS) + 1


def test_plan_groups_pieces_by_rows_within_the_padding_bound(lean):
    pool = KVPool(lean.config.num_hidden_layers)
    caches = [pool.cache() for _ in range(6)]
    for c in caches:
        lean.forward_ragged([Piece(torch.arange(1, 20), c, last=1)])
    like = torch.zeros(1, lean.config.num_key_value_heads, 1, lean.config.head_size)
    sizes = [1, 1, 1, 1, 9, 9]
    spans, at = [], 0
    for n in sizes:
        spans.append((at, at + n))
        at += n
    pieces = [Piece(torch.arange(1, n + 1), c) for n, c in zip(sizes, caches)]
    plan = StepPlan(pool, pieces, spans, [None] * 6, heads=lean.config.num_attention_heads,
                    kv_heads=lean.config.num_key_value_heads, dtype=torch.float32, device=torch.device("cpu"),
                    like=like)
    # the four plain steps (slots 0-3) in one group; the two 9-row pieces (slots 4-5) in another
    assert [(g.lo, g.hi, g.width) for g in plan.groups] == [(0, 4, 1), (4, 6, 9)]
    assert plan.alone == []


def test_pool_slots_are_reused_released_caches_refuse_use_and_the_last_release_frees_memory(lean):
    pool = KVPool(lean.config.num_hidden_layers)
    a, b = pool.cache(), pool.cache()
    assert (a.slot, b.slot) == (0, 1)
    lean.forward_ragged([Piece(torch.arange(1, 10), a), Piece(torch.arange(1, 5), b)])
    kept = b.layers[0].keys.clone()
    a.release()
    c = pool.cache()
    assert c.slot == 0  # the lowest free slot
    with pytest.raises(RuntimeError, match="released"):
        a.layers[0].keys
    lean.forward_ragged([Piece(torch.arange(1, 200), c)])  # grows the room: b's keys move and stay intact
    torch.testing.assert_close(b.layers[0].keys, kept)
    assert pool.nbytes > 0
    b.release()
    c.release()
    assert pool.nbytes == 0 and pool.cache().slot == 0


def test_a_failed_step_rolls_pooled_caches_back_and_the_good_pass_runs_exactly(lean):
    """A step whose second pass breaks in layer 0 (after the step wrote every pass's keys there) is rolled back; the
    good pass then runs alone and gets what it gets without the bad one, and only the bad pass fails."""
    from specdiff.models.batched import BatchedVerifier, _Pass, _Request

    verifier = HFVerifier(lean, tune_kernels=False)
    reference = verifier.start(PROMPTS[0])
    want = reference.score(chain_of(reference.tokens[-1], []))
    batched = BatchedVerifier(verifier)
    good, other = batched.start(PROMPTS[0]), batched.start(PROMPTS[1])
    assert batched.pool is not None and good.cache.pool is batched.pool
    chain = chain_of(good.tokens[-1], [])
    mask, positions = good.tree_inputs(chain)
    ok = _Pass(Piece(chain.tokens, good.cache, position_ids=positions, mask=mask), None)
    n = 70  # more rows than a group takes: it attends alone, with a mask of the wrong width
    bad = _Pass(Piece(torch.arange(1, n + 1), other.cache, mask=torch.zeros(1, 1, n, 3)), None)
    requests = [_Request(ok, 1, None, 1.0), _Request(bad, n, None, 1.0)]
    batched.batcher._run_batch(requests)
    assert requests[1].error is not None and requests[0].error is None
    torch.testing.assert_close(good.scored(chain, *requests[0].result), want, rtol=1e-5, atol=1e-5)
    assert other.cache.get_seq_length() == len(PROMPTS[1]) - 1  # the bad pass left its session as it was
    assert {layer.length for layer in other.cache.layers} == {len(PROMPTS[1]) - 1}
    good.close()
    other.close()
    assert batched.pool.nbytes == 0
