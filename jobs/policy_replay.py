"""Tune the adaptive speculation policy offline: record real rounds once, replay policies over them in seconds.

``record`` decodes each held-out prompt greedily and runs, at every position of its output, one real round of the
largest window (the drafter's argmax window plus the copied candidate, T=0; see ``specdiff.core.replay``), then measures
this machine's cost model (``specdiff.core.policy.calibrate``); ~6 min for 12 prompts per domain with the default
drafter on a 2-core Xeon. ``replay`` walks every decode under fixed windows, the default policy and the variants
given, and prints the speed-up over plain decoding per domain under that cost model. A variant that wins here is
then checked with ``jobs/bench.py`` (real decoding, ratios measured side by side).

    python jobs/policy_replay.py record --out rounds.json                    # the default drafter
    python jobs/policy_replay.py record --drafter untrained --out untrained.json
    python jobs/policy_replay.py replay rounds.json --variant light:prior_weight=1 --variant margin:min_gain=1.0
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

import torch

from specdiff.core.config import SpecConfig
from specdiff.core.policy import SpeculationCosts, SpeculationPolicy

DOMAINS = ("code", "math", "chat")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record one real round at every position of each prompt's greedy output")
    r.add_argument("--drafter", default=None,
                   help="drafter folder, or 'untrained' (an untrained feature drafter of the default recipe's shape); "
                   "default: the built default")
    r.add_argument("--verifier", default=None, help="default: the embedded default verifier")
    r.add_argument("--domains", default=",".join(DOMAINS))
    r.add_argument("--prompts-per-domain", type=int, default=12)
    r.add_argument("--max-new-tokens", type=int, default=96)
    r.add_argument("--gamma", type=int, default=SpecConfig().max_gamma, help="the window recorded (the largest)")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--out", required=True, help="JSON file to write")
    s = sub.add_parser("replay", help="replay fixed windows and policies over recorded rounds")
    s.add_argument("records", help="a file written by `record`")
    s.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                   help="a policy with SpeculationPolicy keywords changed, e.g. light:prior_weight=1 (repeat)")
    s.add_argument("--costs", default=None, help="a cost model JSON ({draft_s, verify_s}) instead of the recorded one")
    args = p.parse_args(argv)
    if args.command == "replay":
        try:
            args.variants = dict(parse_variant(v) for v in args.variant)
        except ValueError as e:
            p.error(f"--variant: {e}")
    return args


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, body = text.partition(":")
    if not name or not body:
        raise ValueError(f"expected NAME:KEY=VALUE[,KEY=VALUE], got {text!r}")
    params = inspect.signature(SpeculationPolicy.__init__).parameters
    known = {k: v.default for k, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY}
    out = {}
    for item in body.split(","):
        key, _, value = item.partition("=")
        if key not in known:
            raise ValueError(f"unknown policy keyword {key!r}; known: {sorted(known)}")
        try:
            out[key] = type(known[key])(value)  # ints stay ints (probe_gamma, intervals)
        except ValueError:
            raise ValueError(f"{key}={value!r}: expected a {type(known[key]).__name__}") from None
    return name, out


def record_main(args) -> int:
    from specdiff import HFVerifier, SpeculativeDecoder, load_drafter
    from specdiff.models.dtypes import resolve_dtype_with_reason
    from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm, state_dir
    from specdiff.core.policy import calibrate
    from specdiff.prompts import chat_prompt_ids, load_prompts
    from specdiff.core.replay import record

    dtype, reason = resolve_dtype_with_reason(args.dtype)
    model, tokenizer = load_causal_lm(args.verifier or DEFAULT_VERIFIER, dtype, backend="auto")
    if args.drafter == "untrained":
        from build_drafter import untrained_drafter  # jobs/ is on sys.path when this script runs

        drafter = untrained_drafter(model)
    else:
        path = Path(args.drafter) if args.drafter else state_dir() / "drafters" / "default"
        if not path.is_dir():
            sys.exit(f"no drafter at {path}: build it (python jobs/build_drafter.py) or pass --drafter DIR")
        drafter = load_drafter(path, dtype=dtype, verifier=model)
    decoder = SpeculativeDecoder(drafter, HFVerifier(model, tap_layers=getattr(drafter, "tap_layers", None)))
    stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    domains = [d for d in args.domains.split(",") if d]
    print(f"dtype: {dtype} ({reason}); recording gamma={args.gamma} rounds at every position", flush=True)
    out: dict = {"gamma": args.gamma, "dtype": str(dtype), "drafter": args.drafter or "default", "domains": {}}
    t0 = time.perf_counter()
    first = None
    for domain in domains:
        decodes = []
        for i, text in enumerate(load_prompts(domain, "eval", args.prompts_per_domain)):
            prompt = chat_prompt_ids(tokenizer, text)
            first = first or prompt
            rounds = record(decoder, prompt, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                            stop_token_ids=stops)
            decodes.append([r.to_dict() for r in rounds])
            print(f"[record] {domain} {i + 1}/{args.prompts_per_domain}: {len(rounds)} positions, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
        out["domains"][domain] = decodes
    costs = calibrate(drafter, decoder.verifier, first, args.gamma, SpecConfig().max_candidates)
    out["costs"] = costs.to_dict()
    Path(args.out).write_text(json.dumps(out))
    print(f"wrote {args.out} (cost model: {costs.describe()})")
    return 0


def replay_main(args) -> int:
    from specdiff.core.replay import RoundRecord, speedup

    data = json.loads(Path(args.records).read_text())
    costs = SpeculationCosts.from_dict(json.loads(Path(args.costs).read_text()) if args.costs else data["costs"])
    gamma = int(data["gamma"])
    decodes = {d: [[RoundRecord.from_dict(r) for r in rounds] for rounds in v] for d, v in data["domains"].items()}

    def policy(**kw):
        return lambda c: SpeculationPolicy(c, gammas=range(1, gamma + 1), ks=[1], allow_plain=True, **kw)

    rows = [(f"fixed gamma={g}", {"gamma": g}) for g in sorted({max(gamma // 2, 1), gamma})]
    rows.append(("adaptive (defaults)", {"policy": policy()}))
    rows += [(f"adaptive {name} {kw}", {"policy": policy(**kw)}) for name, kw in args.variants.items()]
    print(f"drafter {data.get('drafter')}, {data.get('dtype')}; cost model: {costs.describe()}")
    print("| policy | " + " | ".join(f"{d} speed-up (plain share)" for d in decodes) + " |")
    print("|---|" + "---|" * len(decodes))
    for label, kw in rows:
        cells = []
        for domain, ds in decodes.items():
            ratio, plain = speedup(ds, costs, **kw)
            cells.append(f"{ratio:.2f}x ({plain:.0%})")
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    return record_main(args) if args.command == "record" else replay_main(args)


if __name__ == "__main__":
    sys.exit(main())
