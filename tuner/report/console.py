"""The lines a study prints at its end, from its :class:`~tuner.stages.outcome.StudyOutcome`; every loss
carries its unit and every task-score number its n and interval."""

from __future__ import annotations

from tuner.report.heldout import verdict
from tuner.stages.outcome import StudyOutcome

_TIMED = {"measured": "TTFT", "total": "generation", "flops": "FLOP"}


def summary_lines(outcome: StudyOutcome) -> list[str]:
    loss = outcome.search_loss
    kind = outcome.identity.speedup
    points = outcome.points
    out = [outcome.budget_line(), *outcome.notes, ""]
    if outcome.budget.cap is not None:
        out.append(f"Search cap: {outcome.budget.cap.text()}")
    out.append(
        f"Pareto front ({len(outcome.front)} trials; speedup = {kind}; loss = {loss.what}, {loss.unit}):"
    )
    for r in outcome.front:
        out.append(
            f"  trial {r.number:>3}: speedup {r.values[0]:.2f}x, loss {loss.text(r.values[1])} "
            f"(upper bound {loss.text(r.loss.upper if r.loss else float('nan'))}), FLOP model "
            f"{r.flop_speedup:.2f}x, {r.prompt_computed_pct:.1f}% computed"
        )
    if outcome.confirmation is not None:
        out.append("")
        out.append(
            f"Confirmation (task score on all {outcome.confirmation.n_examples} validation examples, "
            f"budget {outcome.confirmation.budget:g} {points}):"
        )
        out += [f"  trial {c.trial:>3}: {c.status}: {c.reason}" for c in outcome.confirmation.candidates]
    if outcome.heldout is not None:
        out.append("")
        out.append(
            "Held-out check (test split; hand-made schedules picked on validation, the study's revival):"
        )
        for row in outcome.heldout.rows:
            val = "stopped early" if row.validation_loss is None else loss.text(row.validation_loss)
            task = (
                ""
                if row.validation_task_loss is None
                else f", task loss {row.validation_task_loss.text()} {points}"
            )
            out.append(
                f"  {row.label}: validation {row.validation_speedup:.2f}x / {loss.what} {val}{task} "
                f"(n={row.n_validation}); test {row.test_speedup:.2f}x {_TIMED[row.test_speed_kind]} "
                f"(FLOP {row.test_flop_speedup:.2f}x) / task loss {row.test_loss.text()} "
                f"{points} (score {row.test_score:.2f} vs {row.test_baseline_score:.2f})"
            )
        out += [f"  {verdict(c)}" for c in outcome.heldout.comparisons]
    if outcome.decision:
        out += ["", outcome.decision]
    power = outcome.power
    if power is not None:
        out += ["", power]
    if points != "score points":  # the stages' own sentences (reasons, verdicts) in the study's points
        out = [line.replace("score points", points) for line in out]
    return out
