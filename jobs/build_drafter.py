"""Build the embedded default drafter for SmolLM2-135M-Instruct with the project's own pipeline.

    python jobs/build_drafter.py               # the default drafter -> $SPECDIFF_HOME/drafters/default
    python jobs/build_drafter.py --ablations   # + the bench's ablation drafters (objectives, standalone, AR)
    python jobs/build_drafter.py --force       # rebuild even if a drafter is there
    python jobs/build_drafter.py --budget-minutes 0   # the whole recipe, however long it takes (default: 15 min)
    python jobs/build_drafter.py --register    # + register the pair in the MLflow registry, promote it to production

Recipe (configs in jobs/configs/, each stage one `jobs/distill.py` run on a local Ray):
  1. teacher: the frozen verifier decodes the training prompts greedily (specdiff.prompts: code, math, chat train
     splits) and keeps its tapped hidden states from the same passes; written once to parquet and reused by every
     later stage;
  2. smollm2-feature.yaml: a drafter conditioned on the verifier's hidden states (DFlash-style), streak-distilled
     (SpecDiff-2 Eq. 6) after a decayed-CE warm-up.
With --ablations, the same feature drafter is trained on the same data with objective.kind=decayed_ce (DFlash) and
ar_distill; the standalone masked-diffusion drafter (the paper's configuration: verifier layers over the prefix,
smollm2-mdm.yaml then smollm2-streak.yaml) is built with its own ablations, and an AR drafter of the same layers
for HF assisted generation.
Work files and logs live in $SPECDIFF_HOME/build/smollm2; an interrupted build resumes from the last checkpoint.
SPECDIFF_BUILD_QUICK=1 shrinks every stage to a few steps on a few prompts (CI smoke tests of this pipeline; the
drafter it makes is not useful).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from specdiff.models.sources import DEFAULT_VERIFIER, state_dir
from specdiff.runtime.publish import publishing

JOBS = Path(__file__).resolve().parent
CONFIGS = JOBS / "configs"
ABLATIONS = ("ar_distill", "naive")  # of the standalone drafter
FEATURE_ABLATIONS = ("decayed_ce", "ar_distill")  # of the feature drafter (same data, same drafter)
STEP = re.compile(r"\[distill\] step (\d+)/(\d+) loss (-?[0-9.]+)")
EVAL = re.compile(r"\[distill\] eval step (\d+): expected streak ([0-9.]+)")
TEACHER = re.compile(r"\[teacher\] (\d+) trajectories sampled")
TEACHER_SKIP = re.compile(r"\[teacher\] time budget spent")
FAMILY = "smollm2"  # the default pair's family in the registry: specdiff-verifier-smollm2, specdiff-drafter-smollm2
QUICK_EVAL = ["eval.offsets=[0]", "teacher.max_new_tokens=12"]  # SPECDIFF_BUILD_QUICK's held-out test
QUICK_SET = ["train.steps=3", "train.batch_size=2", "eval.every=3", "train.checkpoint_every=3",
             "data.max_prompt_tokens=48", *QUICK_EVAL]


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
    from specdiff.distill.teacher import sample_completions
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


def run_stage(label: str, config: Path, overrides: list[str], log: Path, teacher_total: int = 0) -> dict:
    """One ``jobs/distill.py`` run in a subprocess; its log goes to ``log``, its steps to a progress bar (and, when
    the stage runs the teacher first, its trajectories out of ``teacher_total``)."""
    from tqdm import tqdm

    summary_path = log.with_name(log.stem + ".summary.json")  # the stage's result: read from here, not the log
    summary_path.unlink(missing_ok=True)  # a summary left by an earlier attempt must not pass for this one's
    cmd = [sys.executable, str(JOBS / "distill.py"), "--config", str(config), "--summary", str(summary_path)]
    for item in overrides:
        cmd += ["--set", item]
    # RAY_DEDUP_LOGS=0: Ray folds log lines that differ only in numbers, which would hide the teacher's progress.
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "RAY_DEDUP_LOGS": "0"}
    sampled, teacher_began, training = 0, 0.0, False
    began = time.perf_counter()
    seen = set()  # Ray may echo a worker's line twice
    keep = LogFilter()
    with log.open("a", buffering=1) as out, tqdm(  # line-buffered: `tail -f` shows it as it comes
            total=None, desc=label, unit="step", dynamic_ncols=True) as bar:
        bar.set_postfix_str("starting Ray, teacher / held-out trajectories")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out.write(f"# {' '.join(cmd)}\n# progress bars and repeated lines are left out here; Ray's own logs: "
                  "/tmp/ray/session_latest/logs\n")
        for line in proc.stdout:
            if (kept := keep(line)) is not None:
                out.write(kept)
            if m := STEP.search(line):
                step, total = int(m.group(1)), int(m.group(2))
                if not training:  # the first step line: from here on, rate and ETA count training steps only
                    training = True  # (not Ray's start-up and the teacher, which ran on the same bar)
                    bar.reset(total=total)
                    bar.initial = step
                bar.total = total
                bar.n = step
                bar.set_postfix_str(f"loss {float(m.group(3)):.3f}")
                bar.refresh()
            elif TEACHER_SKIP.search(line):
                bar.set_postfix_str(f"teacher: its share of the time budget spent, {sampled} trajectories sampled")
            elif m := TEACHER.search(line):
                sampled += int(m.group(1))
                teacher_began = teacher_began or began  # Ray's start-up counts: it is part of the wait
                bar.set_postfix_str(teacher_progress(sampled, teacher_total, time.perf_counter() - teacher_began))
            elif (m := EVAL.search(line)) and m.group(0) not in seen:
                seen.add(m.group(0))
                bar.write(f"  {label}: held-out expected streak {float(m.group(2)):.3f} at step {m.group(1)}")
        code = proc.wait()
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if code != 0 or not summary.get("finished"):
        raise RuntimeError(f"{label} failed (exit code {code}); see the log {log}")
    summary["wall_s"] = round(time.perf_counter() - began, 1)
    return summary


class LogFilter:
    """Which lines of a stage's output go to its log: the job's own lines, warnings and errors — not Ray Data's
    progress bars (hundreds of redraws per dataset), blank or cursor-control lines, or a line already written
    (Ray repeats some warnings every second)."""

    ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    PREFIX = re.compile(r"^\((?:[\w.:]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s*")  # "(TeacherSampler pid=123) "
    PROGRESS = re.compile(r"logging_progress\.py|Queued blocks:|Running Dataset:|\d+%\|")

    def __init__(self):
        self.seen: set[str] = set()

    def __call__(self, line: str) -> str | None:
        """The line to write (cursor controls removed), or None to leave it out."""
        clean = self.ANSI.sub("", line).strip()
        text = self.PREFIX.sub("", clean)
        if not text or self.PROGRESS.search(text):
            return None
        key = re.sub(r"^\[?\d{4}-\d\d-\d\d[ T][\d:,.]+\s*", "", text)  # the same message at another time
        if key in self.seen:
            return None
        self.seen.add(key)
        return clean + "\n"


def teacher_progress(sampled: int, total: int, elapsed: float) -> str:
    """The teacher's progress line: trajectories so far, rate, and the time left when the total is known."""
    rate = sampled / elapsed if elapsed > 0 else 0.0
    line = f"teacher: {sampled}/{total or '?'} trajectories sampled, {rate * 60:.0f}/min"
    if total and rate > 0 and sampled < total:
        left = (total - sampled) / rate
        line += f", about {left // 60:.0f} min {left % 60:02.0f} s left"
    return line


def distill(label: str, config: str, work: Path, name: str, extra: list[str]) -> dict:
    trajectories, prompts = work / "trajectories", work / "prompts.jsonl"
    reuse = trajectories.is_dir()
    data = [f"data.prompts={prompts}"] + ([f"data.trajectories={trajectories}"] if reuse
                                          else [f"teacher.save_to={trajectories}"])
    overrides = [f"data.heldout={work / 'heldout.jsonl'}", f"run.name={name}",
                 f"run.storage_path={work / 'ray_results'}", f"run.output_dir={work / name}", *data, *extra,
                 *(QUICK_SET if quick() else [])]
    total = 0 if reuse else sum(1 for line in prompts.open() if line.strip())
    return run_stage(label, CONFIGS / config, overrides, work / f"{name}.log", teacher_total=total)


def publish(src: Path, dst: Path, record: dict) -> Path:
    """Copy a finished drafter into the drafters folder atomically (a crash never leaves half a drafter)."""
    with publishing(dst, replace=True) as partial:
        shutil.copytree(src, partial)
        (partial / "build.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    return dst


FIRST_RUN_S = 15 * 60  # a fresh `python jobs/generate.py` (build, then its decode) should take at most this
DECODE_RESERVE_S = 75  # of it: distill's start-up before its clock runs, then generate.py's load and two decodes
# Of the distillation run's budget, the teacher's share (Ray's start included): a slower machine samples the
# prompts that fit (training_mix interleaves the sources) and keeps the rest of its time for training steps. 2-core
# figures: a Xeon with AMX samples all 900 in ~2.5 min (of ~5.8 min allowed); an AVX2-only EPYC sampled 93-110/min.
TEACHER_SHARE = 0.45
DEFAULT_RECIPE = "smollm2-feature.yaml"  # in jobs/configs/


def default_recipe() -> dict:
    """The default drafter's recipe, ``DEFAULT_RECIPE`` in jobs/configs/ (an untrained drafter "with the defaults"
    takes its shape from it)."""
    return yaml.safe_load((CONFIGS / DEFAULT_RECIPE).read_text())


def untrained_drafter(verifier):
    """An untrained feature drafter of the default recipe's shape on ``verifier``: what a user has before any
    alignment (`jobs/generate.py --untrained`, the bench's `untrained` row)."""
    from specdiff.models.feature_drafter import build_feature_drafter

    return build_feature_drafter(verifier, num_layers=default_recipe()["drafter"]["num_layers"])


def sampled_trajectories(folder: Path) -> int:
    """Rows in a trajectories parquet folder (0 if there is none)."""
    import pyarrow.parquet as pq

    if not folder.is_dir():
        return 0
    return sum(pq.read_metadata(f).num_rows for f in folder.glob("*.parquet"))


def build_default(force: bool = False, budget_s: float | None = FIRST_RUN_S) -> Path:
    """The default drafter folder, built first if missing (at most ``budget_s`` on any machine, the decode that
    follows included: a slower CPU trains fewer of the recipe's steps; None: all of them)."""
    target = default_drafter_dir()
    if target.is_dir() and not force:
        return target
    work = work_dir()
    if force:
        shutil.rmtree(work / "ray_results", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    print(f"building the default drafter for {DEFAULT_VERIFIER} (once; logs in {work})", flush=True)
    # A budget longer than the first run's buys proportionally more prompts and steps (the scaling table of
    # docs/results.md); the recipe itself is the first run's.
    scale = max(1.0, budget_s / FIRST_RUN_S) if budget_s else 1.0
    prompts, _ = write_prompts(work, scale)
    prompts_s = time.perf_counter() - began
    wanted = sum(1 for line in prompts.open() if line.strip())
    if force and budget_s is None and 0 < sampled_trajectories(work / "trajectories") < wanted:
        print("the saved teacher trajectories are a time-budgeted subset: sampling all prompts again", flush=True)
        shutil.rmtree(work / "trajectories")
    budget = []
    if budget_s and not quick():
        left = max(60.0, budget_s - (time.perf_counter() - began) - DECODE_RESERVE_S)
        budget = [f"train.time_budget_s={left:.0f}", f"teacher.time_budget_s={TEACHER_SHARE * left:.0f}"]
    if scale > 1:
        recipe = default_recipe()
        budget += [f"train.steps={round(recipe['train']['steps'] * scale)}",
                   f"objective.warmup_ce_steps={round(recipe['objective']['warmup_ce_steps'] * scale)}"]
    feature = distill("feature drafter: teacher + streak-distillation", DEFAULT_RECIPE, work, "feature",
                      budget)
    recipe_steps = round(default_recipe()["train"]["steps"] * scale)
    sampled = sampled_trajectories(work / "trajectories")
    record = {"recipe": [f"jobs/configs/{DEFAULT_RECIPE}"], "stages": {"feature": feature},
              "prompts_s": round(prompts_s, 1), "wall_s": round(time.perf_counter() - began, 1),
              "trajectories": sampled, "prompts": wanted}
    publish(work / "feature", target, record)
    print(f"default drafter ready in {record['wall_s'] / 60:.1f} min: {target}\n"
          f"  stage times: prompts + held-out trajectories {prompts_s:.0f} s, teacher + training "
          f"{feature['wall_s']:.0f} s\n  held-out expected streak {feature.get('initial_expected_streak') or 0:.3f} "
          f"-> {feature.get('expected_streak') or 0:.3f}", flush=True)
    if budget and sampled < wanted:
        print(f"  teacher: {sampled} of the {wanted} training prompts sampled within its share of the time budget",
              flush=True)
    if budget and feature.get("step", recipe_steps) < recipe_steps:
        print(f"  trained {feature['step']} of the recipe's {recipe_steps} steps: what fitted the first run's "
              f"{budget_s / 60:.0f}-minute budget on this machine (the full recipe: python jobs/build_drafter.py "
              "--force --budget-minutes 0)", flush=True)
    return target


def build_standalone(force: bool = False) -> Path:
    """The paper's configuration: a standalone masked-diffusion drafter (verifier layers over the prefix), MDM
    pretraining then streak-distillation, on the default build's trajectories."""
    build_default()
    work, target = work_dir(), drafters_dir() / "smollm2-standalone"
    if target.is_dir() and not force:
        return target
    mdm = distill("standalone 1/2 masked-diffusion pretraining", "smollm2-mdm.yaml", work, "mdm", [])
    streak = distill("standalone 2/2 streak-distillation", "smollm2-streak.yaml", work, "streak",
                     [f"drafter.path={work / 'mdm'}"])
    return publish(work / "streak", target, {"recipe": ["jobs/configs/smollm2-mdm.yaml",
                                                        "jobs/configs/smollm2-streak.yaml"],
                                             "stages": {"mdm": mdm, "streak": streak}})


def build_ablations(force: bool = False) -> dict[str, Path]:
    """The feature drafter trained with the other objectives (same data), the standalone drafter, its stage-1
    (unaligned), AR-distilled and naive-window siblings, and the HF-assisted AR drafter."""
    build_default()
    work, out = work_dir(), {}
    for kind in FEATURE_ABLATIONS:
        target = drafters_dir() / f"smollm2-feature-{kind}"
        if force or not target.is_dir():
            summary = distill(f"feature ablation {kind}", DEFAULT_RECIPE, work, f"feature-{kind}",
                              [f"objective.kind={kind}", "objective.warmup_ce_steps=0"])
            publish(work / f"feature-{kind}", target, {"stage": summary, "objective": kind})
        out[f"feature-{kind}"] = target
    out["standalone"] = build_standalone(force)
    out["mdm"] = drafters_dir() / "smollm2-mdm"
    if force or not out["mdm"].is_dir():  # "unaligned": masked-diffusion pretraining only, no distillation
        publish(work / "mdm", out["mdm"], {"stage": "mdm"})
    for kind in ABLATIONS:
        target = drafters_dir() / f"smollm2-{kind}"
        if force or not target.is_dir():
            summary = distill(f"ablation {kind}", "smollm2-streak.yaml", work, kind,
                              [f"drafter.path={work / 'mdm'}", f"objective.kind={kind}"])
            publish(work / kind, target, {"stage": summary, "objective": kind})
        out[kind] = target
    target = drafters_dir() / "smollm2-ar"
    if force or not target.is_dir():
        build_ar_drafter(work, target)
    out["ar"] = target
    return out


def build_ar_drafter(work: Path, target: Path) -> Path:
    """Same layers and teacher data as the diffusion drafter, next-token loss; as many steps as both stages."""
    import pyarrow.parquet as pq
    import torch
    from tqdm import tqdm

    from specdiff.distill.ar import ar_drafter_from_verifier, train_ar_drafter
    from specdiff.models.sources import load_causal_lm

    mdm, streak = (yaml.safe_load((CONFIGS / f).read_text()) for f in ("smollm2-mdm.yaml", "smollm2-streak.yaml"))
    layers = mdm["drafter"]["layers"]
    steps = 3 if quick() else mdm["train"]["steps"] + streak["train"]["steps"]
    batch = mdm["train"]["batch_size"] * mdm["objective"]["windows_per_sample"] // 4  # about as many tokens/step
    records = pq.read_table(work / "trajectories", columns=["prompt_ids", "completion_ids"]).to_pylist()
    verifier, tokenizer = load_causal_lm(DEFAULT_VERIFIER, torch.float32)
    model = ar_drafter_from_verifier(verifier, layers)
    began = time.perf_counter()
    with tqdm(total=steps, desc="AR drafter (HF assisted generation)", unit="step") as bar:
        def progress(step: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix_str(f"loss {loss:.3f}")

        train_ar_drafter(model, records, steps=steps, batch_size=max(1, batch), lr=mdm["train"]["lr"],
                         progress=progress)
    out = work / "ar"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"layers": layers, "steps": steps, "batch_size": batch, "wall_s": round(time.perf_counter() - began, 1)}
    return publish(out, target, record)


def register_default(target: Path) -> str:
    """The embedded verifier and the drafter built in ``target`` as family ``smollm2`` in the registry (MLflow: the
    embedded sqlite store under $SPECDIFF_HOME unless MLFLOW_TRACKING_URI is set), evaluated on the build's held-out
    prompts and promoted to ``production`` if its τ is at least the current production pair's. Idempotent: the
    verifier (by digest) and a drafter (by its build record) are registered once. Returns the promotion verdict."""
    import hashlib

    from specdiff.distill import load_config
    from specdiff.distill.evaluate import HeldoutSpec
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
        print(f"registering the verifier {DEFAULT_VERIFIER} (copies its weights into the registry's artifacts)",
              flush=True)
        verifier = reg.register_verifier(FAMILY, verifier_dir, source=DEFAULT_VERIFIER)
    build = "sha256:" + hashlib.sha256((target / "build.json").read_bytes()).hexdigest()
    cfg = load_config(CONFIGS / DEFAULT_RECIPE, [f"data.heldout={work_dir() / 'heldout.jsonl'}",
                                                 *(QUICK_EVAL if quick() else [])], check_paths=False)
    spec = HeldoutSpec.from_config(cfg)
    drafter = registered(DRAFTER_PREFIX + FAMILY, "specdiff.build", build)
    if drafter is None:
        print("registering the drafter: evaluating it on the build's held-out prompts", flush=True)
        config_digest, data_digest = config_digests(cfg.model_dump(mode="json"))
        drafter = reg.register_drafter(FAMILY, target, verifier, spec, config_digest=config_digest,
                                       data_digest=data_digest, tags={"specdiff.build": build})
    _, reason = reg.promote(FAMILY, drafter, spec)
    print(f"{model_uri(verifier)} + {model_uri(drafter)} (tau {float(drafter.tags['specdiff.eval.tau']):.3f}): "
          f"{reason}", flush=True)
    return reason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ablations", action="store_true", help="also build the bench's ablation drafters")
    parser.add_argument("--force", action="store_true", help="rebuild what exists")
    parser.add_argument("--budget-minutes", type=float, default=FIRST_RUN_S / 60,
                        help="wall-clock budget of the default drafter's build plus a first decode; a slower machine "
                        "trains fewer steps to fit it (0: the whole recipe, however long it takes; default "
                        "%(default).0f)")
    parser.add_argument("--register", action="store_true",
                        help=f"register the verifier and the default drafter in the registry as family {FAMILY!r} and "
                        "promote the pair if it is at least as good as production (docs/registry.md)")
    args = parser.parse_args(argv)
    try:
        target = build_default(force=args.force, budget_s=args.budget_minutes * 60 or None)
        if args.register:
            register_default(target)
        if args.ablations:
            for kind, path in build_ablations(force=args.force).items():
                print(f"{kind}: {path}")
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
