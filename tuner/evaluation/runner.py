"""Evaluate generation methods on a LongBench task split: predictions, scores and measured speedups.

How a method is scored on one example:

1. The prompt is built with LongBench's template, cut in the middle to ``max_prompt_tokens`` tokens
   (LongBench's rule) and, where LongBench does so for the dataset, wrapped in the chat template. The
   open-QA datasets (:mod:`tuner.data.openqa`) are built to fit instead, so nothing of theirs is cut.
2. The method generates greedily, up to LongBench's length for the dataset (optionally capped), with
   LongBench's stop rule (samsum and the open-QA datasets stop at a newline); the prediction is scored
   by the dataset's metric.
3. **Speed** is not taken from the scoring runs (one wall-clock time each, hit by whatever else the
   machine does). It is measured as the search measures it (:mod:`tuner.statistics.speed`): on a timing example
   (the one whose prompt length is nearest the median, :meth:`Evaluator.timing_example`) the unpruned
   model and the method run in interleaved rounds, the speedup is the minimum baseline time over the
   minimum method time, read on the CPU thread clock on a CPU (:func:`tuner.statistics.speed.resolve_clock`),
   re-measured when implausible against the FLOP model. Both TTFT (prefill + first token) and the
   whole generation of the example's answer length are measured (:meth:`Evaluator.measure_speed`).

The unpruned baseline's predictions (text and token ids), scores and timings are cached on disk as JSON, keyed by model,
data file digests, split, truncation, generation lengths and package version, so a second evaluation
(or every trial of a study) reuses them. The file carries its checksum and that fingerprint, and is
rebuilt with one line when either fails or a value is implausible (:func:`load_baseline`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import statistics
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from tqdm.auto import tqdm

import lazyllm
from lazyllm.atomic import write_atomic
from lazyllm.batch import DEFAULT_BATCH_SIZE, BatchRequest, decodes_frozen, generate_batch
from lazyllm.engine import GenerationResult, LazyLLM, PromptPrefix
from lazyllm.methods import Generator, make_method
from tuner.data.longbench import (
    FILE_DATASET,
    GENERIC_MAX_NEW_TOKENS,
    DatasetSpec,
    PromptConfig,
    Record,
    Split,
    build_prompt,
    dataset_spec,
    encode_prompt,
    is_prompts_path,
    longbench_specs,
    max_new_tokens,
    resolve_task,
    split_records,
    truncate_middle,
    uncut_length,
)
from tuner.data.metrics import agreement_score, score_example, task_score
from tuner.data.openqa import PROMPTS as OPENQA_PROMPTS
from tuner.data.openqa import RecordBuilder, build_split, openqa_specs, resolve_openqa_source
from tuner.data.prompts import PromptRow
from tuner.data.sources import resolve_source
from tuner.evaluation.integrity import announce_rebuild, as_json_value, json_digest
from tuner.statistics.bootstrap import DEFAULT_LEVEL, Estimate, macro_weights, paired_estimate
from tuner.statistics.speed import (
    DEFAULT_ROUNDS,
    SpeedMeasurement,
    generation_timer,
    measure_speedup,
    prefill_timer,
    resolve_clock,
)
from tuner.study.context import check_context, model_context
from tuner.study.settings import EvalSettings

T = TypeVar("T")


@dataclass(frozen=True)
class Example:
    """One prepared prompt: token ids ``[N]`` plus what scoring and generation need."""

    dataset: str
    record_id: str
    input_ids: tuple[int, ...]
    answers: tuple[str, ...]
    all_classes: tuple[str, ...] | None
    max_new_tokens: int
    stop_strings: tuple[str, ...]
    metric: str | None = None  # a prompts file's row metric (None: the dataset's)

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.record_id}"

    @property
    def by_agreement(self) -> bool:
        """No gold answers (a prompts file without them): scored against the unpruned model's answer."""
        return not self.answers


def _task_records(
    config: EvalSettings, tokenizer: Any, has_chat: bool, progress: bool = False
) -> Iterator[tuple[DatasetSpec, list[Record], PromptConfig]]:
    """Per dataset of ``config.task``, in task order: the chosen records of the split and their prompts.

    LongBench's datasets are read and split (``n_examples`` first records of the split); the open-QA
    datasets are built for the budget (:mod:`tuner.data.openqa`), and the questions whose gold passages
    cannot fit are skipped with one warning counting them."""
    specs = resolve_task(config.task, config.language)
    longbench: dict[str, list[Record]] = {}
    prompts = PromptConfig.generic()
    if any(spec.source == "longbench" for spec in specs):
        source = resolve_source(config.data_dir, config.task, config.language)
        longbench = source.load_task(config.task, config.language)
        prompts = source.prompt_config()
    openqa = resolve_openqa_source(config.openqa_dir) if any(s.source == "openqa" for s in specs) else None
    for spec in specs:
        if spec.source == "openqa" and openqa is not None:
            builder = RecordBuilder(
                openqa.load(spec.name),
                tokenizer,
                chat=spec.chat_template and has_chat,
                max_prompt_tokens=config.max_prompt_tokens,
                seed=config.split_seed,
            )
            split: Split = config.split  # type: ignore[assignment]  # checked by EvalSettings
            built = build_split(builder, split, config.split_seed, config.n_examples, progress=progress)
            if built.skipped:
                warnings.warn(
                    f"{spec.name}: {len(built.skipped)} {config.split} question(s) skipped, their gold "
                    f"passages do not fit in {config.max_prompt_tokens} tokens (first: {built.skipped[0]})",
                    stacklevel=3,
                )
            yield spec, built.records, OPENQA_PROMPTS
        elif spec.name in longbench:
            chosen = split_records(longbench[spec.name], config.split, seed=config.split_seed)  # type: ignore[arg-type]
            if config.n_examples is not None:
                chosen = chosen[: config.n_examples]
            yield spec, chosen, prompts


def row_ids(config: EvalSettings, tokenizer: Any, row: PromptRow, has_chat: bool, where: str) -> list[int]:
    """A prompts file's row as model input: a string prompt as one user turn (LongBench's encoding:
    cut in the middle, then the chat template where the model has one), chat messages through the
    chat template (without one: their contents, a blank line apart); a prompt over
    ``max_prompt_tokens`` cut in the middle, or refused with its row (``--long-prompts refuse``)."""
    limit = config.max_prompt_tokens
    if row.text is not None:
        if config.long_prompts == "refuse" and uncut_length(tokenizer, row.text, has_chat, limit) is None:
            raise ValueError(_too_long(where, row, limit))
        return encode_prompt(tokenizer, row.text, has_chat, limit)
    if has_chat:
        messages = [{"role": role, "content": content} for role, content in row.messages]
        ids = list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        )
    else:
        ids = tokenizer("\n\n".join(c for _, c in row.messages), add_special_tokens=False)["input_ids"]
    if config.long_prompts == "refuse" and len(ids) > limit:
        raise ValueError(_too_long(where, row, limit))
    return truncate_middle(ids, limit)


def _too_long(where: str, row: PromptRow, limit: int) -> str:
    return (
        f"{where}: row {row.row} (id {row.id!r}) is longer than --max-prompt-tokens {limit}; raise it, shorten "
        "the prompt, or pass --long-prompts cut to cut it in the middle"
    )


def file_examples(config: EvalSettings, tokenizer: Any) -> list[Example]:
    """The examples of a prompts file's split (:mod:`tuner.data.prompts`): ``n_examples`` first rows
    of the hashed split, each with its metric, answer length (capped by ``max_new_tokens``) and stops."""
    prompts = config.prompts_file  # the content the settings were made with
    assert prompts is not None, "file_examples needs a prompts file task"
    split: Split = config.split  # type: ignore[assignment]  # checked by EvalSettings
    rows = prompts.split(split, config.split_seed)
    if config.n_examples is not None:
        rows = rows[: config.n_examples]
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    examples = []
    for row in rows:
        limit = row.max_new_tokens or GENERIC_MAX_NEW_TOKENS
        if config.max_new_tokens is not None:
            limit = min(limit, config.max_new_tokens)
        examples.append(
            Example(
                dataset=FILE_DATASET,
                record_id=row.id,
                input_ids=tuple(row_ids(config, tokenizer, row, has_chat, prompts.name)),
                answers=row.answers,
                all_classes=None,
                max_new_tokens=limit,
                stop_strings=row.stop,
                metric=row.metric,
            )
        )
    return examples


def build_examples(config: EvalSettings, tokenizer: Any, *, progress: bool = False) -> list[Example]:
    """Load (or build), split and encode the examples of ``config.task`` (datasets in task order);
    LongBench's prompts longer than ``max_prompt_tokens`` are cut in the middle, open-QA ones are
    built to fit (:func:`tuner.data.longbench.encode_prompt`), with a progress bar if ``progress``;
    a prompts file's rows as :func:`file_examples` encodes them."""
    if is_prompts_path(config.task):
        rows = file_examples(config, tokenizer)
        if not rows:
            raise ValueError(f"prompts file {config.task}: no {config.split} rows")
        return rows
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    examples: list[Example] = []
    for spec, records, prompts in _task_records(config, tokenizer, has_chat, progress):
        limit = max_new_tokens(prompts, spec.name)
        if config.max_new_tokens is not None:
            limit = min(limit, config.max_new_tokens)
        for rec in records:
            ids = encode_prompt(
                tokenizer,
                build_prompt(rec, prompts),
                spec.chat_template and has_chat,
                config.max_prompt_tokens,
            )
            examples.append(
                Example(
                    dataset=spec.name,
                    record_id=rec.id,
                    input_ids=tuple(ids),
                    answers=tuple(rec.answers),
                    all_classes=tuple(rec.all_classes) if rec.all_classes else None,
                    max_new_tokens=limit,
                    stop_strings=("\n",) if spec.stop_at_newline else (),
                )
            )
    if not examples:
        raise ValueError(f"task {config.task!r} has no {config.split} examples in {_describe(config)}")
    return examples


def _describe(config: EvalSettings) -> str:
    if is_prompts_path(config.task):
        return config.task
    specs = resolve_task(config.task, config.language)
    where = []
    if any(s.source == "longbench" for s in specs):
        where.append(resolve_source(config.data_dir, config.task, config.language).describe())
    if any(s.source == "openqa" for s in specs):
        where.append(resolve_openqa_source(config.openqa_dir).describe())
    return " and ".join(where)


def data_fingerprint(config: EvalSettings) -> str:
    """Digest of the data a task reads (contents, not size + mtime, which would miss an edited copy);
    a prompts file's with its long-prompt rule (it decides the examples' ids)."""
    if is_prompts_path(config.task):
        assert config.prompts_file is not None
        # "pool": the validation split keeps a fresh pool from the search (since 2026-12-06)
        return f"prompts-{config.prompts_file.fingerprint}-{config.long_prompts}-pool"
    names = [spec.name for spec in longbench_specs(config.task, config.language)]
    parts = (
        [resolve_source(config.data_dir, config.task, config.language).fingerprint(names)] if names else []
    )
    built = openqa_specs(config.task, config.language)
    if built:
        parts.append(resolve_openqa_source(config.openqa_dir).fingerprint(built))
    return "+".join(parts)


@dataclass(frozen=True)
class ExampleResult:
    """One method on one example. ``ttft_s`` and ``total_s`` are the scoring run's own wall-clock
    times (raw evidence only: speedups come from :meth:`Evaluator.measure_speed`)."""

    dataset: str
    record_id: str
    method: str
    prediction: str
    score: float
    ttft_s: float
    total_s: float
    prompt_tokens: int
    new_tokens: int
    prompt_computed_fraction: float

    @staticmethod
    def to_jsonl(rows: Sequence[ExampleResult]) -> str:
        """One JSON object per line (the ``<method>.jsonl`` files of ``tuner.evaluate``)."""
        return "".join(json.dumps(asdict(r)) + "\n" for r in rows)

    @classmethod
    def read_jsonl(cls, path: Path) -> list[ExampleResult]:
        """The rows of a file :meth:`to_jsonl` wrote."""
        return [cls(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class MethodSpeed:
    """A method's measured speedups over the unpruned model on one timing example (:mod:`tuner.statistics.speed`).

    Attributes:
        example: the timing example's key. prompt_tokens: its prompt length. new_tokens: the answer
        length of the whole-generation timing. ttft: TTFT (prefill + first token) speedup. total:
        whole-generation speedup. Each holds every timing, the clock and the rounds.
    """

    example: str
    prompt_tokens: int
    new_tokens: int
    ttft: SpeedMeasurement
    total: SpeedMeasurement

    def __post_init__(self) -> None:
        if self.ttft.clock != self.total.clock:
            raise ValueError(f"clocks differ: ttft {self.ttft.clock!r}, total {self.total.clock!r}")

    @property
    def clock(self) -> str:
        return self.ttft.clock

    def to_dict(self) -> dict[str, Any]:
        return {
            "example": self.example,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "clock": self.clock,
            "ttft": self.ttft.to_dict(),
            "total": self.total.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MethodSpeed:
        return cls(
            example=str(data["example"]),
            prompt_tokens=int(data["prompt_tokens"]),
            new_tokens=int(data["new_tokens"]),
            ttft=SpeedMeasurement.from_dict(data["ttft"]),
            total=SpeedMeasurement.from_dict(data["total"]),
        )


BASELINE_FORMAT = "lazyllm-baseline-v2"
"""v2: a checksum of the content and the fingerprint of the inputs; v1 files (neither) are read into
:class:`BaselineEntry` records by :func:`load_baseline` but never trusted, so they are rebuilt."""


def _finite(value: Any, what: str, low: float = 0.0, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} = {value!r}: not a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{what} = {value!r}: must be finite and in [{low}, {high}]")
    return float(value)


@dataclass(frozen=True)
class BaselineEntry:
    """The unpruned model on one example: its greedy answer, score and scoring-run times.

    Attributes:
        prediction: the answer text. score: the dataset metric in [0, 1]. ttft_s, total_s: the
        scoring run's wall-clock times (>= 0). token_ids: the answer's token ids (teacher-forced by
        :mod:`tuner.evaluation.fidelity`).
    """

    prediction: str
    score: float
    ttft_s: float
    total_s: float
    token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.prediction, str):
            raise ValueError(f"prediction = {self.prediction!r}: not a string")
        _finite(self.score, "score", 0.0, 1.0)
        _finite(self.ttft_s, "ttft_s")
        _finite(self.total_s, "total_s")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.token_ids):
            raise ValueError("token_ids: every id must be an integer >= 0")

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prediction": self.prediction,
            "score": self.score,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "new_tokens": self.new_tokens,
            "token_ids": list(self.token_ids),
        }

    @classmethod
    def from_dict(cls, data: Any) -> BaselineEntry:
        """Read an entry of any format written so far (v1 and v2 entries have the same fields; an
        entry from before answer ids were cached has none and is refused)."""
        if not isinstance(data, dict):
            raise ValueError(f"{data!r}: not an entry")
        if "token_ids" not in data:
            raise ValueError("no answer token ids (written before they were cached)")
        ids = data["token_ids"]
        if not isinstance(ids, list):
            raise ValueError("token_ids: not a list")
        if "new_tokens" in data and data["new_tokens"] != len(ids):
            raise ValueError(f"new_tokens = {data['new_tokens']!r} but {len(ids)} token ids")
        return cls(
            prediction=data.get("prediction"),  # type: ignore[arg-type]  # checked in __post_init__
            score=data.get("score"),  # type: ignore[arg-type]
            ttft_s=data.get("ttft_s"),  # type: ignore[arg-type]
            total_s=data.get("total_s"),  # type: ignore[arg-type]
            token_ids=tuple(ids),
        )


@dataclass(frozen=True)
class BaselineFile:
    """What :func:`load_baseline` read: the entries (migrated to :class:`BaselineEntry`) and, when
    they are not to be trusted, why (``problem``; the entries are then empty or unverified)."""

    entries: dict[str, BaselineEntry]
    problem: str | None = None


def _checksum(fingerprint: Any, entries: dict[str, Any]) -> str:
    return json_digest({"format": BASELINE_FORMAT, "fingerprint": fingerprint, "entries": entries})


def load_baseline(path: Path, fingerprint: dict[str, Any]) -> BaselineFile:
    """The one loader of baseline caches: any format written so far, checked against its checksum,
    ``fingerprint`` (the inputs' identity) and each entry's plausibility. Never raises on bad
    content: a file that fails is reported in ``problem`` (with whatever entries could be read)."""
    if not path.exists():
        return BaselineFile({})
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        return BaselineFile({}, f"not readable JSON: {type(exc).__name__}")
    raw = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return BaselineFile({}, "not a baseline cache (no entries object)")
    entries: dict[str, BaselineEntry] = {}
    for key, value in raw.items():
        try:
            entries[key] = BaselineEntry.from_dict(value)
        except (ValueError, TypeError) as exc:
            return BaselineFile({}, f"entry {key!r}: {exc}")
    if data.get("format") != BASELINE_FORMAT or "checksum" not in data:
        return BaselineFile(entries, "written without a checksum by an older version")
    wanted = as_json_value(fingerprint)
    if data.get("fingerprint") != wanted:
        return BaselineFile({}, "made for other inputs (its fingerprint differs)")
    try:
        checksum = _checksum(wanted, raw)
    except ValueError:  # NaN or infinity somewhere: implausible, and not canonical JSON
        return BaselineFile({}, "holds a non-finite number")
    if data["checksum"] != checksum:
        return BaselineFile({}, "its checksum does not match its content")
    return BaselineFile(entries)


@dataclass
class BaselineCache:
    """Unpruned predictions and timings per example, as one JSON file per evaluation fingerprint
    (with its checksum and fingerprint: :func:`load_baseline`)."""

    path: Path
    fingerprint: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, BaselineEntry] = field(default_factory=dict)

    @classmethod
    def open(cls, cache_dir: Path, fingerprint: dict[str, Any]) -> BaselineCache:
        key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:20]
        path = cache_dir / f"baseline-{key}.json"
        found = load_baseline(path, fingerprint)
        if found.problem is not None:  # rebuilt, never trusted
            announce_rebuild(path, found.problem)
            return cls(path=path, fingerprint=fingerprint)
        return cls(path=path, fingerprint=fingerprint, entries=dict(found.entries))

    def save(self) -> None:
        fingerprint = as_json_value(self.fingerprint)
        entries = {k: v.to_dict() for k, v in self.entries.items()}
        data = {
            "format": BASELINE_FORMAT,
            "fingerprint": fingerprint,
            "checksum": _checksum(fingerprint, entries),
            "entries": entries,
        }
        write_atomic(self.path, json.dumps(data, indent=1))


def score_prediction(example: Example, prediction: str, unpruned: str | None = None) -> float:
    """``prediction`` scored by the example's metric (0-1): against its gold answers, or, for an
    example without any (:attr:`Example.by_agreement`), against ``unpruned``, the unpruned model's
    own answer (:func:`tuner.data.metrics.agreement_score`)."""
    spec = dataset_spec(example.dataset)
    metric = example.metric or spec.metric
    if example.by_agreement:
        if unpruned is None:
            raise ValueError(f"{example.key} has no answers: its score needs the unpruned model's answer")
        return agreement_score(metric, prediction, unpruned)
    classes = list(example.all_classes) if example.all_classes else None
    return score_example(metric, prediction, list(example.answers), classes, spec.first_line)


def chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def run_example(
    generator: Generator, example: Example, prefix: PromptPrefix | None = None
) -> GenerationResult:
    """``generator`` on ``example``'s prompt: greedy, up to its answer length, with its stop strings.

    ``prefix``: the prompt's captured unpruned prefix, for a :class:`~lazyllm.LazyLLM` generator (the
    same answer; the result's TTFT then leaves out the prefix's layers, so it is no timing)."""
    options: dict[str, Any] = {"max_new_tokens": example.max_new_tokens, "stop_strings": example.stop_strings}
    if prefix is not None:
        if not isinstance(generator, LazyLLM):
            raise TypeError(f"a prompt prefix needs a LazyLLM engine, not {type(generator).__name__}")
        options["prefix"] = prefix
    return generator.generate(torch.tensor(example.input_ids), **options)


Run = tuple[Generator, "Example", PromptPrefix | None]
"""One generation to run: the generator, the example, and the prompt's captured prefix (or None)."""


def run_examples(
    runs: Sequence[Run],
    batch_size: int = DEFAULT_BATCH_SIZE,
    forced: Sequence[tuple[int, ...] | None] | None = None,
    force_own: bool = False,
) -> list[GenerationResult]:
    """:func:`run_example` of each run, in order; the runs of LazyLLM engines whose decoding is frozen
    run together, ``batch_size`` at a time (:func:`lazyllm.batch.generate_batch`: prefills batched
    per engine, steps batched; the same greedy answers up to float rounding; their times are the
    batch's, not the example's). Runs with teacher-forced logits keep lone prefills (bit-exact
    scores). Other generators run one at a time.

    ``forced`` (one answer or None per run, for LazyLLM engines): each result also carries the
    teacher-forced logits along it (``forced_logits``, :meth:`LazyLLM.forced_logits`), from the
    generation's own prefill where the run is batched. ``force_own``: each result carries the logits
    teacher-forced along its own answer instead (the fidelity reference, from the same prefill)."""
    if forced is not None and force_own:
        raise ValueError("give forced answers or force_own, not both")
    wanted = list(forced) if forced is not None else [None] * len(runs)
    if len(wanted) != len(runs):
        raise ValueError(f"{len(wanted)} forced answers for {len(runs)} runs: give one (or None) per run")
    out: list[GenerationResult | None] = [None] * len(runs)
    batched = [i for i, (g, _, _) in enumerate(runs) if isinstance(g, LazyLLM) and decodes_frozen(g)]
    requests = [
        BatchRequest(
            runs[i][0],  # type: ignore[arg-type]
            runs[i][1].input_ids,
            max_new_tokens=runs[i][1].max_new_tokens,
            stop_strings=tuple(runs[i][1].stop_strings),
            prefix=runs[i][2],
            forced=wanted[i],
            force_own=force_own,
        )
        for i in batched
    ]
    for i, result in zip(batched, generate_batch(requests, batch_size=batch_size)):
        out[i] = result
    for i, (generator, example, prefix) in enumerate(runs):
        if out[i] is None:
            result = run_example(generator, example, prefix)
            answer = tuple(result.token_ids) if force_own else wanted[i]
            if answer is not None:
                if not isinstance(generator, LazyLLM):
                    raise TypeError(f"a forced answer needs a LazyLLM engine, not {type(generator).__name__}")
                logits = generator.forced_logits(torch.tensor(example.input_ids), answer, prefix=prefix)
                result = dataclasses.replace(result, forced_logits=logits)
            out[i] = result
    return [r for r in out if r is not None]


def result_of(
    method: str, example: Example, result: GenerationResult, unpruned: str | None = None
) -> ExampleResult:
    """One example's scored row from ``method``'s generation (``unpruned``: the unpruned model's
    answer, the reference of an example scored by agreement; see :meth:`Evaluator.unpruned`)."""
    prediction = result.text or ""
    return ExampleResult(
        dataset=example.dataset,
        record_id=example.record_id,
        method=method,
        prediction=prediction,
        score=score_prediction(example, prediction, unpruned),
        ttft_s=result.ttft_s,
        total_s=result.total_s,
        prompt_tokens=result.prompt_tokens,
        new_tokens=len(result.token_ids),
        prompt_computed_fraction=result.prompt_computed_fraction,
    )


class Evaluator:
    """Holds a model, the prepared examples and the cached baseline; evaluates methods on them.

    Args:
        model, tokenizer: from :func:`lazyllm.load_model`.
        config: the evaluation settings.
        cache_dir: where baseline results are cached (JSON).
        progress: show tqdm progress bars.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: EvalSettings,
        cache_dir: str | Path,
        *,
        progress: bool = True,
    ) -> None:
        # before any example is built: a prompt length over the model's context is refused, not cut
        check_context(config.max_prompt_tokens, config.max_new_tokens, model_context(model.config))
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.progress = progress
        self.examples = build_examples(config, tokenizer, progress=progress)
        self.baseline_engine = make_method("baseline", model, tokenizer, None)
        fingerprint = {
            **{
                k: v
                for k, v in asdict(config.eval_only()).items()
                if k not in ("data_dir", "openqa_dir", "trust_remote_code", "long_prompts")  # in "data"
            },
            "data": data_fingerprint(config),
            "lazyllm": lazyllm.__version__,
            "torch": torch.__version__,
            "device": str(next(model.parameters()).device),
            "dtype": str(next(model.parameters()).dtype),
        }
        self.cache = BaselineCache.open(Path(cache_dir), fingerprint)

    def baseline(
        self,
        examples: Sequence[Example] | None = None,
        *,
        resume: tuple[Generator, Callable[[Example], PromptPrefix | None]] | None = None,
    ) -> dict[str, BaselineEntry]:
        """Unpruned prediction, score and timings per example key of ``examples`` (default: all),
        computed once, then read from the cache. ``resume`` = (a keep-all engine, the unpruned
        prefill of an example or None) decodes the missing answers from prefills already captured:
        the same answers, without a progress bar (the caller shows its own)."""
        wanted = list(self.examples if examples is None else examples)
        missing = [ex for ex in wanted if ex.key not in self.cache.entries]
        engine, prefix_of = resume or (self.baseline_engine, lambda ex: None)
        show = self.progress and bool(missing) and resume is None
        # a context: a Ctrl-C closes the bar before the command prints its last line
        with tqdm(total=len(missing), desc="baseline", disable=not show) as bar:
            for chunk in chunks(missing, DEFAULT_BATCH_SIZE):  # decoded together, saved per chunk
                results = run_examples([(engine, ex, prefix_of(ex)) for ex in chunk])
                for ex, result in zip(chunk, results):
                    self.record_baseline(ex, result)
                self.cache.save()
                bar.update(len(chunk))
        return {ex.key: self.cache.entries[ex.key] for ex in wanted}

    def restricted(self, examples: Sequence[Example]) -> Evaluator:
        """The same evaluator (model, settings, baseline cache) on ``examples``, some of its own."""
        known = {ex.key for ex in self.examples}
        if any(ex.key not in known for ex in examples):
            raise ValueError("restricted() takes examples of this evaluator only")
        out = copy.copy(self)
        out.examples = list(examples)
        return out

    def record_baseline(self, example: Example, result: GenerationResult) -> None:
        """Store the unpruned model's generation on ``example`` in the cache (saved by the caller)."""
        prediction = result.text or ""
        self.cache.entries[example.key] = BaselineEntry(
            prediction=prediction,
            score=score_prediction(example, prediction, unpruned=prediction),  # agreement: itself, 1
            ttft_s=result.ttft_s,
            total_s=result.total_s,
            token_ids=tuple(int(t) for t in result.token_ids),  # teacher-forced by the fidelity
        )

    def unpruned(self, example: Example) -> str | None:
        """The reference of an example scored by agreement (its cached unpruned answer), else None."""
        return self.cache.entries[example.key].prediction if example.by_agreement else None

    def timing_example(self, examples: Sequence[Example] | None = None) -> Example:
        """The example of ``examples`` (default: all) whose prompt length is nearest their median
        (ties: the first key), as the search times the one example nearest its target length."""
        pool = list(examples if examples is not None else self.examples)
        if not pool:
            raise ValueError("no examples to pick a timing example from")
        mid = statistics.median(len(ex.input_ids) for ex in pool)
        return min(pool, key=lambda ex: (abs(len(ex.input_ids) - mid), ex.key))

    def measure_speed(
        self,
        generator: Generator,
        example: Example,
        flop_speedup: float,
        *,
        rounds: int = DEFAULT_ROUNDS,
        clock: str = "auto",
    ) -> MethodSpeed:
        """TTFT and whole-generation speedups of ``generator`` over the unpruned model on ``example``,
        by the search's robust path (:func:`tuner.statistics.speed.measure_speedup`: interleaved ``rounds``,
        minimum per side, ``clock`` resolved for the model's device, re-measured when the ratio to
        ``flop_speedup`` is implausible)."""
        read = resolve_clock(clock, next(self.model.parameters()).device)
        ids = torch.tensor(example.input_ids)  # [N]
        new = example.max_new_tokens
        ttft = measure_speedup(
            prefill_timer(self.baseline_engine, ids, read),
            prefill_timer(generator, ids, read),
            flop_speedup,
            rounds=rounds,
            clock=read,
        )
        total = measure_speedup(
            generation_timer(self.baseline_engine, ids, new, read),
            generation_timer(generator, ids, new, read),
            flop_speedup,
            rounds=rounds,
            clock=read,
        )
        return MethodSpeed(example.key, len(example.input_ids), new, ttft, total)

    def evaluate(
        self,
        method: str,
        generator: Generator,
        *,
        should_stop: Callable[[list[ExampleResult]], str | None] | None = None,
        desc: str | None = None,
    ) -> tuple[list[ExampleResult], str | None]:
        """Run ``generator`` on every example (stopping early if ``should_stop`` returns a reason).

        Returns the per-example results and the early-stop reason (None if it ran to the end).
        """
        self.baseline()  # the unpruned answers exist before any method is scored against them
        results: list[ExampleResult] = []
        # a frozen engine's examples decode together; a chunk of one keeps should_stop's granularity
        size = DEFAULT_BATCH_SIZE if isinstance(generator, LazyLLM) and decodes_frozen(generator) else 1
        total = len(self.examples)
        with tqdm(total=total, desc=desc or method, disable=not self.progress, leave=False) as bar:
            for chunk in chunks(self.examples, size):
                for ex, result in zip(chunk, run_examples([(generator, ex, None) for ex in chunk])):
                    results.append(result_of(method, ex, result, self.unpruned(ex)))
                    bar.update(1)
                    if should_stop is not None:
                        reason = should_stop(results)
                        if reason:
                            return results, reason
        return results, None

    def baseline_results(self) -> list[ExampleResult]:
        """The cached baseline as :class:`ExampleResult` rows."""
        base = self.baseline()
        return [
            ExampleResult(
                dataset=ex.dataset,
                record_id=ex.record_id,
                method="baseline",
                prediction=base[ex.key].prediction,
                score=base[ex.key].score,
                ttft_s=base[ex.key].ttft_s,
                total_s=base[ex.key].total_s,
                prompt_tokens=len(ex.input_ids),
                new_tokens=base[ex.key].new_tokens,
                prompt_computed_fraction=1.0,
            )
            for ex in self.examples
        ]


def dataset_scores(results: Sequence[ExampleResult]) -> dict[str, float]:
    """LongBench score (100 x mean) per dataset."""
    by: dict[str, list[float]] = {}
    for r in results:
        by.setdefault(r.dataset, []).append(r.score)
    return {d: task_score(s) for d, s in by.items()}


def macro_score(results: Sequence[ExampleResult]) -> float:
    """The LongBench score of a set of examples: the mean over datasets of each dataset's score (the
    average every accuracy loss and interval here is taken against)."""
    return float(statistics.fmean(dataset_scores(results).values()))


Item = TypeVar("Item", Example, ExampleResult)


def by_category(items: Sequence[Item]) -> dict[str, list[Item]]:
    """Examples (or results) per LongBench category of their dataset, then ``"all"``."""
    groups: dict[str, list[Item]] = {}
    for item in items:
        groups.setdefault(dataset_spec(item.dataset).category, []).append(item)
    groups["all"] = list(items)
    return groups


@dataclass(frozen=True)
class EvaluationSummary:
    """One method on a set of examples against the unpruned baseline on the same examples.

    Attributes:
        n_examples: examples scored. score / baseline_score: macro LongBench score over datasets.
        loss: the accuracy loss (score points, ``baseline - method``: positive = worse) with its
        standard error, paired bootstrap interval and one-sided upper bound at ``loss.level``
        (:func:`loss_estimate`). dataset_scores / baseline_dataset_scores: LongBench score per dataset.
        prompt_computed_pct: mean share of prompt (token, layer) pairs computed, percent.
        speed: the measured speedups (clock, rounds and every timing), None where not timed.

    ``to_dict`` is the ``<method>.summary.json`` layout; :meth:`from_dict` is its one loader.
    """

    n_examples: int
    score: float
    baseline_score: float
    loss: Estimate
    dataset_scores: dict[str, float]
    baseline_dataset_scores: dict[str, float]
    prompt_computed_pct: float
    speed: MethodSpeed | None = None

    def __post_init__(self) -> None:
        if self.n_examples < 1:
            raise ValueError(f"n_examples = {self.n_examples}: a summary needs at least one example")
        if set(self.dataset_scores) != set(self.baseline_dataset_scores):
            raise ValueError(
                f"datasets differ: method {sorted(self.dataset_scores)}, "
                f"baseline {sorted(self.baseline_dataset_scores)} (a paired loss needs the same examples)"
            )
        if not 0.0 <= self.prompt_computed_pct <= 100.0:
            raise ValueError(f"prompt_computed_pct = {self.prompt_computed_pct}: must be in [0, 100]")

    def dataset_losses(self) -> dict[str, float]:
        """Accuracy loss per dataset (score points, baseline - method), in ``dataset_scores`` order."""
        return {d: self.baseline_dataset_scores[d] - v for d, v in self.dataset_scores.items()}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "n_examples": self.n_examples,
            "score": self.score,
            "baseline_score": self.baseline_score,
            "accuracy_loss": self.loss.value,
            "accuracy_loss_se": self.loss.to_dict()["se"],
            "accuracy_loss_interval": [self.loss.low, self.loss.high],
            "accuracy_loss_upper": self.loss.upper,
            "interval_level": self.loss.level,
            "dataset_scores": dict(self.dataset_scores),
            "baseline_dataset_scores": dict(self.baseline_dataset_scores),
            "prompt_computed_pct": self.prompt_computed_pct,
        }
        if self.speed is not None:
            out.update(
                ttft_speedup=self.speed.ttft.speedup,
                total_speedup=self.speed.total.speedup,
                timing_clock=self.speed.clock,
                speed=self.speed.to_dict(),
            )
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationSummary:
        """Read a ``<method>.summary.json``; the speedups are read from ``speed`` (its loose
        ``ttft_speedup``/``total_speedup``/``timing_clock`` copies are not read back)."""
        low, high = data["accuracy_loss_interval"]
        loss = Estimate.from_dict(
            {
                "value": data["accuracy_loss"],
                "se": data.get("accuracy_loss_se"),
                "low": low,
                "high": high,
                "upper": data["accuracy_loss_upper"],
                "level": data["interval_level"],
                "n": data["n_examples"],
            }
        )
        speed = data.get("speed")
        return cls(
            n_examples=int(data["n_examples"]),
            score=float(data["score"]),
            baseline_score=float(data["baseline_score"]),
            loss=loss,
            dataset_scores={str(k): float(v) for k, v in data["dataset_scores"].items()},
            baseline_dataset_scores={str(k): float(v) for k, v in data["baseline_dataset_scores"].items()},
            prompt_computed_pct=float(data["prompt_computed_pct"]),
            speed=None if speed is None else MethodSpeed.from_dict(speed),
        )


def summarize(
    results: Sequence[ExampleResult], baseline: Sequence[ExampleResult], speed: MethodSpeed | None = None
) -> EvaluationSummary:
    """Macro-averaged score over datasets, accuracy loss against the baseline on the same examples
    (with its standard error, 90% paired bootstrap interval and one-sided upper bound), mean share of
    prompt (token, layer) pairs computed, and the measured ``speed`` when given (clock, rounds and
    every timing included)."""
    if not results:
        raise ValueError("no results to summarize")
    done = {(r.dataset, r.record_id) for r in results}
    base = [b for b in baseline if (b.dataset, b.record_id) in done]
    return EvaluationSummary(
        n_examples=len(results),
        score=macro_score(results),
        baseline_score=macro_score(base),
        loss=loss_estimate(results, base),  # paired bootstrap over the same examples (90%, fixed seed)
        dataset_scores=dataset_scores(results),
        baseline_dataset_scores=dataset_scores(base),
        prompt_computed_pct=100 * statistics.fmean(r.prompt_computed_fraction for r in results),
        speed=speed,
    )


def loss_estimate(
    results: Sequence[ExampleResult],
    baseline: Sequence[ExampleResult],
    *,
    level: float = DEFAULT_LEVEL,
    within_datasets: bool = False,
    seed: int = 0,
) -> Estimate:
    """The macro-averaged accuracy loss (score points, ``baseline - results``: positive = worse) of
    ``results`` against ``baseline`` on the same examples, with its standard error, paired bootstrap
    interval and one-sided upper bound (:func:`tuner.statistics.bootstrap.paired_estimate`; ``within_datasets``
    resamples each dataset's examples among themselves)."""
    if not results:
        raise ValueError("no results to estimate a loss from")
    base = {(b.dataset, b.record_id): b.score for b in baseline}
    missing = [f"{r.dataset}/{r.record_id}" for r in results if (r.dataset, r.record_id) not in base]
    if missing:
        raise ValueError(f"baseline lacks example(s) {missing[:3]}: a paired loss needs the same examples")
    datasets = [r.dataset for r in results]
    return paired_estimate(
        [100.0 * base[(r.dataset, r.record_id)] for r in results],
        [100.0 * r.score for r in results],
        macro_weights(datasets),
        strata=datasets if within_datasets else None,
        level=level,
        seed=seed,
    )
