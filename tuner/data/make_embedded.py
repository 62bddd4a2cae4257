"""Writes the packaged data (:mod:`tuner.data.embedded`) from the offline copies of LongBench and of
HotpotQA / SQuAD 2.0::

    python -m tuner.data.make_embedded --data-dir ../shared/data/longbench --openqa-dir ../shared/data/open-qa

LongBench: the six English QA datasets' ``<dataset>.jsonl`` gzipped byte for byte, and the two prompt
tables as they are. Open QA: per dataset the first :data:`~tuner.data.embedded.POOL_QUESTIONS`
validation questions of split seed 0 in sample order (:func:`tuner.data.openqa.split_questions`), their
gold and own passages, and the first :data:`~tuner.data.embedded.POOL_DRAWS` passages of each one's
draw of others, read as :func:`tuner.data.openqa.other_passages` reads them (every index it looks at is
kept). Gzip headers carry no time, so the same inputs give the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

from lazyllm.atomic import write_atomic
from tuner.data.embedded import FOLDER, POOL_DRAWS, POOL_QUESTIONS
from tuner.data.longbench import MAXLEN_FILE, PROMPT_FILE, longbench_specs
from tuner.data.openqa import (
    FILES,
    Corpus,
    Passage,
    Pool,
    distractor_draw,
    load_corpus_file,
    other_passages,
    pool_to_json,
    split_questions,
)

QUICKSTART_TASK = ("qa", "en")
"""The task whose LongBench datasets are packaged: ``--task qa`` (English)."""


class _Watched(Sequence[Passage]):
    """A corpus's passages that remember every index read by subscript (iteration reads none)."""

    def __init__(self, items: tuple[Passage, ...]) -> None:
        self.items = items
        self.read: set[int] = set()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Passage]:
        return iter(self.items)

    @overload
    def __getitem__(self, index: int) -> Passage: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Passage]: ...
    def __getitem__(self, index: int | slice) -> Passage | Sequence[Passage]:
        if isinstance(index, slice):
            return self.items[index]
        self.read.add(index)
        return self.items[index]


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def pool_of(corpus: Corpus, source_sha256: str, questions: int, draws: int) -> dict[str, Any]:
    """The packaged pool of ``corpus`` (:func:`tuner.data.openqa.pool_to_json`)."""
    pool = Pool("validation", 0, source_sha256, draws)
    chosen = split_questions(corpus, pool.split, pool.split_seed)[:questions]
    watched = _Watched(tuple(corpus.passages))
    seen = Corpus(corpus.dataset, watched, corpus.questions)
    kept: set[int] = set()
    for q in chosen:
        kept.update(q.gold + q.own)
        _, draw = distractor_draw(pool.split_seed, q)  # as RecordBuilder.build draws
        list(itertools.islice(other_passages(seen, q, draw), draws))
    return pool_to_json(corpus, pool, chosen, sorted(kept | watched.read))


def write_embedded(longbench: Path, openqa: Path, out: Path = FOLDER) -> dict[str, Any]:
    """Writes the packaged files into ``out`` and returns the manifest it wrote."""
    files: dict[str, Any] = {"longbench": {}, "openqa": {}}
    for spec in longbench_specs(*QUICKSTART_TASK):
        data = (longbench / f"{spec.name}.jsonl").read_bytes()
        write_atomic(out / "longbench" / f"{spec.name}.jsonl.gz", _gzip(data))
        files["longbench"][f"{spec.name}.jsonl"] = hashlib.sha256(data).hexdigest()
    for name in (PROMPT_FILE, MAXLEN_FILE):
        data = (longbench / name).read_bytes()
        write_atomic(out / "longbench" / name, data)
        files["longbench"][name] = hashlib.sha256(data).hexdigest()
    for dataset, file in FILES.items():
        source = openqa / file
        sha = hashlib.sha256(source.read_bytes()).hexdigest()
        pool = pool_of(load_corpus_file(source, dataset), sha, POOL_QUESTIONS, POOL_DRAWS)
        data = json.dumps(pool, ensure_ascii=False, separators=(",", ":")).encode()
        write_atomic(out / "openqa" / f"{dataset}.json.gz", _gzip(data))
        files["openqa"][dataset] = {
            "file": file,
            "source_sha256": sha,
            "questions": len(pool["questions"]),
            "passages": len(pool["passages"]),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    write_atomic(out / "MANIFEST.json", json.dumps(files, indent=1, sort_keys=True) + "\n")
    return files


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="LongBench folder (<dataset>.jsonl)")
    parser.add_argument("--openqa-dir", type=Path, required=True, help="folder of HotpotQA/SQuAD dev JSON")
    parser.add_argument("--out", type=Path, default=FOLDER, help="where to write (default: the package)")
    args = parser.parse_args(argv)
    written = write_embedded(args.data_dir, args.openqa_dir, args.out)
    for dataset, entry in written["openqa"].items():
        print(f"{dataset}: {entry['questions']} questions, {entry['passages']} passages")


if __name__ == "__main__":
    main()
