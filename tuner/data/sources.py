"""Where LongBench comes from: a local folder, the records packaged with lazyllm-tuner, or the Hugging
Face hub's parquet mirror.

Resolution order: ``--data-dir`` (``data_dir`` setting: a folder, or the word ``packaged`` or
``hub``), then the environment variable ``LONGBENCH_DIR``, then the packaged records
(:mod:`tuner.data.embedded`: LongBench's six English QA datasets as the offline copy holds them) where
they hold every LongBench dataset of the task, then the hub for the full sets. A local folder holds
LongBench's own files (``<dataset>.jsonl``, ``dataset2prompt.json``, ``dataset2maxlen.json``); so does
the packaged copy, once unpacked into the cache. The hub path reads each dataset's parquet file
from :data:`HUB_PARQUET` through ``datasets`` (cached the usual way, under ``HF_HOME``) and LongBench's
two prompt tables from :data:`CONFIG_URL` (cached under ``$LAZYLLM_CACHE/longbench``); where the
tables cannot be fetched the generic template is used, with the usual warning. Where the hub is
unreachable this is one line saying so and how to pass a local folder.

Both locations can be pointed elsewhere (a mirror, or local files in tests) with the environment
variables ``LONGBENCH_HUB_PARQUET`` (a template with ``{dataset}``) and ``LONGBENCH_CONFIG_URL``.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazyllm.atomic import write_atomic
from tuner.data.embedded import HUB, PACKAGED, longbench_datasets, longbench_folder
from tuner.data.longbench import (
    MAXLEN_FILE,
    PROMPT_FILE,
    PromptConfig,
    Record,
    _check_dataset,
    _record_from_obj,
    data_dir,
    load_prompt_config,
    load_task,
    longbench_specs,
)

HUB_PARQUET = "hf://datasets/THUDM/LongBench@refs%2Fconvert%2Fparquet/{dataset}/test/0000.parquet"
"""The hub's parquet conversion of THUDM/LongBench, one file per dataset (LongBench's own columns)."""
CONFIG_URL = "https://raw.githubusercontent.com/THUDM/LongBench/main/LongBench/config/"
"""Where LongBench's ``dataset2prompt.json`` and ``dataset2maxlen.json`` are published."""
UNREACHABLE = (
    "the Hugging Face hub's LongBench mirror is unreachable ({why}); pass --data-dir DIR or set "
    "LONGBENCH_DIR to a folder of LongBench <dataset>.jsonl files"
)


def hub_parquet_url(dataset: str) -> str:
    return os.environ.get("LONGBENCH_HUB_PARQUET", HUB_PARQUET).format(dataset=dataset)


def load_parquet(location: str, dataset: str) -> list[Record]:
    """Records of one dataset from a parquet file (a local path, or an ``hf://`` / http URL).

    The file has LongBench's columns (``input, context, answers, length, dataset, language,
    all_classes, _id``); every row is validated like a JSONL line, errors naming ``location[row]``.
    """
    _check_dataset(dataset)
    from datasets import load_dataset  # heavy import, only on this path

    try:
        rows = load_dataset("parquet", data_files={"test": location}, split="test")
    except Exception as exc:  # network, hub, filesystem and parquet errors come in many types
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if "://" in location:
            raise ValueError(UNREACHABLE.format(why=why)) from None
        raise ValueError(f"cannot read LongBench parquet file {location}: {why}") from None
    records = [_record_from_obj(dict(row), dataset, f"{location}[{i}]") for i, row in enumerate(rows)]
    if not records:
        raise ValueError(f"{location}: no records")
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{location}: duplicate _id values")
    return records


def _cache_dir() -> Path:
    root = os.environ.get("LAZYLLM_CACHE") or Path.home() / ".cache" / "lazyllm"
    return Path(root) / "longbench"


def _fetch_config(name: str) -> Path | None:
    """LongBench's prompt table ``name``, downloaded once into the cache; None if it cannot be had."""
    base = os.environ.get("LONGBENCH_CONFIG_URL", CONFIG_URL)
    folder = _cache_dir() / hashlib.sha256(base.encode()).hexdigest()[:12]
    path = folder / name
    if path.is_file():
        return path
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/" + name, timeout=20) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return write_atomic(path, data)


@dataclass(frozen=True)
class DataSource:
    """A resolved LongBench location: ``folder`` for local files, or None for the hub mirror.

    Args:
        folder: the local folder (the packaged records' unpacked copy too), or None (the hub).
        origin: where the choice came from (``--data-dir``, ``LONGBENCH_DIR``, ``packaged`` or ``hub``),
            for messages.
    """

    folder: Path | None
    origin: str

    @property
    def is_hub(self) -> bool:
        return self.folder is None

    def describe(self) -> str:
        if self.origin == PACKAGED:
            return f"the LongBench records packaged with lazyllm-tuner ({', '.join(longbench_datasets())})"
        return (
            f"{self.folder} (from {self.origin})" if self.folder else "the Hugging Face hub's parquet mirror"
        )

    def load_task(self, task: str, language: str) -> dict[str, list[Record]]:
        """Records of every LongBench dataset of ``task`` by name (see :func:`tuner.data.longbench.load_task`)."""
        if self.folder is not None:
            return load_task(task, language, self.folder)
        return {
            spec.name: load_parquet(hub_parquet_url(spec.name), spec.name)
            for spec in longbench_specs(task, language)
        }

    def prompt_config(self) -> PromptConfig:
        if self.folder is not None:
            return load_prompt_config(self.folder)
        fetched = [_fetch_config(name) for name in (PROMPT_FILE, MAXLEN_FILE)]
        if all(p is not None for p in fetched):
            return load_prompt_config(fetched[0].parent)  # type: ignore[union-attr]
        return load_prompt_config(_cache_dir() / "unavailable")  # warns, then the generic template

    def fingerprint(self, datasets: Sequence[str]) -> str:
        """A digest of what the examples depend on: the data files' contents (local) or URLs (hub)."""
        h = hashlib.sha256()
        for name in sorted(datasets):
            h.update(name.encode())
            if self.folder is not None:
                h.update(hashlib.sha256((self.folder / f"{name}.jsonl").read_bytes()).digest())
            else:
                h.update(hub_parquet_url(name).encode())
        config: Any = self.folder if self.folder is not None else None
        for extra in (PROMPT_FILE, MAXLEN_FILE):
            path = config / extra if config is not None else _fetch_config(extra)
            h.update(path.read_bytes() if path is not None and path.exists() else b"-")
        return h.hexdigest()[:16]


def resolve_source(explicit: str | Path | None, task: str | None = None, language: str = "en") -> DataSource:
    """``explicit`` if given (a folder, or the word ``packaged`` or ``hub``), else ``$LONGBENCH_DIR``,
    else the packaged records where they hold every LongBench dataset of ``task`` (None: no task
    known, so not them), else the hub mirror."""
    if isinstance(explicit, str) and explicit == HUB:
        return DataSource(None, HUB)
    if isinstance(explicit, str) and explicit == PACKAGED:
        return DataSource(longbench_folder(), PACKAGED)
    if (explicit is not None and str(explicit)) or os.environ.get("LONGBENCH_DIR"):
        folder = data_dir(explicit)
        origin = "--data-dir" if explicit is not None and str(explicit) else "LONGBENCH_DIR"
        return DataSource(folder, origin)
    if task is not None:
        names = {spec.name for spec in longbench_specs(task, language)}
        if names and names <= set(longbench_datasets()):
            return DataSource(longbench_folder(), PACKAGED)
    return DataSource(None, HUB)
