"""LongBench v1 as data: the 21 datasets, task names, records, validation/test splits and prompts.

* :data:`DATASETS` holds one declarative :class:`DatasetSpec` per LongBench v1 dataset: category,
  language, metric (a :data:`tuner.data.metrics.METRICS` name) and LongBench's generation rules (chat
  template or not, stop at newline, score the first line only). :data:`OPENQA_DATASETS` declares the
  long-context QA datasets built in LongBench's format from HotpotQA and SQuAD (``source="openqa"``;
  :mod:`tuner.data.openqa` builds their records for a prompt budget).
* :func:`resolve_task` turns a task string (a category, ``qa``, ``openqa``, a dataset, or a comma list
  of these) into specs; :func:`load_task` loads their records from a folder laid out like LongBench's ``data/``
  (one ``<dataset>.jsonl`` per dataset); :mod:`tuner.data.sources` adds the Hugging Face hub's mirror.
* :func:`split_records` splits records deterministically into a ``validation`` part (the tuner's
  objective) and a disjoint ``test`` part (held-out reporting).
* :class:`PromptConfig` holds LongBench's ``dataset2prompt.json`` / ``dataset2maxlen.json``;
  :func:`build_prompt` and :func:`truncate_middle` build the model input as LongBench's ``pred.py`` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from tuner.data.metrics import METRICS

CATEGORIES: tuple[str, ...] = (
    "single-doc-qa",
    "multi-doc-qa",
    "summarization",
    "few-shot",
    "synthetic",
    "code",
)
LANGUAGES: tuple[str, ...] = ("en", "zh")
LANGUAGE_FILTERS: tuple[str, ...] = ("en", "zh", "all")
SOURCES: tuple[str, ...] = ("longbench", "openqa", "file")
"""Where a dataset's records come from: LongBench's files, built from open QA releases, or the user's
own prompts file (:mod:`tuner.data.prompts`)."""
FILE_DATASET = "prompts"
"""The dataset name of every row of a prompts file (one dataset: one stratum of the macro average)."""
FILE_CATEGORY = "prompts-file"
PROMPTS_SUFFIXES: dict[str, str] = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
"""A prompts file's suffix -> the ``datasets`` builder that reads it."""


@dataclass(frozen=True)
class DatasetSpec:
    """One LongBench v1 dataset and the rules LongBench applies to it.

    Args:
        name: the dataset name, also the stem of its ``<name>.jsonl`` file.
        category: one of :data:`CATEGORIES`.
        language: ``"en"`` or ``"zh"`` (the language of the prompt; code counts as English).
        metric: a :data:`tuner.data.metrics.METRICS` name.
        chat_template: wrap the prompt in the model's chat template (LongBench: not for the few-shot
            datasets trec, triviaqa, samsum, lsht, nor for the code datasets).
        stop_at_newline: also stop generating at a newline (LongBench: samsum only).
        first_line: score only the first line of the prediction (trec, triviaqa, samsum, lsht).
        source: one of :data:`SOURCES`: ``"longbench"`` (read from LongBench's ``<name>.jsonl``) or
            ``"openqa"`` (built by :mod:`tuner.data.openqa` from HotpotQA / SQuAD for the prompt budget).
    """

    name: str
    category: str
    language: str
    metric: str
    chat_template: bool = True
    stop_at_newline: bool = False
    first_line: bool = False
    source: str = "longbench"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name = {self.name!r}: must be a non-empty dataset name")
        if self.category not in CATEGORIES and (self.category, self.source) != (FILE_CATEGORY, "file"):
            raise ValueError(
                f"{self.name}: category = {self.category!r}: must be one of {', '.join(CATEGORIES)}"
            )
        if self.language not in LANGUAGES:
            raise ValueError(f"{self.name}: language = {self.language!r}: must be 'en' or 'zh'")
        if self.metric not in METRICS:
            raise ValueError(f"{self.name}: metric = {self.metric!r}: must be one of {', '.join(METRICS)}")
        for flag in ("chat_template", "stop_at_newline", "first_line"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise ValueError(f"{self.name}: {flag} = {value!r}: must be True or False")
        if self.source not in SOURCES:
            raise ValueError(f"{self.name}: source = {self.source!r}: must be one of {', '.join(SOURCES)}")


def _few_shot(name: str, language: str, metric: str, *, stop_at_newline: bool = False) -> DatasetSpec:
    return DatasetSpec(
        name,
        "few-shot",
        language,
        metric,
        chat_template=False,
        stop_at_newline=stop_at_newline,
        first_line=True,
    )


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec("narrativeqa", "single-doc-qa", "en", "qa_f1"),
        DatasetSpec("qasper", "single-doc-qa", "en", "qa_f1"),
        DatasetSpec("multifieldqa_en", "single-doc-qa", "en", "qa_f1"),
        DatasetSpec("multifieldqa_zh", "single-doc-qa", "zh", "qa_f1_zh"),
        DatasetSpec("hotpotqa", "multi-doc-qa", "en", "qa_f1"),
        DatasetSpec("2wikimqa", "multi-doc-qa", "en", "qa_f1"),
        DatasetSpec("musique", "multi-doc-qa", "en", "qa_f1"),
        DatasetSpec("dureader", "multi-doc-qa", "zh", "rouge_zh"),
        DatasetSpec("gov_report", "summarization", "en", "rouge"),
        DatasetSpec("qmsum", "summarization", "en", "rouge"),
        DatasetSpec("multi_news", "summarization", "en", "rouge"),
        DatasetSpec("vcsum", "summarization", "zh", "rouge_zh"),
        _few_shot("trec", "en", "classification"),
        _few_shot("triviaqa", "en", "qa_f1"),
        _few_shot("samsum", "en", "rouge", stop_at_newline=True),
        _few_shot("lsht", "zh", "classification"),
        DatasetSpec("passage_count", "synthetic", "en", "count"),
        DatasetSpec("passage_retrieval_en", "synthetic", "en", "retrieval"),
        DatasetSpec("passage_retrieval_zh", "synthetic", "zh", "retrieval_zh"),
        DatasetSpec("lcc", "code", "en", "code_sim", chat_template=False),
        DatasetSpec("repobench-p", "code", "en", "code_sim", chat_template=False),
    )
}
"""All 21 LongBench v1 datasets by name, in LongBench's order."""

OPENQA_DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        # HotpotQA (distractor): its gold passages, its own distractors, then other questions' passages
        DatasetSpec("hotpotqa-long", "multi-doc-qa", "en", "qa_f1", stop_at_newline=True, source="openqa"),
        # SQuAD 2.0 (answerable): its paragraph, its article's other paragraphs, then other articles'
        DatasetSpec("squad-long", "single-doc-qa", "en", "qa_f1", stop_at_newline=True, source="openqa"),
    )
}
"""Long-context QA built in LongBench's format from HotpotQA and SQuAD (:mod:`tuner.data.openqa`).
Their answers are one short span, so generation stops at the first newline."""

ALL_DATASETS: dict[str, DatasetSpec] = {**DATASETS, **OPENQA_DATASETS}
"""Every dataset a task can name: LongBench's, then the open-QA ones."""

FILE_SPEC = DatasetSpec(FILE_DATASET, FILE_CATEGORY, "en", "qa_f1", source="file")
"""The dataset of a prompts file's rows: the chat template where the model has one, no stop rule of
its own; each row carries its metric (:class:`tuner.data.prompts.PromptRow`)."""


def is_prompts_path(task: str) -> bool:
    """Whether ``--task`` names a prompts file: an existing file, or a name ending in one of
    :data:`PROMPTS_SUFFIXES` (a missing one is then refused as a missing file, not an unknown task)."""
    if not isinstance(task, str) or not task.strip() or task in TASKS or task in ALL_DATASETS:
        return False
    return task.lower().endswith(tuple(PROMPTS_SUFFIXES)) or Path(task).expanduser().is_file()


TASKS: dict[str, tuple[str, ...]] = {
    **{category: tuple(n for n, s in DATASETS.items() if s.category == category) for category in CATEGORIES},
    "qa": tuple(n for n, s in DATASETS.items() if s.category in ("single-doc-qa", "multi-doc-qa")),
    "openqa": tuple(OPENQA_DATASETS),
}
"""Task name -> dataset names: LongBench's six categories, ``qa`` = LongBench's single-doc-qa +
multi-doc-qa, and ``openqa`` = the datasets built from HotpotQA and SQuAD."""


def dataset_spec(name: str) -> DatasetSpec:
    """The spec of any dataset a task can name (LongBench's or open-QA); unknown names list the valid ones."""
    if name == FILE_DATASET:
        return FILE_SPEC
    try:
        return ALL_DATASETS[name]
    except KeyError:
        raise ValueError(f"Unknown dataset {name!r}. Available: {', '.join(ALL_DATASETS)}") from None


def task_help() -> str:
    """The task names for ``--help``: task names, then every dataset name."""
    return (
        f"a task ({', '.join(TASKS)}), a dataset ({', '.join(ALL_DATASETS)}) or a comma list; or the path of "
        f"your own prompts file ({', '.join(PROMPTS_SUFFIXES)}; answers optional, docs/data.md)"
    )


def resolve_task(task: str, language: str = "en") -> list[DatasetSpec]:
    """The datasets a task string names, deduplicated, in the order named.

    ``task`` is a :data:`TASKS` name, an :data:`ALL_DATASETS` name, or a comma list of these; or the
    path of a prompts file (:func:`is_prompts_path`), whose rows are the one dataset :data:`FILE_SPEC`
    (a file is a task on its own, never part of a comma list). ``language``
    (``"en"``, ``"zh"`` or ``"all"``) filters the datasets of task names; a dataset named explicitly is
    kept whatever its language.

    >>> [s.name for s in resolve_task("synthetic,trec")]
    ['passage_count', 'passage_retrieval_en', 'trec']
    """
    if language not in LANGUAGE_FILTERS:
        raise ValueError(f"language = {language!r}: must be one of {', '.join(LANGUAGE_FILTERS)}")
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task = {task!r}: name a task ({', '.join(TASKS)}) or a dataset")
    if is_prompts_path(task):  # the file is read and checked by tuner.data.prompts.load_prompts_file
        return [FILE_SPEC]
    names: list[str] = []
    for part in (p.strip() for p in task.split(",")):
        if not part:
            continue
        if part in TASKS:
            names += [n for n in TASKS[part] if language == "all" or ALL_DATASETS[n].language == language]
        elif part in ALL_DATASETS:
            names.append(part)
        elif is_prompts_path(part):
            raise ValueError(f"task {task!r}: a prompts file is a task on its own; drop the other names")
        else:
            raise ValueError(
                f"Unknown task {part!r}. Available: {', '.join(TASKS)}, or a dataset: {', '.join(ALL_DATASETS)}"
            )
    specs = [ALL_DATASETS[n] for n in dict.fromkeys(names)]
    if not specs:
        raise ValueError(
            f"task {task!r} has no datasets in language {language!r}; use language 'all' or name datasets"
        )
    return specs


# --------------------------------------------------------------------------------------------------
# records
@dataclass(frozen=True)
class Record:
    """One LongBench sample.

    Args:
        id: the record's ``_id`` (unique within its dataset; the split hashes it).
        dataset: the dataset name.
        context: the long text (may contain braces; never used as a format string).
        input: the question or instruction (may be empty, e.g. passage_count, lcc).
        answers: the ground-truth answers (at least one); a prediction scores its best match.
        all_classes: the class names, for classification datasets; None elsewhere.
        length: LongBench's length field (words for English, characters for Chinese), if given.
        language: the record's language field (``"en"`` / ``"zh"``).
    """

    id: str
    dataset: str
    context: str
    input: str
    answers: list[str]
    all_classes: list[str] | None = None
    length: int | None = None
    language: str = "en"

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"_id = {self.id!r}: must be a non-empty string")
        for name in ("dataset", "context", "input", "language"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"{name} = {_short(value)}: must be a string")
        if not isinstance(self.answers, list) or not self.answers:
            raise ValueError(f"answers = {_short(self.answers)}: must be a non-empty list of strings")
        if not all(isinstance(a, str) for a in self.answers):
            raise ValueError(f"answers = {_short(self.answers)}: every answer must be a string")
        if self.all_classes is not None and (
            not isinstance(self.all_classes, list) or not all(isinstance(c, str) for c in self.all_classes)
        ):
            raise ValueError(f"all_classes = {_short(self.all_classes)}: must be null or a list of strings")
        if self.length is not None and (
            isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 0
        ):
            raise ValueError(f"length = {self.length!r}: must be null or a non-negative integer")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MissingDataset(FileNotFoundError):
    """A dataset's ``<name>.jsonl`` is not in the data folder (:func:`load_task` skips it with a warning)."""


_REQUIRED_FIELDS = ("_id", "context", "input", "answers")


def _record_from_obj(obj: Any, dataset: str, where: str) -> Record:
    """Build a :class:`Record` from one decoded JSON object; errors name ``where`` (file:line)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name in _REQUIRED_FIELDS:
        if name not in obj:
            raise ValueError(f"{where}: missing field {name!r}")
    try:
        return Record(
            id=obj["_id"],
            dataset=dataset,
            context=obj["context"],
            input=obj["input"],
            answers=obj["answers"],
            all_classes=obj.get("all_classes"),
            length=obj.get("length"),
            language=obj.get("language", DATASETS[dataset].language),
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ValueError(f"Unknown dataset {dataset!r}. Available: {', '.join(DATASETS)}")


def load_records(folder: str | Path, dataset: str) -> list[Record]:
    """Read ``<folder>/<dataset>.jsonl`` (one JSON object per line; blank lines are skipped).

    Raises:
        MissingDataset: the file does not exist.
        ValueError: a line is not valid JSON or not a valid record (``"<file>:<line>: ..."``), two records
            share an ``_id``, or the file holds no record.
    """
    _check_dataset(dataset)
    path = Path(folder) / f"{dataset}.jsonl"
    if not path.is_file():
        raise MissingDataset(f"{path}: no such file (LongBench dataset {dataset!r})")
    records: list[Record] = []
    first_seen: dict[str, int] = {}
    try:
        with path.open(encoding="utf-8") as lines:
            for lineno, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as exc:
                    raise ValueError(f"{where}: invalid JSON: {exc}") from None
                record = _record_from_obj(obj, dataset, where)
                if record.id in first_seen:
                    raise ValueError(
                        f"{where}: duplicate _id {record.id!r} (first at line {first_seen[record.id]})"
                    )
                first_seen[record.id] = lineno
                records.append(record)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def longbench_specs(task: str, language: str) -> list[DatasetSpec]:
    """The datasets of ``task`` read from LongBench's files (``source == "longbench"``), in task order."""
    return [spec for spec in resolve_task(task, language) if spec.source == "longbench"]


def data_dir(explicit: str | Path | None) -> Path:
    """The LongBench data folder: ``explicit`` if given, else the environment variable LONGBENCH_DIR.

    The folder must exist and hold at least one ``*.jsonl`` file.
    """
    if explicit is not None and str(explicit):
        folder, origin = Path(explicit).expanduser(), "--data-dir"
    else:
        env = os.environ.get("LONGBENCH_DIR", "")
        if not env:
            raise ValueError(
                "no LongBench data folder: pass --data-dir or set LONGBENCH_DIR to a folder of <dataset>.jsonl files"
            )
        folder, origin = Path(env).expanduser(), "LONGBENCH_DIR"
    if not folder.is_dir():
        raise ValueError(f"LongBench data folder {folder} (from {origin}) does not exist or is not a folder")
    if not any(folder.glob("*.jsonl")):
        raise ValueError(f"LongBench data folder {folder} (from {origin}) has no *.jsonl files")
    return folder


def load_task(task: str, language: str, folder: str | Path) -> dict[str, list[Record]]:
    """Records of every LongBench dataset of ``task`` (see :func:`resolve_task`) found in ``folder``, by
    name; the task's open-QA datasets are not read here (:mod:`tuner.data.openqa` builds them).

    A dataset whose file is missing is skipped with one warning naming it; if the task has LongBench
    datasets and none is present this is a ``ValueError`` listing the files looked for.
    """
    folder = Path(folder)
    specs = longbench_specs(task, language)
    if not specs:
        return {}
    loaded: dict[str, list[Record]] = {}
    for spec in specs:
        try:
            loaded[spec.name] = load_records(folder, spec.name)
        except MissingDataset:
            warnings.warn(
                f"LongBench dataset {spec.name!r} not found ({spec.name}.jsonl in {folder}); skipping it",
                stacklevel=2,
            )
    if not loaded:
        files = ", ".join(f"{spec.name}.jsonl" for spec in specs)
        raise ValueError(f"no data for task {task!r} in {folder}: looked for {files}")
    return loaded


# --------------------------------------------------------------------------------------------------
# splits
SPLITS: tuple[str, ...] = ("validation", "test")
Split = Literal["validation", "test"]
VALIDATION_FRACTION = 0.3
"""Default share of each dataset in ``validation`` (tuned on); the other ~70% is ``test`` (reported)."""


def unit_hash(seed: int, record_id: str) -> float:
    """A uniform-looking number in [0, 1) from sha256 of ``f"{seed}:{record_id}"`` (first 8 bytes)."""
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class Keyed(Protocol):
    """What the split reads of an item: its dataset and its id (a :class:`Record`, or an open-QA question)."""

    @property
    def id(self) -> str: ...

    @property
    def dataset(self) -> str: ...


K = TypeVar("K", bound=Keyed)


def _in_validation(records: Sequence[Keyed], seed: int, validation_fraction: float) -> list[bool]:
    """Per record: whether it is in ``validation``. Decided per dataset (see :func:`split_records`)."""
    by_dataset: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        by_dataset.setdefault(record.dataset, []).append(index)
    hashes = [unit_hash(seed, record.id) for record in records]
    flags = [h < validation_fraction for h in hashes]
    for indices in by_dataset.values():
        if len(indices) < 2:
            continue
        if not any(flags[i] for i in indices):
            flags[min(indices, key=lambda i: hashes[i])] = True
        elif all(flags[i] for i in indices):
            flags[max(indices, key=lambda i: hashes[i])] = False
    return flags


def split_records(
    records: Iterable[K],
    split: Split,
    seed: int = 0,
    validation_fraction: float = VALIDATION_FRACTION,
) -> list[K]:
    """The records of one split, in their input order (a record: anything with ``id`` and ``dataset``).

    A record is in ``validation`` iff ``u < validation_fraction``, where ``u`` in [0, 1) comes from
    sha256 of ``f"{seed}:{record.id}"``; otherwise it is in ``test``. So each record lands in the same
    split on every machine and run, the two splits are disjoint and cover all records, and about
    ``validation_fraction`` of each dataset is in ``validation``. Per dataset with at least two records,
    both splits get at least one: if hashing put all of them in ``test``, the lowest-hash record moves
    to ``validation``; if all in ``validation``, the highest-hash one moves to ``test``. A dataset with
    one record keeps it where its hash puts it. A different ``seed`` gives an independent split.
    """
    if split not in SPLITS:
        raise ValueError(f"split = {split!r}: must be 'validation' or 'test'")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed = {seed!r}: must be an integer")
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction = {validation_fraction!r}: must be in (0, 1)")
    records = list(records)
    flags = _in_validation(records, seed, validation_fraction)
    want_validation = split == "validation"
    return [record for record, flag in zip(records, flags) if flag == want_validation]


# --------------------------------------------------------------------------------------------------
# prompts
PROMPT_FILE = "dataset2prompt.json"
MAXLEN_FILE = "dataset2maxlen.json"
GENERIC_TEMPLATE = "Read the text and answer.\n\n{context}\n\nQuestion: {input}\nAnswer:"
"""Our own fallback template (not LongBench's): used for every dataset when the configs are absent."""
GENERIC_MAX_NEW_TOKENS = 64
_TEMPLATE_FIELDS = frozenset({"context", "input"})


def _check_template(dataset: str, template: Any) -> None:
    if not isinstance(template, str):
        raise ValueError(f"template for {dataset!r} = {_short(template)}: must be a string")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"template for {dataset!r} is not a valid format string: {exc}") from None
    unknown = fields - _TEMPLATE_FIELDS
    if unknown:
        raise ValueError(
            f"template for {dataset!r} uses {sorted(unknown)}: only {{context}} and {{input}} are filled in"
        )


@dataclass(frozen=True)
class PromptConfig:
    """Prompt templates and generation lengths per dataset.

    Args:
        source: ``"longbench"`` (LongBench's ``dataset2prompt.json`` / ``dataset2maxlen.json``, scores
            comparable with papers) or ``"generic"`` (:data:`GENERIC_TEMPLATE` and
            :data:`GENERIC_MAX_NEW_TOKENS` for every dataset; scores not comparable).
        templates: dataset -> template with ``{context}`` and ``{input}`` fields.
        max_new_tokens: dataset -> generation length in tokens (> 0).
        origin: where the tables came from (a folder), for error messages.
    """

    source: Literal["longbench", "generic"]
    templates: Mapping[str, str]
    max_new_tokens: Mapping[str, int]
    origin: str = ""

    def __post_init__(self) -> None:
        if self.source not in ("longbench", "generic"):
            raise ValueError(f"source = {self.source!r}: must be 'longbench' or 'generic'")
        if not isinstance(self.templates, Mapping):
            raise ValueError(f"templates = {_short(self.templates)}: must map dataset names to templates")
        if not isinstance(self.max_new_tokens, Mapping):
            raise ValueError(
                f"max_new_tokens = {_short(self.max_new_tokens)}: must map dataset names to ints"
            )
        for dataset, template in self.templates.items():
            _check_template(dataset, template)
        for dataset, n in self.max_new_tokens.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"max_new_tokens for {dataset!r} = {n!r}: must be a positive integer")
        object.__setattr__(self, "templates", dict(self.templates))
        object.__setattr__(self, "max_new_tokens", dict(self.max_new_tokens))

    @classmethod
    def generic(cls) -> PromptConfig:
        """The fallback: :data:`GENERIC_TEMPLATE` and :data:`GENERIC_MAX_NEW_TOKENS` for all datasets."""
        return cls(
            source="generic",
            templates=dict.fromkeys(DATASETS, GENERIC_TEMPLATE),
            max_new_tokens=dict.fromkeys(DATASETS, GENERIC_MAX_NEW_TOKENS),
            origin="built-in generic template",
        )

    def template(self, dataset: str) -> str:
        try:
            return self.templates[dataset]
        except KeyError:
            raise ValueError(f"no prompt template for {dataset!r} in {self.origin or self.source}") from None


def read_json(path: Path) -> Any:
    """A JSON file's content; an unreadable or invalid file is one ``ValueError`` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: invalid JSON: {exc}") from None


def _read_json_table(path: Path) -> dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object mapping dataset names, got {type(data).__name__}")
    return data


def load_prompt_config(folder: str | Path) -> PromptConfig:
    """LongBench's prompt tables from ``dataset2prompt.json`` and ``dataset2maxlen.json`` in ``folder``.

    If either file is absent, warns (one warning) and returns :meth:`PromptConfig.generic`, whose
    ``source`` is ``"generic"``.
    """
    folder = Path(folder)
    prompt_path, maxlen_path = folder / PROMPT_FILE, folder / MAXLEN_FILE
    missing = [p.name for p in (prompt_path, maxlen_path) if not p.is_file()]
    if missing:
        warnings.warn(
            f"{' and '.join(missing)} not found in {folder}: using the generic prompt "
            f"{GENERIC_TEMPLATE!r} with max_new_tokens={GENERIC_MAX_NEW_TOKENS} for every dataset; "
            "scores are not comparable with published LongBench results",
            stacklevel=2,
        )
        return PromptConfig.generic()
    templates = _read_json_table(prompt_path)
    max_new = _read_json_table(maxlen_path)
    try:
        return PromptConfig(
            source="longbench", templates=templates, max_new_tokens=max_new, origin=str(folder)
        )
    except ValueError as exc:
        raise ValueError(f"{folder}: {exc}") from None


def build_prompt(record: Record, config: PromptConfig) -> str:
    """The dataset's template filled with the record's context and input.

    Only the template is a format string: braces inside ``context`` / ``input`` are kept verbatim.
    """
    return config.template(record.dataset).format(context=record.context, input=record.input)


def max_new_tokens(config: PromptConfig, dataset: str) -> int:
    """How many tokens to generate for ``dataset`` (LongBench's dataset2maxlen)."""
    try:
        return config.max_new_tokens[dataset]
    except KeyError:
        raise ValueError(f"no max_new_tokens for {dataset!r} in {config.origin or config.source}") from None


CHAT_MARGIN = 32
"""Tokens left for the chat template's own tokens when a chat prompt's text is cut (:func:`encode_prompt`)."""


def encode_prompt(tokenizer: Any, text: str, chat: bool, max_tokens: int) -> list[int]:
    """The model input for a prompt, in LongBench's order: the text's tokens cut in the middle (to
    ``max_tokens - CHAT_MARGIN`` where the chat template follows), then the chat template applied (a
    ``user`` turn with the generation prompt), then the whole cut to ``max_tokens``."""
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    if chat:
        budget = max_tokens - CHAT_MARGIN  # room for the template's own tokens
        if len(ids) > budget:
            text = tokenizer.decode(truncate_middle(ids, budget), skip_special_tokens=True)
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        return truncate_middle(list(out), max_tokens)
    return truncate_middle(ids, max_tokens)


def uncut_length(tokenizer: Any, text: str, chat: bool, max_tokens: int) -> int | None:
    """The length of :func:`encode_prompt`'s result when it cuts nothing, else None (the prompt is too
    long: its text has more than ``max_tokens`` tokens, ``max_tokens - CHAT_MARGIN`` with the chat
    template, or the templated whole has more than ``max_tokens``)."""
    n_text = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    if n_text > (max_tokens - CHAT_MARGIN if chat else max_tokens):
        return None
    if not chat:
        return n_text
    n_all = len(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
    )
    return n_all if n_all <= max_tokens else None


def truncate_middle(ids: Sequence[int], max_tokens: int) -> list[int]:
    """Cut a too-long prompt in the middle (LongBench's rule): keep the first ``max_tokens // 2`` and the
    last ``max_tokens - max_tokens // 2`` tokens. A prompt that fits is returned unchanged.

    (LongBench keeps ``max_tokens // 2`` tokens at each end, one fewer in total when ``max_tokens`` is
    odd; here the result has exactly ``max_tokens`` tokens.)

    >>> truncate_middle([1, 2, 3, 4, 5, 6, 7], 5)
    [1, 2, 5, 6, 7]
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens = {max_tokens!r}: must be a positive integer")
    ids = list(ids)
    if len(ids) <= max_tokens:
        return ids
    head = max_tokens // 2
    tail = max_tokens - head
    return ids[:head] + ids[len(ids) - tail :]
