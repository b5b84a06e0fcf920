"""Streak-distillation on Ray: teacher trajectories (Ray Data) -> a Ray Train job -> an aligned drafter.

Ray and MLflow are imported lazily, inside the functions that need them; the objectives live in
``specdiff.core.objectives`` (pure torch).
"""

from specdiff.distill.config import DistillConfig, load_config, parse_config
from specdiff.distill.job import DistillSummary, run

__all__ = ["DistillConfig", "DistillSummary", "load_config", "parse_config", "run"]
