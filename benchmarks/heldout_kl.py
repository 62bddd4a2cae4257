"""A finished study's held-out rows compared on teacher-forced KL on test, not only on task score.

    python benchmarks/heldout_kl.py runs/<study> [--data-dir DIR] [--threads 2] [--json PATH]

The held-out stage (``heldout.json``) compares the recommendation with the best hand-made schedules
on the test split by measured TTFT and task-score loss. With 29 test examples the task score tells
two schedules apart only when they differ by several points; the teacher-forced KL of
:mod:`tuner.evaluation.fidelity` is the low-noise signal the search itself uses. This reads the study's
``recommended.json`` and ``heldout.json``, rebuilds the test split from the study's own settings
(the study's cached baseline answers are reused), and reports for every row:

* its mean KL per answer token on test (nats, macro over datasets) with a 90% bootstrap interval;
* the paired KL difference, recommendation minus the row, on the same test examples (negative: the
  recommendation drifts less), with its 90% interval; "cannot be told apart" when it contains 0;

beside the study's own test TTFT, FLOP speedup and task-score loss. The only thing it writes into
the study folder is the test split's fidelity reference, in the study's ``cache/`` beside the test
baseline it reuses (``--json`` saves the table elsewhere).

Measured 2026-12-01 on the default study (README command 1 at a460714; 2-core CPU, about 3 minutes
for SmolLM2, 5 for gemma3-270m; test n=29, 90% intervals; KL difference = recommended - the row):

| study | row | test TTFT | test task loss | test KL (nats) | KL difference |
|---|---|---|---|---|---|
| SmolLM2 seed 0 | recommended (TSP keeping 40%) | 1.48x | 1.31 [-1.02, 3.62] | 0.288 [0.135, 0.478] | |
| | best paper-style | 1.58x | 4.17 [0.99, 7.67] | 0.515 [0.283, 0.767] | -0.228 [-0.392, -0.088] |
| | best one-stage | 1.33x | 2.80 [-0.51, 6.76] | 0.309 [0.141, 0.512] | -0.021 [-0.077, +0.028] |
| SmolLM2 seed 1 | recommended (1.98x, FastKV rule) | 1.98x | 4.70 [1.36, 8.26] | 0.335 [0.165, 0.529] | |
| | best paper-style | 1.56x | 4.17 [0.99, 7.67] | 0.515 [0.283, 0.767] | -0.180 [-0.339, -0.044] |
| | best one-stage | 1.33x | 2.80 [-0.51, 6.76] | 0.309 [0.141, 0.512] | +0.026 [-0.027, +0.081] |
| gemma3-270m | recommended (paper-style start) | 1.32x | -0.31 [-0.91, 0.01] | 0.0062 [0.0044, 0.0081] | |
| | best paper-style | 1.20x | 0.96 [-0.87, 3.80] | 0.0146 [0.0125, 0.0170] | -0.0084 [-0.0106, -0.0064] |
| | best one-stage | 2.15x | 1.21 [-0.31, 2.95] | 0.094 [0.039, 0.179] | -0.088 [-0.172, -0.033] |

The task score cannot tell most of these rows apart; the KL does. The two SmolLM2 seeds' picks
drift alike on test although their task losses are 3.4 points apart. On SmolLM2 the same schedules
drift 1.6-7x more on these 29 test examples than on the 13 validation ones (seed 0's pick: 0.042 on
validation), which is why the 1024-token study's validation evidence under-predicts its test loss.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, Schedule, load_model
from tuner.evaluation.fidelity import ExampleDrift, FidelityEvaluator
from tuner.evaluation.runner import Evaluator
from tuner.statistics.bootstrap import estimate, macro_weights, paired_estimate
from tuner.study.handmade import families
from tuner.study.settings import EvalSettings

LEVEL = 0.9


def row_schedules(heldout: dict[str, Any], recommended: Schedule) -> dict[str, Schedule]:
    """Each ``heldout.json`` row's schedule by label: the recommendation, and the hand-made picks rebuilt
    by name from :func:`tuner.study.handmade.families` (the study's revival), checked against the
    percentiles the row recorded."""
    grids = families(recommended.model, recommended.num_layers, recommended.revival)
    out = {"recommended": recommended}
    for family, name in heldout["best_hand_made"].items():
        out[f"best {family} ({name})"] = grids[family][name]
    for row in heldout["rows"]:
        sched = out[row["schedule"]]
        if [round(p, 4) for p in sched.percentiles] != [round(p, 4) for p in row["percentiles"]]:
            raise ValueError(f"{row['schedule']}: heldout.json holds other percentiles than this code builds")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("study_dir", help="a finished study's folder (holds recommended.json and heldout.json)")
    p.add_argument(
        "--data-dir", default=None, help="LongBench folder, as given to the study (default: $LONGBENCH_DIR)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also save the rows here")
    args = p.parse_args()
    study = Path(args.study_dir)
    missing = [n for n in ("recommended.json", "heldout.json") if not (study / n).is_file()]
    if missing:
        print(f"error: {study} has no {', '.join(missing)}: pass a finished study's folder", file=sys.stderr)
        return 2
    recommended = Schedule.load(study / "recommended.json")
    heldout = json.loads((study / "heldout.json").read_text())
    if not any(row["schedule"] == "recommended" for row in heldout["rows"]):
        print(
            f"error: {study}/heldout.json has no recommended row (the study recommended nothing)",
            file=sys.stderr,
        )
        return 2
    meta = recommended.metadata
    settings = meta["settings"]
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(meta["model"])
    cfg = EvalSettings(
        model=meta["model"], task=meta["task"], language=settings["language"], split="test",
        split_seed=settings["split_seed"], n_examples=settings["n_examples"],
        max_prompt_tokens=settings["max_prompt_tokens"], max_new_tokens=settings["max_new_tokens"],
        data_dir=args.data_dir,
    )  # fmt: skip
    evaluator = Evaluator(model, tokenizer, cfg, study / "cache", progress=True)
    fidelity = FidelityEvaluator(evaluator, top_k=int(settings["fidelity_top_k"]))
    start = time.monotonic()
    fidelity.references()
    print(f"test reference: {len(evaluator.examples)} examples, {time.monotonic() - start:.0f} s")
    schedules = row_schedules(heldout, recommended)
    drifts: dict[str, list[ExampleDrift]] = {}
    for row in heldout["rows"]:
        engine = LazyLLM(model, schedules[row["schedule"]], tokenizer=tokenizer, strict_model_name=False)
        drifts[row["schedule"]], _ = fidelity.evaluate(engine, desc=row["schedule"])
    weights = macro_weights([d.dataset for d in drifts["recommended"]])
    rec = [d.kl for d in drifts["recommended"]]
    out = []
    print(f"\n{meta['model']}, study {meta['study']}, test split, n={len(rec)}, {LEVEL:.0%} intervals")
    # what the study's held-out check timed (TTFT, whole generation, or nothing: the FLOP model);
    # files written before the field timed TTFT
    timed = {row.get("test_speedup_kind", "measured") for row in heldout["rows"]}
    names = {"measured": "TTFT", "total": "generation speedup", "flops": "FLOP speedup"}
    label = names[timed.pop()] if len(timed) == 1 else "speedup"
    print(
        f"| schedule | test {label} (FLOP) | test task loss | test KL (nats) | top-1 agreement "
        "| KL: recommended - it |"
    )
    print("|---|---|---|---|---|---|")
    for row in heldout["rows"]:
        kls = [d.kl for d in drifts[row["schedule"]]]
        kl = estimate(kls, weights, level=LEVEL)
        top1 = estimate([d.top1 for d in drifts[row["schedule"]]], weights, level=LEVEL).value
        diff = None if row["schedule"] == "recommended" else paired_estimate(rec, kls, weights, level=LEVEL)
        told = "" if diff is None or not diff.low <= 0.0 <= diff.high else " (cannot be told apart)"
        low, high = row["test_loss_interval"]
        print(
            f"| {row['schedule']} | {row['test_speedup']:.2f}x ({row['test_flop_speedup']:.2f}x) | "
            f"{row['test_loss']:.2f} [{low:.2f}, {high:.2f}] | {kl.value:.4f} [{kl.low:.4f}, {kl.high:.4f}] | "
            f"{top1:.3f} | "
            + ("-" if diff is None else f"{diff.value:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}]{told}")
            + " |"
        )
        out.append({
            "schedule": row["schedule"], "test_speedup": row["test_speedup"],
            "test_flop_speedup": row["test_flop_speedup"], "test_loss": row["test_loss"],
            "test_kl": kl.to_dict(), "test_top1": top1,
            "kl_recommended_minus_it": None if diff is None else diff.to_dict(),
        })  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"study": meta["study"], "n_test": len(rec), "rows": out}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
