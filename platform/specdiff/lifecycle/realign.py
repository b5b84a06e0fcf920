"""Re-alignment: a verifier version without an aligned drafter gets one, exactly once.

    registry (MLflow)                         jobs (Ray Job Submission)
    latest verifier version, no aligned   ->  claim it (unique experiment; one winner among racing watchers)
    drafter, unclaimed                        submit `python -m specdiff distill`, warm-started from production
                                              wait; a failed job is resubmitted, at most ``max_attempts`` times
    register the new drafter (lineage     <-  SUCCEEDED: the drafter folder in ``run.output_dir``
    tags, held-out τ / α_j), promote it if τ >= the production pair's τ on the same held-out prompts

Every step is recorded as ``specdiff.lifecycle.realign.*`` tags on the claim experiment and on the verifier version, so the
MLflow UI shows where a re-alignment stands and why a drafter was or was not promoted. Each attempt's Ray
submission id is deterministic (``realign-<family>-v<version>-a<attempt>``): Ray refuses a second job with the same
id, a second guard behind the claim.

``Jobs`` is the small interface to the job system; ``RayJobs`` implements it with ``JobSubmissionClient`` (Ray is
imported there only). The registry side is ``specdiff.registry`` (MLflow only), measuring through its evaluator
(``specdiff.lifecycle.evaluate.Registry``).
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import yaml

from specdiff.distill.config import load_config
from specdiff.distill.job import absolutize
from specdiff.lineage.evaluation import HeldoutSpec
from specdiff.runtime.extras import require
from specdiff.models.sources import state_dir
from specdiff.runtime.ray_auth import auth_headers, refused_message
from specdiff.registry import VERIFIER_PREFIX, Registry, claim_name, config_digests, model_uri

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# The job's entrypoint: the package's own CLI. The package travels with the job (``py_modules``), so a cluster that
# has the dependencies but no install of specdiff (or another version of it) runs this one.
DISTILL_MODULE = "specdiff"


class Jobs(Protocol):
    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict | None) -> None: ...

    def status(self, submission_id: str) -> str: ...  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED

    def message(self, submission_id: str) -> str: ...

    def stop(self, submission_id: str) -> None: ...


class RayJobs:
    """``Jobs`` over Ray's Job Submission SDK (the dashboard address, e.g. http://127.0.0.1:8265)."""

    def __init__(self, address: str):
        require("train", "re-alignment's Ray job client", "ray", "aiohttp")
        from ray.exceptions import AuthenticationError
        from ray.job_submission import JobSubmissionClient

        try:  # the token Ray would read, sent whatever this process's RAY_AUTH_MODE (Ray sends it only for "token")
            self.client = JobSubmissionClient(address, headers=auth_headers())
        except AuthenticationError as err:
            raise ConnectionError(refused_message(address, err)) from err

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict | None) -> None:
        try:
            self.client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env)
        except RuntimeError as err:
            if "already exists" not in str(err):
                raise
            # Ray keeps submission ids unique: someone (a takeover of this claim) submitted it; wait on that job.

    def status(self, submission_id: str) -> str:
        return str(self.client.get_job_status(submission_id).value)

    def message(self, submission_id: str) -> str:
        info = self.client.get_job_info(submission_id)
        return (info.message or "") + "\n" + self.client.get_job_logs(submission_id)[-2000:]

    def stop(self, submission_id: str) -> None:
        self.client.stop_job(submission_id)


@dataclass(frozen=True)
class RealignSettings:
    family: str  # registered models specdiff-verifier-<family> / specdiff-drafter-<family>
    config: str  # base distillation config (YAML); verifier, drafter init, run and tracking are filled in
    overrides: tuple[str, ...] = ()  # --set section.key=value on top of it
    heldout: str | None = None  # held-out prompts for the promotion test; default: the config's data.heldout
    work_dir: str | None = None  # configs, drafters and checkpoints of re-alignments; default state_dir()/realign
    max_attempts: int = 2  # submissions per verifier version before it is reported failed
    poll_s: float = 5.0  # job status period
    job_timeout_s: float | None = None  # a job running longer is stopped and counts as a failed attempt
    python: str = "python"  # interpreter of the job's entrypoint on the cluster
    working_dir: str | None = None  # also uploaded, as the job's working_dir (its relative paths resolve there)
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")


@dataclass
class Outcome:
    status: str  # nothing-to-do | claimed-elsewhere | promoted | not-promoted | failed
    verifier_version: str | None = None
    drafter_version: str | None = None
    reason: str = ""
    jobs: list[str] = field(default_factory=list)


class Realigner:
    def __init__(self, registry: Registry, jobs: Jobs, settings: RealignSettings, log: Callable[[str], None] = print):
        if registry.evaluator is None:  # it registers and promotes: it must be able to measure a pair
            raise ValueError("re-alignment needs a registry that measures pairs: "
                             "specdiff.lifecycle.evaluate.Registry(uri), not specdiff.registry.Registry(uri)")
        self.registry, self.jobs, self.s, self.log = registry, jobs, settings, log
        self.work = Path(settings.work_dir or state_dir() / "realign").resolve()
        base = load_config(settings.config, list(settings.overrides), check_paths=False)
        self.spec = HeldoutSpec.from_config(base, str(Path(settings.heldout or base.data.heldout).resolve()))

    def pending(self):
        """The latest verifier version, if it has no aligned drafter and nobody claimed it; else None (why is
        logged). Older versions are superseded: they are never aligned after the fact."""
        family = self.s.family
        latest = self.registry.versions(VERIFIER_PREFIX + family)[-1]
        version = str(latest.version)
        if self.registry.aligned(family, version):
            self.log(f"[realign] {latest.name}/{version} already has an aligned drafter")
            return None
        state = self.registry.claim_state(family, version)
        if state is not None:
            self.log(f"[realign] {latest.name}/{version} is claimed by {state.get('specdiff.claim.owner')} "
                     f"(status {state.get('specdiff.lifecycle.realign.status')})")
            return None
        return latest

    def run_once(self) -> Outcome:
        verifier = self.pending()
        if verifier is None:
            return Outcome("nothing-to-do")
        version = str(verifier.version)
        if self.registry.claim(self.s.family, version, self.s.owner) is None:
            self.log(f"[realign] {verifier.name}/{version}: another watcher claimed it first")
            return Outcome("claimed-elsewhere", version)
        self.log(f"[realign] claimed {verifier.name}/{version} ({claim_name(self.s.family, version)})")
        return self.realign(verifier)

    def watch(self, interval_s: float, max_polls: int | None = None) -> None:
        """Poll forever (or ``max_polls`` times). Every version is attempted once; failures are reported, not
        looped on."""
        polls = 0
        while max_polls is None or polls < max_polls:
            try:
                outcome = self.run_once()
            except Exception as err:  # a registry or cluster hiccup: report it, poll again next period
                self.log(f"[realign] poll failed: {type(err).__name__}: {err}")
            else:
                if outcome.status != "nothing-to-do":
                    self.log(f"[realign] {outcome.status}: {outcome.reason}")
            polls += 1
            if max_polls is None or polls < max_polls:
                time.sleep(interval_s)

    # -- one claimed version ------------------------------------------------------------------------------------

    def realign(self, verifier) -> Outcome:
        family, version = self.s.family, str(verifier.version)
        warm = self.registry.production(family)
        submitted, error = [], ""
        for attempt in range(1, self.s.max_attempts + 1):
            sid = f"realign-{family}-v{version}-a{attempt}"
            config, output = self.prepare(verifier, warm, sid)
            self.registry.record(family, version, status="submitted", job=sid, attempt=attempt)
            self.jobs.submit(sid, self.entrypoint(config), self.runtime_env())
            submitted.append(sid)
            self.log(f"[realign] attempt {attempt}/{self.s.max_attempts}: submitted {sid} "
                     f"(warm start: {model_uri(warm) if warm else 'none, config drafter.init'})")
            state = self.wait(sid)
            if state == "SUCCEEDED":
                break
            error = self.jobs.message(sid).strip()[-1500:]
            self.log(f"[realign] {sid} {state}: {error[-300:]}")
            self.registry.record(family, version, status=f"attempt-{attempt}-{state.lower()}", error=error)
        else:
            reason = f"{len(submitted)} attempts failed; last: {error[-500:]}"
            self.registry.record(family, version, status="failed", error=reason)
            return Outcome("failed", version, reason=reason, jobs=submitted)

        cfg_digest, data_digest = config_digests(yaml.safe_load(config.read_text()))
        self.registry.record(family, version, status="registering")
        drafter = self.registry.register_drafter(
            family, output, verifier, self.spec, config_digest=cfg_digest, data_digest=data_digest,
            experiment=claim_name(family, version),
            tags={"specdiff.lifecycle.realign.job": submitted[-1], "specdiff.warm_start": model_uri(warm) if warm else "none"})
        self.log(f"[realign] registered {drafter.name}/{drafter.version}: tau {drafter.tags['specdiff.eval.tau']}")
        ok, reason = self.registry.promote(family, drafter, self.spec)
        self.log(f"[realign] {reason}")
        status = "promoted" if ok else "not-promoted"
        self.registry.record(family, version, status=status, drafter_version=drafter.version, promotion=reason)
        return Outcome(status, version, str(drafter.version), reason, submitted)

    def prepare(self, verifier, warm, sid: str) -> tuple[Path, Path]:
        """The job's full config (written as YAML next to its output) and its drafter output folder."""
        family, version = self.s.family, str(verifier.version)
        out = self.work / family / sid
        out.mkdir(parents=True, exist_ok=True)
        sets = [f"verifier.path={self.registry.local_dir(verifier)}", f"verifier.name={verifier.name}",
                f"verifier.version={version}", f"run.name={sid}", f"run.output_dir={out / 'drafter'}",
                f"run.storage_path={self.work / 'ray_results'}", "tracking.backend=mlflow",
                f"tracking.tracking_uri={self.registry.uri}", f"tracking.experiment={claim_name(family, version)}"]
        if warm is not None:
            sets += ["drafter.init=pretrained", f"drafter.path={self.registry.local_dir(warm)}"]
        cfg = absolutize(load_config(self.s.config, [*self.s.overrides, *sets]))
        path = out / "distill.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return path, out / "drafter"

    def entrypoint(self, config: Path) -> str:
        return f"{shlex.quote(self.s.python)} -m {DISTILL_MODULE} distill --config {shlex.quote(str(config))}"

    def runtime_env(self) -> dict:
        import specdiff

        env = {"py_modules": [str(Path(specdiff.__file__).parent)], "excludes": ["__pycache__"]}
        return {**env, "working_dir": self.s.working_dir} if self.s.working_dir else env

    def wait(self, sid: str) -> str:
        began, last = time.monotonic(), None
        while True:
            state = self.jobs.status(sid)
            if state != last:
                self.log(f"[realign] {sid}: {state}")
                last = state
            if state in TERMINAL:
                return state
            if self.s.job_timeout_s is not None and time.monotonic() - began > self.s.job_timeout_s:
                self.log(f"[realign] {sid}: running longer than {self.s.job_timeout_s:.0f}s, stopping it")
                self.jobs.stop(sid)
                return "STOPPED"
            time.sleep(self.s.poll_s)


__all__ = ["Jobs", "Outcome", "RayJobs", "RealignSettings", "Realigner"]
