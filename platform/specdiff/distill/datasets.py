"""User prompt datasets for the distillation job: read, validated and tokenized on the driver before Ray starts.

A dataset is a ``.jsonl`` file (one JSON object a line), a ``.json`` file (a list of objects; one object a line is
read too) or parquet (a file, or a folder of parquet files), with exactly one of three prompt columns:

- ``prompt``: raw text, tokenized as is with the verifier's tokenizer (``tokenizer(text)["input_ids"]``: no chat
  template; the special tokens the tokenizer itself adds, none for SmolLM2);
- ``messages``: chat turns, OpenAI style ``{"role": ..., "content": ...}`` or ShareGPT style ``{"from": "human" |
  "gpt" | "system", "value": ...}``, rendered with the verifier's chat template and ``add_generation_prompt=True``;
  a conversation that ends with an assistant turn is the prompt of that turn (it is left out);
- ``prompt_ids``: a list of token ids.

Other columns (``domain``, ...) are kept. Every error names the file, and the line (``.jsonl``) or row where one
record is bad. Empty prompts are dropped and prompts longer than ``max_prompt_tokens`` keep their last tokens; both
are counted (``DataCounts``). ``prepare_data`` writes each normalized dataset (``prompt_ids`` + the other columns)
as one ``.jsonl`` file in the run's folder, which the teacher then reads through Ray Data's ``read_json`` (JSONL, not
parquet: Ray Data 2.60's parquet reader lists files in a task that asks for a whole CPU, which a streamed teacher
beside two 0.5-CPU train workers never gets on a 2-core machine: the job stalls). A file that already holds
trajectories (a ``completion_ids`` column, e.g. ``data.heldout`` sampled once) is used as is.

Pure Python + pyarrow (transformers only for a tokenizer); no Ray.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

PROMPT_COLUMNS = ("prompt", "messages", "prompt_ids")
TRAJECTORY_COLUMN = "completion_ids"  # a file of trajectories: used as is
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class DataCounts:
    """What became of one dataset's rows: ``kept`` = ``rows - dropped_empty``; ``truncated`` of the kept ones were
    cut to their last ``max_prompt_tokens`` tokens."""

    path: str
    column: str
    rows: int
    kept: int
    dropped_empty: int
    truncated: int
    max_prompt_tokens: int

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self, field: str) -> str:
        return (f"[distill] {field}: {self.rows} rows ({self.column!r}) in {self.path}: {self.kept} kept, "
                f"{self.dropped_empty} empty dropped, {self.truncated} cut to their last {self.max_prompt_tokens} "
                "tokens")


@dataclass(frozen=True)
class PreparedData:
    """The paths the job's Ray Data reads (normalized prompts, or a trajectory file as is) and the counts."""

    prompts: str | None
    heldout: str
    counts: dict  # field ("data.prompts" / "data.heldout") -> DataCounts.to_dict(); absent: used as is

    def summary(self) -> dict:
        return dict(self.counts)


class DatasetError(ValueError):
    """A prompt dataset that cannot be used: the message names the file (and the line or row)."""


class _Where:
    """Names the file, and the line or row, in an error message."""

    def __init__(self, field: str, path: str, unit: str):
        self.field, self.path, self.unit = field, path, unit

    def file(self, message: str) -> ValueError:
        return DatasetError(f"{self.field} {self.path!r}: {message}")

    def row(self, number: int, message: str) -> ValueError:
        return DatasetError(f"{self.field} {self.path!r}, {self.unit} {number}: {message}")


# ---------------------------------------------------------------------------------------------------- reading


def _is_json(path: str) -> bool:
    return path.endswith((".jsonl", ".json"))


def _read_bytes(path: str) -> bytes:
    if "://" in path:
        import pyarrow.fs

        fs, inner = pyarrow.fs.FileSystem.from_uri(path)
        with fs.open_input_stream(inner) as f:
            return f.read()
    return Path(path).read_bytes()


def _json_lines(text: str, where: _Where) -> tuple[list[dict], list[int]]:
    rows, numbers = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise where.row(number, f"not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise where.row(number, f"must be a JSON object, got {type(value).__name__}")
        rows.append(value)
        numbers.append(number)
    return rows, numbers


def read_rows(path: str, field: str = "data.prompts") -> tuple[list[dict], list[int], _Where]:
    """The records of a dataset file or folder, the number naming each in errors, and the namer.

    ``.jsonl`` (and a ``.json`` file of one object a line): records numbered by line; ``.json`` holding a list of
    objects and parquet: numbered by row, from 1."""
    if _is_json(path):
        try:
            text = _read_bytes(path).decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DatasetError(f"{field} {path!r}: cannot read: {e}") from None
        if path.endswith(".json"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                if e.msg != "Extra data":  # a second value after the first: one object a line
                    raise DatasetError(f"{field} {path!r}: not valid JSON: {e}") from None
            else:
                where = _Where(field, path, "row")
                if isinstance(value, dict):
                    value = [value]
                if not isinstance(value, list):
                    raise where.file(f"must hold a list of objects, got {type(value).__name__}")
                for number, row in enumerate(value, 1):
                    if not isinstance(row, dict):
                        raise where.row(number, f"must be a JSON object, got {type(row).__name__}")
                return value, list(range(1, len(value) + 1)), where
        where = _Where(field, path, "line")
        rows, numbers = _json_lines(text, where)
        return rows, numbers, where
    where = _Where(field, path, "row")
    table = _read_parquet(path, where)
    return table.to_pylist(), list(range(1, table.num_rows + 1)), where


def _read_parquet(path: str, where: _Where, columns: list[str] | None = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = "://" not in path
    if local and not Path(path).exists():
        raise where.file("no such file or folder")
    if local and Path(path).is_dir() and not any(p.is_file() and not p.name.startswith((".", "_"))
                                                 for p in Path(path).rglob("*")):
        raise where.file("the folder holds no parquet files")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise where.file(f"not a readable parquet file or folder (files other than .jsonl/.json are read as "
                         f"parquet): {e}") from None


def columns_of(path: str, field: str = "data.prompts") -> list[str] | None:
    """A parquet dataset's column names from its schema alone (None for JSON: its records are read anyway)."""
    if _is_json(path):
        return None
    import pyarrow as pa
    import pyarrow.dataset as pads

    where = _Where(field, path, "row")
    if "://" not in path and not Path(path).exists():
        raise where.file("no such file or folder")
    try:
        return list(pads.dataset(path, format="parquet").schema.names)
    except (pa.ArrowException, OSError) as e:
        raise where.file(f"not a readable parquet file or folder (files other than .jsonl/.json are read as "
                         f"parquet): {e}") from None


def prompt_column(columns, where: _Where) -> str:
    """The one prompt column among ``columns``; an error for none or several."""
    found = [c for c in PROMPT_COLUMNS if c in columns]
    if len(found) == 1:
        return found[0]
    if not found:
        raise where.file(f"needs exactly one of the columns 'prompt' (text), 'messages' (chat turns) or "
                         f"'prompt_ids' (token ids); its columns are {sorted(columns)}")
    raise where.file(f"has the columns {found}: a dataset must have exactly one of 'prompt', 'messages', "
                     "'prompt_ids' (say which one is the prompt by dropping the others)")


# ---------------------------------------------------------------------------------------------------- messages


def _text(content, what: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        texts = []
        for j, part in enumerate(content, 1):
            text_part = isinstance(part, dict) and part.get("type", "text") == "text"
            if not text_part or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{what}: content part {j} must be {{'type': 'text', 'text': str}}, got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"{what}: content must be a string, got {type(content).__name__}")


def normalize_messages(value) -> list[dict]:
    """OpenAI or ShareGPT turns -> ``[{"role", "content"}]`` (ShareGPT's human/gpt -> user/assistant); a ValueError
    that says what is wrong otherwise."""
    if not isinstance(value, list):
        raise ValueError(f"'messages' must be a list of {{'role', 'content'}} turns, got {type(value).__name__}")
    turns = []
    for i, turn in enumerate(value, 1):
        if not isinstance(turn, dict):
            raise ValueError(f"'messages' turn {i} must be an object with 'role' and 'content', got "
                             f"{type(turn).__name__}")
        present = {k for k, v in turn.items() if v is not None}  # parquet structs carry every field, unset ones null
        if "role" in present:
            role, content_key = turn["role"], "content"
            if not isinstance(role, str) or not role:
                raise ValueError(f"'messages' turn {i}: role must be a non-empty string, got {role!r}")
            if content_key not in turn:
                raise ValueError(f"'messages' turn {i} has no 'content' (keys: {sorted(turn)})")
        elif "from" in present:
            speaker, content_key = turn["from"], "value"
            role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
            if role is None:
                raise ValueError(f"'messages' turn {i}: ShareGPT 'from' must be one of {sorted(SHAREGPT_ROLES)}, "
                                 f"got {speaker!r}")
            if content_key not in turn:
                raise ValueError(f"'messages' turn {i} has no 'value' (keys: {sorted(turn)})")
        else:
            raise ValueError(f"'messages' turn {i} needs 'role' and 'content' (or ShareGPT 'from' and 'value'), "
                             f"got keys {sorted(turn)}")
        turns.append({"role": role, "content": _text(turn[content_key], f"'messages' turn {i}")})
    return turns


def _template_ids(out) -> list[int]:
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(t) for t in out]


# ---------------------------------------------------------------------------------------------------- prompts


def _ids(value, vocab_size: int | None) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"'prompt_ids' must be a list of ints, got {type(value).__name__}")
    for j, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"'prompt_ids' must be a list of ints, got {t!r} at index {j}")
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise ValueError(f"'prompt_ids' id {t} at index {j} is not a token id of the verifier ({bound})")
    return list(value)


def tokenize_rows(rows: list[dict], numbers: list[int], where: _Where, column: str, tokenizer: Callable[[], object],
                  max_prompt_tokens: int, vocab_size: int | None = None) -> tuple[list[list[int]], list[int], dict]:
    """-> the kept rows' prompt ids (cut to their last ``max_prompt_tokens``), the indices of the kept rows, and
    the counts ``{"dropped_empty", "truncated"}``. ``tokenizer``: a loader, called only for text or messages."""
    tok = None
    if column != "prompt_ids":
        try:
            tok = tokenizer()
        except ValueError as e:
            raise where.file(f"has a {column!r} column: {e}") from None
    if column == "messages" and not getattr(tok, "chat_template", None):
        raise where.file("has a 'messages' column, which needs a chat template, but the verifier's tokenizer has "
                         "none (give 'prompt' text or 'prompt_ids' instead)")
    out, kept, empty, truncated = [], [], 0, 0
    for i, (row, number) in enumerate(zip(rows, numbers)):
        if column not in row or row[column] is None:
            raise where.row(number, f"has no {column!r} (every record needs the dataset's prompt column)")
        value = row[column]
        try:
            if column == "prompt_ids":
                ids = _ids(value, vocab_size)
            elif column == "prompt":
                if not isinstance(value, str):
                    raise ValueError(f"'prompt' must be a string, got {type(value).__name__}")
                ids = list(tok(value)["input_ids"]) if value.strip() else []
            else:
                turns = normalize_messages(value)
                if turns and turns[-1]["role"] == "assistant":  # the prompt of that reply
                    turns = turns[:-1]
                if not any(t["content"].strip() for t in turns):
                    ids = []
                else:
                    try:
                        ids = _template_ids(tok.apply_chat_template(turns, add_generation_prompt=True))
                    except Exception as e:  # a template's raise_exception, e.g. roles that must alternate
                        raise ValueError(f"the verifier's chat template failed on these turns: "
                                         f"{type(e).__name__}: {e}") from None
        except ValueError as e:
            raise where.row(number, str(e)) from None
        if not ids:
            empty += 1
            continue
        if len(ids) > max_prompt_tokens:
            ids = ids[-max_prompt_tokens:]
            truncated += 1
        out.append(ids)
        kept.append(i)
    return out, kept, {"dropped_empty": empty, "truncated": truncated}


def normalized_records(rows: list[dict], kept: list[int], ids: list[list[int]], where: _Where) -> list[dict]:
    """``prompt_ids`` + the other columns of the kept rows (every column any row has, null where one lacks it).
    A column whose values Arrow cannot hold in one column (``"a"`` in one row, ``3`` in another) is an error here
    rather than in Ray Data's reader."""
    import pyarrow as pa

    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    extra = [n for n in names if n not in PROMPT_COLUMNS]
    for name in extra:
        try:
            pa.array([rows[i].get(name) for i in kept])
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise where.file(f"column {name!r} mixes values of different types, which one Arrow column cannot "
                             f"hold: {e}") from None
    return [{"prompt_ids": p, **{n: rows[i].get(n) for n in extra}} for i, p in zip(kept, ids)]


def write_jsonl(records: list[dict], dest: str) -> None:
    """One JSON object a line at ``dest`` (a local path, written aside then renamed; or a URI). Values JSON has no
    type for (bytes, timestamps of a parquet column) are written as their ``str``."""
    text = "".join(json.dumps(r, default=str) + "\n" for r in records).encode()
    if "://" in dest:
        import pyarrow.fs

        fs, inner = pyarrow.fs.FileSystem.from_uri(dest)
        fs.create_dir(inner.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(inner) as f:
            f.write(text)
        return
    from specdiff.runtime.publish import publishing

    with publishing(dest, replace=True) as partial:
        partial.write_bytes(text)


def prepare_dataset(path: str, dest: str, *, field: str, tokenizer: Callable[[], object], max_prompt_tokens: int,
                    vocab_size: int | None = None) -> DataCounts | None:
    """Read, validate and tokenize the dataset at ``path``; write it normalized to ``dest`` (JSONL). Returns its
    counts, or None where ``path`` holds trajectories already (a ``completion_ids`` column: nothing is written)."""
    columns = columns_of(path, field)
    if columns is not None and TRAJECTORY_COLUMN in columns:
        return None
    rows, numbers, where = read_rows(path, field)
    names: set[str] = set()
    for row in rows:
        names.update(row)
    if TRAJECTORY_COLUMN in names:
        return None
    if not rows:
        raise where.file("holds no records")
    column = prompt_column(names, where)
    ids, kept, counts = tokenize_rows(rows, numbers, where, column, tokenizer, max_prompt_tokens, vocab_size)
    if not ids:
        raise where.file(f"every one of its {len(rows)} prompts is empty")
    write_jsonl(normalized_records(rows, kept, ids, where), dest)
    return DataCounts(path=path, column=column, rows=len(rows), kept=len(ids), max_prompt_tokens=max_prompt_tokens,
                      **counts)


def verifier_vocab_size(verifier_path: str) -> int | None:
    """``vocab_size`` of the verifier's config.json (None where there is none to read)."""
    try:
        return int(json.loads((Path(verifier_path) / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def tokenizer_loader(verifier_path: str) -> Callable[[], object]:
    """A loader of the verifier folder's tokenizer, loaded once on first call: ``AutoTokenizer``, which is what the
    teacher tokenized ``prompt`` text with before prompts were tokenized here (the same ids)."""
    loaded = []

    def load():
        if not loaded:
            from transformers import AutoTokenizer

            try:
                loaded.append(AutoTokenizer.from_pretrained(verifier_path))
            except (OSError, ValueError, TypeError) as e:
                first = (str(e).strip().splitlines() or [""])[0]  # transformers' messages run to many lines
                raise ValueError(f"this needs the verifier's tokenizer, and verifier.path {verifier_path!r} has none "
                                 f"that loads ({type(e).__name__}: {first}); give 'prompt_ids' instead") from None
        return loaded[0]

    return load


def data_dir(cfg) -> str:
    """Where a run keeps its normalized prompt files: ``<run.storage_path>/<run.name>/data``."""
    return f"{cfg.run.storage_path.rstrip('/')}/{cfg.run.name}/data"


def prepare_data(cfg, *, log: Callable[[str], None] = lambda s: print(s, flush=True)) -> PreparedData:
    """``data.prompts`` (unless ``data.trajectories`` replaces them) and ``data.heldout`` of a DistillConfig whose
    paths are absolute -> normalized ``.jsonl`` files in ``data_dir(cfg)``, and their counts (logged, one line each)."""
    d = cfg.data
    tokenizer = tokenizer_loader(cfg.verifier.path)
    vocab_size = verifier_vocab_size(cfg.verifier.path)
    out, counts = {}, {}
    for field, path, name in (("data.prompts", None if d.trajectories else d.prompts, "prompts"),
                              ("data.heldout", d.heldout, "heldout")):
        if path is None:
            out[name] = d.prompts  # unused: trajectories replace the prompts
            continue
        dest = f"{data_dir(cfg)}/{name}.jsonl"
        c = prepare_dataset(path, dest, field=field, tokenizer=tokenizer, max_prompt_tokens=d.max_prompt_tokens,
                            vocab_size=vocab_size)
        if c is None:
            log(f"[distill] {field}: trajectories ('{TRAJECTORY_COLUMN}') in {path}, used as is")
            out[name] = path
            continue
        log(c.line(field))
        out[name] = dest
        counts[field] = c.to_dict()
    return PreparedData(prompts=out["prompts"], heldout=out["heldout"], counts=counts)
