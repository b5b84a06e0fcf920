"""Distillation pieces without Ray: teacher sampling (batched, KV cache), windows, held-out evaluation, LoRA
checkpoints and the exported drafter."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import full_logprobs, tiny_llama
from specdiff import SamplingParams, build_small_drafter, drafter_from_verifier, load_drafter, target_probs
from specdiff.distill.config import parse_config
from specdiff.distill.evaluate import evaluate_drafter
from specdiff.distill.trajectories import sample_completions
from specdiff.lineage.verifier import verifier_record
from specdiff.distill.train import (
    _write_drafter,
    apply_lora,
    load_checkpoint,
    lr_factor,
    steps_that_fit,
    save_checkpoint,
    window_loss,
)
from specdiff.distill.windows import cut_windows, heldout_prefixes
from specdiff.models.hf import HFModel

V = 64
PROMPTS = [[1, 2, 3], [7], list(range(10, 22))]


def base_config(**sections) -> dict:
    tree = {"verifier": {"path": "v"}, "data": {"prompts": "p", "heldout": "h"}, "eval": {"offsets": [0]}}
    tree.update(sections)
    return tree


def test_greedy_teacher_matches_per_prompt_full_forward(verifier_model):
    hf = HFModel(verifier_model)
    completions, top_ids, top_lp = sample_completions(hf, PROMPTS, 6, SamplingParams(temperature=0), 4, None)
    assert completions.shape == (3, 6) and top_ids.shape == (3, 6, 4)
    for prompt, completion in zip(PROMPTS, completions.tolist()):
        tokens = list(prompt)
        for _ in range(6):
            tokens.append(int(full_logprobs(verifier_model, tokens)[-1].argmax()))
        assert completion == tokens[len(prompt) :]
    # Top-k of log p with p the argmax one-hot: the argmax with 0 first, then k - 1 distinct ids with -inf.
    assert (top_ids[..., 0] == completions).all()
    assert (top_lp[..., 0] == 0).all() and (top_lp[..., 1:] == float("-inf")).all()
    assert all(len(set(row)) == 4 for row in top_ids.reshape(-1, 4).tolist())


def test_sampled_teacher_logprobs_are_the_target_distribution(verifier_model):
    hf = HFModel(verifier_model)
    sampling = SamplingParams(temperature=0.5, top_p=0.95)
    gen = torch.Generator().manual_seed(0)
    completions, top_ids, top_lp = sample_completions(hf, PROMPTS, 5, sampling, 3, gen)
    for b, prompt in enumerate(PROMPTS):
        seq = prompt + completions[b].tolist()
        p = target_probs(full_logprobs(verifier_model, seq)[len(prompt) - 1 : -1], sampling)  # [5, V]
        ref = p.log().topk(3, dim=-1)
        torch.testing.assert_close(top_lp[b], ref.values, atol=1e-4, rtol=1e-4)
        assert (p[torch.arange(5), completions[b]] > 0).all()  # every sampled token is allowed by top-p


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_ragged_teacher_on_the_lean_forward_equals_the_padded_one(tmp_path, temperature):
    """The lean Llama teacher (``load_teacher_model``: ragged prefill in chunks, decode steps over a KV pool) gives
    what transformers' padded batch gives: tokens, top-k log p, tapped states and prompt targets, for prompts short
    enough to share an attention call and long enough to attend alone, split over several prefill chunks."""
    from specdiff.distill import trajectories
    from specdiff.distill.trajectories import load_teacher_model
    from specdiff.models.llama import LlamaCausalLM

    tiny_llama(V, seed=3, init_std=0.2).save_pretrained(tmp_path / "v")
    lean = load_teacher_model(tmp_path / "v", "float32")
    assert isinstance(lean, LlamaCausalLM)
    padded = HFModel(trajectories.load_verifier_model(tmp_path / "v", "float32"))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 1, 70, 12, 90, 5)]
    sampling = SamplingParams(temperature=temperature)
    outs = {}
    for name, model in (("padded", padded), ("lean", lean)):
        feats, targets = [], []
        out = trajectories.sample_completions(model, prompts, 7, sampling, 3, torch.Generator().manual_seed(5),
                                              taps=(0, 1), features_out=feats, prompt_targets_out=targets)
        outs[name] = (*out, feats, targets)
    (c, ids, lp, feats, targets), (c2, ids2, lp2, feats2, targets2) = outs["padded"], outs["lean"]
    assert torch.equal(c, c2) and torch.equal(ids, ids2)
    torch.testing.assert_close(lp2, lp, atol=1e-4, rtol=1e-4)
    assert [f.shape for f in feats2] == [(len(p) + 6, 64) for p in prompts]
    for a, b in zip(feats, feats2):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    assert all(torch.equal(a, b) for a, b in zip(targets, targets2))
    # Small prefill chunks (one prompt per forward where they do not fit together) change nothing.
    chunked = trajectories._sample_ragged(lean, prompts, 7, sampling, 3, torch.Generator().manual_seed(5),
                                          prefill_rows=64)
    assert torch.equal(chunked[0], c2)


def test_cut_windows_and_heldout_prefixes():
    records = {"prompt_ids": [[1, 2]], "completion_ids": [list(range(10, 20))],
               "topk_ids": [[[t, 0] for t in range(10, 20)]], "topk_logprobs": [[[-0.1, -3.0]] * 10]}
    batch = cut_windows(records, 4, 5, None, torch.Generator().manual_seed(0))
    assert batch.labels.shape == (5, 4) and batch.teacher_ids.shape == (5, 2)
    for prefix, labels, top in zip(batch.prefixes, batch.labels.tolist(), batch.teacher_ids.tolist()):
        o = len(prefix) - 2
        assert prefix == [1, 2] + list(range(10, 10 + o)) and labels == list(range(10 + o, 14 + o))
        assert top[0] == labels[0]  # the teacher's top-k row at the window's first position
    bounded = cut_windows(records, 4, 3, 6, torch.Generator().manual_seed(0))
    assert all(len(p) <= 2 for p in bounded.prefixes)  # max_context 6 leaves room for the 4-token window
    assert heldout_prefixes([{"prompt_ids": [1], "completion_ids": [5, 6, 7]}], [0, 2]) == [[1], [1, 5, 6]]
    with pytest.raises(ValueError, match="fewer than gamma"):
        cut_windows(records, 11, 1, None, None)


def test_heldout_eval_matches_a_direct_computation(verifier_model):
    drafter = build_small_drafter(V, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    sampling = SamplingParams(temperature=1.0)
    gamma = 4
    result = evaluate_drafter(HFModel(drafter.model), drafter.config, HFModel(verifier_model), PROMPTS, gamma,
                              sampling, batch_size=2)
    streaks, survive_all = [], []
    for prefix in PROMPTS:
        draft = drafter.propose(prefix, gamma).argmax(-1).tolist()
        logp = full_logprobs(verifier_model, prefix + draft)[len(prefix) - 1 : -1]
        p = target_probs(logp, sampling)[torch.arange(gamma), torch.tensor(draft)].double()
        survive = p.cumprod(0)
        streaks.append(float(survive.sum()))
        survive_all.append(survive)
    s = torch.stack(survive_all)
    reached = torch.cat([torch.ones(len(PROMPTS), 1, dtype=torch.float64), s[:, :-1]], 1)
    assert result.expected_streak == pytest.approx(sum(streaks) / len(streaks), rel=1e-5)
    assert result.alpha == pytest.approx((s.sum(0) / reached.sum(0)).tolist(), rel=1e-5)
    assert result.metrics()["eval/alpha_1"] == result.alpha[0]


def test_lr_schedule():
    assert lr_factor(0, 4, 20, "cosine") == pytest.approx(0.25)
    assert lr_factor(4, 4, 20, "cosine") == pytest.approx(1.0)
    assert lr_factor(20, 4, 20, "cosine") == pytest.approx(0.0)
    assert lr_factor(12, 4, 20, "linear") == pytest.approx(0.5)
    assert lr_factor(19, 0, 20, "constant") == 1.0


def test_steps_that_fit_a_time_budget():
    assert steps_that_fit(100, 600, remaining_s=300.0, step_s=1.5) == 300  # 200 more steps fit
    assert steps_that_fit(100, 600, remaining_s=3000.0, step_s=1.5) == 600  # never past the recipe
    assert steps_that_fit(100, 600, remaining_s=-5.0, step_s=1.5) == 101  # over budget: end after one more step
    assert steps_that_fit(100, 600, remaining_s=1.4, step_s=1.5) == 101
    assert steps_that_fit(100, 600, remaining_s=10.0, step_s=0.0) == 600  # no measurement yet: no change
    # a fast machine re-plans at the recipe's last step with time to spare: the run ends there, finished (it planned
    # step 601 of 600 and reported itself unfinished before)
    assert steps_that_fit(600, 600, remaining_s=392.0, step_s=0.51) == 600


@pytest.mark.parametrize("kind", ["streak", "ar_distill", "naive", "mdm"])
def test_every_objective_trains_the_drafter(verifier_model, kind):
    cfg = parse_config(base_config(objective={"kind": kind, "gamma": 4}, teacher={"max_new_tokens": 8}))
    drafter = drafter_from_verifier(verifier_model, num_layers=1)
    records = {"prompt_ids": PROMPTS, "completion_ids": [list(range(20, 28))] * 3,
               "topk_ids": [[[t, 1, 2] for t in range(20, 28)]] * 3, "topk_logprobs": [[[-0.2, -2.0, -3.0]] * 8] * 3}
    gen = torch.Generator().manual_seed(0)
    batch = cut_windows(records, 4, 2, None, gen)
    hf = HFModel(drafter.model)
    loss = window_loss(hf, drafter, cfg, batch, gen)
    loss.backward()
    grads = [p.grad for p in drafter.model.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)


def test_lora_checkpoint_roundtrip_and_merged_drafter(tmp_path, verifier_model):
    cfg = parse_config(base_config(train={"lora": {"enabled": True, "r": 4, "alpha": 8}},
                                   objective={"gamma": 4}, teacher={"max_new_tokens": 8}))
    drafter = drafter_from_verifier(verifier_model, num_layers=1)
    model = apply_lora(drafter.model, cfg.train.lora)
    untrained = drafter.propose([1, 2, 3], 4)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert 0 < sum(p.numel() for p in trainable) < sum(p.numel() for p in model.parameters()) // 4
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    gen = torch.Generator().manual_seed(0)
    records = {"prompt_ids": PROMPTS, "completion_ids": [list(range(30, 38))] * 3,
               "topk_ids": [[]] * 3, "topk_logprobs": [[]] * 3}
    for _ in range(3):
        loss = window_loss(HFModel(drafter.model), drafter, cfg, cut_windows(records, 4, 2, None, gen), gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    trained = drafter.propose([1, 2, 3], 4)
    assert not torch.allclose(trained, untrained, atol=1e-4)
    state = {"step": 3, "evals": [[0, 0.1, [0.1] * 4], [3, 0.2, [0.2] * 4]], "run_id": None}
    save_checkpoint(tmp_path, model, opt, sched, gen, state)

    fresh = drafter_from_verifier(verifier_model, num_layers=1)
    fresh_model = apply_lora(fresh.model, cfg.train.lora)
    opt2 = torch.optim.AdamW([p for p in fresh_model.parameters() if p.requires_grad], lr=1e-2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0)
    assert load_checkpoint(tmp_path, fresh_model, opt2, sched2, torch.Generator())["step"] == 3
    torch.testing.assert_close(fresh.propose([1, 2, 3], 4), trained)
    assert sched2.last_epoch == 3 and len(opt2.state) == len(opt.state)

    record = {"name": "tiny", "version": "1", "digest": "sha256:x", "path": "v"}
    _write_drafter(tmp_path / "drafter", model, drafter, cfg, record, state)
    loaded = load_drafter(tmp_path / "drafter")
    torch.testing.assert_close(loaded.propose([1, 2, 3], 4), trained, atol=1e-5, rtol=1e-4)
    meta = json.loads((tmp_path / "drafter" / "specdiff_drafter.json").read_text())
    assert meta["verifier"] == record and meta["training"]["heldout_expected_streak"] == {"initial": 0.1,
                                                                                        "final": 0.2}
    assert not any("lora" in k for k in loaded.model.state_dict())  # merged, plain Llama weights


def test_verifier_record_digest_changes_with_weights(tmp_path):
    tiny_llama(V, seed=0).save_pretrained(tmp_path / "a")
    tiny_llama(V, seed=1).save_pretrained(tmp_path / "b")
    a, b = verifier_record(tmp_path / "a", version="2"), verifier_record(tmp_path / "b")
    assert a.name == "a" and a.version == "2" and a.digest.startswith("sha256:") and a.digest != b.digest
    assert verifier_record(tmp_path / "a", version="2") == a
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="verifier.path must hold model weights"):
        verifier_record(tmp_path / "empty")


def test_prefix_ar_loss_is_the_causal_next_token_loss(verifier_model):
    from specdiff.distill.train import prefix_ar_loss
    from specdiff.models.drafter import window_inputs, window_outputs

    drafter = drafter_from_verifier(verifier_model, num_layers=2, causal_prefix=True)
    prefixes = [list(range(3, 15)), [5, 6, 7]]  # the second is shorter than M + 1: its left padding is excluded
    m = 6
    inputs = window_inputs(prefixes, 4, drafter.config.mask_token_id)
    hf = HFModel(drafter.model)
    outputs = window_outputs(hf, inputs, drafter.config, grad=False, prefix_outputs=m)
    got = prefix_ar_loss(outputs[:, :m], inputs, drafter.config)
    nll = []
    for p in prefixes:  # a plain causal pass over the prefix alone: block attention must not leak the window
        logp = drafter.model(torch.tensor([p])).logits[0, :-1, :V].float().log_softmax(-1)
        nll += [-logp[i, p[i + 1]] for i in range(max(0, len(p) - 1 - m), len(p) - 1)]
    torch.testing.assert_close(got, torch.stack(nll).mean(), atol=1e-5, rtol=1e-4)


def test_freeze_embeddings_keeps_vocabulary_rows_and_trains_the_mask_row(verifier_model):
    from specdiff.distill.train import freeze_vocabulary_rows

    cfg = parse_config(base_config(objective={"kind": "mdm", "gamma": 4}, teacher={"max_new_tokens": 8},
                                   drafter={"causal_prefix": True}, train={"freeze_embeddings": True}))
    drafter = drafter_from_verifier(verifier_model, num_layers=1, causal_prefix=True)
    freeze_vocabulary_rows(drafter.model, V)
    before = drafter.model.model.embed_tokens.weight.detach().clone()
    opt = torch.optim.AdamW(drafter.model.parameters(), lr=1e-2, weight_decay=0.0)
    records = {"prompt_ids": PROMPTS, "completion_ids": [list(range(20, 28))] * 3,
               "topk_ids": [[[]] * 8] * 3, "topk_logprobs": [[[]] * 8] * 3}
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        loss = window_loss(HFModel(drafter.model), drafter, cfg, cut_windows(records, 4, 2, None, gen), gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = drafter.model.model.embed_tokens.weight.detach()
    assert torch.equal(after[:V], before[:V])
    assert not torch.equal(after[V], before[V])  # the mask token's row learns


def test_ar_drafter_inherits_layers_trains_and_assists_hf_generate(verifier_model):
    from specdiff.distill.ar import ar_drafter_from_verifier, completion_nll, train_ar_drafter

    ar = ar_drafter_from_verifier(verifier_model, [1])
    torch.testing.assert_close(ar.model.layers[0].mlp.up_proj.weight, verifier_model.model.layers[1].mlp.up_proj.weight)
    assert ar.config.vocab_size == verifier_model.config.vocab_size
    records = [{"prompt_ids": p, "completion_ids": list(range(20, 28))} for p in PROMPTS]
    with torch.no_grad():
        before = float(completion_nll(ar, records))
    train_ar_drafter(ar, records, steps=30, batch_size=3, lr=1e-2, warmup_steps=2)
    with torch.no_grad():
        assert float(completion_nll(ar, records)) < before - 1.0
        prompt = torch.tensor([[1, 2, 3]])
        plain = verifier_model.generate(prompt, do_sample=False, max_new_tokens=10)
        assisted = verifier_model.generate(prompt, do_sample=False, max_new_tokens=10, assistant_model=ar)
    assert torch.equal(plain, assisted)
    with pytest.raises(ValueError, match="layers must be indices"):
        ar_drafter_from_verifier(verifier_model, [5])


def test_prefix_ar_weight_trains_with_prefixes_shorter_than_its_rows(verifier_model):
    cfg = parse_config(base_config(objective={"kind": "streak", "gamma": 4, "prefix_ar_weight": 1.0,
                                              "prefix_ar_positions": 16},
                                   teacher={"max_new_tokens": 8}, drafter={"causal_prefix": True}))
    drafter = drafter_from_verifier(verifier_model, num_layers=1, causal_prefix=True)
    batch = cut_windows({"prompt_ids": [[1], [2, 3]], "completion_ids": [list(range(20, 28))] * 2,
                         "topk_ids": [[[]] * 8] * 2, "topk_logprobs": [[[]] * 8] * 2}, 4, 1, None, None)
    gen = torch.Generator().manual_seed(0)
    loss = window_loss(HFModel(drafter.model), drafter, cfg, batch, gen)
    plain = parse_config(base_config(objective={"kind": "streak", "gamma": 4}, teacher={"max_new_tokens": 8}))
    assert torch.isfinite(loss) and float(loss) > float(window_loss(HFModel(drafter.model), drafter, plain, batch, gen))


def test_pretrained_drafter_keeps_its_attention_unless_the_config_sets_it(tmp_path, verifier_model):
    from specdiff import save_drafter
    from specdiff.distill.train import build_drafter

    save_drafter(drafter_from_verifier(verifier_model, num_layers=1, causal_prefix=True), tmp_path / "block")
    pretrained = {"init": "pretrained", "path": str(tmp_path / "block")}
    kept = build_drafter(parse_config(base_config(drafter=pretrained)), verifier_model)
    assert kept.config.causal_prefix is True and kept._cache is not None
    off = build_drafter(parse_config(base_config(drafter={**pretrained, "causal_prefix": False})), verifier_model)
    assert off.config.causal_prefix is False
    assert build_drafter(parse_config(base_config()), verifier_model).config.causal_prefix is False


def test_teacher_past_its_deadline_returns_empty_batches_of_the_same_schema(tmp_path):
    """teacher.time_budget_s: the actor samples no more once the deadline has passed, but always one batch first
    (so the job has data and the empty batches have the sampled ones' schema)."""
    import time
    from dataclasses import asdict

    import pyarrow as pa

    from specdiff.distill.teacher import TeacherSampler

    tiny_llama(V, seed=0).save_pretrained(tmp_path / "v")
    sampler = TeacherSampler(verifier=verifier_record(tmp_path / "v").to_dict(), dtype="float32",
                             sampling=asdict(SamplingParams(temperature=0.0)), max_new_tokens=4, logprobs_k=2,
                             max_prompt_tokens=16, seed=0, taps=[1], deadline=time.time() - 1.0)
    table = pa.table({"prompt_ids": pa.array(PROMPTS, type=pa.list_(pa.int32()))})
    first = sampler(table)  # past the deadline already: the first batch is still sampled
    assert first.num_rows == 3 and len(first.column("completion_ids")[0]) == 4
    second = sampler(table)
    assert second.num_rows == 0 and second.schema == first.schema
    assert (sampler.sampled, sampler.skipped) == (3, 3)
    sampler.deadline = time.time() + 60.0
    assert sampler(table).num_rows == 3 and sampler.sampled == 6


def test_local_ray_hook_drops_only_the_state_api_warning_and_needs_no_specdiff(tmp_path):
    """The worker set-up hook of a dashboard-less local Ray silences Ray Train's placement-group cleaner's
    once-a-second "State API unavailable" warning, keeps its other messages, and unpickles in a process that has
    not imported specdiff (Ray ships it to every worker; the controller, the cleaner and the data readers never
    import our package)."""
    import logging
    import subprocess
    import sys

    from ray import cloudpickle  # what Ray pickles a set-up hook with

    from specdiff.distill.job import _train_cleaner_quiet_hook

    blob = tmp_path / "hook.pkl"
    blob.write_bytes(cloudpickle.dumps(_train_cleaner_quiet_hook()))
    script = f"""
import logging, pickle, sys
pickle.loads(open({str(blob)!r}, "rb").read())()
log = logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner")
log.propagate = False  # (importing ray configures the "ray" loggers) print what passes the logger's filters
log.addHandler(logging.StreamHandler(sys.stdout))
log.warning("Failed to query Ray Train Controller actor state. State API may be temporarily unavailable.")
log.warning("Detected that the Ray Train controller actor is dead.")
print("specdiff imported:", any(m == "specdiff" or m.startswith("specdiff.") for m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["Detected that the Ray Train controller actor is dead.",
                                       "specdiff imported: False"]
    assert logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner").filters == []
