"""Prompt sources nobody here wrote (specdiff.prompts.corpus, specdiff.prompts.word_problems, specdiff.distill.selfwritten): their
evaluation splits never share a file, a topic, a template or a request with training."""

import ast

import pytest
import torch

from specdiff.prompts import corpus
from specdiff.prompts import DISJOINT_SETS, Prompt, eval_prompts, prompt_ids, source_prompts, training_mix


def test_code_and_prose_splits_share_no_file_and_no_text():
    root = corpus.Path(corpus.sysconfig.get_paths()["stdlib"])
    splits = {f: corpus.split_of(f.relative_to(root).as_posix()) for f in corpus.stdlib_files()}
    assert 0.06 < sum(s == "eval" for s in splits.values()) / len(splits) < 0.2
    assert not any("test" in f.parts or "site-packages" in f.parts for f in splits)
    for kind in ("code", "prose"):
        make = corpus.code_prompts if kind == "code" else corpus.prose_prompts
        train, held = make("train", 120), make("eval", 40)
        assert len(train) == 120 and len(held) == 40 and len(set(held)) == 40
        assert not set(train) & set(held)
        assert make("eval", 40) == held  # deterministic
    with pytest.raises(ValueError, match="split must be 'train' or 'eval', got 'dev'"):
        corpus.code_prompts("dev", 3)


def test_function_prompts_stop_before_the_body():
    source = ('import os\n\n\ndef join(a, b):\n    """Join two paths."""\n    x = os.path.join(a, b)\n'
              '    return x\n\n\ndef short():\n    return 1\n\n\ndef bare(x):\n    y = x + 1\n    return y\n')
    prompts = corpus.function_prompts(source)
    assert prompts[0] == 'import os\n\n\ndef join(a, b):\n    """Join two paths."""\n'
    assert prompts[1].endswith("def bare(x):\n") and "y = x + 1" not in prompts[1]
    assert len(prompts) == 2  # `short` has one statement: nothing to write
    assert corpus.function_prompts("def broken(:\n") == []


def test_word_problem_generators_share_no_template_with_training():
    held = source_prompts("math-other", "eval", 60)
    train = training_mix([], mix={"math": 400, "math-broad": 300})
    assert len({p.text for p in held}) == 60
    stems = {" ".join(p.text.split()[:4]) for p in held}
    assert not any(" ".join(p.text.split()[:4]) in stems for p in train)
    with pytest.raises(ValueError, match="math-other is an evaluation source"):
        source_prompts("math-other", "train", 3)
    with pytest.raises(ValueError, match="math-broad is a training source"):
        source_prompts("math-broad", "eval", 3)
    with pytest.raises(ValueError, match="source must be one of"):
        source_prompts("poetry", "train", 3)


def test_disjoint_eval_sets_never_appear_in_training():
    train = {p.text for p in training_mix(["a request of the training seed"] * 130)}
    held = eval_prompts(DISJOINT_SETS, 12, lambda n: [f"held-out request {i}" for i in range(n)])
    assert set(held) == set(DISJOINT_SETS)
    for name, prompts in held.items():
        assert len(prompts) == 12, name
        assert not {p.text for p in prompts} & train, name
    assert all(p.raw for p in held["code-raw"]) and not any(p.raw for p in held["code-chat"])
    assert all(p.text.startswith(corpus.CODE_INSTRUCTIONS["eval"]) for p in held["code-chat"])
    with pytest.raises(ValueError, match="chat-self set needs the verifier"):
        eval_prompts(["chat-self"], 2)


class WordTokenizer:
    """Ids are words of a tiny vocabulary; a ChatML-like template."""

    def __init__(self, vocab_size):
        self.words = ["<eos>"] + [f"w{i}" for i in range(1, vocab_size)]
        self.eos_token_id = 0

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        text = "".join(f"[{m['role']}] {m['content']} <eos> " for m in messages)
        return text if not tokenize else self.encode(text)

    def encode(self, text, add_special_tokens=True):
        return [self.words.index(w) if w in self.words else 1 for w in text.split()]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.words[i] for i in ids if not (skip_special_tokens and i == 0))


def test_self_written_requests_are_seeded_filtered_and_exclude_the_heldout(tmp_path):
    from helpers import tiny_llama

    from specdiff.distill.selfwritten import (cached_heldout, keep, self_written_prompts, user_turn_header,
                                             write_packaged)
    from specdiff.models.hf import HFModel

    tok = WordTokenizer(64)
    assert user_turn_header(tok) == tok.encode("[user]")
    model = HFModel(tiny_llama(64, seed=3, init_std=0.4))  # peaked logits: some samples end early (<eos>)
    kept = self_written_prompts(model, tok, 50, seed=5, batch_size=32, max_batches=3)
    assert kept, "a random model with peaked logits writes some short requests"
    assert kept == self_written_prompts(model, tok, 50, seed=5, batch_size=32, max_batches=3)
    assert all(keep(t) for t in kept) and len(set(kept)) == len(kept)
    calls = []
    held = cached_heldout(tmp_path, "float32", lambda: calls.append(1) or (model, tok))
    assert cached_heldout(tmp_path, "float32", lambda: calls.append(1) or (model, tok)) == held and calls == [1]
    record = write_packaged(model, tok, tmp_path / "packaged.json", 20)
    assert record["heldout"] == held  # the same seed and batch as the cached held-out set
    assert record["train"] and not set(record["train"]) & set(held)
    assert not keep("loop loop loop loop loop loop") and not keep("hi")
    assert keep("How do I bake a simple loaf of bread?")


def test_raw_prompts_carry_no_template():
    class Tok(WordTokenizer):
        pass

    tok = Tok(64)
    assert prompt_ids(tok, Prompt("code-raw", "w3 w4", raw=True)) == [3, 4]
    assert prompt_ids(tok, Prompt("code-chat", "w3 w4")) != [3, 4]
