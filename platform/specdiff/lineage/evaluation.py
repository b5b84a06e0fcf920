"""What a held-out evaluation of a drafter–verifier pair is run on (``HeldoutSpec``) and what it found
(``EvalResult``): plain data, standard library only.

The training job measures its drafter with these, the registry records them on a drafter version, and a promotion
compares two pairs only on the same spec (equal digests). Measuring is done above (``specdiff.distill.evaluate``,
``specdiff.lifecycle.evaluate``); nothing here loads a model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class EvalResult:
    expected_streak: float  # mean over held-out windows of the selected candidate's expected accepted tokens
    alpha: list[float]  # [γ] P(position j accepted | reached)
    windows: int
    cut: int = 0  # windows whose greedy continuation left the trajectory before the streak ended (teacher_forced_eval)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}expected_streak": self.expected_streak, f"{prefix}tau": 1 + self.expected_streak}
        out.update({f"{prefix}alpha_{j + 1}": a for j, a in enumerate(self.alpha)})
        return out


@dataclass(frozen=True)
class HeldoutSpec:
    """The held-out test a drafter–verifier pair is measured on; both sides of a promotion use the same one.

    Each prompt (``prompt_ids`` rows of a .jsonl file) is completed by the pair's own verifier (``max_new_tokens``
    tokens at ``temperature`` / ``top_p``, seeded), windows are cut at ``offsets``, and the drafter's argmax window
    is scored as in ``specdiff.distill.evaluate.evaluate_drafter``. τ = 1 + expected streak (tokens per verifier call
    under greedy acceptance, bonus/recovered token included)."""

    prompts: str
    gamma: int = 8
    offsets: tuple[int, ...] = (0, 8)
    max_new_tokens: int = 32
    temperature: float = 0.5
    top_p: float = 0.95
    seed: int = 0

    @classmethod
    def from_config(cls, cfg, prompts: str | None = None) -> HeldoutSpec:
        """The test a distillation config (``DistillConfig``) implies: its held-out prompts, γ, eval offsets,
        teacher and seed."""
        t = cfg.teacher
        return cls(prompts=prompts or cfg.data.heldout, gamma=cfg.objective.gamma, offsets=tuple(cfg.eval.offsets),
                   max_new_tokens=t.max_new_tokens, temperature=t.temperature, top_p=t.top_p, seed=cfg.run.seed)

    def digest(self) -> str:
        """sha256 over the prompt file's bytes and every other field: equal digests = the same test."""
        h = hashlib.sha256(Path(self.prompts).read_bytes())
        h.update(json.dumps({k: v for k, v in asdict(self).items() if k != "prompts"}, sort_keys=True).encode())
        return "sha256:" + h.hexdigest()


def read_prompt_ids(path: str) -> list[list[int]]:
    """``prompt_ids`` rows of a .jsonl file (the format of jobs/make_tiny.py and data.heldout)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows or any("prompt_ids" not in r or not r["prompt_ids"] for r in rows):
        raise ValueError(f"held-out prompts must be non-empty 'prompt_ids' rows of a .jsonl file, got {path!r}")
    return [list(map(int, r["prompt_ids"])) for r in rows]
