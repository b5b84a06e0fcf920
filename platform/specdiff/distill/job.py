"""The driver: teacher trajectories (Ray Data) streamed into a Ray Train ``TorchTrainer``; the trained drafter out.

Python::

    from specdiff.distill import load_config, run
    summary = run(load_config("tiny", ["train.steps=20"]))
    summary.output_dir  # a folder for specdiff.load_drafter, with the verifier record

Order of work: validate the config and its paths, hash the verifier, read, check and tokenize the prompt datasets
(``specdiff.distill.datasets``: a bad file fails here, before Ray starts), start/connect Ray, sample the held-out
trajectories (small, collected on the driver), then fit. Training trajectories are not materialised: the teacher's
``map_batches`` output streams into the workers' dataset shards (unless ``teacher.save_to`` asks for a parquet copy).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from specdiff.models.dtypes import dtype_name, resolve_dtype_with_reason
from specdiff.runtime.extras import require
from specdiff.models.feature_drafter import FEATURE_DRAFTER_META, default_tap_layers
from specdiff.runtime.memory import KEEP_FREED_ENV
from specdiff.models.sources import resolve_model_path
from specdiff.runtime.publish import publishing
from specdiff.runtime.ray_auth import use_private_token
from specdiff.distill.config import DistillConfig, parse_config
from specdiff.distill.datasets import prepare_data
from specdiff.distill.events import Emitter, Note, Pump, Sink
from specdiff.distill.feature import draft_vocabulary
from specdiff.distill.teacher_stage import read_records, teacher_dataset
from specdiff.lineage.verifier import VerifierRecord, verifier_record
from specdiff.distill.train import DRAFTER_DIR, STATE, train_loop
from specdiff.distill.windows import heldout_prefixes

LOCAL_FIELDS = ("run.storage_path", "run.output_dir", "verifier.path", "data.prompts", "data.heldout",
                "data.trajectories", "drafter.path", "teacher.save_to", "tracking.artifact_location")


@dataclass
class DistillSummary:
    step: int  # last optimizer step reached
    finished: bool  # step == train.steps, or fewer where train.time_budget_s ended it (False after stop_after)
    output_dir: str | None  # the drafter folder, when finished
    metrics: dict = field(default_factory=dict)  # rank 0's last reported metrics
    verifier: dict = field(default_factory=dict)
    checkpoint: str | None = None
    # per prompt dataset ("data.prompts", "data.heldout"; absent: trajectories used as is): rows, kept,
    # dropped_empty, truncated (cut to their last data.max_prompt_tokens), column, path (datasets.DataCounts)
    data: dict = field(default_factory=dict)

    def record(self) -> dict:
        """The summary a program reads (the CLI's ``--summary`` file, the build's ``<stage>.summary.json``): step,
        finished, output_dir, expected streaks, prompt counts."""
        return {"step": self.step, "finished": self.finished, "output_dir": self.output_dir,
                "expected_streak": self.metrics.get("eval/expected_streak"),
                "initial_expected_streak": self.metrics.get("eval/initial_expected_streak"),
                "data": self.data}  # per prompt dataset: rows, kept, dropped_empty, truncated


def absolutize(cfg: DistillConfig) -> DistillConfig:
    """Resolve relative local paths against the driver's working directory (workers run elsewhere)."""
    tree = cfg.model_dump(mode="json")
    tree["verifier"]["path"] = resolve_model_path(tree["verifier"]["path"])  # the embedded default's folder
    for dotted in LOCAL_FIELDS:
        section, key = dotted.split(".")
        value = tree[section][key]
        if value and "://" not in value:
            tree[section][key] = str(Path(value).expanduser().resolve())
    return parse_config(tree)


def init_ray(cfg: DistillConfig, *, log_to_driver: bool = True) -> None:
    """Connect to ``ray.address`` / RAY_ADDRESS (``ray job submit`` sets it) or start a new local Ray. The specdiff
    package travels to the workers as a ``py_modules`` runtime env, so the cluster needs no install of it (unless
    the Ray job running this driver ships it already: re-alignment submits it so). ``log_to_driver=False``: a new
    local Ray keeps its workers' output in its own logs (a caller that takes events renders progress itself)."""
    import ray

    import specdiff

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    runtime_env = {"env_vars": dict(KEEP_FREED_ENV)}  # teacher and training workers reuse freed blocks
    if not _job_ships_modules():  # two py_modules (the job's and ours) would be a runtime-env conflict
        runtime_env.update(py_modules=[str(Path(specdiff.__file__).parent)], excludes=["__pycache__"])
    if cfg.ray.address is None and "RAY_ADDRESS" not in os.environ:
        # "local": a new Ray for this job. A bare ray.init() would join whatever `ray start` cluster this machine
        # last started, which may be someone else's.
        runtime_env["worker_process_setup_hook"] = _train_cleaner_quiet_hook()
        use_private_token()  # token auth on, but no ~/.ray/auth_token left for a later `ray start` (ray_auth)
        ray.init(address="local", num_cpus=cfg.ray.num_cpus, runtime_env=runtime_env, include_dashboard=False,
                 log_to_driver=log_to_driver)
    else:
        ray.init(address=cfg.ray.address, runtime_env=runtime_env)


def _job_ships_modules() -> bool:
    """Whether this driver runs as a Ray job whose runtime env already carries ``py_modules``."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return False
    return bool((json.loads(raw).get("runtime_env") or {}).get("py_modules"))


def _train_cleaner_quiet_hook():
    """A worker set-up hook for a local Ray without its dashboard. There Ray's State API never answers, and Ray
    Train's placement-group cleaner (a detached actor that asks it every second whether the training controller is
    alive, to free the controller's resources if it dies) logs "Failed to query Ray Train Controller actor state"
    once a second for the whole job: hundreds of lines. The hook drops that one warning. (Nothing is lost: the
    local Ray ends with this job.) Defined inside a function so that Ray pickles it by value: a worker runs it
    without importing specdiff."""

    def hook() -> None:
        import logging

        class DropStateApiWarning(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                return not record.getMessage().startswith("Failed to query Ray Train Controller actor state")

        logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner").addFilter(
            DropStateApiWarning())

    return hook


def run(cfg: DistillConfig, on_event: Sink | None = None) -> DistillSummary:
    """The whole job; see the module's docstring. ``on_event``: a callable that receives the run's progress as
    ``specdiff.distill.events`` (the driver's and the workers'; called from a helper thread while Ray runs) instead
    of lines printed on this process's stdout. Without it the job prints them, as under ``ray job submit``."""
    require("train", "the distillation job (specdiff.distill.run)", "ray", "pyarrow", "peft")
    import ray.data

    began = time.time()  # train.time_budget_s counts from here (wall clock: the workers compare against it)
    cfg = absolutize(cfg)
    cfg.check_paths()
    record = verifier_record(cfg.verifier.path, cfg.verifier.name, cfg.verifier.version)
    say = Emitter() if on_event is None else Emitter(sink=on_event, echo=False)
    say(Note(f"[distill] verifier {record.name} {record.version} {record.digest[:19]}..."))
    dtype, why = resolve_dtype_with_reason(cfg.verifier.dtype)  # each teacher actor and worker resolves it again
    say(Note(f"[distill] verifier dtype {dtype_name(dtype)} ({why})"))
    data = prepare_data(cfg, log=lambda line: say(Note(line)))  # on the driver, before Ray: a bad dataset fails here
    init_ray(cfg, log_to_driver=on_event is None)
    # Ray Data's progress bars on a terminal; in a log (a pipe, `ray job submit`) they print a screenful per second.
    ray.data.DataContext.get_current().enable_progress_bars = sys.stdout.isatty() and on_event is None
    pump = Pump(on_event) if on_event is not None else None
    try:
        return _fit(cfg, record, data, began, say, Emitter(relay=pump.relay) if pump else Emitter())
    finally:
        if pump is not None:
            pump.close()


def _fit(cfg: DistillConfig, record: VerifierRecord, data, began: float, say: Emitter,
         workers: Emitter) -> DistillSummary:
    """From a started Ray on: held-out and training trajectories, then the Ray Train fit. ``say``: the driver's
    events; ``workers``: the emitter the teacher actors and the training loop report through."""
    import ray.train
    from ray.train.torch import TorchTrainer

    cfg = resolve_feature_taps(cfg)
    heldout_ds = read_records(data.heldout, cfg.data.read_cpus)
    if "completion_ids" in heldout_ds.schema().names:  # trajectories already (e.g. written by the teacher once)
        heldout = heldout_ds.take_all()
    else:
        heldout = teacher_dataset(heldout_ds, record, cfg, events=workers).take_all()
    prefixes = heldout_prefixes(heldout, cfg.eval.offsets)
    say(Note(f"[distill] teacher: {len(heldout)} held-out trajectories -> {len(prefixes)} eval windows"))
    train_ds = training_trajectories(cfg, record, began, prompts=data.prompts, say=say, workers=workers)
    vocabulary = feature_vocabulary(cfg, train_ds, prompts=data.prompts, say=say)

    t = cfg.train
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"config": cfg.model_dump(mode="json"), "verifier_record": record.to_dict(),
                           "heldout_prefixes": prefixes, "draft_vocabulary": vocabulary, "job_started": began,
                           "events": workers,
                           # Saved trajectories are shuffled every epoch; a streamed teacher's are not (a shuffle
                           # buffer would hold training back until the teacher had sampled the whole epoch).
                           "shuffle_buffer": cfg.data.shuffle_buffer if materialized(cfg) else 0,
                           "heldout_records": [{"prompt_ids": list(r["prompt_ids"]),
                                                "completion_ids": list(r["completion_ids"])} for r in heldout]},
        scaling_config=ray.train.ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu,
                                               resources_per_worker={"CPU": t.cpus_per_worker}),
        run_config=ray.train.RunConfig(
            name=cfg.run.name,
            storage_path=cfg.run.storage_path,
            failure_config=ray.train.FailureConfig(max_failures=t.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=t.keep_checkpoints),
        ),
        datasets={"train": train_ds},
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    return summarize(cfg, record, result, data=data.summary())


def materialized(cfg: DistillConfig) -> bool:
    """Whether the training trajectories are on disk (reused, or written by the teacher first), not streamed."""
    return bool(cfg.data.trajectories or cfg.teacher.save_to)


def training_trajectories(cfg: DistillConfig, record: VerifierRecord, began: float | None = None, *,
                          prompts: str | None = None, say: Emitter | None = None, workers: Emitter | None = None):
    """Streamed teacher output, or parquet trajectories (reused, or written first when teacher.save_to is set).
    ``began``: the job's start (``time.time()``), which ``teacher.time_budget_s`` counts from. ``prompts``: the
    prompt records to read (``run`` passes the normalized file of ``datasets.prepare_data``); default
    ``data.prompts``. ``say`` / ``workers``: where the driver's and the teacher actors' events go (default: printed)."""
    say = say or Emitter()
    taps = cfg.drafter.target_layer_ids if is_feature(cfg) else None
    if cfg.data.trajectories:
        say(Note(f"[distill] reusing trajectories from {cfg.data.trajectories}"))
        ds = read_records(cfg.data.trajectories, cfg.data.read_cpus)
        if taps and "features" not in ds.schema().names:
            raise ValueError(f"data.trajectories {cfg.data.trajectories!r} hold no verifier features; a feature "
                             "drafter needs trajectories written by its own teacher (teacher.save_to)")
        if taps:
            stored = json.loads(ds.select_columns(["feature_layers"]).take(1)[0]["feature_layers"])
            if stored != list(taps):
                raise ValueError(f"data.trajectories {cfg.data.trajectories!r} hold the states of verifier layers "
                                 f"{stored}, but drafter.target_layer_ids is {list(taps)}")
        return cached(ds, cfg.data.trajectories, say)
    budget = cfg.teacher.time_budget_s
    deadline = (began if began is not None else time.time()) + budget if budget else None
    ds = teacher_dataset(read_records(prompts or cfg.data.prompts, cfg.data.read_cpus), record, cfg, taps,
                         whole_batches=materialized(cfg), deadline=deadline, events=workers)
    if cfg.teacher.save_to:
        save_to = cfg.teacher.save_to
        if "://" in save_to:  # remote storage: written in place
            ds.write_parquet(save_to)
        else:  # written aside, then renamed: an interrupted teacher never leaves a partial folder to be reused
            with publishing(save_to.rstrip("/"), replace=True) as partial:
                ds.write_parquet(str(partial))
        say(Note(f"[distill] teacher trajectories written to {save_to}"))
        return cached(read_records(save_to, cfg.data.read_cpus), save_to, say)
    return ds


CACHE_LIMIT = 1 << 30  # trajectories up to 1 GiB on disk are held in the object store for the whole run


def cached(ds, path: str, say: Emitter | None = None):
    """``ds`` materialised once when its files at ``path`` are small: otherwise every epoch reads and decodes the
    parquet again, on the same CPUs as the training step (on 2 cores, a step at an epoch boundary took 2-7 s
    instead of 1.2 s)."""
    if "://" in path:
        return ds
    p = Path(path)
    size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
    if size > CACHE_LIMIT:
        return ds
    (say or Emitter())(Note(f"[distill] trajectories held in the object store for the run ({size / 2**20:.0f} MiB)"))
    return ds.materialize()


def is_feature(cfg: DistillConfig) -> bool:
    """A drafter conditioned on the verifier's hidden states: a new one, or a pretrained feature drafter folder."""
    d = cfg.drafter
    return d.init == "feature" or (d.init == "pretrained" and (Path(d.path) / FEATURE_DRAFTER_META).is_file())


def resolve_feature_taps(cfg: DistillConfig) -> DistillConfig:
    """Fill ``drafter.target_layer_ids`` for a feature drafter (the pretrained drafter's, else the default for the
    verifier's depth), so that the teacher, the training loop and the output agree on them."""
    from transformers import AutoConfig

    if not is_feature(cfg):
        return cfg
    tree = cfg.model_dump(mode="json")
    d = tree["drafter"]
    if cfg.drafter.init == "pretrained":
        meta = json.loads((Path(cfg.drafter.path) / FEATURE_DRAFTER_META).read_text())
        d["target_layer_ids"] = list(meta["config"]["target_layer_ids"])
        d["draft_vocab_size"] = meta["config"].get("draft_vocab_size")
    elif d["target_layer_ids"] is None:
        d["target_layer_ids"] = default_tap_layers(int(AutoConfig.from_pretrained(cfg.verifier.path).num_hidden_layers))
    return parse_config(tree)


def feature_vocabulary(cfg: DistillConfig, train_ds, *, prompts: str | None = None,
                       say: Emitter | None = None) -> list[int] | None:
    """The draft vocabulary of a new feature drafter: the most frequent ids of the training trajectories (prompt
    and completion tokens), counted once on the driver before training. ``prompts``: as ``training_trajectories``."""
    if cfg.drafter.init != "feature" or cfg.drafter.draft_vocab_size is None:
        return None
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(cfg.verifier.path).vocab_size
    if cfg.drafter.draft_vocab_size >= vocab:
        raise ValueError(f"drafter.draft_vocab_size must be < the verifier's vocabulary ({vocab}), got "
                         f"{cfg.drafter.draft_vocab_size}; use null for the whole vocabulary")
    if materialized(cfg):  # on disk: count the trajectories themselves
        rows = train_ds.select_columns(["prompt_ids", "completion_ids"]).take_all()
        token_lists = [list(r["prompt_ids"]) + list(r["completion_ids"]) for r in rows]
    else:  # streamed: counting completions would run the teacher twice, so count the prompts
        rows = read_records(prompts or cfg.data.prompts, cfg.data.read_cpus).take_all()
        if rows and "prompt_ids" not in rows[0]:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.verifier.path)
            token_lists = [tokenizer(r["prompt"])["input_ids"] for r in rows]
        else:
            token_lists = [list(r["prompt_ids"]) for r in rows]
    ids = draft_vocabulary(token_lists, vocab, cfg.drafter.draft_vocab_size)
    (say or Emitter())(Note(f"[distill] draft vocabulary: the {len(ids)} most frequent of {vocab} tokens in "
                            f"{len(rows)} records"))
    return ids.tolist()


def summarize(cfg: DistillConfig, record: VerifierRecord, result, data: dict | None = None) -> DistillSummary:
    metrics = dict(result.metrics or {})
    step = int(metrics.get("step", 0))
    summary = DistillSummary(step=step, finished=step == metrics.get("planned_steps", cfg.train.steps),
                             output_dir=None, metrics=metrics, verifier=record.to_dict(), data=dict(data or {}))
    if result.checkpoint is None:
        return summary
    with result.checkpoint.as_directory() as d:
        summary.checkpoint = result.checkpoint.path
        state = json.loads((Path(d) / STATE).read_text())
        summary.step = state["step"]
        summary.finished = summary.step == state.get("planned_steps", cfg.train.steps)  # a budget may end it early
        src = Path(d) / DRAFTER_DIR
        if summary.finished and src.is_dir():
            out = Path(cfg.run.output_dir)
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(src, out)
            summary.output_dir = str(out)
    return summary
