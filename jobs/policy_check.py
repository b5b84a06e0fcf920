"""Adaptive speculation vs plain decoding on the embedded verifier with an UNTRAINED drafter (the worst case).

Decodes each prompt plain and with the adaptive defaults (``SpecConfig()``) alternately (``--repeats`` times each,
so that load from other processes hits both alike), then once at a fixed (gamma, K), and prints tok/s and the
ratios to plain, by wall time and by this process's CPU time (steadier on a shared machine; with --threads 1 it is
the work done). The adaptive decoder's one-off cost calibration runs in a warm-up decode
first and is reported separately. With a useless drafter the adaptive policy should run at ~plain speed (target
>= 0.95x), while the fixed setting shows what a bad gamma/K costs.

    python jobs/policy_check.py                       # float32, 2 prompts x 64 tokens, fixed gamma=8 K=4
    python jobs/policy_check.py --dtype bfloat16 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import time

import torch

from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, drafter_from_verifier, generate_plain
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm, parse_dtype

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=SpecConfig().max_gamma, help="the fixed setting to compare against")
    p.add_argument("--k", type=int, default=SpecConfig().max_candidates)
    p.add_argument("--repeats", type=int, default=2, help="plain/adaptive pairs per prompt")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm(DEFAULT_VERIFIER, parse_dtype(args.dtype))
    verifier = HFVerifier(model)
    drafter = drafter_from_verifier(model, 2, layers=[0, len(model.model.layers) - 1], causal_prefix=True)
    decoder = SpeculativeDecoder(drafter, verifier)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
               for p in PROMPTS]
    prompts = [list(p["input_ids"] if isinstance(p, dict) or hasattr(p, "input_ids") else p) for p in prompts]
    fixed = SpecConfig(gamma=args.gamma, num_candidates=args.k)
    n = args.max_new_tokens

    warm = decoder.generate(prompts[0], max_new_tokens=4, seed=0)  # calibrates the adaptive policy's costs
    costs = decoder.costs
    print(f"calibration {warm.stats.calibration_s:.2f} s: {costs.describe()}")
    runs = {
        "plain": lambda p: generate_plain(verifier, p, max_new_tokens=n),
        "adaptive (defaults)": lambda p: decoder.generate(p, max_new_tokens=n, seed=0),
        f"fixed gamma={args.gamma} K={args.k}": lambda p: decoder.generate(p, max_new_tokens=n, spec=fixed, seed=0),
    }
    names = list(runs)
    order = names[:2] * args.repeats + names[2:]
    totals = {name: [0, 0.0, 0.0] for name in runs}
    for i, prompt in enumerate(prompts):
        outputs = {}
        for name in order:
            run = runs[name]
            t0, c0 = time.perf_counter(), time.process_time()
            result = run(prompt)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            totals[name][0] += len(result.tokens)
            totals[name][1] += dt
            totals[name][2] += cpu
            outputs[name] = result.tokens
            extra = "" if name == "plain" else f"  tau {result.stats.tau:.2f}  {result.stats.choices}"
            tokens = len(result.tokens)
            print(f"prompt {i} {name:24s} {tokens / dt:6.2f} tok/s ({tokens / cpu:6.2f} per CPU s){extra}")
        same = all(out == outputs["plain"] for out in outputs.values())
        print(f"prompt {i} outputs equal plain greedy: {same}")
    plain_tokens, plain_s, plain_cpu = totals["plain"]
    for name, (tokens, seconds, cpu) in totals.items():
        wall, work = tokens / seconds, tokens / cpu
        print(f"total {name:24s} {wall:6.2f} tok/s  {wall / (plain_tokens / plain_s):.2f}x plain   "
              f"{work:6.2f} tok per CPU s  {work / (plain_tokens / plain_cpu):.2f}x plain")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
