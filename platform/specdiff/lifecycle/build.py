"""The recipe of the embedded default drafter for SmolLM2-135M-Instruct, run with the project's own pipeline.

    specdiff build                      # the default drafter -> $SPECDIFF_HOME/drafters/default
    specdiff build --ablations          # + the bench's ablation drafters (objectives, standalone, AR)
    specdiff build --budget-minutes 0   # the whole recipe, however long it takes (default: 15 min)

    from specdiff.lifecycle.build import build_default
    build_default(progress=print)       # the folder; its progress as typed events (BuildEvent)

Recipe (``specdiff.recipes``; each stage one ``specdiff.distill.run`` on a local Ray, in this process, its config
typed and its progress delivered as events: no stage reads another's printed text):
  1. teacher: the frozen verifier decodes the training prompts greedily (specdiff.prompts: code, math, chat train
     splits) and keeps its tapped hidden states from the same passes; written once to parquet and reused by every
     later stage;
  2. smollm2-feature: a drafter conditioned on the verifier's hidden states (DFlash-style), streak-distilled
     (SpecDiff-2 Eq. 6) after a decayed-CE warm-up.
With ablations, the same feature drafter is trained on the same data with objective.kind=decayed_ce (DFlash) and
ar_distill; the standalone masked-diffusion drafter (the paper's configuration: verifier layers over the prefix,
smollm2-mdm then smollm2-streak) is built with its own ablations, and an AR drafter of the same layers for HF
assisted generation.
Work files and logs live in $SPECDIFF_HOME/build/smollm2 (a stage's events in ``<stage>.log``, its summary in
``<stage>.summary.json``); an interrupted build resumes from the last checkpoint. SPECDIFF_BUILD_QUICK=1 shrinks every
stage to a few steps on a few prompts (CI smoke tests of this pipeline; the drafter it makes is not useful).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from specdiff.distill.config import DistillConfig, parse_config
from specdiff.distill.events import Evaluated, Event, TrainStep
from specdiff.runtime import publish as publish_file
from specdiff.runtime.publish import publishing
from specdiff.models.sources import DEFAULT_VERIFIER, state_dir
from specdiff.recipes import read_recipe

ABLATIONS = ("ar_distill", "naive")  # of the standalone drafter
FEATURE_ABLATIONS = ("decayed_ce", "ar_distill")  # of the feature drafter (same data, same drafter)
FAMILY = "smollm2"  # the default pair's family in the registry: specdiff-verifier-smollm2, specdiff-drafter-smollm2
QUICK_EVAL = {"eval": {"offsets": [0]}, "teacher": {"max_new_tokens": 12}}  # SPECDIFF_BUILD_QUICK's held-out test
QUICK = {"train": {"steps": 3, "batch_size": 2, "checkpoint_every": 3}, "eval": {"every": 3, "offsets": [0]},
         "data": {"max_prompt_tokens": 48}, "teacher": {"max_new_tokens": 12}}


def quick() -> bool:
    return os.environ.get("SPECDIFF_BUILD_QUICK") == "1"


def drafters_dir() -> Path:
    return state_dir() / "drafters"


def default_drafter_dir() -> Path:
    return drafters_dir() / "default"


def work_dir() -> Path:
    return state_dir() / "build" / "smollm2"


def write_prompts(work: Path, scale: float = 1.0) -> tuple[Path, Path]:
    """The training prompts' ids (``specdiff.prompts.training_mix``: the in-distribution sets beside standard-library
    code and prose, raw and as requests, broader math and requests the verifier writes itself), and greedy teacher
    trajectories of held-out prompts from sources disjoint from training (``DISJOINT_SETS``: other files, other
    templates, another seed). Held-out trajectories are sampled here, once, so no stage has to start a teacher actor
    for 16 prompts. The prompts' texts go to ``prompts.txt.jsonl`` beside them, for a person to read. ``scale``
    multiplies every source's count (a source with fewer prompts gives all it has)."""
    from specdiff import SamplingParams
    from specdiff.distill.selfwritten import packaged
    from specdiff.distill.trajectories import sample_completions
    from specdiff.models.hf import HFModel
    from specdiff.models.sources import load_causal_lm
    from specdiff.prompts import DISJOINT_SETS, SELF_WRITTEN, TRAINING_MIX, eval_prompts, prompt_ids, training_mix

    model, tokenizer = load_causal_lm(DEFAULT_VERIFIER, "auto")  # the dtype policy: float32 on a CPU without bf16
    per_set = 1 if quick() else 4
    scale = 0.02 if quick() else scale  # a longer build's budget buys more prompts of every source
    n_self = max(1, round(TRAINING_MIX[SELF_WRITTEN] * scale))
    shipped = packaged(DEFAULT_VERIFIER)  # written once by this verifier, shipped with the package: no sampling here
    train_self, held_self = shipped["train"][:n_self], shipped["heldout"][:per_set]
    train = training_mix(train_self, scale=scale)
    evaluation = [p for ps in eval_prompts(DISJOINT_SETS, per_set, lambda n: held_self).values() for p in ps]
    rows = {split: [{"domain": p.source, "prompt_ids": prompt_ids(tokenizer, p)} for p in prompts]
            for split, prompts in (("train", train), ("eval", evaluation))}
    # The job drops and counts empty training prompts itself; the held-out ones are sampled here, so they must not be.
    rows["eval"] = [r for r in rows["eval"] if r["prompt_ids"]]
    recipe = default_recipe()
    new_tokens = 12 if quick() else recipe["teacher"]["max_new_tokens"]
    prompts = [r["prompt_ids"][-recipe["data"]["max_prompt_tokens"]:] for r in rows["eval"]]
    completions, _, _ = sample_completions(HFModel(model), prompts, new_tokens, SamplingParams(0.0), 0, None)
    for r, p, c in zip(rows["eval"], prompts, completions.tolist()):
        r.update(prompt_ids=p, completion_ids=c)
    (work / "prompts.txt.jsonl").write_text("".join(
        json.dumps({"split": split, "source": p.source, "raw": p.raw, "text": p.text}) + "\n"
        for split, prompts in (("train", train), ("eval", evaluation)) for p in prompts))
    paths = []
    for split, name in (("train", "prompts.jsonl"), ("eval", "heldout.jsonl")):
        path = work / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows[split]))
        paths.append(path)
    return paths[0], paths[1]


@dataclass(frozen=True)
class StageStarted:
    """A distillation stage begins; ``teacher_total``: training prompts its teacher samples first (0: reused)."""

    label: str
    teacher_total: int


@dataclass(frozen=True)
class StageProgress:
    """One event of the stage's distillation run (``specdiff.distill.events``)."""

    label: str
    event: Event


@dataclass(frozen=True)
class StageFinished:
    label: str
    summary: dict  # the stage's summary record (as its .summary.json file), with its wall time


@dataclass(frozen=True)
class BuildNote:
    """A line of the build's own (what it builds, where, the stage times at the end)."""

    text: str


BuildEvent = Union[StageStarted, StageProgress, StageFinished, BuildNote]
Progress = Callable[[BuildEvent], None]


def print_progress(event: BuildEvent) -> None:
    """The plain rendering: the build's notes and the stages' evaluations, one line each (the CLI draws a bar)."""
    if isinstance(event, BuildNote):
        print(event.text, flush=True)
    elif isinstance(event, StageProgress) and isinstance(event.event, Evaluated):
        print(f"  {event.label}: held-out expected streak {event.event.expected_streak:.3f} at step "
              f"{event.event.step}", flush=True)


@dataclass(frozen=True)
class Budget:
    """What a stage may spend: wall-clock seconds for the whole run and for its teacher (None: no limit), and the
    schedule's steps (None: the recipe's)."""

    train_s: float | None = None
    teacher_s: float | None = None
    steps: int | None = None
    warmup_ce_steps: int | None = None

    def sections(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        if self.train_s is not None:
            out.setdefault("train", {})["time_budget_s"] = round(self.train_s)
        if self.teacher_s is not None:
            out.setdefault("teacher", {})["time_budget_s"] = round(self.teacher_s)
        if self.steps is not None:
            out.setdefault("train", {})["steps"] = self.steps
        if self.warmup_ce_steps is not None:
            out.setdefault("objective", {})["warmup_ce_steps"] = self.warmup_ce_steps
        return out


def configure(recipe: str | dict, *updates: dict[str, dict]) -> DistillConfig:
    """A shipped recipe (or its tree) with ``updates`` (``{section: {key: value}}``, later ones win) merged in,
    validated: an unknown section or key is an error that names it."""
    tree = copy.deepcopy(read_recipe(recipe) if isinstance(recipe, str) else recipe)
    for update in updates:
        for section, values in update.items():
            tree.setdefault(section, {}).update(values)
    return parse_config(tree)


def run_stage(label: str, cfg: DistillConfig, log: Path, teacher_total: int = 0,
              progress: Progress = print_progress) -> dict:
    """One distillation run (``specdiff.distill.run``, in this process on a local Ray). Its events go to ``log`` as
    lines and to ``progress``; its summary record to ``<log>.summary.json`` beside the log, and is returned with
    the stage's wall time. A run that fails, or ends before its last step, raises a RuntimeError that names the
    stage and its log."""
    from specdiff.distill import run

    summary_path = log.with_name(log.stem + ".summary.json")
    summary_path.unlink(missing_ok=True)  # a summary left by an earlier attempt must not pass for this one's
    began = time.perf_counter()
    progress(StageStarted(label, teacher_total))
    lock = threading.Lock()  # the relay's thread and this one both write the log
    with log.open("a", buffering=1) as out:  # line-buffered: `tail -f` shows it as it comes
        out.write(f"# {label}: specdiff.distill.run(run.name={cfg.run.name}); Ray's own logs: "
                  "/tmp/ray/session_latest/logs\n")

        def on_event(event: Event) -> None:
            with lock:
                out.write(event.line() + "\n")
            progress(StageProgress(label, event))

        try:
            done = run(cfg, on_event=on_event)
        except Exception as e:  # any failure of the run: named with its stage, the cause chained
            with lock:
                out.write(f"# failed: {type(e).__name__}: {e}\n")
            raise RuntimeError(f"{label} failed ({type(e).__name__}: {e}); see the log {log}") from e
    record = done.record()
    write_summary(summary_path, record)
    if not done.finished:
        raise RuntimeError(f"{label} failed: it stopped at step {done.step} before its last; see the log {log}")
    record = {**record, "wall_s": round(time.perf_counter() - began, 1)}
    progress(StageFinished(label, record))
    return record


def teacher_progress(sampled: int, total: int, elapsed: float) -> str:
    """The teacher's progress line: trajectories so far, rate, and the time left when the total is known."""
    rate = sampled / elapsed if elapsed > 0 else 0.0
    line = f"teacher: {sampled}/{total or '?'} trajectories sampled, {rate * 60:.0f}/min"
    if total and rate > 0 and sampled < total:
        left = (total - sampled) / rate
        line += f", about {left // 60:.0f} min {left % 60:02.0f} s left"
    return line


def distill(label: str, recipe: str, work: Path, name: str, progress: Progress, *updates: dict[str, dict]) -> dict:
    """A stage of ``recipe`` with its paths set to the work folder, the teacher's trajectories reused once
    written, ``updates`` merged in (and SPECDIFF_BUILD_QUICK's last)."""
    trajectories, prompts = work / "trajectories", work / "prompts.jsonl"
    reuse = trajectories.is_dir()
    paths = {"run": {"name": name, "storage_path": str(work / "ray_results"), "output_dir": str(work / name)},
             "data": {"prompts": str(prompts), "heldout": str(work / "heldout.jsonl"),
                      **({"trajectories": str(trajectories)} if reuse else {})},
             **({} if reuse else {"teacher": {"save_to": str(trajectories)}})}
    cfg = configure(recipe, paths, *updates, *([QUICK] if quick() else []))
    total = 0 if reuse else sum(1 for line in prompts.open() if line.strip())
    return run_stage(label, cfg, work / f"{name}.log", teacher_total=total, progress=progress)


def publish(src: Path, dst: Path, record: dict) -> Path:
    """Copy a finished drafter into the drafters folder atomically (a crash never leaves half a drafter)."""
    with publishing(dst, replace=True) as partial:
        shutil.copytree(src, partial)
        (partial / "build.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    return dst


FIRST_RUN_S = 15 * 60  # a fresh `specdiff generate` (build, then its decode) should take at most this
DECODE_RESERVE_S = 75  # of it: distill's start-up before its clock runs, then generate's load and two decodes
# Of the distillation run's budget, the teacher's share (Ray's start included): a slower machine samples the
# prompts that fit (training_mix interleaves the sources) and keeps the rest of its time for training steps. On a
# 2-core AVX2-only EPYC (float32) the first run is short of steps, not of data: with the lean teacher, a 0.45 share
# sampled 576 trajectories and left 213 steps (held-out streak 0.320); 0.28 sampled 320 and left 308 (0.438).
TEACHER_SHARE = 0.28
DEFAULT_RECIPE = "smollm2-feature"  # in specdiff.recipes


def default_recipe() -> dict:
    """The default drafter's recipe, ``DEFAULT_RECIPE`` (an untrained drafter "with the defaults" takes its shape
    from it)."""
    return read_recipe(DEFAULT_RECIPE)


def untrained_drafter(verifier):
    """An untrained feature drafter of the default recipe's shape on ``verifier``: what a user has before any
    alignment (`specdiff generate --untrained`, the bench's `untrained` row)."""
    from specdiff.models.feature_drafter import build_feature_drafter

    return build_feature_drafter(verifier, num_layers=default_recipe()["drafter"]["num_layers"])


def sampled_trajectories(folder: Path) -> int:
    """Rows in a trajectories parquet folder (0 if there is none)."""
    import pyarrow.parquet as pq

    if not folder.is_dir():
        return 0
    return sum(pq.read_metadata(f).num_rows for f in folder.glob("*.parquet"))


def first_run_budget(budget_s: float | None, spent_s: float, recipe: dict) -> tuple[Budget, float]:
    """The feature stage's budget when the whole build (and a first decode) must fit in ``budget_s`` seconds, of
    which ``spent_s`` are gone, and the scale of the recipe it buys: a budget longer than the first run's buys
    proportionally more prompts and steps (the scaling table of docs/results.md); None: the whole recipe."""
    scale = max(1.0, budget_s / FIRST_RUN_S) if budget_s else 1.0
    train_s = teacher_s = None
    if budget_s and not quick():
        train_s = max(60.0, budget_s - spent_s - DECODE_RESERVE_S)
        teacher_s = TEACHER_SHARE * train_s
    steps = warmup = None
    if scale > 1:
        steps = round(recipe["train"]["steps"] * scale)
        warmup = round(recipe["objective"]["warmup_ce_steps"] * scale)
    return Budget(train_s=train_s, teacher_s=teacher_s, steps=steps, warmup_ce_steps=warmup), scale


def build_default(force: bool = False, budget_s: float | None = FIRST_RUN_S,
                  progress: Progress = print_progress) -> Path:
    """The default drafter folder, built first if missing (at most ``budget_s`` on any machine, the decode that
    follows included: a slower CPU trains fewer of the recipe's steps; None: all of them). ``progress`` receives
    the build's events (``BuildEvent``); the default prints the notes and evaluations."""
    target = default_drafter_dir()
    if target.is_dir() and not force:
        return target
    work = work_dir()
    if force:
        shutil.rmtree(work / "ray_results", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    note = lambda text: progress(BuildNote(text))  # noqa: E731
    note(f"building the default drafter for {DEFAULT_VERIFIER} (once; logs in {work})")
    recipe = default_recipe()
    scale = max(1.0, budget_s / FIRST_RUN_S) if budget_s else 1.0
    prompts, _ = write_prompts(work, scale)
    prompts_s = time.perf_counter() - began
    wanted = sum(1 for line in prompts.open() if line.strip())
    if force and budget_s is None and 0 < sampled_trajectories(work / "trajectories") < wanted:
        note("the saved teacher trajectories are a time-budgeted subset: sampling all prompts again")
        shutil.rmtree(work / "trajectories")
    budget, scale = first_run_budget(budget_s, time.perf_counter() - began, recipe)
    feature = distill("feature drafter: teacher + streak-distillation", DEFAULT_RECIPE, work, "feature", progress,
                      budget.sections())
    recipe_steps = round(recipe["train"]["steps"] * scale)
    sampled = sampled_trajectories(work / "trajectories")
    record = {"recipe": [f"specdiff/recipes/{DEFAULT_RECIPE}.yaml"], "stages": {"feature": feature},
              "prompts_s": round(prompts_s, 1), "wall_s": round(time.perf_counter() - began, 1),
              "trajectories": sampled, "prompts": wanted}
    publish(work / "feature", target, record)
    note(f"default drafter ready in {record['wall_s'] / 60:.1f} min: {target}\n"
         f"  stage times: prompts + held-out trajectories {prompts_s:.0f} s, teacher + training "
         f"{feature['wall_s']:.0f} s\n  held-out expected streak {feature.get('initial_expected_streak') or 0:.3f} "
         f"-> {feature.get('expected_streak') or 0:.3f}")
    timed = budget.train_s is not None
    if timed and sampled < wanted:
        note(f"  teacher: {sampled} of the {wanted} training prompts sampled within its share of the time budget")
    if timed and feature.get("step", recipe_steps) < recipe_steps:
        note(f"  trained {feature['step']} of the recipe's {recipe_steps} steps: what fitted the first run's "
             f"{budget_s / 60:.0f}-minute budget on this machine (the full recipe: specdiff build --force "
             "--budget-minutes 0)")
    return target


def build_standalone(force: bool = False, progress: Progress = print_progress) -> Path:
    """The paper's configuration: a standalone masked-diffusion drafter (verifier layers over the prefix), MDM
    pretraining then streak-distillation, on the default build's trajectories."""
    build_default(progress=progress)
    work, target = work_dir(), drafters_dir() / "smollm2-standalone"
    if target.is_dir() and not force:
        return target
    mdm = distill("standalone 1/2 masked-diffusion pretraining", "smollm2-mdm", work, "mdm", progress)
    streak = distill("standalone 2/2 streak-distillation", "smollm2-streak", work, "streak", progress,
                     {"drafter": {"path": str(work / "mdm")}})
    return publish(work / "streak", target, {"recipe": ["specdiff/recipes/smollm2-mdm.yaml",
                                                        "specdiff/recipes/smollm2-streak.yaml"],
                                             "stages": {"mdm": mdm, "streak": streak}})


def build_ablations(force: bool = False, progress: Progress = print_progress) -> dict[str, Path]:
    """The feature drafter trained with the other objectives (same data), the standalone drafter, its stage-1
    (unaligned), AR-distilled and naive-window siblings, and the HF-assisted AR drafter."""
    build_default(progress=progress)
    work, out = work_dir(), {}
    for kind in FEATURE_ABLATIONS:
        target = drafters_dir() / f"smollm2-feature-{kind}"
        if force or not target.is_dir():
            summary = distill(f"feature ablation {kind}", DEFAULT_RECIPE, work, f"feature-{kind}", progress,
                              {"objective": {"kind": kind, "warmup_ce_steps": 0}})
            publish(work / f"feature-{kind}", target, {"stage": summary, "objective": kind})
        out[f"feature-{kind}"] = target
    out["standalone"] = build_standalone(force, progress)
    out["mdm"] = drafters_dir() / "smollm2-mdm"
    if force or not out["mdm"].is_dir():  # "unaligned": masked-diffusion pretraining only, no distillation
        publish(work / "mdm", out["mdm"], {"stage": "mdm"})
    for kind in ABLATIONS:
        target = drafters_dir() / f"smollm2-{kind}"
        if force or not target.is_dir():
            summary = distill(f"ablation {kind}", "smollm2-streak", work, kind, progress,
                              {"drafter": {"path": str(work / "mdm")}, "objective": {"kind": kind}})
            publish(work / kind, target, {"stage": summary, "objective": kind})
        out[kind] = target
    target = drafters_dir() / "smollm2-ar"
    if force or not target.is_dir():
        build_ar_drafter(work, target, progress)
    out["ar"] = target
    return out


def build_ar_drafter(work: Path, target: Path, progress: Progress = print_progress) -> Path:
    """Same layers and teacher data as the diffusion drafter, next-token loss; as many steps as both stages."""
    import pyarrow.parquet as pq
    import torch

    from specdiff.distill.ar import ar_drafter_from_verifier, train_ar_drafter
    from specdiff.models.sources import load_causal_lm

    mdm, streak = read_recipe("smollm2-mdm"), read_recipe("smollm2-streak")
    layers = mdm["drafter"]["layers"]
    steps = 3 if quick() else mdm["train"]["steps"] + streak["train"]["steps"]
    batch = mdm["train"]["batch_size"] * mdm["objective"]["windows_per_sample"] // 4  # about as many tokens/step
    records = pq.read_table(work / "trajectories", columns=["prompt_ids", "completion_ids"]).to_pylist()
    verifier, tokenizer = load_causal_lm(DEFAULT_VERIFIER, torch.float32)
    model = ar_drafter_from_verifier(verifier, layers)
    began = time.perf_counter()
    label = "AR drafter (HF assisted generation)"
    progress(StageStarted(label, 0))
    last = [began]

    def on_step(step: int, loss: float) -> None:
        now = time.perf_counter()
        progress(StageProgress(label, TrainStep(step, steps, loss, mdm["train"]["lr"], now - last[0], 0.0)))
        last[0] = now

    train_ar_drafter(model, records, steps=steps, batch_size=max(1, batch), lr=mdm["train"]["lr"], progress=on_step)
    out = work / "ar"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"layers": layers, "steps": steps, "batch_size": batch, "wall_s": round(time.perf_counter() - began, 1)}
    progress(StageFinished(label, record))
    return publish(out, target, record)


def register_default(target: Path, progress: Progress = print_progress) -> str:
    """The embedded verifier and the drafter built in ``target`` as family ``smollm2`` in the registry (MLflow: the
    embedded sqlite store under $SPECDIFF_HOME unless MLFLOW_TRACKING_URI is set), evaluated on the build's held-out
    prompts and promoted to ``production`` if its τ is at least the current production pair's. Idempotent: the
    verifier (by digest) and a drafter (by its build record) are registered once. Returns the promotion verdict."""
    import hashlib

    from specdiff.lineage.evaluation import HeldoutSpec
    from specdiff.distill.teacher import verifier_record
    from specdiff.models.sources import resolve_model_path
    from specdiff.lifecycle.evaluate import Registry
    from specdiff.registry import DRAFTER_PREFIX, VERIFIER_PREFIX, config_digests, model_uri

    reg = Registry()

    def registered(name: str, tag: str, value: str):
        """The newest version of ``name`` tagged ``tag=value``, or None."""
        return next(reversed(reg.tagged(name, tag, value)), None)

    verifier_dir = resolve_model_path(DEFAULT_VERIFIER)
    digest = verifier_record(verifier_dir).digest
    verifier = registered(VERIFIER_PREFIX + FAMILY, "specdiff.digest", digest)
    if verifier is None:
        progress(BuildNote(f"registering the verifier {DEFAULT_VERIFIER} (copies its weights into the registry's "
                           "artifacts)"))
        verifier = reg.register_verifier(FAMILY, verifier_dir, source=DEFAULT_VERIFIER)
    build = "sha256:" + hashlib.sha256((target / "build.json").read_bytes()).hexdigest()
    cfg = configure(DEFAULT_RECIPE, {"data": {"heldout": str(work_dir() / "heldout.jsonl")}},
                    *([QUICK_EVAL] if quick() else []))
    spec = HeldoutSpec.from_config(cfg)
    drafter = registered(DRAFTER_PREFIX + FAMILY, "specdiff.build", build)
    if drafter is None:
        progress(BuildNote("registering the drafter: evaluating it on the build's held-out prompts"))
        config_digest, data_digest = config_digests(cfg.model_dump(mode="json"))
        drafter = reg.register_drafter(FAMILY, target, verifier, spec, config_digest=config_digest,
                                       data_digest=data_digest, tags={"specdiff.build": build})
    _, reason = reg.promote(FAMILY, drafter, spec)
    progress(BuildNote(f"{model_uri(verifier)} + {model_uri(drafter)} (tau "
                       f"{float(drafter.tags['specdiff.eval.tau']):.3f}): {reason}"))
    return reason


def write_summary(path: Path, record: dict) -> None:
    """Atomically: a reader never sees half a file."""
    publish_file.write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
