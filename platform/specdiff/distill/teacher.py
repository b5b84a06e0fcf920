"""Teacher trajectories: the frozen verifier samples completions of prompts, batched, with an exact KV cache.

``sample_completions`` is pure torch. ``TeacherSampler`` is the Ray Data callable class (one per actor of the pool,
each holding the verifier); ``teacher_dataset`` wires prompts -> ``map_batches`` -> Arrow records that stream into
training. A record holds the prompt ids, the completion ids, the verifier's identity, the sampling settings, and
the top-k log-probs of the verifier's sampling distribution p at every completion position.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from specdiff.core.config import SamplingParams
from specdiff.models.dtypes import resolve_dtype
from specdiff.models.hf import HFModel
from specdiff.runtime.memory import keep_freed_memory
from specdiff.core.sampling import sample, target_probs
from specdiff.distill.events import Emitter, TeacherBudgetSpent, TeacherSampled

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


@dataclass(frozen=True)
class VerifierRecord:
    """Which verifier a drafter was aligned to; ``digest`` is sha256 over its config and weight files."""

    name: str
    version: str
    digest: str
    path: str

    def to_dict(self) -> dict:
        return asdict(self)


def verifier_record(path: str | Path, name: str | None = None, version: str = "unversioned") -> VerifierRecord:
    path = Path(path)
    files = sorted(f for f in path.iterdir() if f.name == "config.json" or f.suffix in WEIGHT_SUFFIXES)
    if not any(f.suffix in WEIGHT_SUFFIXES for f in files):
        raise ValueError(f"verifier.path must hold model weights ({', '.join(WEIGHT_SUFFIXES)}), got {str(path)!r}")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return VerifierRecord(name=name or path.name, version=version, digest="sha256:" + h.hexdigest(), path=str(path))


def load_verifier_model(path: str | Path, dtype: str | torch.dtype = "float32") -> torch.nn.Module:
    """The frozen verifier, on the CPU, in eval mode. ``dtype`` "auto" follows ``specdiff.models.dtypes`` (resolved where
    this runs: a teacher actor decides for its own machine); the default stays float32 so that registry
    evaluations give the same figures on every machine."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype))
    model.requires_grad_(False)
    return model.eval()


def causal_inputs(sequences: Sequence[Sequence[int]], pad_id: int = 0):
    """Left-padded ids [B, L], validity [B, L] bool and position ids [B, L] for a causal forward pass."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    valid = torch.zeros(len(sequences), length, dtype=torch.bool)
    for b, s in enumerate(sequences):
        ids[b, length - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
        valid[b, length - len(s) :] = True
    positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    return ids, valid, positions


def _greedy_step(logits: torch.Tensor, k: int):
    """Greedy decoding's token [B, 1] and top-k (values, indices) of log p, p the argmax one-hot, without
    materialising p: the argmax first with log p = 0, then k - 1 other ids with -inf (the same as
    ``target_probs(..., greedy).log().topk(k)``, up to the order of the -inf ids, which carry no mass)."""
    token = logits.argmax(-1, keepdim=True)  # ties: the lowest id, as target_probs
    if not k:
        return token, None
    ids = logits.scatter(-1, token, float("inf")).topk(k, dim=-1).indices  # argmax first, then distinct
    lp = torch.full(ids.shape, float("-inf"), device=ids.device)
    lp[:, 0] = 0.0
    return token, (lp, ids)


@torch.no_grad()
def sample_completions(
    hf: HFModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams,
    logprobs_k: int,
    generator: torch.Generator | None,
    taps: tuple[int, ...] | None = None,
    features_out: list | None = None,
    prompt_targets_out: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample ``max_new_tokens`` tokens after every prompt from p (``target_probs`` at ``sampling``).

    Returns completions [B, N] long, top-k ids [B, N, k] long and top-k log p [B, N, k] float32 (-inf where the
    sampling filter removed the token).

    ``taps``: also collect the outputs of those verifier layers for every prompt token and every completion token
    but the last (the ones the passes read) from the same forward passes, appended to ``features_out`` as one
    tensor [P_b + N - 1, taps * H] per prompt (a feature drafter's training context).

    ``prompt_targets_out``: also append, per prompt, the verifier's argmax after each of its tokens ([P_b] long,
    from the same prefill pass): greedy labels for windows anchored inside the prompt (see
    ``distill.feature.greedy_targets``).
    """
    from transformers import DynamicCache

    ids, valid, positions = causal_inputs(prompts)
    cache = DynamicCache()
    want_targets = prompt_targets_out is not None
    out = hf.logits(ids, attention_mask=valid.long(), position_ids=positions, cache=cache,
                    last=None if want_targets else 1, taps=taps)
    feats = []
    if taps:
        out, prefill = out
        feats.append(prefill.cpu())
    if want_targets:
        argmax = out.argmax(-1).cpu()  # [B, L_pad]; prompts are left-padded
        for i, p in enumerate(prompts):
            prompt_targets_out.append(argmax[i, ids.shape[1] - len(p) :])
    logits = out[:, -1]
    mask, pos = valid.long(), positions[:, -1:]
    tokens, top_ids, top_lp = [], [], []
    k = min(logprobs_k, hf.vocab_size)
    for step in range(max_new_tokens):
        if sampling.greedy:  # p is the argmax one-hot: skip the [B, V] softmax, log and multinomial draw
            token, top = _greedy_step(logits, k)
        else:
            p = target_probs(logits, sampling)  # [B, V]
            token = sample(p, generator)  # [B, 1]
            top = p.log().topk(k, dim=-1) if k else None
        tokens.append(token[:, 0])
        if top is not None:
            values, indices = top
            top_ids.append(indices)
            top_lp.append(values)
        if step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        pos = pos + 1
        out = hf.logits(token, attention_mask=mask, position_ids=pos, cache=cache, last=1, taps=taps)
        if taps:
            out, step_feats = out
            feats.append(step_feats.cpu())
        logits = out[:, -1]
    b = len(prompts)
    if taps and features_out is not None:
        every = torch.cat(feats, 1)  # [B, L_pad + N - 1, F]; prompts are left-padded
        pad = ids.shape[1]
        for i, p in enumerate(prompts):
            features_out.append(every[i, pad - len(p) :])
    completions = torch.stack(tokens, 1)
    if not k:
        return completions, torch.zeros(b, max_new_tokens, 0, dtype=torch.long), torch.zeros(b, max_new_tokens, 0)
    return completions, torch.stack(top_ids, 1), torch.stack(top_lp, 1).float()


class TeacherSampler:
    """Ray Data callable class: a batch of prompts (pyarrow) -> a batch of trajectory records (pyarrow).

    The verifier is loaded once per actor. Each actor draws from its own generator (seed + actor id), so actors
    and epochs get fresh samples. Past ``deadline`` (wall clock, ``time.time()``) an actor samples no more: the
    remaining batches come back empty (after at least one sampled batch), so a time-budgeted job trains on the
    prompts that came first.
    """

    engine = "hf"

    def __init__(self, verifier: dict, dtype: str, sampling: dict, max_new_tokens: int, logprobs_k: int,
                 max_prompt_tokens: int, seed: int, taps: list[int] | None = None, deadline: float | None = None,
                 events: Emitter | None = None):
        self._setup(verifier, sampling, max_new_tokens, logprobs_k, max_prompt_tokens, seed, taps, deadline, events)
        self.hf = HFModel(load_verifier_model(self.record.path, dtype))

    def _setup(self, verifier, sampling, max_new_tokens, logprobs_k, max_prompt_tokens, seed, taps,
               deadline=None, events: Emitter | None = None) -> None:
        self.events = events or Emitter()  # its line in the actor's log; its event to the driver's relay, if any
        keep_freed_memory()  # batched passes allocate the same large blocks batch after batch
        self.taps = tuple(taps) if taps else None  # a feature drafter's context: kept from the same passes
        self.record = VerifierRecord(**verifier)
        self.sampling = SamplingParams(**sampling)
        self.max_new_tokens = max_new_tokens
        self.logprobs_k = logprobs_k
        self.max_prompt_tokens = max_prompt_tokens
        self.tokenizer = None
        self.sampled = 0
        self.deadline, self.skipped, self.empty = deadline, 0, None  # empty: the output schema, zero rows
        actor = _actor_id()
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(actor.encode()))

    def _prompt_ids(self, table) -> list[list[int]]:
        if "prompt_ids" in table.column_names:
            prompts = [list(map(int, p)) for p in table.column("prompt_ids").to_pylist()]
        elif "prompt" in table.column_names:
            if self.tokenizer is None:
                from transformers import AutoTokenizer

                self.tokenizer = AutoTokenizer.from_pretrained(self.record.path)
            prompts = [self.tokenizer(t)["input_ids"] for t in table.column("prompt").to_pylist()]
        else:
            raise ValueError(f"prompt data must have a 'prompt_ids' or 'prompt' column, got {table.column_names}")
        bad = [p for p in prompts if not p]
        if bad:
            raise ValueError("prompt data must not contain empty prompts")
        return [p[-self.max_prompt_tokens :] for p in prompts]

    def __call__(self, table):
        import pyarrow as pa

        if self.empty is not None and self.deadline is not None and time.time() > self.deadline:
            if not self.skipped:  # one event, not one a batch
                self.events(TeacherBudgetSpent(self.sampled))
            self.skipped += table.num_rows
            return self.empty
        prompts = self._prompt_ids(table)
        completions, top_ids, top_lp, features, targets = self._sample(prompts)
        n = len(prompts)
        self.sampled += n
        # One event a batch: the job log (and the build's progress bar) shows the teacher advancing.
        self.events(TeacherSampled(n, self.sampled, self.engine))
        extra = {}
        if self.taps:
            from specdiff.distill.feature import encode_features

            extra["features"] = pa.array([encode_features(f) for f in features], type=pa.binary())
            extra["feature_layers"] = pa.array([json.dumps(list(self.taps))] * n)  # which layers they are
            extra["prompt_targets"] = pa.array([t.tolist() for t in targets], type=pa.list_(pa.int32()))
        out = pa.table({**extra,
            "prompt_ids": pa.array(prompts, type=pa.list_(pa.int32())),
            "completion_ids": pa.array(completions, type=pa.list_(pa.int32())),
            "topk_ids": pa.array(top_ids, type=pa.list_(pa.list_(pa.int32()))),
            "topk_logprobs": pa.array(top_lp, type=pa.list_(pa.list_(pa.float32()))),
            "verifier_name": pa.array([self.record.name] * n),
            "verifier_version": pa.array([self.record.version] * n),
            "verifier_digest": pa.array([self.record.digest] * n),
            "sampling": pa.array([json.dumps(asdict(self.sampling), sort_keys=True)] * n),
        })
        self.empty = out.schema.empty_table()
        return out

    def _sample(self, prompts: list[list[int]]):
        """-> completions [B][N], top-k ids [B][N][k], top-k log p [B][N][k] (lists), and with taps the features
        [P_b + N - 1, F] and prompt targets [P_b] per prompt (else empty / None)."""
        features: list[torch.Tensor] = []
        targets: list[torch.Tensor] | None = [] if self.taps else None
        completions, top_ids, top_lp = sample_completions(
            self.hf, prompts, self.max_new_tokens, self.sampling, self.logprobs_k, self.generator,
            taps=self.taps, features_out=features, prompt_targets_out=targets,
        )
        return completions.tolist(), top_ids.tolist(), top_lp.tolist(), features, targets


def _actor_id() -> str:
    import ray

    if not ray.is_initialized():  # outside Ray (unit tests): one deterministic stream
        return "local"
    return ray.get_runtime_context().get_actor_id() or "driver"


def read_records(path: str, num_cpus: float):
    """A Ray dataset of prompts or trajectories from .jsonl/.json or .parquet (a file or a folder)."""
    import ray.data

    if path.endswith((".jsonl", ".json")):
        return ray.data.read_json(path, num_cpus=num_cpus)
    return ray.data.read_parquet(path, num_cpus=num_cpus)


def teacher_dataset(prompts, verifier: VerifierRecord, cfg, taps: list[int] | None = None, *,
                    whole_batches: bool = True, deadline: float | None = None,
                    events: Emitter | None = None) -> object:
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
    from specdiff.distill.teacher_vllm import VLLMTeacherSampler, choose_engine

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
