"""The verifier and our feature drafter served by vLLM, through Ray Serve LLM (``ray.serve.llm``): vLLM's continuous
batching and OpenAI server, Serve's replicas and autoscaling. Needs the vLLM extra (README: "vLLM engine").

    serve run serve_apps.specdiff_vllm:app                                 # the embedded default pair, :8000
    serve run serve_apps.specdiff_vllm:app gamma=4 speculation_max_batch=8 drafter=/path/to/feature-drafter

Ray Serve LLM runs on CPUs too (Ray 2.60: a placement group of CPU bundles; this builder asks for one when
``num_gpus`` is 0), so one code path serves a laptop and an A100 pool. The drafter is exported once per drafter
digest to ``$SPECDIFF_HOME/vllm`` (``specdiff.vllm.export``) and loaded by vLLM as speculative method ``dflash``.

Speculation under load: ``load_cap`` (default ``auto``: the cap measured on this machine by ``jobs/bench_vllm.py
--find-cap``, else ``specdiff.serving.load_cap.FALLBACK_CAP``) deploys a plain engine beside the speculative one, and
the ingress sends a new request to the plain engine while more than ``load_cap`` are in flight
(``specdiff.serving.vllm_ingress``). vLLM's own switch, ``speculation_max_batch`` (its dynamic schedule
``num_speculative_tokens_per_batch_size``: γ tokens while the engine's batch holds at most that many requests, 0
above), stays available, but vLLM 0.32 still runs the drafter's forward on a step that drafts nothing, so a capped
engine stays slower than plain under load (``specdiff.serving.load_cap``).

Which to pick (docs/vllm.md): the split-pool app (``serve_apps.specdiff:app``) for the latency of each request
(self-selection over K candidates, the adaptive policy, drafter and verifier on their own pools); this one for
throughput under load (vLLM batches every request's step into one forward; one candidate per round).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from specdiff.vllm.export import DEFAULT_MIN_DRAFT_CONFIDENCE
from specdiff.models.sources import DEFAULT_VERIFIER, default_verifier_path, resolve_model_path, state_dir
from specdiff.runtime.publish import publishing
from specdiff.serving.config import DEFAULT_DRAFTER, _Strict


class VLLMAppConfig(_Strict):
    """The builder's ``args`` (``serve run serve_apps.specdiff_vllm:app key=value ...`` or a Serve config YAML)."""

    model_id: str = Field("smollm2-135m-instruct", description="The model name clients send.")
    verifier: str = Field(DEFAULT_VERIFIER, description="Hugging Face folder of the verifier, or the embedded "
                          f"default {DEFAULT_VERIFIER!r}.")
    drafter: str | None = Field(DEFAULT_DRAFTER, description="Feature drafter folder; 'default': the built default "
                                "drafter ($SPECDIFF_HOME/drafters/default); none: no speculation.")
    gamma: int = Field(4, ge=1, description="Draft tokens per step (vLLM num_speculative_tokens), at most the "
                       "drafter's window.")
    prompt_lookup: bool = Field(True, description="Draft a copy from the context where it has one, the drafter's "
                                "window elsewhere (specdiff.vllm.plugin; n-grams 2 to 4).")
    min_draft_confidence: float | None = Field(DEFAULT_MIN_DRAFT_CONFIDENCE, gt=0, lt=1, description="Verify the "
                                               "drafter's tokens only while the running product of its top-1 "
                                               "probabilities stays at or above this (specdiff.vllm.plugin); none: "
                                               "every window whole.")
    speculation_max_batch: int | None = Field(None, ge=1, description="Speculate while the engine's batch holds at "
                                              "most this many requests, not above (none: always). vLLM's dynamic "
                                              "schedule: the drafter's forward still runs above it.")
    load_cap: int | Literal["auto"] | None = Field("auto", description="Send a new request to a plain engine (the "
                                                   "verifier alone, model '<model_id>-plain') while more than this "
                                                   "many are in flight; auto: the cap measured on this machine "
                                                   "(jobs/bench_vllm.py --find-cap), else 1; none: one engine, no "
                                                   "cap. A GPU deployment gives the plain engine its own num_gpus.")
    max_num_seqs: int = Field(64, ge=1, description="vLLM: requests batched per step.")
    max_model_len: int = Field(2048, ge=16, description="vLLM: context length per request.")
    dtype: str = Field("auto", description="auto (specdiff.models.dtypes: bf16 on a GPU or a CPU with native bf16, else "
                       "float32), float32 or bfloat16.")
    enforce_eager: bool | None = Field(None, description="vLLM: skip compilation (default: on a CPU, where "
                                       "compiling takes minutes).")
    num_gpus: float = Field(0, ge=0, description="0: a CPU deployment; > 0: a GPU one (Ray Serve LLM then gives each "
                            "replica as many GPUs as vLLM's tensor_parallel_size × pipeline_parallel_size, set in "
                            "engine_kwargs; default 1).")
    num_cpus: float = Field(1, gt=0, description="CPUs per replica (CPU deployment).")
    accelerator_type: str | None = Field(None, description="GPU type, e.g. 'A100' (GPU deployments only).")
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(1, ge=1)
    kv_cache_gib: float | None = Field(None, gt=0, description="Memory for vLLM's KV cache, GiB (its "
                                       "kv_cache_memory_bytes). Default: 2 on a CPU deployment, where vLLM's own "
                                       "default asks for 92% of the machine's memory free at start and refuses to "
                                       "start beside another replica; on a GPU, vLLM's gpu_memory_utilization.")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="More vLLM engine arguments (win).")

    @model_validator(mode="after")
    def _consistent(self) -> VLLMAppConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        if self.accelerator_type and not self.num_gpus:
            raise ValueError(f"accelerator_type={self.accelerator_type!r} needs num_gpus > 0")
        if self.speculation_max_batch is not None and self.drafter is None:
            raise ValueError("speculation_max_batch needs a drafter")
        if isinstance(self.load_cap, int) and self.load_cap < 1:
            raise ValueError(f"load_cap must be >= 1, 'auto' or none, got {self.load_cap}")
        return self


def speculative_config(export, gamma: int, max_batch: int | None, max_num_seqs: int) -> dict:
    """vLLM's ``speculative_config`` for an export: γ tokens, and with ``max_batch`` a dynamic schedule that drafts
    nothing above that batch size."""
    config = export.speculative_config(gamma)
    if max_batch is not None and max_batch < max_num_seqs:
        config["num_speculative_tokens_per_batch_size"] = [[1, max_batch, gamma], [max_batch + 1, max_num_seqs, 0]]
    return config


def export_for_vllm(drafter_dir: Path, verifier_dir: Path, *, prompt_lookup: bool = True,
                    min_draft_confidence: float | None = DEFAULT_MIN_DRAFT_CONFIDENCE):
    """The drafter exported for vLLM, once per drafter and verifier folder state and plugin setting
    (``$SPECDIFF_HOME/vllm/<key>``, published atomically: replicas starting together never read half an export)."""
    from specdiff.vllm.export import DEFAULT_PROMPT_LOOKUP, EXPORT_META, VllmExport, export_vllm

    lookup = DEFAULT_PROMPT_LOOKUP if prompt_lookup else None
    suffix = (f"lookup{lookup[0]}-{lookup[1]}" if lookup else "drafter-only") + (
        f"-cut{min_draft_confidence:g}" if min_draft_confidence else "")
    target = state_dir() / "vllm" / f"{_digest(drafter_dir)}-{_digest(verifier_dir)}-{suffix}"
    if not (target / EXPORT_META).is_file():
        with publishing(target) as partial:  # where another replica published it first, its copy stays
            export_vllm(drafter_dir, partial, verifier_dir=verifier_dir, prompt_lookup=lookup,
                        min_draft_confidence=min_draft_confidence)
    meta = json.loads((target / EXPORT_META).read_text())["export"]
    return VllmExport(path=target, num_speculative_tokens=meta["num_speculative_tokens"],
                      mask_token_id=meta["mask_token_id"], draft_vocab_size=meta["draft_vocab_size"],
                      target_layer_ids=tuple(meta["target_layer_ids"]),
                      prompt_lookup=tuple(meta["prompt_lookup"]) if meta.get("prompt_lookup") else None,
                      min_draft_confidence=meta.get("min_draft_confidence"))


def _digest(folder: Path) -> str:
    """Names, sizes and modification times of a folder's files: another build is another key."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    for f in sorted(folder.iterdir()):
        if f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}".encode())
    return h.hexdigest()[:16]


CPU_KV_CACHE_GIB = 2.0


def engine_kwargs(cfg: VLLMAppConfig, verifier_dir: Path, *, plain: bool = False) -> dict[str, Any]:
    """vLLM's engine arguments for the app's engine (``plain``: the verifier alone): ``cfg.engine_kwargs`` win."""
    from specdiff.models.dtypes import dtype_name, resolve_dtype

    gpu = cfg.num_gpus > 0
    engine = {
        "dtype": dtype_name(resolve_dtype(cfg.dtype, device="cuda" if gpu else "cpu")),
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "enforce_eager": (not gpu) if cfg.enforce_eager is None else cfg.enforce_eager,
        "disable_log_stats": False,  # spec-decode counters on the metrics endpoint
    }
    if cfg.drafter is not None and not plain:
        export = _export(cfg, verifier_dir)
        engine["speculative_config"] = speculative_config(export, cfg.gamma, cfg.speculation_max_batch,
                                                          cfg.max_num_seqs)
    sized = {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(cfg.engine_kwargs)
    if (cfg.kv_cache_gib is not None or not gpu) and not sized:
        engine["kv_cache_memory_bytes"] = int((cfg.kv_cache_gib or CPU_KV_CACHE_GIB) * 2**30)
    engine.update(cfg.engine_kwargs)
    return engine


def llm_config(cfg: VLLMAppConfig, *, plain: bool = False):
    """The ``ray.serve.llm.LLMConfig`` of the app's engine (``plain``: the verifier alone, ``<model_id>-plain``)."""
    from ray.serve.llm import LLMConfig

    verifier_dir = _verifier_dir(cfg)
    gpu = cfg.num_gpus > 0
    engine = engine_kwargs(cfg, verifier_dir, plain=plain)
    deployment = {"autoscaling_config": {"min_replicas": cfg.min_replicas, "max_replicas": cfg.max_replicas}}
    kwargs: dict[str, Any] = {}
    if gpu:
        kwargs["accelerator_type"] = cfg.accelerator_type
    else:  # a CPU deployment: one CPU bundle for the engine (Ray 2.60 infers the CPU backend from it)
        kwargs["placement_group_config"] = {"bundles": [{"CPU": cfg.num_cpus}]}
        deployment["ray_actor_options"] = {"num_cpus": 0}
    model_id = plain_model_id(cfg) if plain else cfg.model_id
    return LLMConfig(model_loading_config={"model_id": model_id, "model_source": str(verifier_dir)},
                     engine_kwargs=engine, deployment_config=deployment, **kwargs)


def plain_model_id(cfg: VLLMAppConfig) -> str:
    return f"{cfg.model_id}-plain"


def resolve_load_cap(cfg: VLLMAppConfig) -> tuple[int | None, str]:
    """(the load cap, where it came from); None without a drafter or with ``load_cap`` none."""
    if cfg.drafter is None or cfg.load_cap is None:
        return None, "no cap (load_cap=none)" if cfg.drafter is not None else "no drafter"
    if cfg.load_cap != "auto":
        return int(cfg.load_cap), "load_cap"
    from specdiff.models.dtypes import dtype_name, resolve_dtype
    from specdiff.serving.load_cap import cap_path, read_cap

    verifier_dir = _verifier_dir(cfg)
    export = _export(cfg, verifier_dir)
    dtype = dtype_name(resolve_dtype(cfg.dtype, device="cuda" if cfg.num_gpus > 0 else "cpu"))
    gamma = min(cfg.gamma, export.num_speculative_tokens)
    return read_cap(cap_path(state_dir(), verifier_dir, _drafter_dir(cfg.drafter), gamma, dtype))


def _verifier_dir(cfg: VLLMAppConfig) -> Path:
    return default_verifier_path() if cfg.verifier == DEFAULT_VERIFIER else Path(resolve_model_path(cfg.verifier))


def _export(cfg: VLLMAppConfig, verifier_dir: Path):
    return export_for_vllm(_drafter_dir(cfg.drafter), verifier_dir, prompt_lookup=cfg.prompt_lookup,
                           min_draft_confidence=cfg.min_draft_confidence)


def _drafter_dir(drafter: str) -> Path:
    if drafter == DEFAULT_DRAFTER:
        from specdiff.serving.models import default_drafter_dir

        folder = default_drafter_dir()
        if not folder.is_dir():
            raise ValueError(f"drafter='default': the default drafter is not built ({str(folder)!r} is missing); "
                             "build it once with `specdiff build`, or pass drafter=<folder> or "
                             "drafter=none")
        return folder
    folder = Path(drafter)
    if not folder.is_dir():
        raise ValueError(f"drafter must be a feature drafter folder, got {drafter!r} (not a folder)")
    return folder


def build_vllm_app(args: dict[str, Any] | VLLMAppConfig | None = None):
    """An OpenAI-compatible Serve application (``ray.serve.llm.build_openai_app``) for ``args``: with a drafter and a
    load cap, the speculative engine and a plain one behind ``specdiff.serving.vllm_ingress.LoadCappedIngress``."""
    from ray.serve.llm import build_openai_app

    cfg = args if isinstance(args, VLLMAppConfig) else VLLMAppConfig.model_validate(_none_strings(args or {}))
    cap, source = resolve_load_cap(cfg)
    if cap is None:
        return build_openai_app({"llm_configs": [llm_config(cfg)]})
    from specdiff.serving.vllm_ingress import LoadCappedIngress

    print(f"[specdiff_vllm] load cap {cap} ({source}): above it requests take {plain_model_id(cfg)!r}", flush=True)
    return build_openai_app({
        "llm_configs": [llm_config(cfg), llm_config(cfg, plain=True)],
        "ingress_cls_config": {"ingress_cls": LoadCappedIngress, "ingress_extra_kwargs": {
            "speculative_model_id": cfg.model_id, "plain_model_id": plain_model_id(cfg), "cap": cap}},
    })


def _none_strings(args: dict[str, Any]) -> dict[str, Any]:
    """``serve run ... drafter=none`` passes the string 'none'."""
    return {k: (None if isinstance(v, str) and v.lower() in ("none", "null") else v) for k, v in args.items()}
