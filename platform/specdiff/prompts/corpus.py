"""Prompts cut from real text that every machine of the project has: nothing here was written for the project.

- **code**: Python functions of the standard library. A prompt is a function's lines up to the end of its
  signature and docstring, with the few lines before it; the verifier writes the body. The library's files are
  split by a hash of their path: ``train`` and ``eval`` never share a file.
- **prose**: the Python documentation's topics (``pydoc_data.topics``, shipped with every CPython), cut at a
  sentence boundary; topics are split by name the same way.

Each is used in two forms (``specdiff.prompts``): as a raw completion (the text itself, no chat template, what a
``/v1/completions`` client sends) and wrapped in a user message ("complete this code"). The instruction wordings
of the two splits differ too, so a held-out prompt shares neither its text nor its wording with training.

Pure Python (``ast``, ``sysconfig``): no torch, no tokenizer.
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
import zlib
from functools import lru_cache
from pathlib import Path

EVAL_SHARE = 8  # one file (or topic) in 8 is held out, chosen by a hash of its name
# Folders of the standard library left out: tests and demos (odd code), vendored or generated sources.
_SKIP = ("test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "dist-packages", "ensurepip",
         "pydoc_data", "__pycache__", "encodings", "config-3")
MAX_PROMPT_CHARS = 1400  # about 350 tokens: more than data.max_prompt_tokens keeps, so a cut never starts mid-line
CONTEXT_LINES = 12  # lines before the function kept in front of it (imports, a class header, the previous function)

CODE_INSTRUCTIONS = {
    "train": ("Complete this Python code.", "Finish the implementation of this function.",
              "Write the body of the following Python function.", "Continue this Python code.",
              "Implement the function below."),
    "eval": ("Here is part of a Python module. Please complete the function.",
             "Can you finish writing this function?"),
}
PROSE_INSTRUCTIONS = {
    "train": ("Continue this text.", "Continue the following passage.", "Write the next few sentences of this text."),
    "eval": ("Please keep writing from where this text stops:",),
}


def split_of(name: str) -> str:
    """``eval`` for one name in ``EVAL_SHARE`` (a stable hash, the same on every machine), else ``train``."""
    return "eval" if zlib.crc32(name.encode()) % EVAL_SHARE == 0 else "train"


@lru_cache(maxsize=1)
def stdlib_files() -> tuple[Path, ...]:
    """The standard library's own ``.py`` files, sorted (its tests, demos and vendored code left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _SKIP or part.startswith("test") for part in rel.parts[:-1]) or rel.name.startswith("test"):
            continue
        files.append(path)
    return tuple(files)


def function_prompts(source: str) -> list[str]:
    """Every function of ``source`` with a body of at least two statements, cut after its signature and docstring
    (the body is what the verifier writes), with up to ``CONTEXT_LINES`` lines before it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
            continue
        first = node.body[0]
        has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
            and isinstance(first.value.value, str)
        end = first.end_lineno if has_doc else node.body[0].lineno - 1  # 1-based, inclusive
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        begin = max(0, start - 1 - CONTEXT_LINES)
        text = "".join(lines[begin:end])
        if len(text) > MAX_PROMPT_CHARS:  # cut at a line's start, never inside one
            text = text[-MAX_PROMPT_CHARS:]
            text = text[text.find("\n") + 1:]
        if len(text.strip()) >= 40:
            out.append(text)
    return out


@lru_cache(maxsize=None)
def _file_prompts(path: Path) -> tuple[str, ...]:
    """``function_prompts`` of one file, parsed once a process (code-raw and code-chat read the same files)."""
    try:
        return tuple(function_prompts(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError):
        return ()


def code_prompts(split: str, n: int, seed: int = 0) -> list[str]:
    """``n`` function prefixes from the standard library files of ``split``, one per file in a seeded order, then
    a second round over the files, and so on (many files rather than many functions of one)."""
    _check_split(split)
    rng = random.Random(f"code-{split}-{seed}")
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in stdlib_files() if split_of(f.relative_to(root).as_posix()) == split]
    rng.shuffle(files)
    per_file: list[list[str]] = []
    for path in files:
        prompts = list(_file_prompts(path))
        if prompts:
            rng.shuffle(prompts)
            per_file.append(prompts)
        if sum(len(p) for p in per_file) >= 4 * n and len(per_file) >= n:
            break
    out: list[str] = []
    for depth in range(max((len(p) for p in per_file), default=0)):
        out += [p[depth] for p in per_file if depth < len(p)]
        if len(out) >= n:
            break
    return out[:n]


def prose_prompts(split: str, n: int, seed: int = 0, chars: tuple[int, int] = (300, 900)) -> list[str]:
    """``n`` passages of the Python documentation's topics of ``split``, each starting at a paragraph and ending at
    a sentence's end, ``chars`` long."""
    _check_split(split)
    from pydoc_data.topics import topics

    rng = random.Random(f"prose-{split}-{seed}")
    names = sorted(name for name in topics if split_of(name) == split)
    paragraphs = list(dict.fromkeys(p for name in names for p in _paragraphs(topics[name])))
    if split == "eval":  # topics repeat one another's paragraphs: a held-out one is in no training topic
        seen = {p for name in topics if split_of(name) == "train" for p in _paragraphs(topics[name])}
        paragraphs = [p for p in paragraphs if p not in seen]
    rng.shuffle(paragraphs)
    out = []
    for text in paragraphs:
        cut = _sentence_cut(text, rng.randint(*chars))
        if cut:
            out.append(cut)
        if len(out) == n:
            break
    return out


def _paragraphs(text: str) -> list[str]:
    """Runs of prose (code samples, tables and very short paragraphs left out), joined up to ~2000 characters."""
    out, run = [], ""
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip().splitlines()
        if not lines or lines[0].startswith(" ") or sum(c.isalpha() for c in block) < 0.7 * len(block.strip()) \
                or len(block.strip()) < 80:
            if run:
                out.append(run)
            run = ""
            continue
        run = f"{run}\n\n{' '.join(l.strip() for l in lines)}" if run else " ".join(l.strip() for l in lines)
        if len(run) > 2000:
            out.append(run)
            run = ""
    if run:
        out.append(run)
    return out


def _sentence_cut(text: str, limit: int) -> str | None:
    """``text`` up to the last sentence end before ``limit`` characters (None if there is none past 120)."""
    head = text[:limit]
    ends = [m.end() for m in re.finditer(r"[.!?:](?=\s)", head)]
    ends = [e for e in ends if e >= 120]
    return head[: ends[-1]] if ends else None


def wrap_code(snippet: str, split: str, rng: random.Random) -> str:
    """The snippet as a user message, with one of ``split``'s instruction wordings."""
    return f"{rng.choice(CODE_INSTRUCTIONS[split])}\n\n```python\n{snippet}```"


def wrap_prose(passage: str, split: str, rng: random.Random) -> str:
    return f"{rng.choice(PROSE_INSTRUCTIONS[split])}\n\n{passage}"


def _check_split(split: str) -> None:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
