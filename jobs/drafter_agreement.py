"""How well drafters predict the verifier's own continuation, position by position (teacher-forced, no decoding).

    python jobs/drafter_agreement.py                       # the drafters built by jobs/build_drafter.py --ablations
    python jobs/drafter_agreement.py --drafter mine=path/to/drafter --gamma 8 --rows 16

For every held-out trajectory (prompt + the verifier's greedy completion, as written by jobs/build_drafter.py) and
every ``--stride``-th offset into the completion, a diffusion drafter proposes a window of γ marginals after the
prefix; position j counts as a hit when argmax q_j is the verifier's token. An AR drafter (``--ar``) is scored on its
next-token prediction at every completion position. This separates drafter quality from everything a decode adds
(tree size, verifier time, sampling), which is what the smollm2-bench study used it for (docs/studies.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from specdiff.models.drafter import load_drafter
from specdiff.models.sources import state_dir


def diffusion_agreement(drafter, rows: list[dict], gamma: int, stride: int) -> list[float]:
    hits, windows = torch.zeros(gamma), 0
    for row in rows:
        prompt, completion = row["prompt_ids"], row["completion_ids"]
        for offset in range(0, len(completion) - gamma + 1, stride):
            q = drafter.propose(prompt + completion[:offset], gamma)  # [γ, V]
            hits += (q.argmax(-1) == torch.tensor(completion[offset : offset + gamma])).float()
            windows += 1
    return (hits / max(windows, 1)).tolist()


@torch.no_grad()
def ar_agreement(model, rows: list[dict]) -> float:
    hits = total = 0
    for row in rows:
        ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
        start = len(row["prompt_ids"])
        predicted = model(ids).logits[0, start - 1 : -1].argmax(-1)
        hits += int((predicted == ids[0, start:]).sum())
        total += len(row["completion_ids"])
    return hits / max(total, 1)


def main(argv: list[str] | None = None) -> int:
    home = state_dir()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", action="append", metavar="NAME=DIR",
                        help="a diffusion drafter folder (repeat); default: the built default and ablations")
    parser.add_argument("--ar", default=str(home / "drafters" / "smollm2-ar"),
                        help="an AR drafter folder ('' to skip)")
    parser.add_argument("--heldout", default=str(home / "build" / "smollm2" / "heldout.jsonl"),
                        help="jsonl with prompt_ids and completion_ids")
    parser.add_argument("--rows", type=int, default=12, help="held-out trajectories used")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--stride", type=int, default=4, help="offsets into each completion, this far apart")
    args = parser.parse_args(argv)

    heldout = Path(args.heldout)
    if not heldout.is_file():
        print(f"error: no held-out trajectories at {heldout}; run `python jobs/build_drafter.py` first or pass "
              "--heldout", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in heldout.open() if line.strip()][: args.rows]
    if not all("completion_ids" in r for r in rows):
        print(f"error: {heldout} has rows without completion_ids (the verifier's continuation)", file=sys.stderr)
        return 1
    if args.drafter:
        drafters = dict(item.split("=", 1) for item in args.drafter)
    else:
        built = {"streak": "default", "unaligned": "smollm2-mdm", "ar_distill": "smollm2-ar_distill",
                 "naive": "smollm2-naive"}
        drafters = {k: str(home / "drafters" / v) for k, v in built.items() if (home / "drafters" / v).is_dir()}
    torch.manual_seed(0)
    print(f"| drafter | {' | '.join(f'q_{j + 1}' for j in range(args.gamma))} |")
    print(f"|---|{'---|' * args.gamma}")
    for name, folder in drafters.items():
        agreement = diffusion_agreement(load_drafter(folder, dtype=torch.float32), rows, args.gamma, args.stride)
        print(f"| {name} | {' | '.join(f'{a:.3f}' for a in agreement)} |", flush=True)
    if args.ar:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.ar, dtype=torch.float32).eval()
        print(f"| AR drafter, next token | {ar_agreement(model, rows):.3f} |{' |' * (args.gamma - 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
