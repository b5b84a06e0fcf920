"""The MLflow registry of drafter–verifier pairs. MLflow lives here; no Ray, no training package.

Registered models, one pair of them per verifier *family* (e.g. ``tiny``)::

    specdiff-verifier-<family>  a version per verifier build. Tags: specdiff.digest (sha256 over config + weights,
                                the digest the distillation job records), specdiff.tokenizer_digest, specdiff.source
    specdiff-drafter-<family>   a version per aligned drafter, tied to exactly ONE verifier version by its tags:
                                specdiff.models.verifier.{model,version,digest}, specdiff.training.config_digest,
                                specdiff.teacher.data_digest, and its held-out evaluation specdiff.eval.*
    alias ``production``        on the drafter model: the served pair (its verifier = the version in its tags);
                                mirrored on the verifier model for the UI. Serving reads only the drafter alias.

Both kinds are pyfunc models (``DrafterModel``, ``VerifierModel``; weights as artifacts, not torch.export), so
``mlflow.pyfunc.load_model("models:/specdiff-drafter-tiny@production")`` works; ``Registry.resolve_pair`` gives
local folders for the engine instead, after checking the verifier digest.

Measuring a pair is not the registry's job: it records the ``EvalResult`` it is handed (``register_drafter(...,
evaluation=...)``) or asks its injected ``PairEvaluator`` for one. ``specdiff.lifecycle.evaluate.Registry`` is this
class with the held-out evaluator plugged in (what jobs, the build and re-alignment use).

Store: ``MLFLOW_TRACKING_URI`` (a server, or any store), else the embedded default: ``state_dir()/mlflow.db``
(sqlite) with artifacts in ``state_dir()/mlartifacts``.

Exactly-once re-alignment (``claim``): the only compare-and-set MLflow offers is creating an entity whose name is
unique. Tags and aliases are upserts (two writers both "win"), so a tag cannot be a lock. ``claim`` creates the
experiment ``specdiff-realign/<family>/v<version>``: the store inserts it under a UNIQUE name constraint, so of any
number of racing callers exactly one succeeds and the others get RESOURCE_ALREADY_EXISTS. The experiment then holds
the claim's state (tags) and the runs of that re-alignment (distillation, evaluation).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pydantic
import yaml

from specdiff.runtime.extras import missing_extra

try:
    import mlflow
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
except ModuleNotFoundError as err:
    raise missing_extra("registry", "specdiff.registry (the MLflow registry)", err) from err

from specdiff.lineage.evaluation import EvalResult, HeldoutSpec
from specdiff.lineage.verifier import verifier_record
from specdiff.models.sources import state_dir
from specdiff.runtime.publish import publishing

PRODUCTION = "production"
_FLUENT_LOCK = threading.RLock()  # mlflow's module-level URIs are process-wide
VERIFIER_PREFIX, DRAFTER_PREFIX = "specdiff-verifier-", "specdiff-drafter-"
REGISTRY_EXPERIMENT = "specdiff-registry"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "chat_template.jinja")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the embedded sqlite store under the state directory (created)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    state_dir().mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{state_dir() / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """Artifact root for new experiments: next to a local sqlite file (``mlartifacts/``; the embedded default's is
    ``state_dir()/mlartifacts``). None for a server, which decides itself."""
    if uri.startswith("sqlite:///"):
        return str(Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts")
    return None


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """Id of experiment ``name``, created (with its artifacts under ``artifact_root``) when missing."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    root = artifact_root(uri)
    try:
        return client.create_experiment(name, artifact_location=f"{root}/{_slug(name)}" if root else None)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id  # created meanwhile by another process


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def sha256_files(paths) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(p) for p in paths):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return "sha256:" + h.hexdigest()


def tokenizer_digest(folder: str | Path) -> str:
    files = [Path(folder) / n for n in TOKENIZER_FILES if (Path(folder) / n).is_file()]
    return sha256_files(files) if files else "none"


def config_digests(config: dict) -> tuple[str, str]:
    """(training config digest, teacher data digest) of a distillation config (``DistillConfig.model_dump``).

    Config: everything that shapes the drafter (not run/ray/tracking bookkeeping, not the verifier's path).
    Teacher data: the prompt (or trajectory) files, the teacher section and the seed; with the verifier digest
    (a tag of its own) they determine the teacher trajectories."""
    shaping = {k: v for k, v in config.items() if k not in ("run", "ray", "tracking", "fault")}
    shaping["verifier"] = {k: v for k, v in config["verifier"].items() if k != "path"}
    shaping["data"] = {k: v for k, v in config["data"].items() if k not in ("prompts", "heldout", "trajectories")}
    cfg = "sha256:" + hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()
    data = config["data"]
    source = Path(data["trajectories"] or data["prompts"])
    files = sorted(source.rglob("*")) if source.is_dir() else [source]
    h = hashlib.sha256(sha256_files(f for f in files if f.is_file()).encode())
    h.update(json.dumps({"teacher": config["teacher"], "seed": config["run"]["seed"]}, sort_keys=True).encode())
    return cfg, "sha256:" + h.hexdigest()


class DraftRequest(pydantic.BaseModel):
    prefix_ids: list[int]
    gamma: int = 8


class GenerateRequest(pydantic.BaseModel):
    prompt_ids: list[int]
    max_new_tokens: int = 16


class DrafterModel(mlflow.pyfunc.PythonModel):
    """pyfunc of a drafter folder (``save_drafter``): ``[{"prefix_ids": [...], "gamma": 8}, ...]`` -> the argmax
    window of each (its signature comes from the type hints)."""

    def load_context(self, context):
        from specdiff.models.drafter import load_drafter
        from specdiff.models.feature_drafter import is_feature_drafter

        if is_feature_drafter(context.artifacts["drafter"]):
            # It reads its verifier's hidden states: load the pair with Registry.resolve_pair instead.
            raise ValueError("a feature drafter cannot run alone as a pyfunc; load the pair with "
                             "specdiff.registry.Registry().resolve_pair(uri) and specdiff.load_drafter(dir, "
                             "verifier=...)")
        self.drafter = load_drafter(context.artifacts["drafter"])

    def predict(self, context, model_input: list[DraftRequest], params: dict | None = None) -> list[list[int]]:
        return [self.drafter.propose(r.prefix_ids, r.gamma).argmax(-1).tolist() for r in model_input]


class VerifierModel(mlflow.pyfunc.PythonModel):
    """pyfunc of a verifier folder (Hugging Face causal LM): ``[{"prompt_ids": [...], "max_new_tokens": 16}]`` ->
    the greedy continuation of each."""

    def load_context(self, context):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(context.artifacts["verifier"]).eval()

    def predict(self, context, model_input: list[GenerateRequest], params: dict | None = None) -> list[list[int]]:
        from specdiff.core.config import SamplingParams
        from specdiff.core.engine import generate_plain
        from specdiff.models.verifier import HFVerifier

        verifier = HFVerifier(self.model)
        return [generate_plain(verifier, r.prompt_ids, max_new_tokens=r.max_new_tokens,
                               sampling=SamplingParams(temperature=0)).tokens for r in model_input]


def _requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{p}=={version(p)}" for p in ("torch", "transformers", "safetensors", "mlflow")]


class PairEvaluator(Protocol):
    """Measures a drafter folder against a verifier folder on a held-out spec, and draws the result (a PNG at
    ``path``, returned). ``specdiff.lifecycle.evaluate.HeldoutEvaluator`` is the platform's."""

    def evaluate(self, drafter_dir: Path, verifier_dir: Path, spec: HeldoutSpec) -> EvalResult: ...

    def plot(self, result: EvalResult, path: str, label: str) -> str: ...


@dataclass(frozen=True)
class Pair:
    """A registered drafter version, the verifier version it is aligned to, and local copies of both."""

    drafter: ModelVersion
    verifier: ModelVersion
    drafter_dir: Path
    verifier_dir: Path

    @property
    def label(self) -> str:
        return f"{self.drafter.name}/{self.drafter.version} + {self.verifier.name}/{self.verifier.version}"


class Registry:
    """Pairs in one MLflow store (``uri``; default ``tracking_uri()``). ``evaluator`` measures a pair where no figure
    is handed in (``register_drafter``) or none was measured on the spec asked for (``tau``, ``promote``)."""

    def __init__(self, uri: str | None = None, evaluator: PairEvaluator | None = None):
        self.uri = uri or tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        self.evaluator = evaluator

    def _measure(self, drafter_dir: Path, verifier_dir: Path, spec: HeldoutSpec) -> EvalResult:
        if self.evaluator is None:
            raise ValueError("this Registry has no evaluator to measure the pair on the held-out spec: pass "
                             "evaluation=... to register_drafter, or use specdiff.lifecycle.evaluate.Registry "
                             "(the registry with the held-out evaluator)")
        return self.evaluator.evaluate(Path(drafter_dir), Path(verifier_dir), spec)

    @contextlib.contextmanager
    def _fluent(self):
        """mlflow's module-level API (start_run, log_model, download_artifacts) pointed at this store, then put
        back exactly as it was: set_tracking_uri/set_registry_uri also export MLFLOW_*_URI to the environment, and
        restoring through them would pin a registry URI that was only a default."""
        from mlflow.tracking._model_registry import utils as registry_utils
        from mlflow.tracking._tracking_service import utils as tracking_utils

        env = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
        with _FLUENT_LOCK:
            saved = (tracking_utils._tracking_uri, registry_utils._registry_uri, [os.environ.get(k) for k in env])
            mlflow.set_tracking_uri(self.uri)
            mlflow.set_registry_uri(self.uri)
            try:
                yield
            finally:
                tracking_utils._tracking_uri, registry_utils._registry_uri = saved[0], saved[1]
                for key, value in zip(env, saved[2]):
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value

    # -- names and look-ups ------------------------------------------------------------------------------------

    def _model(self, name: str, role: str, family: str) -> None:
        try:
            self.client.create_registered_model(name, tags={"specdiff.role": role, "specdiff.family": family})
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

    def versions(self, name: str) -> list[ModelVersion]:
        """Versions of a registered model, oldest first; a clear error for an unknown name."""
        try:
            self.client.get_registered_model(name)
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            known = sorted(m.name for m in self.client.search_registered_models())
            raise ValueError(f"registered model {name!r} does not exist in {self.uri} (registered: {known})") from None
        found = self.client.search_model_versions(f"name = '{name}'")
        return sorted(found, key=lambda v: int(v.version))

    def get(self, model_uri: str) -> ModelVersion:
        """``models:/<name>@<alias>`` or ``models:/<name>/<version>`` -> the model version; errors name the model,
        alias or version that is missing."""
        if not model_uri.startswith("models:/"):
            raise ValueError(f"model URI must look like models:/<name>@<alias> or models:/<name>/<version>, "
                             f"got {model_uri!r}")
        body = model_uri.removeprefix("models:/")
        name, sep, alias = body.partition("@")
        if not sep:
            name, _, version = body.partition("/")
        versions = self.versions(name)  # raises for an unknown name
        if sep:
            try:
                return self.client.get_model_version_by_alias(name, alias)
            except MlflowException:
                aliases = sorted(self.client.get_registered_model(name).aliases)
                raise ValueError(f"registered model {name!r} has no alias {alias!r} (aliases: {aliases}); "
                                 f"promote a version first (jobs/registry.py promote)") from None
        match = [v for v in versions if str(v.version) == version]
        if not match:
            raise ValueError(f"registered model {name!r} has no version {version!r} "
                             f"(versions: {[v.version for v in versions]})")
        return match[0]

    def production(self, family: str) -> ModelVersion | None:
        """The production drafter version of a family, or None when nothing is promoted yet."""
        try:
            return self.client.get_model_version_by_alias(DRAFTER_PREFIX + family, PRODUCTION)
        except MlflowException as err:
            if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise

    def tagged(self, name: str, tag: str, value: str) -> list[ModelVersion]:
        """Versions of ``name`` whose tag ``tag`` is ``value``, oldest first; none when the model does not exist yet."""
        if not self.client.search_registered_models(f"name = '{name}'"):
            return []
        return [v for v in self.versions(name) if v.tags.get(tag) == value]

    def aligned(self, family: str, verifier_version: str) -> list[ModelVersion]:
        """Drafter versions distilled against exactly this verifier version."""
        return self.tagged(DRAFTER_PREFIX + family, "specdiff.models.verifier.version", str(verifier_version))

    def local_dir(self, version: ModelVersion) -> Path:
        """The weights folder of a model version, downloaded once into the state directory (versions are
        immutable, so the copy is reused)."""
        role = "drafter" if version.name.startswith(DRAFTER_PREFIX) else "verifier"
        store = hashlib.sha256(self.uri.encode()).hexdigest()[:10]
        target = state_dir() / "registry" / store / version.name / str(version.version)
        if not target.is_dir():
            # Concurrent replicas never see half a download; where two download at once, the first copy stays.
            with publishing(target) as partial, self._fluent():
                partial.mkdir()
                mlflow.artifacts.download_artifacts(model_uri(version), dst_path=str(partial))
        mlmodel = yaml.safe_load((target / "MLmodel").read_text())
        return target / mlmodel["flavors"]["python_function"]["artifacts"][role]["path"]

    # -- registration -------------------------------------------------------------------------------------------

    def register_verifier(self, family: str, path: str | Path, *, source: str | None = None) -> ModelVersion:
        """A new version of ``specdiff-verifier-<family>`` holding the folder's weights (and tokenizer)."""
        name = VERIFIER_PREFIX + family
        record = verifier_record(path, name)
        tags = {"specdiff.role": "verifier", "specdiff.digest": record.digest,
                "specdiff.tokenizer_digest": tokenizer_digest(path),
                "specdiff.source": source or str(Path(path).resolve())}
        self._model(name, "verifier", family)
        return self._log(name, "verifier", VerifierModel(), {"verifier": str(path)}, tags,
                         run_name=f"verifier-{family}")

    def register_drafter(self, family: str, drafter_dir: str | Path, verifier: ModelVersion, spec: HeldoutSpec, *,
                         evaluation: EvalResult | None = None, config_digest: str | None = None,
                         data_digest: str | None = None, experiment: str = REGISTRY_EXPERIMENT,
                         tags: dict | None = None) -> ModelVersion:
        """A new version of ``specdiff-drafter-<family>`` aligned to ``verifier``, with its held-out figures on
        ``spec``: ``evaluation`` when given (measured on ``spec`` by the caller), else measured by the evaluator.
        τ, α_j and expected streak go to a run (metrics, α plot when the evaluator draws one) and to the version's
        tags.

        The drafter's own record (``specdiff_drafter.json``, written by the distillation job) must name the same
        verifier digest: a drafter is aligned only to the verifier it was distilled against."""
        from specdiff.models.drafter import drafter_meta

        meta = drafter_meta(drafter_dir)
        recorded = (meta.get("verifier") or {}).get("digest")
        digest = verifier.tags["specdiff.digest"]
        if recorded != digest:
            raise ValueError(f"drafter {str(drafter_dir)!r} was distilled against verifier digest {recorded}, not "
                             f"{verifier.name}/{verifier.version} ({digest}); distill it against that verifier")
        if config_digest is None:  # registered by hand: the training record stands in for the config
            config_digest = "sha256:" + hashlib.sha256(
                json.dumps(meta.get("training"), sort_keys=True).encode()).hexdigest()
        result = evaluation if evaluation is not None else self._measure(drafter_dir, self.local_dir(verifier), spec)
        tau = 1 + result.expected_streak
        version_tags = {
            "specdiff.role": "drafter",
            "specdiff.models.verifier.model": verifier.name, "specdiff.models.verifier.version": str(verifier.version),
            "specdiff.models.verifier.digest": digest,
            "specdiff.training.config_digest": config_digest, "specdiff.teacher.data_digest": data_digest or "unknown",
            "specdiff.eval.tau": f"{tau:.6f}", "specdiff.eval.expected_streak": f"{result.expected_streak:.6f}",
            "specdiff.eval.alpha": json.dumps([round(a, 6) for a in result.alpha]),
            "specdiff.eval.spec_digest": spec.digest(), "specdiff.eval.windows": str(result.windows),
            "specdiff.models.drafter.kind": meta.get("kind", "diffusion"),
            **(tags or {}),
        }
        if meta.get("kind") == "feature":  # it reads these verifier layers: re-alignment must keep or retrain them
            version_tags["specdiff.models.drafter.tap_layers"] = json.dumps(meta["config"]["target_layer_ids"])
        self._model(DRAFTER_PREFIX + family, "drafter", family)

        def log_eval():
            mlflow.log_metrics({"tau": tau, "expected_streak": result.expected_streak,
                                **{f"alpha_{j + 1}": a for j, a in enumerate(result.alpha)}})
            for j, a in enumerate(result.alpha):  # one series, step = position: the UI charts α against j
                mlflow.log_metric("alpha_by_position", a, step=j + 1)
            if self.evaluator is None:
                return
            with tempfile.TemporaryDirectory() as tmp:
                plot = self.evaluator.plot(result, os.path.join(tmp, "alpha_per_position.png"),
                                           label=f"held-out, verifier v{verifier.version}, tau {tau:.3f}")
                mlflow.log_artifact(plot, "plots")

        return self._log(DRAFTER_PREFIX + family, "drafter", DrafterModel(), {"drafter": str(drafter_dir)},
                         version_tags,
                         run_name=f"drafter-{family}-for-v{verifier.version}", experiment=experiment,
                         before=log_eval)

    def _log(self, name: str, role: str, model, artifacts: dict, tags: dict, *, run_name: str,
             experiment: str = REGISTRY_EXPERIMENT, before=None) -> ModelVersion:
        """One run: params/metrics, the pyfunc model, and a registered version carrying ``tags`` from creation."""
        experiment_id = ensure_experiment(self.client, experiment, self.uri)
        with self._fluent(), mlflow.start_run(experiment_id=experiment_id, run_name=run_name):
            mlflow.log_params({k.removeprefix("specdiff."): v[:6000] for k, v in tags.items()})
            if before is not None:
                before()
            with warnings.catch_warnings():  # no input example on purpose: MLflow would load the model to run it
                warnings.filterwarnings("ignore", message=".*input example was not provided.*")
                info = mlflow.pyfunc.log_model(name=role, python_model=model, artifacts=artifacts,
                                               pip_requirements=_requirements())
            created = mlflow.register_model(info.model_uri, name, tags=tags)
        return self.client.get_model_version(name, str(created.version))

    # -- promotion ----------------------------------------------------------------------------------------------

    def tau(self, drafter: ModelVersion, spec: HeldoutSpec) -> float:
        """The pair's τ on ``spec``: the registered figure when it was measured on the same test, else measured by
        the evaluator."""
        if drafter.tags.get("specdiff.eval.spec_digest") == spec.digest():
            return float(drafter.tags["specdiff.eval.tau"])
        pair = self.resolve_pair(model_uri(drafter))
        return 1 + self._measure(pair.drafter_dir, pair.verifier_dir, spec).expected_streak

    def promote(self, family: str, candidate: ModelVersion, spec: HeldoutSpec, *, force: bool = False) -> tuple[bool, str]:
        """Point ``production`` at ``candidate`` if its τ is at least the production pair's on ``spec`` (or with
        ``force``); either way the reason is written to the candidate's ``specdiff.promotion`` tag."""
        current = self.production(family)
        new = self.tau(candidate, spec)
        if current is None or str(current.version) == str(candidate.version):
            ok, reason = True, f"promoted: tau {new:.4f}; no production pair before"
        else:
            old = self.tau(current, spec)
            ok = force or new >= old
            verdict = "promoted" if ok else "not promoted"
            sign = ">=" if new >= old else "<"
            reason = (f"{verdict}: tau {new:.4f} {sign} {old:.4f} of production {current.name}/{current.version} "
                      f"on held-out {spec.digest()[:19]}{' (forced)' if force and new < old else ''}")
        self.client.set_model_version_tag(candidate.name, candidate.version, "specdiff.promotion", reason)
        if ok:
            self.client.set_registered_model_alias(candidate.name, PRODUCTION, candidate.version)
            self.client.set_registered_model_alias(candidate.tags["specdiff.models.verifier.model"], PRODUCTION,
                                                   candidate.tags["specdiff.models.verifier.version"])
        return ok, reason

    # -- serving ------------------------------------------------------------------------------------------------

    def resolve_pair(self, drafter_uri: str, verifier_dir: str | Path | None = None) -> Pair:
        """A registered drafter (``models:/specdiff-drafter-<family>@production`` or ``/<version>``) and the
        verifier version it is aligned to, as local folders. ``verifier_dir`` overrides the verifier folder; its
        digest (like the downloaded one's) must be the one the drafter was distilled against."""
        drafter = self.get(drafter_uri)
        if "specdiff.models.verifier.model" not in drafter.tags:
            raise ValueError(f"{drafter_uri} ({drafter.name}/{drafter.version}) has no specdiff.models.verifier.* tags; "
                             "register drafters with Registry.register_drafter")
        verifier = self.get(f"models:/{drafter.tags['specdiff.models.verifier.model']}/"
                            f"{drafter.tags['specdiff.models.verifier.version']}")
        folder = Path(verifier_dir) if verifier_dir is not None else self.local_dir(verifier)
        expected, actual = drafter.tags["specdiff.models.verifier.digest"], verifier_record(folder).digest
        if actual != expected:
            raise ValueError(
                f"verifier digest mismatch: drafter {drafter.name}/{drafter.version} is aligned to "
                f"{verifier.name}/{verifier.version} with digest {expected}, but the verifier at {str(folder)!r} "
                f"has digest {actual}")
        return Pair(drafter, verifier, self.local_dir(drafter), folder)

    # -- re-alignment claims --------------------------------------------------------------------------------------

    def claim(self, family: str, verifier_version: str, owner: str) -> str | None:
        """Claim the re-alignment of one verifier version: the claim experiment's id for exactly one caller, None
        for every other (see the module docstring for why a uniquely named creation is the compare-and-set)."""
        name = claim_name(family, verifier_version)
        root = artifact_root(self.uri)
        try:
            return self.client.create_experiment(
                name, artifact_location=f"{root}/{_slug(name)}" if root else None,
                tags={"specdiff.claim.owner": owner, "specdiff.claim.time": f"{time.time():.0f}",
                      "specdiff.lifecycle.realign.status": "claimed"})
        except MlflowException as err:
            if err.error_code == "RESOURCE_ALREADY_EXISTS":
                return None
            raise

    def claim_state(self, family: str, verifier_version: str) -> dict | None:
        """Tags of a version's claim experiment (None when unclaimed)."""
        found = self.client.get_experiment_by_name(claim_name(family, verifier_version))
        return None if found is None else dict(found.tags)

    def record(self, family: str, verifier_version: str, **tags) -> None:
        """State of a re-alignment: on its claim experiment and, for the UI, on the verifier version."""
        found = self.client.get_experiment_by_name(claim_name(family, verifier_version))
        for key, value in tags.items():
            self.client.set_experiment_tag(found.experiment_id, f"specdiff.lifecycle.realign.{key}", str(value))
            self.client.set_model_version_tag(VERIFIER_PREFIX + family, verifier_version, f"specdiff.lifecycle.realign.{key}",
                                              str(value)[:5000])


def model_uri(version: ModelVersion) -> str:
    """``models:/<name>/<version>`` of a model version."""
    return f"models:/{version.name}/{version.version}"


def claim_name(family: str, verifier_version: str) -> str:
    return f"specdiff-realign/{family}/v{verifier_version}"
