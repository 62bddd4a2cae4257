"""The multi-fidelity step: a search's feasible front measured again at the target prompt length.

A search with ``search_prompt_tokens`` shorter than ``max_prompt_tokens`` runs its trials on the
validation prompts cut (LongBench) or built (open-QA) to the short length: a trial's prefill costs
about as much as the short prompt, so a search that cannot afford many trials at 4096 or 8192 tokens
can at 1024. A schedule is a share kept per layer, so it carries over to any length unchanged. What
does not carry over is its KL: the same schedule drifts differently on longer prompts (a fixed share
of more tokens keeps more of them). So nothing is *decided* at the short length:

1. **The trials** rank schedules by their KL at the search length, under the search cap derived in
   those units (:attr:`tuner.study.settings.SearchSettings.search_prior`: the slope prior recorded
   nearest the search length; ``--max-kl`` or the constant otherwise). The speed objective is the FLOP
   model at the target budget, ``max_prompt_tokens`` (what the prompts are cut or built to), so the
   front's speeds are the target's.
2. **This step**: every schedule of the front of complete trials that drifts (KL > 0) is measured
   again on the same validation examples at ``max_prompt_tokens``
   (:meth:`tuner.stages.trial.TrialRunner.at_target`: their own unpruned prefill, answer and
   reference), fastest first: the feasible front, and the complete trials faster than it whose bound
   went over the cap at the short length (the same schedule drifts less on longer prompts, so the
   short cap alone would keep them from a target where they may fit). Each becomes a record with the
   target KL (its per-example values and bound); one whose KL goes over the cap there, or that a
   faster one measured here confidently beats (dominated, as in a search), stops early as a trial
   would, and leaves the front. Keep-all (KL exactly 0 at any length) is kept as it is.
3. **The decision** (:func:`tuner.stages.confirm.confirm`) runs on those records and on the target
   runner: the calibration's examples, the fresh-drift check's prompts and their KLs are all at
   ``max_prompt_tokens``, so every KL the rule reads (the front's, the scored schedules', the fresh
   prompts') is measured at one length, the one the user runs, and the cap keeps its meaning of
   feasibility at the target too. The held-out check then times and scores the pick at the target.

The cap is read at two lengths on purpose: it is in the units of the trials' KL for the search, and
the same number bounds the target KL for feasibility in step 2. Where drift shrinks with length (as
measured for SmolLM2: docs/tuning.md#multi-fidelity-search) this is conservative: a schedule that
fits the cap at the short length tends to fit it at the target. A complete trial the short cap made
infeasible is measured at the target in step 2 and may fit there; a trial the cap stopped early is
never seen, so the search may still miss fast schedules that would have fitted at the target; it
never lets an unmeasured one through. The hand-made schedules of the held-out check are picked on the
search's short-length KLs (the ones the study holds), then scored and timed at the target like the
pick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.evaluation.losses import Loss, Rival
from tuner.stages.front import feasible_front, non_dominated
from tuner.stages.trial import TrialRunner
from tuner.study.records import TrialRecord, complete_trial_count

JUDGED_ATTR = "judged_at_target"
"""The study's user attr holding the front as judged at the target length (:func:`store_judged`), so that
``tuner.export`` reads the recommendation's metrics at the length the decision judged them at."""


@dataclass(frozen=True)
class AtTarget:
    """The front of a multi-fidelity search measured again at the target length.

    Attributes:
        runner: the study on the search's examples at ``max_prompt_tokens`` (what the decision reads).
        records: the front of the search's complete trials (the feasible front and the faster trials
            the short cap made infeasible), each drifting record replaced by its target one (what the
            decision reads: a record off that front, measured only at the search length, would sit
            among target KLs at another length's).
        measured: ``(trial, KL at the search length, KL at the target or None where it stopped)`` per
            re-measured record, fastest first (nats of mean KL per answer token).
        search_tokens: the trials' prompt length; ``target_tokens``: the decision's.
        over_cap: the trials among ``records`` whose bound was over the cap at the search length.
    """

    runner: TrialRunner
    records: tuple[TrialRecord, ...]
    measured: tuple[tuple[int, float, float | None], ...]
    search_tokens: int
    target_tokens: int
    over_cap: tuple[int, ...] = ()

    def note(self) -> str:
        """One line for the report: what was measured where."""
        kls = ", ".join(
            f"#{n} {short:.4f}{'*' if n in self.over_cap else ''} -> {'stopped' if long is None else f'{long:.4f}'}"
            for n, short, long in self.measured
        )
        over = (
            f" ({len(self.over_cap)} of them, starred, over the search cap at {self.search_tokens} tokens)"
            if self.over_cap
            else ""
        )
        return (
            f"multi-fidelity search: trials on {self.search_tokens}-token prompts; the front's "
            f"{len(self.measured)} drifting schedules{over} measured again at {self.target_tokens} tokens on the "
            f"same {len(self.runner.evaluator.examples)} validation examples (KL nats, search -> target: "
            f"{kls}); the calibration, fresh-drift check, held-out check and decision ran at "
            f"{self.target_tokens} tokens"
        )


def at_target(records: Sequence[TrialRecord], runner: TrialRunner) -> AtTarget:
    """Measure the front of ``records`` (from ``runner``, the search at its short length) again at
    ``max_prompt_tokens``: its feasible front and the faster complete trials over the short cap (see
    the module docstring)."""
    target = runner.at_target()
    loss = runner.search_loss
    front = target_front(records, loss)
    again: dict[int, TrialRecord] = {}
    measured: list[tuple[int, float, float | None]] = []
    for r in front:
        if r.values[1] == 0:  # no drift at one length is the unpruned model's logits at every length
            continue
        rivals = [  # the faster schedules measured here within the cap: one that beats it dominates it
            Rival(t.number, t.values[0], t.values[1])
            for t in again.values()
            if t.loss is not None and loss.within(t.loss)
        ]
        result = loss.measure(
            target.context, target.engine(r.schedule), f"KL at target of trial {r.number}", rivals
        )
        note = {**r.provenance, "kl_prompt_tokens": runner.settings.max_prompt_tokens}
        if result.estimate is None:
            again[r.number] = dataclasses.replace(
                r, loss=None, speedup=None, stopped=f"at {runner.settings.max_prompt_tokens} tokens: {result.stopped}",
                examples_run=result.examples_run, provenance=note, per_example={}, per_dataset={},
            )  # fmt: skip
            measured.append((r.number, r.values[1], None))
            continue
        again[r.number] = dataclasses.replace(
            r, loss=result.estimate, per_example=result.per_example, per_dataset=result.per_dataset,
            metrics={**r.metrics, **result.metrics}, examples_run=result.examples_run, provenance=note,
        )  # fmt: skip
        measured.append((r.number, r.values[1], result.estimate.value))
    short = runner.evaluator.config.max_prompt_tokens
    return AtTarget(
        target,
        tuple(again.get(r.number, r) for r in front),
        tuple(measured),
        short,
        runner.settings.max_prompt_tokens,
        tuple(r.number for r in front if r.loss is None or not loss.within(r.loss)),
    )


def target_front(records: Sequence[TrialRecord], loss: Loss) -> list[TrialRecord]:
    """What step 2 measures at the target, fastest first: the feasible front, and the complete
    records faster than its fastest that are over ``loss``'s cap at the search length, those of them
    no faster record beats on both objectives."""
    front = feasible_front(records, loss)
    floor = front[0].values[0] if front else 0.0
    on = {r.number for r in front}
    faster = [r for r in non_dominated(records) if r.values[0] > floor and r.number not in on]
    return faster + front


def store_judged(study: optuna.Study, found: AtTarget) -> None:
    """Keep ``found``'s records and note in ``study`` with the number of complete trials they judged
    (as the confirmation is kept: :meth:`tuner.stages.confirm.Confirmation.store`)."""
    complete = complete_trial_count(study)
    study.set_user_attr(
        JUDGED_ATTR,
        {"complete_trials": complete, "note": found.note(), "records": [r.to_dict() for r in found.records]},
    )


def judged_of_study(study: optuna.Study) -> tuple[tuple[TrialRecord, ...], str | None]:
    """The stored front at the target length and its note, where they judged the study's current
    complete trials; else ``((), None)`` (a study that is not multi-fidelity, or has trials since)."""
    data: Any = study.user_attrs.get(JUDGED_ATTR)
    if not isinstance(data, dict) or data.get("complete_trials") != complete_trial_count(study):
        return (), None
    try:
        records = tuple(TrialRecord.from_dict(r) for r in data["records"])
    except (KeyError, TypeError, ValueError):
        return (), None  # an older or damaged attr: as if never measured at the target
    return records, str(data.get("note") or "") or None
