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
