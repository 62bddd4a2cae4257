"""The data packaged with lazyllm-tuner, so that ``python -m tuner.search --task qa`` runs offline.

Two parts, each with its source's license and provenance beside it (``PROVENANCE.md``):

* ``longbench/``: LongBench v1's six English QA datasets (``narrativeqa``, ``qasper``,
  ``multifieldqa_en``, ``hotpotqa``, ``2wikimqa``, ``musique``: every record of the offline copy the
  quickstart reads, validation and test), each ``<dataset>.jsonl`` gzipped byte for byte, and
  LongBench's ``dataset2prompt.json`` / ``dataset2maxlen.json``. :func:`longbench_folder` unpacks them
  once into the cache, where they are an ordinary LongBench folder (the same bytes, so the same
  records, ids and data fingerprint as the folder they were cut from).
* ``openqa/``: a fresh-prompt pool for the fresh-drift check: the first :data:`POOL_QUESTIONS`
  validation questions (split seed 0, in sample order) of HotpotQA dev and of SQuAD 2.0 dev, with the
  passages their records draw (:class:`tuner.data.openqa.Pool`); no test question is in it.

``python -m tuner.data.make_embedded`` writes both from the offline copies; ``MANIFEST.json`` holds
the sha256 of every packaged file's content. The words :data:`PACKAGED` and :data:`HUB` name these
sources where a folder is asked for (``--data-dir``, ``--openqa-dir``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from lazyllm.atomic import write_atomic

FOLDER = Path(__file__).resolve().parent
"""This package's folder, holding the packaged files."""
MANIFEST = FOLDER / "MANIFEST.json"
PACKAGED = "packaged"
"""``--data-dir packaged`` / ``--openqa-dir packaged``: the data packaged here."""
HUB = "hub"
"""``--data-dir hub`` / ``--openqa-dir hub``: the Hugging Face hub's full sets (``./hub`` for a folder so named)."""
POOL_QUESTIONS = 150
"""Validation questions per open-QA dataset in the packaged fresh-prompt pool."""
POOL_DRAWS = 48
"""Passages of other questions kept per pool question (the draw's first, in its order): enough for
HotpotQA prompts of several thousand tokens; a longer prompt names the folder to pass instead."""


def manifest() -> dict[str, Any]:
    """``MANIFEST.json``: ``{"longbench": {file: sha256 of its content}, "openqa": {dataset: {...}}}``."""
    data: dict[str, Any] = json.loads(MANIFEST.read_text(encoding="utf-8"))
    return data


def longbench_datasets() -> tuple[str, ...]:
    """The LongBench datasets packaged here, by name."""
    return tuple(name.removesuffix(".jsonl") for name in manifest()["longbench"] if name.endswith(".jsonl"))


def _cache_root() -> Path:
    root = os.environ.get("LAZYLLM_CACHE") or Path.home() / ".cache" / "lazyllm"
    return Path(root) / "embedded"


def longbench_folder() -> Path:
    """The packaged LongBench files as a folder (unpacked into the cache on first use, checked against
    the manifest's sha256 as they are written)."""
    files: dict[str, str] = manifest()["longbench"]
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:12]
    folder = _cache_root() / f"longbench-{digest}"
    for name, sha in files.items():
        target = folder / name
        if target.is_file():
            continue
        packed = FOLDER / "longbench" / name
        data = (
            packed.read_bytes()
            if packed.is_file()
            else gzip.decompress((FOLDER / "longbench" / f"{name}.gz").read_bytes())
        )
        if hashlib.sha256(data).hexdigest() != sha:
            raise ValueError(f"packaged LongBench file {name} does not match its sha256 in {MANIFEST}")
        write_atomic(target, data)
    return folder


def pool_path(dataset: str) -> Path:
    """The packaged fresh-prompt pool of an open-QA dataset (gzipped JSON, :func:`tuner.data.openqa.load_pool`)."""
    return FOLDER / "openqa" / f"{dataset}.json.gz"
