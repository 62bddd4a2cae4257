"""The held-out check after a search: the recommendation against the best hand-made schedules, on test.

Two families of hand-made schedules a user might write:

* **paper-style**: progressive pruning in equal stages from a quarter or half of the depth, keeping
  30% or 50% of the prompt at the end (LazyLLM's own recipe);
* **one-stage**: prune to ``K%`` of the prompt once, after layer ``L`` (FastKV's token-selective
  propagation: full context up to a middle layer, then only the selected tokens), ``K`` in
  10/30/50%, ``L`` a quarter or half of the depth.

The best of each family is picked on the *validation* examples with the search's own accuracy signal
(the fastest by the FLOP model whose one-sided upper bound of loss is within the search budget;
the lowest loss if none is). Then the recommendation and both picks are evaluated on the *test*
split, which the search never saw: speedup (robust TTFT or FLOP model) and task-score loss with a
paired bootstrap interval; each hand-made pick is compared with the recommendation on the same test
examples, and when the interval of the difference in loss contains 0 the report says in words that
the two cannot be told apart on accuracy.
"""

from __future__ import annotations

from typing import Any

from lazyllm.engine import LazyLLM
from lazyllm.flops import flop_speedup
from lazyllm.schedule import Schedule
from tuner.evaluation import Evaluator, ExampleResult, loss_estimate, macro_score
from tuner.stats import macro_weights, paired_estimate
from tuner.study import StudyRunner


def hand_made_grid(model_name: str, layers: int) -> dict[str, Schedule]:
    """Paper-style progressive schedules a user might write by hand, by name."""
    grid = {}
    for start in sorted({layers // 4, layers // 2}):
        for keep in (0.3, 0.5):
            stages = max(1, min(4, layers - 1 - start))
            grid[f"paper start={start} keep={keep}"] = Schedule.progressive(
                model_name, layers, start_layer=start, final_keep=keep, stages=stages
            )
    return grid


def one_stage_grid(model_name: str, layers: int) -> dict[str, Schedule]:
    """FastKV-style one-stage schedules: keep ``K%`` of the prompt after layer ``L``.

    >>> sorted(one_stage_grid("m", 8))[:2]
    ['one-stage keep=10% after layer 2', 'one-stage keep=10% after layer 4']
    """
    grid = {}
    for layer in sorted({max(0, layers // 4), max(0, layers // 2)}):
        if layer >= layers - 1:
            continue
        for keep in (10, 30, 50):
            grid[f"one-stage keep={keep}% after layer {layer}"] = Schedule.from_layers(
                model_name, layers, {layer: 100 - keep}
            )
    return grid


def _pick(runner: StudyRunner, grid: dict[str, Schedule]) -> tuple[str, dict[str, dict[str, float]]]:
    """The fastest (FLOP model) schedule of ``grid`` whose validation loss bound is within the search's
    budget, else the one with the lowest loss; with every candidate's numbers."""
    seen: dict[str, dict[str, float]] = {}
    # fastest first: the first one within budget is the pick, so slower ones need no evaluation
    order = sorted(grid, key=lambda n: -flop_speedup(grid[n], runner.dims, runner.prompt_tokens))
    for name in order:
        engine = LazyLLM(runner.model, grid[name], tokenizer=runner.tokenizer, strict_model_name=False)
        est = runner.loss(engine, name).estimate
        flops = flop_speedup(grid[name], runner.dims, runner.prompt_tokens)
        if est is None:
            seen[name] = {"flop_speedup": flops, "loss": float("inf"), "upper": float("inf")}
            continue
        seen[name] = {"flop_speedup": flops, "loss": est.value, "upper": est.upper}
        if est.upper <= runner.budget:
            return name, seen
    return min(seen, key=lambda n: (seen[n]["loss"], -seen[n]["flop_speedup"])), seen


def _verdict(
    label: str, other: str, rec: list[ExampleResult], hand: list[ExampleResult], level: float
) -> str:
    """One sentence comparing two schedules' test losses on the same examples."""
    diff = paired_estimate(
        [100.0 * r.score for r in hand], [100.0 * r.score for r in rec], macro_weights([r.dataset for r in rec]),
        level=level,
    )  # fmt: skip  # loss(label) - loss(other), in score points
    if diff.low <= 0.0 <= diff.high:
        return (
            f"{label} and {other} cannot be told apart on test accuracy: loss difference "
            f"{diff.value:+.2f} points ({diff.level:.0%} interval {diff.low:+.2f} to {diff.high:+.2f}, n={diff.n})"
        )
    better = label if diff.value < 0 else other
    return (
        f"{better} loses less on test: loss difference ({label} - {other}) {diff.value:+.2f} points "
        f"({diff.level:.0%} interval {diff.low:+.2f} to {diff.high:+.2f}, n={diff.n})"
    )


def heldout_check(runner: StudyRunner, recommended: Schedule | None) -> dict[str, Any]:
    """Best hand-made schedules (picked on validation) vs the recommendation, on test; see the module docstring."""
    settings, model, tokenizer = runner.settings, runner.model, runner.tokenizer
    layers = runner.num_layers
    families = {
        "paper-style": hand_made_grid(settings.model, layers),
        "one-stage": one_stage_grid(settings.model, layers),
    }
    picks: dict[str, tuple[str, Schedule]] = {}
    hand_validation: dict[str, dict[str, dict[str, float]]] = {}
    for family, grid in families.items():
        name, seen = _pick(runner, grid)
        picks[family] = (name, grid[name])
        hand_validation[family] = seen

    test = Evaluator(
        model,
        tokenizer,
        settings.with_split("test"),
        settings.study_dir / "cache",
        progress=runner.evaluator.progress,
    )
    test_runner = StudyRunner(settings, model, tokenizer, test, runner.space, runner.baseline)
    base_test = test.baseline_results()
    candidates: list[tuple[str, Schedule]] = []
    if recommended is not None:
        candidates.append(("recommended", recommended))
    for family, (name, sched) in picks.items():
        candidates.append((f"best {family} ({name})", sched))
    rows: list[dict[str, Any]] = []
    results: dict[str, list[ExampleResult]] = {}
    for label, sched in candidates:
        engine = LazyLLM(model, sched, tokenizer=tokenizer, strict_model_name=False)
        res, _ = test.evaluate("lazyllm", engine, desc=f"{label} (test)")
        results[label] = res
        est = loss_estimate(res, base_test, level=settings.confidence)
        flops = flop_speedup(sched, test_runner.dims, test_runner.prompt_tokens)
        speed = test_runner.measure_speed(engine, sched) if settings.speedup == "measured" else None
        validation = _validation_numbers(label, sched, recommended, picks, hand_validation)
        rows.append(
            {
                "schedule": label,
                **validation,
                "test_speedup": round(speed.speedup if speed is not None else flops, 3),
                "test_flop_speedup": round(flops, 3),
                "test_loss": round(est.value, 2),
                "test_loss_interval": [round(est.low, 2), round(est.high, 2)],
                "test_loss_upper": round(est.upper, 2),
                "test_loss_se": est.to_dict()["se"],
                # macro over datasets, like the loss: baseline - score = loss (to rounding)
                "test_score": round(macro_score(res), 2),
                "test_baseline_score": round(macro_score(base_test), 2),
                "within_budget": est.upper <= settings.max_accuracy_loss,
                "n_validation": len(runner.evaluator.examples),
                "n_test": len(test.examples),
                "percentiles": list(sched.percentiles),
            }
        )
    verdicts = []
    labels = [label for label, _ in candidates]
    if "recommended" in results:
        verdicts = [
            _verdict("recommended", other, results["recommended"], results[other], settings.confidence)
            for other in labels[1:]
        ]
    return {
        "level": settings.confidence,
        "budget": settings.max_accuracy_loss,
        "hand_made_validation": hand_validation,
        "best_hand_made": {family: name for family, (name, _) in picks.items()},
        "rows": rows,
        "verdicts": verdicts,
    }


def _validation_numbers(
    label: str,
    sched: Schedule,
    recommended: Schedule | None,
    picks: dict[str, tuple[str, Schedule]],
    seen: dict[str, dict[str, dict[str, float]]],
) -> dict[str, Any]:
    if label == "recommended" and recommended is not None:
        metrics = recommended.metadata.get("metrics", {})
        confirmation = recommended.metadata.get("confirmation", {})
        task = confirmation.get("task_loss") or {}
        return {
            "validation_speedup": round(float(metrics.get("speedup", float("nan"))), 3),
            "validation_loss": round(float(task.get("value", metrics.get("accuracy_loss", float("nan")))), 4),
            "validation_loss_kind": "task score (confirmation)" if task else "search objective",
        }
    for family, (name, s) in picks.items():
        if s == sched and label.startswith(f"best {family}"):
            numbers = seen[family][name]
            return {
                "validation_speedup": round(numbers["flop_speedup"], 3),
                "validation_loss": round(numbers["loss"], 4),
                "validation_loss_kind": "search objective (speedup: FLOP model)",
            }
    return {}
