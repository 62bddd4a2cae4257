"""The confirmation stage: re-score the best feasible candidates on the task before recommending.

The search ranks schedules by a cheap, low-noise signal (fidelity) or by the task score; either way
its pick may be lucky. Here the top ``k`` records of the **feasible** front (fastest first) are
evaluated with the LongBench task score on **every** validation example, and the task-score loss gets
a paired bootstrap interval against the baseline. Racing:

* candidates run fastest first; the first whose one-sided upper bound of task-score loss is within
  the user's budget (``max_accuracy_loss`` score points) is **confirmed** and becomes the
  recommendation (nothing slower can be recommended over it, so the slower candidates are **skipped**);
* a candidate stops early (**failed**) once its loss cannot meet the budget even if every remaining
  example scored perfectly; one that runs to the end over budget is **failed** too;
* a record of an ``accuracy="score"`` study already scored on every validation example is not re-run.
  Its feasibility already is that same bound, so in a score search the fastest feasible front record
  is confirmed and ``k`` only matters for records that cover fewer examples (older studies): racing
  more candidates gives none of them another draw.

The stage returns a :class:`Confirmation`; it writes nothing. The session stores it in the study
(user attr ``"confirmation"``, so ``tuner.export`` finds the same pick later) and the report writes
``confirmation.json`` and ``recommended.json`` from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from lazyllm import LazyLLM
from tuner.data.embedded import PACKAGED
from tuner.evaluation.fidelity import ExampleDrift, FidelityEvaluator
from tuner.evaluation.losses import ScoreLoss
from tuner.evaluation.runner import ExampleResult, build_examples, loss_estimate, macro_score
from tuner.stages.front import feasible_front
from tuner.stages.rule import (
    FreshKL,
    Refused,
    judged_kl,
    judged_kl_upper,
    measured_fresh_kl,
    pooled_rule,
    to_score,
)
from tuner.stages.trial import TrialRunner, fidelity_of
from tuner.statistics.bootstrap import Estimate, macro_weights
from tuner.statistics.calibration import Calibration, ScoredSchedule, UnprunedScore
from tuner.study.records import TrialRecord, complete_trial_count
from tuner.study.settings import EvalSettings

STATUSES = ("confirmed", "failed", "skipped", "scored")
CONFIRMATION_ATTR = "confirmation"
"""Study user attr holding the last confirmation (:meth:`Confirmation.to_dict`)."""


@dataclass(frozen=True)
class CandidateResult:
    """One candidate of the confirmation stage.

    Attributes:
        trial: Optuna trial number.
        percentiles: its schedule's percentiles (for people reading the JSON).
        speedup: its speed objective from the search.
        search_loss: its loss from the search, in the search loss's unit.
        status: ``confirmed``, ``failed``, ``skipped`` (a faster candidate was confirmed) or
            ``scored`` (task-scored as evidence for the calibration, not the pick).
        loss: task-score loss (score points) on all validation examples (None when skipped or
            stopped early).
        reason: why, in words.
    """

    trial: int
    percentiles: tuple[float, ...]
    speedup: float
    search_loss: float
    status: str
    loss: Estimate | None
    reason: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status = {self.status!r}: must be one of {', '.join(STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "percentiles": list(self.percentiles),
            "speedup": self.speedup,
            "search_loss": self.search_loss,
            "status": self.status,
            "task_loss": None if self.loss is None else self.loss.to_dict(),
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CandidateResult:
        task = data.get("task_loss")
        return cls(
            trial=int(data["trial"]),
            percentiles=tuple(float(p) for p in data["percentiles"]),
            speedup=float(data["speedup"]),
            search_loss=float(data["search_loss"]),
            status=str(data["status"]),
            loss=None if task is None else Estimate.from_dict(task),
            reason=str(data["reason"]),
        )


@dataclass(frozen=True)
class FreshCheck:
    """The fresh-drift check of a pooled confirmation (:func:`tuner.stages.rule.pooled_rule`, step 5).

    Attributes:
        prompts: what the prompts were, in words (or why the check did not run, with ``n_examples`` 0).
        n_examples: how many prompts (0: the check did not run).
        kl: (trial, mean KL in nats) for every front schedule measured, fastest first.
        stopped: (trial, prompts measured) for every schedule whose check stopped early, refused on the
            prompts measured so far (:data:`tuner.stages.rule.FreshDrift`): its KL is then a lower bound
            of the mean over all ``n_examples``, the rest counted at 0.
        upper: (trial, one-sided bound of its mean KL at the study's ``confidence``, resampling the
            prompts within each dataset) for every schedule measured on all ``n_examples``.
    """

    prompts: str
    n_examples: int
    kl: tuple[tuple[int, float], ...] = ()
    stopped: tuple[tuple[int, int], ...] = ()
    upper: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.n_examples < 0:
            raise ValueError(f"n_examples = {self.n_examples}: must be >= 0")
        if self.kl and self.n_examples == 0:
            raise ValueError("a fresh check that did not run measured no KL")
        measured = {t for t, _ in self.kl}
        for trial, n in self.stopped:
            if trial not in measured or not 0 <= n < self.n_examples:
                raise ValueError(
                    f"stopped ({trial}, {n}): a stopped check is of a measured trial, after 0 to "
                    f"{self.n_examples - 1} of its {self.n_examples} prompts"
                )
        cut = {t for t, _ in self.stopped}
        for trial, up in self.upper:
            kl = self.of(trial)
            if kl is None or trial in cut or not up >= kl:
                raise ValueError(
                    f"upper ({trial}, {up}): a bound is of a trial measured on every prompt, at least its KL"
                )

    def measured(self, trial: int) -> int:
        """How many prompts ``trial``'s KL was measured on (``n_examples`` unless stopped early)."""
        return next((n for t, n in self.stopped if t == trial), self.n_examples)

    @property
    def ran(self) -> bool:
        return self.n_examples > 0

    def of(self, trial: int) -> float | None:
        """``trial``'s fresh KL (None: not measured)."""
        return next((kl for t, kl in self.kl if t == trial), None)

    def judged(self, trial: int, kl: float) -> float:
        """The KL the rule judged ``trial`` (of KL ``kl`` on the calibration's examples) at."""
        return judged_kl(kl, self.of(trial))

    def judged_upper(self, trial: int, kl: float) -> float | None:
        """That KL's one-sided bound, where it is the fresh KL and the bound was measured (else None)."""
        return judged_kl_upper(kl, self.of(trial), next((u for t, u in self.upper if t == trial), None))

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "n_examples": self.n_examples,
            "kl": [list(x) for x in self.kl],
            "stopped": [list(x) for x in self.stopped],
            "upper": [list(x) for x in self.upper],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FreshCheck:
        return cls(
            str(data["prompts"]),
            int(data["n_examples"]),
            tuple((int(t), float(kl)) for t, kl in data.get("kl", [])),
            tuple((int(t), int(n)) for t, n in data.get("stopped", [])),
            tuple((int(t), float(u)) for t, u in data.get("upper", [])),
        )


def kl_so_far(drifts: Sequence[ExampleDrift], weights: Mapping[str, float]) -> float:
    """The weighted mean KL over every prompt of ``weights`` (example key -> weight) with those not in
    ``drifts`` yet counted at 0: a KL is >= 0, so this is a lower bound of the mean over all of them,
    and that mean itself once every prompt is in ``drifts``."""
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("the prompts' weights must sum to more than 0")
    return sum(weights[f"{d.dataset}/{d.record_id}"] * d.kl for d in drifts) / total


@dataclass(frozen=True)
class Confirmation:
    """The confirmation stage's outcome: every candidate, the recommended trial (None if none passed),
    and how many complete trials the study held when it ran (a later trial makes it stale).

    ``rule`` says how the pick was certified: ``pooled`` (the calibration's predicted task-loss bound
    of the schedule's KL, :mod:`tuner.statistics.calibration`) or ``direct`` (the schedule's own task-score bound).
    """

    budget: float
    level: float
    candidates: tuple[CandidateResult, ...]
    n_examples: int
    complete_trials: int
    rule: str = "direct"
    calibration: Calibration | None = None
    fresh: FreshCheck | None = None

    @property
    def recommended(self) -> CandidateResult | None:
        return next((c for c in self.candidates if c.status == "confirmed"), None)

    def recommended_upper_at_confidence(self) -> float | None:
        """The pooled pick's predicted task-loss bound at the calibration's ``confidence`` (None for a
        direct rule, no pick, or a calibration stored without that level); within ``budget`` means
        certified there too, not only at the decision level."""
        rec = self.recommended
        if rec is None or self.calibration is None:
            return None
        if self.fresh is None:
            return self.calibration.upper_at_confidence(rec.search_loss)
        kl = self.fresh.judged(rec.trial, rec.search_loss)
        return self.calibration.upper_with_kl_error(kl, self.fresh.judged_upper(rec.trial, rec.search_loss))

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {
            "budget": self.budget,
            "unit": ScoreLoss.unit,
            "level": self.level,
            "n_examples": self.n_examples,
            "complete_trials": self.complete_trials,
            "recommended_trial": None if rec is None else rec.trial,
            "rule": self.rule,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "fresh": None if self.fresh is None else self.fresh.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Confirmation:
        return cls(
            budget=float(data["budget"]),
            level=float(data["level"]),
            candidates=tuple(CandidateResult.from_dict(c) for c in data.get("candidates", [])),
            n_examples=int(data["n_examples"]),
            complete_trials=int(data.get("complete_trials", -1)),
            rule=str(data.get("rule", "direct")),
            calibration=None
            if data.get("calibration") is None
            else Calibration.from_dict(data["calibration"]),
            fresh=None if data.get("fresh") is None else FreshCheck.from_dict(data["fresh"]),
        )

    def store(self, study: optuna.Study) -> None:
        study.set_user_attr(CONFIRMATION_ATTR, self.to_dict())

    @classmethod
    def of_study(cls, study: optuna.Study) -> Confirmation | None:
        """The study's stored confirmation if it judged the study's current complete trials."""
        data = study.user_attrs.get(CONFIRMATION_ATTR)
        if not isinstance(data, dict):
            return None
        current = complete_trial_count(study)
        try:
            found = cls.from_dict(data)
        except (KeyError, TypeError, ValueError):
            return None  # an older or damaged attr: as if never confirmed
        return found if found.complete_trials == current else None


def _reusable(record: TrialRecord, n_examples: int) -> Estimate | None:
    """A score-mode record that already covers every validation example."""
    if record.accuracy == "score" and len(record.per_example) == n_examples:
        return record.loss
    return None


def confirm(records: list[TrialRecord], runner: TrialRunner, k: int, complete_trials: int) -> Confirmation:
    """The recommendation, certified on the task score: pooled for a fidelity search, direct racing
    for a score search (see the module docstring)."""
    if runner.search_loss.kind == "fidelity":
        return confirm_pooled(records, runner, k, complete_trials)
    return confirm_direct(records, runner, k, complete_trials)


def confirm_direct(
    records: list[TrialRecord], runner: TrialRunner, k: int, complete_trials: int
) -> Confirmation:
    """Race the top ``k`` feasible front records (fastest first) on their own task-score bound."""
    budget = runner.budget.task
    n = len(runner.evaluator.examples)
    out: list[CandidateResult] = []
    done = False
    for r in feasible_front(records, runner.search_loss)[:k]:
        if done:
            out.append(candidate_of(r, "skipped", None, "a faster candidate was confirmed"))
            continue
        est = _reusable(r, n)
        if est is None:
            scored = budget.measure(runner.context, runner.engine(r.schedule), f"confirm trial {r.number}")
            if scored.estimate is None:
                out.append(candidate_of(r, "failed", None, str(scored.stopped)))
                continue
            est = scored.estimate
        done = budget.within(est)
        why = (
            f"task-score loss {est.text()} score points; upper bound {est.upper:.2f} "
            f"{'<=' if done else '>'} budget {budget.budget:g}"
        )
        out.append(candidate_of(r, "confirmed" if done else "failed", est, why))
    return Confirmation(budget.budget, runner.settings.confidence, tuple(out), n, complete_trials)


def candidate_of(r: TrialRecord, status: str, loss: Estimate | None, reason: str) -> CandidateResult:
    speedup, search_loss = r.values
    return CandidateResult(r.number, r.schedule.percentiles, speedup, search_loss, status, loss, reason)


@dataclass(frozen=True)
class FreshPrompts:
    """The prompts of the fresh-drift check: their fidelity evaluator, macro weights, and what they are."""

    fidelity: FidelityEvaluator
    weights: dict[str, float]
    text: str


def fresh_prompts(runner: TrialRunner, calibration: FidelityEvaluator) -> Callable[[], FreshPrompts] | str:
    """What builds the fresh-drift check's prompts (on first use), or why there are none. An open-QA
    search's are the calibration's validation examples it did not see, ``--fresh-kl-examples`` per
    dataset (their unpruned side was computed with the calibration): its front's KLs come from the
    few examples that ranked it, and a schedule chosen there drifted 2.2 times as much on the next
    24 (docs/statistics.md). A prompts file's are its own fresh pool: validation rows the search never
    read (:meth:`tuner.data.prompts.PromptsFile.split`), at most ``--fresh-kl-examples``. Any other
    search's are open-QA validation prompts from ``--openqa-dir``, ``$OPENQA_DIR`` or the packaged pool,
    however many examples it ranked its schedules on: what the check measures is the front's selection
    on the examples that ranked it, which more of them shrink and do not remove (docs/statistics.md)."""
    settings = runner.settings
    per = settings.fresh_kl_examples
    source = settings.fresh_source()
    tokens = settings.max_prompt_tokens
    if source.kind == "none":
        return source.reason
    if source.kind == "calibration":
        seen = {ex.key for ex in runner.evaluator.examples}
        taken: dict[str, int] = {}
        beyond = []
        for ex in calibration.evaluator.examples:
            if ex.key not in seen and taken.get(ex.dataset, 0) < per:
                taken[ex.dataset] = taken.get(ex.dataset, 0) + 1
                beyond.append(ex)
        if not beyond:
            return (
                "not available: the calibration's examples are the search's own (raise --confirm-n-examples)"
            )

        def beyond_search() -> FreshPrompts:
            evaluator = calibration.evaluator.restricted(beyond)
            weights = dict(zip((e.key for e in beyond), macro_weights([e.dataset for e in beyond])))
            text = f"open-QA validation beyond the search's ({per} per dataset, {tokens} tokens)"
            # no prefill kept: a capture costs about 2.8 s a prompt at 2048 tokens, a schedule
            # resumed from it saves about 0.5 s, and a check reads 1 to 3 schedules
            return FreshPrompts(fidelity_of(settings, evaluator, prefix_bytes=0), weights, text)

        return beyond_search
    if source.kind == "file":
        assert source.settings is not None  # FreshSource: "file" carries its settings
        own: EvalSettings = source.settings
        prompts = settings.prompts_file
        assert prompts is not None  # FreshSource: "file" is a prompts file's
        pool = prompts.pool_size(settings.split_seed)
        validation = pool + prompts.split_sizes(settings.split_seed)["validation"]

        def file_rows() -> FreshPrompts:
            there = runner.on(own)
            text = (
                f"{prompts.name}'s own rows: {len(there.evaluator.examples)} of the {pool} validation rows "
                f"of {validation} kept from the search, {tokens} tokens"
            )
            return FreshPrompts(there.fidelity, there.weights, text)

        return file_rows
    assert source.settings is not None  # FreshSource: "open-qa" carries its settings
    other: EvalSettings = source.settings
    try:  # its records build (a few seconds of tokenizing) before the rule may need them
        if not build_examples(other, runner.tokenizer):
            return f"not available: no open-QA validation question fits in {tokens} tokens"
    except ValueError as exc:
        return f"not available: {exc}"

    def open_qa() -> FreshPrompts:
        there = runner.on(other)
        pool = "the packaged pool, " if other.openqa_dir == PACKAGED else ""
        return FreshPrompts(
            there.fidelity, there.weights, f"open-QA validation ({pool}{per} per dataset, {tokens} tokens)"
        )

    return open_qa


def fresh_kl_of(
    there: FreshPrompts, engine: LazyLLM, refused: Refused, level: float, desc: str = "fresh KL"
) -> tuple[FreshKL, int]:
    """``engine``'s mean KL on the fresh prompts ``there`` and how many prompts it was measured on:
    all of them (with the mean's one-sided bound at ``level``, resampling prompts within each
    dataset), or fewer where the KL so far (:func:`kl_so_far`, a lower bound) is already
    ``refused``; the KL returned is then that bound, not complete (0 and no prompt where the rule
    refuses the schedule at its own KL). A refused schedule's check stops at about the share of
    prompts its bound needs, the one that passes reads them all."""

    if refused(0.0):  # refused at its own KL at the check's level: no prompt can change that
        return FreshKL(0.0, complete=False), 0

    def settled(so_far: list[ExampleDrift]) -> str | None:  # refused already, whatever the rest drift
        return "refused" if refused(kl_so_far(so_far, there.weights)) else None

    drifts, _ = there.fidelity.evaluate(engine, should_stop=settled, desc=desc)
    if len(drifts) < len(there.fidelity.evaluator.examples):
        return FreshKL(kl_so_far(drifts, there.weights), complete=False), len(drifts)
    weights = [there.weights[f"{d.dataset}/{d.record_id}"] for d in drifts]
    return measured_fresh_kl([d.kl for d in drifts], weights, [d.dataset for d in drifts], level), len(drifts)


def unpruned_score(results: Sequence[ExampleResult], confidence: float) -> UnprunedScore:
    """The unpruned model's score on the calibration's examples (points, macro over datasets, as the
    report rounds it) with its one-sided bound at ``confidence``: what a prior that scales by it is
    read at (the score for the slope, its bound for the certified one and, by default, for the one
    that decides)."""
    return UnprunedScore.measured(
        [100.0 * r.score for r in results],
        macro_weights([r.dataset for r in results]),
        level=confidence,
        value=macro_score(results),
    )


def confirm_pooled(
    records: list[TrialRecord], runner: TrialRunner, k: int, complete_trials: int
) -> Confirmation:
    """Run the pooled decision rule (:func:`tuner.stages.rule.pooled_rule`) on the study's records,
    task-scoring its ``k`` schedules on the calibration's examples (the search's validation examples,
    or ``--confirm-n-examples`` per dataset of them: then each scored schedule's KL is measured there
    too), and report every front schedule it judged (the pick confirmed, the others scored as evidence)."""
    level = runner.settings.confidence
    config = runner.settings.evidence_settings("confirm")
    # the rule's schedules are scored first, in one pass with the unpruned side (baseline answers and
    # references) the calibration's examples lack: one unpruned prefill per example for everything,
    # every schedule resuming from it, a chunk of examples decoded together
    chosen = to_score(feasible_front(records, runner.search_loss), k)
    fid = runner.fidelity_on(config)
    own = fid is runner.fidelity  # the search's examples: the records hold their KLs
    scored = (
        fid.score_together(
            {r.number: runner.engine(r.schedule) for r in chosen},
            kl=not own,
            desc=f"task score of {len(chosen)} schedules",
        )
        if chosen
        else {}
    )
    on = runner.on(config, fid)
    direct: dict[int, Estimate] = {}
    base = {(b.dataset, b.record_id): b.score for b in on.baseline.results}

    def evidence(asked: Sequence[TrialRecord]) -> list[ScoredSchedule]:
        if [r.number for r in asked] != [r.number for r in chosen]:
            raise ValueError("the rule asked for other schedules than tuner.stages.rule.to_score chose")
        out = []
        for r in chosen:
            results, drifts = scored[r.number]
            direct[r.number] = loss_estimate(results, on.baseline.results, level=level)
            task = {
                f"{x.dataset}/{x.record_id}": 100.0 * (base[(x.dataset, x.record_id)] - x.score)
                for x in results
            }
            kl = r.per_example if own else {f"{d.dataset}/{d.record_id}": d.kl for d in drifts}
            out.append(ScoredSchedule(r.number, kl, task))
        return out

    fresh_on = fresh_prompts(runner, fid)
    fresh_kl: list[tuple[int, float]] = []
    stopped: list[tuple[int, int]] = []
    uppers: list[tuple[int, float]] = []
    prompts: list[FreshPrompts] = []  # built on first use only

    def fresh(r: TrialRecord, refused: Refused) -> FreshKL:
        assert not isinstance(fresh_on, str)
        if not prompts:
            prompts.append(fresh_on())
        seen, measured = fresh_kl_of(
            prompts[0], runner.engine(r.schedule), refused, level, f"fresh KL of trial {r.number}"
        )
        fresh_kl.append((r.number, seen.kl))
        if seen.upper is not None:
            uppers.append((r.number, seen.upper))
        if not seen.complete:
            stopped.append((r.number, measured))
        return seen

    # the slope's bound at the decision level decides; every reported interval stays at ``level``
    decision = pooled_rule(
        records, runner.search_loss, runner.budget.task, k, on.weights, evidence,
        level=runner.settings.decision_level, confidence=level, prior=runner.settings.prior,
        baseline_score=unpruned_score(on.baseline.results, level),
        decide_at_bound=runner.settings.prior_at_score_bound,
        fresh=None if isinstance(fresh_on, str) else fresh,
        exponent=runner.settings.calibration_exponent,
    )  # fmt: skip
    if decision.calibration is None:
        check = FreshCheck("not needed: no drifting schedule was scored", 0)
    elif isinstance(fresh_on, str):
        check = FreshCheck(fresh_on, 0)
    elif not fresh_kl:
        check = FreshCheck("not needed: no drifting front schedule passed on its own KL", 0)
    else:
        there = prompts[0]
        check = FreshCheck(
            there.text, len(there.fidelity.evaluator.examples), tuple(fresh_kl), tuple(stopped), tuple(uppers)
        )
    picked = decision.picked
    out: list[CandidateResult] = []
    for v in decision.verdicts:  # fastest first
        r = v.record
        status = "confirmed" if picked is not None and r.number == picked.number else None
        if status is None and r.number in direct:
            status = "scored"
        if status is None:
            continue
        why = v.why + (
            f"; its own task-score loss {direct[r.number].text()} score points" if r.number in direct else ""
        )
        out.append(candidate_of(r, status, direct.get(r.number), why))
    return Confirmation(
        runner.budget.task.budget,
        level,
        tuple(out),
        len(on.evaluator.examples),
        complete_trials,
        "pooled",
        decision.calibration,
        check,
    )
