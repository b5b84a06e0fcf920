"""The iso-cost control: a small autoregressive drafter for Hugging Face assisted generation, trained on the same
teacher trajectories as the diffusion drafter (pure torch, one process; no Ray).

It has the diffusion drafter's shape (the same inherited verifier layers, embeddings and head, the verifier's own
vocabulary so ``generate(assistant_model=...)`` accepts it) and learns next-token prediction on the teacher's
completions: sequence-level distillation, the AR counterpart of what the diffusion drafter is trained on.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from specdiff.distill.trajectories import causal_inputs


def ar_drafter_from_verifier(verifier: torch.nn.Module, layers: Sequence[int]) -> torch.nn.Module:
    """A causal LM of ``len(layers)`` of the verifier's decoder layers, with its embeddings, final norm and head."""
    from transformers import AutoModelForCausalLM

    src = verifier.model.layers
    bad = [i for i in layers if not 0 <= i < len(src)]
    if not layers or bad:
        raise ValueError(f"layers must be indices into the verifier's {len(src)} layers, got {list(layers)}")
    config = type(verifier.config)(**{**verifier.config.to_dict(), "num_hidden_layers": len(layers)})
    model = AutoModelForCausalLM.from_config(config).to(next(verifier.parameters()).dtype)
    state = {k: v for k, v in verifier.state_dict().items() if not k.startswith("model.layers.")}
    for dst, i in enumerate(layers):
        prefix = f"model.layers.{i}."
        state.update({f"model.layers.{dst}." + k[len(prefix):]: v for k, v in verifier.state_dict().items()
                      if k.startswith(prefix)})
    model.load_state_dict(state, strict=False)
    return model


def completion_nll(model: torch.nn.Module, records: Sequence[dict]) -> torch.Tensor:
    """Mean next-token NLL of the completions given their prompts (teacher forcing; prompt tokens not scored). The
    LM head runs on the completion rows only (on a 49k vocabulary it would otherwise dominate the step)."""
    seqs = [list(r["prompt_ids"]) + list(r["completion_ids"]) for r in records]
    ids, valid, positions = causal_inputs(seqs)
    hidden = model.model(input_ids=ids, attention_mask=valid.long(), position_ids=positions).last_hidden_state
    n = max(len(r["completion_ids"]) for r in records)
    rows = hidden[:, -n - 1 : -1]  # outputs that predict the last n tokens
    targets = ids[:, -n:]
    scored = torch.zeros_like(targets, dtype=torch.bool)
    for b, r in enumerate(records):
        scored[b, n - len(r["completion_ids"]) :] = True
    logits = model.get_output_embeddings()(rows).float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return (nll * scored).sum() / scored.sum()


def train_ar_drafter(
    model: torch.nn.Module,
    records: Sequence[dict],
    *,
    steps: int,
    batch_size: int = 4,
    lr: float = 1e-3,
    warmup_steps: int = 10,
    max_prompt_tokens: int = 96,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
) -> torch.nn.Module:
    """AdamW with linear warm-up and cosine decay over ``steps`` batches of teacher trajectories (records with
    ``prompt_ids`` and ``completion_ids``); prompts are cut to their last ``max_prompt_tokens``."""
    from specdiff.distill.train import lr_factor

    if not records:
        raise ValueError("records must hold at least one teacher trajectory, got none")
    records = [{"prompt_ids": list(r["prompt_ids"])[-max_prompt_tokens:], "completion_ids": r["completion_ids"]}
               for r in records]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup_steps, steps, "cosine"))
    order = torch.randperm(len(records), generator=torch.Generator().manual_seed(seed)).tolist()
    model.train()
    for step in range(steps):
        batch = [records[order[(step * batch_size + i) % len(order)]] for i in range(batch_size)]
        loss = completion_nll(model, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if progress is not None:
            progress(step + 1, float(loss))
    return model.eval()
