"""The one preflight: every setting, file and URI an entry point uses, checked before any model loads
and before anything is written.

Each entry point calls its check first and starts work only when it passes: ``tuner.search``
(:func:`check_search`, through :func:`tuner.orchestration.session.preflight`), ``tuner.export``
(:func:`check_tracking`, :func:`check_budget`, :func:`tuner.tracking.registry.check_name`),
``tuner.evaluate`` (:func:`check_evaluate`) and the served model (:func:`tuner.tracking.serving.check_request`,
per request); ``lazyllm.generate``, which must not import the tuner, has the same step of its own
(``lazyllm.generate._preflight``: prompt, schedule file and revival before the model loads). Settings validate their own values
when built (:mod:`tuner.study.settings`); what is checked here is what needs the file system or the
network: data files, schedule and search-space files, and the storage, tracking and registry URIs
(one tracking URI serves as the registry too). A failed check is one line (``ValueError``) naming
the problem and the fix, with every password masked (:mod:`tuner.redact`); nothing is retried.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from lazyllm.schedule import Schedule
from tuner.study.context import check_context

if TYPE_CHECKING:
    from tuner.study.settings import EvalSettings, EvaluateSettings, SearchSettings


def check_tracking(uri: str) -> None:
    """A tracking (and registry) URI that answers: see :func:`tuner.tracking.runs.check_reachable`."""
    from tuner.tracking.runs import check_reachable

    check_reachable(uri)


def check_search(settings: SearchSettings) -> None:
    """``tuner.search``: search space, data, storage, tracking store and registered-model name."""
    from tuner.data.openqa import check_task
    from tuner.data.prompts import check_splits
    from tuner.data.sources import resolve_source
    from tuner.study.spaces import load_space
    from tuner.study.storage import check_storage, check_tracking_store, sqlite_path
    from tuner.tracking.registry import check_name
    from tuner.tracking.runs import default_tracking_uri, wanted

    load_space(settings.search_space)  # an unknown or malformed space fails here
    prompts = settings.prompts_file  # a prompts file: read and every row checked, before any state
    if prompts is not None:
        check_splits(prompts, settings.split_seed, settings.heldout)  # enough for a held-out check
        if settings.long_prompts == "refuse":
            check_prompt_lengths(settings)
    # the model's context, when its config is on disk (else tuner.evaluation.runner.Evaluator checks the loaded one)
    check_context(settings.max_prompt_tokens, settings.max_new_tokens, _local_context(settings.model))
    resolve_source(settings.data_dir, settings.task, settings.language).load_task(
        settings.task, settings.language
    )  # data present, readable
    check_task(settings.task, settings.language, settings.openqa_dir)  # open-QA sources readable
    fresh = settings.fresh_source().settings
    if fresh is not None:  # the fresh-drift check's prompts are readable too
        check_task(fresh.task, fresh.language, fresh.openqa_dir)
    # a URL names an existing place; only the study folder (the default's, or one named in full) is ours
    named = sqlite_path(settings.storage_url)
    ours = named is not None and named.parent.resolve() == settings.study_dir.resolve()
    check_storage(settings.storage_url, folder=settings.storage is not None and not ours)
    if settings.register is not None:
        check_name(settings.register)
    if wanted(settings):
        if settings.tracking_uri is not None:
            check_tracking(settings.tracking_uri)
        else:  # the default store lives in the output folder, whose own check comes next
            check_tracking_store(default_tracking_uri(settings), folder=False)
    elif settings.register is not None:
        raise ValueError("--register needs MLflow tracking; drop --tracking-uri none or --register")


def check_prompt_lengths(settings: EvalSettings) -> None:
    """``--long-prompts refuse``: every row of the prompts file (both splits: the file is the workload)
    encoded as the evaluation encodes it, the first one over ``--max-prompt-tokens`` refused with its
    row, before the study folder exists. Needs only the tokenizer; one that cannot load (a hub id
    offline) is left to the model load, which fails with its own message."""
    from transformers import AutoTokenizer

    from lazyllm.models import resolve
    from tuner.evaluation.runner import row_ids

    prompts = settings.prompts_file
    assert prompts is not None, "check_prompt_lengths needs a prompts file task"
    source, local = resolve(settings.model)  # a name that is no model: its own one-line error
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, local_files_only=local, trust_remote_code=settings.trust_remote_code
        )
    except OSError:
        return
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    for row in prompts.rows:
        row_ids(settings, tokenizer, row, has_chat, prompts.name)


def _local_context(model: str) -> int | None:
    """The context length in a model's ``config.json`` when it is already on disk (a folder or a
    prepared packaged model); None otherwise (the loaded model is checked instead)."""
    from lazyllm.models import PACKAGED_MODELS, cache_dir

    folder = cache_dir() / model / "hf" if model in PACKAGED_MODELS else Path(model).expanduser()
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = data.get("max_position_embeddings") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_budget(value: float | None, flag: str = "--max-accuracy-loss") -> None:
    """A loss budget in score points: finite and >= 0 (None = the study's own)."""
    if value is not None and (not math.isfinite(value) or value < 0):
        raise ValueError(f"{flag} {value}: must be a finite number >= 0 (score points)")


def load_schedule(path: str | Path, flag: str = "--schedule") -> Schedule:
    """Read and validate a schedule file (one line naming the file on any problem)."""
    if not Path(path).is_file():
        raise ValueError(
            f"{flag} {path}: no such file; pass a schedule JSON (e.g. runs/<study>/recommended.json)"
        )
    return Schedule.load(path)


def check_evaluate(settings: EvaluateSettings) -> Schedule | None:
    """``tuner.evaluate``: the schedule file and the data; returns the schedule (None if not given)."""
    from tuner.data.openqa import check_task
    from tuner.data.sources import resolve_source

    schedule = load_schedule(settings.schedule) if settings.schedule else None
    resolve_source(settings.data_dir, settings.task, settings.language).load_task(
        settings.task, settings.language
    )
    check_task(settings.task, settings.language, settings.openqa_dir)
    return schedule
