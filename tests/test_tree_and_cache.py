"""Tree attention scores every candidate exactly; the KV-cache commit keeps the cache exact; selection is optimal."""

from __future__ import annotations

import torch

from helpers import full_logprobs
from specdiff import HFVerifier, SamplingParams, build_tree, expected_streak, select
from specdiff.core.tree import chain

PROMPT = [3, 17, 9, 41, 2, 8]
# Shared prefixes (rows 0/1 share 2 tokens, rows 2/3 share 1), a duplicate (row 4 == row 0) and a lone branch.
CANDIDATES = torch.tensor(
    [
        [5, 6, 7, 8],
        [5, 6, 9, 9],
        [1, 2, 3, 4],
        [1, 7, 7, 7],
        [5, 6, 7, 8],
        [11, 12, 13, 14],
    ]
)


def test_trie_merges_shared_prefixes_and_duplicates():
    tree = build_tree(0, CANDIDATES)
    assert tree.candidates.shape[0] == 5  # the duplicate collapsed
    assert tree.candidate_of.tolist() == [0, 1, 2, 3, 0, 4]
    assert tree.num_nodes == 1 + 4 + 2 + 4 + 3 + 4
    for row, path in zip(tree.candidates, tree.paths):
        assert tree.tokens[path].tolist() == row.tolist()
        assert tree.depth[path].tolist() == [1, 2, 3, 4]
    mask = tree.attention_mask()
    leaf = int(tree.paths[1, -1])
    assert mask[leaf].nonzero().flatten().tolist() == sorted([0] + tree.paths[1].tolist())


def test_tree_scoring_equals_separate_forward_passes(verifier_model):
    session = HFVerifier(verifier_model).start(PROMPT)
    tree = build_tree(PROMPT[-1], CANDIDATES)
    logp = session.score(tree)  # [N+1, V]
    for row in range(tree.candidates.shape[0]):
        cand = tree.candidates[row].tolist()
        reference = full_logprobs(verifier_model, PROMPT + cand)[len(PROMPT) - 1 :]  # [gamma+1, V]
        nodes = [0] + tree.paths[row].tolist()
        torch.testing.assert_close(logp[nodes], reference, atol=1e-5, rtol=1e-5)


def test_commit_keeps_cache_exact(verifier_model):
    session = HFVerifier(verifier_model).start(PROMPT)
    tokens = list(PROMPT)
    # Round 1: accept two tokens of a candidate that is NOT the trie's first path (nodes must be moved).
    tree = build_tree(tokens[-1], CANDIDATES)
    session.score(tree)
    path = tree.paths[2, :2].tolist()
    session.commit(path, 33)
    tokens += tree.candidates[2, :2].tolist() + [33]
    assert session.tokens == tokens and session.cached == len(tokens) - 1
    # Round 2: accept the first path entirely; round 3: reject at once.
    for accept, nxt in [(4, 21), (0, 12)]:
        tree = build_tree(tokens[-1], CANDIDATES[[1, 3]])
        logp = session.score(tree)
        torch.testing.assert_close(logp[0], full_logprobs(verifier_model, tokens)[-1], atol=1e-5, rtol=1e-5)
        session.commit(tree.paths[0, :accept].tolist(), nxt)
        tokens += tree.candidates[0, :accept].tolist() + [nxt]
    logp = session.score(chain(tokens[-1], []))
    torch.testing.assert_close(logp[0], full_logprobs(verifier_model, tokens)[-1], atol=1e-5, rtol=1e-5)


def test_selection_never_keeps_a_lower_score(verifier_model):
    session = HFVerifier(verifier_model).start(PROMPT)
    g = torch.Generator().manual_seed(0)
    for temperature in (0.0, 0.7, 1.0):
        for _ in range(20):
            cands = torch.randint(0, 8, (8, 4), generator=g)  # small alphabet: many shared prefixes and duplicates
            tree = build_tree(PROMPT[-1], cands)
            probs = torch.softmax(torch.randn(tree.num_nodes, 64, generator=g) * 3, -1)
            if temperature == 0:
                probs = torch.nn.functional.one_hot(probs.argmax(-1), 64).float()
            best, scores = select(tree, probs)
            # Score each candidate independently, walking its own path.
            for row in range(tree.candidates.shape[0]):
                nodes = [0] + tree.paths[row].tolist()
                p = torch.stack([probs[nodes[j], tree.candidates[row, j]] for j in range(4)])
                torch.testing.assert_close(scores[row], expected_streak(p.double()))
            assert scores[best] == scores.max()
            assert best == int((scores == scores.max()).nonzero()[0])  # deterministic tie-break: first sampled
    assert session.cached == len(PROMPT) - 1


def test_expected_streak_is_expected_greedy_accepted_length():
    # Brute-force: enumerate the accept/reject outcomes of 4 positions.
    import itertools

    p = torch.tensor([0.9, 0.5, 0.7, 0.2], dtype=torch.float64)
    expected = 0.0
    for outcome in itertools.product([True, False], repeat=4):
        prob = torch.where(torch.tensor(outcome), p, 1 - p).prod()
        streak = next((i for i, ok in enumerate(outcome) if not ok), 4)
        expected += float(prob) * streak
    assert abs(float(expected_streak(p)) - expected) < 1e-12


def test_target_probs_matches_hf_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from specdiff import target_probs

    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)) * 3
    for t, k, p in [(0.7, 0, 1.0), (1.0, 10, 1.0), (1.3, 0, 0.8), (0.5, 7, 0.6)]:
        scores = TemperatureLogitsWarper(t)(None, logits.clone())
        if k:
            scores = TopKLogitsWarper(k)(None, scores)
        if p < 1:
            scores = TopPLogitsWarper(p)(None, scores)
        torch.testing.assert_close(target_probs(logits, SamplingParams(temperature=t, top_k=k, top_p=p)), scores.softmax(-1))


def test_a_one_point_distribution_is_its_token_without_a_draw():
    from specdiff.core.sampling import sample

    gen = torch.Generator().manual_seed(0)
    point = torch.zeros(1000)
    point[417] = 1.0
    before = gen.get_state()
    assert sample(point, gen).tolist() == [417] and sample(point[None], gen).shape == (1, 1)
    assert torch.equal(gen.get_state(), before)  # T=0 steps skip multinomial's draw over the whole vocabulary
    assert sample(point, gen, 3).tolist() == [417] * 3
    spread = torch.full((1000,), 1e-3)
    assert 0 <= int(sample(spread, gen)) < 1000 and not torch.equal(gen.get_state(), before)


def test_candidates_start_with_the_argmax_window_when_asked():
    from specdiff.core.selection import sample_candidates

    marginals = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    gen = torch.Generator().manual_seed(0)
    cands, probs = sample_candidates(marginals, 4, 2.0, gen, include_argmax=True)
    assert cands.shape == (4, 2) and cands[0].tolist() == [1, 0] and cands.dtype == torch.long
    assert torch.allclose(probs.sum(-1), torch.ones(2))  # the distribution the other K-1 were drawn from
    (only,), none = sample_candidates(marginals, 1, 2.0, gen, include_argmax=True)
    assert only.tolist() == [1, 0] and none is None  # K=1: the argmax window itself, nothing drawn


def test_folded_grouped_query_attention_scores_trees_as_stock_sdpa(monkeypatch):
    import copy

    from helpers import tiny_llama
    from specdiff.models.hf import GQA_SDPA, fold_gqa_attention

    stock = tiny_llama(64, seed=3, init_std=0.2)  # 4 query heads on 2 key/value heads, sdpa
    folded_model = copy.deepcopy(stock)
    verifier = HFVerifier(folded_model)  # folds
    assert folded_model.config._attn_implementation == GQA_SDPA
    assert not fold_gqa_attention(torch.nn.Linear(2, 2))  # not a transformers model: left alone
    reference = HFVerifier(stock, tune_kernels=False)
    stock.set_attn_implementation("sdpa")  # back to transformers' own: the reference
    shapes = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *a, **k: shapes.append(tuple(q.shape)) or real(q, *a, **k))
    prompt = [3, 17, 9, 41, 5, 22, 8]
    a, b = verifier.start(prompt), reference.start(prompt)
    for candidates in ([[5, 6, 7]], [[5, 6, 7], [5, 9, 1], [2, 2, 2]], [[1]]):
        tree = build_tree(a.tokens[-1], torch.tensor(candidates))
        torch.testing.assert_close(a.score(tree), b.score(tree), rtol=1e-4, atol=1e-5)
        a.commit([1], 4)
        b.commit([1], 4)
    assert (1, 2, 2 * 9, 8) in shapes  # the 9-node tree: 2 groups x 9 rows on the 2 key/value heads, no copies
    ids = torch.randint(0, 64, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :5] = 0  # left padding, as in batched teacher sampling
    with torch.no_grad():
        torch.testing.assert_close(folded_model(ids, attention_mask=mask).logits, stock(ids, attention_mask=mask).logits,
                                   rtol=1e-4, atol=1e-5)
