"""User prompt datasets (specdiff.distill.datasets): JSONL, JSON and parquet with a `prompt`, `messages` or
`prompt_ids` column are tokenized on the driver into the same prompt ids the teacher reads; bad files fail before
Ray starts, naming the file and the line or row; empty prompts are dropped and over-long ones cut, both counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specdiff.distill import load_config
from specdiff.distill.datasets import data_dir, prepare_data, prepare_dataset, tokenizer_loader

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "jobs" / "configs" / "tiny.yaml"

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 2 and 3."}]
SHAREGPT = [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Add 2 and 3."}]


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    """A tiny Llama verifier folder with a byte-level tokenizer and a ChatML chat template (no hub access)."""
    from helpers import tiny_llama

    from specdiff.serving.models import byte_tokenizer

    folder = tmp_path_factory.mktemp("verifier")
    tokenizer = byte_tokenizer()
    tiny_llama(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tok(verifier):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(verifier)  # what the teacher tokenized `prompt` text with


def template(tok, turns) -> list[int]:
    out = tok.apply_chat_template(turns, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def write(path: Path, rows: list[dict]) -> Path:
    """rows -> .jsonl, .json (a list), .parquet (a file) or a folder of two parquet files, by the path's name."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.mkdir()
        half = max(1, len(rows) // 2)
        pq.write_table(pa.Table.from_pylist(rows[:half]), path / "part-0.parquet")
        pq.write_table(pa.Table.from_pylist(rows[half:]), path / "part-1.parquet")
    return path


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def prepare(path: Path, verifier: Path, max_prompt_tokens: int = 256, field: str = "data.prompts"):
    """-> (counts, records of the normalized file the job's Ray Data reads)."""
    dest = path.parent / f"normalized-{path.name}.jsonl"
    counts = prepare_dataset(str(path), str(dest), field=field, tokenizer=tokenizer_loader(str(verifier)),
                             max_prompt_tokens=max_prompt_tokens, vocab_size=300)
    return counts, (read_jsonl(dest) if counts is not None else None)


FORMATS = ["p.jsonl", "p.json", "p.parquet", "folder"]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("column", ["prompt", "messages", "prompt_ids"])
def test_each_format_and_column_gives_the_prompt_ids(tmp_path, verifier, tok, name, column):
    texts = ["def add(a, b):", "The sum of 2 and 3 is", "Hello"]
    values = {
        "prompt": (texts, [tok(t)["input_ids"] for t in texts]),
        "messages": ([[{"role": "user", "content": t}] for t in texts],
                     [template(tok, [{"role": "user", "content": t}]) for t in texts]),
        "prompt_ids": ([[1, 2, 3], [4, 5], [299]], [[1, 2, 3], [4, 5], [299]]),
    }[column]
    rows = [{column: v, "domain": d} for v, d in zip(values[0], ["code", "math", "chat"])]
    counts, out = prepare(write(tmp_path / name, rows), verifier)
    assert [r["prompt_ids"] for r in out] == values[1]
    assert [r["domain"] for r in out] == ["code", "math", "chat"]  # other columns pass through, in order
    assert set(out[0]) == {"prompt_ids", "domain"}
    assert (counts.column, counts.rows, counts.kept, counts.dropped_empty, counts.truncated) == (column, 3, 3, 0, 0)


def test_prompt_text_is_tokenized_as_the_teacher_did_no_template_no_added_bos(tmp_path, verifier, tok):
    # The teacher tokenized `prompt` with AutoTokenizer(path)(text)["input_ids"]; the ids must not change. The byte
    # tokenizer (like SmolLM2's) adds no BOS: the ids are exactly the text's bytes.
    text = "x = 1  # naïve"
    _, out = prepare(write(tmp_path / "p.jsonl", [{"prompt": text}]), verifier)
    assert out[0]["prompt_ids"] == tok(text)["input_ids"] == list(text.encode())


def test_messages_sharegpt_and_a_final_assistant_turn(tmp_path, verifier, tok):
    want = template(tok, CHAT)
    assert tok.decode(want).endswith("<|im_start|>assistant\n")  # add_generation_prompt
    rows = [{"messages": CHAT},
            {"messages": SHAREGPT},
            {"messages": CHAT + [{"role": "assistant", "content": "5"}]},  # the prompt of that reply
            {"messages": SHAREGPT + [{"from": "gpt", "value": "5"}]},
            {"messages": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": [{"type": "text", "text": "Add 2 "}, {"type": "text",
                                                                                           "text": "and 3."}]}]}]
    counts, out = prepare(write(tmp_path / "m.jsonl", rows), verifier)
    assert [r["prompt_ids"] for r in out] == [want] * 5
    longer = CHAT + [{"role": "assistant", "content": "5"}, {"role": "user", "content": "Times 4?"}]
    _, out = prepare(write(tmp_path / "m2.jsonl", [{"messages": longer}]), verifier)
    assert out[0]["prompt_ids"] == template(tok, longer)  # a user turn last: the whole conversation


def test_empty_prompts_are_dropped_and_counted(tmp_path, verifier):
    cases = {
        "prompt": ["", "ok", "   \n"],
        "prompt_ids": [[], [7], []],
        "messages": [[], [{"role": "user", "content": "ok"}], [{"role": "user", "content": ""}],
                     [{"role": "assistant", "content": "only a reply"}]],
    }
    for column, values in cases.items():
        rows = [{column: v, "i": i} for i, v in enumerate(values)]
        counts, out = prepare(write(tmp_path / f"{column}.jsonl", rows), verifier)
        assert [r["i"] for r in out] == [1], column
        assert (counts.rows, counts.kept, counts.dropped_empty, counts.truncated) == (len(values), 1,
                                                                                       len(values) - 1, 0), column


def test_over_long_prompts_keep_their_last_tokens_and_are_counted(tmp_path, verifier, tok):
    rows = [{"prompt_ids": list(range(10))}, {"prompt_ids": [1, 2, 3]}, {"prompt_ids": list(range(20, 26))},
            {"prompt": "abcdefgh"}]
    counts, out = prepare(write(tmp_path / "ids.jsonl", rows[:3]), verifier, max_prompt_tokens=5)
    assert [r["prompt_ids"] for r in out] == [[5, 6, 7, 8, 9], [1, 2, 3], [21, 22, 23, 24, 25]]
    assert (counts.kept, counts.dropped_empty, counts.truncated) == (3, 0, 2)
    counts, out = prepare(write(tmp_path / "text.jsonl", rows[3:]), verifier, max_prompt_tokens=3)
    assert out[0]["prompt_ids"] == tok("abcdefgh")["input_ids"][-3:] and counts.truncated == 1


def test_every_prompt_empty_is_an_error(tmp_path, verifier):
    path = write(tmp_path / "p.jsonl", [{"prompt": ""}, {"prompt": " "}])
    with pytest.raises(ValueError, match=r"p\.jsonl.*every one of its 2 prompts is empty"):
        prepare(path, verifier)


def test_a_file_of_trajectories_is_used_as_is(tmp_path, verifier):
    for name in ("t.jsonl", "t.parquet"):
        path = write(tmp_path / name, [{"prompt_ids": [1, 2], "completion_ids": [3, 4]}])
        counts, out = prepare(path, verifier, field="data.heldout")
        assert counts is None and not (tmp_path / f"normalized-{name}.jsonl").exists()


BAD_ROWS = [  # (rows, what the message says besides the file and line)
    ([{"text": "hi"}], "needs exactly one of the columns 'prompt' (text), 'messages' (chat turns) or 'prompt_ids'"),
    ([{"prompt": "hi", "prompt_ids": [1]}], "has the columns ['prompt', 'prompt_ids']"),
    ([{"prompt": "hi"}, {"messages": CHAT}], "has the columns ['prompt', 'messages']"),
    ([{"prompt": "hi"}, {"prompt": "a"}, {"domain": "x"}], "line 3: has no 'prompt'"),
    ([{"prompt": "hi"}, {"prompt": 3}], "line 2: 'prompt' must be a string, got int"),
    ([{"prompt_ids": [1]}, {"prompt_ids": [1, "2"]}],
     "line 2: 'prompt_ids' must be a list of ints, got '2' at index 1"),
    ([{"prompt_ids": [1, 300]}], "line 1: 'prompt_ids' id 300 at index 1 is not a token id of the verifier"),
    ([{"messages": CHAT}, {"messages": "hi"}],
     "line 2: 'messages' must be a list of {'role', 'content'} turns, got str"),
    ([{"messages": CHAT}, {"messages": ["hi"]}], "line 2: 'messages' turn 1 must be an object"),
    ([{"messages": [{"role": "user"}]}], "line 1: 'messages' turn 1 has no 'content'"),
    ([{"messages": [{"role": "user", "text": "hi"}]}], "line 1: 'messages' turn 1 has no 'content'"),
    ([{"messages": [{"user": "hi"}]}], "line 1: 'messages' turn 1 needs 'role' and 'content'"),
    ([{"messages": [{"from": "bot", "value": "hi"}]}], "line 1: 'messages' turn 1: ShareGPT 'from' must be one of"),
    ([{"messages": [{"from": "human"}]}], "line 1: 'messages' turn 1 has no 'value'"),
    ([{"messages": [{"role": "user", "content": {"a": 1}}]}], "line 1: 'messages' turn 1: content must be a string"),
    ([{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}],
     "content part 1 must be {'type': 'text', 'text': str}, got 'image_url'"),
    ([{"prompt": "a", "domain": "x"}, {"prompt": "b", "domain": 3}], "column 'domain' mixes values"),
]


@pytest.mark.parametrize("rows, message", BAD_ROWS, ids=range(len(BAD_ROWS)))
def test_bad_rows_name_the_file_and_the_line(tmp_path, verifier, rows, message):
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError) as err:
        prepare(path, verifier)
    assert f"data.prompts {str(path)!r}" in str(err.value) and message in str(err.value), str(err.value)


@pytest.mark.parametrize("name", ["bad.json", "bad.parquet"])
def test_json_and_parquet_name_the_row(tmp_path, verifier, name):
    path = write(tmp_path / name, [{"messages": CHAT}, {"messages": [{"role": "user", "content": "a"}, {"role": ""}]}])
    with pytest.raises(ValueError, match=rf"{name}', row 2: 'messages' turn 2: role must be a non-empty string"):
        prepare(path, verifier)


@pytest.mark.parametrize("name, text, message", [
    ("p.jsonl", '{"prompt": "a"}\n{"prompt": "b"\n', r"p\.jsonl', line 2: not valid JSON: Expecting ',' delimiter"),
    ("p.jsonl", '{"prompt": "a"}\n["b"]\n', r"p\.jsonl', line 2: must be a JSON object, got list"),
    ("p.json", '[{"prompt": "a"}, {"prompt": }]', r"p\.json': not valid JSON: Expecting value"),
    ("p.json", '"just text"', r"p\.json': must hold a list of objects, got str"),
    ("p.parquet", "not parquet at all", r"p\.parquet': not a readable parquet file or folder .*: "),
    ("p.jsonl", None, r"p\.jsonl': cannot read: .*No such file"),
    ("p.parquet", None, r"p\.parquet': no such file or folder"),
    ("folder", "", r"folder': the folder holds no parquet files"),
    ("empty.jsonl", "\n", r"empty\.jsonl': holds no records"),
])
def test_unreadable_files_name_the_file_and_the_reader_message(tmp_path, verifier, name, text, message):
    path = tmp_path / name
    if name == "folder":
        path.mkdir()
    elif text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message):
        prepare(path, verifier)


def test_a_json_file_of_one_object_a_line_is_read(tmp_path, verifier):
    path = tmp_path / "lines.json"
    path.write_text('{"prompt_ids": [1]}\n{"prompt_ids": [2, 3]}\n')
    counts, out = prepare(path, verifier)
    assert [r["prompt_ids"] for r in out] == [[1], [2, 3]] and counts.rows == 2


def test_text_needs_the_verifier_tokenizer(tmp_path):
    from helpers import tiny_llama

    bare = tmp_path / "bare"
    tiny_llama(64).save_pretrained(bare)  # weights, no tokenizer
    path = write(tmp_path / "p.jsonl", [{"prompt": "hi"}])
    with pytest.raises(ValueError, match=r"p\.jsonl': has a 'prompt' column: this needs the verifier's tokenizer"):
        prepare(path, bare)
    counts, out = prepare(write(tmp_path / "ids.jsonl", [{"prompt_ids": [1, 2]}]), bare)  # ids need none
    assert out[0]["prompt_ids"] == [1, 2]


def job_overrides(verifier: Path, tmp_path: Path, prompts: Path, heldout: Path) -> list[str]:
    return [f"verifier.path={verifier}", f"data.prompts={prompts}", f"data.heldout={heldout}",
            f"run.storage_path={tmp_path / 'ray_results'}", f"run.output_dir={tmp_path / 'drafter'}",
            "data.max_prompt_tokens=16"]


def test_prepare_data_writes_both_files_into_the_run_folder(tmp_path, verifier, capsys):
    prompts = write(tmp_path / "train.jsonl", [{"messages": CHAT}, {"messages": []}])
    heldout = write(tmp_path / "heldout.parquet", [{"prompt": "short"}, {"prompt": "a prompt of more than 16"}])
    cfg = load_config(TINY, job_overrides(verifier, tmp_path, prompts, heldout))
    data = prepare_data(cfg)
    folder = Path(data_dir(cfg))
    assert folder == tmp_path / "ray_results" / "tiny-distill" / "data"
    assert data.prompts == str(folder / "prompts.jsonl") and data.heldout == str(folder / "heldout.jsonl")
    assert read_jsonl(data.heldout)[1]["prompt_ids"] == list(b"a prompt of more than 16")[-16:]
    import pyarrow.json  # the reader of Ray Data's read_json

    assert pyarrow.json.read_json(data.heldout).column("prompt_ids").type == pa.list_(pa.int64())
    counts = data.summary()
    assert counts["data.prompts"] | {"path": None} == {"path": None, "column": "messages", "rows": 2, "kept": 1,
                                                       "dropped_empty": 1, "truncated": 1, "max_prompt_tokens": 16}
    assert (counts["data.heldout"]["kept"], counts["data.heldout"]["truncated"]) == (2, 1)
    log = capsys.readouterr().out
    assert f"[distill] data.prompts: 2 rows ('messages') in {prompts}: 1 kept, 1 empty dropped, 1 cut to their " \
           "last 16 tokens" in log

    cfg = load_config(TINY, job_overrides(verifier, tmp_path, prompts, heldout) + [f"data.trajectories={tmp_path}"])
    assert "data.prompts" not in prepare_data(cfg).counts  # trajectories replace the prompts: not read


def test_a_bad_dataset_fails_the_job_before_ray_starts(tmp_path, verifier):
    import ray

    from specdiff.distill import run

    prompts = write(tmp_path / "train.jsonl", [{"messages": CHAT}, {"messages": [{"role": "user"}]}])
    heldout = write(tmp_path / "heldout.jsonl", [{"prompt_ids": [1, 2]}])
    with pytest.raises(ValueError, match=r"data.prompts '.*train\.jsonl', line 2: 'messages' turn 1 has no 'content'"):
        run(load_config(TINY, job_overrides(verifier, tmp_path, prompts, heldout)))
    assert not ray.is_initialized()


def test_cli_reports_a_bad_dataset_with_status_2_before_ray_starts(tmp_path, verifier):
    prompts = write(tmp_path / "train.jsonl", [{"prompt_ids": [1]}, {"prompt_ids": [1], "prompt": "x"}])
    cmd = [sys.executable, str(REPO / "jobs" / "distill.py"), "--config", str(TINY)]
    for o in job_overrides(verifier, tmp_path, prompts, prompts):
        cmd += ["--set", o]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO / "platform")})
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"error: data.prompts {str(prompts)!r}: has the columns ['prompt', 'prompt_ids']" in out.stderr
    assert "Traceback" not in out.stderr and "Started a local Ray instance" not in out.stderr + out.stdout


def test_cli_summary_carries_the_counts(tmp_path, verifier, monkeypatch):
    sys.path.insert(0, str(REPO / "jobs"))
    import distill as cli  # the old command's thin file: `specdiff distill`

    import specdiff.distill
    from specdiff.distill import DistillSummary

    counts = {"data.prompts": {"rows": 5, "kept": 4, "dropped_empty": 1, "truncated": 2}}
    monkeypatch.setattr(specdiff.distill, "run",
                        lambda cfg: DistillSummary(step=3, finished=True, output_dir="x", data=counts))
    prompts = write(tmp_path / "p.jsonl", [{"prompt_ids": [1]}])
    args = ["--config", str(TINY), "--summary", str(tmp_path / "summary.json")]
    for o in job_overrides(verifier, tmp_path, prompts, prompts):
        args += ["--set", o]
    assert cli.main(args) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["data"] == counts


@pytest.mark.slow
def test_job_summary_counts_dropped_and_cut_prompts(tmp_path):
    """The CLI on the tiny assets with empty and over-long prompts: they are counted in the summary file, the printed
    summary line and the log, and the job trains."""
    sys.path.insert(0, str(REPO / "jobs"))
    from make_tiny import make_tiny

    assets = make_tiny(tmp_path / "tiny", train_prompts=64, heldout_prompts=8)
    rows = [json.loads(line) for line in (assets / "prompts.jsonl").read_text().splitlines()]
    rows[3]["prompt_ids"], rows[7]["prompt_ids"] = [], []
    rows[5]["prompt_ids"] = rows[5]["prompt_ids"] * 100  # > 256 tokens
    write(tmp_path / "prompts.parquet", rows)
    cmd = [sys.executable, str(REPO / "jobs" / "distill.py"), "--config", str(TINY),
           "--summary", str(tmp_path / "summary.json")]
    for o in [f"verifier.path={assets / 'verifier'}", f"data.prompts={tmp_path / 'prompts.parquet'}",
              f"data.heldout={assets / 'heldout.jsonl'}", f"run.storage_path={tmp_path / 'ray_results'}",
              f"run.output_dir={tmp_path / 'drafter'}", "train.steps=2", "train.checkpoint_every=2",
              "eval.offsets=[0]"]:
        cmd += ["--set", o]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": str(REPO / "platform")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] and summary["step"] == 2
    prompts = summary["data"]["data.prompts"]
    assert (prompts["rows"], prompts["kept"], prompts["dropped_empty"], prompts["truncated"]) == (64, 62, 2, 1)
    assert summary["data"]["data.heldout"]["kept"] == 8
    last = [line for line in out.stdout.splitlines() if line.startswith("[distill] {")][-1]
    assert json.loads(last.removeprefix("[distill] "))["data"] == summary["data"]
    assert "62 kept, 2 empty dropped, 1 cut to their last 256 tokens" in out.stdout
