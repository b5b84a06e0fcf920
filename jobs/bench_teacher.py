"""Teacher throughput, side by side in one process: the torch sampler on the lean Llama forward (what
``teacher.engine: hf`` runs for a Llama-family verifier: ragged prefill, decode steps over one KV pool), the same
sampler on transformers' padded batch (what it ran before, and runs for other architectures), and the vLLM sampler
where vLLM is installed (``teacher.engine: vllm``). Same training prompts and settings as the default feature-drafter
recipe (the build's training prompts in its order; greedy, 64 new tokens, top-8 log-probs, three tapped layers):

    python jobs/bench_teacher.py                   # 2 rounds of one 64-prompt batch per engine, alternating
    python jobs/bench_teacher.py --batch-size 16 --rounds 3 --no-features

Prints trajectories/s and new tokens/s per engine, their ratio to the padded sampler, and whether every engine's
completions equal the padded ones; ``--ray`` also runs one batch through the Ray Data teacher stage
(``teacher_dataset``) with the hf and vllm engines, in actors, as the distillation job does.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PADDED = "hf, transformers padded"
sys.path.insert(0, str(ROOT / "platform"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="timed batches per engine, alternating (>= 1)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--no-features", action="store_true", help="no tapped layers (a standalone drafter's teacher)")
    p.add_argument("--ray", action="store_true", help="also one batch per engine through the Ray Data stage")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1 (round 0 only warms up)")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")

    import pyarrow as pa
    import torch

    from specdiff.core.config import SamplingParams
    from specdiff.distill.selfwritten import packaged
    from specdiff.distill.teacher import TeacherSampler, verifier_record
    from specdiff.distill.trajectories import load_verifier_model
    from specdiff.models.dtypes import resolve_dtype_with_reason
    from specdiff.models.hf import HFModel
    from specdiff.models.sources import DEFAULT_VERIFIER, default_verifier_path, load_causal_lm
    from specdiff.prompts import prompt_ids, training_mix

    path = default_verifier_path()
    _, tokenizer = load_causal_lm(str(path), "float32")
    # The build's training prompts, in its order (raw and chat, nine sources interleaved: lengths vary, as in a run).
    shipped = packaged(DEFAULT_VERIFIER)
    prompts = [ids[-160:] for ids in (prompt_ids(tokenizer, p) for p in training_mix(shipped["train"])) if ids]
    taps = None if args.no_features else [1, 14, 27]
    kwargs = dict(verifier=verifier_record(path).to_dict(), dtype=args.dtype,
                  sampling=asdict(SamplingParams(temperature=args.temperature)), max_new_tokens=args.max_new_tokens,
                  logprobs_k=8, max_prompt_tokens=160, seed=0, taps=taps)
    dtype, why = resolve_dtype_with_reason(args.dtype)
    print(f"dtype {dtype} ({why}); torch threads {torch.get_num_threads()}; batch {args.batch_size}; "
          f"{args.max_new_tokens} new tokens; taps {taps}", flush=True)

    engines, loaded = {}, {}
    t0 = time.perf_counter()
    engines["hf, lean forward"] = TeacherSampler(**kwargs)
    loaded["hf, lean forward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    padded = TeacherSampler(**kwargs)
    padded.hf = HFModel(load_verifier_model(path, args.dtype))  # transformers' padded batch
    padded.engine = "hf"
    engines[PADDED] = padded
    loaded[PADDED] = time.perf_counter() - t0
    if importlib.util.find_spec("vllm") is not None:
        from specdiff.distill.teacher_vllm import VLLMTeacherSampler

        t0 = time.perf_counter()
        engines["vllm"] = VLLMTeacherSampler(**kwargs)
        loaded["vllm"] = time.perf_counter() - t0
    else:
        print("vllm is not installed here: its row is left out (README: 'vLLM engine')", flush=True)
    times: dict[str, list[float]] = {name: [] for name in engines}
    same: dict[str, list[bool]] = {name: [] for name in engines}
    for r in range(args.rounds + 1):  # round 0 warms every engine up
        batch = prompts[r * args.batch_size:(r + 1) * args.batch_size]
        table = pa.table({"prompt_ids": pa.array(batch, type=pa.list_(pa.int32()))})
        outs = {}
        for name, sampler in engines.items():
            t0 = time.perf_counter()
            outs[name] = sampler(table).column("completion_ids").to_pylist()
            if r:
                times[name].append(time.perf_counter() - t0)
        for name in engines:
            same[name].extend(a == b for a, b in zip(outs[name], outs[PADDED]))
    print("\n| engine | load (s) | s per batch | trajectories/s | new tokens/s | vs padded | completions = padded |")
    print("|---|---|---|---|---|---|---|")
    rate = {name: args.batch_size * len(ts) / sum(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"| {name} | {loaded[name]:.0f} | {sum(ts) / len(ts):.1f} | {rate[name]:.2f} | "
              f"{rate[name] * args.max_new_tokens:.0f} | {rate[name] / rate[PADDED]:.2f}x | "
              f"{sum(same[name])}/{len(same[name])} |")

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
    for engine in ("hf", "vllm") if importlib.util.find_spec("vllm") is not None else ("hf",):
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
