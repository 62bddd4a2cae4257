"""What does the search add to its warm starts? The same study run three ways, over seeds.

    python benchmarks/search_ablation.py [--studies longbench openqa] [--arms warm search both]
        [--seeds 0 1 2] [--out benchmarks/data/search-ablation-DATE] [--data-dir DIR] [--openqa-dir DIR]

Arms (each a real ``python -m tuner.search`` run in its own output folder, the study's own settings,
time budget and stages; only what is queued before the sampler differs):

* ``warm``: the warm starts only: the study is created with them queued and ``--n-trials`` set to
  their number (keep-all's reference trial included), so the sampler proposes nothing;
* ``search``: the sampler only: the study is created with keep-all's reference trial queued and no
  warm start (the study's ``warm_started`` mark is set, so ``tuner.search`` queues none);
* ``both``: the study as shipped (the reference, the warm starts, then the sampler).

Studies: ``longbench`` (the CPU quickstart: ``--task qa`` at the defaults) and ``openqa`` (the open-QA
preset, ``--preset openqa``). Each run appends one JSON row to ``OUT/rows.jsonl`` once it has
finished (a rerun skips the (study, arm, seed) rows already there, so an interrupted ablation
resumes and nothing is duplicated): the pick (trial, schedule, FLOP speedup, validation KL), the
held-out check's test task loss with its 90% interval and n, the search cap and its source, and the
sampler's own complete trials (not queued: no warm start, reference or duplicate's replacement
draw): how many, how many feasible (KL bound within the cap) and how many faster than 1.3x within
0.15 nats (issue 52's count); and how many proposals the speed floor (``--min-speedup``) stopped.
The held-out check runs on few test examples; test each pick on 300 with the ``tuner.evaluate``
command each row carries. Timings are only comparable between runs on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.search import parse_settings
from tuner.stages.front import study_records
from tuner.stages.outcome import StudyOutcome
from tuner.stages.trial import SPEED_FLOOR_CONSTRAINT
from tuner.study.settings import SearchSettings
from tuner.study.spaces import load_space
from tuner.study.spaces.base import KEEP_ALL_ATTR
from tuner.study.storage import make_storage, open_study

ARMS = ("warm", "search", "both")
STUDIES = ("longbench", "openqa")
REGION = (1.3, 0.15)
"""Issue 52's count: complete trials faster than 1.3x (the study's speed objective) within 0.15 nats
of mean KL."""


def study_argv(study: str, seed: int, data_dir: str, openqa_dir: str, output: Path) -> list[str]:
    """The ``tuner.search`` flags of ``study`` (the CPU quickstart, or the open-QA preset) for ``seed``."""
    if study == "longbench":
        base = ["--task", "qa", "--data-dir", data_dir, "--openqa-dir", openqa_dir]
    elif study == "openqa":
        base = ["--preset", "openqa", "--openqa-dir", openqa_dir]
    else:
        raise ValueError(f"Unknown study {study!r}. Available: {', '.join(STUDIES)}")
    return [*base, "--seed", str(seed), "--output", str(output), "--tracking-uri", "none"]


def num_layers(settings: SearchSettings) -> int:
    from transformers import AutoConfig

    from lazyllm.models import resolve

    path, _ = resolve(settings.model)
    config = AutoConfig.from_pretrained(path, trust_remote_code=settings.trust_remote_code)
    return int(config.num_hidden_layers)


def prepare(arm: str, argv: list[str]) -> list[str]:
    """Create the study for ``arm`` before ``tuner.search`` resumes it; the flags it then runs with."""
    if arm == "both":
        return argv
    settings = parse_settings(argv)
    layers = num_layers(settings)
    space = load_space(settings.search_space)
    storage = make_storage(settings.storage_url)
    try:
        study = open_study(settings, layers, storage)
        if arm == "search" and not study.user_attrs.get("warm_started"):
            study.enqueue_trial({}, user_attrs={KEEP_ALL_ATTR: True})
            study.set_user_attr("warm_started", True)  # tuner.search queues no warm start
    finally:
        storage.engine.dispose()
    if arm == "warm":
        return [*argv, "--n-trials", str(1 + len(space.warm_start(layers)))]
    return argv


def sampler_trials(study: optuna.Study) -> list[Any]:
    """The complete trials the sampler proposed itself (none queued with fixed parameters)."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if "fixed_params" not in t.system_attrs and not t.user_attrs.get(KEEP_ALL_ATTR)
    ]


SEARCH_ONLY = ("--tracking-uri", "--n-trials")
"""``tuner.search`` flags (with their values) that ``tuner.evaluate`` does not take."""


def evaluate_flags(argv: list[str]) -> list[str]:
    """The study's flags less the search-only ones: the start of its ``tuner.evaluate`` command."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in SEARCH_ONLY:
            skip = True
        else:
            out.append(a)
    return out


def row_of(study_name: str, arm: str, seed: int, argv: list[str], wall_s: float) -> dict[str, Any]:
    settings = parse_settings(argv)
    study = optuna.load_study(study_name=settings.name, storage=settings.storage_url)
    outcome = StudyOutcome.from_study(study)
    cap = outcome.budget.search.budget
    records = {r.number: r for r in study_records(study)}
    own = [records[t.number] for t in sampler_trials(study) if t.number in records]
    best = outcome.recommended
    heldout_path = settings.study_dir / "heldout.json"
    heldout = json.loads(heldout_path.read_text()) if heldout_path.exists() else {}
    rec = next((r for r in heldout.get("rows", []) if r["schedule"] == "recommended"), None)
    test_n = 150 if study_name == "openqa" else None
    evaluate = (
        None
        if best is None
        else " ".join(
            [
                ".venv/bin/python -m tuner.evaluate",
                *evaluate_flags(argv),
                "--split test --methods baseline,lazyllm",
                f"--schedule {settings.study_dir / 'recommended.json'}",
                *([f"--n-examples {test_n}"] if test_n else []),
            ]
        )
    )
    return {
        "study": study_name,
        "arm": arm,
        "seed": seed,
        "date": datetime.date.today().isoformat(),
        "wall_min": round(wall_s / 60, 1),
        "search_cap_nats": cap,
        "search_cap_source": outcome.identity.search_cap_source or "constant",
        "trials_complete": len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))),
        "sampler_below_floor": sum(
            1 for t in study.get_trials(deepcopy=False) if SPEED_FLOOR_CONSTRAINT in t.constraints
        ),
        "min_speedup": settings.min_speedup,
        "sampler_complete": len(own),
        "sampler_feasible": sum(1 for r in own if r.loss is not None and r.loss.upper <= cap),
        "sampler_in_region": sum(
            1 for r in own if r.complete and r.values[0] > REGION[0] and r.values[1] <= REGION[1]
        ),
        "pick_trial": None if best is None else best.number,
        "pick_percentiles": None if best is None else list(best.schedule.percentiles),
        "pick_scoring": None if best is None else str(best.schedule.scoring),
        "pick_flop_speedup": None if best is None else best.flop_speedup,
        "pick_validation_kl_nats": None if best is None else best.values[1],
        "test_task_loss": None if rec is None else rec["test_loss"],
        "test_task_loss_interval_90": None if rec is None else rec["test_loss_interval"],
        "test_n": None if rec is None else rec["n_test"],
        "test_ttft_speedup": None if rec is None else rec["test_speedup"],
        "evaluate_on_test": evaluate,
    }


def done_keys(rows: Path) -> set[tuple[str, str, int]]:
    if not rows.exists():
        return set()
    out = set()
    for line in rows.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out.add((r["study"], r["arm"], int(r["seed"])))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--studies", nargs="+", choices=STUDIES, default=list(STUDIES))
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--out", type=Path, default=Path(f"benchmarks/data/search-ablation-{datetime.date.today()}")
    )
    p.add_argument("--data-dir", default=os.environ.get("LONGBENCH_DIR", "../shared/data/longbench"))
    p.add_argument("--openqa-dir", default=os.environ.get("OPENQA_DIR", "../shared/data/open-qa"))
    args = p.parse_args(argv)

    rows = args.out / "rows.jsonl"
    done = done_keys(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    for study in args.studies:
        for seed in args.seeds:
            for arm in args.arms:
                if (study, arm, seed) in done:
                    print(f"{study} {arm} seed {seed}: already in {rows}")
                    continue
                output = args.out / "runs" / f"{study}-{arm}-seed{seed}"
                flags = prepare(arm, study_argv(study, seed, args.data_dir, args.openqa_dir, output))
                log = args.out / f"{study}-{arm}-seed{seed}.log"
                start = time.monotonic()
                with log.open("w") as fh:
                    code = subprocess.call(
                        [sys.executable, "-m", "tuner.search", *flags], stdout=fh, stderr=subprocess.STDOUT
                    )
                if code != 0:
                    print(
                        f"{study} {arm} seed {seed}: tuner.search exited {code} (see {log}); no row written"
                    )
                    return code
                row = row_of(study, arm, seed, flags, time.monotonic() - start)
                with rows.open("a") as fh:  # one row per finished run: a rerun skips it
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
