"""The held-out check after a search: the recommendation against the best hand-made schedule, on test.

The hand-made schedules are a small grid of paper-style progressive schedules (pruning starts at a
quarter or half of the depth, keeps 30% or 50% at the end); the best of them within the loss budget
is picked on the *validation* examples, then both it and the recommendation are evaluated on the
*test* split, which the search never saw.
"""

from __future__ import annotations

import statistics
from typing import Any

from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.methods import make_method
from lazyllm.schedule import Schedule
from tuner.evaluation import Evaluator, summarize
from tuner.settings import SearchSettings


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


def heldout_check(
    settings: SearchSettings, model: Any, tokenizer: Any, validation: Evaluator, recommended: Schedule | None
) -> dict[str, Any]:
    """Best hand-made paper-style schedule (picked on validation) vs the recommendation, on test."""
    layers = int(model.config.num_hidden_layers)
    dims = ModelDims.from_config(model.config)
    grid = hand_made_grid(settings.model, layers)
    paired = settings.speedup == "measured"

    def speed(summary: dict[str, Any], schedule: Schedule, ev: Evaluator) -> float:
        if settings.speedup == "flops":
            n = round(statistics.fmean(len(e.input_ids) for e in ev.examples))
            return flop_speedup(schedule, dims, n)
        return float(summary["ttft_speedup"])

    base_val = validation.baseline_results()
    hand: dict[str, tuple[float, float]] = {}
    for name, sched in grid.items():
        method = make_method("lazyllm", model, tokenizer, sched)
        res, _ = validation.evaluate("lazyllm", method, desc=name, paired_timing=paired)
        s = summarize(res, base_val)
        hand[name] = (speed(s, sched, validation), float(s["accuracy_loss"]))
    ok = [n for n, (_, loss) in hand.items() if loss <= settings.max_accuracy_loss]
    best_hand = max(ok, key=lambda n: hand[n][0]) if ok else min(hand, key=lambda n: hand[n][1])

    test = Evaluator(model, tokenizer, settings.with_split("test"), settings.study_dir / "cache")
    base_test = test.baseline_results()
    rows = []
    candidates: list[tuple[str, Schedule, float, float]] = []
    if recommended is not None:
        metrics = recommended.metadata.get("metrics", {})
        candidates.append(
            ("recommended", recommended, float(metrics["speedup"]), float(metrics["accuracy_loss"]))
        )
    candidates.append((f"best hand-made ({best_hand})", grid[best_hand], *hand[best_hand]))
    for label, sched, val_speed, val_loss in candidates:
        method = make_method("lazyllm", model, tokenizer, sched)
        res, _ = test.evaluate("lazyllm", method, desc=f"{label} (test)", paired_timing=paired)
        test_summary = summarize(res, base_test)
        rows.append(
            {
                "schedule": label,
                "validation_speedup": round(val_speed, 3),
                "validation_loss": round(val_loss, 2),
                "test_speedup": round(speed(test_summary, sched, test), 3),
                "test_loss": round(float(test_summary["accuracy_loss"]), 2),
                "test_score": round(float(test_summary["score"]), 2),
                "test_baseline_score": round(float(test_summary["baseline_score"]), 2),
                "n_validation": len(validation.examples),
                "n_test": len(test.examples),
            }
        )
    return {"hand_made_validation": hand, "best_hand_made": best_hand, "rows": rows}
