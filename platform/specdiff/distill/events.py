"""Progress of a distillation run as typed events, for a program that drives it (the build, a notebook, a UI).

Every line the job prints for people is one of these events rendered by ``line()``, so the printed log and the
events never disagree. A caller passes ``specdiff.distill.run(cfg, on_event=...)`` a callable; the driver's own events
go straight to it, and those of the Ray workers (the teacher actors, rank 0 of the training loop) travel through a
small relay actor that the driver drains while the job runs. The caller renders them (a progress bar, log lines); no
stage reads another's printed text.

    from specdiff.distill import load_config, run
    from specdiff.distill.events import TrainStep

    def show(event):
        if isinstance(event, TrainStep):
            print(event.step, event.planned, event.loss)

    run(load_config("tiny"), on_event=show)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Union


@dataclass(frozen=True)
class Note:
    """A line for people that no program needs to act on (the verifier's record, the dtype, the data counts...)."""

    text: str

    def line(self) -> str:
        return self.text


@dataclass(frozen=True)
class TeacherSampled:
    """One teacher actor sampled a batch of ``count`` trajectories (``actor_total`` by that actor so far)."""

    count: int
    actor_total: int
    engine: str

    def line(self) -> str:
        return f"[teacher] {self.count} trajectories sampled ({self.actor_total} by this actor, {self.engine})"


@dataclass(frozen=True)
class TeacherBudgetSpent:
    """A teacher actor reached ``teacher.time_budget_s``: it skips the prompts that remain."""

    actor_total: int

    def line(self) -> str:
        return (f"[teacher] time budget spent: prompts skipped from here on ({self.actor_total} sampled by this "
                "actor)")


@dataclass(frozen=True)
class TrainStep:
    """Rank 0's training metrics at ``step`` of ``planned`` (fewer than ``train.steps`` under a time budget)."""

    step: int
    planned: int
    loss: float
    lr: float
    step_s: float
    data_wait_s: float

    def line(self) -> str:
        return (f"[distill] step {self.step}/{self.planned} loss {self.loss:.4f} lr {self.lr:.2e} {self.step_s:.3f}s/step "
                f"(waiting for data {self.data_wait_s:.3f}s)")


@dataclass(frozen=True)
class Evaluated:
    """The held-out test at ``step``: expected streak and α per position."""

    step: int
    expected_streak: float
    alpha: tuple[float, ...]
    seconds: float
    how: str

    def line(self) -> str:
        return (f"[distill] eval step {self.step}: expected streak {self.expected_streak:.3f} "
                f"alpha {[round(a, 3) for a in self.alpha]} ({self.seconds:.1f}s, {self.how})")


Event = Union[Note, TeacherSampled, TeacherBudgetSpent, TrainStep, Evaluated]
Sink = Callable[[Event], None]


def print_event(event: Event) -> None:
    """The default sink: the event's line on stdout (what `ray job submit` and a terminal show)."""
    print(event.line(), flush=True)


class Emitter:
    """What the job's code calls to report: prints the line (``echo``) and forwards the event to ``relay`` (a
    ``Relay`` actor handle, on a worker) or ``sink`` (on the driver). Picklable when it holds a relay or nothing, so
    it travels to the workers."""

    def __init__(self, *, sink: Sink | None = None, relay=None, echo: bool = True):
        self.sink, self.relay, self.echo = sink, relay, echo

    def __call__(self, event: Event) -> None:
        if self.echo:
            print_event(event)
        if self.sink is not None:
            self.sink(event)
        if self.relay is not None:
            self.relay.push.remote(event)  # fire and forget: a worker never waits for the driver

    def for_workers(self) -> "Emitter":
        """The emitter a worker uses: its lines go to its own log, its events to the relay."""
        return Emitter(relay=self.relay, echo=True)


class Relay:
    """A Ray actor (``num_cpus=0``: it must not take a CPU from the teacher or the training workers) that holds the
    workers' events until the driver drains them."""

    def __init__(self):
        self.events: list = []

    def push(self, event) -> None:
        self.events.append(event)

    def drain(self) -> list:
        out, self.events = self.events, []
        return out


class Pump:
    """Starts a ``Relay`` and, until ``close()``, a thread that delivers its events to ``sink`` in arrival order
    (every ``period_s``; the sink is called from that thread, one event at a time)."""

    def __init__(self, sink: Sink, period_s: float = 0.25):
        import ray

        self.sink, self.period_s = sink, period_s
        self.relay = ray.remote(num_cpus=0)(Relay).remote()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specdiff-distill-events", daemon=True)
        self._thread.start()

    def _deliver(self) -> None:
        import ray

        for event in ray.get(self.relay.drain.remote()):
            self.sink(event)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._deliver()

    def close(self) -> None:
        """Stop the thread, deliver what is left, end the relay."""
        import ray

        self._stop.set()
        self._thread.join()
        self._deliver()
        ray.kill(self.relay)


__all__ = ["Emitter", "Evaluated", "Event", "Note", "Pump", "Relay", "Sink", "TeacherBudgetSpent", "TeacherSampled",
           "TrainStep", "print_event"]
