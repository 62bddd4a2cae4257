"""Long-context QA built from HotpotQA and SQuAD 2.0, as LongBench-format records filled to a budget.

Two datasets (declared in :data:`tuner.data.longbench.OPENQA_DATASETS`, task ``openqa`` = both):

* ``hotpotqa-long``: HotpotQA dev, distractor setting. A question's gold passages are its context
  paragraphs whose title is among its supporting facts; its distractors are first its own other
  context paragraphs, then paragraphs of other questions (never one whose title is among its own).
  Prompt: LongBench's multi-document template (its ``hotpotqa`` entry), passages written as LongBench
  writes them (``Passage i:\\n<title>\\n<text>``, joined by a newline). Gold: the ``answer``.
* ``squad-long``: SQuAD 2.0 dev, answerable questions only. The gold passage is the question's
  paragraph; distractors are first the other paragraphs of its article, then paragraphs of other
  articles. Prompt: LongBench's single-document template (its ``multifieldqa_en`` entry), paragraphs
  joined by a blank line. Gold: every distinct answer text (scored as the best match).

How one record is built (:class:`RecordBuilder`), for a tokenizer, a chat-template flag and a budget of
``max_prompt_tokens``: the question's own distractors in an order drawn from ``(seed, dataset, id)``,
then other passages drawn by the same generator, are added to the gold passages while the prompt's
estimated length stays within the budget (token counts of passages are computed once and cached).
The selected passages are then shuffled (a second generator from the same key) and the prompt is
encoded exactly as the evaluation encodes it (:func:`tuner.data.longbench.encode_prompt`: template,
then chat template); while that would cut anything, the last distractor added is dropped. So the
final prompt is never cut and holds every gold passage whole. A question whose gold passages alone do
not fit is skipped (:class:`BuiltSplit` counts it), never cut. A record depends only on the corpus,
the tokenizer, the flag, the budget, the seed and its own id, not on which records were built before.

The validation/test split is LongBench's (:func:`tuner.data.longbench.split_records`: a hash of the
question id), taken on the questions before any record is built, so it is the same at every budget.
A split is then taken in a hashed order (:func:`split_questions`), so its first ``n`` records are a
random sample of it, not SQuAD's first article or two.

Where the data comes from (:func:`resolve_openqa_source`): ``--openqa-dir`` (the ``openqa_dir``
setting), else the environment variable ``OPENQA_DIR`` (a folder holding the official files
:data:`FILES`), else the Hugging Face hub's parquet conversion of ``hotpotqa/hotpot_qa`` (config
``distractor``, split ``validation``) and ``rajpurkar/squad_v2`` (split ``validation``) through
``datasets``; ``OPENQA_HUB_PARQUET`` (a template with ``{dataset}``) points the hub path elsewhere.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, overload

from tqdm.auto import tqdm

from tuner.data.embedded import HUB, PACKAGED, POOL_QUESTIONS, manifest, pool_path
from tuner.data.longbench import (
    CHAT_MARGIN,
    OPENQA_DATASETS,
    PromptConfig,
    Record,
    Split,
    build_prompt,
    read_json,
    resolve_task,
    split_records,
    uncut_length,
)

FILES: dict[str, str] = {
    "hotpotqa-long": "hotpot_dev_distractor_v1.json",
    "squad-long": "squad_dev_v2.0.json",
}
"""Dataset -> its official file in the open-QA folder (HotpotQA dev distractor v1, SQuAD 2.0 dev)."""

HUB_PARQUET: dict[str, str] = {
    "hotpotqa-long": "hf://datasets/hotpotqa/hotpot_qa@refs%2Fconvert%2Fparquet/distractor/validation/0000.parquet",
    "squad-long": "hf://datasets/rajpurkar/squad_v2@refs%2Fconvert%2Fparquet/squad_v2/validation/0000.parquet",
}
"""Dataset -> the hub's parquet conversion of its source (HotpotQA distractor / SQuAD 2.0, validation)."""

UNREACHABLE = (
    "the Hugging Face hub's {what} is unreachable ({why}); pass --openqa-dir DIR or set OPENQA_DIR to "
    "a folder holding hotpot_dev_distractor_v1.json and squad_dev_v2.0.json"
)
FULL_SETS = (
    "pass --openqa-dir DIR (a folder holding hotpot_dev_distractor_v1.json and squad_dev_v2.0.json) "
    "or --openqa-dir hub"
)
"""Where to turn when the packaged pool cannot serve a request."""

PROMPTS = PromptConfig(
    source="longbench",
    templates={
        # LongBench's dataset2prompt.json, entry "hotpotqa" (multi-document QA)
        "hotpotqa-long": "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question "
        "based on the given passages. Only give me the answer and do not output any other words.\n\n"
        "Question: {input}\nAnswer:",
        # LongBench's dataset2prompt.json, entry "multifieldqa_en" (single-document QA)
        "squad-long": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following "
        "question based on the above text, only give me the answer and do not output any other words.\n\n"
        "Question: {input}\nAnswer:",
    },
    # LongBench's dataset2maxlen.json for the same entries
    max_new_tokens={"hotpotqa-long": 32, "squad-long": 64},
    origin="tuner.data.openqa (LongBench's hotpotqa and multifieldqa_en prompts)",
)
"""The prompts of the open-QA datasets: LongBench's own templates and answer lengths."""

BUILD_VERSION = 1
"""Bumped whenever the way records are built changes (it is part of :meth:`OpenQASource.fingerprint`)."""

_MARGIN = 8
"""Tokens of the budget left free by the estimate (boundary merges); the exact check decides."""
_MISSES = 3
"""Consecutive candidate passages that do not fit before the filling stops."""
_FULL = 16
"""The filling stops when fewer tokens than this are left (no passage is that short)."""


# --------------------------------------------------------------------------------------------------
# corpora
@dataclass(frozen=True)
class Passage:
    """One paragraph. ``group``: passages sharing a group with a question's own are never drawn as
    its "other" distractors (HotpotQA: the title; SQuAD: the article's title)."""

    title: str
    text: str
    group: str


@dataclass(frozen=True)
class Question:
    """One question of a corpus; ``gold`` and ``own`` index :attr:`Corpus.passages`.

    Args:
        id: the question id (HotpotQA ``_id``, SQuAD ``id``); the split hashes it.
        dataset: ``hotpotqa-long`` or ``squad-long``.
        question: the question text.
        answers: the gold answers (at least one).
        gold: the passages that hold the answer (at least one).
        own: the question's own distractors (HotpotQA: its other context paragraphs; SQuAD: its
            article's other paragraphs), in file order.
        groups: the groups of its gold and own passages (see :class:`Passage`).
    """

    id: str
    dataset: str
    question: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]
    own: tuple[int, ...]
    groups: frozenset[str]

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("question id is empty")
        if not self.answers or not all(isinstance(a, str) and a for a in self.answers):
            raise ValueError(f"question {self.id}: answers = {self.answers!r}: need non-empty strings")
        if not self.gold:
            raise ValueError(f"question {self.id}: no gold passage")
        if set(self.gold) & set(self.own):
            raise ValueError(f"question {self.id}: a passage is both gold and distractor")


class SparsePassages(Sequence[Passage]):
    """Some of the passages of a corpus of ``size`` passages, by their index in it: what a packaged pool
    (:class:`Pool`) keeps. Reading a passage it does not hold is a ``ValueError`` saying ``missing``.

    Args:
        size: how many passages the whole corpus has (a draw of "other" passages ranges over them all).
        items: index -> passage, for the indices kept.
        group_sizes: group -> how many passages of the whole corpus are in it, for the groups the kept
            questions have (the draw counts the passages it may take).
        missing: the message of the error raised for an index not kept.
    """

    def __init__(
        self, size: int, items: Mapping[int, Passage], group_sizes: Mapping[str, int], missing: str
    ) -> None:
        if any(not 0 <= i < size for i in items):
            raise ValueError(f"a kept passage index is outside 0..{size - 1}")
        self._size = size
        self.items = dict(items)
        self.group_sizes = Counter(group_sizes)
        self._missing = missing

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> Passage: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Passage]: ...
    def __getitem__(self, index: int | slice) -> Passage | Sequence[Passage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        if not 0 <= index < self._size:
            raise IndexError(index)
        try:
            return self.items[index]
        except KeyError:
            raise ValueError(self._missing.format(index=index)) from None


@dataclass(frozen=True)
class Pool:
    """What a packaged corpus holds of its source: the first questions of one split, in sample order.

    Args:
        split: the split its questions are from (:func:`split_questions`).
        split_seed: the seed of that split and of the records' draws.
        source_sha256: sha256 of the official file it was cut from (the fingerprint of its records).
        draws: how many "other" passages of each question's draw it keeps (:func:`other_passages`).
    """

    split: Split
    split_seed: int
    source_sha256: str
    draws: int


@dataclass(frozen=True)
class Corpus:
    """The passages and questions of one open-QA dataset, in file order (passages deduplicated).

    A packaged corpus (``pool`` set) holds only some passages (:class:`SparsePassages`) and the first
    questions of one split in sample order; :func:`split_questions` serves that split alone."""

    dataset: str
    passages: Sequence[Passage]
    questions: tuple[Question, ...]
    pool: Pool | None = None

    def __post_init__(self) -> None:
        if self.dataset not in OPENQA_DATASETS:
            raise ValueError(
                f"Unknown open-QA dataset {self.dataset!r}. Available: {', '.join(OPENQA_DATASETS)}"
            )
        if not self.questions:
            raise ValueError(f"{self.dataset}: no questions")
        ids = Counter(q.id for q in self.questions)
        twice = [i for i, n in ids.items() if n > 1]
        if twice:
            raise ValueError(f"{self.dataset}: duplicate question id {twice[0]!r}")
        n = len(self.passages)
        for q in self.questions:
            if not all(0 <= i < n for i in q.gold + q.own):
                raise ValueError(f"{self.dataset}: question {q.id} names a passage outside 0..{n - 1}")

    @cached_property
    def group_sizes(self) -> Counter[str]:
        if isinstance(self.passages, SparsePassages):
            return self.passages.group_sizes
        return Counter(p.group for p in self.passages)


class _Passages:
    """Deduplicates passages by (group, title, text) while a corpus is read."""

    def __init__(self) -> None:
        self.items: list[Passage] = []
        self.index: dict[tuple[str, str, str], int] = {}

    def add(self, title: str, text: str, group: str) -> int:
        key = (group, title, text)
        if key not in self.index:
            self.index[key] = len(self.items)
            self.items.append(Passage(title, text, group))
        return self.index[key]


def _fail(where: str, problem: str) -> ValueError:
    return ValueError(f"{where}: {problem}")


def hotpotqa_corpus(items: Any, where: str) -> Corpus:
    """A corpus from HotpotQA's official JSON (a list of ``{_id, question, answer, supporting_facts,
    context}``); errors name ``where[index]``."""
    if not isinstance(items, list):
        raise _fail(where, "expected a JSON list of HotpotQA questions")
    passages = _Passages()
    questions: list[Question] = []
    for n, item in enumerate(items):
        at = f"{where}[{n}]"
        try:
            qid, text, answer = item["_id"], item["question"], item["answer"]
            facts = {str(title) for title, _ in item["supporting_facts"]}
            context = [(str(title), "".join(map(str, sentences))) for title, sentences in item["context"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail(at, f"not a HotpotQA question ({type(exc).__name__}: {exc})") from None
        if not isinstance(qid, str) or not isinstance(text, str) or not isinstance(answer, str):
            raise _fail(at, "_id, question and answer must be strings")
        titles = [title for title, _ in context]
        missing = facts - set(titles)
        if missing:
            raise _fail(at, f"supporting fact title {sorted(missing)[0]!r} is not in its context")
        gold: list[int] = []
        own: list[int] = []
        for title, body in context:
            (gold if title in facts else own).append(passages.add(title, body, title))
        try:
            questions.append(
                Question(qid, "hotpotqa-long", text, (answer,), tuple(gold), tuple(own), frozenset(titles))
            )
        except ValueError as exc:
            raise _fail(at, str(exc)) from None
    try:
        return Corpus("hotpotqa-long", tuple(passages.items), tuple(questions))
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def squad_corpus(data: Any, where: str) -> Corpus:
    """A corpus from SQuAD 2.0's official JSON (``{version, data: [{title, paragraphs: [{context,
    qas}]}]}``); unanswerable questions (``is_impossible``, or no answer) are left out."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise _fail(where, "expected SQuAD's JSON object with a 'data' list of articles")
    passages = _Passages()
    questions: list[Question] = []
    for a, article in enumerate(data["data"]):
        try:
            title = str(article["title"])
            paragraphs = [(str(p["context"]), list(p["qas"])) for p in article["paragraphs"]]
        except (KeyError, TypeError) as exc:
            raise _fail(f"{where}[{a}]", f"not a SQuAD article ({type(exc).__name__}: {exc})") from None
        indices = [passages.add(title, text, title) for text, _ in paragraphs]
        for p, (_, qas) in enumerate(paragraphs):
            for q, qa in enumerate(qas):
                at = f"{where}[{a}].paragraphs[{p}].qas[{q}]"
                try:
                    qid, text = qa["id"], qa["question"]
                    answers = tuple(dict.fromkeys(str(x["text"]) for x in qa.get("answers", [])))
                except (KeyError, TypeError) as exc:
                    raise _fail(at, f"not a SQuAD question ({type(exc).__name__}: {exc})") from None
                if qa.get("is_impossible", False) or not answers:
                    continue
                own = tuple(i for i in dict.fromkeys(indices) if i != indices[p])
                try:
                    questions.append(
                        Question(
                            str(qid), "squad-long", str(text), answers, (indices[p],), own, frozenset({title})
                        )
                    )
                except ValueError as exc:
                    raise _fail(at, str(exc)) from None
    try:
        return Corpus("squad-long", tuple(passages.items), tuple(questions))
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def hotpotqa_from_hub_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The hub's HotpotQA rows (``id``, ``supporting_facts: {title, sent_id}``, ``context: {title,
    sentences}``) in the official JSON's schema."""
    return [
        {
            "_id": row["id"],
            "question": row["question"],
            "answer": row["answer"],
            "supporting_facts": [
                list(x) for x in zip(row["supporting_facts"]["title"], row["supporting_facts"]["sent_id"])
            ],
            "context": [[t, list(s)] for t, s in zip(row["context"]["title"], row["context"]["sentences"])],
        }
        for row in rows
    ]


def squad_from_hub_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The hub's SQuAD rows (one per question: ``id, title, context, question, answers: {text,
    answer_start}``) in the official JSON's schema (articles and paragraphs in order of appearance)."""
    articles: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        paragraphs = articles.setdefault(row["title"], {})
        paragraphs.setdefault(row["context"], []).append(
            {
                "id": row["id"],
                "question": row["question"],
                "answers": [{"text": t} for t in row["answers"]["text"]],
                "is_impossible": not row["answers"]["text"],
            }
        )
    return {
        "version": "v2.0",
        "data": [
            {"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}
            for title, paragraphs in articles.items()
        ],
    }


_CORPUS_FROM_JSON = {"hotpotqa-long": hotpotqa_corpus, "squad-long": squad_corpus}
_JSON_FROM_HUB = {"hotpotqa-long": hotpotqa_from_hub_rows, "squad-long": squad_from_hub_rows}


def hub_parquet_url(dataset: str) -> str:
    template = os.environ.get("OPENQA_HUB_PARQUET")
    return template.format(dataset=dataset) if template else HUB_PARQUET[dataset]


def load_corpus_file(path: str | Path, dataset: str) -> Corpus:
    """A corpus from the dataset's official JSON file."""
    path = Path(path)
    return _CORPUS_FROM_JSON[dataset](read_json(path), str(path))


def load_corpus_parquet(location: str, dataset: str) -> Corpus:
    """A corpus from the hub's parquet conversion (a local path, or an ``hf://`` / http URL), read
    through ``datasets``."""
    from datasets import load_dataset  # heavy import, only on this path

    try:
        rows = load_dataset("parquet", data_files={"validation": location}, split="validation")
    except Exception as exc:  # network, hub, filesystem and parquet errors come in many types
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if "://" in location:
            raise ValueError(UNREACHABLE.format(what=f"copy of {dataset}'s source", why=why)) from None
        raise ValueError(f"cannot read {dataset} parquet file {location}: {why}") from None
    try:
        data = _JSON_FROM_HUB[dataset](list(rows))
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"{location}: not the hub's {dataset} columns ({type(exc).__name__}: {exc})"
        ) from None
    return _CORPUS_FROM_JSON[dataset](data, location)


POOL_FORMAT = "lazyllm-openqa-pool"
POOL_VERSION = 1


def pool_to_json(
    corpus: Corpus, pool: Pool, questions: Sequence[Question], kept: Sequence[int]
) -> dict[str, Any]:
    """A packaged pool of the full ``corpus`` as JSON: ``questions`` (the split's first, in sample
    order), the passages ``kept`` (by index), and the sizes of the questions' groups."""
    groups = sorted({g for q in questions for g in q.groups})
    return {
        "format": POOL_FORMAT,
        "version": POOL_VERSION,
        "dataset": corpus.dataset,
        "split": pool.split,
        "split_seed": pool.split_seed,
        "source_sha256": pool.source_sha256,
        "draws": pool.draws,
        "n_passages": len(corpus.passages),
        "group_sizes": {g: corpus.group_sizes[g] for g in groups},
        "passages": [[i, corpus.passages[i].title, corpus.passages[i].text, corpus.passages[i].group] for i in sorted(kept)],
        "questions": [
            {"id": q.id, "question": q.question, "answers": list(q.answers), "gold": list(q.gold),
             "own": list(q.own), "groups": sorted(q.groups)}
            for q in questions
        ],
    }  # fmt: skip


def load_pool(path: str | Path) -> Corpus:
    """A packaged pool (:func:`pool_to_json`, gzipped) as a :class:`Corpus` with ``pool`` set."""
    path = Path(path)
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
        if (data["format"], data["version"]) != (POOL_FORMAT, POOL_VERSION):
            raise ValueError(f"format {data['format']!r} version {data['version']!r}")
        dataset = str(data["dataset"])
        pool = Pool(data["split"], int(data["split_seed"]), str(data["source_sha256"]), int(data["draws"]))
        missing = (
            f"the packaged {dataset} pool keeps {pool.draws} other passages per question, too few for "
            f"prompts this long (passage {{index}} not kept): {FULL_SETS}"
        )
        passages = SparsePassages(
            int(data["n_passages"]),
            {
                int(i): Passage(str(title), str(text), str(group))
                for i, title, text, group in data["passages"]
            },
            {str(g): int(n) for g, n in data["group_sizes"].items()},
            missing,
        )
        questions = tuple(
            Question(str(q["id"]), dataset, str(q["question"]), tuple(q["answers"]), tuple(q["gold"]),
                     tuple(q["own"]), frozenset(q["groups"]))
            for q in data["questions"]
        )  # fmt: skip
    except (
        OSError,
        EOFError,
        gzip.BadGzipFile,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
    ) as exc:
        raise ValueError(f"{path}: not a packaged open-QA pool ({type(exc).__name__}: {exc})") from None
    return Corpus(dataset, passages, questions, pool)


@dataclass(frozen=True)
class OpenQASource:
    """A resolved open-QA location: ``folder`` holding :data:`FILES`, or None for the hub.

    Args:
        folder: the local folder, or None (the hub).
        origin: where the choice came from (``--openqa-dir``, ``OPENQA_DIR`` or ``hub``), for messages.
    """

    folder: Path | None
    origin: str

    @property
    def is_packaged(self) -> bool:
        return self.folder is None and self.origin == PACKAGED

    def describe(self) -> str:
        if self.is_packaged:
            return (
                f"the fresh-prompt pool packaged with lazyllm-tuner ({POOL_QUESTIONS} validation "
                "questions of HotpotQA dev and of SQuAD 2.0 dev)"
            )
        return (
            f"{self.folder} (from {self.origin})"
            if self.folder
            else "the Hugging Face hub's parquet conversion"
        )

    def location(self, dataset: str) -> str:
        if self.is_packaged:
            return str(pool_path(dataset))
        return str(self.folder / FILES[dataset]) if self.folder is not None else hub_parquet_url(dataset)

    def load(self, dataset: str) -> Corpus:
        """The corpus of ``dataset`` (a ``ValueError`` naming the file or URL if it cannot be read)."""
        if dataset not in OPENQA_DATASETS:
            raise ValueError(f"Unknown open-QA dataset {dataset!r}. Available: {', '.join(OPENQA_DATASETS)}")
        if self.is_packaged:
            return load_pool(pool_path(dataset))
        if self.folder is None:
            return load_corpus_parquet(self.location(dataset), dataset)
        path = self.folder / FILES[dataset]
        if not path.is_file():
            raise ValueError(
                f"{path}: no such file (open-QA dataset {dataset!r}, from {self.origin}); put the official "
                f"{FILES[dataset]} there or pass another --openqa-dir"
            )
        return load_corpus_file(path, dataset)

    def fingerprint(self, datasets: Sequence[str]) -> str:
        """A digest of what the records depend on: the files' contents (local) or URLs (hub), and
        :data:`BUILD_VERSION`."""
        h = hashlib.sha256(f"openqa-build-{BUILD_VERSION}".encode())
        for name in sorted(datasets):
            h.update(name.encode())
            if self.is_packaged:  # its records are the folder's, so is its fingerprint
                h.update(bytes.fromhex(str(manifest()["openqa"][name]["source_sha256"])))
            elif self.folder is not None:
                h.update(hashlib.sha256((self.folder / FILES[name]).read_bytes()).digest())
            else:
                h.update(hub_parquet_url(name).encode())
        return h.hexdigest()[:16]


def resolve_openqa_source(explicit: str | Path | None) -> OpenQASource:
    """``explicit`` if given (a folder, or the word ``packaged`` or ``hub``), else ``$OPENQA_DIR``,
    else the hub. (The fresh-drift check asks for ``packaged`` where no folder is given.)"""
    if isinstance(explicit, str) and explicit in (PACKAGED, HUB):
        return OpenQASource(None, explicit)
    if explicit is not None and str(explicit):
        folder, origin = Path(explicit).expanduser(), "--openqa-dir"
    elif os.environ.get("OPENQA_DIR"):
        folder, origin = Path(os.environ["OPENQA_DIR"]).expanduser(), "OPENQA_DIR"
    else:
        return OpenQASource(None, "hub")
    if not folder.is_dir():
        raise ValueError(f"open-QA folder {folder} (from {origin}) does not exist or is not a folder")
    return OpenQASource(folder, origin)


def openqa_specs(task: str, language: str) -> list[str]:
    """The open-QA datasets of ``task``, in task order."""
    return [spec.name for spec in resolve_task(task, language) if spec.source == "openqa"]


def check_task(task: str, language: str, openqa_dir: str | None) -> None:
    """Every open-QA dataset of ``task`` can be read (nothing is built): for the preflight."""
    names = openqa_specs(task, language)
    if names:
        source = resolve_openqa_source(openqa_dir)
        for name in names:
            source.load(name)


# --------------------------------------------------------------------------------------------------
# records
def distractor_draw(seed: int, question: Question) -> tuple[list[int], random.Random]:
    """A question's own distractors in their drawn order, and the generator that goes on to draw the
    others (:func:`other_passages`), both from ``(seed, dataset, id)``."""
    draw = _generator(seed, question.dataset, question.id, "draw")
    own = list(question.own)
    draw.shuffle(own)
    return own, draw


def other_passages(corpus: Corpus, question: Question, draw: random.Random) -> Iterator[int]:
    """Passages of other questions (other articles), in an order drawn by ``draw``, each once (the
    record's distractors after its own, :class:`RecordBuilder`)."""
    passages = corpus.passages
    eligible = len(passages) - sum(corpus.group_sizes[g] for g in question.groups)
    seen: set[int] = set()
    while len(seen) < eligible:
        i = draw.randrange(len(passages))
        if i in seen or passages[i].group in question.groups:
            continue
        seen.add(i)
        yield i


def _generator(seed: int, dataset: str, qid: str, purpose: str) -> random.Random:
    digest = hashlib.sha256(f"openqa:{purpose}:{seed}:{dataset}:{qid}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class RecordBuilder:
    """Builds records of one corpus for one tokenizer, chat-template flag and prompt budget.

    Args:
        corpus: the questions and passages.
        tokenizer: the target model's tokenizer (the budget is counted in its tokens).
        chat: whether the prompt is wrapped in the chat template (as the evaluation wraps it).
        max_prompt_tokens: the budget of the prompt as finally encoded.
        seed: seeds the distractors' draw and the passages' order (with the question id).
    """

    corpus: Corpus
    tokenizer: Any
    chat: bool
    max_prompt_tokens: int
    seed: int = 0
    _tokens: dict[int, int] = field(default_factory=dict, repr=False)
    _headers: dict[int, int] = field(default_factory=dict, repr=False)
    _chat_tokens: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_prompt_tokens < 16:
            raise ValueError(f"max_prompt_tokens = {self.max_prompt_tokens}: must be >= 16")
        multi = self.corpus.dataset == "hotpotqa-long"
        self._separator = "\n" if multi else "\n\n"
        self._sep_tokens = _n_tokens(self.tokenizer, self._separator)

    # the context's text ------------------------------------------------------------------------
    def _body(self, index: int) -> str:
        p = self.corpus.passages[index]
        return f"{p.title}\n{p.text}" if self.corpus.dataset == "hotpotqa-long" else p.text

    def _header(self, position: int) -> str:
        return f"Passage {position}:\n" if self.corpus.dataset == "hotpotqa-long" else ""

    def context(self, order: Sequence[int]) -> str:
        """The context of passages ``order`` (indices into the corpus), as the prompt shows it."""
        return self._separator.join(self._header(k + 1) + self._body(i) for k, i in enumerate(order))

    # estimates -----------------------------------------------------------------------------------
    def _passage_tokens(self, index: int) -> int:
        if index not in self._tokens:
            self._tokens[index] = _n_tokens(self.tokenizer, self._body(index))
        return self._tokens[index]

    def _header_tokens(self, position: int) -> int:
        if position not in self._headers:
            self._headers[position] = _n_tokens(self.tokenizer, self._header(position))
        return self._headers[position]

    def _added(self, index: int, position: int) -> int:
        """Estimated tokens that passage ``index`` adds at ``position`` (1-based; a separator before
        every passage but the first)."""
        sep = self._sep_tokens if position > 1 else 0
        return sep + self._header_tokens(position) + self._passage_tokens(index)

    def _limit(self, question: Question) -> tuple[int, int]:
        """(tokens of the prompt's text without passages, the estimate's ceiling for the prompt's text)."""
        empty = self.prompt(question, "")
        n_text = _n_tokens(self.tokenizer, empty)
        ceiling = self.max_prompt_tokens
        if self.chat:
            if self._chat_tokens is None:  # the chat template's own tokens, measured once on no question
                bare = PROMPTS.template(self.corpus.dataset).format(context="", input="")
                whole = uncut_length(self.tokenizer, bare, True, 10**9) or 0
                self._chat_tokens = whole - _n_tokens(self.tokenizer, bare)
            ceiling = min(self.max_prompt_tokens - CHAT_MARGIN, self.max_prompt_tokens - self._chat_tokens)
        return n_text, ceiling - _MARGIN

    def prompt(self, question: Question, context: str) -> str:
        record = Record(
            id=question.id,
            dataset=question.dataset,
            context=context,
            input=question.question,
            answers=list(question.answers),
        )
        return build_prompt(record, PROMPTS)

    def build(self, question: Question) -> Record | None:
        """The question's record, or None when its gold passages alone do not fit the budget."""
        own, draw = distractor_draw(self.seed, question)
        fixed, ceiling = self._limit(question)
        chosen: list[int] = []
        total = fixed
        for i in question.gold:
            chosen.append(i)
            total += self._added(i, len(chosen))
        if total <= ceiling:
            misses = 0
            for i in itertools.chain(own, other_passages(self.corpus, question, draw)):
                if ceiling - total < _FULL:
                    break
                cost = self._added(i, len(chosen) + 1)
                if total + cost <= ceiling:
                    chosen.append(i)
                    total += cost
                    misses = 0
                else:
                    misses += 1
                    if misses >= _MISSES:
                        break
        n_gold = len(question.gold)
        while True:
            order = list(chosen)
            _generator(self.seed, question.dataset, question.id, "order").shuffle(order)
            context = self.context(order)
            text = self.prompt(question, context)
            if uncut_length(self.tokenizer, text, self.chat, self.max_prompt_tokens) is not None:
                return Record(
                    id=question.id,
                    dataset=question.dataset,
                    context=context,
                    input=question.question,
                    answers=list(question.answers),
                )
            if len(chosen) == n_gold:
                return None
            chosen.pop()  # the last distractor added; the gold passages come first and stay


@dataclass(frozen=True)
class BuiltSplit:
    """The records built for one split, and the ids of the questions skipped because their gold
    passages alone do not fit the budget (in split order)."""

    dataset: str
    records: list[Record]
    skipped: tuple[str, ...]


def split_questions(corpus: Corpus, split: Split, split_seed: int = 0) -> list[Question]:
    """The questions of ``split`` (LongBench's hashed split of the question ids) in sample order.

    The order sorts the split by sha256 of the seed and question id, so every prefix is a simple
    random sample of the split, whatever the file's order: SQuAD's file groups its questions by
    article, and a prefix in file order would come from one or two articles. The order depends on
    nothing but the seed and the ids, so it is the same on every machine and at every prompt length.
    """

    if corpus.pool is not None:
        pool = corpus.pool
        if (split, split_seed) != (pool.split, pool.split_seed):
            raise ValueError(
                f"the packaged {corpus.dataset} pool holds {pool.split} questions of split seed "
                f"{pool.split_seed} only, not {split} ones of seed {split_seed}: {FULL_SETS}"
            )
        return list(corpus.questions)  # kept in sample order: the split's first questions

    def key(question: Question) -> bytes:
        return hashlib.sha256(
            f"openqa:sample:{split_seed}:{question.dataset}:{question.id}".encode()
        ).digest()

    return sorted(split_records(corpus.questions, split, seed=split_seed), key=key)


def build_split(
    builder: RecordBuilder,
    split: Split,
    split_seed: int = 0,
    limit: int | None = None,
    *,
    progress: bool = False,
) -> BuiltSplit:
    """Records of the questions in ``split``, in :func:`split_questions`'s sample order, until
    ``limit`` records are built (None: all); a question that cannot fit is skipped and counted.
    ``progress`` shows a bar (each record tokenizes its prompt a few times: hundreds of 2048-token
    records take minutes on a CPU)."""
    questions = split_questions(builder.corpus, split, split_seed)
    records: list[Record] = []
    skipped: list[str] = []
    total = len(questions) if limit is None else min(limit, len(questions))
    desc = f"build {builder.corpus.dataset} {split} records"
    with tqdm(total=total, desc=desc, disable=not progress or total == 0, leave=False) as bar:
        for question in questions:
            if limit is not None and len(records) >= limit:
                break
            record = builder.build(question)
            if record is None:
                skipped.append(question.id)
            else:
                records.append(record)
                bar.update(1)
    if builder.corpus.pool is not None and not records:
        raise ValueError(
            f"no question of the packaged {builder.corpus.dataset} pool fits in {builder.max_prompt_tokens} "
            "tokens (their gold passages alone are longer)"
        )
    if builder.corpus.pool is not None and (limit is None or len(records) < limit):
        raise ValueError(
            f"the packaged {builder.corpus.dataset} pool holds {len(questions)} {split} questions "
            f"({len(skipped)} too long for {builder.max_prompt_tokens} tokens), fewer than the "
            f"{'whole split' if limit is None else limit} asked for: {FULL_SETS}"
        )
    return BuiltSplit(builder.corpus.dataset, records, tuple(skipped))
