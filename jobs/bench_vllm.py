"""Benchmark in vLLM: vLLM plain, vLLM n-gram and vLLM + our feature drafter, next to our engine, in ONE run.

    python jobs/bench_vllm.py [--drafter DIR] [--gamma 4] [--concurrency 2 4 8 16] [--out DIR]

Runs in the vLLM virtualenv (README: "vLLM engine (optional)"). The three vLLM engines are loaded once and kept
alive side by side; then, prompt by prompt, every method decodes the same held-out prompt (evaluation splits,
chat template, T=0, same max tokens) back to back, so a noisy stretch of the machine hits all alike:

- ``vllm_plain``: the verifier alone in vLLM;
- ``vllm_ngram``: vLLM's prompt-lookup speculation (``--gamma`` tokens, n-gram sizes ``--ngram``);
- ``vllm_ours``: vLLM's ``dflash`` method with our drafter (``--drafter``, exported with ``specdiff.vllm.export``)
  and our plugin's copied candidate where the context has one (``specdiff.vllm.plugin``);
- ``vllm_ours_nolookup`` (with ``--lookup-ablation``): our drafter alone, as vLLM's dflash method runs it;
- ``vllm_ours_nocut`` (with ``--cut-ablation``): copies and drafter, every drafter window verified whole;
- ``vllm_ours_capped`` (with ``--speculation-max-batch N``): the same, drafting nothing while vLLM's batch holds more
  than N requests (vLLM's dynamic schedule; the Serve app's ``speculation_max_batch``);
- ``plain`` and ``specdiff``: our engine in this process (Hugging Face verifier, adaptive γ/K), for reference.

Batch 1 is one request at a time. Then, for each ``--concurrency`` N, N requests at once (the prompts repeated) per
vLLM engine: total tokens/s, the throughput a loaded server sees, and per speculative engine the largest N up to
which it kept up with vLLM plain (its crossover: the Serve app's ``speculation_max_batch``). vLLM rows are compared
with vLLM plain, ours with our plain.
At T=0 every vLLM row must emit vLLM plain's tokens (the script says where one does not). Writes ``bench_vllm.md``
and ``bench_vllm.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

from specdiff.prompts import DISJOINT_SETS, IN_DISTRIBUTION_SETS, SOURCES


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--drafter", default=None, help="feature drafter folder (default: the state directory's default "
                   "drafter, built by jobs/build_drafter.py)")
    p.add_argument("--sets", "--domains", dest="domains", nargs="+", default=[*DISJOINT_SETS, *IN_DISTRIBUTION_SETS],
                   choices=[s for s in SOURCES if s != "math-broad"], metavar="SET",
                   help="prompt sets, as jobs/bench.py's --sets (default: %(default)s)")
    p.add_argument("--prompts-per-domain", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--gamma", type=int, default=4, help="speculative tokens per step for both vLLM methods")
    p.add_argument("--speculation-max-batch", type=int, default=None, metavar="N",
                   help="also vllm_ours_capped: our drafter with no drafts while vLLM's batch holds more than N "
                   "requests (serve_apps.specdiff_vllm's speculation_max_batch)")
    p.add_argument("--lookup-ablation", action="store_true",
                   help="also vllm_ours_nolookup: our drafter without the plugin's copied candidate")
    p.add_argument("--cut-ablation", action="store_true",
                   help="also vllm_ours_nocut: the plugin without its confidence cut of the drafter's windows")
    p.add_argument("--min-draft-confidence", type=float, default=None, metavar="C",
                   help="the plugin's confidence cut for vllm_ours (default: specdiff.vllm.export's; 0: off)")
    p.add_argument("--ngram", type=int, nargs=2, default=[2, 4], metavar=("MIN", "MAX"),
                   help="n-gram sizes of vLLM's prompt lookup")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16],
                   help="requests at once for the throughput rows, one or more values (0: skip)")
    p.add_argument("--eager", action="store_true", help="vLLM without compilation (loads in ~1 min instead of "
                   "~2.5 on 2 cores; decodes slower)")
    p.add_argument("--no-ours", action="store_true", help="skip our engine's rows")
    p.add_argument("--outputs", action="store_true", help="also write every method's token ids to the JSON report "
                   "(key 'outputs': method -> one list per prompt)")
    p.add_argument("--kv-cache-gb", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per engine (CPU build)")
    p.add_argument("--find-cap", action="store_true",
                   help="measure the vLLM app's load cap instead: vLLM plain and vLLM + the drafter only, side by side "
                   "at every --concurrency (default 1 2 4 8 16), --repeats times; keeps the crossover for this machine "
                   "under $SPECDIFF_HOME/vllm-cap (specdiff.serving.load_cap), where serve_apps.specdiff_vllm reads it")
    p.add_argument("--repeats", type=int, default=2, help="--find-cap: rounds over the concurrencies (averaged)")
    p.add_argument("--dtype", default="float32", help="--find-cap: the engines' dtype (the app's dtype=auto resolves "
                   "to bfloat16 on a GPU or a CPU with native bf16)")
    p.add_argument("--out", default="bench-vllm")
    return p.parse_args(argv)


def spec_counters(results) -> dict[str, float]:
    """Drafts, draft tokens and accepted tokens of ``results`` (vLLM's per-request spec-decode metrics, engine
    argument ``per_request_spec_decode_metrics``): each engine's own, where the process-wide Prometheus counters
    keep only the last engine loaded."""
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    for r in results:
        m = r.outputs[0].spec_decode_metrics
        if m is not None:
            summary = m.to_dict()  # vLLM's own reading of the request's acceptance histogram
            out["drafts"] += summary["num_spec_steps"]
            out["draft_tokens"] += summary["num_draft_tokens"]
            out["accepted_tokens"] += summary["num_accepted_draft_tokens"]
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        print(f"error: vLLM is not importable here ({e}); run this in the vLLM virtualenv (README: 'vLLM engine "
              "(optional)')", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gb))
    if args.find_cap:
        return find_cap(args)
    import torch
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt

    from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, generate_plain, load_drafter
    from specdiff.vllm.export import DEFAULT_MIN_DRAFT_CONFIDENCE, export_vllm
    from specdiff.models.sources import default_verifier_path, load_causal_lm, state_dir
    from specdiff.distill.selfwritten import packaged
    from specdiff.models.sources import DEFAULT_VERIFIER
    from specdiff.prompts import eval_prompts, prompt_ids

    drafter_dir = Path(args.drafter) if args.drafter else state_dir() / "drafters" / "default"
    if not drafter_dir.is_dir():
        print(f"error: no drafter at {drafter_dir}; build one with `python jobs/build_drafter.py` or pass --drafter",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    verifier_dir = default_verifier_path()
    cut = DEFAULT_MIN_DRAFT_CONFIDENCE if args.min_draft_confidence is None else (args.min_draft_confidence or None)
    export = export_vllm(drafter_dir, out / "drafter-vllm", verifier_dir=verifier_dir, min_draft_confidence=cut)
    gamma = min(args.gamma, export.num_speculative_tokens)

    model, tokenizer = load_causal_lm(str(verifier_dir), "float32")
    sets = eval_prompts(args.domains, args.prompts_per_domain, lambda n: packaged(DEFAULT_VERIFIER)["heldout"][:n])
    prompts = [(name, prompt_ids(tokenizer, p)) for name, ps in sets.items() for p in ps]
    configs = {
        "vllm_plain": None,
        "vllm_ngram": {"method": "ngram", "num_speculative_tokens": gamma, "prompt_lookup_min": args.ngram[0],
                       "prompt_lookup_max": args.ngram[1]},
        "vllm_ours": export.speculative_config(gamma),
    }
    if args.lookup_ablation:
        alone = export_vllm(drafter_dir, out / "drafter-vllm-nolookup", verifier_dir=verifier_dir, prompt_lookup=None,
                            min_draft_confidence=None)
        configs["vllm_ours_nolookup"] = alone.speculative_config(gamma)
    if args.cut_ablation:
        whole = export_vllm(drafter_dir, out / "drafter-vllm-nocut", verifier_dir=verifier_dir,
                            min_draft_confidence=None)
        configs["vllm_ours_nocut"] = whole.speculative_config(gamma)
    if args.speculation_max_batch:  # the Serve app's switch-off: vLLM's dynamic schedule, no drafts above N
        from specdiff.serving.vllm_app import speculative_config

        configs["vllm_ours_capped"] = speculative_config(export, gamma, args.speculation_max_batch, 1 << 16)
    engines, load_s = {}, {}
    for name, spec in configs.items():
        t0 = time.perf_counter()
        print(f"[bench_vllm] loading {name} ...", flush=True)
        engines[name] = LLM(model=str(verifier_dir), dtype="float32", enforce_eager=args.eager, max_model_len=2048,
                            seed=0, disable_log_stats=False, speculative_config=spec,
                            per_request_spec_decode_metrics="summary" if spec else "none")
        load_s[name] = time.perf_counter() - t0
        print(f"[bench_vllm] {name} loaded in {load_s[name]:.0f} s", flush=True)
    greedy = VllmSampling(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=False)

    ours = {}
    if not args.no_ours:
        drafter = load_drafter(drafter_dir, dtype=torch.float32, verifier=model)
        verifier = HFVerifier(model, tap_layers=getattr(drafter, "tap_layers", None))
        decoder = SpeculativeDecoder(drafter, verifier, costs_cache=state_dir() / "costs")
        plain_verifier = HFVerifier(model)
        stops = [tokenizer.eos_token_id]
        ours = {
            "plain": lambda p: generate_plain(plain_verifier, p, max_new_tokens=args.max_new_tokens,
                                              stop_token_ids=stops).tokens,
            "specdiff": lambda p: decoder.generate(p, max_new_tokens=args.max_new_tokens, stop_token_ids=stops,
                                                   spec=SpecConfig(), seed=0).tokens,
        }
        ours["specdiff"](prompts[0][1][:8])  # warm-up (and the cost model: kept per machine)

    counted: dict[str, dict[str, float]] = {}  # spec-decode counters per engine, batch-1 rows only

    def vllm_run(name, batch, count_in=None):
        results = engines[name].generate([TokensPrompt(prompt_token_ids=p) for p in batch], greedy, use_tqdm=False)
        if count_in is not None and configs[name]:
            for k, v in spec_counters(results).items():
                for counts in (counted.setdefault(name, {}), count_in):
                    counts[k] = counts.get(k, 0.0) + v
        return [list(r.outputs[0].token_ids) for r in results]

    for name in engines:  # warm-up: first-request overheads
        vllm_run(name, [prompts[0][1][:8]])

    rows: dict[tuple[str, str], dict] = {}
    outputs: dict[str, list] = {}
    methods = [*engines, *ours]
    for i, (domain, prompt) in enumerate(prompts):
        for name in methods:
            row = rows.setdefault((domain, name), {"tokens": 0, "seconds": 0.0})
            t0 = time.perf_counter()
            tokens = vllm_run(name, [prompt], row)[0] if name in engines else ours[name](prompt)
            seconds = time.perf_counter() - t0
            row["tokens"] += len(tokens)
            row["seconds"] += seconds
            outputs.setdefault(name, []).append(tokens)
        print(f"[bench_vllm] prompt {i + 1}/{len(prompts)} ({domain}) done", flush=True)

    throughput: dict[int, dict[str, float]] = {}  # requests at once -> engine -> total tok/s
    for n in sorted(c for c in set(args.concurrency) if c > 0):
        batch = [prompts[i % len(prompts)][1] for i in range(n)]
        for name in engines:
            t0 = time.perf_counter()
            tokens = sum(len(t) for t in vllm_run(name, batch))
            throughput.setdefault(n, {})[name] = tokens / (time.perf_counter() - t0)
            print(f"[bench_vllm] {name}: {n} at once, {throughput[n][name]:.1f} tok/s", flush=True)

    report = build_report(args, rows, outputs, counted, throughput, load_s, gamma, prompts)
    if args.outputs:
        report["outputs"] = outputs
    (out / "bench_vllm.json").write_text(json.dumps(report, indent=1))
    (out / "bench_vllm.md").write_text(report_markdown(report))
    print(report_markdown(report))
    engines.clear()  # the engines' processes end with their last reference
    gc.collect()
    return 0 if report["vllm_outputs_equal_plain"] else 1


def find_cap(args) -> int:
    """``--find-cap``: vLLM plain and vLLM + our drafter (the app's export: copies and confidence cut on), loaded side
    by side; at each concurrency N both decode the same N prompts back to back, ``--repeats`` rounds; the cap is the
    crossover of the summed throughputs (``specdiff.serving.load_cap.cap_from_throughput``)."""
    import platform as host

    from vllm import LLM
    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt

    from specdiff.distill.selfwritten import packaged
    from specdiff.models.dtypes import cpuinfo_value
    from transformers import AutoTokenizer

    from specdiff.models.sources import DEFAULT_VERIFIER, default_verifier_path, state_dir
    from specdiff.prompts import eval_prompts, prompt_ids
    from specdiff.runtime import machine_cache
    from specdiff.serving.load_cap import cap_from_throughput, cap_path
    from specdiff.serving.vllm_app import export_for_vllm

    drafter_dir = Path(args.drafter) if args.drafter else state_dir() / "drafters" / "default"
    if not drafter_dir.is_dir():
        print(f"error: no drafter at {drafter_dir}; build one with `python jobs/build_drafter.py` or pass --drafter",
              file=sys.stderr)
        return 2
    verifier_dir = default_verifier_path()
    export = export_for_vllm(drafter_dir, verifier_dir)  # what the app serves
    gamma = min(args.gamma, export.num_speculative_tokens)
    tokenizer = AutoTokenizer.from_pretrained(str(verifier_dir))
    sets = eval_prompts(args.domains, args.prompts_per_domain, lambda n: packaged(DEFAULT_VERIFIER)["heldout"][:n])
    prompts = [prompt_ids(tokenizer, p) for ps in sets.values() for p in ps]
    concurrency = sorted({c for c in args.concurrency if c > 0}) if args.concurrency != [16] else [1, 2, 4, 8, 16]
    engines = {}
    for name, spec in (("vllm_plain", None), ("vllm_ours", export.speculative_config(gamma))):
        t0 = time.perf_counter()
        engines[name] = LLM(model=str(verifier_dir), dtype=args.dtype, enforce_eager=args.eager, max_model_len=2048,
                            max_num_seqs=max(64, max(concurrency)), seed=0, speculative_config=spec)
        print(f"[bench_vllm] {name} loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    greedy = VllmSampling(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=False)

    def run(name, batch):
        results = engines[name].generate([TokensPrompt(prompt_token_ids=p) for p in batch], greedy, use_tqdm=False)
        return [list(r.outputs[0].token_ids) for r in results]

    for name in engines:
        run(name, [prompts[0][:8]])
    tokens = {n: {k: 0 for k in engines} for n in concurrency}
    seconds = {n: {k: 0.0 for k in engines} for n in concurrency}
    differ = 0
    for r in range(args.repeats):
        for n in concurrency:
            batch = [prompts[(i + r * n) % len(prompts)] for i in range(n)]
            outs = {}
            for name in (engines if r % 2 == 0 else reversed(list(engines))):  # alternate who goes first
                t0 = time.perf_counter()
                outs[name] = run(name, batch)
                seconds[n][name] += time.perf_counter() - t0
                tokens[n][name] += sum(len(t) for t in outs[name])
            differ += sum(a != b for a, b in zip(outs["vllm_ours"], outs["vllm_plain"]))
            print(f"[bench_vllm] round {r + 1}, {n} at once: " + ", ".join(
                f"{k} {tokens[n][k] / seconds[n][k]:.1f} tok/s" for k in engines), flush=True)
    throughput = {n: {k: tokens[n][k] / seconds[n][k] for k in engines} for n in concurrency}
    cap = cap_from_throughput(throughput, "vllm_ours")
    record = {"cap": cap, "gamma": gamma, "dtype": args.dtype, "eager": args.eager, "repeats": args.repeats,
              "max_new_tokens": args.max_new_tokens, "prompts": len(prompts), "machine": cpuinfo_value("model name")
              or host.processor(), "cpus": os.cpu_count(), "machine_facts": machine_cache.machine(),
              "throughput_by_concurrency": {n: {k: round(v, 2) for k, v in t.items()} for n, t in throughput.items()},
              "outputs_differing_from_vllm_plain": differ, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
              "drafter": str(drafter_dir)}
    path = cap_path(state_dir(), verifier_dir, drafter_dir, gamma, args.dtype)
    machine_cache.write_json(path, record)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_cap.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))
    print(f"[bench_vllm] load cap {cap} (kept at {path})", flush=True)
    engines.clear()
    gc.collect()
    return 0 if differ == 0 or args.dtype != "float32" else 1


def build_report(args, rows, outputs, counted, throughput, load_s, gamma, prompts) -> dict:
    domains = list(dict.fromkeys(d for d, _ in prompts))
    table = []
    for domain in domains:
        for name in dict.fromkeys(n for d, n in rows if d == domain):
            r = rows[(domain, name)]
            base = rows[(domain, "vllm_plain" if name.startswith("vllm") else "plain")]
            rate, base_rate = r["tokens"] / r["seconds"], base["tokens"] / base["seconds"]
            table.append({"domain": domain, "method": name, "tokens": r["tokens"], "seconds": round(r["seconds"], 3),
                          "tokens_per_s": round(rate, 2), "speedup": round(rate / base_rate, 3),
                          "tau": round(1 + r["accepted_tokens"] / r["drafts"], 3) if r.get("drafts") else None})
    top = throughput[max(throughput)] if throughput else {}
    acceptance = {}
    for name, delta in counted.items():
        if delta.get("drafts"):
            acceptance[name] = {**delta, "tau": round(1 + delta["accepted_tokens"] / delta["drafts"], 3)}
    plain = outputs["vllm_plain"]
    differ = {name: sum(a != b for a, b in zip(outs, plain)) for name, outs in outputs.items()}
    vllm_equal = all(differ[n] == 0 for n in outputs if n.startswith("vllm"))
    return {
        "settings": {"gamma": gamma, "ngram": args.ngram, "max_new_tokens": args.max_new_tokens, "eager": args.eager,
                     "prompts_per_domain": args.prompts_per_domain, "concurrency": args.concurrency,
                     "dtype": "float32"},
        "rows": table,
        "acceptance": acceptance,
        # the largest concurrency's rows, then every concurrency's
        "throughput_tokens_per_s": {k: round(v, 2) for k, v in top.items()},
        "throughput_vs_vllm_plain": {k: round(v / top["vllm_plain"], 3) for k, v in top.items()},
        "throughput_by_concurrency": {n: {k: round(v, 2) for k, v in t.items()} for n, t in throughput.items()},
        "speculation_crossover": crossover(throughput),
        "outputs_differing_from_vllm_plain": differ,
        "vllm_outputs_equal_plain": vllm_equal,
        "load_s": {k: round(v, 1) for k, v in load_s.items()},
    }


def crossover(throughput: dict[int, dict[str, float]]) -> dict[str, int | None]:
    """Per speculative engine: the largest measured concurrency up to which it was at least as fast as vLLM plain at
    every measured concurrency (None: slower already at the smallest)."""
    out: dict[str, int | None] = {}
    for name in next(iter(throughput.values()), {}):
        if name == "vllm_plain":
            continue
        out[name] = None
        for n in sorted(throughput):
            if throughput[n][name] < throughput[n]["vllm_plain"]:
                break
            out[name] = n
    return out


def report_markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"# vLLM bench (T=0, float32, γ={s['gamma']}, n-gram {s['ngram']}, {s['max_new_tokens']} tokens, "
             f"{s['prompts_per_domain']} prompts/domain, eager={s['eager']})", "",
             "| domain | method | tok/s | speed-up (vLLM rows: vs vllm_plain; ours: vs plain) | τ (vLLM) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['domain']} | {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}× | "
              f"{'' if r.get('tau') is None else format(r['tau'], '.2f')} |" for r in report["rows"]]
    if report["acceptance"]:
        lines += ["", "| method | drafts | draft tokens | accepted | τ |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {a['drafts']:.0f} | {a['draft_tokens']:.0f} | {a['accepted_tokens']:.0f} | {a['tau']:.2f} |"
                  for n, a in report["acceptance"].items()]
    by = report["throughput_by_concurrency"]
    if by:
        names = list(next(iter(by.values())))
        lines += ["", "| requests at once | " + " | ".join(f"{n} tok/s" for n in names) + " |",
                  "|---|" + "---|" * len(names)]
        lines += [f"| {c} | " + " | ".join(f"{t[n]:.1f} ({t[n] / t['vllm_plain']:.2f}×)" for n in names) + " |"
                  for c, t in by.items()]
        lines += ["", "speculation kept up with vllm_plain up to (requests at once): " + ", ".join(
            f"{n} {c if c is not None else 'none'}" for n, c in report["speculation_crossover"].items())]
    lines += ["", "outputs differing from vllm_plain (of each method's prompts): "
              + ", ".join(f"{n} {c}" for n, c in report["outputs_differing_from_vllm_plain"].items()),
              "load seconds: " + ", ".join(f"{n} {v:.0f}" for n, v in report["load_s"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # vLLM spawns engine processes: the guard is required
    sys.exit(main())
