"""``specdiff build``: the embedded default drafter (``specdiff.lifecycle.build``), with a progress bar per stage.

    specdiff build                      # the default drafter -> $SPECDIFF_HOME/drafters/default
    specdiff build --ablations          # + the bench's ablation drafters (objectives, standalone, AR)
    specdiff build --force              # rebuild even if a drafter is there
    specdiff build --budget-minutes 0   # the whole recipe, however long it takes (default: 15 min)
    specdiff build --register           # + register the pair in the MLflow registry, promote it to production

The bars are drawn from the build's events (``specdiff.lifecycle.build.BuildEvent``); each stage's own lines go to
its log under $SPECDIFF_HOME/build/smollm2.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from contextlib import contextmanager

FAMILY = "smollm2"


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="build the default drafter of the embedded verifier (once)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ablations", action="store_true", help="also build the bench's ablation drafters")
    p.add_argument("--force", action="store_true", help="rebuild what exists")
    p.add_argument("--budget-minutes", type=float, default=15.0,
                   help="wall-clock budget of the default drafter's build plus a first decode; a slower machine "
                   "trains fewer steps to fit it (0: the whole recipe, however long it takes; default "
                   "%(default).0f)")
    p.add_argument("--register", action="store_true",
                   help=f"register the verifier and the default drafter in the registry as family {FAMILY!r} and "
                   "promote the pair if it is at least as good as production (docs/registry.md)")
    return p


class BarRenderer:
    """BuildEvents -> one tqdm bar per stage (on stderr): steps with the loss, the teacher's trajectories and rate
    while it samples, the held-out evaluations as lines above the bar; the build's notes as lines on stdout."""

    def __init__(self):
        self.bar = None
        self.lock = threading.Lock()  # events arrive from the distillation run's relay thread too

    def __call__(self, event) -> None:
        from specdiff.distill.events import Evaluated, TeacherBudgetSpent, TeacherSampled, TrainStep
        from specdiff.lifecycle.build import BuildNote, StageFinished, StageProgress, StageStarted, teacher_progress

        with self.lock:
            if isinstance(event, BuildNote):
                self._write(event.text, sys.stdout)
            elif isinstance(event, StageStarted):
                from tqdm import tqdm

                self._close()
                self.bar = tqdm(total=None, desc=event.label, unit="step", dynamic_ncols=True)
                self.bar.set_postfix_str("starting Ray, teacher / held-out trajectories")
                self.teacher_total, self.sampled, self.began, self.training = event.teacher_total, 0, time.perf_counter(), False
            elif isinstance(event, StageFinished):
                self._close()
            elif isinstance(event, StageProgress) and self.bar is not None:
                e = event.event
                if isinstance(e, TrainStep):
                    if not self.training:  # from the first step on, rate and ETA count training steps only
                        self.training = True
                        self.bar.reset(total=e.planned)
                        self.bar.initial = e.step
                    self.bar.total, self.bar.n = e.planned, e.step
                    self.bar.set_postfix_str(f"loss {e.loss:.3f}")
                    self.bar.refresh()
                elif isinstance(e, TeacherSampled):
                    self.sampled += e.count
                    self.bar.set_postfix_str(teacher_progress(self.sampled, self.teacher_total,
                                                              time.perf_counter() - self.began))
                elif isinstance(e, TeacherBudgetSpent):
                    self.bar.set_postfix_str(f"teacher: its share of the time budget spent, {self.sampled} "
                                             "trajectories sampled")
                elif isinstance(e, Evaluated):
                    self.bar.write(f"  {event.label}: held-out expected streak {e.expected_streak:.3f} at step "
                                   f"{e.step}")

    def _write(self, text: str, stream) -> None:
        if self.bar is not None:
            self.bar.write(text, file=stream)
        else:
            print(text, file=stream, flush=True)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        with self.lock:
            self._close()


@contextmanager
def render():
    """A progress sink for ``specdiff.lifecycle.build`` that draws bars; closed on the way out."""
    renderer = BarRenderer()
    try:
        yield renderer
    finally:
        renderer.close()


def offline_env() -> None:
    """The stages' teacher and workers run in this process's local Ray: offline, no usage report (a variable the
    user set wins)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from specdiff.lifecycle.build import build_ablations, build_default, register_default

    offline_env()
    try:
        with render() as progress:
            target = build_default(force=args.force, budget_s=args.budget_minutes * 60 or None, progress=progress)
            if args.register:
                register_default(target, progress)
            if args.ablations:
                for kind, path in build_ablations(force=args.force, progress=progress).items():
                    progress.close()
                    print(f"{kind}: {path}")
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
