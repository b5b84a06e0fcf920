"""Write tiny offline assets for jobs/configs/tiny.yaml: a tiny Llama verifier and prompt files.

    python jobs/make_tiny.py --out artifacts/tiny

The verifier is a real ``LlamaForCausalLM`` (saved with save_pretrained) whose weights are set so that it speaks a
tiny language: after token x comes σ(x), σ a random cycle over the vocabulary, with probability set by
``sharpness``; the rest of the mass is spread by random embedding overlaps. A drafter must learn to read the last
prefix token and to compose σ along the window, which a small one does in tens of steps on a CPU: a smoke test of
the whole pipeline, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def tiny_verifier(vocab_size: int = 32, *, hidden_size: int = 64, layers: int = 2, sharpness: float = 0.6,
                  seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    cycle = torch.randperm(vocab_size, generator=gen)
    successor = torch.empty(vocab_size, dtype=torch.long)
    successor[cycle] = cycle.roll(-1)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream carries the current token's embedding unchanged
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = torch.randn(vocab_size, hidden_size, generator=gen)
        model.model.embed_tokens.weight.copy_(emb)
        unit = emb / emb.norm(dim=-1, keepdim=True)
        head = torch.empty_like(unit)
        head[successor] = unit  # logit of σ(x) after x: sharpness * |normed e_x| = sharpness * sqrt(hidden)
        model.lm_head.weight.copy_(sharpness * head)
    return model


def write_prompts(path: Path, count: int, vocab_size: int, seed: int, length: tuple[int, int] = (4, 12)) -> None:
    gen = torch.Generator().manual_seed(seed)
    with path.open("w") as f:
        for _ in range(count):
            n = int(torch.randint(length[0], length[1] + 1, (1,), generator=gen))
            f.write(json.dumps({"prompt_ids": torch.randint(vocab_size, (n,), generator=gen).tolist()}) + "\n")


def make_tiny(out: str | Path, *, vocab_size: int = 32, train_prompts: int = 2400, heldout_prompts: int = 32,
              sharpness: float = 0.6, seed: int = 0) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tiny_verifier(vocab_size, sharpness=sharpness, seed=seed).save_pretrained(out / "verifier")
    write_prompts(out / "prompts.jsonl", train_prompts, vocab_size, seed + 1)
    write_prompts(out / "heldout.jsonl", heldout_prompts, vocab_size, seed + 2)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="artifacts/tiny")
    parser.add_argument("--vocab-size", type=int, default=32)
    parser.add_argument("--sharpness", type=float, default=0.6)
    args = parser.parse_args()
    print(make_tiny(args.out, vocab_size=args.vocab_size, sharpness=args.sharpness))
