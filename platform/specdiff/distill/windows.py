"""Training windows cut from teacher trajectories (pure torch; no Ray).

A window at offset o of completion x: prefix ``prompt ∥ x_<o`` (bounded like the drafter bounds it at inference),
labels x_o..x_{o+γ-1}, and the teacher's top-k log-probs at position o (for AR-distill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specdiff.models.drafter import bound_prefixes


@dataclass(frozen=True)
class WindowBatch:
    prefixes: list[list[int]]  # B prefixes of any length
    labels: torch.Tensor  # [B, γ] long
    teacher_ids: torch.Tensor  # [B, k] long (k may be 0)
    teacher_logprobs: torch.Tensor  # [B, k] float32


def cut_windows(
    records: dict[str, list],
    gamma: int,
    windows_per_sample: int,
    max_context: int | None,
    generator: torch.Generator | None,
) -> WindowBatch:
    """``records``: columns ``prompt_ids``, ``completion_ids``, ``topk_ids``, ``topk_logprobs`` (lists, one entry per
    trajectory). Offsets are drawn uniformly from [0, len(completion) - γ], ``windows_per_sample`` per trajectory."""
    prefixes, labels, top_ids, top_lp = [], [], [], []
    for prompt, completion, ids, lps in zip(
        records["prompt_ids"], records["completion_ids"], records["topk_ids"], records["topk_logprobs"]
    ):
        room = len(completion) - gamma
        if room < 0:
            raise ValueError(f"completion has {len(completion)} tokens, fewer than gamma={gamma}")
        for o in torch.randint(room + 1, (windows_per_sample,), generator=generator).tolist():
            prefixes.append(list(prompt) + list(completion[:o]))
            labels.append(list(completion[o : o + gamma]))
            top_ids.append(list(ids[o]) if len(ids) else [])
            top_lp.append(list(lps[o]) if len(lps) else [])
    return WindowBatch(
        prefixes=bound_prefixes(prefixes, gamma, max_context),
        labels=torch.tensor(labels, dtype=torch.long),
        teacher_ids=torch.tensor(top_ids, dtype=torch.long).reshape(len(labels), -1),
        teacher_logprobs=torch.tensor(top_lp, dtype=torch.float32).reshape(len(labels), -1),
    )


def heldout_prefixes(records: Sequence[dict], offsets: Sequence[int]) -> list[list[int]]:
    """Evaluation prefixes ``prompt ∥ x_<o`` for every held-out trajectory and offset o."""
    return [list(r["prompt_ids"]) + list(r["completion_ids"][:o]) for r in records for o in offsets]
