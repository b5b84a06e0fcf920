"""The teacher stage on Ray Data: prompts -> an actor pool of samplers holding the verifier (``teacher.TeacherSampler``
on Hugging Face, or ``teacher_vllm.VLLMTeacherSampler``) -> trajectory records that stream into training.

Above both samplers, so that choosing one imports each without either importing the other's chooser.
"""

from __future__ import annotations

from dataclasses import asdict

from specdiff.distill.teacher import TeacherSampler
from specdiff.distill.teacher_vllm import VLLMTeacherSampler, choose_engine
from specdiff.lineage.verifier import VerifierRecord


def read_records(path: str, num_cpus: float):
    """A Ray dataset of prompts or trajectories from .jsonl/.json or .parquet (a file or a folder)."""
    import ray.data

    if path.endswith((".jsonl", ".json")):
        return ray.data.read_json(path, num_cpus=num_cpus)
    return ray.data.read_parquet(path, num_cpus=num_cpus)


def teacher_dataset(prompts, verifier: VerifierRecord, cfg, taps: list[int] | None = None, *,
                    whole_batches: bool = True, deadline: float | None = None,
                    events=None) -> object:
    """prompts (a Ray dataset) -> trajectory records, sampled on an actor pool holding the verifier.

    ``cfg``: the job's DistillConfig (teacher, data and verifier sections are read). ``taps``: also record those
    verifier layers' states (a ``features`` column, for a feature drafter). ``deadline``: see ``TeacherSampler``.
    ``events``: where the actors report each batch (``specdiff.distill.events``; default: printed)."""
    import ray.data

    t = cfg.teacher
    # Whole batches: without this, a read block of 94 prompts becomes batches of 64 and 30, and a short batch
    # decodes at little more than half the rate (batched decoding is weight-bandwidth bound on a CPU). Not while
    # training runs beside a streamed teacher: the repartition's tasks then find no free CPU and the job stalls.
    if whole_batches:
        prompts = prompts.repartition(target_num_rows_per_block=t.batch_size, strict=True)
    sampler = VLLMTeacherSampler if choose_engine(t.engine, t.gpus_per_actor) == "vllm" else TeacherSampler
    return prompts.map_batches(
        sampler,
        fn_constructor_kwargs={
            "verifier": verifier.to_dict(),
            "dtype": cfg.verifier.dtype,
            "sampling": asdict(t.sampling()),
            "max_new_tokens": t.max_new_tokens,
            "logprobs_k": t.logprobs_k,
            "max_prompt_tokens": cfg.data.max_prompt_tokens,
            "seed": cfg.run.seed,
            "taps": taps,
            "deadline": deadline,
            "events": events,
        },
        batch_size=t.batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=t.num_actors),
        num_cpus=t.cpus_per_actor,
        num_gpus=t.gpus_per_actor or None,
    )
