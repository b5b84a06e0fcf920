"""The teacher stage on vLLM: the same trajectory records as ``teacher.TeacherSampler``, sampled by a vLLM engine in
the Ray Data actor (``teacher.engine: vllm``; ``auto`` picks it when vLLM is installed and the actor has a GPU).

vLLM samples the completions (continuous batching, its own kernels) and returns the top-k log-probs of the
distribution it sampled from (``logprobs_mode="processed_logprobs"``: after temperature, top-k and top-p, so the
records hold the same p as the Hugging Face sampler's; greedy: the argmax with log p 0 and k - 1 ids at -inf, as
``trajectories._greedy_step``). A feature drafter's context (the tapped verifier states of every prompt token and every
completion token but the last, and the verifier's argmax after each prompt token) is not something vLLM exposes: one
batched Hugging Face pass over the finished sequences computes it (a prefill, no decoding).

Measured on CPU in ``docs/distill.md`` (vLLM's CPU worker computes on one core and keeps the other for its
frontend, so on a 2-core machine the Hugging Face sampler stays the default there).
"""

from __future__ import annotations

import torch

from specdiff.models.dtypes import dtype_name, resolve_dtype
from specdiff.models.hf import HFModel
from specdiff.distill.teacher import TeacherSampler
from specdiff.distill.trajectories import causal_inputs, load_verifier_model

FEATURE_CHUNK = 8  # sequences per feature pass (its logits are [chunk, L, V] floats)


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # not installed, or a broken build (the CPU wheel's torchvision, ...)
        return False
    return True


def choose_engine(engine: str, gpus_per_actor: float) -> str:
    """``teacher.engine`` -> "hf" or "vllm". auto: vLLM where it is installed and the actor has a GPU; on a CPU the
    Hugging Face sampler (measured faster on 2 cores, docs/distill.md)."""
    if engine == "vllm":
        if not vllm_available():
            raise ValueError("teacher.engine is 'vllm' but vLLM does not import here; install the vLLM extra "
                             "(README: 'vLLM engine') or set teacher.engine: hf")
        return "vllm"
    if engine == "auto":
        return "vllm" if gpus_per_actor > 0 and vllm_available() else "hf"
    return "hf"


class VLLMTeacherSampler(TeacherSampler):
    """``TeacherSampler`` with a vLLM engine sampling (same constructor arguments, same records)."""

    engine = "vllm"

    def __init__(self, verifier: dict, dtype: str, sampling: dict, max_new_tokens: int, logprobs_k: int,
                 max_prompt_tokens: int, seed: int, taps: list[int] | None = None, deadline: float | None = None,
                 events=None):
        self._setup(verifier, sampling, max_new_tokens, logprobs_k, max_prompt_tokens, seed, taps, deadline, events)
        from vllm import LLM

        torch_dtype = resolve_dtype(dtype)
        self.llm = LLM(
            model=self.record.path,
            dtype=dtype_name(torch_dtype),
            seed=seed,
            max_model_len=max_prompt_tokens + max_new_tokens + 1,
            max_logprobs=max(self.logprobs_k, 1),
            logprobs_mode="processed_logprobs",
            enforce_eager=not torch.cuda.is_available(),  # CPU: no compilation (minutes on 2 cores)
            skip_tokenizer_init=True,  # token ids in, token ids out
        )
        # The feature pass (a feature drafter only): the same weights as Hugging Face runs them in training.
        self.hf = HFModel(load_verifier_model(self.record.path, dtype)) if self.taps else None

    def _sample(self, prompts: list[list[int]]):
        from vllm import SamplingParams as VLLMSampling
        from vllm.inputs import TokensPrompt

        s, n, k = self.sampling, self.max_new_tokens, self.logprobs_k
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=self.generator).tolist()
        params = [VLLMSampling(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or -1, max_tokens=n,
                               min_tokens=n, ignore_eos=True, logprobs=k or None, seed=seed, detokenize=False)
                  for seed in seeds]  # a fixed length, as the HF sampler (every worker gets the same windows)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        completions, top_ids, top_lp = [], [], []
        for out in outs:
            sample = out.outputs[0]
            completions.append(list(sample.token_ids))
            ids, lps = [], []
            for position in sample.logprobs or [[]] * n:
                ranked = sorted((lp.rank, tok, lp.logprob) for tok, lp in position.items() if lp.rank <= k)[:k]
                ids.append([tok for _, tok, _ in ranked])
                lps.append([0.0 if s.greedy and r == 1 else (float("-inf") if s.greedy else lp)
                            for r, _, lp in ranked])
            top_ids.append(ids)
            top_lp.append(lps)
        features, targets = self._features(prompts, completions) if self.taps else ([], None)
        return completions, top_ids, top_lp, features, targets

    @torch.no_grad()
    def _features(self, prompts: list[list[int]], completions: list[list[int]]):
        """Tapped states of prompt + completion[:-1] and the argmax after each prompt token: one prefill pass."""
        features, targets = [], []
        for lo in range(0, len(prompts), FEATURE_CHUNK):
            seqs = [p + c[:-1] for p, c in zip(prompts[lo:lo + FEATURE_CHUNK], completions[lo:lo + FEATURE_CHUNK])]
            ids, valid, positions = causal_inputs(seqs)
            logits, every = self.hf.logits(ids, attention_mask=valid.long(), position_ids=positions, taps=self.taps)
            width = ids.shape[1]
            for i, (seq, p) in enumerate(zip(seqs, prompts[lo:lo + FEATURE_CHUNK])):
                start = width - len(seq)  # left-padded
                features.append(every[i, start:].cpu())
                targets.append(logits[i, start:start + len(p)].argmax(-1).cpu())
        return features, targets
