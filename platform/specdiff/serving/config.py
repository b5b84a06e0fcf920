"""Pydantic configs for the Serve app: the builder's ``args`` (Serve config YAML or ``serve run key=value``).

Python::

    from specdiff.serving import AppConfig, build_app
    app = build_app(AppConfig(drafter={"max_replicas": 4}, pools=True))

YAML (``serve deploy``)::

    applications:
      - name: specdiff
        import_path: serve_apps.specdiff:app
        args:
          pools: true
          models: {verifier: /models/verifier, drafter: /models/drafter}   # or {demo: true}; default: the embedded pair
          drafter: {min_replicas: 1, max_replicas: 4, num_gpus: 1, accelerator_type: A100}

``serve run serve_apps.specdiff:app drafter.max_replicas=4 pools=true``: dotted keys address nested fields.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from specdiff.core.config import SpecConfig
from specdiff.models.sources import DEFAULT_VERIFIER

_SPEC = SpecConfig()  # the library's defaults for γ, K and the draft temperature: one source

DEMO = "demo"
DEFAULT_DRAFTER = "default"  # the embedded default pair's drafter (specdiff.serving.models.resolve_default)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSource(_Strict):
    """Where the verifier, drafter and tokenizer come from.

    By default the embedded default pair: the verifier SmolLM2-135M-Instruct (``smollm2-135m-instruct``) and its
    default drafter (``default``: ``$SPECDIFF_HOME/drafters/default`` built by ``python jobs/build_drafter.py``, else
    the registry's ``models:/specdiff-drafter-smollm2@production``). ``demo=true`` serves a tiny random-init pair
    instead (offline, seconds, gibberish: tests and laptops)."""

    demo: bool = Field(
        False, description="Serve the tiny random-init demo pair (verifier and drafter 'demo'): offline, no build."
    )
    model_id: str = Field(
        None, description="Name served in /v1/models; requests must use it as `model`. Default: "
        "'smollm2-135m-instruct' for the embedded default verifier, else 'specdiff-demo'."
    )
    verifier: str = Field(
        None,
        description="Verifier: 'smollm2-135m-instruct' (the embedded default), 'demo' (tiny random-init Llama over "
        "a byte tokenizer, no download) or a Hugging Face causal-LM folder / hub id.",
    )
    drafter: str = Field(
        None,
        description="Drafter: 'default' (the embedded default pair's: $SPECDIFF_HOME/drafters/default, else the "
        "registry's production alias of family smollm2), 'demo' (build_small_drafter over the verifier's "
        "vocabulary), a folder written by save_drafter or save_feature_drafter, 'hf:<folder or hub id>' (a "
        "masked-diffusion model such as DiffuCoder), or 'import:<module>:<function>' (a factory called with this "
        "ModelSource that returns a standalone Drafter).",
    )
    tokenizer: str | None = Field(None, description="Tokenizer folder / hub id; default: the verifier's.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; 'auto' = bfloat16 on a GPU or a CPU with native bf16, else float32 "
        "(specdiff.models.dtypes; SPECDIFF_DTYPE forces it)."
    )
    backend: Literal["auto", "transformers", "specdiff"] = Field(
        "auto", description="Verifier forward: 'specdiff' (specdiff.models.llama: transformers' Llama forward in plain torch, "
        "weights loaded straight from safetensors; replicas start seconds sooner), 'transformers', or 'auto' "
        "(specdiff where the folder is a Llama-family model it computes exactly and no device_map is given)."
    )
    device_map: str | None = Field(
        None, description="Passed to from_pretrained (e.g. 'auto' to spread a 72B verifier over a replica's GPUs)."
    )
    trust_remote_code: bool = Field(False, description="Allow model code from the hub (Dream/DiffuCoder need it).")
    drafter_options: dict[str, Any] = Field(
        default_factory=dict,
        description="DrafterConfig fields for an 'hf:' drafter: shifted_logits, max_context, denoising_steps, ...",
    )
    max_context: int | None = Field(None, ge=2, description="Verifier context limit; default: the model's.")
    demo_seed: int = Field(0, description="Init seed of the demo models (every replica builds the same weights).")
    pair: str | None = Field(
        None,
        description="A registered drafter, 'models:/specdiff-drafter-<family>@production' (or '/<version>'): serve "
        "it with the verifier version it is aligned to (specdiff.registry). Leave `drafter` unset; a `verifier` "
        "folder given with it must have the digest the drafter was distilled against.",
    )
    tracking_uri: str | None = Field(
        None, description="MLflow store of `pair`; default MLFLOW_TRACKING_URI, else the embedded sqlite store."
    )
    follow_s: float = Field(
        30, ge=0, description="With `pair` an alias: every replica re-reads it this often and swaps a newly promoted "
        "pair in (0: only at start-up and on a Serve reconfigure of user_config {'pair': ...})."
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """Fill verifier / drafter / model_id from ``demo`` (and ``pair``) when they are not given."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}
        demo = TypeAdapter(bool).validate_python(data.get("demo", False))
        if demo:
            given = {k: data[k] for k in ("verifier", "drafter", "pair") if data.get(k, DEMO) != DEMO}
            if given:
                key, value = next(iter(given.items()))
                raise ValueError(f"{key} must be left unset with demo=true (the demo pair is served), got {value!r}")
            data.update(verifier=DEMO, drafter=DEMO)
        elif data.get("pair") is not None:  # the pair names both (a verifier given is an override, digest-checked)
            data.setdefault("verifier", DEMO)
            data.setdefault("drafter", DEMO)
        else:
            data.setdefault("verifier", DEFAULT_VERIFIER)
            data.setdefault("drafter", DEFAULT_DRAFTER)
        data.setdefault("model_id", DEFAULT_VERIFIER if data["verifier"] == DEFAULT_VERIFIER else "specdiff-demo")
        return data

    @field_validator("drafter")
    @classmethod
    def _drafter_form(cls, value: str) -> str:
        if value.startswith("import:") and value.count(":") != 2:
            raise ValueError(f"drafter must look like 'import:<module>:<function>', got {value!r}")
        return value

    @model_validator(mode="after")
    def _pair_form(self) -> ModelSource:
        if self.pair is None:
            return self
        if not self.pair.startswith("models:/"):
            raise ValueError(f"pair must look like models:/<name>@<alias> or models:/<name>/<version>, got {self.pair!r}")
        if self.drafter != DEMO:
            raise ValueError(f"drafter must be left unset when pair is set (the pair names it), got {self.drafter!r}")
        return self


class PoolOptions(_Strict):
    """Replicas of one deployment: autoscaling bounds and what each replica asks of its node pool."""

    min_replicas: int = Field(1, ge=0, description="Autoscaling lower bound.")
    max_replicas: int = Field(1, ge=1, description="Autoscaling upper bound (a pool resource also caps it).")
    initial_replicas: int | None = Field(None, ge=0, description="Replicas at start; default min_replicas.")
    target_ongoing_requests: float = Field(8, gt=0, description="Per-replica load the autoscaler aims for.")
    max_ongoing_requests: int = Field(64, ge=1, description="Per-replica concurrency cap (back-pressure above).")
    num_cpus: float = Field(0.5, ge=0, description="CPUs per replica (small default: the demo fits a 2-core laptop).")
    num_gpus: float = Field(0, ge=0, description="GPUs per replica (2 for a 72B verifier in bfloat16 on A100-80GB).")
    accelerator_type: str | None = Field(None, description="Ray accelerator type, e.g. 'A100' or 'A100-80G'.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom resources per replica, e.g. {'drafter_pool': 1}."
    )

    @field_validator("resources", mode="before")
    @classmethod
    def _json_resources(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value  # `serve run ... drafter.resources='{...}'`

    @model_validator(mode="after")
    def _bounds(self) -> PoolOptions:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        return self

    def deployment_options(self, pool_resource: str | None) -> dict:
        """Keyword arguments for ``serve.deployment(...)`` / ``.options(...)``."""
        resources = dict(self.resources)
        if pool_resource is not None:
            resources.setdefault(pool_resource, 1)
        actor = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": resources}
        if self.accelerator_type:
            actor["accelerator_type"] = self.accelerator_type
        autoscaling = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
        }
        if self.initial_replicas is not None:
            autoscaling["initial_replicas"] = self.initial_replicas
        return {
            "autoscaling_config": autoscaling,
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": actor,
        }


class DrafterOptions(PoolOptions):
    max_batch_size: int = Field(16, ge=1, description="Concurrent proposals batched into one forward (serve.batch).")
    batch_wait_timeout_s: float = Field(0.004, ge=0, description="How long a batch waits to fill.")
    max_sessions: int = Field(256, ge=1, description="Feature drafter: per-replica cap on draft caches (LRU beyond).")
    cache_budget_mb: float = Field(
        512, gt=0, description="Feature drafter: per-replica memory budget for draft caches (LRU beyond)."
    )
    num_virtual_nodes: int = Field(100, ge=1, description="Consistent-hash ring (feature drafter sessions).")


class VerifierOptions(PoolOptions):
    max_sessions: int = Field(256, ge=1, description="Per-replica cap on live KV-cache sessions (LRU beyond).")
    kv_cache_budget_mb: float = Field(
        2048, gt=0, description="Per-replica memory budget for KV caches. Split placement: least recently used "
        "sessions are evicted. Colocated (Decoder): a request waits until its room (prompt + max_tokens + the largest "
        "tree) fits beside the decodes running (batch steps over a KV pool: count x the longest room, since every slot "
        "has the longest's); one that could never fit is refused with a 503 naming the limit."
    )
    num_virtual_nodes: int = Field(100, ge=1, description="Consistent-hash ring: virtual nodes per replica.")
    feature_dtype: Literal["float16", "bfloat16", "float32"] = Field(
        "float16", description="Feature drafter: dtype of the tapped features sent to the drafter (2 bytes per "
        "number; float32 makes the served drafts bit-identical to an in-process decode's)."
    )
    batching: bool = Field(True, description="The lean forward's passes share batch steps "
                           "(specdiff.models.batched): a Decoder replica runs every decode's next verifier pass in "
                           "one forward per step; a Verifier replica (split placement) the calls in flight. false: "
                           "one forward per session and pass.")
    max_batch_rows: int = Field(4096, ge=1, description="Colocated batching: most rows (tree nodes, prompt tokens) "
                                "in one batch step; a longer prefill runs in a step of its own.")
    batch_wait_ms: float = Field(3.0, ge=0, description="Colocated batching: how long a step waits for sessions "
                                 "still busy (drafting, emitting) once no pass has arrived for that long.")


class RouterOptions(PoolOptions):
    max_ongoing_requests: int = Field(256, ge=1, description="Concurrent requests per router replica.")
    drafter_timeout_s: float = Field(
        2.0, gt=0, description="A drafter call slower than this is abandoned; the round runs verifier-only."
    )
    drafter_cooldown_s: float = Field(
        1.0, ge=0, description="After a drafter failure, skip the drafter for this long (verifier-only rounds)."
    )
    verifier_timeout_s: float = Field(60.0, gt=0, description="Timeout of one verifier call before it is retried.")
    verifier_retries: int = Field(2, ge=0, description="Retries of a failed verifier call (a new replica recomputes).")
    max_gamma: int = Field(64, ge=1, description="Largest window γ a request may ask for.")
    max_candidates: int = Field(64, ge=1, description="Largest K a request may ask for.")
    max_tokens_limit: int = Field(4096, ge=1, description="Largest max_tokens a request may ask for.")
    default_max_tokens: int = Field(64, ge=1, description="max_tokens when a request gives none.")
    gamma: int | None = Field(None, ge=1, description="Default window γ; None: chosen round by round by the "
                              "adaptive policy (specdiff.core.policy), up to adaptive_max_gamma.")
    num_candidates: int | None = Field(None, ge=1, description="Default K; None: adaptive, up to "
                                       "adaptive_max_candidates.")
    adaptive_max_gamma: int = Field(_SPEC.max_gamma, ge=1, description="Largest γ the adaptive policy tries.")
    adaptive_max_candidates: int = Field(_SPEC.max_candidates, ge=1, description="Largest K the adaptive policy tries.")
    speculation_max_load: int | None = Field(
        None, ge=1, description="Speculate only while the session's verifier replica decodes at most this many "
        "sessions; busier, decodes take plain steps (several to a call) until the load drops. None: always "
        "speculate. Measure the crossover with jobs/loadtest.py. Requests that name gamma or num_candidates are "
        "not gated.")
    draft_temperature: float = Field(_SPEC.draft_temperature, ge=0, description="Default draft temperature.")
    decode_threads: int = Field(256, ge=1, description="Threads that run decode loops (each blocks on handles).")


class AppConfig(_Strict):
    """Everything the builder takes. Every field is overridable from YAML ``args`` or ``serve run`` key=value."""

    models: ModelSource = Field(default_factory=ModelSource)
    drafter: DrafterOptions = Field(default_factory=DrafterOptions)
    verifier: VerifierOptions = Field(default_factory=VerifierOptions)
    router: RouterOptions = Field(default_factory=lambda: RouterOptions(num_cpus=0.25))
    colocate: bool | None = Field(
        None,
        description="Drafter and verifier on the same replicas (deployment 'Decoder', sized by the `verifier` "
        "options), which run whole decodes with the in-process engine and stream tokens to the router: no call per "
        "round, so a served decode runs at the in-process speed. False: separate Drafter and Verifier deployments "
        "(own pools and autoscaling, two calls per speculative round: for a standalone drafter with weights of its "
        "own, e.g. Dream-7B on its own GPUs). None (default): colocated for a feature drafter (it shares the "
        "verifier's embeddings and LM head and reads its hidden states every round, as vLLM runs such drafters), "
        "separate otherwise. docs/serve.md compares them.",
    )
    pools: bool = Field(
        False,
        description="Ask for one unit of 'drafter_pool' / 'verifier_pool' per replica (declare them on the cluster "
        "first; an undeclared resource leaves the deployment DEPLOYING forever). Off on a laptop/CI.",
    )
    drafter_pool: str = Field("drafter_pool", description="Name of the drafter pool's custom resource.")
    verifier_pool: str = Field("verifier_pool", description="Name of the verifier pool's custom resource.")

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> AppConfig:
        """From a Serve ``args`` dict; dotted keys (``drafter.max_replicas=4`` from ``serve run``) are nested."""
        nested: dict[str, Any] = {}
        for key, value in (args or {}).items():
            node = nested
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ValueError(f"{key} conflicts with a non-mapping value for {part!r}")
            if isinstance(node.get(leaf), dict) and isinstance(value, dict):
                node[leaf].update(value)
            else:
                node[leaf] = value
        return cls.model_validate(nested)
