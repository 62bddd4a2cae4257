"""The user's own prompts as a task: a local JSONL, JSON, CSV or Parquet file, labels optional.

``--task PATH`` names a prompts file (:func:`tuner.data.longbench.is_prompts_path`: an existing file,
or a name ending in one of :data:`SUFFIXES`). The file is read through ``datasets``
(``load_dataset("json" | "csv" | "parquet", data_files=...)``) and every row is validated before any
model loads or anything is written (:func:`load_prompts_file`); a bad file is one line naming the
file, the row and the fix.

A row (the schema, also in ``docs/data.md``):

* ``prompt``: a string (sent as one user turn, through the model's chat template where it has one),
  or chat messages, a list of ``{role, content}``. Or the LongBench shape: ``context`` and ``input``
  filled into ``template`` (the row's, the file's, or :data:`tuner.data.longbench.GENERIC_TEMPLATE`).
* ``id`` (or LongBench's ``_id``): optional, unique; the hashed validation/test split keys on it, or
  on a hash of the prompt where there is none.
* ``answers``: optional list of strings. Every row has them (gold budget) or none does (agreement
  budget: a pruned answer is scored against the unpruned model's own greedy answer).
* ``metric``: optional :data:`tuner.data.metrics.METRICS` name (default ``qa_f1``).
* ``max_new_tokens``: optional answer length (default: ``--max-new-tokens``, else
  :data:`tuner.data.longbench.GENERIC_MAX_NEW_TOKENS`). ``stop``: optional list of stop strings.

File-level defaults of ``metric``, ``max_new_tokens``, ``template`` and ``stop``: a ``.json`` file may
be an object ``{"metric": ..., "rows": [...]}`` (a row's own value wins).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tuner.data.longbench import (
    FILE_DATASET,
    GENERIC_TEMPLATE,
    PROMPTS_SUFFIXES,
    SPLITS,
    _check_template,
    split_records,
    unit_hash,
)
from tuner.data.metrics import METRICS

SUFFIXES = PROMPTS_SUFFIXES
"""File suffix -> the ``datasets`` builder that reads it."""
MAX_ROW_BYTES = 8 * 2**20
"""A longer line (row) is refused: 8 MiB of text is millions of tokens, beyond any model's context."""
MIN_SPLIT = 10
"""Fewer prompts than this in a split: too few for a held-out check (a clear error, or ``--no-heldout``)."""
FRESH = "fresh"
"""The split of a prompts file's fresh pool (:meth:`PromptsFile.split`): validation rows the search
never reads, for the fresh-drift check."""
FRESH_ROWS = 12
"""At most this many validation rows of a prompts file are kept from the search as its fresh pool
(the ``--fresh-kl-examples`` default: what the check reads of open-QA, per dataset)."""
FRESH_MIN = 4
"""A fresh pool needs at least this many rows beyond the search's :data:`MIN_SPLIT`; a file with fewer
validation rows keeps them all for the search and its study has no fresh-drift check (it says so)."""
DEFAULT_METRIC = "qa_f1"
HEADER_KEYS = frozenset({"metric", "max_new_tokens", "template", "stop", "rows"})
LONG_PROMPTS = ("cut", "refuse")
"""What ``--long-prompts`` does with a prompt over ``--max-prompt-tokens``: cut it in the middle, or refuse."""
AGREEMENT_BUDGET = 20.0
"""The default ``--max-accuracy-loss`` of a file without answers, in agreement points: what a 2-point
gold budget corresponds to on the open-QA grid, rounded down (``benchmarks/agreement_vs_gold.py``,
docs/statistics.md)."""
GOLD_PER_AGREEMENT_POINT = 2.0 / AGREEMENT_BUDGET
"""Gold points per agreement point at the default (the search's KL cap reads an agreement budget so)."""
AGREEMENT_EXPONENT = 0.5
"""The calibration's shape for agreement: loss = slope x KL^0.5 (the straight line fits worse than a
constant on the grid, docs/statistics.md)."""
BUDGET_KINDS = ("gold", "agreement")
"""What a task's score points measure: agreement with gold answers, or with the unpruned model's own."""

SCHEMA_HINT = "see docs/data.md for the schema"


@dataclass(frozen=True)
class PromptRow:
    """One validated row of a prompts file.

    Args:
        row: its 1-based position among the file's rows (what errors name).
        id: its id (given, or ``h-`` and a hash of the prompt).
        text: the prompt as one string (None for chat messages).
        messages: the chat messages as ``(role, content)`` pairs (empty for a string prompt).
        answers: the gold answers (empty: scored by agreement with the unpruned answer).
        metric: a :data:`tuner.data.metrics.METRICS` name.
        max_new_tokens: its answer length (None: the study's).
        stop: extra stop strings.
    """

    row: int
    id: str
    text: str | None
    messages: tuple[tuple[str, str], ...]
    answers: tuple[str, ...]
    metric: str
    max_new_tokens: int | None
    stop: tuple[str, ...]

    @property
    def dataset(self) -> str:
        return FILE_DATASET


@dataclass(frozen=True)
class PromptsFile:
    """A validated prompts file: its rows, and what identifies it (never its content)."""

    path: Path
    fingerprint: str
    rows: tuple[PromptRow, ...]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def budget_kind(self) -> str:
        """``gold`` when the rows carry answers, ``agreement`` when none does."""
        return "gold" if self.rows[0].answers else "agreement"

    def split(self, split: str, seed: int = 0) -> list[PromptRow]:
        """The rows of ``split`` in file order: the same hashed validation/test split as every task (by
        id), with the validation split's :func:`fresh_pool_size` rows of highest hash set apart as the
        ``fresh`` split (:data:`FRESH`), which the search never reads."""
        if split not in (*SPLITS, FRESH):
            raise ValueError(f"split = {split!r}: must be one of {', '.join((*SPLITS, FRESH))}")
        if split == "test":
            return split_records(self.rows, "test", seed=seed)
        validation = split_records(self.rows, "validation", seed=seed)
        ranked = sorted(validation, key=lambda row: unit_hash(seed, row.id))
        pool = {row.id for row in ranked[len(ranked) - fresh_pool_size(len(ranked)) :]}
        return [row for row in validation if (row.id in pool) == (split == FRESH)]

    def split_sizes(self, seed: int = 0) -> dict[str, int]:
        """Rows of ``validation`` (the search's) and ``test``; the fresh pool's: :meth:`pool_size`."""
        return {s: len(self.split(s, seed)) for s in SPLITS}

    def pool_size(self, seed: int = 0) -> int:
        """Rows of the fresh pool (the ``fresh`` split)."""
        return len(self.split(FRESH, seed))

    def fresh_note(self, seed: int = 0) -> str:
        """Why the file has no fresh pool (empty where it has one)."""
        if self.pool_size(seed):
            return ""
        validation = len(self.split("validation", seed))
        return (
            f"no fresh-drift check: {self.name}'s {validation} validation rows (of {len(self.rows)}) "
            f"are all the search's; a fresh pool of at least {FRESH_MIN} rows the search never reads needs "
            f"{MIN_SPLIT + FRESH_MIN} or more (add prompts)"
        )


def fresh_pool_size(validation: int) -> int:
    """Rows of a validation split of ``validation`` rows kept from the search as the fresh pool: up to
    :data:`FRESH_ROWS`, leaving the search at least :data:`MIN_SPLIT`, and none where fewer than
    :data:`FRESH_MIN` would be left over."""
    spare = validation - MIN_SPLIT
    return min(FRESH_ROWS, spare) if spare >= FRESH_MIN else 0


class _Refused(ValueError):
    """A row's problem; the file name is added where it is caught."""


def _short(value: Any, limit: int = 50) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------------
# the bytes: what must hold before datasets reads the file
def _scan_text(path: Path) -> None:
    """Refuse a binary file, a line over :data:`MAX_ROW_BYTES` or bytes that are not UTF-8, by line."""
    with path.open("rb") as f:
        line_no = 0
        while True:
            line = f.readline(MAX_ROW_BYTES + 1)
            if not line:
                return
            line_no += 1
            if len(line) > MAX_ROW_BYTES and not line.endswith(b"\n"):
                raise ValueError(
                    f"{path}: line {line_no} is longer than {MAX_ROW_BYTES // 2**20} MiB; a row holds one prompt "
                    "(split it, or cut the prompt)"
                )
            if b"\x00" in line:
                raise ValueError(
                    f"{path}: binary content (a NUL byte on line {line_no}); a prompts file is UTF-8 text "
                    "(JSONL, JSON or CSV) or Parquet"
                )
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}: line {line_no} is not UTF-8 (byte {line[exc.start]:#04x} at column "
                    f"{exc.start + 1}); save the file as UTF-8"
                ) from None


def _check_bytes(path: Path, builder: str) -> None:
    if not path.exists():
        raise ValueError(
            f"prompts file {path}: no such file; pass a JSONL, JSON, CSV or Parquet file of prompts"
        )
    if not path.is_file():
        raise ValueError(
            f"prompts file {path}: not a file; pass a JSONL, JSON, CSV or Parquet file of prompts"
        )
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path}: empty file; write one prompt per row ({SCHEMA_HINT})")
    if builder == "parquet":
        with path.open("rb") as f:
            head = f.read(4)
        if head != b"PAR1":
            raise ValueError(f"{path}: not a Parquet file (no PAR1 magic); write Parquet or use .jsonl")
        return
    with path.open("rb") as f:
        head = f.read(8192)
    if b"\x00" in head:  # the usual test for a binary file, before any line is read as text
        line = head[: head.index(b"\x00")].count(b"\n") + 1
        raise ValueError(
            f"{path}: binary content (a NUL byte on line {line}); a prompts file is UTF-8 text "
            "(JSONL, JSON or CSV) or Parquet"
        )
    _scan_text(path)
    with path.open("rb") as f:
        if not f.read(4096).strip() and not f.read(1):
            raise ValueError(
                f"{path}: empty file (whitespace only); write one prompt per row ({SCHEMA_HINT})"
            )


# --------------------------------------------------------------------------------------------------
# rows
def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise _Refused(f'{what} = {_short(value)} is not a non-empty list of strings; write e.g. ["Paris"]')
    return tuple(value)


def _maybe_json_list(value: Any, csv: bool) -> Any:
    """A CSV cell holding a JSON list (``["a", "b"]``) as that list; anything else unchanged."""
    if csv and isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _messages(value: list[Any]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for m in value:
        if (
            not isinstance(m, Mapping)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise _Refused(
                f"prompt message {_short(m)} is not a {{role, content}} pair of strings; a prompt is a string "
                "or a list of {role, content} messages"
            )
        if not m["role"].strip():
            raise _Refused("a prompt message has an empty role")
        out.append((m["role"], m["content"]))
    if not out or not any(content.strip() for _, content in out):
        raise _Refused("empty prompt (no message has content); give each row a prompt")
    return tuple(out)


def _prompt(
    obj: Mapping[str, Any], header: Mapping[str, Any]
) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    prompt = obj.get("prompt")
    if prompt is None:
        context, question = obj.get("context"), obj.get("input")
        if context is None and question is None:
            raise _Refused("no 'prompt' (nor LongBench's 'context' and 'input'); give each row a prompt")
        if not isinstance(context, str) or not isinstance(question, str):
            raise _Refused("'context' and 'input' must both be strings (the LongBench shape)")
        template = obj.get("template") or header.get("template") or GENERIC_TEMPLATE
        try:
            _check_template("prompts file", template)
        except ValueError as exc:
            raise _Refused(str(exc)) from None
        prompt = template.format(context=context, input=question)
    if isinstance(prompt, str):
        if not prompt.strip():
            raise _Refused("empty prompt; give each row a non-empty prompt")
        return prompt, ()
    if isinstance(prompt, list):
        return None, _messages(prompt)
    raise _Refused(f"prompt = {_short(prompt)}: must be a string or a list of {{role, content}} messages")


def _row(obj: Any, row: int, header: Mapping[str, Any], csv: bool) -> PromptRow:
    if not isinstance(obj, Mapping):
        raise _Refused(f"not an object (got {type(obj).__name__}); write one JSON object per row")
    text, messages = _prompt(obj, header)
    answers_value = _maybe_json_list(obj.get("answers"), csv)
    answers = () if answers_value is None else _strings(answers_value, "answers")
    metric = obj.get("metric") or header.get("metric") or DEFAULT_METRIC
    if metric not in METRICS:
        raise _Refused(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    limit = obj.get("max_new_tokens")
    limit = header.get("max_new_tokens") if limit is None else limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _Refused(f"max_new_tokens = {_short(limit)}: must be a positive integer")
    stop_value = _maybe_json_list(obj.get("stop"), csv)
    stop_value = header.get("stop") if stop_value is None else stop_value
    stop = () if stop_value is None else _strings(stop_value, "stop")
    raw_id = obj.get("id", obj.get("_id"))
    if raw_id is None or raw_id == "":
        seen = text if text is not None else json.dumps(messages)
        rid = "h-" + hashlib.sha256(seen.encode()).hexdigest()[:16]
    elif isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise _Refused(f"id = {_short(raw_id)}: must be a string or an integer")
    else:
        rid = str(raw_id)
    return PromptRow(row, rid, text, messages, answers, str(metric), limit, stop)


def _rows(path: Path, objs: Sequence[Any], header: Mapping[str, Any], csv: bool) -> tuple[PromptRow, ...]:
    """Validate every row; a problem names the file and the row."""
    rows: list[PromptRow] = []
    first: dict[str, int] = {}
    for n, obj in enumerate(objs, start=1):
        try:
            row = _row(obj, n, header, csv)
        except _Refused as exc:
            raise ValueError(f"{path}: row {n}: {exc}") from None
        if row.id in first:
            what = f"id {row.id!r}" if not row.id.startswith("h-") else "the same prompt (no id)"
            raise ValueError(
                f"{path}: row {n}: {what} repeats row {first[row.id]}; ids must be unique (drop the duplicate)"
            )
        first[row.id] = n
        if rows and bool(row.answers) != bool(rows[0].answers):
            has, lacks = (1, n) if rows[0].answers else (n, 1)
            raise ValueError(
                f"{path}: row {lacks} has no answers but row {has} has; give answers on every row or on none"
            )
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows; write one prompt per row ({SCHEMA_HINT})")
    return tuple(rows)


# --------------------------------------------------------------------------------------------------
# reading through datasets
@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars or error logs from ``datasets`` while it reads (its failure is our one line)."""
    import datasets

    logger = logging.getLogger("datasets")
    level = logger.level
    bars = datasets.is_progress_bar_enabled()
    logger.setLevel(logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def _header(path: Path) -> dict[str, Any]:
    """A ``.json`` file's file-level defaults (an object with ``rows``); {} for a list or JSON lines."""
    with path.open("rb") as f:
        first = f.read(4096).lstrip()[:1]
    if first != b"{":
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {}  # JSON lines: one object per line
    if not isinstance(data, dict) or "rows" not in data:
        return {}
    unknown = sorted(set(data) - HEADER_KEYS)
    if unknown:
        raise ValueError(
            f"{path}: unknown file-level key(s) {unknown}; valid: {', '.join(sorted(HEADER_KEYS))}"
        )
    if not isinstance(data["rows"], list):
        raise ValueError(f"{path}: 'rows' must be a list of row objects")
    return {k: v for k, v in data.items() if k != "rows"} | {"rows": True}


def _diagnose_json(path: Path) -> None:
    """Where ``datasets`` failed on a JSON file: the first malformed row, by line (a list: the position)."""
    text = path.read_text(encoding="utf-8")
    try:
        json.loads(text)
        return  # one JSON document: not a line problem
    except ValueError as whole:
        if text.lstrip()[:1] == "[":
            raise ValueError(
                f"{path}: malformed JSON at line {whole.lineno}, column {whole.colno} ({whole.msg}); "  # type: ignore[attr-defined]
                "fix that row"
            ) from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError as exc:
            raise ValueError(
                f"{path}: row on line {n}: malformed JSON ({exc.msg}, column {exc.colno}); write one JSON "  # type: ignore[attr-defined]
                "object per line"
            ) from None


def _read(path: Path, builder: str, header: Mapping[str, Any]) -> list[dict[str, Any]]:
    from datasets import load_dataset  # heavy import, only on this path

    options: dict[str, Any] = {"field": "rows"} if header.get("rows") else {}
    with tempfile.TemporaryDirectory(prefix="lazyllm-prompts-") as cache, _quiet_datasets():
        try:  # a cache of its own, removed after: nothing of the file is kept anywhere
            table = load_dataset(builder, data_files=str(path), split="train", cache_dir=cache, **options)
            return [dict(row) for row in table]
        except Exception as exc:  # pyarrow, pandas and datasets errors come in many types
            if builder == "json":
                _diagnose_json(path)
            cause = exc.__cause__ or exc.__context__ or exc
            why = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            raise ValueError(
                f"{path}: cannot be read as {builder.upper()} ({why[:200]}); {SCHEMA_HINT}"
            ) from None


def fingerprint_of(path: Path) -> str:
    """sha256 of the file's bytes (16 hex): a changed file is another study, never a silent mix."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def builder_of(path: Path) -> str:
    try:
        return SUFFIXES[path.suffix.lower()]
    except KeyError:
        raise ValueError(
            f"prompts file {path}: unknown type {path.suffix or '(no suffix)'!r}; use one of "
            f"{', '.join(SUFFIXES)}"
        ) from None


def load_prompts_file(path: str | Path) -> PromptsFile:
    """Read and validate a prompts file (see the module docstring); one ``ValueError`` naming the
    file, the row and the fix on any problem. Read once per content (memoized on path, size, mtime)."""
    path = Path(path).expanduser()
    builder = builder_of(path)
    _check_bytes(path, builder)
    stat = path.stat()
    return _load(path.resolve(), builder, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _load(path: Path, builder: str, size: int, mtime_ns: int) -> PromptsFile:
    header = _header(path) if builder == "json" else {}
    objs = _read(path, builder, header)
    rows = _rows(path, objs, header, csv=builder == "csv")
    return PromptsFile(path, fingerprint_of(path), rows)


def check_splits(prompts: PromptsFile, seed: int, heldout: bool) -> None:
    """Refuse a file whose splits hold too few prompts for a held-out check (``heldout``), naming the counts."""
    sizes = prompts.split_sizes(seed)
    small = {s: n for s, n in sizes.items() if n < MIN_SPLIT}
    if heldout and small:
        counts = ", ".join(f"{n} {s}" for s, n in sizes.items())
        raise ValueError(
            f"{prompts.path}: {counts} prompts (of {len(prompts.rows)} rows, split by a hash of the id): a held-out "
            f"check needs at least {MIN_SPLIT} in each split; add prompts, or pass --no-heldout to run "
            "without one (the report then says no held-out check was possible)"
        )
    if sizes["validation"] == 0:
        raise ValueError(
            f"{prompts.path}: no validation prompts (of {len(prompts.rows)} rows); add prompts ({SCHEMA_HINT})"
        )


def heldout_note(prompts: PromptsFile, seed: int) -> str:
    """Why no held-out check ran on a prompts file (empty where the splits allow one)."""
    sizes = prompts.split_sizes(seed)
    if min(sizes.values()) >= MIN_SPLIT:
        return ""
    counts = ", ".join(f"{n} {s}" for s, n in sizes.items())
    return f"no held-out check was possible: {counts} prompts (a check needs {MIN_SPLIT} in each split)"
