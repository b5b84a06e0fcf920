from specdiff.prompts import DOMAINS, load_prompts, write_jsonl

import json

import pytest


@pytest.mark.parametrize("domain", DOMAINS)
def test_splits_are_disjoint_and_nonempty(domain):
    train, evaluation = load_prompts(domain, "train"), load_prompts(domain, "eval")
    assert len(train) >= 30 and len(evaluation) >= 10
    assert not set(train) & set(evaluation)
    assert load_prompts(domain, "eval") == evaluation  # deterministic


def test_jsonl_and_bad_names(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", domains=("math", "chat"), split="eval", limit=3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["domain"] for r in rows] == ["math"] * 3 + ["chat"] * 3
    with pytest.raises(ValueError, match="domain must be one of .*, got 'poetry'"):
        load_prompts("poetry", "train")
    with pytest.raises(ValueError, match="split must be 'train' or 'eval', got 'test'"):
        load_prompts("code", "test")


def test_training_splits_hold_the_extra_prompts():
    import ast

    from specdiff.prompts.extra import CHAT_QUESTIONS, CODE_STUBS

    code, chat = load_prompts("code", "train"), load_prompts("chat", "train")
    assert len(code) == 124 + len(CODE_STUBS) and len(chat) == 36 + len(CHAT_QUESTIONS)
    assert len(set(code)) == len(code) and len(set(chat)) == len(chat)
    evaluation = " ".join(load_prompts("chat", "eval")).lower()
    for stub in CODE_STUBS:  # a signature and a docstring, no body: the verifier writes the body
        (fn,) = [n for n in ast.parse(stub + "    pass\n").body if isinstance(n, ast.FunctionDef)]
        assert ast.get_docstring(fn) and ">>>" in stub and len(fn.body) == 2  # docstring, pass
        assert f"def {fn.name}(" not in " ".join(load_prompts("code", "eval"))
    assert all(q.lower() not in evaluation for q in CHAT_QUESTIONS)


def test_training_mix_interleaves_every_source_in_proportion():
    """A time-budgeted teacher samples a prefix of the mix: any prefix keeps each source's share."""
    from collections import Counter

    from specdiff.prompts import SELF_WRITTEN, TRAINING_MIX, training_mix

    requests = [f"request number {i} about something" for i in range(TRAINING_MIX[SELF_WRITTEN])]
    mix = training_mix(requests)
    assert Counter(p.source for p in mix) == TRAINING_MIX
    half = Counter(p.source for p in mix[: len(mix) // 2])
    assert all(abs(half[s] - n / 2) <= 1 for s, n in TRAINING_MIX.items())
    assert {p.source for p in mix if p.raw} == {"code-raw", "prose-raw"}
    assert [p.text for p in mix if p.source == SELF_WRITTEN] == requests
