"""The teacher stage's Hugging Face sampler: ``TeacherSampler`` is the Ray Data callable class (one per actor of the
pool, each holding the frozen verifier) that turns a batch of prompts into trajectory records with
``trajectories.sample_completions``. A record holds the prompt ids, the completion ids, the verifier's identity, the
sampling settings, and the top-k log-probs of the verifier's sampling distribution p at every completion position.
``teacher_stage.teacher_dataset`` wires prompts -> ``map_batches`` -> records that stream into training.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict

import torch

from specdiff.core.config import SamplingParams
from specdiff.distill.trajectories import causal_inputs  # noqa: F401 (moved there; kept importable from here)
from specdiff.distill.trajectories import encode_features, load_teacher_model, sample_completions
from specdiff.distill.trajectories import load_verifier_model  # noqa: F401 (kept importable from here)
from specdiff.lineage.verifier import VerifierRecord
from specdiff.lineage.verifier import WEIGHT_SUFFIXES, verifier_record  # noqa: F401 (moved there; kept importable)
from specdiff.models.hf import HFModel
from specdiff.runtime.memory import keep_freed_memory
from specdiff.distill.events import Emitter, TeacherBudgetSpent, TeacherSampled


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
        self.hf = load_teacher_model(self.record.path, dtype)  # the lean Llama forward where it is exact
        if not isinstance(self.hf, HFModel):
            self.engine = "hf, lean Llama forward"

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


