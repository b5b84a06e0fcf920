"""Experiment tracking behind one small interface: ``NullTracker`` (tests, other ranks) and ``MLflowTracker``."""

from __future__ import annotations

from typing import Protocol


class Tracker(Protocol):
    run_id: str | None

    def log_params(self, params: dict) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: str, folder: str | None = None) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Same signatures, does nothing."""

    run_id = None

    def log_params(self, params: dict) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: str, folder: str | None = None) -> None:
        pass

    def finish(self, status: str = "FINISHED") -> None:
        pass


class MLflowTracker:
    """One MLflow run; ``run_id`` continues an earlier run (a resumed training run logs into the same one)."""

    def __init__(self, tracking_uri: str, experiment: str, run_name: str, *, run_id: str | None = None,
                 artifact_location: str | None = None):
        from specdiff.runtime.extras import require

        require("registry", "tracking.backend=mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            experiment_id = self.client.create_experiment(experiment, artifact_location=artifact_location)
        else:
            experiment_id = found.experiment_id
        if run_id is None:
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        flat = [Param(k, str(v)[:6000]) for k, v in _flatten(params).items()]
        for i in range(0, len(flat), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(self.run_id, params=flat[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_artifact(self, path: str, folder: str | None = None) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path=folder)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def make_tracker(tracking, run_name: str, run_id: str | None = None) -> Tracker:
    """From the config's ``tracking`` section."""
    if tracking.backend == "none":
        return NullTracker()
    return MLflowTracker(tracking.tracking_uri, tracking.experiment, run_name, run_id=run_id,
                         artifact_location=tracking.artifact_location)
