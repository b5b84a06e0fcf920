"""The drafter conditioned on the verifier's hidden states: feature plumbing, cache, training/inference agreement,
exactness at T=0, files and bad input."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from helpers import OracleDrafter, tiny_llama
from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, generate_plain, load_drafter
from specdiff.distill.feature import draft_vocabulary
from specdiff.models.feature_drafter import (
    AnchorBatch,
    FeatureDrafter,
    anchor_logits,
    build_feature_drafter,
    load_feature_drafter,
    save_feature_drafter,
)

PROMPTS = [[5], [3, 17, 9, 41], list(range(1, 40))]


def taps_of(model, tokens, taps) -> torch.Tensor:
    """Tapped states of every token, from a from-scratch forward: [len(tokens), taps * H]."""
    with torch.no_grad():
        hidden = model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return torch.cat([hidden[i + 1][0] for i in taps], -1)


@pytest.fixture(scope="module")
def drafter(verifier_model):
    return build_feature_drafter(verifier_model, num_layers=2, seed=1)


class OracleFeatureDrafter(OracleDrafter):
    """A good drafter (the verifier's greedy continuation) that also checks the features the engine hands it."""

    needs_features = True

    def __init__(self, model, taps):
        super().__init__(model, confidence=0.6)
        self.tap_layers = taps
        self.worst = 0.0
        self.calls = 0

    def propose(self, prefix, gamma, features=None):
        assert features is not None and features.shape[0] == len(prefix) - 1
        ref = taps_of(self.model, list(prefix), self.tap_layers)[:-1]
        self.worst = max(self.worst, float((features.float() - ref).abs().max()))
        self.calls += 1
        return super().propose(prefix, gamma)


def test_session_features_match_a_full_forward_after_accepted_windows(verifier_model):
    # Accepted nodes of any candidate (K > 1 branches the tree) hand their states to the context in order.
    oracle = OracleFeatureDrafter(verifier_model, (0, 1))
    decoder = SpeculativeDecoder(oracle, HFVerifier(verifier_model, tap_layers=(0, 1)))
    result = decoder.generate(PROMPTS[1], max_new_tokens=40, spec=SpecConfig(gamma=6, num_candidates=4,
                                                                              draft_temperature=1.0), seed=0)
    assert result.stats.tau > 2.0, "the oracle must get windows accepted for this test to mean anything"
    assert oracle.calls > 3 and oracle.worst < 1e-4


def test_taps_come_from_the_scoring_pass(verifier_model):
    session = HFVerifier(verifier_model, tap_layers=(1,)).start([4, 8, 15, 16])
    assert torch.allclose(session.features, taps_of(verifier_model, [4, 8, 15], (1,)), atol=1e-5)
    assert HFVerifier(verifier_model).start([4, 8]).features is None  # no taps, no cost
    tapped = HFVerifier(verifier_model, tap_layers=(1,))
    plain = tapped.without_taps()  # what a colocated replica decodes plain requests with
    assert plain.start([4, 8]).features is None and tapped.tap_layers == (1,) and plain.model is tapped.model
    assert generate_plain(plain, [4, 8, 15], max_new_tokens=8).tokens == generate_plain(
        tapped, [4, 8, 15], max_new_tokens=8).tokens


def test_cached_context_equals_a_fresh_pass(verifier_model, drafter):
    tokens = list(range(3, 40))
    feats = taps_of(verifier_model, tokens, drafter.tap_layers)
    fresh = build_feature_drafter(verifier_model, num_layers=2, seed=1)
    for n in (10, 11, 17, 30, 12, 25):  # extend, extend, jump, then a shorter prefix (cache is cut back)
        cached = drafter.propose(tokens[:n], 5, feats[: n - 1])
        fresh.reset()
        assert torch.allclose(cached, fresh.propose(tokens[:n], 5, feats[: n - 1]), atol=1e-5)
    other = [7] + tokens[1:20]  # a diverging prefix starts over
    f2 = taps_of(verifier_model, other, drafter.tap_layers)
    fresh.reset()
    assert torch.allclose(drafter.propose(other, 3, f2[:-1]), fresh.propose(other, 3, f2[:-1]), atol=1e-5)


def test_many_anchors_in_one_forward_equal_separate_windows(verifier_model):
    # Training (anchor blocks with a block mask) and inference (one window) must compute the same marginals.
    d = build_feature_drafter(verifier_model, num_layers=2, seed=2, draft_vocab_size=48)
    d.set_draft_vocabulary(torch.randperm(64, generator=torch.Generator().manual_seed(0))[:48])
    tokens = torch.tensor([list(range(1, 31)), list(range(31, 61))])
    feats = torch.stack([taps_of(verifier_model, t.tolist(), d.tap_layers) for t in tokens])
    anchors = torch.tensor([[0, 4, 9, 20], [2, 3, 15, 21]])
    gamma = 5
    labels = tokens.gather(1, (anchors[..., None] + torch.arange(1, gamma + 1)).view(2, -1)).view(2, 4, gamma)
    batch = AnchorBatch(anchors, labels, torch.ones(2, 4, dtype=torch.bool))
    with torch.no_grad():
        probs = d.to_vocab(anchor_logits(d, d.model, tokens, feats, batch, gamma).softmax(-1))
    for b in range(2):
        for i, a in enumerate(anchors[b].tolist()):
            d.reset()
            alone = d.propose(tokens[b, : a + 1].tolist(), gamma, feats[b, :a])
            assert torch.allclose(probs[b, i], alone, atol=1e-5), (b, a)
    outside = torch.ones(64, dtype=torch.bool)
    outside[d.model.draft_ids] = False
    assert float(alone[:, outside].sum()) == 0.0  # never drafts outside its vocabulary


@pytest.mark.parametrize("gamma", [1, 4, 16])
@pytest.mark.parametrize("k", [1, 4])
def test_equals_greedy_decoding(verifier_model, drafter, gamma, k):
    decoder = SpeculativeDecoder(drafter, HFVerifier(verifier_model, tap_layers=drafter.tap_layers))
    for prompt in PROMPTS:
        expected = generate_plain(HFVerifier(verifier_model), prompt, max_new_tokens=30).tokens
        result = decoder.generate(prompt, max_new_tokens=30, spec=SpecConfig(gamma=gamma, num_candidates=k), seed=1)
        assert result.tokens == expected, f"prompt of {len(prompt)} tokens"


def test_save_and_load_round_trip(verifier_model, drafter, tmp_path):
    save_feature_drafter(drafter, tmp_path / "d", verifier={"digest": "sha256:abc"})
    loaded = load_drafter(tmp_path / "d", verifier=verifier_model)
    assert isinstance(loaded, FeatureDrafter) and loaded.tap_layers == drafter.tap_layers
    tokens = list(range(2, 20))
    feats = taps_of(verifier_model, tokens, drafter.tap_layers)[:-1]
    drafter.reset()
    assert torch.allclose(loaded.propose(tokens, 4, feats), drafter.propose(tokens, 4, feats), atol=1e-6)
    names = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    # vLLM's dflash layout: fc, hidden_norm, norm and Qwen3-shaped layers; no embeddings or LM head of its own
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight",
            "layers.1.mlp.gate_proj.weight", "mask_embedding"} <= names
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)


def test_mismatched_pairs_are_refused_before_decoding(verifier_model, drafter, tmp_path):
    with pytest.raises(ValueError, match="tap_layers"):
        SpeculativeDecoder(drafter, HFVerifier(verifier_model))  # the verifier taps nothing
    with pytest.raises(ValueError, match=r"layers \[1\].*taps \[0\]"):
        SpeculativeDecoder(drafter, HFVerifier(verifier_model, tap_layers=(0,)))
    save_feature_drafter(drafter, tmp_path / "d", verifier={"digest": "sha256:abc"})
    with pytest.raises(ValueError, match="hidden size 32"):
        wide = tiny_llama(64, seed=0)
        wide.config.hidden_size = 48
        load_feature_drafter(tmp_path / "d", wide)
    with pytest.raises(ValueError, match="aligned to verifier sha256:abc"):
        load_feature_drafter(tmp_path / "d", verifier_model, verifier_digest="sha256:other")
    with pytest.raises(ValueError, match="verifier=<the verifier model>"):
        load_drafter(tmp_path / "d")
    with pytest.raises(ValueError, match=r"features must have shape \[n, 32\]"):
        drafter.propose([1, 2, 3], 4, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="needs the verifier's tapped hidden states"):
        drafter.propose([1, 2, 3], 4)


def test_missing_or_corrupt_files_are_named(verifier_model, drafter, tmp_path):
    folder = save_feature_drafter(drafter, tmp_path / "d")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupt drafter file .*model.safetensors"):
        load_feature_drafter(folder, verifier_model)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="weights missing: .*model.safetensors"):
        load_feature_drafter(folder, verifier_model)
    (folder / "specdiff_feature_drafter.json").write_text("{")
    with pytest.raises(ValueError, match="corrupt drafter file .*specdiff_feature_drafter.json"):
        load_feature_drafter(folder, verifier_model)


def test_draft_vocabulary_is_the_most_frequent_tokens():
    ids = draft_vocabulary([[5, 5, 5, 2], [2, 9]], vocab_size=12, size=4)
    assert ids.tolist() == [5, 2, 9, 0]  # then unseen ids, lowest first


def test_heldout_evaluation_with_a_kv_cache_equals_full_passes():
    # evaluate_feature_drafter scores drafts on the prefix pass's KV cache; the reference re-reads every prefix.
    from specdiff.core.config import SamplingParams
    from specdiff.distill.evaluate import score_drafts
    from specdiff.distill.feature import evaluate_feature_drafter, prefix_features
    from specdiff.models.hf import HFModel

    model = tiny_llama(64, init_std=0.3)
    d = build_feature_drafter(model)
    prefixes = [list(range(1, n)) for n in (5, 9, 20, 33)] + [[7, 3, 2]]
    sampling = SamplingParams(temperature=1.0)
    options = dict(num_candidates=3, draft_temperature=1.5, batch_size=2)
    fast = evaluate_feature_drafter(d, HFModel(model), prefixes, 6, sampling,
                                    generator=torch.Generator().manual_seed(0), **options)
    marginals = d.propose_batch(prefixes, 6, prefix_features(HFModel(model), prefixes, d.tap_layers))
    slow = score_drafts(marginals, prefixes, HFModel(model), 6, sampling, generator=torch.Generator().manual_seed(0),
                        **options)
    assert fast.expected_streak > 0.01
    assert fast.expected_streak == pytest.approx(slow.expected_streak, abs=1e-6)
    assert fast.alpha == pytest.approx(slow.alpha, abs=1e-6)


def test_greedy_labels_follow_the_text_while_it_is_greedy():
    from specdiff.models.feature_drafter import greedy_labels

    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    greedy = torch.zeros_like(tokens)
    greedy[0, :-1] = tokens[0, 1:]
    greedy[0, 2] = 99  # after token 7 the verifier would say 99, not 8
    labels = greedy_labels(tokens, greedy, torch.tensor([[0, 3, 5]]), 4)
    assert labels[0, 0].tolist() == [6, 7, 99, -1]  # the text left greedy decoding at 8: the rest is unknown
    assert labels[0, 1].tolist() == [9, 10, 11, 12]
    assert labels[0, 2].tolist() == [11, 12, -1, -1]  # past the end


def test_prompt_anchors_are_labelled_by_the_teachers_prefill_argmax():
    # The teacher's prefill records the verifier's argmax over the prompt; windows anchored in the prompt are
    # labelled with greedy decoding's continuation from there, and completion windows keep the teacher's tokens.
    from specdiff.core.config import SamplingParams
    from specdiff.distill.feature import greedy_targets
    from specdiff.distill.trajectories import sample_completions
    from specdiff.models.feature_drafter import sample_anchors
    from specdiff.models.hf import HFModel

    model = tiny_llama(64, init_std=0.3)
    prompts = [list(range(3, 20)), [7, 3, 2, 9, 9, 4]]
    targets, features = [], []
    completions, _, _ = sample_completions(HFModel(model), prompts, 10, SamplingParams(temperature=0.0), 0, None,
                                           taps=(0,), features_out=features, prompt_targets_out=targets)
    for p, t, c in zip(prompts, targets, completions):
        with torch.no_grad():
            ref = model(torch.tensor([p])).logits[0].argmax(-1)
        assert t.tolist() == ref.tolist()
        assert int(t[-1]) == int(c[0])  # greedy: the last prompt target is the first completion token
    records = {"prompt_ids": prompts, "completion_ids": completions.tolist(),
               "prompt_targets": [t.tolist() for t in targets]}
    seqs = [p + c.tolist() for p, c in zip(prompts, completions)]
    tokens = torch.zeros(2, max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    greedy = greedy_targets(records, tokens)
    batch = sample_anchors([len(s) for s in seqs], [len(p) for p in prompts], tokens, 3, 4,
                           torch.Generator().manual_seed(0), greedy=greedy, prompt_anchors=3)
    assert batch.valid.sum(1).tolist() == [7, 7]
    for i, p in enumerate(prompts):
        for a, labels in zip(batch.anchors[i, 4:].tolist(), batch.labels[i, 4:].tolist()):
            assert a <= len(p) - 2 and labels[0] == int(targets[i][a])
        for a, labels in zip(batch.anchors[i, :4].tolist(), batch.labels[i, :4].tolist()):
            assert labels == seqs[i][a + 1 : a + 4]
    with pytest.raises(ValueError, match="prompt_targets"):
        greedy_targets({"prompt_ids": prompts}, tokens)


@pytest.mark.parametrize("kind", ["streak", "decayed_ce", "naive", "ar_distill"])
def test_training_loss_selects_windows_before_the_head_and_equals_the_per_window_formulation(kind):
    # feature_loss keeps the valid windows' hidden rows before the head (cheaper than indexing the logits); loss and
    # gradients must equal the plain formulation: every block's logits, then the valid ones. One trajectory is too
    # short for any completion window, so some blocks are invalid.
    from specdiff.distill.config import ObjectiveSection
    from specdiff.distill.feature import collate, encode_features, feature_loss
    from specdiff.models.feature_drafter import sample_anchors
    from specdiff.core.objectives import ar_distill_first_position_loss, decayed_ce_loss, naive_window_loss, streak_loss

    model = tiny_llama(64, init_std=0.3)
    d = build_feature_drafter(model, target_layer_ids=[0, 1], seed=2, draft_vocab_size=48)
    d.set_draft_vocabulary(torch.arange(16, 64))
    d.model.float()
    prompts = [[3, 9, 4, 7, 1], [2, 6], [8, 1, 5]]
    completions = [list(range(20, 40)), [30, 31, 32], list(range(40, 52))]
    features = [taps_of(model, p + c, (0, 1))[:-1] for p, c in zip(prompts, completions)]
    columns = {"prompt_ids": prompts, "completion_ids": completions,
               "features": [encode_features(f) for f in features]}
    objective = ObjectiveSection(kind=kind, gamma=4, anchors_per_sample=6, temperature=1.5)
    loss = feature_loss(d, d.model, objective, columns, torch.Generator().manual_seed(5))
    fast = torch.autograd.grad(loss, list(d.model.parameters()), allow_unused=True)

    tokens, feats, lengths, starts = collate(columns, d.config.feature_size)
    batch = sample_anchors(lengths, starts, tokens, 4, 6, torch.Generator().manual_seed(5))
    assert not bool(batch.valid.all())
    logits = anchor_logits(d, d.model, tokens, feats, batch, 4)[batch.valid]
    labels = d.draft_labels(batch.labels[batch.valid])
    ref = {"streak": lambda: streak_loss(logits, labels, 1.5),
           "decayed_ce": lambda: decayed_ce_loss(logits, labels, objective.decay, 1.5),
           "naive": lambda: naive_window_loss(logits, labels, 1.5),
           "ar_distill": lambda: ar_distill_first_position_loss(logits, labels, 1.5)}[kind]()
    slow = torch.autograd.grad(ref, list(d.model.parameters()), allow_unused=True)
    assert float(loss) == pytest.approx(float(ref), rel=1e-5)
    for a, b in zip(fast, slow):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_teacher_forced_heldout_evaluation_equals_scoring_by_the_verifier():
    # At T=0 with greedy drafts (K=1), reading acceptance off greedy held-out trajectories gives exactly what the
    # verifier-scored evaluation gives on the same windows.
    from specdiff.core.config import SamplingParams
    from specdiff.distill.config import ObjectiveSection
    from specdiff.distill.feature import encode_features, evaluate_feature_drafter, feature_loss, teacher_forced_eval
    from specdiff.distill.trajectories import sample_completions
    from specdiff.distill.windows import heldout_prefixes
    from specdiff.models.hf import HFModel

    model = tiny_llama(64, init_std=0.3)
    prompts = [list(range(1, n)) for n in (5, 9, 20)] + [[7, 3, 2]]
    features = []
    completions, _, _ = sample_completions(HFModel(model), prompts, 12, SamplingParams(temperature=0.0), 0, None,
                                           taps=(0, 1), features_out=features)
    records = [{"prompt_ids": p, "completion_ids": c} for p, c in zip(prompts, completions.tolist())]
    d = build_feature_drafter(model, target_layer_ids=[0, 1], seed=3)
    d.model.float()
    columns = {"prompt_ids": prompts, "completion_ids": completions.tolist(),
               "features": [encode_features(f) for f in features]}
    opt = torch.optim.Adam(d.model.parameters(), lr=3e-3)
    objective = ObjectiveSection(kind="decayed_ce", gamma=6, anchors_per_sample=4)
    figures = []
    for step in range(31):
        if step % 15 == 0:  # untrained, partly and well trained: streaks of every length
            d.model.eval()
            fast = teacher_forced_eval(d, HFModel(model), records, [0, 3, 4], 6)
            slow = evaluate_feature_drafter(d, HFModel(model), heldout_prefixes(records, [0, 3, 4]), 6,
                                            SamplingParams(temperature=0.0))
            assert fast.windows == slow.windows == 12
            assert fast.expected_streak == pytest.approx(slow.expected_streak, abs=1e-6)
            assert fast.alpha == pytest.approx(slow.alpha, abs=1e-6)
            figures.append(fast.expected_streak)
            d.model.train()
        loss = feature_loss(d, d.model, objective, columns, torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert figures[-1] > 1.0 and figures[-1] > figures[0]
    assert teacher_forced_eval(d, HFModel(model), records, [8], 6) is None  # 8 + 6 > 12 tokens
    assert fast.cut == 0
    # A trajectory that is not greedy under this verifier (as a bf16 batched decode can be against a full pass):
    # the labels follow the verifier's argmax, a streak that reaches the point where the trajectory parts is cut
    # there. alpha_1 stays exact; the expected streak is a lower bound, equal on the untouched windows.
    bent = [dict(r) for r in records]
    bent[0]["completion_ids"] = bent[0]["completion_ids"][:2] + [(t + 1) % 64 for t in bent[0]["completion_ids"][2:]]
    fast = teacher_forced_eval(d, HFModel(model), bent, [0, 3, 4], 6)
    slow = evaluate_feature_drafter(d, HFModel(model), heldout_prefixes(bent, [0, 3, 4]), 6,
                                    SamplingParams(temperature=0.0))
    assert fast.alpha[0] == pytest.approx(slow.alpha[0], abs=1e-6)
    assert fast.expected_streak <= slow.expected_streak + 1e-6
    assert fast.cut >= 1  # the trained drafter follows the verifier past token 2 of trajectory 0
    clean = teacher_forced_eval(d, HFModel(model), records[1:], [0, 3, 4], 6)
    part = evaluate_feature_drafter(d, HFModel(model), heldout_prefixes(bent[1:], [0, 3, 4]), 6,
                                    SamplingParams(temperature=0.0))
    assert clean.expected_streak == pytest.approx(part.expected_streak, abs=1e-6)
