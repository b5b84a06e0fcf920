"""Teacher throughput: the Hugging Face sampler against the vLLM one (``teacher.engine``), side by side in one
process, on the same training prompts with the same settings as the default feature-drafter recipe
(jobs/configs/smollm2-feature.yaml: greedy, 64 new tokens, top-8 log-probs, three tapped layers). Run it in the vLLM
virtualenv (README: "vLLM engine"):

    python jobs/bench_teacher.py                   # 2 rounds of one 64-prompt batch per engine, alternating
    python jobs/bench_teacher.py --batch-size 16 --rounds 3 --no-features

Prints trajectories/s and new tokens/s per engine and their ratio; ``--ray`` also runs one batch through the Ray Data
teacher stage (``teacher_dataset``) with each engine, in actors, as the distillation job does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "platform"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="batches per engine, alternating")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--no-features", action="store_true", help="no tapped layers (a standalone drafter's teacher)")
    p.add_argument("--ray", action="store_true", help="also one batch per engine through the Ray Data stage")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")

    import pyarrow as pa
    import torch

    from specdiff.core.config import SamplingParams
    from specdiff.distill.teacher import TeacherSampler, verifier_record
    from specdiff.distill.teacher_vllm import VLLMTeacherSampler
    from specdiff.models.dtypes import resolve_dtype_with_reason
    from specdiff.models.sources import default_verifier_path, load_causal_lm
    from specdiff.prompts import chat_prompt_ids, load_prompts

    path = default_verifier_path()
    _, tokenizer = load_causal_lm(str(path), "float32")
    messages = [m for d in ("code", "math", "chat") for m in load_prompts(d, "train")]
    prompts = [chat_prompt_ids(tokenizer, m)[-160:] for m in messages]
    taps = None if args.no_features else [1, 14, 27]
    kwargs = dict(verifier=verifier_record(path).to_dict(), dtype=args.dtype,
                  sampling=asdict(SamplingParams(temperature=args.temperature)), max_new_tokens=args.max_new_tokens,
                  logprobs_k=8, max_prompt_tokens=160, seed=0, taps=taps)
    dtype, why = resolve_dtype_with_reason(args.dtype)
    print(f"dtype {dtype} ({why}); torch threads {torch.get_num_threads()}; batch {args.batch_size}; "
          f"{args.max_new_tokens} new tokens; taps {taps}", flush=True)

    t0 = time.perf_counter()
    engines = {"hf": TeacherSampler(**kwargs)}
    loaded = {"hf": time.perf_counter() - t0}
    t0 = time.perf_counter()
    engines["vllm"] = VLLMTeacherSampler(**kwargs)
    loaded["vllm"] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds + 1):  # round 0 warms both up
        batch = prompts[r * args.batch_size:(r + 1) * args.batch_size]
        table = pa.table({"prompt_ids": pa.array(batch, type=pa.list_(pa.int32()))})
        for name, sampler in engines.items():
            t0 = time.perf_counter()
            sampler(table)
            if r:
                times[name].append(time.perf_counter() - t0)
    print("\n| engine | load (s) | s per batch | trajectories/s | new tokens/s |")
    print("|---|---|---|---|---|")
    rate = {}
    for name, ts in times.items():
        per = sum(ts) / len(ts)
        rate[name] = args.batch_size / per
        print(f"| {name} | {loaded[name]:.0f} | {per:.1f} | {rate[name]:.2f} | "
              f"{rate[name] * args.max_new_tokens:.0f} |")
    print(f"\nvllm / hf: {rate['vllm'] / rate['hf']:.2f}x")

    if args.ray:
        del engines
        ray_stage(kwargs, prompts[: args.batch_size], args)


def ray_stage(kwargs, prompts, args) -> None:
    """One batch per engine through ``teacher_dataset`` (actors), as the distillation job runs it."""
    import ray
    import ray.data

    from specdiff.distill.config import DistillConfig
    from specdiff.distill.teacher_stage import teacher_dataset
    from specdiff.lineage.verifier import VerifierRecord

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=True)
    for engine in ("hf", "vllm"):
        cfg = DistillConfig.model_validate({
            "verifier": {"path": kwargs["verifier"]["path"], "dtype": args.dtype},
            "data": {"prompts": "unused.jsonl", "heldout": "unused.jsonl", "max_prompt_tokens": 160},
            "teacher": {"engine": engine, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                        "logprobs_k": 8, "batch_size": args.batch_size, "cpus_per_actor": 2},
        })
        ds = ray.data.from_items([{"prompt_ids": p} for p in prompts])
        t0 = time.perf_counter()
        rows = teacher_dataset(ds, VerifierRecord(**kwargs["verifier"]), cfg, kwargs["taps"]).take_all()
        print(f"ray data, {engine}: {len(rows)} trajectories in {time.perf_counter() - t0:.0f} s (actor start and "
              f"model load included)", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
