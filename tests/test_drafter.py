"""The diffusion drafter: one bidirectional pass over prefix ∥ [MASK]×γ, batching, shifting, truncation, steps."""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_llama
from specdiff import DrafterConfig, HFDiffusionDrafter, build_small_drafter, drafter_from_verifier, load_drafter, save_drafter
from specdiff.models.drafter import window_inputs

V = 64


@pytest.fixture(scope="module")
def drafter():
    return build_small_drafter(V, hidden_size=32, num_layers=2, num_heads=2)


def count_forwards(model):
    calls = []
    handle = model.register_forward_hook(lambda mod, args, kwargs_or_out: calls.append(1))
    return calls, handle


def test_marginals_shape_and_one_pass(drafter):
    calls, handle = count_forwards(drafter.model)
    q = drafter.propose([1, 2, 3, 4], gamma=16)
    handle.remove()
    assert q.shape == (16, V) and len(calls) == 1
    torch.testing.assert_close(q.sum(-1), torch.ones(16))


def test_attention_is_bidirectional(drafter):
    # The first window position sees the masks AFTER it only if attention is bidirectional: a causal model would
    # give the same first marginal whatever the window length.
    prefix = [1, 2, 3, 4]
    assert not torch.allclose(drafter.propose(prefix, 4)[0], drafter.propose(prefix, 1)[0], atol=1e-4)
    assert not torch.allclose(drafter.propose(prefix, 4), drafter.propose([1, 2, 3, 5], 4))


def test_batch_equals_single(drafter):
    prefixes = [[1, 2, 3], [7], list(range(10, 30))]
    batch = drafter.propose_batch(prefixes, 5)
    assert batch.shape == (3, 5, V)
    for row, prefix in zip(batch, prefixes):
        torch.testing.assert_close(row, drafter.propose(prefix, 5), atol=1e-5, rtol=1e-4)


def test_mask_token_excluded_and_in_vocab_mask_zeroed():
    model = tiny_llama(V, seed=2)
    d = HFDiffusionDrafter(model, DrafterConfig(mask_token_id=V - 1, vocab_size=V))
    q = d.propose([1, 2], 3)
    assert q.shape == (3, V) and torch.all(q[:, V - 1] == 0)


def test_shifted_logits_read_the_previous_position():
    model = tiny_llama(V, seed=2)
    plain = HFDiffusionDrafter(model, DrafterConfig(mask_token_id=0, vocab_size=V))
    shifted = HFDiffusionDrafter(model, DrafterConfig(mask_token_id=0, vocab_size=V, shifted_logits=True))
    prefix, gamma = [5, 6, 7], 4
    batch = window_inputs([prefix], gamma, 0)
    ids, valid, pos = batch.ids, batch.valid, batch.positions
    mask = plain.hf.additive_mask(valid[:, None, :].expand(-1, ids.shape[1], -1))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[0].float()
    logits[:, 0] = float("-inf")
    torch.testing.assert_close(shifted.propose(prefix, gamma), logits[2:6].softmax(-1))
    torch.testing.assert_close(plain.propose(prefix, gamma), logits[3:7].softmax(-1))


def test_max_context_left_truncates():
    model = tiny_llama(V, seed=2)
    bounded = HFDiffusionDrafter(model, DrafterConfig(mask_token_id=0, vocab_size=V, max_context=8))
    full = HFDiffusionDrafter(model, DrafterConfig(mask_token_id=0, vocab_size=V))
    prefix = list(range(1, 40))
    torch.testing.assert_close(bounded.propose(prefix, 4), full.propose(prefix[-4:], 4))


def test_denoising_steps_run_t_passes_and_fix_confident_positions():
    model = tiny_llama(V, seed=2, init_std=0.5)
    one = HFDiffusionDrafter(model, DrafterConfig(mask_token_id=0, vocab_size=V))
    three = HFDiffusionDrafter(model, DrafterConfig(mask_token_id=0, vocab_size=V, denoising_steps=3))
    calls, handle = count_forwards(model)
    q3 = three.propose([4, 5, 6], 6)
    handle.remove()
    assert len(calls) == 3 and q3.shape == (6, V)
    q1 = one.propose([4, 5, 6], 6)
    # The two most confident positions of the first pass are final after step one: identical to the T=1 marginals.
    first = q1.max(-1).values.topk(2).indices
    torch.testing.assert_close(q3[first], q1[first])
    assert not torch.allclose(q3, q1)


def test_drafter_from_verifier_inherits_weights(verifier_model):
    d = drafter_from_verifier(verifier_model, num_layers=1)
    assert d.vocab_size == 64 and d.config.mask_token_id == 64
    torch.testing.assert_close(d.model.model.embed_tokens.weight[:64], verifier_model.model.embed_tokens.weight)
    torch.testing.assert_close(
        d.model.model.layers[0].self_attn.q_proj.weight, verifier_model.model.layers[0].self_attn.q_proj.weight
    )
    assert d.propose([1, 2, 3], 4).shape == (4, 64)


def test_save_and_load_roundtrip(tmp_path, drafter):
    save_drafter(drafter, tmp_path / "d", verifier={"name": "tiny"})
    loaded = load_drafter(tmp_path / "d")
    assert loaded.config == drafter.config
    torch.testing.assert_close(loaded.propose([1, 2, 3], 4), drafter.propose([1, 2, 3], 4))


def block_drafter(verifier_model, **options):
    d = drafter_from_verifier(verifier_model, num_layers=2, causal_prefix=True)
    config = DrafterConfig(**{**d.config.__dict__, **options})
    return HFDiffusionDrafter(d.model, config), HFDiffusionDrafter(d.model, config, cache_prefix=False)


def test_causal_prefix_prefix_is_causal_window_is_bidirectional(verifier_model):
    _, d = block_drafter(verifier_model, shifted_logits=False)
    # Window rows see each other: the first marginal depends on the window length.
    assert not torch.allclose(d.propose([1, 2, 3, 4], 4)[0], d.propose([1, 2, 3, 4], 1)[0], atol=1e-4)
    # Prefix rows are causal: a drafter run over the prefix alone gives the same last-prefix output as an AR pass.
    shifted = HFDiffusionDrafter(d.model, DrafterConfig(**{**d.config.__dict__, "shifted_logits": True}),
                                 cache_prefix=False)
    ar = d.model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1, :V].softmax(-1)
    torch.testing.assert_close(shifted.propose([1, 2, 3, 4], 1)[0], ar, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("max_context", [None, 24])
def test_prefix_cache_equals_a_full_pass(verifier_model, max_context):
    cached, full = block_drafter(verifier_model, max_context=max_context)
    run = []  # tokens the cached drafter runs per call
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(V, (5,), generator=gen).tolist()
    for step in range(14):
        prefix += torch.randint(V, (1 + step % 3,), generator=gen).tolist()
        handle = cached.model.register_forward_pre_hook(
            lambda mod, args, kwargs: run.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
        got = cached.propose(prefix, 4)
        handle.remove()
        seen = prefix[cached._cache.start :]
        assert max_context is None or len(seen) + 4 <= max_context
        torch.testing.assert_close(got, full.propose(seen, 4), atol=1e-5, rtol=1e-4)
    # a prefix that diverges (another session) restarts the cache and is still exact
    other = [3] * 9
    torch.testing.assert_close(cached.propose(other, 4), full.propose(other, 4), atol=1e-5, rtol=1e-4)
    assert max(run[1:-1]) <= 3 + 1 + 4 if max_context is None else sorted(run)[len(run) // 2] <= 3 + 1 + 4
    assert cached._cache.tokens == other
