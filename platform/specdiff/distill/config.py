"""The distillation job's typed config: a YAML file plus ``--set section.key=value`` overrides.

Pydantic lives here, at the edge; unknown keys are errors that name the key, and every check that can fail runs
before Ray starts. Example (the ``tiny`` recipe, ``specdiff/recipes/tiny.yaml``)::

    verifier: {path: artifacts/tiny/verifier, name: tiny-llama, version: "1"}
    data: {prompts: artifacts/tiny/prompts.jsonl, heldout: artifacts/tiny/heldout.jsonl}
    objective: {kind: streak, gamma: 8}
    train: {steps: 40, num_workers: 2, cpus_per_worker: 0.5}

Python::

    cfg = load_config("tiny", ["train.steps=10"])  # a shipped recipe's name, or a YAML file
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specdiff.core.config import SamplingParams
from specdiff.models.sources import DEFAULT_VERIFIER


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _inside(path: str, folder: str) -> bool:
    """Whether local ``path`` is ``folder`` or lies under it (URIs: never)."""
    if "://" in path or "://" in folder:
        return False
    return Path(path).expanduser().resolve().is_relative_to(Path(folder).expanduser().resolve())


class RunSection(Section):
    name: str = Field("distill", description="Run name: checkpoints live in <storage_path>/<name>; rerunning the "
                      "same name resumes from its latest checkpoint.")
    storage_path: str = Field("artifacts/ray_results", description="Where Ray Train persists checkpoints (an "
                              "absolute path or URI on a multi-node cluster).")
    output_dir: str = Field("artifacts/drafter", description="The trained drafter directory (load_drafter).")
    seed: int = Field(0, description="Seeds model init, window offsets, masking and eval sampling.")


class RaySection(Section):
    address: str | None = Field(None, description="Ray cluster address; None: RAY_ADDRESS (set by `ray job "
                                "submit`) or a new local Ray.")
    num_cpus: float | None = Field(None, description="Logical CPUs of a new local Ray (ignored when connecting).")


class VerifierSection(Section):
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)  # version=2 from --set

    path: str = Field(..., description="Hugging Face model folder of the frozen verifier (teacher), or "
                      "`smollm2-135m-instruct` (the embedded default, converted once into the state directory).")
    name: str | None = Field(None, description="Verifier name recorded with the drafter; default: folder name.")
    version: str = Field("unversioned", description="Verifier version recorded with the drafter.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Verifier dtype (teacher and eval); auto: bfloat16 on a GPU or a CPU with native bf16, "
        "else float32 (specdiff.models.dtypes).")


class DataSection(Section):
    prompts: str | None = Field(None, description="Training prompts: .jsonl, .json (a list of objects) or parquet "
                                "(a file or a folder) with exactly one of the columns `prompt` (raw text, tokenized "
                                "with the verifier's tokenizer, no chat template), `messages` (OpenAI "
                                "role/content or ShareGPT from/value turns, the verifier's chat template applied; a "
                                "last assistant turn is left out) or `prompt_ids` (list of ints); other columns are "
                                "kept. Read, checked and tokenized on the driver before Ray starts "
                                "(specdiff.distill.datasets): a bad file or row is an error naming it; empty prompts "
                                "are dropped, and counted in the summary with the cut ones. Not read when "
                                "data.trajectories is set.")
    heldout: str = Field(..., description="Held-out prompts for evaluation, same format; a file that already holds "
                         "trajectories (a `completion_ids` column) is used as is, without running the teacher.")
    trajectories: str | None = Field(None, description="Reuse teacher trajectories written earlier "
                                     "(teacher.save_to); the teacher is then not run for training data.")
    max_prompt_tokens: int = Field(256, ge=1, description="Keep the last N tokens of each prompt (data.prompts "
                                   "and data.heldout; the summary counts the prompts cut).")
    read_cpus: float = Field(0.25, gt=0, description="Logical CPUs per file-read task (Ray Data's default of 1 "
                             "starves the teacher next to 2 train workers on a 2-core machine).")
    shuffle_buffer: int = Field(1024, ge=0, description="Saved trajectories (data.trajectories or "
                                "teacher.save_to): each train worker shuffles its batches from this many, reshuffled "
                                "every epoch (Ray Data's local shuffle; 0: file order). Prompt files list one domain "
                                "after another: without it a batch holds one domain. A streamed teacher's "
                                "trajectories come in prompt-file order (shuffle the file).")


class TeacherSection(Section):
    temperature: float = Field(0.5, ge=0, description="Teacher sampling temperature.")
    top_p: float = Field(0.95, gt=0, le=1, description="Teacher top-p.")
    top_k: int = Field(0, ge=0, description="Teacher top-k (0: off).")
    max_new_tokens: int = Field(32, ge=1, description="Completion length (fixed; no early stop, so every worker "
                                "gets the same number of windows).")
    logprobs_k: int = Field(8, ge=0, description="Top-k teacher log-probs stored per completion position.")
    batch_size: int = Field(8, ge=1, description="Prompts per teacher batch.")
    num_actors: int = Field(1, ge=1, description="Actor pool size (each holds a copy of the verifier).")
    cpus_per_actor: float = Field(0.5, gt=0, description="Logical CPUs per teacher actor.")
    gpus_per_actor: float = Field(0, ge=0, description="GPUs per teacher actor.")
    engine: Literal["auto", "hf", "vllm"] = Field("auto", description="What samples: hf (batched torch "
                                                  "decoding: the lean Llama forward where it is exact, else "
                                                  "transformers), vllm (a vLLM engine in each actor; the vLLM extra), "
                                                  "auto: vllm where it is installed and the actors have GPUs, else "
                                                  "hf (faster on a 2-core CPU: docs/distill.md).")
    save_to: str | None = Field(None, description="Also write the trajectories to this parquet folder (then "
                                "training reads them back instead of streaming).")
    time_budget_s: float | None = Field(None, gt=0, description="Sample no more once this many seconds have passed "
                                        "since the job started: the prompts not reached by then are skipped (so "
                                        "list them in priority order), after at least one batch per actor. "
                                        "jobs/build_drafter.py sets it from its time budget. None: every prompt.")

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


class DrafterSection(Section):
    init: Literal["from_verifier", "small", "pretrained", "feature"] = Field("from_verifier", description=
        "from_verifier: inherit the verifier's embeddings/head and `num_layers` layers; small: random "
        "Llama-shaped; pretrained: load_drafter(path) (a feature drafter folder too); feature: a new drafter "
        "conditioned on the verifier's hidden states (DFlash-style, `num_layers` draft layers, no embeddings or "
        "head of its own).")
    target_layer_ids: list[int] | None = Field(None, description="feature: verifier layers whose outputs are the "
                                               "context (default: three evenly spaced from layer 1 to N-3).")
    draft_vocab_size: int | None = Field(8192, ge=2, description="feature: the drafter scores only the N most "
                                         "frequent tokens of the training data (None: the whole vocabulary); "
                                         "others are never drafted, verification is unchanged.")
    path: str | None = Field(None, description="Drafter folder for init=pretrained.")
    num_layers: int = Field(2, ge=1, description="Layers (from_verifier, small).")
    layers: list[int] | None = Field(None, description="from_verifier: which verifier layers to inherit (default: "
                                     "`num_layers` evenly spaced).")
    causal_prefix: bool | None = Field(None, description="Block attention: the prefix attends causally (as in "
                                       "the verifier, and cacheable across rounds), the masked window "
                                       "bidirectionally. None: the pretrained drafter's own setting, else false.")
    hidden_size: int = Field(256, ge=8, description="Hidden size (small).")
    num_heads: int = Field(4, ge=1, description="Attention heads (small).")
    max_context: int | None = Field(None, ge=2, description="Drafter context bound (last N tokens).")


class ObjectiveSection(Section):
    kind: Literal["streak", "ar_distill", "naive", "mdm", "decayed_ce"] = Field("streak", description="streak: "
        "Eq. 6; ar_distill: divergence at the first position; naive: uniform CE over the window; mdm: masked "
        "diffusion; decayed_ce: DFlash's CE weighted exp(-(j-1)/decay) (feature drafters).")
    decay: float = Field(4.0, gt=0, description="decayed_ce: the position decay (DFlash: 4 for gamma 8).")
    anchors_per_sample: int = Field(32, ge=1, description="feature: blocks cut from each trajectory per step, "
                                    "all scored in one forward.")
    prompt_anchors_per_sample: int = Field(0, ge=0, description="feature + greedy teacher: more blocks per "
                                           "trajectory, anchored inside the prompt and labelled with the verifier's "
                                           "argmax there (the teacher's prefill records it: no extra verifier "
                                           "pass). 0: completion anchors only.")
    warmup_ce_steps: int = Field(0, ge=0, description="feature + streak: the first N steps use decayed_ce (the "
                                 "streak's gradient vanishes while q is tiny), then Eq. 6.")
    gamma: int = Field(8, ge=1, description="Window length γ.")
    temperature: float = Field(1.0, gt=0, description="Drafter sampling temperature the objective is taken at.")
    windows_per_sample: int = Field(2, ge=1, description="Windows cut per teacher completion.")
    divergence: Literal["fkl", "tvd"] = Field("fkl", description="ar_distill divergence.")
    prefix_ar_weight: float = Field(0.0, ge=0, description="Weight of an auxiliary next-token loss on the "
                                    "block-causal prefix rows (drafter.causal_prefix): every prefix position is an "
                                    "AR prediction, so the first window position learns from far more tokens.")
    prefix_ar_positions: int = Field(16, ge=1, description="Prefix positions (the last ones before the window) "
                                     "the auxiliary loss reads; each costs one LM-head row.")


class LoraSection(Section):
    enabled: bool = Field(False, description="Train LoRA adapters (merged into the output) instead of all weights.")
    r: int = Field(32, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    targets: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                               description="Module names to adapt.")


class TrainSection(Section):
    steps: int = Field(100, ge=1, description="Optimizer steps (the schedule spans these).")
    stop_after: int | None = Field(None, ge=1, description="End this run after this step with a checkpoint; "
                                   "rerun the same run name to continue.")
    time_budget_s: float | None = Field(
        None, gt=0, description="Wall-clock seconds for the whole run, counted from the job's start (Ray start, "
        "teacher sampling and evaluations included). Where the remaining steps do not fit at the measured step "
        "time, the run trains the steps that do: the learning-rate schedule and the CE warm-up "
        "(objective.warmup_ce_steps) shrink in proportion, and the run ends there, finished, with its final "
        "evaluation and drafter. None: every one of train.steps.")
    batch_size: int = Field(4, ge=1, description="Teacher completions per worker per step (x windows_per_sample).")
    lr: float = Field(2e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="After warm-up.")
    grad_clip: float | None = Field(1.0, gt=0, description="Max gradient norm (None: off).")
    freeze_embeddings: bool = Field(False, description="Keep the inherited token embeddings (and a tied LM head) "
                                    "fixed; the appended mask-token row still trains.")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: bf16 autocast on a GPU that "
                                                       "supports it, or on a CPU with native bf16 for a drafter at "
                                                       "least 256 wide; else fp32 (tiny drafters train faster in fp32; "
                                                       "see specdiff.models.dtypes.train_autocast_bf16).")
    lora: LoraSection = LoraSection()
    num_workers: int = Field(2, ge=1)
    cpus_per_worker: float = Field(0.5, gt=0, description="0.5 leaves Ray Data CPUs on a 2-core machine.")
    use_gpu: bool = False
    checkpoint_every: int = Field(20, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    max_failures: int = Field(2, ge=-1, description="Worker-group restarts from the latest checkpoint (-1: "
                                                    "unlimited).")
    log_every: int = Field(5, ge=1)


class EvalSection(Section):
    every: int = Field(20, ge=1, description="Held-out evaluation every N steps (and before the first, and at "
                                             "the end).")
    offsets: list[int] = Field([0, 8], description="Window offsets into each held-out completion.")
    num_candidates: int = Field(1, ge=1, description="K candidates per window (self-selection).")
    draft_temperature: float = Field(0.0, ge=0, description="Candidate sampling temperature (0: argmax).")
    temperature: float | None = Field(None, ge=0, description="Verifier temperature the acceptance is measured at "
                                      "(0: greedy decoding); None: the teacher's sampling settings.")


class TrackingSection(Section):
    backend: Literal["none", "mlflow"] = "none"
    tracking_uri: str | None = Field(None, description="e.g. sqlite:///artifacts/mlflow.db or http://host:5000.")
    experiment: str = "specdiff-distill"
    artifact_location: str | None = Field(None, description="Artifact root for a new experiment.")


class FaultSection(Section):
    """Chaos testing: SIGKILL one worker once, to exercise restart from the latest checkpoint."""

    kill_at_step: int | None = Field(None, ge=1)
    kill_rank: int = Field(1, ge=0)


class DistillConfig(Section):
    run: RunSection = RunSection()
    ray: RaySection = RaySection()
    verifier: VerifierSection
    data: DataSection
    teacher: TeacherSection = TeacherSection()
    drafter: DrafterSection = DrafterSection()
    objective: ObjectiveSection = ObjectiveSection()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    tracking: TrackingSection = TrackingSection()
    fault: FaultSection = FaultSection()

    @model_validator(mode="after")
    def _consistent(self) -> DistillConfig:
        t, o = self.teacher, self.objective
        if self.data.prompts is None and self.data.trajectories is None:
            raise ValueError("data.prompts or data.trajectories must be set, got neither")
        if _inside(self.run.storage_path, self.run.output_dir):
            raise ValueError(f"run.storage_path ({self.run.storage_path}) must not lie inside run.output_dir "
                             f"({self.run.output_dir}): the finished drafter replaces run.output_dir, checkpoints "
                             "and all")
        if o.gamma > t.max_new_tokens:
            raise ValueError(f"objective.gamma must be <= teacher.max_new_tokens ({t.max_new_tokens}), got {o.gamma}")
        if o.kind == "ar_distill" and t.logprobs_k < 1 and self.drafter.init != "feature":
            raise ValueError(f"teacher.logprobs_k must be >= 1 for objective.kind='ar_distill', got {t.logprobs_k}")
        if self.train.lora.enabled and self.drafter.init == "small":
            raise ValueError("train.lora.enabled needs drafter.init 'from_verifier' or 'pretrained', got 'small'")
        if self.objective.prefix_ar_weight > 0 and not self.drafter.causal_prefix and self.drafter.init != "pretrained":
            raise ValueError("objective.prefix_ar_weight needs drafter.causal_prefix true, got false")
        if self.train.freeze_embeddings and self.train.weight_decay:
            raise ValueError(f"train.freeze_embeddings needs train.weight_decay 0 (decay would move the frozen "
                             f"rows), got {self.train.weight_decay}")
        if self.drafter.layers is not None and self.drafter.init != "from_verifier":
            raise ValueError(f"drafter.layers needs drafter.init 'from_verifier', got {self.drafter.init!r}")
        if self.drafter.init == "feature":
            if o.kind == "mdm" or o.prefix_ar_weight > 0:
                raise ValueError(f"objective.kind={o.kind!r} / prefix_ar_weight need a standalone drafter; a feature "
                                 "drafter trains with streak, decayed_ce, naive or ar_distill")
            if self.train.lora.enabled:
                raise ValueError("train.lora.enabled is not supported for drafter.init='feature' (it trains all of "
                                 "its few weights)")
            if o.prompt_anchors_per_sample and t.temperature > 0:
                raise ValueError(f"objective.prompt_anchors_per_sample needs a greedy teacher (teacher.temperature "
                                 f"0: its labels are the verifier's argmax), got temperature {t.temperature}")
        elif o.prompt_anchors_per_sample:
            raise ValueError("objective.prompt_anchors_per_sample needs drafter.init='feature'")
        elif o.kind == "decayed_ce":
            raise ValueError("objective.kind='decayed_ce' needs drafter.init='feature'")
        if self.drafter.init == "pretrained" and not self.drafter.path:
            raise ValueError("drafter.path must be set for drafter.init='pretrained', got None")
        bad = [x for x in self.eval.offsets if not 0 <= x < t.max_new_tokens]
        if bad:
            raise ValueError(f"eval.offsets must lie in [0, teacher.max_new_tokens={t.max_new_tokens}), got {bad}")
        if self.tracking.backend == "mlflow" and not self.tracking.tracking_uri:
            raise ValueError("tracking.tracking_uri must be set for tracking.backend='mlflow', got None")
        self.teacher.sampling()  # SamplingParams' own checks
        return self

    def eval_sampling(self) -> SamplingParams:
        """The verifier's sampling settings that held-out acceptance is measured at."""
        if self.eval.temperature is None:
            return self.teacher.sampling()
        return SamplingParams(temperature=self.eval.temperature)

    def check_paths(self) -> None:
        """Inputs must exist before any work starts (trajectory folders too)."""
        paths = {"verifier.path": self.verifier.path, "data.heldout": self.data.heldout,
                 "data.prompts": self.data.prompts, "data.trajectories": self.data.trajectories,
                 "drafter.path": self.drafter.path if self.drafter.init == "pretrained" else None}
        for field, value in paths.items():
            if value is not None and "://" not in value and value != DEFAULT_VERIFIER and not Path(value).exists():
                raise ValueError(f"{field} must be an existing path, got {value!r}")


def _set(tree: dict, dotted: str, value) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {dotted!r}: {key!r} is not a section")
    node[leaf] = value


def _describe(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        where = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown config key {where!r}")
        elif e["type"] == "missing":
            lines.append(f"missing config key {where!r}")
        elif not where:  # a cross-field check: its message names the fields and values
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"{where}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def parse_config(tree: dict) -> DistillConfig:
    try:
        return DistillConfig.model_validate(tree)
    except ValidationError as e:
        raise ValueError(f"invalid distill config: {_describe(e)}") from None


def load_config(path: str | Path | None, overrides: list[str] = (), *, check_paths: bool = True) -> DistillConfig:
    """YAML file (optional) + ``section.key=value`` overrides (values parsed as YAML) -> validated config. ``path``
    may also name a recipe the package ships (``tiny``, ``smollm2-feature.yaml``: ``specdiff.recipes``) where no
    such file exists."""
    from specdiff.recipes import is_recipe, recipe_names, recipe_text

    tree: dict = {}
    if path is not None:
        if Path(path).is_file():
            text = Path(path).read_text()
        elif is_recipe(str(path)):
            text = recipe_text(str(path))
        else:
            raise FileNotFoundError(f"config {str(path)!r}: no such file, and no recipe of that name (the package "
                                    f"ships {recipe_names()})")
        tree = yaml.safe_load(text) or {}
        if not isinstance(tree, dict):
            raise ValueError(f"config file must hold a mapping, got {type(tree).__name__} in {str(path)!r}")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override must look like section.key=value, got {item!r}")
        _set(tree, key.strip(), yaml.safe_load(raw))
    cfg = parse_config(tree)
    if check_paths:
        cfg.check_paths()
    return cfg
