"""The Ray Train worker loop: plain PyTorch with four Ray touchpoints (prepare_model, get_dataset_shard,
get_checkpoint, report).

Every worker builds the drafter, restores the latest checkpoint if there is one, and runs DDP steps on its shard of
the streamed teacher trajectories. Rank 0 alone evaluates on held-out prefixes (α_j, expected streak), logs to the
tracker, writes checkpoints (trainable weights as safetensors + optimizer state + ``state.json``) and, at the last
step, the merged drafter directory (``save_drafter``, with the verifier record) inside the final checkpoint.
Decisions about when to report depend only on the step, so all ranks call ``ray.train.report`` together.
"""

from __future__ import annotations

import collections
import copy
import json
import math
import os
import signal
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from specdiff.models.drafter import (
    HFDiffusionDrafter,
    build_small_drafter,
    drafter_from_verifier,
    load_drafter,
    save_drafter,
    window_from_outputs,
    window_inputs,
    window_outputs,
)
from specdiff.models.dtypes import train_autocast_bf16
from specdiff.models.feature_drafter import (
    FeatureDrafter,
    build_feature_drafter,
    is_feature_drafter,
    load_feature_drafter,
    save_feature_drafter,
)
from specdiff.models.hf import HFModel
from specdiff.runtime.memory import keep_freed_memory
from specdiff.core.objectives import ar_distill_loss, mask_window, masked_diffusion_loss, naive_window_loss, streak_loss
from specdiff.distill.config import DistillConfig
from specdiff.distill.events import Emitter, Evaluated, Note, TrainStep
from specdiff.distill.evaluate import alpha_plot, evaluate_drafter
from specdiff.distill.feature import evaluate_feature_drafter, feature_loss, teacher_forced_eval
from specdiff.distill.trajectories import load_verifier_model
from specdiff.lineage.evaluation import EvalResult
from specdiff.distill.tracking import NullTracker, make_tracker
from specdiff.distill.windows import WindowBatch, cut_windows

STATE = "state.json"
WEIGHTS = "trainable.safetensors"
OPTIMIZER = "optimizer.pt"
DRAFTER_DIR = "drafter"


def build_drafter(cfg: DistillConfig, verifier_model: torch.nn.Module | None,
                  vocabulary: list[int] | None = None) -> HFDiffusionDrafter | FeatureDrafter:
    d = cfg.drafter
    if d.init == "feature":
        extra = {"draft_vocab_size": d.draft_vocab_size} if d.draft_vocab_size else {}
        drafter = build_feature_drafter(verifier_model, num_layers=d.num_layers, target_layer_ids=d.target_layer_ids,
                                        seed=cfg.run.seed, max_gamma=max(16, cfg.objective.gamma), **extra)
        if vocabulary is not None:
            drafter.set_draft_vocabulary(torch.tensor(vocabulary))
        drafter.model.float()  # trained in float32; the verifier's frozen embeddings/head keep their dtype
        return drafter
    if d.init == "pretrained" and is_feature_drafter(d.path):
        drafter = load_feature_drafter(d.path, verifier_model, dtype=torch.float32)
        return drafter
    if d.init == "pretrained":
        drafter = load_drafter(d.path)
    elif d.init == "from_verifier":
        drafter = drafter_from_verifier(verifier_model, num_layers=d.num_layers, layers=d.layers,
                                        causal_prefix=bool(d.causal_prefix), seed=cfg.run.seed)
    else:
        vocab = int(verifier_model.get_output_embeddings().weight.shape[0])
        drafter = build_small_drafter(vocab, hidden_size=d.hidden_size, num_layers=d.num_layers,
                                      num_heads=d.num_heads, seed=cfg.run.seed)
    # Unset fields keep what the drafter already has (a pretrained drafter's own attention and context bound).
    overrides = {k: v for k, v in (("max_context", d.max_context), ("causal_prefix", d.causal_prefix)) if v is not None}
    if overrides:
        drafter = HFDiffusionDrafter(drafter.model, replace(drafter.config, **overrides))
    return drafter


def freeze_vocabulary_rows(model: torch.nn.Module, vocab_size: int) -> None:
    """Zero the gradient of the first ``vocab_size`` rows of the input embeddings and the LM head (the same tensor
    when tied): inherited token vectors stay fixed, appended rows (the mask token) still train. With zero
    gradients from the start, AdamW (weight decay 0) leaves those rows exactly unchanged."""
    weights = {id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_output_embeddings())
               if m is not None}
    for weight in weights.values():
        keep = torch.ones(weight.shape[0], 1, dtype=weight.dtype, device=weight.device)
        keep[:vocab_size] = 0
        weight.register_hook(lambda grad, keep=keep: grad * keep)


def apply_lora(model: torch.nn.Module, lora) -> torch.nn.Module:
    """Inject LoRA adapters in place (the Hugging Face model keeps its class) and return the peft wrapper."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.targets),
                        bias="none")
    return get_peft_model(model, config)


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based): linear warm-up, then decay."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1 - progress
    return 1.0


BUDGET_RESERVE_S = 10.0  # of a time budget, kept for the final checkpoint and drafter (plus two evaluations)


def steps_that_fit(step: int, steps: int, remaining_s: float, step_s: float) -> int:
    """The last step a run at ``step`` can reach in ``remaining_s`` seconds at ``step_s`` seconds a step: at least
    one more step (none once ``steps`` is reached), at most ``steps``."""
    if not step_s > 0:
        return steps
    return min(steps, max(step + 1, step + int(max(0.0, remaining_s) // step_s)))


def _agree_min(value: int, world: int) -> int:
    """The smallest of the ranks' ``value`` (every rank must plan the same last step, or DDP would hang)."""
    if world == 1:
        return value
    import torch.distributed as dist

    x = torch.tensor([value])
    dist.all_reduce(x, op=dist.ReduceOp.MIN)
    return int(x)


def window_loss(hf: HFModel, drafter: HFDiffusionDrafter, cfg: DistillConfig, batch: WindowBatch,
                generator: torch.Generator) -> torch.Tensor:
    """The configured objective on one batch of windows (gradients flow through ``hf``)."""
    o, dcfg = cfg.objective, drafter.config
    extra = o.prefix_ar_positions if o.prefix_ar_weight > 0 else 0
    if extra and not (dcfg.causal_prefix and dcfg.shifted_logits):
        raise ValueError("objective.prefix_ar_weight needs a drafter with causal_prefix and shifted_logits, got "
                         f"causal_prefix={dcfg.causal_prefix}, shifted_logits={dcfg.shifted_logits}")
    if o.kind == "mdm":
        noisy, masked, t = mask_window(batch.labels, dcfg.mask_token_id, generator)
        inputs = window_inputs(batch.prefixes, noisy, dcfg.mask_token_id)
    else:
        inputs = window_inputs(batch.prefixes, o.gamma, dcfg.mask_token_id)
    extra = max(0, min(extra, inputs.ids.shape[1] - inputs.gamma - 1))  # rows that exist before the window
    outputs = window_outputs(hf, inputs, dcfg, grad=True, prefix_outputs=extra)
    logits = window_from_outputs(outputs[:, extra:], dcfg)
    labels = batch.labels.to(logits.device)
    if o.kind == "mdm":
        loss = masked_diffusion_loss(logits, labels, masked.to(logits.device), t)
    elif o.kind == "streak":
        loss = streak_loss(logits, labels, o.temperature)
    elif o.kind == "naive":
        loss = naive_window_loss(logits, labels, o.temperature)
    else:
        loss = ar_distill_loss(logits[:, 0], batch.teacher_ids.to(logits.device),
                               batch.teacher_logprobs.to(logits.device), o.divergence, o.temperature)
    if extra:
        loss = loss + o.prefix_ar_weight * prefix_ar_loss(outputs[:, :extra], inputs, dcfg)
    return loss


def prefix_ar_loss(outputs: torch.Tensor, inputs, config) -> torch.Tensor:
    """Next-token cross-entropy of the block-causal prefix rows: outputs [B, M, V'] at the M positions before the
    last prefix token predict the last M prefix tokens (left padding excluded)."""
    m, length = outputs.shape[1], inputs.ids.shape[1]
    end = length - inputs.gamma  # first window column
    targets = inputs.ids[:, end - m : end].to(outputs.device)
    valid = inputs.valid[:, end - m - 1 : end - 1].to(outputs.device)
    logp = outputs[..., : config.vocab_size].float().log_softmax(-1)
    nll = -logp.gather(-1, targets[..., None].clamp_max(config.vocab_size - 1)).squeeze(-1)
    return (nll * valid).sum() / valid.sum().clamp_min(1)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters, plus a feature drafter's draft vocabulary (a buffer fixed before training)."""
    state = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    state.update({n: b.detach().cpu().contiguous() for n, b in model.named_buffers() if n.endswith("draft_ids")})
    return state


def save_checkpoint(path: Path, model, optimizer, scheduler, generator, state: dict) -> None:
    from safetensors.torch import save_file

    save_file(trainable_state(model), str(path / WEIGHTS))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "generator": generator.get_state()}, path / OPTIMIZER)
    (path / STATE).write_text(json.dumps(state, indent=2, sort_keys=True))


def load_checkpoint(path: Path, model, optimizer, scheduler, generator) -> dict:
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(load_file(str(path / WEIGHTS)), strict=False)
    if unexpected:
        raise ValueError(f"checkpoint {str(path)!r} holds weights this model lacks: {unexpected[:5]}")
    extra = torch.load(path / OPTIMIZER, weights_only=False)
    optimizer.load_state_dict(extra["optimizer"])
    scheduler.load_state_dict(extra["scheduler"])
    generator.set_state(extra["generator"])
    return json.loads((path / STATE).read_text())


def _batches(shard, batch_size: int, shuffle_buffer: int = 0, seed: int = 0):
    """Endless teacher batches (dict of python lists): epoch after epoch over this worker's shard, each epoch
    shuffled through a buffer of ``shuffle_buffer`` trajectories (0: in order) with its own seed."""
    epoch = 0
    while True:
        seen = 0
        shuffle = {"local_shuffle_buffer_size": shuffle_buffer, "local_shuffle_seed": seed * 1_000_003 + epoch} \
            if shuffle_buffer else {}
        epoch += 1
        for table in shard.iter_batches(batch_size=batch_size, batch_format="pyarrow", drop_last=True, **shuffle):
            seen += 1
            yield {name: table.column(name).to_pylist() for name in table.column_names}
        if not seen:
            raise ValueError(f"a worker's data shard holds fewer than train.batch_size={batch_size} trajectories; "
                             "add prompts or lower train.batch_size / train.num_workers")


def train_loop(loop_config: dict) -> None:
    import ray.train
    import ray.train.torch

    keep_freed_memory()  # every step frees and reallocates ~100 MB blocks: reuse them instead of faulting pages in
    cfg = DistillConfig.model_validate(loop_config["config"])
    record, heldout = loop_config["verifier_record"], loop_config["heldout_prefixes"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    t, o = cfg.train, cfg.objective
    say = loop_config.get("events") or Emitter()  # rank 0's progress: its log line, and the driver's relay if any

    # On the worker's device (a GPU with use_gpu): a feature drafter reads its embeddings and head, rank 0 evaluates
    # with it. Index tensors and sampling stay on the host; they meet the weights at the forward passes.
    verifier_model = load_verifier_model(record["path"], cfg.verifier.dtype).to(device)
    drafter = build_drafter(cfg, verifier_model, loop_config.get("draft_vocabulary"))
    feature = isinstance(drafter, FeatureDrafter)
    if rank != 0 and not feature:
        verifier_model = None  # only rank 0 evaluates (a feature drafter keeps the verifier's embeddings and head)
    model = apply_lora(drafter.model, t.lora) if t.lora.enabled else drafter.model
    model.to(device)
    if t.freeze_embeddings and not feature:
        freeze_vocabulary_rows(drafter.model, drafter.config.vocab_size)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    # starts: the step each attempt began at (a resumed run continues from its checkpoint, not from 0).
    # planned_steps: the schedule's last step, fewer than train.steps where a time budget says so.
    state = {"step": 0, "run_id": None, "evals": [], "starts": [], "verifier_digest": record["digest"]}

    def planned() -> int:
        return state.get("planned_steps", t.steps)  # a checkpoint from before time budgets has none

    def end() -> int:
        return min(planned(), t.stop_after or t.steps)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, t.warmup_steps, planned(),
                                                                                t.schedule))
    generator = torch.Generator().manual_seed(cfg.run.seed * 7919 + rank)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = load_checkpoint(Path(d), model, optimizer, scheduler, generator)
        if state["verifier_digest"] != record["digest"]:
            raise ValueError(f"run {cfg.run.name!r} was trained against verifier {state['verifier_digest']}, got "
                             f"{record['digest']}; use a new run.name to start over")
    start = state["step"]
    state["starts"].append(start)
    if rank == 0:
        _log_attempt(cfg, start)
    if rank == 0:
        say(Note(f"[distill] rank 0/{world}: {'resuming at step ' + str(start) if start else 'starting'} "
                 f"({sum(p.numel() for p in params):,} trainable parameters, objective={o.kind}, gamma={o.gamma})"))

    prepared = ray.train.torch.prepare_model(model, move_to_device=False)  # DDP (gloo on CPU) when world > 1
    hf = None if feature else HFModel(drafter.model, runner=prepared)
    tracker = make_tracker(cfg.tracking, cfg.run.name, state["run_id"]) if rank == 0 else NullTracker()
    if rank == 0:
        state["run_id"] = tracker.run_id
        if not start:
            tracker.log_params({**cfg.model_dump(mode="json"), "verifier_record": record})
    eval_model = None if feature else HFModel(drafter.model)
    verifier = HFModel(verifier_model) if verifier_model is not None and rank == 0 else None
    width = drafter.config.hidden_size if feature else getattr(drafter.model.config, "hidden_size", None)
    use_bf16 = train_autocast_bf16(t.precision, device, width)  # auto: a bf16 GPU, or a wide drafter on a bf16 CPU
    if rank == 0:
        say(Note(f"[distill] training precision: {'bf16 autocast' if use_bf16 else 'fp32'} (train.precision="
                 f"{t.precision})"))

    eval_s = 0.0  # the last evaluation's duration (rank 0), kept back from a time budget

    def evaluate(step: int) -> dict:
        nonlocal eval_s
        if rank != 0:
            return {}
        began = time.perf_counter()
        options = dict(num_candidates=cfg.eval.num_candidates, draft_temperature=cfg.eval.draft_temperature,
                       generator=torch.Generator().manual_seed(cfg.run.seed))
        was_training = drafter.model.training
        drafter.model.eval()
        if feature:
            drafter.reset()
            result = None
            greedy = (cfg.eval_sampling().temperature == 0 and cfg.eval.num_candidates == 1
                      and cfg.eval.draft_temperature == 0)
            if greedy and loop_config.get("heldout_records"):  # read off the greedy held-out trajectories
                result = teacher_forced_eval(drafter, verifier, loop_config["heldout_records"], cfg.eval.offsets,
                                             o.gamma)
            if result is None:
                how = "scored by the verifier"
                result = evaluate_feature_drafter(drafter, verifier, heldout, o.gamma, cfg.eval_sampling(),
                                                  **options)
            else:
                how = "read off the held-out trajectories" + (
                    f"; {result.cut} of {result.windows} streaks cut where a trajectory is not this pass's argmax"
                    if result.cut else "")
        else:
            how = "scored by the verifier"
            result = evaluate_drafter(eval_model, drafter.config, verifier, heldout, o.gamma, cfg.eval_sampling(),
                                      **options)
        drafter.model.train(was_training)
        state["evals"].append([step, result.expected_streak, result.alpha])
        metrics = result.metrics()
        tracker.log_metrics(metrics, step)
        with tempfile.TemporaryDirectory() as tmp:
            history = [(s, EvalResult(e, a, len(heldout))) for s, e, a in state["evals"]]
            tracker.log_artifact(alpha_plot(history, os.path.join(tmp, "alpha_per_position.png")), "plots")
        eval_s = time.perf_counter() - began
        say(Evaluated(step, result.expected_streak, tuple(result.alpha), eval_s, how))
        return {**metrics, "eval/initial_expected_streak": state["evals"][0][1]}

    if start == 0:
        ray.train.report({"step": 0, **evaluate(0)})

    batches = _batches(ray.train.get_dataset_shard("train"), t.batch_size, loop_config.get("shuffle_buffer", 0),
                       cfg.run.seed * 7919 + rank + start)  # a resumed run does not replay the first epochs
    job_started = loop_config.get("job_started") or time.time()
    step_times, data_times, losses = [], [], []
    recent = collections.deque(maxlen=20)  # the step times a time budget plans from
    step = start
    while step < end():
        began = time.perf_counter()
        records = next(batches)
        data_times.append(time.perf_counter() - began)
        prepared.train()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
            if feature:
                # The CE warm-up spans the same share of a budget-shortened schedule; once past it, never back.
                if "streak_from" not in state and step >= o.warmup_ce_steps * planned() // t.steps:
                    state["streak_from"] = step
                objective = o if "streak_from" in state or o.kind != "streak" else o.model_copy(
                    update={"kind": "decayed_ce"})
                loss = feature_loss(drafter, prepared, objective, records, generator)
            else:
                windows = cut_windows(records, o.gamma, o.windows_per_sample, drafter.config.max_context, generator)
                loss = window_loss(hf, drafter, cfg, windows, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip) if t.grad_clip else None
        optimizer.step()
        scheduler.step()
        step += 1
        state["step"] = step
        step_times.append(time.perf_counter() - began)
        recent.append(step_times[-1])
        losses.append(loss.item())
        if t.time_budget_s and step - start >= 5 and step % 5 == 0:  # re-plan from the measured step time
            left, step_s = t.time_budget_s - (time.time() - job_started), sum(recent) / len(recent)
            total = _agree_min(steps_that_fit(step, t.steps, left - BUDGET_RESERVE_S - 2 * eval_s, step_s), world)
            if total != planned() and rank == 0:
                say(Note(f"[distill] time budget: {total} of {t.steps} steps fit ({step_s:.2f} s a step, "
                         f"{left:.0f} s left)"))
            state["planned_steps"] = total

        if cfg.fault.kill_at_step == step and cfg.fault.kill_rank == rank:
            marker = Path(cfg.run.storage_path) / cfg.run.name / "fault_injected"
            if not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(f"killed rank {rank} at step {step}\n")
                print(f"[distill] fault injection: SIGKILL rank {rank} at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        metrics = {"step": step, "planned_steps": planned()}
        last = step == end()
        if step % t.log_every == 0 or last:
            train_metrics = {"train/loss": sum(losses) / len(losses), "train/lr": scheduler.get_last_lr()[0],
                             "train/step_s": sum(step_times) / len(step_times),
                             "train/data_wait_s": sum(data_times) / len(data_times)}
            if grad_norm is not None:
                train_metrics["train/grad_norm"] = float(grad_norm)
            tracker.log_metrics(train_metrics, step)
            if rank == 0:
                say(TrainStep(step, planned(), train_metrics["train/loss"], train_metrics["train/lr"],
                              train_metrics["train/step_s"], train_metrics["train/data_wait_s"]))
            metrics.update(train_metrics)
            step_times, data_times, losses = [], [], []
        if step % cfg.eval.every == 0 or last:
            metrics.update(evaluate(step))
        if step % t.checkpoint_every == 0 or last:
            _report_with_checkpoint(metrics, rank, model, optimizer, scheduler, generator, state,
                                    final=step == planned(), drafter=drafter, cfg=cfg, record=record)
        elif step % cfg.eval.every == 0:
            ray.train.report(metrics)
    if step == planned():
        tracker.finish()


def _log_attempt(cfg: DistillConfig, start: int) -> None:
    """Append this attempt's first step to <storage>/<run>/attempts.jsonl (local storage only): the history of
    starts, restarts and resumes survives even when the checkpoint written last was never registered."""
    if "://" in cfg.run.storage_path:
        return
    path = Path(cfg.run.storage_path) / cfg.run.name / "attempts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"start": start, "time": time.time()}) + "\n")


def _report_with_checkpoint(metrics, rank, model, optimizer, scheduler, generator, state, *, final, drafter, cfg,
                            record) -> None:
    import ray.train

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            path = Path(tmp)
            save_checkpoint(path, model, optimizer, scheduler, generator, state)
            if final:
                _write_drafter(path / DRAFTER_DIR, model, drafter, cfg, record, state)
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint)


def _write_drafter(path: Path, model, drafter: HFDiffusionDrafter, cfg: DistillConfig, record: dict, state: dict):
    """The engine-loadable drafter: LoRA merged into a copy of the weights, plus the lineage record."""
    evals = state["evals"]
    if isinstance(drafter, FeatureDrafter):
        save = partial(save_feature_drafter, drafter, path)
    else:
        merged = copy.deepcopy(model).merge_and_unload() if cfg.train.lora.enabled else model
        save = partial(save_drafter, HFDiffusionDrafter(merged, drafter.config), path)
    save(
        verifier=record,
        training={
            "objective": cfg.objective.model_dump(mode="json"),
            "teacher": cfg.teacher.model_dump(mode="json", exclude={"save_to"}),
            "steps": state["step"],
            "recipe_steps": cfg.train.steps,  # more than "steps" where train.time_budget_s shortened the run
            "time_budget_s": cfg.train.time_budget_s,
            "lora": cfg.train.lora.model_dump(mode="json") if cfg.train.lora.enabled else None,
            "heldout_expected_streak": {"initial": evals[0][1] if evals else None,
                                        "final": evals[-1][1] if evals else None},
            "heldout_alpha_final": evals[-1][2] if evals else None,
        },
    )
