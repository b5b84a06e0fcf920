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


def test_code_train_split_adds_stdlib_functions_humaneval_style():
    import ast

    from specdiff.prompts import _stdlib_functions, stdlib_functions

    functions = stdlib_functions(300)
    assert len(functions) >= 100 and len(set(functions)) == len(functions)
    _stdlib_functions.cache_clear()
    assert stdlib_functions(300) == functions  # seeded: the same on every run of one Python
    for source in functions:
        node = ast.parse(source + "    pass\n").body[0]  # signature and docstring only: a body completes it
        assert isinstance(node, ast.FunctionDef) and ast.get_docstring(node)
        assert len(node.body) == 2
    train = load_prompts("code", "train")
    assert len(train) == 124 + len(functions)
    assert train[124].startswith("Complete this Python function.\n\n```python\ndef ")
