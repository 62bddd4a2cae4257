"""Settings: dataclass defaults -> YAML preset (``studies/*.yaml``) -> CLI flags, validated once.

One model of *what to evaluate on* (:class:`EvalSettings`: model, task, language, split, truncation,
answer lengths, data) is shared by the search (:class:`SearchSettings`) and the report CLI
(:class:`EvaluateSettings`), so a preset means the same examples to both. Every field carries its
help text, and the command-line flags are made from the fields (:func:`add_flags`), so a setting is
declared, defaulted, documented and validated in exactly one place.

The search defaults are budgeted to finish ``python -m tuner.search --task qa`` on a 2-core CPU in
about 15 minutes, everything included (SmolLM2, every QA validation example scored by teacher-forced
fidelity, prompts cut to 1024 tokens, answers capped at 32 tokens, trials bounded by
``trials_timeout`` = 420 s (``n_trials`` = 100 is a ceiling that time reaches first on a CPU), then
the confirmation stage and the held-out check). On a GPU the ``qa-gpu`` preset reads LongBench's
full QA sets from the hub, raises ``max_prompt_tokens`` to 3500, lifts ``trials_timeout``, bounds the
search to 4 validation examples a dataset and calibrates on all of them (``studies/qa-gpu.yaml``;
what that costs: :mod:`tuner.study.cost`).

On the command line a setting that may be null takes ``none`` (``--n-examples none``: all examples,
``--trials-timeout none``: no limit), also over a preset that sets it. Renamed settings keep their old
spelling, as a flag and as a preset key, deprecated (:data:`RENAMED`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lazyllm.methods import check_method, needs_schedule, parse_method_options
from lazyllm.models import DEFAULT_MODEL, DTYPES, parse_dtype
from lazyllm.schedule import Revival
from tuner.data.embedded import PACKAGED
from tuner.data.longbench import LANGUAGE_FILTERS, SPLITS, is_prompts_path, resolve_task, task_help
from tuner.data.prompts import (
    AGREEMENT_BUDGET,
    AGREEMENT_EXPONENT,
    FRESH,
    GOLD_PER_AGREEMENT_POINT,
    LONG_PROMPTS,
    PromptsFile,
    load_prompts_file,
)
from tuner.statistics.cap import CAP_MARGIN, KL_PER_POINT, MIN_SPEEDUP, SearchCap, agreement_cap, search_cap
from tuner.statistics.prior import SlopePrior
from tuner.statistics.prior import resolve as resolve_prior
from tuner.statistics.shape import SQUARE_ROOT, check_exponent
from tuner.statistics.speed import CLOCKS
from tuner.study.identity import StudyIdentity
from tuner.study.samplers import check_sampler, sampler_names
from tuner.study.strict_yaml import load_strict

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"
SPEEDUP_MODES = ("measured", "total", "flops")
ACCURACY_MODES = ("fidelity", "score")
"""What a study minimises: teacher-forced KL to the unpruned model, or the task score (one definition;
:mod:`tuner.study.records` validates a trial's accuracy mode against it)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
SEED_MAX = 2**32 - 1  # numpy's and Optuna's samplers take seeds in 0..2**32-1
HEARTBEAT_MAX_S = 3600  # an hour between heartbeats; the heartbeat thread's wait must stay a valid timeout
GRACE_MAX_S = 7 * 24 * 3600  # a week without a heartbeat before a trial counts as crashed
CONFIRM_K_DEFAULT = 6
FRESH_KINDS = ("open-qa", "file", "calibration", "none")


@dataclass(frozen=True)
class FreshSource:
    """Where the fresh-drift check's prompts come from (:meth:`SearchSettings.fresh_source`).

    ``open-qa``: open-QA validation records described by ``settings``; ``file``: a prompts file's
    fresh pool (its ``fresh`` split, :meth:`tuner.data.prompts.PromptsFile.split`) described by
    ``settings``; ``calibration``: the calibration's examples the search did not see (an open-QA
    search's own task; :func:`tuner.stages.confirm.fresh_prompts`); ``none``: no check, for ``reason``.
    """

    kind: str
    settings: EvalSettings | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FRESH_KINDS:
            raise ValueError(f"fresh source kind = {self.kind!r}: must be one of {', '.join(FRESH_KINDS)}")
        if (self.settings is not None) != (self.kind in ("open-qa", "file")):
            raise ValueError(
                f"fresh source {self.kind!r}: settings go with 'open-qa' and 'file' and only with them"
            )
        if bool(self.reason) != (self.kind == "none"):
            raise ValueError(f"fresh source {self.kind!r}: a reason goes with 'none' and only with it")


def _help(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


def _slug(text: str) -> str:
    """A folder-safe name part: path separators and odd characters become '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "x"


def _timing_rounds() -> Any:
    """The timing-rounds setting of the search and of ``tuner.evaluate`` (declared once)."""
    return field(default=3, metadata=_help("interleaved timings per side and measurement (min per side)"))


def _timing_clock() -> Any:
    """The timing-clock setting of the search and of ``tuner.evaluate`` (declared once)."""
    return field(
        default="auto",
        metadata=_help(
            "clock of the measured speedups: cpu (one thread, its CPU time; robust to background load), "
            "wall, or auto (cpu on a CPU, wall on CUDA)",
            choices=CLOCKS,
        ),
    )


def _check_timing(rounds: int, clock: str) -> None:
    if rounds < 1:
        raise ValueError(f"timing_rounds = {rounds}: must be >= 1")
    if clock not in CLOCKS:
        raise ValueError(f"timing_clock = {clock!r}: must be one of {', '.join(CLOCKS)}")


def _seed(name: str, value: int) -> None:
    if not 0 <= value <= SEED_MAX:
        raise ValueError(
            f"{name} = {value}: must be in 0..{SEED_MAX} (2**32-1, what numpy and Optuna accept)"
        )


def _finite(name: str, value: float | None, *, low: float | None = None, strict: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} = {value!r}: must be a finite number")
    if low is not None and (value <= low if strict else value < low):
        raise ValueError(f"{name} = {value}: must be {'>' if strict else '>='} {low}")


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate on; shared by ``tuner.search`` and ``tuner.evaluate``."""

    model: str = field(default=DEFAULT_MODEL, metadata=_help("alias, checkpoint folder or hub id"))
    task: str = field(default="qa", metadata=_help(task_help()))
    language: str = field(default="en", metadata=_help("dataset language", choices=LANGUAGE_FILTERS))
    split: str = field(default="validation", metadata=_help("which split of each dataset", choices=SPLITS))
    split_seed: int = field(default=0, metadata=_help("seed of the hashed validation/test split"))
    n_examples: int | None = field(
        default=None, metadata=_help("at most this many examples per dataset (none = all)")
    )
    max_prompt_tokens: int = field(
        default=1024, metadata=_help("prompts longer than this are cut in the middle")
    )
    max_new_tokens: int | None = field(
        default=32, metadata=_help("cap on LongBench's per-dataset answer length (none = LongBench's own)")
    )
    data_dir: str | None = field(
        default=None,
        metadata=_help(
            "LongBench folder, or 'packaged' or 'hub' (default: $LONGBENCH_DIR, else the records packaged "
            "with the project where they hold the task, else the hub)"
        ),
    )
    openqa_dir: str | None = field(
        default=None,
        metadata=_help(
            "folder of HotpotQA/SQuAD JSON, or 'packaged' or 'hub', for the openqa tasks (default: "
            "$OPENQA_DIR, else the hub) and the fresh-drift check (default: $OPENQA_DIR, else the packaged pool)"
        ),
    )
    trust_remote_code: bool = field(
        default=False, metadata=_help("allow a hub model's own Python code to run")
    )
    dtype: str = field(
        default="auto",
        metadata=_help(
            "weights and activations (auto: float32 on CPU, bfloat16 on CUDA)", choices=tuple(DTYPES)
        ),
    )
    long_prompts: str = field(
        default="cut",
        metadata=_help(
            "a prompts file's prompt over --max-prompt-tokens: cut in the middle as LongBench's are (the "
            "default, what every built-in task does), or refuse the file naming the row",
            choices=LONG_PROMPTS,
        ),
    )

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)  # the engine's one rule for dtype names
        if self.long_prompts not in LONG_PROMPTS:
            raise ValueError(
                f"long_prompts = {self.long_prompts!r}: must be one of {', '.join(LONG_PROMPTS)}"
            )
        if self.language not in LANGUAGE_FILTERS:
            raise ValueError(f"language = {self.language!r}: must be one of {', '.join(LANGUAGE_FILTERS)}")
        if self.split not in SPLITS and not (self.split == FRESH and is_prompts_path(self.task)):
            raise ValueError(f"split = {self.split!r}: must be one of {', '.join(SPLITS)}")
        if (
            isinstance(self.task, str)
            and "," in self.task
            and not all(p.strip() for p in self.task.split(","))
        ):
            raise ValueError(f"task = {self.task!r}: a comma list with an empty part; drop the extra comma")
        resolve_task(self.task, self.language)  # an unknown task fails here, before any state
        _ = self.prompts_file  # a prompts file is read and checked once, here: its content is the study's
        if self.n_examples is not None and self.n_examples < 1:
            raise ValueError(f"n_examples = {self.n_examples}: must be >= 1 (or null for all)")
        if self.max_prompt_tokens < 16:
            raise ValueError(f"max_prompt_tokens = {self.max_prompt_tokens}: must be >= 16")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(
                f"max_new_tokens = {self.max_new_tokens}: must be >= 1 (or null for LongBench's)"
            )
        if not self.model.strip():
            raise ValueError("model is empty: pass an alias, a checkpoint folder or a hub id")

    @property
    def model_slug(self) -> str:
        return _slug(Path(self.model).name or self.model)

    @functools.cached_property
    def prompts_file(self) -> PromptsFile | None:
        """The task's prompts file as it was when these settings were made, read and validated (None
        for a named task): the study's name and identity are of that content."""
        return load_prompts_file(self.task) if is_prompts_path(self.task) else None

    @property
    def task_slug(self) -> str:
        """The task in a folder name; a prompts file's stem and content fingerprint (an edited file is
        another study)."""
        prompts = self.prompts_file
        if prompts is None:
            return _slug(self.task)
        return f"{_slug(prompts.path.stem)}-{prompts.fingerprint[:8]}"

    @property
    def budget_kind(self) -> str:
        """What the task's score points measure (:data:`tuner.data.prompts.BUDGET_KINDS`): ``gold``,
        or ``agreement`` for a prompts file without answers."""
        prompts = self.prompts_file
        return "gold" if prompts is None else prompts.budget_kind

    def eval_only(self) -> EvalSettings:
        """Just the evaluation fields (what the baseline cache and the examples depend on)."""
        return EvalSettings(**{f.name: getattr(self, f.name) for f in fields(EvalSettings)})

    def with_split(self, split: str) -> EvalSettings:
        return dataclasses.replace(self.eval_only(), split=split)


def _check_search_prompt_tokens(settings: SearchSettings) -> None:
    """A multi-fidelity search's one-line errors: a length within 16..max_prompt_tokens, a fidelity
    search (its KL needs no answer, so a shorter prompt still ranks schedules) and the FLOP model's
    speed (a timed trial would time the short prompt, not the one the user runs)."""
    n = settings.search_prompt_tokens
    if isinstance(n, bool) or n is None or not 16 <= n <= settings.max_prompt_tokens:
        raise ValueError(
            f"search_prompt_tokens = {n}: must be in 16..max_prompt_tokens ({settings.max_prompt_tokens}), "
            "or none for the same length"
        )
    if n < settings.max_prompt_tokens and (settings.accuracy != "fidelity" or settings.speedup != "flops"):
        raise ValueError(
            f"search_prompt_tokens = {n} < max_prompt_tokens = {settings.max_prompt_tokens} needs "
            f"--accuracy fidelity and --speedup flops (got {settings.accuracy}, {settings.speedup}): trials "
            "on short prompts rank schedules by KL, and their speed is the FLOP model's at the target length"
        )


@dataclass(frozen=True)
class SearchSettings(EvalSettings):
    """Everything a study needs. See ``python -m tuner.search --help`` for each field."""

    # search: every validation example (the fidelity pass is cheap and the speed is timed on one prompt)
    n_examples: int | None = field(
        default=None, metadata=_help("validation examples per dataset (default / none = all)")
    )
    n_trials: int = field(
        default=100,
        metadata=_help(
            "finished trials the study should hold (on a CPU --trials-timeout usually ends it first)"
        ),
    )
    trials_timeout: float | None = field(
        default=420.0,
        metadata=_help(
            "seconds for this run's trials, not the whole run: baseline, confirmation and held-out "
            "check come on top (none = no limit)"
        ),
    )
    study_name: str | None = field(default=None, metadata=_help("default: <model>-<task>-<search space>"))
    storage: str | None = field(
        default=None, metadata=_help("Optuna storage URL (default: sqlite file in the study folder)")
    )
    # TPE: benchmarks/sampler_choice.py favoured GP on hypervolume, but GP models only the fixed
    # parameters of a define-by-run space and collapsed onto keep-all in a real study (docs/tuning.md#samplers)
    sampler: str = field(default="tpe", metadata=_help("Optuna sampler", choices=tuple(sampler_names())))
    seed: int = field(default=0, metadata=_help("sampler seed"))
    search_space: str = field(default="stages", metadata=_help("a packaged space name or a YAML path"))
    max_accuracy_loss: float = field(
        default=2.0,
        metadata=_help(
            "loss budget in score points (confirmation, recommended.json) (default: 2.0; for a prompts "
            f"file without answers, {AGREEMENT_BUDGET:g} agreement points, with --calibration-exponent "
            f"{AGREEMENT_EXPONENT:g} and a search cap of the gold points it corresponds to, docs/statistics.md)"
        ),
    )
    # benchmarks/objective_noise.py: fidelity is the more reliable signal per CPU second (docs/benchmarks.md)
    accuracy: str = field(
        default="fidelity",
        metadata=_help(
            "search objective: teacher-forced KL to the unpruned model, or the task score",
            choices=ACCURACY_MODES,
        ),
    )
    max_kl: float | None = field(
        default=None,
        metadata=_help(
            "fidelity cap during the search, mean KL per answer token in nats (default: the KL at which "
            f"the model's slope prior predicts {CAP_MARGIN:g}x --max-accuracy-loss, or {KL_PER_POINT:g} nats "
            "per score point without a prior; the recommendation is decided by the study's own "
            "calibration: docs/statistics.md#confirmation)"
        ),
    )
    min_speedup: float = field(
        default=MIN_SPEEDUP,
        metadata=_help(
            "the sampler's proposals the FLOP model puts below this speedup are not evaluated: stopped "
            "at once and marked infeasible, so the sampler leaves that region (1 = off; queued schedules "
            "always run: docs/tuning.md#the-speed-floor)"
        ),
    )
    confidence: float = field(
        default=0.9, metadata=_help("level of every interval and of the one-sided bounds in constraints")
    )
    decision_level: float = field(
        default=0.6,
        metadata=_help(
            "level of the calibration's predicted task-loss bound that decides the recommendation "
            "(benchmarks/decision_rule.py measures its error rate; intervals stay at --confidence)"
        ),
    )
    prior_at_score_bound: bool = field(
        default=True,
        metadata=_help(
            "read a slope prior that scales by the unpruned score at that score's one-sided bound at "
            "--confidence for the bound that decides, as for the certified one: the score is measured on "
            "the calibration's few examples (benchmarks/decision_rule.py --score-levels replays it; "
            "--no-prior-at-score-bound: at the score, the rule before 2026-12-07)"
        ),
    )
    calibration_exponent: float = field(
        default=SQUARE_ROOT,
        metadata=_help(
            "shape p of the calibration, task loss = slope x KL^p, in (0, 1]: 0.5 a square root (concave: a "
            "small KL costs relatively more, as the recorded grids show), 1 a straight line; the slope prior "
            "must be fitted at the same p"
        ),
    )
    confirm_k: int = field(
        default=CONFIRM_K_DEFAULT,
        metadata=_help(
            "feasible front schedules scored on the task before recommending (a fidelity search: the "
            "calibration's points; a score search: the candidates raced, each already within budget "
            "on its own bound, so the fastest is confirmed)"
        ),
    )
    confirm_n_examples: int | None = field(
        default=None,
        metadata=_help(
            "validation examples per dataset that confirmation task-scores and the calibration fits on "
            "(more than the search's, for a calibration with power; none = the search's own)"
        ),
    )
    heldout_n_examples: int | None = field(
        default=None,
        metadata=_help("test examples per dataset of the held-out check (none = as many as the search's)"),
    )
    timing_rounds: int = _timing_rounds()
    timing_clock: str = _timing_clock()
    fidelity_top_k: int = field(default=64, metadata=_help("unpruned tokens per step kept for the KL"))
    fidelity_gold: bool = field(
        default=False, metadata=_help("also record the change in gold-answer log-likelihood (2nd pass)")
    )
    output: str = field(default="runs", metadata=_help("results root"))
    # the FLOP model tracks measured TTFT on CPU (docs/benchmarks.md) and costs nothing, so a study
    # evaluates three times as many schedules; the held-out check times TTFT side by side either way
    speedup: str = field(
        default="flops",
        metadata=_help(
            "search objective: the FLOP model of TTFT (the held-out check still times TTFT), measured "
            "TTFT timed in every trial, or measured whole-generation time (total)",
            choices=SPEEDUP_MODES,
        ),
    )
    timed_new_tokens: int | None = field(
        default=None,
        metadata=_help(
            "answer length timed for --speedup total (default / none: the timed example's own); "
            "not --max-new-tokens, the cap on every scored answer"
        ),
    )
    revival: str = field(
        default="frozen",
        metadata=_help("decoding revival policy of every trial's schedule: frozen, dynamic or budget:N"),
    )
    slope_prior: str = field(
        default="auto",
        metadata=_help(
            "floor of an underpowered calibration's slope: auto (the model's packaged open-QA prior recorded nearest "
            "max_prompt_tokens, if any), none, or a prior JSON file (benchmarks/slope_prior.py)"
        ),
    )
    search_max_kl: float | None = field(
        default=None,
        metadata=_help(
            "fidelity cap of a multi-fidelity search's trials, at search_prompt_tokens (the long-prompt "
            "presets' exploration cap: the front is judged again at max_prompt_tokens); not applied when "
            "the trials run at max_prompt_tokens, which take --max-kl, else the prior's cap at that length "
            "(docs/tuning.md#multi-fidelity-search)"
        ),
    )
    search_prompt_tokens: int | None = field(
        default=None,
        metadata=_help(
            "prompt length the search's trials run at (none = max_prompt_tokens); shorter: a multi-fidelity "
            "search, whose feasible front is measured again at max_prompt_tokens, where the calibration, "
            "the fresh-drift check, the held-out check and the decision run (docs/tuning.md#multi-fidelity-search)"
        ),
    )
    fresh_kl_examples: int = field(
        default=12,
        metadata=_help(
            "prompts per dataset the search never saw on which a fidelity study re-measures the KL of its "
            "front before picking: a prompts file's own fresh rows, else open-QA validation prompts "
            "(--openqa-dir, $OPENQA_DIR, else the packaged pool; checked where the search saw fewer); 0 = off"
        ),
    )
    heldout: bool = field(default=True, metadata=_help("check the recommendation on the test split"))
    tracking_uri: str | None = field(
        default=None,
        metadata=_help("MLflow tracking URI (default: sqlite file in the study folder; 'none' = off)"),
    )
    register: str | None = field(
        default=None, metadata=_help("register the recommended schedule as this MLflow registered model")
    )
    n_workers: int = field(default=1, metadata=_help("local worker processes on this study"))
    heartbeat_interval: int = field(default=10, metadata=_help("seconds between trial heartbeats"))
    heartbeat_grace: int = field(
        default=60, metadata=_help("seconds without a heartbeat before a trial counts as crashed")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.split != "validation":
            raise ValueError(f"split = {self.split!r}: a study searches on 'validation' (reports use test)")
        if self.n_trials < 1:
            raise ValueError(f"n_trials = {self.n_trials}: must be >= 1")
        _seed("seed", self.seed)
        _finite("trials_timeout", self.trials_timeout, low=0, strict=True)
        check_sampler(self.sampler)
        if self.speedup not in SPEEDUP_MODES:
            raise ValueError(f"speedup = {self.speedup!r}: must be one of {', '.join(SPEEDUP_MODES)}")
        _finite("max_accuracy_loss", self.max_accuracy_loss, low=0)
        if self.accuracy not in ACCURACY_MODES:
            raise ValueError(f"accuracy = {self.accuracy!r}: must be one of {', '.join(ACCURACY_MODES)}")
        _finite("max_kl", self.max_kl, low=0, strict=True)
        _finite("search_max_kl", self.search_max_kl, low=0, strict=True)
        _finite("min_speedup", self.min_speedup, low=1.0)
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence = {self.confidence}: must be in [0.5, 1), e.g. 0.9")
        if not 0.5 <= self.decision_level <= self.confidence:
            raise ValueError(
                f"decision_level = {self.decision_level}: must be in [0.5, confidence = {self.confidence}], "
                "e.g. 0.6 (a decision is not made above the level it is reported at)"
            )
        check_exponent(self.calibration_exponent)
        confirm_most = max(self.n_trials, CONFIRM_K_DEFAULT)
        if not 0 <= self.confirm_k <= confirm_most:
            raise ValueError(
                f"confirm_k = {self.confirm_k}: must be in 0..{confirm_most} (0 = no confirmation): it "
                f"scores schedules of the front, and a study of n_trials = {self.n_trials} trials has at "
                f"most that many (the default {CONFIRM_K_DEFAULT} is allowed whatever n_trials)"
            )
        for name in ("confirm_n_examples", "heldout_n_examples"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} = {value}: must be >= 1 (or null for the search's own)")
        if isinstance(self.fresh_kl_examples, bool) or self.fresh_kl_examples < 0:
            raise ValueError(
                f"fresh_kl_examples = {self.fresh_kl_examples}: must be >= 0 (0 = no fresh-prompt check)"
            )
        if self.timed_new_tokens is not None and self.timed_new_tokens < 1:
            raise ValueError(
                f"timed_new_tokens = {self.timed_new_tokens}: must be >= 1 (or null for the answer length)"
            )
        if self.search_prompt_tokens is not None:
            _check_search_prompt_tokens(self)
        _ = self.revival_policy  # parsed once here: dynamic, frozen or budget:N; anything else is one line
        prior = self.prior  # read once here: a bad file or another model's prior is one line
        if prior is not None:
            prior.upper(self.decision_level)  # it must hold bounds at both levels the rule reads
            prior.upper(self.confidence)
        _check_timing(self.timing_rounds, self.timing_clock)
        if self.fidelity_top_k < 1:
            raise ValueError(f"fidelity_top_k = {self.fidelity_top_k}: must be >= 1")
        if self.n_workers < 1:
            raise ValueError(f"n_workers = {self.n_workers}: must be >= 1")
        if not 1 <= self.heartbeat_interval <= HEARTBEAT_MAX_S:
            raise ValueError(
                f"heartbeat_interval = {self.heartbeat_interval}: must be in 1..{HEARTBEAT_MAX_S} seconds"
            )
        if not self.heartbeat_interval < self.heartbeat_grace <= GRACE_MAX_S:
            raise ValueError(
                f"heartbeat_grace = {self.heartbeat_grace}: must be > heartbeat_interval "
                f"({self.heartbeat_interval}) and <= {GRACE_MAX_S} seconds (a week)"
            )
        if self.study_name is not None and not _NAME.match(self.study_name):
            raise ValueError(
                f"study_name = {self.study_name!r}: use letters, digits, '_', '-' and '.' (it names a folder)"
            )

    @property
    def name(self) -> str:
        """The study name: given, or derived from model, task and search space (a path's file stem)."""
        if self.study_name:
            return self.study_name
        space = (
            Path(self.search_space).stem
            if self.search_space.endswith((".yaml", ".yml"))
            else self.search_space
        )
        return f"{self.model_slug}-{self.task_slug}-{_slug(space)}"

    @property
    def study_dir(self) -> Path:
        return Path(self.output) / self.name

    @functools.cached_property
    def revival_policy(self) -> Revival:
        """The decoding policy of every trial's schedule, typed (``revival`` is its spelling)."""
        return Revival.parse(self.revival)

    @functools.cached_property
    def prior(self) -> SlopePrior | None:
        """The slope prior ``slope_prior`` names, read once (None: ``none``, or ``auto`` with no
        packaged prior for this model, or for an agreement budget: the packaged priors are in gold
        points, and an agreement calibration's slope is about eight times theirs, docs/statistics.md)."""
        if self.slope_prior == "auto" and self.budget_kind == "agreement":
            return None
        return resolve_prior(
            self.slope_prior, self.model_slug, self.max_prompt_tokens, self.calibration_exponent
        )

    @property
    def multi_fidelity(self) -> bool:
        """Whether the trials run on shorter prompts than the decision (``search_prompt_tokens``)."""
        return self.search_prompt_tokens is not None and self.search_prompt_tokens < self.max_prompt_tokens

    def search_eval(self) -> EvalSettings:
        """What the search's trials evaluate on: :meth:`eval_only` with prompts cut (or built) to
        ``search_prompt_tokens`` when that is set."""
        own = self.eval_only()
        if not self.multi_fidelity:
            return own
        assert self.search_prompt_tokens is not None  # multi_fidelity says so
        return dataclasses.replace(own, max_prompt_tokens=self.search_prompt_tokens)

    @functools.cached_property
    def search_prior(self) -> SlopePrior | None:
        """The slope prior the search cap reads: :attr:`prior`, or in a multi-fidelity search the one
        recorded nearest ``search_prompt_tokens``, the length the trials' KL is measured at."""
        if not self.multi_fidelity or self.slope_prior != "auto" or self.budget_kind == "agreement":
            return self.prior
        return resolve_prior(
            self.slope_prior, self.model_slug, self.search_prompt_tokens, self.calibration_exponent
        )

    @functools.cached_property
    def cap(self) -> SearchCap | None:
        """A fidelity search's cap (:func:`tuner.statistics.cap.search_cap`: ``max_kl``, else in a
        multi-fidelity search ``search_max_kl``, else from :attr:`search_prior`, else the constant);
        None for a score search."""
        if self.accuracy != "fidelity":
            return None
        if self.max_kl is None and self.multi_fidelity and self.search_max_kl is not None:
            return SearchCap(self.search_max_kl, "exploration")
        if self.max_kl is None and self.budget_kind == "agreement" and self.prior is None:
            return agreement_cap(self.max_accuracy_loss * GOLD_PER_AGREEMENT_POINT)
        return search_cap(self.max_accuracy_loss, self.max_kl, self.search_prior)

    def with_cap(self, cap: SearchCap) -> SearchSettings:
        """These settings with a search cap measured rather than read (``pilot``:
        :mod:`tuner.stages.pilot`): not a flag, so that a resumed study measures it again the same way;
        the identity, the budget and MLflow's parameters read it from :attr:`cap` as any other."""
        out = dataclasses.replace(self)
        out.__dict__["cap"] = cap  # the cached property's slot: the same object answers every reader
        return out

    @property
    def search_cap(self) -> float | None:
        """:attr:`cap` in nats (part of the study's identity, and so of MLflow's parameters)."""
        return None if self.cap is None else self.cap.nats

    @property
    def search_cap_source(self) -> str:
        return "" if self.cap is None else self.cap.source

    @property
    def search_cap_prior(self) -> str | None:
        return None if self.cap is None else self.cap.prior

    def fresh_source(self) -> FreshSource:
        """The prompts of the fresh-drift check (:func:`tuner.stages.rule.pooled_rule`, step 5): a
        prompts file's own fresh pool (validation rows the search never reads, at most
        ``fresh_kl_examples``); the calibration's examples beyond the search's where the search's own
        task is open-QA; else open-QA validation records at this study's prompt length,
        ``fresh_kl_examples`` per dataset, from ``--openqa-dir``, ``$OPENQA_DIR``, or the pool packaged
        with the project (never the hub unasked); or why there are none."""
        if self.fresh_kl_examples == 0:
            return FreshSource("none", reason="off (--fresh-kl-examples 0)")
        prompts = self.prompts_file
        if prompts is not None:
            note = prompts.fresh_note(self.split_seed)
            if note:
                return FreshSource("none", reason=note)
            settings = dataclasses.replace(self.eval_only(), split=FRESH, n_examples=self.fresh_kl_examples)
            return FreshSource("file", settings=settings)
        if any(spec.source == "openqa" for spec in resolve_task(self.task, self.language)):
            return FreshSource("calibration")
        settings = dataclasses.replace(
            self.eval_only(), task="openqa", language="en", split="validation",
            n_examples=self.fresh_kl_examples,
            openqa_dir=self.openqa_dir or os.environ.get("OPENQA_DIR") or PACKAGED,
        )  # fmt: skip
        return FreshSource("open-qa", settings=settings)

    def evidence_settings(self, stage: str) -> EvalSettings:
        """What the ``confirm`` stage (validation, ``confirm_n_examples``) or the ``heldout`` stage
        (test, ``heldout_n_examples``) evaluates on; each falls back to the search's ``n_examples``."""
        if stage == "confirm":
            n, split = self.confirm_n_examples, "validation"
        elif stage == "heldout":
            n, split = self.heldout_n_examples, "test"
        else:
            raise ValueError(f"stage = {stage!r}: must be confirm or heldout")
        chosen = self.with_split(split)
        return chosen if n is None else dataclasses.replace(chosen, n_examples=n)

    @property
    def storage_url(self) -> str:
        """Any Optuna storage URL; default a SQLite file in the study folder."""
        return self.storage or f"sqlite:///{(self.study_dir / 'study.db').resolve()}"

    def study_identity(self) -> dict[str, Any]:
        """The settings a resumed study must share with the one that created it."""
        keys = ("model", "dtype", "task", "language", "search_space", "max_prompt_tokens", "n_examples",
                "max_new_tokens", "split_seed", "speedup", "max_accuracy_loss", "accuracy", "max_kl", "revival", "timing_clock",
                "confidence", "fidelity_top_k", "fidelity_gold", "search_cap", "search_cap_source",
                "search_cap_prior", "search_prompt_tokens")  # fmt: skip
        prompts = self.prompts_file
        file = {} if prompts is None else {"task_fingerprint": f"{prompts.fingerprint}/{self.long_prompts}"}
        given = {k: getattr(self, k) for k in keys} | {
            "task_fingerprint": None,
            "budget_kind": self.budget_kind,
        }
        return StudyIdentity.from_dict(given | file).to_dict()  # one rule for what is stored


@dataclass(frozen=True)
class EvaluateSettings(EvalSettings):
    """``python -m tuner.evaluate``: methods compared on a split (test by default)."""

    split: str = field(default="test", metadata=_help("which split of each dataset", choices=SPLITS))
    schedule: str | None = field(
        default=None, metadata=_help("LazyLLM schedule JSON (needed by every method but baseline)")
    )
    methods: str = field(
        default="baseline,random,static,compression,lazyllm", metadata=_help("comma list of methods")
    )
    seed: int = field(default=0, metadata=_help("seed of the methods that draw at random"))
    output: str | None = field(
        default=None, metadata=_help("results folder (default: outputs/evaluate/<model>-<task>-<split>)")
    )
    allow_other_model: bool = field(
        default=False, metadata=_help("use a schedule made for another model of the same depth")
    )
    method_options: str | None = field(
        default=None,
        metadata=_help("method knobs, comma list of METHOD.KNOB=VALUE, e.g. gemfilter.k=0.3,tsp.layer=14"),
    )
    match_speedup: bool = field(
        default=False,
        metadata=_help("also compare the peers (gemfilter, tsp) with the schedule at matched speed and loss"),
    )
    # speedups are measured as the search measures them (tuner.statistics.speed)
    timing_rounds: int = _timing_rounds()
    timing_clock: str = _timing_clock()

    def __post_init__(self) -> None:
        super().__post_init__()
        _seed("seed", self.seed)
        if not self.method_list:
            raise ValueError("methods is empty: pass a comma list such as baseline,lazyllm")
        for method in self.method_list:
            check_method(method)
        self.options_by_method  # noqa: B018 - validates names and values before any model loads
        if self.schedule is None and (self.match_speedup or any(needs_schedule(m) for m in self.method_list)):
            needing = [m for m in self.method_list if needs_schedule(m)] or ["--match-speedup"]
            raise ValueError(f"--schedule is needed for {', '.join(needing)}")
        _check_timing(self.timing_rounds, self.timing_clock)

    @property
    def options_by_method(self) -> dict[str, dict[str, float]]:
        """``method_options`` parsed and validated: method -> knob -> value."""
        return parse_method_options(self.method_options)

    @property
    def method_list(self) -> list[str]:
        return [m.strip() for m in self.methods.split(",") if m.strip()]

    @property
    def out_dir(self) -> Path:
        """``output``, or a folder derived from model, task and split (runs never overwrite each other)."""
        if self.output:
            return Path(self.output)
        return Path("outputs") / "evaluate" / f"{self.model_slug}-{_slug(self.task)}-{self.split}"


S = TypeVar("S", bound=EvalSettings)
_PRESET_CLASSES: tuple[type[EvalSettings], ...] = (SearchSettings, EvaluateSettings)


def _field_names(cls: type[EvalSettings]) -> set[str]:
    return {f.name for f in fields(cls)}


def load_preset(name_or_path: str, cls: type[EvalSettings] = SearchSettings) -> dict[str, Any]:
    """Read a preset: a name under ``studies/`` (``qa`` -> ``studies/qa.yaml``) or a YAML path.

    A preset may hold any setting of the search or of the evaluation CLI; ``cls`` keeps the ones it
    has (so one preset describes the same examples to both). A key neither knows is an error.
    """
    path = Path(name_or_path)
    if not path.suffix:
        path = STUDIES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in STUDIES_DIR.glob("*.yaml"))
        raise ValueError(
            f"Unknown preset {name_or_path!r}. Available: {', '.join(available)} (or a YAML path)"
        )
    try:
        data = load_strict(path.read_text()) or {}  # a key given twice is an error, as in a search space
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"preset {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"preset {path} must be a mapping of setting: value")
    data = _renamed(data, f"preset {path}")
    known = set().union(*(_field_names(c) for c in _PRESET_CLASSES))
    unknown = set(map(str, data)) - known
    if unknown:
        raise ValueError(
            f"preset {path}: unknown setting(s) {sorted(unknown)}; valid: {', '.join(sorted(known))}"
        )
    mine = _field_names(cls)
    return {k: v for k, v in data.items() if k in mine}


RENAMED = {"timeout": "trials_timeout", "new_tokens": "timed_new_tokens"}
"""Old setting name -> new one: the old spelling still works as a flag and as a preset key, with a
warning (``timeout`` bounded the trials only, unlike Optuna's ``timeout``; ``new_tokens`` read like
``max_new_tokens``)."""


def _renamed(data: Mapping[Any, Any], where: str) -> dict[Any, Any]:
    """``data`` with old setting names replaced by new ones (a warning for each; both is an error)."""
    out = dict(data)
    for old, new in RENAMED.items():
        if old in out:
            if new in out:
                raise ValueError(f"{where}: {old!r} is the old name of {new!r}; give only {new!r}")
            warnings.warn(f"{where}: {old!r} is deprecated; it is now {new!r}", FutureWarning, stacklevel=3)
            out[new] = out.pop(old)
    return out


class _Null:
    """What ``none`` on the command line parses to: null, given on purpose (None is "not given")."""

    def __repr__(self) -> str:
        return "none"


NULL: Any = _Null()


class _OldSpelling(argparse.Action):
    """Stores the flag's value; warns when it was given by the old spelling of a renamed setting."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        if option_string is not None and option_string != self.option_strings[0]:
            warnings.warn(
                f"{option_string} is deprecated; it is now {self.option_strings[0]}",
                FutureWarning,
                stacklevel=2,
            )
        setattr(namespace, self.dest, values)


def _nullable(kind: type) -> Any:
    """An argparse ``type`` taking ``none`` (or ``null``) as :data:`NULL`, else ``kind``."""

    def parse(text: str) -> Any:
        return NULL if text.strip().lower() in ("none", "null") else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error: "invalid int value"
    return parse


def resolve_settings(
    preset: str | None,
    overrides: Mapping[str, Any],
    cls: type[S] = SearchSettings,  # type: ignore[assignment]
) -> S:
    """Defaults, then the preset, then the CLI ``overrides`` (None values mean "not given")."""
    values: dict[str, Any] = {}
    if preset:
        values.update(load_preset(preset, cls))
    values.update({k: (None if v is NULL else v) for k, v in overrides.items() if v is not None})
    if _agreement_task(cls, values.get("task")):
        _agreement_defaults(cls, values)
    for f in fields(cls):
        if f.name in values:
            _check_type(f, values[f.name])
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"bad settings: {exc}") from None


def _agreement_task(cls: type[EvalSettings], task: Any) -> bool:
    """Whether ``task`` is a prompts file without answers, for settings of ``cls`` that hold a budget."""
    if "max_accuracy_loss" not in _field_names(cls) or not isinstance(task, str) or not is_prompts_path(task):
        return False
    return load_prompts_file(task).budget_kind == "agreement"


def _agreement_defaults(cls: type[EvalSettings], values: dict[str, Any]) -> None:
    """The defaults of a study budgeted in agreement points, where neither preset nor flag set them
    (benchmarks/agreement_vs_gold.py, docs/statistics.md): the budget that corresponds to 2 gold points,
    the square-root calibration (agreement loss against KL is concave: a straight line fits it worse
    than its mean); the search's KL cap of that gold budget is :attr:`SearchSettings.cap`'s."""
    mine = _field_names(cls)
    values.setdefault("max_accuracy_loss", AGREEMENT_BUDGET)
    if "calibration_exponent" in mine:
        values.setdefault("calibration_exponent", AGREEMENT_EXPONENT)


def settings_from_flags(args: Any, cls: type[S]) -> S:
    """Settings of type ``cls`` from parsed flags: ``--preset`` (if any), then every flag given."""
    values = dict(vars(args))
    preset = values.pop("preset", None)
    values.pop("debug", None)
    return resolve_settings(preset, values, cls)


_SCALARS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _base_type(f: dataclasses.Field[Any]) -> tuple[str, bool]:
    """('int' | 'float' | 'str' | 'bool', nullable) from the field's annotation string."""
    parts = [p.strip() for p in str(f.type).split("|")]
    nullable = "None" in parts
    base = next(p for p in parts if p != "None")
    return base, nullable


def _check_type(f: dataclasses.Field[Any], value: Any) -> None:
    base, nullable = _base_type(f)
    if value is None and nullable:
        return
    ok = isinstance(value, _SCALARS[base]) and not (base != "bool" and isinstance(value, bool))
    if not ok:
        what = f"{base} or null" if nullable else base
        raise ValueError(f"{f.name} = {value!r}: must be {what}")


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[EvalSettings],
    *,
    only: set[str] | None = None,
    exclude: set[str] = frozenset(),  # type: ignore[assignment]
    helps: Mapping[str, str] | None = None,
) -> None:
    """One ``--flag`` per field of ``cls`` (help and choices from the field); unset flags are None.

    ``helps`` replaces a field's help text (and its default) where another command means the setting
    differently (``tuner.export``: the study's own budget is the default)."""
    for f in fields(cls):
        if f.name in exclude or (only is not None and f.name not in only):
            continue
        base, nullable = _base_type(f)
        flag = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        text = (helps or {}).get(f.name) or str(meta.get("help", ""))
        if f.name not in (helps or {}) and "(default" not in text:  # a help naming its default keeps it
            text += f" (default: {f.default})"
        if base == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        kind: Any = {"int": int, "float": float, "str": str}[base]
        if nullable and base != "str":  # a text setting keeps "none" as text (--tracking-uri none)
            kind = _nullable(kind)
        old = [f"--{o.replace('_', '-')}" for o, n in RENAMED.items() if n == f.name]
        if old:
            text += f" ({', '.join(old)}: the old spelling, deprecated)"
        action: Any = _OldSpelling if old else "store"
        parser.add_argument(
            flag,
            *old,
            action=action,
            dest=f.name,
            type=kind,
            default=None,
            choices=meta.get("choices"),
            help=text,
        )
