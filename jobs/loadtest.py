"""Loopback load test of the Serve app: throughput and p50/p99 latency at several concurrencies, with and without
speculation, printed as a Markdown table.

    python jobs/loadtest.py                       # starts a private Ray + Serve (demo models) on 127.0.0.1:8011
    python jobs/loadtest.py --app default --in-process   # the embedded default pair, and served vs in-process
    python jobs/loadtest.py --app default --placement split   # separate Drafter + Verifier deployments
    python jobs/loadtest.py --url http://127.0.0.1:8000 --model my-model   # an app already running

Requests leave γ and K to the app (its default: the adaptive policy) unless ``--gamma`` / ``--k`` are given.
``--in-process`` (a private app only) loads the same pair in this process (one torch thread, as in a replica) and
after each served completion at concurrency 1 decodes the same prompt in process, speculative and plain: the
served / in-process ratio of tok/s per pair, side by side in one run.

Bounded: ``--requests`` per cell, ``--max-tokens`` per request, a timeout on every request, loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["def fibonacci(n):", "The capital of France is", "Once upon a time", "1, 2, 3, 4,", "import numpy as np"]


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def held_out(per_domain: int = 4) -> list[str]:
    """User messages from the evaluation splits (code, math, chat interleaved): what the default drafter is for."""
    sys.path.insert(0, str(ROOT / "platform"))
    from specdiff.prompts import load_prompts

    domains = [load_prompts(d, "eval", per_domain) for d in ("code", "math", "chat")]
    return [p for group in zip(*domains) for p in group]


def disjoint(per_set: int = 8) -> list[tuple[bool, str]]:
    """(raw, text) prompts from sources kept apart from training (specdiff.prompts.DISJOINT_SETS' held-out
    standard-library functions, raw and as requests, and the other word problems), interleaved."""
    sys.path.insert(0, str(ROOT / "platform"))
    from specdiff.prompts import source_prompts

    sets = [source_prompts(name, "eval", per_set) for name in ("code-raw", "code-chat", "math-other")]
    return [(p.raw, p.text) for group in zip(*sets) for p in group]


def request_body(args, i: int, speculative: bool, model: str | None = None) -> tuple[str, dict]:
    """(endpoint, body) of request ``i``: a raw completion, or a chat message from the held-out prompts."""
    body = {"model": model or args.model, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "seed": i}
    if speculative is not None:  # None: a server of its own (vLLM plain) that knows no speculation fields
        body.update(speculative=speculative, gamma=args.gamma, num_candidates=args.k)
    if args.prompt_set == "raw":
        return "/v1/completions", {**body, "prompt": PROMPTS[i % len(PROMPTS)]}
    raw, message = args.messages[i % len(args.messages)]
    if raw:
        return "/v1/completions", {**body, "prompt": message}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": message}]}


def run_cell(url, model, concurrency, speculative, args):
    def one(i):
        # Streamed, so the first token's time is seen; the usage arrives in the last chunk (include_usage).
        endpoint, body = request_body(args, i, speculative, model)
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        first, usage = None, None
        with requests.post(url + endpoint, json=body, timeout=args.timeout, stream=True) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"request {i} failed: {chunk['error']}")
                if first is None and any(c.get("text") or (c.get("delta") or {}).get("content")
                                         for c in chunk.get("choices", [])):
                    first = time.perf_counter() - t0
                if chunk.get("usage"):
                    usage = chunk["usage"]
        if usage is None:
            raise RuntimeError(f"request {i}: the stream ended without its usage chunk")
        total = time.perf_counter() - t0
        return total, usage["completion_tokens"], usage.get("speculative", {}), first if first is not None else total

    n = max(args.requests, concurrency)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    latencies = [r[0] for r in results]
    tokens = sum(r[1] for r in results)
    return {
        "concurrency": concurrency,
        "mode": {True: "speculative", False: "verifier-only", None: "vLLM plain"}[speculative],
        "requests": n,
        "tok_s": tokens / wall,
        "req_s": n / wall,
        "p50_s": statistics.median(latencies),
        "p99_s": percentile(latencies, 99),
        "ttft_p50_s": statistics.median(r[3] for r in results),
        "ttft_p99_s": percentile([r[3] for r in results], 99),
        "tau": statistics.mean(r[2].get("tau", 1.0) for r in results),
        "busy_plain": sum(r[2].get("choices", {}).get("busy_plain", 0) for r in results),
    }


def compare_in_process(url, args, pairs_per_mode: int = 4) -> list[dict]:
    """Served completion, then the same decode in this process (same pair, seed, γ/K settings), alternating, for
    speculative and plain requests: tok/s of each and their ratio."""
    import torch

    from specdiff import HFVerifier, SamplingParams, SpecConfig, SpeculativeDecoder, generate_plain
    from specdiff.prompts import chat_prompt_ids
    from specdiff.serving.config import ModelSource
    from specdiff.serving.models import load_drafter, load_tokenizer, load_verifier, resolve_pair

    torch.set_num_threads(1)  # as in a replica (one CPU's share)
    source, _ = resolve_pair(ModelSource(demo=True) if args.app == "demo" else ModelSource())
    drafter, verifier, tokenizer = load_drafter(source), load_verifier(source), load_tokenizer(source)
    decoder = SpeculativeDecoder(drafter, verifier)  # adaptive: calibrated here, as the router does there
    # Plain decoding pays for no taps; the same weights, not a second load.
    plain_verifier = HFVerifier(verifier.model, max_context=verifier.max_context) if verifier.tap_layers else verifier
    sampling = SamplingParams(temperature=args.temperature)
    spec = SpecConfig(gamma=args.gamma, num_candidates=args.k)
    out = []
    for i in range(pairs_per_mode * 2 + 2):  # two warm-ups (one per mode), then alternating pairs
        speculative = i % 2 == 0
        endpoint, body = request_body(args, i // 2, speculative)
        body["seed"] = i
        t0 = time.perf_counter()
        r = requests.post(url + endpoint, json=body, timeout=args.timeout)
        r.raise_for_status()
        served_s, usage = time.perf_counter() - t0, r.json()["usage"]
        if "prompt" in body:
            ids = tokenizer.encode(body["prompt"], add_special_tokens=False)
        else:
            ids = chat_prompt_ids(tokenizer, body["messages"][0]["content"])
        t0 = time.perf_counter()
        if speculative:
            local = decoder.generate(ids, max_new_tokens=args.max_tokens, sampling=sampling, spec=spec, seed=i)
        else:
            local = generate_plain(plain_verifier, ids, max_new_tokens=args.max_tokens, sampling=sampling, seed=i)
        local_s = time.perf_counter() - t0
        if i >= 2:
            served = usage["completion_tokens"] / served_s
            here = len(local.tokens) / local_s
            out.append({"mode": "speculative" if speculative else "plain", "served_tok_s": served,
                        "in_process_tok_s": here, "ratio": served / here, "tau": usage["speculative"]["tau"],
                        "choices": usage["speculative"].get("choices")})
            print(f"pair {i - 1}: {out[-1]['mode']}: served {served:.1f} tok/s, in process {here:.1f} tok/s "
                  f"({served / here:.2f}x)", file=sys.stderr, flush=True)
    return out


def print_pairs(pairs: list[dict]) -> None:
    print("\n| mode | served tok/s | in-process tok/s | served / in-process (median; per pair) |")
    print("|---|---|---|---|")
    for mode in ("speculative", "plain"):
        rows = [p for p in pairs if p["mode"] == mode]
        ratios = [p["ratio"] for p in rows]
        served = ", ".join(f"{p['served_tok_s']:.1f}" for p in rows)
        here = ", ".join(f"{p['in_process_tok_s']:.1f}" for p in rows)
        each = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"| {mode} | {served} | {here} | {statistics.median(ratios):.2f}; {each} |")


def start_local(port: int, args):
    """A private Ray instance + the demo app; returns a stop() callable."""
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S="60")
    sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "platform"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    import ray
    from ray import serve

    from specdiff.runtime.ray_auth import use_private_token
    from specdiff.serving.app import build_app

    use_private_token()  # token auth as Ray sets it up, without leaving ~/.ray/auth_token behind
    cores = os.cpu_count() or 1
    # Logical CPUs beyond the cores: the router and proxies need a share while the verifier replica owns the cores.
    # With --vllm-plain, vLLM's engine reserves the cores too (the two apps are measured one after the other).
    logical = cores + 2 + (cores + 1 if args.vllm_plain else 0)
    ray.init(address="local", num_cpus=logical, include_dashboard=False, log_to_driver=False)  # private instance
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    small = {"num_cpus": 0.5}
    models = {"demo": True} if args.app == "demo" else {}  # {}: the embedded default pair
    if args.drafter:
        models["drafter"] = args.drafter
    if args.dtype:
        models["dtype"] = args.dtype
    router = dict(small)
    if args.max_load is not None:  # "off": always speculate
        router["speculation_max_load"] = None if args.max_load == "off" else int(args.max_load)
    # The verifier replica's CPUs set its torch threads (Ray's OMP_NUM_THREADS): all cores by default, as vLLM uses.
    verifier = {"num_cpus": args.verifier_cpus or cores}
    if args.no_batching:
        verifier["batching"] = False
    app = build_app({"models": models, "drafter": small, "verifier": verifier, "router": router,
                     "colocate": {"auto": None, "colocated": True, "split": False}[args.placement]})
    done = threading.Event()

    def deploy():  # serve.run blocks forever if a deployment cannot be placed: wait with a deadline
        serve.run(app, name="loadtest", route_prefix="/", blocking=False)
        done.set()

    threading.Thread(target=deploy, daemon=True).start()
    if not done.wait(args.startup_timeout):
        raise TimeoutError(f"app not RUNNING after {args.startup_timeout}s")
    if args.vllm_plain:  # vLLM without speculation beside it, on the same verifier weights and dtype
        from specdiff.serving.vllm_app import build_vllm_app

        plain = build_vllm_app({"drafter": None, "dtype": args.dtype or "auto", "num_cpus": cores,
                                "max_num_seqs": max(64, max(args.concurrency))})
        serve.run(plain, name="vllm-plain", route_prefix="/vllm", blocking=False)
        deadline = time.time() + args.startup_timeout
        while serve.status().applications["vllm-plain"].status != "RUNNING":
            if time.time() > deadline:
                raise TimeoutError(f"vLLM plain app not RUNNING after {args.startup_timeout}s")
            time.sleep(2)

    def stop():
        serve.shutdown()
        ray.shutdown()

    return stop


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="an already running app (default: start one on 127.0.0.1:8011)")
    p.add_argument("--model", default="specdiff-demo")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=16, help="requests per cell (at least the concurrency)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--gamma", type=int, default=None, help="window per request (default: the app's; adaptive)")
    p.add_argument("--k", type=int, default=None, help="candidates per request (default: the app's; adaptive)")
    p.add_argument("--app", choices=["demo", "default"], default="demo",
                   help="private app: the tiny demo pair, or the embedded default pair (needs its drafter built)")
    p.add_argument("--prompts", dest="prompt_set", choices=["raw", "heldout", "disjoint"], default=None,
                   help="raw completions (default with the demo app) or chat messages from the held-out evaluation "
                   "prompts of code, math and chat (default with --app default)")
    p.add_argument("--max-load", default=None, metavar="N|off",
                   help="private app: router.speculation_max_load (speculation off above N sessions on a verifier "
                   "replica; off: always speculate; default: the app's)")
    p.add_argument("--placement", choices=["auto", "colocated", "split"], default="auto",
                   help="the private app's colocate setting: colocated (one deployment holds both models and runs "
                   "whole decodes), split (Drafter + Verifier deployments), auto (the app's default: colocated for a "
                   "feature drafter)")
    p.add_argument("--in-process", action="store_true",
                   help="compare each served completion at concurrency 1 with the same decode in this process")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--timeout", type=float, default=300, help="per request, seconds")
    p.add_argument("--startup-timeout", type=float, default=300)
    p.add_argument("--verifier-cpus", type=float, default=None,
                   help="CPUs of the private app's verifier/Decoder replica (default: every core of this machine)")
    p.add_argument("--no-batching", action="store_true",
                   help="private app: one forward per session and pass (verifier.batching=false), for comparison")
    p.add_argument("--drafter", default=None, help="private app: models.drafter (default: the app's)")
    p.add_argument("--vllm-plain", action="store_true",
                   help="private app: also serve vLLM without speculation (the vLLM extra's virtualenv) and run "
                        "it at every concurrency, side by side")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16"],
                   help="private app: models.dtype (default: auto)")
    args = p.parse_args(argv)

    stop = None
    url = args.url
    if args.in_process and url is not None:
        p.error("--in-process needs the private app (no --url): both sides must run the same pair")
    if args.placement != "auto" and url is not None:
        p.error("--placement configures the private app; an app at --url is served as it was deployed")
    if args.app == "default" and args.model == "specdiff-demo":
        args.model = "smollm2-135m-instruct"
    if args.prompt_set is None:
        args.prompt_set = "heldout" if args.app == "default" else "raw"
    args.messages = {"heldout": lambda: [(False, m) for m in held_out()], "disjoint": disjoint,
                     "raw": list}[args.prompt_set]()
    if args.vllm_plain and url is not None:
        p.error("--vllm-plain starts its own vLLM app beside the private app (no --url)")
    if url is None:
        stop = start_local(8011, args)
        url = "http://127.0.0.1:8011"
    try:
        run_cell(url, args.model, 1, True, argparse.Namespace(**{**vars(args), "requests": 2}))  # warm-up
        pairs = compare_in_process(url, args) if args.in_process else []
        rows = []
        if args.vllm_plain:
            run_cell(url + "/vllm", args.model, 1, None, argparse.Namespace(**{**vars(args), "requests": 2}))
        for c in args.concurrency:
            for spec in (False, True) + ((None,) if args.vllm_plain else ()):
                rows.append(run_cell(url + ("/vllm" if spec is None else ""), args.model, c, spec, args))
                row = rows[-1]
                print(f"done: concurrency {c}, {row['mode']}: {row['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        if stop is not None:
            stop()
    print(f"\napp placement: {args.placement}")
    if pairs:
        print_pairs(pairs)
    print(f"\nprompts={args.prompt_set} max_tokens={args.max_tokens} temperature={args.temperature} "
          f"gamma={args.gamma} K={args.k} max_load={args.max_load}\n")
    print("| concurrency | mode | requests | tokens/s | requests/s | p50 latency (s) | p99 latency (s) | "
          "p50 / p99 first token (s) | τ | plain steps under load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['mode']} | {r['requests']} | {r['tok_s']:.1f} | {r['req_s']:.2f} | "
            f"{r['p50_s']:.2f} | {r['p99_s']:.2f} | {r['ttft_p50_s']:.2f} / {r['ttft_p99_s']:.2f} | {r['tau']:.2f} | "
            f"{r['busy_plain']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "messages"},
                                               "rows": rows, "pairs": pairs}, indent=1))


if __name__ == "__main__":
    main()
