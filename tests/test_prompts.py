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

    from specdiff.prompt_data import CHAT_QUESTIONS, CODE_STUBS

    code, chat = load_prompts("code", "train"), load_prompts("chat", "train")
    assert len(code) == 124 + len(CODE_STUBS) and len(chat) == 36 + len(CHAT_QUESTIONS)
    assert len(set(code)) == len(code) and len(set(chat)) == len(chat)
    evaluation = " ".join(load_prompts("chat", "eval")).lower()
    for stub in CODE_STUBS:  # a signature and a docstring, no body: the verifier writes the body
        (fn,) = [n for n in ast.parse(stub + "    pass\n").body if isinstance(n, ast.FunctionDef)]
        assert ast.get_docstring(fn) and ">>>" in stub and len(fn.body) == 2  # docstring, pass
        assert f"def {fn.name}(" not in " ".join(load_prompts("code", "eval"))
    assert all(q.lower() not in evaluation for q in CHAT_QUESTIONS)


def test_training_prompts_come_in_priority_order():
    """A time-budgeted teacher samples a prefix of this list: the sets the recipe was first measured on come first,
    and any prefix keeps each domain's share."""
    from collections import Counter

    from specdiff.prompts import training_prompts

    ordered = training_prompts()
    everything = [(d, p) for d in DOMAINS for p in load_prompts(d, "train")]
    assert sorted(ordered) == sorted(everything)  # the same prompts (math draws one problem twice)
    core = Counter(d for d, _ in ordered[:560])
    assert core == {"code": 124, "math": 400, "chat": 36}
    assert {p for d, p in ordered[:560] if d == "chat"} == set(load_prompts("chat", "train", 36))
    head = Counter(d for d, _ in ordered[:280])  # half the core: half of each domain's
    assert all(abs(head[d] - core[d] / 2) <= 1 for d in DOMAINS)
    assert training_prompts(10) == ordered[:10]
