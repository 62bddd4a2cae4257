"""The front stage: a study's trial records -> the Pareto front and its feasible part.

* A record is on the **front** when no other complete record is at least as fast and loses at most
  as much, with one of the two strictly better. Each schedule counts once (the earliest trial that
  evaluated it), so a schedule proposed twice by an older study is one front member, not two.
* **Feasible**: the one-sided upper bound of the loss is within the search loss's budget.
* Before confirmation the pick is the fastest feasible record (ties: lower loss, then earlier).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import optuna

from tuner.evaluation.losses import Loss
from tuner.study.records import TrialRecord, schedule_key


def study_records(study: optuna.Study, model: str | None = None) -> list[TrialRecord]:
    """Every finished trial's record, in trial order (one loader for every study format)."""
    name = model or str(study.user_attrs.get("identity", {}).get("model", "unknown"))
    records = (TrialRecord.from_trial(t, name) for t in study.get_trials(deepcopy=False))
    return [r for r in records if r is not None]


def distinct(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Complete records, one per schedule (the earliest), legacy duplicates dropped."""
    seen: set[str] = set()
    out = []
    for r in sorted(records, key=lambda r: r.number):
        key = schedule_key(r.schedule)
        if r.complete and r.duplicate_of is None and key not in seen:
            seen.add(key)
            out.append(r)
    return out


def non_dominated(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The records no other beats on both objectives (speedup up, loss down), fastest first."""
    pool = distinct(records)
    front = [
        r
        for r in pool
        if not any(
            o.values[0] >= r.values[0] and o.values[1] <= r.values[1] and o.values != r.values for o in pool
        )
    ]
    return sorted(front, key=lambda r: (-r.values[0], r.values[1], r.number))


def feasible(records: Sequence[TrialRecord], loss: Loss) -> list[TrialRecord]:
    """Complete distinct records confidently within ``loss``'s budget."""
    return [r for r in distinct(records) if r.loss is not None and loss.within(r.loss)]


def feasible_front(records: Sequence[TrialRecord], loss: Loss) -> list[TrialRecord]:
    """Non-dominated records among the feasible ones, fastest first."""
    return non_dominated(feasible(records, loss))


def fastest_feasible(records: Sequence[TrialRecord], loss: Loss) -> TrialRecord | None:
    """The fastest feasible record (ties: lower loss, then the earlier trial)."""
    return min(feasible(records, loss), key=lambda r: (-r.values[0], r.values[1], r.number), default=None)
